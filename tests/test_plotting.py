"""Tests for ue5m3.plotting: deterministic style, byte-stable atomic saves, label formatting."""

import os
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import pytest

from ue5m3 import plotting


def _draw() -> plt.Figure:
    plotting.apply_style()
    fig, ax = plt.subplots()
    ax.plot([1, 10, 100], [3, 1, 2], **plotting.paper_vs_ours["paper"])
    ax.plot([1, 10, 100], [2, 2, 1], **plotting.paper_vs_ours["ours"])
    ax.set(xscale="log", title="UE5M3 max 61,440", xlabel="$2^{-17}$")
    ax.legend()
    return fig


def _listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_apply_style_sets_truetype_fonts_and_fixed_salt():
    plotting.apply_style()
    assert matplotlib.rcParams["pdf.fonttype"] == 42
    assert matplotlib.rcParams["svg.hashsalt"] == plotting.STYLE["svg.hashsalt"]
    assert matplotlib.rcParams["font.family"] == ["DejaVu Sans"]


@pytest.mark.parametrize("suffix", [".pdf", ".svg", ".png"])
def test_saving_the_same_figure_twice_gives_identical_bytes(tmp_path, suffix):
    first = plotting.save_figure(_draw(), tmp_path / f"a{suffix}")
    second = plotting.save_figure(_draw(), tmp_path / f"b{suffix}")
    assert first.read_bytes() == second.read_bytes()
    assert _listing(tmp_path) == [f"a{suffix}", f"b{suffix}"]  # no temporary files left behind


def test_pdf_carries_no_creation_date_or_producer(tmp_path):
    data = plotting.save_figure(_draw(), tmp_path / "fig.pdf").read_bytes()
    assert b"/CreationDate" not in data
    assert b"/Producer" not in data


def test_save_figure_creates_parent_directories_with_the_usual_file_mode(tmp_path):
    path = plotting.save_figure(_draw(), tmp_path / "new" / "dir" / "fig.pdf")
    assert path.is_file()
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_failed_save_leaves_no_partial_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    path = tmp_path / "fig.pdf"
    path.write_bytes(b"old figure")
    fig = _draw()

    def savefig_that_dies_halfway(fname, **kwargs):
        Path(fname).write_bytes(b"%PDF-1.4 truncated")
        raise RuntimeError("disk full")

    monkeypatch.setattr(fig, "savefig", savefig_that_dies_halfway)
    with pytest.raises(RuntimeError, match="disk full"):
        plotting.save_figure(fig, path)
    assert path.read_bytes() == b"old figure"
    assert _listing(tmp_path) == ["fig.pdf"]


def test_failed_first_save_creates_no_file(tmp_path, monkeypatch):
    fig = _draw()

    def savefig_that_fails(fname, **kwargs):
        raise OSError("no space")

    monkeypatch.setattr(fig, "savefig", savefig_that_fails)
    with pytest.raises(OSError, match="no space"):
        plotting.save_figure(fig, tmp_path / "fig.pdf")
    assert _listing(tmp_path) == []


def test_save_figure_rejects_a_path_without_suffix(tmp_path):
    with pytest.raises(ValueError, match="suffix"):
        plotting.save_figure(_draw(), tmp_path / "figure")


def test_repo_path_resolves_from_the_root_and_from_a_subdirectory(tmp_path, monkeypatch):
    (tmp_path / "Snakefile").write_text("")
    (tmp_path / "notebooks").mkdir()
    for cwd in (tmp_path, tmp_path / "notebooks"):
        monkeypatch.chdir(cwd)
        assert plotting.repo_path("results/x.csv") == tmp_path / "results" / "x.csv"
    assert plotting.repo_path(tmp_path / "abs.csv") == tmp_path / "abs.csv"


