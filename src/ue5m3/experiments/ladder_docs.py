"""The scale ladder as Markdown: the tables of docs/experiments.md's ladder section (between its markers), from the
claims' sizings and each rung's summary (:mod:`ue5m3.experiments.ladder`); ``ue5m3 ladder --write
docs/experiments.md`` writes them (:mod:`ue5m3.cli.rungs`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ue5m3.experiments.ladder import CPU_DAG_SECONDS_PER_RUN, ClaimSizing, RungSummary, decisions, paper_window_sd
from ue5m3.experiments.power import detectable_effect, seeds_needed

__all__ = ["ladder_table", "power_table", "tables", "write_section", "BEGIN", "END"]


def _fmt(value: Any, spec: str = "{}") -> str:
    return "" if value is None else spec.format(value)


def _tokens(n: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"


def ladder_table(rows: Sequence[tuple[RungSummary, Mapping[str, Mapping[str, Any]]]]) -> str:
    """The ladder as Markdown: rung, model, tokens, seeds, runs, GPU-hours and the claims each rung decides."""
    lines = [
        "| rung | config | model | tokens / run | seeds | runs | GPU-hours (training) | claims decidable |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for summary, decided in rows:
        yes = [k for k, d in decided.items() if str(d["decidable"]).startswith("yes")]
        maybe = [k for k, d in decided.items() if d["decidable"] == "if the spread shrinks"]
        claims = ", ".join(yes) or "none"
        if maybe:
            claims += f"; if the spread shrinks: {', '.join(maybe)}"
        if summary.gpu:
            per_seed = summary.gpu_hours / len(summary.seeds)
            hours = f"{summary.gpu_hours:,.0f} on {summary.gpu} ({per_seed:,.0f} per seed)"
        elif summary.rung.wall_s is not None:
            hours = f"0 ({summary.rung.wall_s / 3600:.1f} h on 2 CPU cores, measured)"
        else:
            hours = f"0 (about {summary.runs * CPU_DAG_SECONDS_PER_RUN / 3600:.1f} h on 2 CPU cores)"
        lines.append(
            f"| {summary.rung.title} | `{summary.rung.configs[-1]}` | {summary.model} ({summary.parameters_m:,.0f}M) "
            f"| {_tokens(summary.tokens_per_run)} ({summary.steps:,} steps x {_tokens(summary.tokens_per_step)}) "
            f"| {len(summary.seeds)} | {summary.runs} | {hours} | {claims} |"
        )
    return "\n".join(lines) + "\n"


def power_table(sizings: Sequence[ClaimSizing], rows: Sequence[tuple[RungSummary, Mapping[str, Any]]]) -> str:
    """Per claim: the paper's effect, the CPU spread it is sized by, and the seeds each rung's spread needs (held /
    shrunk) for 80% power at alpha 0.05."""
    head = "| claim | paper effect | CPU effect | CPU SD (window, trajectory) | "
    head += " | ".join(
        f"seeds at {s.rung.key}{', for the CPU effect' if s.rung.effect == 'measured' else ''} (held / shrunk)"
        for s, _ in rows
    )
    head += " | note |"
    lines = [head, "|" + "---|" * (5 + len(rows))]
    for sizing in sizings:
        sp = sizing.spread
        cpu = f"{sp.effect:+.4f} ({len(sp.seeds)} seeds)" if sp else ""
        sd = f"{sp.sd:.4f} ({sp.window_sd:.4f}, {sp.trajectory_sd:.4f})" if sp else ""
        cells = []
        for _, decided in rows:
            d = decided[sizing.claim.key]
            held, shrunk = d["held"], d["shrunk"]
            if held is None and shrunk is None:
                cells.append(str(d["decidable"]))
            else:
                cells.append(f"{_fmt(held) or '>10^6'} / {_fmt(shrunk) or '>10^6'}: {d['decidable']}")
        lines.append(
            f"| {sizing.claim.key} | {_fmt(sizing.paper_effect, '{:+.4f}')} | {cpu} | {sd} | "
            + " | ".join(cells)
            + f" | {sizing.note} |"
        )
    return "\n".join(lines) + "\n"


def tables(sizings: Sequence[ClaimSizing], rungs: Sequence[tuple[RungSummary, Any]]) -> str:
    """The Markdown of docs/experiments.md's ladder section from the claims' sizings and each rung's summary and
    loaded pipeline config: the ladder table, the per-claim power table and the window part's check against the
    paper's own data (:func:`ue5m3.cli.rungs.render` loads and costs the rungs)."""
    rows = [(summary, {s.claim.key: decisions(s, summary, cfg) for s in sizings}) for summary, cfg in rungs]
    paper_mean, paper_window, paper_tokens = paper_window_sd()
    measured = [s.spread for s in sizings if s.spread is not None and s.window == "training"]
    check = ""
    if measured:
        sp = measured[0]
        predicted = sp.window_sd * math.sqrt(sp.window_tokens / paper_tokens)
        check = (
            f"\nThe window part at the paper's scale, from its own data: the 350M control's ten logged paired "
            f"differences (T = 2048 minus T = 448, {_tokens(paper_tokens)} tokens in the window) have a window SD "
            f"of {paper_window:.5f} (mean {paper_mean:+.5f}); the CPU runs' {sp.treatment} - {sp.baseline} window "
            f"SD {sp.window_sd:.4f} at {_tokens(sp.window_tokens)} tokens, scaled by the square root of the tokens, "
            f"predicts {predicted:.5f}: another pair and another model, so only the order of magnitude is "
            f"compared. {_check_word(paper_window / predicted)}\n"
        )
    return ladder_table(rows) + "\n" + power_table(sizings, rows) + _at_measured_scale(sizings, rows) + check


