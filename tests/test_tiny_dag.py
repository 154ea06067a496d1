"""The whole DAG on the tiny `.test/` config, end to end, as the README's user meets it: every stage's outputs, each
notebook's Run All with its defaults against the results, the README's one-figure rebuild and one-figure report run
as written with nothing on PATH, and every figure's caption against the figure's own labels.

The DAG runs fresh into ``.test/dag/`` and stays there: ``make test-cluster`` renders its report in a browser from it
(system_tests/test_report.py).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from helpers import tiny_dag
from ue5m3 import figures, stages

pytestmark = pytest.mark.slow

ROOT = tiny_dag.ROOT


@pytest.fixture(scope="module")
def dag() -> Path:
    """Every rule of the DAG on the tiny config, from nothing."""
    return tiny_dag.run(fresh=True)


def test_every_stage_ran_end_to_end_on_the_tiny_config(dag):
    work = dag
    summary = (work / "results" / "train" / "summary" / "main" / "by_recipe.csv").read_text()
    assert "bf16" in summary and "ue5m3_b16" in summary
    control = (work / "results" / "train" / "summary" / "control" / "final_window.csv").read_text()
    assert "ue5m3_b16_t2048_override" in control
    assert (work / "results" / "train" / "main" / "ue5m3_b16" / "seed1" / "checkpoints" / "step-00000004").is_dir()
    nll = work / "results" / "eval" / "nll" / "ue5m3_b16" / "seed1" / "step4"
    evaluated = sorted(p.stem for p in nll.glob("*.json"))
    assert evaluated == ["calibrated_frozen", "cold_d50_replay", "current_tensor"]
    downstream = work / "results" / "eval" / "downstream" / "ue5m3_b16" / "seed1" / "step4" / "cold_d50_replay.json"
    assert json.loads(downstream.read_text())["aggregates"]["mmlu"]["best"] is not None
    assert "ue5m3_b16" in (work / "figures" / "downstream_vs_paper.csv").read_text()
    assert (work / "results" / "throughput" / "emulated" / "throughput.csv").is_file()


FORMAT_NAMES = ("UE5M3", "E4M3", "UE8M0", "E2M1", "MXFP4", "NVFP4", "BF16")
"""The number formats a caption may name: each one it names as shown must be named in the figure."""


def _shown(labels: dict) -> str:
    """Every text of a figure's labels sidecar (ue5m3.plotting.figure_labels), joined."""
    texts = [labels["suptitle"], *labels["figure_legend"]]
    for ax in labels["axes"]:
        texts += [ax["title"], ax["xlabel"], ax["ylabel"], *ax["legend"], *ax["ticklabels"], *ax["texts"]]
    return " ".join(texts)


def _described(caption: str) -> str:
    """What a caption says the figure shows: without its templated settings, its citations of the paper's own
    numbers (a sentence starting 'Paper', a parenthesis starting 'paper')."""
    text = re.sub(r"\{\{.*?\}\}", "", caption, flags=re.S)
    text = re.sub(r"\(paper [^()]*(\([^()]*\)[^()]*)*\)", "", text)
    return " ".join(s for s in re.split(r"(?<=\.) ", text) if not s.startswith("Paper"))


def _caption_disagreements(caption: str, labels: dict) -> list[str]:
    described, shown = _described(caption), _shown(labels).upper()
    problems = [f"names {name}, which the figure does not" for name in FORMAT_NAMES
                if re.search(rf"\b{name}\b", described) and name not in shown]  # fmt: skip
    scales = {ax[key] for ax in labels["axes"] for key in ("xscale", "yscale")}
    if re.search(r"\blog(2|10)? axis|\baxes log|\blog axes", described) and "log" not in scales:
        problems.append(f"says log axis, the figure's scales are {sorted(scales)}")
    return problems


def test_caption_disagreements_are_found():
    labels = {"suptitle": "", "figure_legend": [], "axes": [
        {"title": "E4M3", "xlabel": "x", "ylabel": "", "legend": [], "ticklabels": [], "texts": [],
         "xscale": "linear", "yscale": "linear"}]}  # fmt: skip
    assert _caption_disagreements("E4M3 and UE5M3 on a log axis. Paper: NVFP4 2.3.", labels) == [
        "names UE5M3, which the figure does not",
        "says log axis, the figure's scales are ['linear']",
    ]
    assert _caption_disagreements("E4M3 values (paper section 4.1: UE8M0 too).", labels) == []


