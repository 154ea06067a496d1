"""The whole DAG on the tiny `.test/` config, end to end, and its Snakemake report in a real browser.

One run of every rule (data, training runs, the override control, evaluations, identification, throughput,
summaries, figures and report views), then `snakemake --report`; headless Chromium (Debian's `chromium` and
`chromium-driver`, installed by install_browser.sh when missing) opens the report, checks that every figure and
table is listed in its category with its caption, and shows each one through the report's own viewer, checking
that the screenshot is not blank.

Run by `make test-cluster` (after `make test`, from .ci/run).
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ue5m3 import figures

ROOT = Path(__file__).resolve().parents[1]
INSTALLER = Path(__file__).with_name("install_browser.sh")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _snakemake(work: Path, *args: str) -> None:
    command = ["snakemake", "--snakefile", str(ROOT / "Snakefile"), "--directory", str(work)]
    command += ["--configfile", str(ROOT / ".test" / "config.yaml"), *args]
    result = subprocess.run(command, cwd=work, env=_env(), capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"


@pytest.fixture(scope="module")
def browser():
    if shutil.which("chromium") is None or shutil.which("chromedriver") is None:
        subprocess.run(["bash", str(INSTALLER)], check=True, timeout=1200)
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.add_argument("--window-size=1400,1000")
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
    driver = webdriver.Chrome(options=options, service=service)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    """Every rule of the DAG on the tiny config, then the report (one self-contained HTML file). While working on
    the report, UE5M3_REPORT_WORKDIR names a finished run's directory to reuse (its report is rebuilt)."""
    reused = os.environ.get("UE5M3_REPORT_WORKDIR")
    if reused:
        work = Path(reused)
        _snakemake(work, "--report", str(work / "report.html"))
        return work
    work = tmp_path_factory.mktemp("report")
    shutil.copytree(ROOT / "config", work / "config")
    _snakemake(work, "--cores", "2")
    _snakemake(work, "--report", str(work / "report.html"))
    return work


def test_every_stage_ran_end_to_end_on_the_tiny_config(report):
    work = report
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


def _expected_views(work: Path) -> set[str]:
    """The report view of every figure (PDF -> PNG) and table (CSV -> HTML) the run wrote to figures/."""
    suffix = {".pdf": ".png", ".csv": ".html"}
    drawn = [p for p in (work / "figures").iterdir() if p.suffix in suffix]
    assert len(drawn) >= 25, sorted(p.name for p in drawn)
    return {p.stem + suffix[p.suffix] for p in drawn}


def _not_blank(png: bytes) -> float:
    """The fraction of pixels that differ from the most common colour (the background)."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("L")
    histogram = image.histogram()
    return 1.0 - max(histogram) / sum(histogram)


def test_the_report_lists_every_figure_and_table_in_its_category_and_renders_each(report, browser, tmp_path):
    expected = _expected_views(report)
    browser.get((report / "report.html").as_uri())
    deadline = time.monotonic() + 60
    while browser.execute_script("return typeof app === 'undefined' || typeof results === 'undefined'"):
        assert time.monotonic() < deadline, "the report's application never started"
        time.sleep(0.5)
    listed = browser.execute_script(
        "const out = {}; for (const [c, subs] of Object.entries(categories)) for (const paths of Object.values(subs))"
        " for (const p of paths) out[p] = c; return out;"
    )
    by_name = {Path(path).name: (path, category) for path, category in listed.items()}
    assert set(by_name) == expected, f"listed: {sorted(by_name)}"
    categories = {category for _, category in by_name.values()}
    placed = ("paper section", "paper appendix", "(beyond the paper")
    assert all(any(p in c for p in placed) for c in categories), categories
    for category in sorted(categories):  # as a reader opens them: back to the results menu, then the category
        browser.execute_script("app.setView({navbarMode: 'menu'})")
        _until(lambda: browser.find_element("tag name", "body").text, lambda text: "Results" in text)
        browser.execute_script("app.showCategory(arguments[0])", category)
        # each item listed by its title (the registry's), not by its file path
        titles = [figures.figure(Path(n).stem).title for n, (_, c) in by_name.items() if c == category]
        listed_all = lambda text, titles=titles: all(t in text for t in titles)  # noqa: E731
        text = _until(lambda: browser.find_element("tag name", "body").text, listed_all)
        missing = [t for t in titles if t not in text]
        assert not missing, f"{missing} are not listed under {category!r}"
    blank = {}
    for name, (path, _) in sorted(by_name.items()):
        caption = browser.execute_script("return results[arguments[0]].caption", path)
        assert caption and len(caption) > 40, f"{name} has no caption"
        browser.execute_script("new ToggleViewManager(app).handleSelectedResult(arguments[0])", path)
        shot = _until(browser.get_screenshot_as_png, lambda png: _not_blank(png) >= MIN_INK)
        (tmp_path / f"{name}.png").write_bytes(shot)
        if _not_blank(shot) < MIN_INK:
            blank[name] = round(_not_blank(shot), 4)
    assert not blank, f"blank views (fraction of non-background pixels): {blank}; screenshots in {tmp_path}"


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


def test_every_figures_caption_names_only_what_the_figure_shows(report):
    """The registry's caption against the figure's own titles, labels, legend, ticks and annotations (the sidecar
    each figure rule writes beside its report view): the formats it names and the log axes it claims."""
    problems = {}
    for item in (f for f in figures.FIGURES if f.kind == "pdf"):
        labels = json.loads((report / "results" / "report" / f"{item.name}.labels.json").read_text())
        if found := _caption_disagreements(item.caption, labels):
            problems[item.name] = found
    assert not problems, problems


MIN_INK = 0.02  # the share of pixels off the background below which a view counts as blank


def _until(read, done, timeout: float = 15.0):
    """``read()`` until ``done`` holds for it or ``timeout`` seconds pass (the report renders asynchronously);
    the last value read."""
    deadline = time.monotonic() + timeout
    value = read()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(0.25)
        value = read()
    return value


NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.fixture(scope="module")
def checkout(report) -> Path:
    """The finished DAG's directory laid out as the README's user's checkout: the Snakefile at its root (what the
    notebooks' defaults resolve from), workflow/ and .venv/ beside it (linked), the notebooks in notebooks/ (copied:
    a kernel's working directory is the resolved one)."""
    work = report
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
