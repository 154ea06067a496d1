"""The shipped pipeline configs against the stages' config dataclasses: one home per setting.

* Every stage section of ``config/config.yaml`` (and of the paper config merged over it, as Snakemake merges
  ``--configfile``) loads through its stage's strict loader.
* ``workflow/schemas/config.schema.yaml`` and the dataclasses cannot drift: each schema section names only
  dataclass fields, requires every field without a default, and allows the JSON types the loader accepts.
* ``config/paper.yaml`` holds only what differs from ``config/config.yaml``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ue5m3 import config
from ue5m3.data import DataConfig
from ue5m3.experiments.accumulation import AccumulationConfig
from ue5m3.experiments.range_analysis import RangeAnalysisConfig
from ue5m3.identify.grid_control import GridControlConfig
from ue5m3.identify.probes import CorpusConfig
from ue5m3.training.config import OptimConfig

ROOT = Path(__file__).resolve().parents[1]
CPU = config.read_yaml(ROOT / "config" / "config.yaml")
PAPER = config.read_yaml(ROOT / "config" / "paper.yaml")
SCHEMA = config.read_yaml(ROOT / "workflow" / "schemas" / "config.schema.yaml")

# (key path in the pipeline config, path of its schema in the JSON schema, the stage dataclass)
SECTIONS = [
    (("range_analysis",), ("$defs", "range_analysis"), RangeAnalysisConfig),
    (("accumulation",), ("$defs", "accumulation"), AccumulationConfig),
    (("data",), ("$defs", "data"), DataConfig),
    (("identification", "grid_control"), ("$defs", "identification", "properties", "grid_control"), GridControlConfig),
]


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _at(tree: dict, path: tuple[str, ...]):
    for key in path:
        tree = tree[key]
    return tree


def _resolve(node: dict) -> dict:
    while "$ref" in node:
        node = _at(SCHEMA, tuple(node["$ref"].removeprefix("#/").split("/")))
    return node


def _json_types(node: dict) -> set[str]:
    """The JSON types a schema fragment allows (an empty set: anything)."""
    node = _resolve(node)
    if "anyOf" in node:
        return set().union(*(_json_types(n) for n in node["anyOf"]))
    kind = node.get("type")
    if kind is None and "enum" in node:
        names = {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null"}
        return {names[type(v)] for v in node["enum"]}
    return set(kind) if isinstance(kind, list) else {kind} if kind else set()


CONFIGS = {"cpu": CPU, "paper": _merge(CPU, PAPER)}


@pytest.mark.parametrize("which", sorted(CONFIGS))
@pytest.mark.parametrize(("path", "cls"), [(p, c) for p, _, c in SECTIONS], ids=[".".join(p) for p, _, _ in SECTIONS])
def test_each_stage_section_loads_through_its_strict_loader(which, path, cls):
    config.load(cls, _at(CONFIGS[which], path), source=f"{which} config", path=".".join(path))


@pytest.mark.parametrize("which", sorted(CONFIGS))
def test_corpora_and_the_optimizer_load_through_their_loaders(which):
    cfg = CONFIGS[which]
    for name, corpus in cfg["identification"]["corpora"].items():
        config.load(CorpusConfig, corpus, source=which, path=f"identification.corpora.{name}")
    for section in ("training", "control"):
        config.load(OptimConfig, cfg[section]["optim"], source=which, path=f"{section}.optim")


@pytest.mark.parametrize(
    ("schema_path", "cls"), [(s, c) for _, s, c in SECTIONS], ids=[c.__name__ for *_, c in SECTIONS]
)
def test_the_schema_and_the_dataclass_agree(schema_path, cls):
    section = _resolve(_at(SCHEMA, schema_path))
    expected = config.schema(cls)
    assert section.get("additionalProperties") is False, "a stage section must refuse unknown keys"
    unknown = set(section["properties"]) - set(expected["properties"])
    assert not unknown, f"schema {'/'.join(schema_path)} names keys {cls.__name__} does not have: {sorted(unknown)}"
    not_required = set(expected["required"]) - set(section.get("required", []))
    assert not not_required, f"{cls.__name__} has no default for {sorted(not_required)}; the schema must require them"
    for key, node in section["properties"].items():
        ours, theirs = _json_types(expected["properties"][key]), _json_types(node)
        if ours and theirs:
            widened = theirs - ours - ({"integer"} if "number" in ours else set())
            assert not widened, f"schema {key}: allows {sorted(widened)}, which {cls.__name__}.{key} refuses"


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


def test_the_tokenizer_source_schema_and_dataclass_agree():
    from ue5m3.data.hub import TokenizerSource

    section = _resolve(_at(SCHEMA, ("$defs", "tokenizer_source")))
    expected = config.schema(TokenizerSource)
    assert section["additionalProperties"] is False
    assert set(section["properties"]) == set(expected["properties"])
    assert set(expected["required"]) <= set(section["required"])
    assert CPU["tokenizer_source"] is None  # the CPU scale trains its BPE offline: nothing to fetch
    TokenizerSource.from_dict(CONFIGS["paper"]["tokenizer_source"], source="paper config")
