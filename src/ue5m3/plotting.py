"""Deterministic figure style shared by every notebook (style guide rule 11).

The figures are pipeline outputs, so two runs on the same tables must give the same bytes. Three things
make that true: a fixed style (one font family, fixed sizes, TrueType fonts embedded with `pdf.fonttype`
42, a fixed SVG hash salt) applied by :func:`apply_style`; no timestamps or version strings in the file
(:func:`save_figure` clears them); and atomic writes, so an interrupted save never leaves a truncated
figure behind for Snakemake to mistake for a finished one.

Later figures compare our runs with the paper's reported numbers; :data:`paper_vs_ours` fixes how each
side is drawn (the paper in grey/black hollow markers, ours in colour) so every notebook agrees.

Every notebook starts with :func:`notebook_setup`: it applies the style and binds the notebook's path
parameters to the Snakemake rule's inputs and outputs, or resolves their defaults from the repository root
when the notebook runs by hand. Under Snakemake, a rule's output ``<key>_view`` is the report view of its output
``<key>`` (:mod:`ue5m3.figures`): :func:`save_figure` and :func:`save_table` write the view beside the
figure or table (:mod:`ue5m3.report`), in the same job, so a figure rebuilt alone can be reported at once.

Every figure carries a caption (:func:`add_caption`) with the settings it was made with, read from the results'
provenance, beside the paper's (:func:`scale_caption`), so a reader sees at once whether ours ran at CPU scale
or at the paper's.
"""

from __future__ import annotations

import json
import math
import os
import textwrap
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

import matplotlib as mpl
from matplotlib.figure import Figure

from ue5m3 import report
from ue5m3.artifacts import atomic_path, write_csv

STYLE: dict[str, Any] = {
    "font.family": "DejaVu Sans",  # ships with matplotlib, so every machine renders the same glyphs
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.5,
    "lines.linewidth": 1.5,
    "lines.markersize": 5,
    "figure.figsize": (6.0, 3.5),
    "figure.dpi": 100,
    "figure.constrained_layout.use": True,
    "savefig.dpi": 300,
    "pdf.fonttype": 42,  # embed TrueType (editable text in the PDF, no Type 3 bitmaps)
    "ps.fonttype": 42,
    "svg.fonttype": "none",
    "svg.hashsalt": "ue5m3",  # SVG element ids are otherwise random per run
}
"""rcParams set by :func:`apply_style`."""

PAPER_COLOR = "0.25"
"""The paper's reported numbers: dark grey."""
OURS_COLOR = "#1f77b4"
"""Our reproduction: blue."""

paper_vs_ours: dict[str, dict[str, Any]] = {
    "paper": {
        "color": PAPER_COLOR,
        "marker": "o",
        "markerfacecolor": "none",
        "markeredgecolor": "black",
        "linestyle": "none",
        "label": "paper",
    },
    "ours": {"color": OURS_COLOR, "marker": "o", "linestyle": "-", "label": "ours"},
}
"""Keyword arguments for ``ax.plot`` by side: the paper's reported values as hollow black markers, ours
in colour. Use as ``ax.plot(x, y, **paper_vs_ours["paper"])``."""

FORMAT_COLORS: dict[str, str] = {"UE5M3": "#1f77b4", "E4M3": "#d62728", "UE8M0": "#2ca02c", "E2M1": "#9467bd"}
"""One colour per number format, shared by all figures."""

# Savefig metadata that would otherwise embed the date or the matplotlib version.
_STABLE_METADATA: dict[str, dict[str, None]] = {
    "pdf": {"CreationDate": None, "Producer": None},
    "svg": {"Date": None, "Creator": None},
    "png": {"Software": None},
}


def apply_style() -> None:
    """Set the shared matplotlib rcParams (:data:`STYLE`) for the current process."""
    mpl.rcParams.update(STYLE)


def save_figure(fig: Figure, path: str | os.PathLike[str]) -> Path:
    """Write `fig` to `path` atomically and byte-reproducibly.

    The figure is first saved to a temporary file in the destination directory and then moved over `path`
    with :func:`os.replace`, so readers see either the old file or the complete new one. Creation dates and
    producer strings are left out, so saving the same figure twice gives identical bytes.

    Args:
        fig: the figure to save.
        path: destination; its suffix (``.pdf``, ``.svg``, ``.png``, ...) selects the format. Missing
            parent directories are created.

    Returns:
        The destination as a :class:`~pathlib.Path`.

    Raises:
        ValueError: if `path` has no suffix to take the format from.
    """
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if not fmt:
        raise ValueError(f"save_figure needs a file suffix to choose the format, got {str(path)!r}; use e.g. .pdf")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=fmt, metadata=_STABLE_METADATA.get(fmt))
    _write_view(path, figure_labels(fig))
    return path


