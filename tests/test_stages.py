"""The registry of stages and figures (ue5m3.stages) and what is generated from it: the README's stage table, the
rule files' paper sections, the rules' figure outputs, the producers of results named to a notebook run by hand."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ue5m3 import stages

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
    names = [f.name for f in stages.FIGURES]
    assert len(names) == len(set(names)) >= 30
    names = {s.name for s in stages.STAGES}
    assert {f.stage for f in stages.FIGURES} == names
    for rule in stages.figure_rules():
        keys = [f.key for f in stages.figures_of(rule)]
        assert len(keys) == len(set(keys)), rule
    assert sorted(s.order for s in stages.STAGES) == list(range(len(stages.STAGES)))
    assert set().union(*RULE_FILES.values()) == names


def test_every_figure_rule_exists_and_takes_its_outputs_from_the_registry():
    text = {p.name: p.read_text() for p in RULES.glob("*.smk")}
    for rule in stages.figure_rules():
        home = [name for name, body in text.items() if re.search(rf"^rule {rule}:", body, re.M)]
        assert len(home) == 1, rule
        block = text[home[0]].split(f"rule {rule}:", 1)[1].split("\nrule ", 1)[0]
        assert f'**figure_outputs("{rule}")' in block, f"rule {rule} lists its figures by hand"


def test_the_readme_shows_the_registrys_stage_table():
    assert stages.stage_table() in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("name", sorted(RULE_FILES))
def test_each_rule_file_names_the_paper_sections_of_its_stages(name):
    header = " ".join(line.lstrip("# ") for line in (RULES / name).read_text().splitlines()[:4])
    for stage in RULE_FILES[name]:
        assert f"paper {stages.stage(stage).paper}" in header, f"{name}: {stages.stage(stage).paper}"


def test_an_unknown_name_is_refused_naming_the_known_ones():
    with pytest.raises(KeyError, match="range_headroom"):
        stages.figure("range_headrom")
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