def test_every_figures_caption_names_only_what_the_figure_shows(dag):
    """The registry's caption against the figure's own titles, labels, legend, ticks and annotations (the sidecar
    each figure rule writes beside its report view): the formats it names and the log axes it claims."""
    problems = {}
    for item in (f for f in figures.FIGURES if f.kind == "pdf"):
        labels = json.loads((dag / "results" / "report" / f"{item.name}.labels.json").read_text())
        if found := _caption_disagreements(item.caption, labels):
            problems[item.name] = found
    assert not problems, problems


NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.fixture(scope="module")
def checkout(dag) -> Path:
    """The finished DAG's directory laid out as the README's user's checkout: the Snakefile at its root (what the
    notebooks' defaults resolve from), workflow/ and .venv/ beside it (linked), the notebooks in notebooks/ (copied:
    a kernel's working directory is the resolved one)."""
    work = dag
    for name in ("Snakefile", "workflow", ".venv"):
        if not (work / name).exists():
            (work / name).symlink_to(ROOT / name)
    (work / "notebooks").mkdir(exist_ok=True)
    for notebook in NOTEBOOKS:
        shutil.copy2(notebook, work / "notebooks" / notebook.name)
    return work


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_runs_all_with_its_defaults_against_the_pipelines_results(checkout, notebook):
    """JupyterLab's Run All: every cell in order, the kernel started in notebooks/, no parameter passed; the
    defaults find the results the DAG wrote, and the notebook redraws its figures and tables."""
    import nbformat
    from nbclient import NotebookClient

    path = checkout / "notebooks" / notebook.name
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    started = time.time()
    client.execute()
    first = next(c for c in nb.cells if c.cell_type == "code" and "notebook_setup(" in c.source)
    printed = "".join(o.get("text", "") for o in first.get("outputs", []) if o.get("output_type") == "stream")
    assert "Reading the pipeline's results" in printed, printed
    source = "\n".join(c.source for c in nb.cells)
    drawn = [f.file for f in figures.FIGURES if f"figures/{f.file}" in source]
    assert drawn, f"{notebook.name} names no figure of the registry"
    stale = [name for name in drawn if (checkout / "figures" / name).stat().st_mtime < started]
    assert not stale, f"{notebook.name} did not redraw {stale}"


def test_every_figure_names_recipes_by_the_papers_labels(dag):
    """No title, axis label, legend, tick or annotation of any figure shows a recipe's code identifier where the
    paper has a name for it (the one mapping, ``stages.RECIPE_LABELS``)."""
    identifiers = [r for r, shown in stages.RECIPE_LABELS.items() if r != shown]
    found = {}
    for item in (f for f in figures.FIGURES if f.kind == "pdf"):
        shown = _shown(json.loads((dag / "results" / "report" / f"{item.name}.labels.json").read_text()))
        if raw := [r for r in identifiers if re.search(rf"(?<![\w/.]){re.escape(r)}(?![\w.])", shown)]:
            found[item.name] = raw
    assert not found, found


def _readme_command(starts: str) -> list[str]:
    """The README's command (a code span) that starts with ``starts``, as a list of words."""
    text = (ROOT / "README.md").read_text()
    spans = [s for s in re.findall(r"`([^`\n]+)`", text) if s.startswith(starts)]
    assert spans, f"the README shows no command starting {starts!r}"
    return shlex.split(spans[0])


def test_the_readmes_one_figure_rebuild_and_its_report_work_as_written(checkout):
    """From the checkout's root, nothing exported (PATH without the venv): the README's one-figure rebuild redraws
    the figure, and the README's report of one figure holds it with its caption."""
    work = checkout
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "SNAKEMAKE"))}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p)
    figure = work / "figures" / "range_headroom.pdf"
    figure.unlink()
    rebuild = _readme_command(".venv/bin/snakemake --cores 2 figures/")
    result = subprocess.run(rebuild, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"{' '.join(rebuild)}\n{result.stdout[-3000:]}\n{result.stderr[-4000:]}"
    assert figure.stat().st_size > 0
    report_command = _readme_command(".venv/bin/snakemake --report report.html figures/")
    report_command[-1] = report_command[-1].replace("NAME", "range_headroom")
    result = subprocess.run(report_command, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"{' '.join(report_command)}\n{result.stdout[-3000:]}\n{result.stderr[-4000:]}"
    html = (work / "report.html").read_text(errors="replace")
    assert "range_headroom.png" in html
    caption = figures.figure("range_headroom").caption.split("{{")[0].strip()
    assert caption[:60] in html, "the one-figure report lacks the figure's caption"
