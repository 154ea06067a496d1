"""The tiny DAG's Snakemake report in a real browser.

Headless Chromium (Debian's `chromium` and `chromium-driver`, installed by install_browser.sh when missing) opens
the report of the whole DAG on the tiny `.test/` config, checks that every figure and table is listed in its
category by its title with its caption, and shows each one through the report's own viewer, checking that the
screenshot is not blank. The DAG is the one `make test` ran into ``.test/dag/`` (tests/test_tiny_dag.py), brought
up to date by Snakemake first (all of it when `make test` has not run).

Run by `make test-cluster` (after `make test`, from .ci/run).
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ue5m3 import figures

ROOT = Path(__file__).resolve().parents[1]
INSTALLER = Path(__file__).with_name("install_browser.sh")
sys.path.insert(0, str(ROOT / "tests"))  # the test suite's helpers: the tiny DAG's runner and its directory
from helpers import tiny_dag  # noqa: E402


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
def report() -> Path:
    """The tiny DAG (up to date) and its report, one self-contained HTML file. While working on the report,
    UE5M3_REPORT_WORKDIR names a finished run's directory to reuse as it is."""
    reused = os.environ.get("UE5M3_REPORT_WORKDIR")
    work = Path(reused) if reused else tiny_dag.run(fresh=False)
    tiny_dag.snakemake(work, "--report", str(work / "report.html"))
    return work


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
    # the menu lists the categories in the paper's order (each stage's zero-padded place: the menu sorts by name)
    browser.execute_script("app.setView({navbarMode: 'menu'})")
    menu = _until(lambda: browser.find_element("tag name", "body").text, lambda text: "RESULTS" in text.upper())
    shown = [c for c in menu.splitlines() if c in categories]
    assert shown == sorted(categories, key=lambda c: int(c.split()[0])), shown
    for category in sorted(categories):  # as a reader opens them: back to the results menu, then the category
        browser.execute_script("app.setView({navbarMode: 'menu'})")
        in_menu = lambda text, category=category: category in text  # noqa: E731
        menu = _until(lambda: browser.find_element("tag name", "body").text, in_menu)
        assert category in menu, f"the results menu does not list {category!r}"
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


def test_the_report_opens_on_the_claims_table_every_row_in_reach_beside_the_workflow_graph(report, browser):
    """The front page as a reader lands on it: the claims heading, and every claim's statement, reachable with the
    page scrolled to its top left (Snakemake centres its pages in the window, which lost the top of a page taller
    than the window: the heading and the first claim), and the table clear of the workflow graph beside it."""
    claims = list(csv.DictReader((report / "figures" / "claims.csv").open(newline="")))
    assert claims
    browser.get((report / "report.html").as_uri())
    _until(lambda: browser.find_elements("id", "the-paper-s-claims"), bool, timeout=60)
    browser.execute_script("for (const e of document.querySelectorAll('*')) { e.scrollTop = 0; e.scrollLeft = 0; }")
    boxes = browser.execute_script(
        "const box = e => e && e.getBoundingClientRect().toJSON();"
        "const section = document.getElementById('the-paper-s-claims');"
        "return {heading: box(section.querySelector('h1, h2, h3')), table: box(section.querySelector('table')),"
        " graph: box(document.querySelector('.vega-embed'))};"
    )
    assert boxes["heading"]["top"] >= 0 and boxes["heading"]["left"] >= 0, boxes
    assert boxes["table"]["left"] >= 0, boxes
    if boxes["graph"]:  # side by side: the table ends before the graph starts (or lies wholly above or below it)
        table, graph = boxes["table"], boxes["graph"]
        apart = table["right"] <= graph["left"] or table["bottom"] <= graph["top"] or graph["bottom"] <= table["top"]
        assert apart, boxes
    shown = browser.find_element("tag name", "body").text  # what is displayed, not what overflow clips away
    hidden = [row["statement"] for row in claims if " ".join(row["statement"].split()) not in " ".join(shown.split())]
    assert not hidden, f"claims out of the reader's reach on the front page: {hidden}"


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