def figure_labels(fig: Figure) -> dict[str, Any]:
    """What a reader sees named in a figure: each axes' titles (left, centre, right), x and y labels, scales, tick
    labels, annotations and legend entries, and the figure's suptitle and legends (what a caption must agree
    with)."""
    axes = []
    for ax in fig.axes:
        legend = ax.get_legend()
        titles = [ax.get_title(loc=loc) for loc in ("left", "center", "right")]
        axes.append(
            {
                "title": " ".join(t for t in titles if t),
                "ticklabels": [t.get_text() for t in (*ax.get_xticklabels(), *ax.get_yticklabels()) if t.get_text()],
                "texts": [t.get_text() for t in ax.texts],
                "xlabel": ax.get_xlabel(),
                "ylabel": ax.get_ylabel(),
                "xscale": ax.get_xscale(),
                "yscale": ax.get_yscale(),
                "legend": [t.get_text() for t in legend.get_texts()] if legend is not None else [],
            }
        )
    suptitle = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) is not None else ""
    legends = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    return {"suptitle": suptitle, "figure_legend": legends, "axes": axes}


def save_table(path: str | os.PathLike[str], rows: Any, fieldnames: list[str]) -> Path:
    """Write a comparison table as CSV atomically (:func:`ue5m3.artifacts.write_csv`), and its report view when the
    rule declares one.

    Args:
        path: the CSV file.
        rows: dict rows, or a pandas DataFrame (its records).
        fieldnames: the columns, in order.
    """
    records = rows.to_dict("records") if hasattr(rows, "to_dict") else rows
    write_csv(path, records, fieldnames)
    _write_view(Path(path))
    return Path(path)


_VIEWS: dict[Path, Path] = {}
"""Figure or table -> its report view, bound by :func:`notebook_setup` from the rule's ``<key>_view`` outputs."""


def _write_view(path: Path, labels: dict[str, Any] | None = None) -> None:
    """The report view of a figure or table, when the rule declares one; a figure's view gets a sidecar
    ``<view>.labels.json`` of :func:`figure_labels`, which the caption test reads."""
    view = _VIEWS.get(path.resolve())
    if view is None:
        return
    report.render(path, view)
    if labels is not None:
        with atomic_path(view.with_suffix(".labels.json")) as tmp:
            tmp.write_text(json.dumps(labels, indent=1, sort_keys=True) + "\n")


def repo_path(path: str | os.PathLike[str]) -> Path:
    """Resolve a repository-relative path from the repository root or any directory below it.

    Notebooks default to paths such as ``results/range_analysis/formats.csv``; this lets them run by hand
    from the repository root or from ``notebooks/``. The root is the nearest directory, starting at the
    current one and walking up, that holds a ``Snakefile``.

    Args:
        path: a path relative to the repository root; absolute paths are returned unchanged.

    Returns:
        The resolved path.

    Raises:
        FileNotFoundError: if no directory from the current one upwards holds a ``Snakefile``.
    """
    path = Path(path)
    if path.is_absolute():
        return path
    cwd = Path.cwd()
    for directory in (cwd, *cwd.parents):
        if (directory / "Snakefile").is_file():
            return directory / path
    raise FileNotFoundError(
        f"cannot resolve {str(path)!r}: no Snakefile in {str(cwd)!r} or above; run from inside the "
        "repository or pass an absolute path"
    )


_SNAKEMAKE_SECTIONS = ("input", "output")


