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
