"""The strict config loader (ue5m3.config): every refusal names the source and the key path."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

import pytest

from ue5m3 import config


class Colour(StrEnum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True, kw_only=True)
class Inner:
    rate: float
    steps: int = 3

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError(f"rate: must be positive, got {self.rate!r}")


@dataclass(frozen=True, kw_only=True)
class Outer:
    name: str
    inner: Inner
    colour: Colour = Colour.RED
    sizes: tuple[int, ...] = ()
    pair: tuple[float, float] = (0.0, 1.0)
    grid: int | None = None
    flag: bool = False
    extra: Mapping[str, int] = field(default_factory=dict)


GOOD = {"name": "x", "inner": {"rate": 2}}


def test_defaults_fill_omitted_keys_and_types_are_converted_once():
    cfg = config.load(Outer, {**GOOD, "colour": "blue", "sizes": [1, 2], "pair": [1, 2]}, source="f.yaml")
    assert cfg == Outer(name="x", inner=Inner(rate=2.0), colour=Colour.BLUE, sizes=(1, 2), pair=(1.0, 2.0))
    assert isinstance(cfg.inner.rate, float) and cfg.colour is Colour.BLUE


def test_dump_is_the_inverse_of_load():
    cfg = config.load(Outer, {**GOOD, "sizes": [4], "extra": {"a": 1}}, source="f.yaml")
    assert config.load(Outer, config.dump(cfg)) == cfg


@pytest.mark.parametrize(
    ("data", "kind", "message"),
    [
        ({**GOOD, "nmae": 1}, config.ConfigError, "f.yaml: <root>: unknown keys ['nmae'], missing keys []"),
        ({"inner": {"rate": 1}}, config.ConfigError, "missing keys ['name']"),
        ({**GOOD, "inner": {"rate": 1, "stpes": 2}}, config.ConfigError, "f.yaml: inner: unknown keys ['stpes']"),
        ({**GOOD, "flag": "no"}, config.ConfigTypeError, "f.yaml: flag: expected bool, got str 'no'"),
        ({**GOOD, "inner": {"rate": True}}, config.ConfigTypeError, "f.yaml: inner.rate: expected float, got bool"),
        ({**GOOD, "grid": 2.5}, config.ConfigTypeError, "f.yaml: grid: expected int or null, got float 2.5"),
        ({**GOOD, "sizes": "1,2"}, config.ConfigTypeError, "f.yaml: sizes: expected a list, got str"),
        ({**GOOD, "sizes": [1, "2"]}, config.ConfigTypeError, "f.yaml: sizes[1]: expected int, got str '2'"),
        ({**GOOD, "pair": [1.0]}, config.ConfigError, "f.yaml: pair: expected 2 items, got 1"),
        ({**GOOD, "colour": "green"}, config.ConfigError, "f.yaml: colour: unknown value 'green'; accepted: ['red'"),
        ({**GOOD, "inner": {"rate": -1}}, config.ConfigError, "f.yaml: inner.rate: must be positive, got -1.0"),
        ({**GOOD, "extra": {"a": "b"}}, config.ConfigTypeError, "f.yaml: extra.a: expected int, got str 'b'"),
        ([1], config.ConfigTypeError, "f.yaml: <root>: expected a mapping, got list"),
    ],
)
def test_bad_values_are_refused_naming_the_source_and_the_key_path(data, kind, message):
    with pytest.raises(kind) as info:
        config.load(Outer, data, source="f.yaml")
    assert message in str(info.value)


def test_type_errors_are_type_errors_and_config_errors():
    with pytest.raises(TypeError):
        config.load(Outer, {**GOOD, "flag": 1})
    assert issubclass(config.ConfigTypeError, config.ConfigError)


@dataclass(frozen=True, kw_only=True)
class Either:
    layers: tuple[int, ...] | Inner


@pytest.mark.parametrize(
    ("value", "kind", "message"),
    [
        ([1, 2.5], config.ConfigTypeError, "f.yaml: layers[1]: expected int, got float 2.5"),  # the list's problem
        ({"rate": "x"}, config.ConfigTypeError, "f.yaml: layers.rate: expected float, got str 'x'"),
        ({"rat": 1}, config.ConfigError, "f.yaml: layers: unknown keys ['rat']"),
        ("x", config.ConfigTypeError, "f.yaml: layers: expected a list or a mapping, got str 'x'"),
    ],
)
def test_a_union_of_a_list_and_a_mapping_reports_the_alternative_of_the_values_shape(value, kind, message):
    with pytest.raises(kind) as info:
        config.load(Either, {"layers": value}, source="f.yaml")
    assert message in str(info.value)
    assert config.load(Either, {"layers": [1, 2]}).layers == (1, 2)


def test_complete_documents_refuse_keys_left_to_defaults():
    with pytest.raises(config.ConfigError, match=r"inner: unknown keys \[\], missing keys \['steps'\]"):
        config.load(Outer, {**config.dump(config.load(Outer, GOOD)), "inner": {"rate": 1.0}}, complete=True)


def test_read_yaml_refuses_duplicate_keys_and_names_the_file(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("a: 1\nb:\n  c: 2\n  c: 3\n")
    pattern = r"(?s)dup.yaml: not valid YAML: .*duplicate key 'c' \(first at line 3\)"
    with pytest.raises(config.ConfigError, match=pattern):
        config.read_yaml(path)


def test_load_value_reads_inline_json_or_a_file(tmp_path):
    assert config.load_value('{"a": 1}') == ({"a": 1}, "config (inline JSON)")
    path = tmp_path / "c.yaml"
    path.write_text("a: 2\n")
    assert config.load_value(str(path)) == ({"a": 2}, str(path))
    with pytest.raises(config.ConfigError, match="not valid JSON"):
        config.load_value("{a: 1")


def test_load_value_reads_a_section_of_a_file(tmp_path):
    path = tmp_path / "pipeline.yaml"
    path.write_text("evaluation:\n  nll: {seed: 3}\n  steps: [1]\n")
    assert config.load_value(f"{path}#evaluation.nll") == ({"seed": 3}, f"{path}#evaluation.nll")
    with pytest.raises(
        config.ConfigError, match=r"no section 'evaluation.snapshot' \(keys there: \['nll', 'steps'\]\)"
    ):
        config.load_value(f"{path}#evaluation.snapshot")


def test_field_docs_read_both_docstring_styles():
    @dataclasses.dataclass
    class Documented:
        """Something.

        Attributes:
            a, b: two numbers
                on two lines.
        """

        a: int = 1
        b: int = 2
        c: int = 3
        """The third."""

    assert config.field_docs(Documented) == {
        "a": "two numbers on two lines.",
        "b": "two numbers on two lines.",
        "c": "The third.",
    }


def test_schema_describes_what_the_loader_accepts():
    schema = config.schema(Outer)
    assert schema["required"] == ["inner", "name"] and schema["additionalProperties"] is False
    assert schema["properties"]["grid"] == {"anyOf": [{"type": "integer"}, {"type": "null"}]}
    assert schema["properties"]["colour"] == {"enum": ["red", "blue"]}
    assert schema["properties"]["pair"]["minItems"] == 2
