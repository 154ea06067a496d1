"""The shipped pipeline configs: ``config/paper.yaml`` holds only what differs from ``config/config.yaml``, and the
paper config pins its hub files (how each section loads: tests/test_pipeline_sections.py and
tests/test_pipeline_check.py)."""

from __future__ import annotations

from pathlib import Path

from ue5m3 import config

ROOT = Path(__file__).resolve().parents[1]
CPU = config.read_yaml(ROOT / "config" / "config.yaml")
PAPER = config.read_yaml(ROOT / "config" / "paper.yaml")


def _duplicates(over: dict, base: dict, path: tuple[str, ...] = ()) -> list[str]:
    found = []
    for key, value in over.items():
        if not isinstance(base, dict) or key not in base:
            continue
        if isinstance(value, dict) and isinstance(base[key], dict):
            found += _duplicates(value, base[key], (*path, key))
        elif value == base[key]:
            found.append(".".join((*path, key)))
    return found


def test_the_paper_config_holds_only_what_differs_from_the_cpu_config():
    assert _duplicates(PAPER, CPU) == []


def test_the_duplicate_finder_sees_a_repeated_value():
    assert _duplicates({"a": {"b": 1, "c": 2}, "d": 3}, {"a": {"b": 1, "c": 5}, "d": 4}) == ["a.b"]


def test_the_cpu_config_fetches_nothing_and_the_paper_config_pins_its_tokenizer():
    from ue5m3.data.hub import TokenizerSource

    assert CPU["tokenizer_source"] is None  # the CPU scale trains its BPE offline: nothing to fetch
    TokenizerSource.from_dict(PAPER["tokenizer_source"], source="paper config")