def test_repo_path_outside_a_repository_raises(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if any((d / "Snakefile").is_file() for d in (tmp_path, *tmp_path.parents)):
        pytest.skip("a Snakefile sits above the temporary directory")
    with pytest.raises(FileNotFoundError, match="Snakefile"):
        plotting.repo_path("results/x.csv")


@pytest.mark.parametrize(
    ("value", "label"),
    [
        (61440, "61,440"),
        (448, "448"),
        (2048.0, "2,048"),
        (30.0, "30"),
        (2**-17, "$2^{-17}$"),
        (2**-9, "$2^{-9}$"),
        (100 * 2**-17 / 448, r"$1.7\times10^{-6}$"),
        (0.0, "0"),
        (-0.25, "$-2^{-2}$"),
    ],
)
def test_format_number(value, label):
    assert plotting.format_number(value) == label


def test_scale_caption_names_cpu_scale_when_a_shared_setting_differs():
    caption = plotting.scale_caption(
        {"model": "debug", "steps": 150, "seeds": [1, 2], "lr": 0.25},
        {"model": "8b", "steps": 30000, "seeds": [42]},
    )
    assert (
        caption
        == "ours (CPU scale): model debug, steps 150, seeds 1, 2, lr $2^{-2}$\npaper: model 8b, steps 30,000, seeds 42"
    )


def test_scale_caption_names_paper_scale_when_every_shared_setting_agrees():
    ours = {"seeds": [41, 42, 43], "steps": 500, "grid": 1024.0, "only ours": "x"}
    caption = plotting.scale_caption(ours, {"seeds": [41, 42, 43], "steps": 500, "grid": 1024})
    assert caption.startswith("ours (paper scale): seeds 41, 42, 43, steps 500, grid 1,024, only ours x\n")


def _caption_figure(text: str) -> plt.Figure:
    plotting.apply_style()
    fig, ax = plt.subplots(figsize=(4.0, 3.0))
    ax.plot([1, 2], [3, 4])
    ax.set_xlabel("x label")
    plotting.add_caption(fig, text)
    fig.canvas.draw()
    return fig


def test_add_caption_wraps_to_the_figure_and_keeps_the_axes_above_it():
    fig = _caption_figure("short first line\n" + "a long second paragraph " * 12)
    (caption,) = fig.texts
    renderer = fig.canvas.get_renderer()
    box = caption.get_window_extent(renderer)
    assert box.x1 <= fig.bbox.x1  # wrapped to the figure's width
    assert len(caption.get_text().splitlines()) >= 3
    (ax,) = fig.axes
    assert ax.get_tightbbox(renderer).y0 >= box.y1 - 1  # the x label sits above the caption


def test_saving_a_captioned_figure_twice_gives_identical_bytes(tmp_path):
    first = plotting.save_figure(_caption_figure("ours (CPU scale): a\npaper: b"), tmp_path / "a.pdf")
    second = plotting.save_figure(_caption_figure("ours (CPU scale): a\npaper: b"), tmp_path / "b.pdf")
    assert first.read_bytes() == second.read_bytes()


def test_add_caption_refuses_a_figure_without_constrained_layout():
    fig = plt.figure(layout="none")
    with pytest.raises(ValueError, match="constrained"):
        plotting.add_caption(fig, "text")


class _Outputs(dict):
    """The named outputs of a Snakemake job as the notebook's ``snakemake.output`` holds them."""

    def __getattr__(self, name):
        return self[name]


class _ViewJob:
    """A notebook job whose outputs are named, as Snakemake's are (``items()``)."""

    def __init__(self, **outputs):
        self.input = _Outputs()
        self.output = _Outputs(outputs)


def test_a_rule_declaring_views_gets_them_written_beside_its_figure_and_table(tmp_path):
    figure, table = tmp_path / "figures" / "f.pdf", tmp_path / "figures" / "t.csv"
    views = tmp_path / "report"
    namespace = {
        "snakemake": _ViewJob(f=str(figure), f_view=str(views / "f.png"), t=str(table), t_view=str(views / "t.html")),
        "figure_pdf": "unused",
    }
    plotting.notebook_setup(namespace, figure_pdf="output.f")
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    plotting.save_figure(fig, figure)
    plt.close(fig)
    plotting.save_table(table, [{"a": 1, "b": 2.5}], ["a", "b"])
    assert (views / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<td>2.5</td>" in (views / "t.html").read_text() and table.read_text() == "a,b\n1,2.5\n"


def test_by_hand_a_figure_is_saved_without_a_view(tmp_path):
    namespace = {"figure_pdf": str(tmp_path / "f.pdf")}
    plotting.notebook_setup(namespace, figure_pdf="output.f")
    fig, _ = plt.subplots()
    plotting.save_figure(fig, namespace["figure_pdf"])
    plt.close(fig)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.pdf"]


# --- notebook_setup --------------------------------------------------------------------------------------


class _Files(list):
    """Stands in for Snakemake's Namedlist: a list of paths with some of them (or sublists) named."""

    def __init__(self, **named):
        super().__init__()
        for name, value in named.items():
            self.extend(value if isinstance(value, list) else [value])
            setattr(self, name, value)


class _Snakemake:
    def __init__(self, input: _Files, output: _Files):
        self.input, self.output = input, output


def _parameters() -> dict:
    return {"curves_csv": "results/curves.csv", "runs": [], "figure_pdf": "figures/f.pdf", "other": "left alone"}


def test_notebook_setup_under_snakemake_binds_inputs_and_outputs_and_applies_the_style():
    matplotlib.rcdefaults()
    smk = _Snakemake(
        _Files(curves="r/curves.csv", runs=["r/a.json", "r/b.json"]), _Files(figure="fig.pdf", table="t.csv")
    )
    namespace = {**_parameters(), "snakemake": smk}
    plotting.notebook_setup(namespace, curves_csv="input.curves", runs="input.runs", figure_pdf="output.figure")
    assert namespace["curves_csv"] == "r/curves.csv"
    assert namespace["runs"] == ["r/a.json", "r/b.json"] and type(namespace["runs"]) is list
    assert namespace["figure_pdf"] == "fig.pdf"
    assert namespace["other"] == "left alone"
    assert matplotlib.rcParams["pdf.fonttype"] == 42
    assert matplotlib.rcParams["svg.hashsalt"] == plotting.STYLE["svg.hashsalt"]


def test_notebook_setup_binds_the_whole_input_to_a_bare_section():
    smk = _Snakemake(_Files(a="x.json", b="y.json"), _Files())
    namespace = {"jsons": [], "snakemake": smk}
    plotting.notebook_setup(namespace, jsons="input")
    assert namespace["jsons"] == ["x.json", "y.json"]


def _repository(tmp_path, *files):
    (tmp_path / "Snakefile").write_text("")
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("{}")
    (tmp_path / "notebooks").mkdir()


def test_notebook_setup_by_hand_resolves_the_defaults_from_the_repository_root(tmp_path, monkeypatch, capsys):
    _repository(tmp_path, "results/curves.csv", "results/a.json")
    monkeypatch.chdir(tmp_path / "notebooks")
    namespace = {**_parameters(), "runs": ["results/a.json", tmp_path / "results" / "a.json"]}
    plotting.notebook_setup(namespace, curves_csv="input.curves", runs="input.runs", figure_pdf="output.figure")
    assert namespace["curves_csv"] == tmp_path / "results" / "curves.csv"
    assert namespace["runs"] == [tmp_path / "results" / "a.json"] * 2
    assert namespace["figure_pdf"] == tmp_path / "figures" / "f.pdf"
    assert namespace["other"] == "left alone"
    assert "curves_csv: results/curves.csv" in capsys.readouterr().out  # the first cell says what it read


def test_notebook_setup_by_hand_expands_a_pattern_into_the_sorted_files_it_matches(tmp_path, monkeypatch):
    _repository(
        tmp_path, "results/curves.csv", "results/train/main/b/seed1/final.json", "results/train/main/a/seed2/final.json"
    )
    monkeypatch.chdir(tmp_path)
    namespace = {**_parameters(), "runs": "results/train/main/*/seed*/final.json"}
    plotting.notebook_setup(namespace, curves_csv="input.curves", runs="input.runs", figure_pdf="output.figure")
    main = tmp_path / "results" / "train" / "main"
    assert namespace["runs"] == [main / "a" / "seed2" / "final.json", main / "b" / "seed1" / "final.json"]


def test_notebook_setup_by_hand_names_the_rule_that_makes_a_missing_input(tmp_path, monkeypatch):
    _repository(tmp_path, "results/curves.csv")
    monkeypatch.chdir(tmp_path)
    namespace = {**_parameters(), "runs": "results/train/main/*/seed*/final.json"}
    with pytest.raises(FileNotFoundError, match=r"(?s)'runs'.*rule train_run.*snakemake --cores 2 figures/f.pdf"):
        plotting.notebook_setup(namespace, curves_csv="input.curves", runs="input.runs", figure_pdf="output.figure")


def test_notebook_setup_under_snakemake_binds_a_pattern_parameter_to_the_rules_list():
    smk = _Snakemake(_Files(curves="r/curves.csv", runs=["r/a.json"]), _Files(figure="fig.pdf"))
    namespace = {**_parameters(), "runs": "results/*.json", "snakemake": smk}
    plotting.notebook_setup(namespace, curves_csv="input.curves", runs="input.runs", figure_pdf="output.figure")
    assert namespace["runs"] == ["r/a.json"]


@pytest.mark.parametrize(
    ("sources", "error", "match"),
    [
        ({"missing_csv": "input.missing"}, KeyError, "missing_csv"),
        ({"curves_csv": "inputs.curves"}, ValueError, "inputs.curves"),
        ({"curves_csv": "log"}, ValueError, "log"),
        ({"curves_csv": "params.x"}, ValueError, "params.x"),
    ],
    ids=["undefined parameter", "misspelt section", "log", "params"],
)
def test_notebook_setup_rejects_bad_sources_before_binding_anything(sources, error, match):
    smk = _Snakemake(_Files(curves="r/curves.csv"), _Files(figure="fig.pdf"))
    namespace = {**_parameters(), "snakemake": smk}
    with pytest.raises(error, match=match):
        plotting.notebook_setup(namespace, figure_pdf="output.figure", **sources)
    assert namespace["figure_pdf"] == "figures/f.pdf"


def test_figure_labels_name_what_a_reader_sees_in_the_saved_figure(tmp_path):
    """Titles at any place, axis labels and scales, categorical tick labels, annotations and legend entries."""
    fig, (left, right) = plt.subplots(1, 2)
    left.plot([1, 10], [1, 100], label="UE5M3")
    left.set(xscale="log", yscale="log", xlabel="target T", ylabel="headroom U / T")
    left.set_title("E4M3: 126 codes", loc="left")
    left.annotate("max 448", (1, 1))
    left.legend()
    right.barh([0, 1], [1, 2])
    right.set_yticks([0, 1], labels=["TE NVFP4", "UE5M3 B16"])
    plotting.save_figure(fig, tmp_path / "f.pdf")
    labels = plotting.figure_labels(fig)
    plt.close(fig)
    first, second = labels["axes"]
    assert first["title"] == "E4M3: 126 codes" and first["texts"] == ["max 448"] and first["legend"] == ["UE5M3"]
    assert (first["xscale"], first["yscale"], first["xlabel"]) == ("log", "log", "target T")
    assert {"TE NVFP4", "UE5M3 B16"} <= set(second["ticklabels"])
