"""The registries of stages and figures (ue5m3.stages, ue5m3.figures) and what is generated from them: the README's
stage table, the rule files' paper sections, the rules' figure outputs, the producers of results named to a notebook
run by hand."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ue5m3 import figures, stages

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "workflow" / "rules"

# which rule file runs which stages
RULE_FILES = {
    "range_analysis.smk": ["range_analysis"],
    "accumulation.smk": ["accumulation"],
    "training.smk": ["training", "override_control"],
    "evaluation.smk": ["validation", "policy_sensitivity", "scale_snapshot", "downstream"],
    "identification.smk": ["identification", "grid_control"],
    "throughput.smk": ["throughput"],
    "conformance.smk": ["conformance"],
    "claims.smk": ["claims"],
    "format_study.smk": ["format_study", "scale_telemetry"],
}


def test_names_are_unique_and_every_figure_belongs_to_a_stage():
    names = [f.name for f in figures.FIGURES]
    assert len(names) == len(set(names)) >= 30
    names = {s.name for s in stages.STAGES}
    assert {f.stage for f in figures.FIGURES} == names
    for rule in figures.figure_rules():
        keys = [f.key for f in figures.figures_of(rule)]
        assert len(keys) == len(set(keys)), rule
    assert sorted(s.order for s in stages.STAGES) == list(range(len(stages.STAGES)))
    assert set().union(*RULE_FILES.values()) == names


def test_the_reports_categories_sort_by_name_into_the_stages_order():
    """Snakemake's report lists categories sorted by name: the zero-padded place keeps "10" after "9"."""
    by_order = [s.name for s in sorted(stages.STAGES, key=lambda s: s.order)]
    by_name = sorted(stages.STAGES, key=lambda s: stages.category(s.name))
    assert [s.name for s in by_name] == by_order
    assert stages.category("range_analysis").startswith("01 Range of the block-scale formats (paper sections")


def test_every_figure_rule_exists_and_takes_its_outputs_from_the_registry():
    text = {p.name: p.read_text() for p in RULES.glob("*.smk")}
    for rule in figures.figure_rules():
        home = [name for name, body in text.items() if re.search(rf"^rule {rule}:", body, re.M)]
        assert len(home) == 1, rule
        block = text[home[0]].split(f"rule {rule}:", 1)[1].split("\nrule ", 1)[0]
        assert f'**figure_outputs("{rule}")' in block, f"rule {rule} lists its figures by hand"


def test_the_readme_shows_the_registrys_stage_table():
    assert figures.stage_table() in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("name", sorted(RULE_FILES))
def test_each_rule_file_names_the_paper_sections_of_its_stages(name):
    header = " ".join(line.lstrip("# ") for line in (RULES / name).read_text().splitlines()[:4])
    for stage in RULE_FILES[name]:
        assert stages.placement(stage) in header, f"{name}: {stages.placement(stage)}"


def test_an_unknown_name_is_refused_naming_the_known_ones():
    with pytest.raises(KeyError, match="range_headroom"):
        figures.figure("range_headrom")
    with pytest.raises(KeyError, match="unknown stage"):
        stages.stage("nope")


def test_every_result_a_notebook_reads_has_a_producer_rule_that_exists():
    rules = set()
    for smk in RULES.glob("*.smk"):
        rules |= set(re.findall(r"^\s*(?:use )?(?:rule|checkpoint) (\w+)", smk.read_text(), re.M))
        rules |= set(re.findall(r" as (\w+) with:", smk.read_text()))
    assert {rule for _, rule in stages.PRODUCERS} <= rules
    notebooks = (ROOT / "notebooks").glob("*.py")
    defaults = re.findall(r'^\w+ = "(results/[^"]+)"', "\n".join(p.read_text() for p in notebooks), re.M)
    assert defaults and all(stages.producer(d) for d in defaults), [d for d in defaults if not stages.producer(d)]


_PLACE = r"[0-9A-C][0-9.]*(?:-[0-9.]+)?"
_CITATION = re.compile(rf"\b(sections?|appendix|appendices|table) ({_PLACE}(?:(?:, | and ){_PLACE})*)")


def _cited(text: str) -> set[tuple[str, str]]:
    """The paper places a text names, as (kind, number): 'sections 7.1-7.3' gives the three sections, 'sections 4.1
    and 5.2' both."""
    places = set()
    for kind, numbers in _CITATION.findall(text):
        kind = {"sections": "section", "appendices": "appendix"}.get(kind, kind)
        for place in re.split(r", | and ", numbers):
            first, _, last = place.partition("-")
            places.add((kind, first))
            if last:  # a range within one section: 7.1-7.3
                head, _, low = first.rpartition(".")
                places.update((kind, f"{head}.{n}") for n in range(int(low), int(last.rpartition(".")[2]) + 1))
    return places


def test_cited_places_parse_ranges_and_lists():
    assert _cited("sections 7.1-7.3") == {("section", "7.1"), ("section", "7.2"), ("section", "7.3")}
    assert _cited("section 6 and appendix B") == {("section", "6"), ("appendix", "B")}
    assert _cited("sections 4.1 and 5.2") == {("section", "4.1"), ("section", "5.2")}
    assert _cited("section 7.6 (table 10)") == {("section", "7.6"), ("table", "10")}


@pytest.mark.parametrize("figure", figures.FIGURES, ids=lambda f: f.name)
def test_a_caption_cites_only_the_paper_places_of_its_stage(figure):
    """The one stage-to-section table decides where a figure sits in the paper: a caption that names a section,
    appendix or table names one of its stage's (or a subsection of one)."""
    own = _cited(stages.stage(figure.stage).paper)
    for kind, number in _cited(figure.caption):
        covered = any(k == kind and (number == n or number.startswith(n + ".")) for k, n in own)
        assert covered, f"{figure.name}'s caption cites {kind} {number}; its stage is at {sorted(own)}"