def notebook_setup(namespace: MutableMapping[str, Any], **sources: str) -> None:
    """Set up a figure notebook: apply the style and bind its path parameters.

    Call it right after the parameters cell as ``notebook_setup(globals(), table_csv="output.table", ...)``.

    * Under Snakemake's ``notebook:`` directive (``namespace`` holds the injected ``snakemake`` object) each named
      parameter is set from the rule: ``"input.curves"`` is ``snakemake.input.curves``, a bare ``"input"`` the rule's
      whole input; a list parameter (its default a glob pattern) receives a list.
    * By hand (JupyterLab's Run All, papermill, nbmake) each parameter keeps its default, resolved from the
      repository root (:func:`repo_path`): a path as it is, a glob pattern as the sorted files it matches. Every
      input must exist: a missing one is refused, naming the rule of the pipeline that makes it and the command
      that runs it. What was found is printed, so the first cell says what the notebook reads.

    Args:
        namespace: the notebook's globals; the named parameters are rebound in it.
        **sources: parameter name -> ``"<section>"`` or ``"<section>.<name>"`` of the Snakemake object, the
            section ``input`` or ``output`` (file paths only).

    Raises:
        KeyError: a named parameter is not defined in ``namespace`` (it belongs in the parameters cell).
        ValueError: a source names another section.
        FileNotFoundError: by hand, an input the pipeline has not made yet (the message says how to make it).
    """
    apply_style()
    for name, source in sources.items():
        if name not in namespace:
            raise KeyError(f"notebook parameter {name!r} is not defined; set its default in the parameters cell")
        section, _, key = source.partition(".")
        if section not in _SNAKEMAKE_SECTIONS:
            raise ValueError(f"{name}={source!r}: the source must be one of {_SNAKEMAKE_SECTIONS}, optionally .name")
    smk = namespace.get("snakemake")  # injected by Snakemake's notebook: directive
    _VIEWS.clear()
    if smk is not None:
        _bind_from_snakemake(namespace, smk, sources)
        return
    outputs = [namespace[n] for n, source in sources.items() if source.startswith("output")]
    found = []
    for name, source in sources.items():
        default = namespace[name]
        if source.startswith("input"):
            namespace[name] = _existing_inputs(name, default, outputs)
            count = len(namespace[name]) if isinstance(namespace[name], list) else 1
            found.append(f"  {name}: {default}" + (f" ({count} files)" if is_pattern(default) else ""))
        else:
            namespace[name] = repo_path(default)
    print(  # noqa: T201 - the notebook's first output: what it reads
        "Reading the pipeline's results (by hand: the defaults below, resolved from the repository root; under "
        "Snakemake its rule's inputs):\n" + "\n".join(found)
    )


def is_pattern(value: Any) -> bool:
    """Whether a notebook parameter's default is a glob pattern (a list parameter)."""
    return isinstance(value, str) and any(c in value for c in "*?[")


def _bind_from_snakemake(namespace: MutableMapping[str, Any], smk: Any, sources: Mapping[str, str]) -> None:
    named = getattr(smk.output, "items", None)  # Snakemake's named outputs
    if callable(named):
        outputs = dict(named())
        for key, view in outputs.items():
            if key.endswith("_view") and key.removesuffix("_view") in outputs:
                _VIEWS[Path(outputs[key.removesuffix("_view")]).resolve()] = Path(view)
    for name, source in sources.items():
        section, _, key = source.partition(".")
        value = getattr(smk, section)
        if key:
            value = getattr(value, key)
        default = namespace[name]
        namespace[name] = list(value) if is_pattern(default) or isinstance(default, list) else value


def _existing_inputs(name: str, default: Any, outputs: list[Any]) -> Any:
    """A by-hand input: the file (or the files a pattern matches), refused when the pipeline has not made it yet."""
    from ue5m3 import stages  # noqa: PLC0415 - only the by-hand path needs the registry

    if isinstance(default, list):
        paths = [repo_path(p) for p in default]
    elif is_pattern(default):
        root = repo_path(".")
        paths = sorted(root.glob(str(default)))
    else:
        paths = [repo_path(default)]
    missing = [p for p in paths if not p.exists()] if paths else [repo_path(default)]
    if missing:
        target = " ".join(str(o) for o in outputs[:1])
        rule = stages.producer(str(default))
        made_by = f"rule {rule} of the pipeline makes it" if rule else "the pipeline makes it"
        raise FileNotFoundError(
            f"notebook parameter {name!r}: {missing[0] if paths else default} does not exist yet ({made_by}); run "
            f"`snakemake --cores 2 {target}` from the repository root first (or `make reproduce` for everything)"
        )
    return paths if isinstance(default, list) or is_pattern(default) else paths[0]