def _at_measured_scale(sizings: Sequence[ClaimSizing], rows: Sequence[tuple[RungSummary, Mapping[str, Any]]]) -> str:
    """What the rungs at the measured runs' scale (the CPU rung) resolve: per claim sized by its own training-loss
    pair, the smallest effect their seeds find with 80% power against the measured effect and the paper's, and, where
    the measured effect needs more seeds than the rung has, the runs and time that would take."""
    lines = []
    for summary, decided in rows:
        if not (summary.rung.same_scale or summary.rung.effect == "measured") or summary.gpu:
            continue
        n = len(summary.seeds)
        for sizing in sizings:
            sp = sizing.spread
            if sp is None or sizing.window != "training" or not sizing.note.startswith("measured"):
                continue
            d = decided[sizing.claim.key]
            if d["sd_held"] is None:
                continue
            smallest = detectable_effect(n, d["sd_held"]) if n >= 2 else None
            text = (
                f"- {sizing.claim.key}: at the {summary.rung.key} rung ({n} seeds, paired SD {d['sd_held']:.4f}) the "
                f"smallest effect found with 80% power is {_fmt(smallest, '{:.4f}') or 'none (one seed)'}; the CPU "
                f"runs' own effect is {sp.effect:+.4f} and the paper's {_fmt(sizing.paper_effect, '{:+.4f}')}"
            )
            held = seeds_needed(sp.effect, d["sd_held"], margin=sizing.margin)  # for the CPU runs' own effect
            if held is not None and held > n:
                runs = held * len({sizing.claim.treatment, sizing.claim.baseline})
                hours = runs * CPU_DAG_SECONDS_PER_RUN / 3600
                text += (
                    f". The CPU effect needs {held} paired seeds: {runs} runs of its two recipes alone, about "
                    f"{hours:.0f} h on 2 CPU cores, past the rung's budget, so the rung cannot decide it at the CPU "
                    "scale"
                )
            elif held is not None:
                text += f". The CPU effect needs {held} paired seeds: the rung decides it"
            if sizing.paper_effect is not None and smallest is not None:
                verb = "would be" if abs(sizing.paper_effect) >= smallest else "would not be"
                text += f"; a paper-sized gap at this spread {verb} found"
            lines.append(text + ".")
    if not lines:
        return ""
    return "\nWhat the CPU rung resolves at the CPU runs' own scale:\n\n" + "\n".join(lines) + "\n"


def _check_word(ratio: float) -> str:
    """The window check's verdict: the paper's window SD over the CPU runs' scaled by the square root of the tokens."""
    if 1 / 3 <= ratio <= 3:
        return f"They agree within a factor of {max(ratio, 1 / ratio):.1f}."
    if ratio > 3:
        return (
            f"The paper's is {ratio:.0f} times the prediction: at its scale the window part shrinks more slowly than "
            "the square root of the tokens, so the shrunk numbers of seeds are optimistic even for the window part."
        )
    return f"The paper's is {1 / ratio:.0f} times below the prediction: the held numbers are conservative."


BEGIN = "<!-- ladder:begin (ue5m3 ladder --write docs/experiments.md) -->"
END = "<!-- ladder:end -->"


def write_section(path: str | Path, text: str) -> None:
    """Replace what lies between the ladder markers of the Markdown file ``path`` with ``text``.

    Raises:
        ValueError: the file has no markers.
    """
    path = Path(path)
    doc = path.read_text(encoding="utf-8")
    if BEGIN not in doc or END not in doc:
        raise ValueError(f"{path} has no ladder markers ({BEGIN} ... {END})")
    head, rest = doc.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    path.write_text(f"{head}{BEGIN}\n{text}{END}{tail}", encoding="utf-8")