def format_number(value: float) -> str:
    """Short label text for a value read from a table (labels are computed, never typed in).

    Powers of two below 1 print as mathtext ``$2^{k}$``, other values below 1 in scientific notation,
    values from 100 up with thousands separators and no decimals, the rest with four significant digits.

    Args:
        value: the number to label.

    Returns:
        The label, e.g. ``"61,440"``, ``"$2^{-17}$"``, ``"$1.7\\times10^{-6}$"``, ``"30"``.
    """
    value = float(value)
    magnitude = abs(value)
    if magnitude == 0 or not math.isfinite(value):
        return f"{value:g}"
    sign = "-" if value < 0 else ""
    if magnitude < 1:
        fraction, exponent = math.frexp(magnitude)
        if fraction == 0.5:
            return f"${sign}2^{{{exponent - 1}}}$"
        mantissa, power = f"{magnitude:.1e}".split("e")
        return f"${sign}{mantissa}\\times10^{{{int(power)}}}$"
    if magnitude >= 100:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def _setting(value: Any) -> str:
    """One setting's value as caption text: numbers by :func:`format_number`, ints with separators, lists joined."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if value.is_integer() and abs(value) >= 1 else format_number(value)
    if isinstance(value, list | tuple):
        return ", ".join(map(_setting, value))
    return str(value)


def scale_caption(ours: Mapping[str, Any], paper: Mapping[str, Any]) -> str:
    """Two caption lines: our settings (read from the results' provenance) and the paper's, with the scale named.

    Our line says "CPU scale" when any setting both sides name differs, "paper scale" when all agree, so the
    caption stays true when the pipeline runs ``config/paper.yaml``. Keys are the labels printed.

    Args:
        ours: label -> value of our run, e.g. ``{"model": "nemotron_h_debug", "steps": 150}``.
        paper: label -> value of the paper's run, same labels (those only one side has are printed, not compared).

    Returns:
        E.g. ``"ours (CPU scale): model nemotron_h_debug, steps 150\npaper: model nemotron_h_8b, steps 30,000"``.
    """
    shared = [key for key in ours if key in paper]
    same = all(_setting(ours[key]) == _setting(paper[key]) for key in shared)
    scale = "paper scale" if same else "CPU scale"

    def line(settings: Mapping[str, Any]) -> str:
        return ", ".join(f"{key} {_setting(value)}" for key, value in settings.items())

    return f"ours ({scale}): {line(ours)}\npaper: {line(paper)}"


CAPTION_FONTSIZE = 6.5
"""Font size of :func:`add_caption` (points)."""


def add_caption(fig: Figure, text: str) -> None:
    """Write ``text`` under the axes of a constrained-layout figure, in the space it reserves there.

    Each paragraph (newline-separated) is wrapped to the figure's width; the layout's rectangle is shrunk from
    below by the caption's height, so axes, tick labels and legends never overlap it. Call it once per figure,
    before saving.

    Args:
        fig: a figure with the constrained layout of :data:`STYLE`.
        text: the caption; paragraphs separated by newlines.

    Raises:
        ValueError: the figure has no constrained layout (its axes would not make room).
    """
    engine = fig.get_layout_engine()
    if engine is None or not hasattr(engine, "set") or "rect" not in engine.get():
        raise ValueError("add_caption needs a constrained-layout figure; apply the style (notebook_setup) first")
    # DejaVu Sans averages about 0.56 em per character of prose: 0.6 leaves a margin on the right
    width_chars = max(20, int(0.97 * fig.get_figwidth() * 72 / (0.6 * CAPTION_FONTSIZE)))
    lines = [wrapped for paragraph in text.splitlines() for wrapped in textwrap.wrap(paragraph, width_chars) or [""]]
    height = (len(lines) * CAPTION_FONTSIZE * 1.25 + 4) / 72 / fig.get_figheight()  # a fraction of the figure
    engine.set(rect=(0.0, height, 1.0, 1.0 - height))
    fig.text(0.01, height, "\n".join(lines), ha="left", va="top", fontsize=CAPTION_FONTSIZE, color="0.3")


def paired_effects(ax: Any, table: Any, *, ylabel: str, paper_label: str = "paper (one seed)") -> None:
    """Bars of a paired comparison table (:mod:`ue5m3.experiments.comparisons.recipes`): per row (its ``label``),
    our mean paired effect with its 95% t interval over seeds (no bar where we did not run it), beside the paper's
    effect (hatched), each bar's verdict written under it."""
    import numpy as np

    x = np.arange(len(table))
    effect = table["effect"].astype(float).to_numpy()
    low = table["interval_low"].astype(float).to_numpy()
    high = table["interval_high"].astype(float).to_numpy()
    err = np.vstack([np.nan_to_num(effect - low), np.nan_to_num(high - effect)])
    ax.bar(x - 0.2, effect, 0.4, yerr=err, capsize=3, color=OURS_COLOR, label="ours: mean paired difference (95% t)")
    paper = table["paper_effect"].astype(float).to_numpy()
    ax.bar(x + 0.2, paper, 0.4, color="white", edgecolor=PAPER_COLOR, hatch="//", label=paper_label)
    ax.axhline(0, color="black", linewidth=0.6)
    pairs = zip(table["label"], table["verdict"], strict=True)
    ticks = [f"{textwrap.fill(lab, 14)}\n{verdict}" for lab, verdict in pairs]
    ax.set_xticks(list(x), ticks)
    ax.tick_params(axis="x", labelsize=6.5)
    ax.set_ylabel(ylabel)
