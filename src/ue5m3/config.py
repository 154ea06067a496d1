"""One strict loader for every config of the project (style rule 6).

Each stage's settings are a frozen, keyword-only dataclass whose defaults are written once, in the dataclass.
:func:`load` builds one from plain data (a YAML/JSON mapping) and refuses, naming the source file and the key
path:

* unknown keys and missing keys without a default (both listed);
* values of the wrong type (a bool where a number belongs, a string where a list belongs, a float where an int
  belongs), unknown enum values (the accepted ones listed);
* numbers outside the range their dataclass declares for them (:class:`Range`, in a ``RANGES`` class attribute:
  the values a real run could use, with a note on what one does), NaN anywhere and infinities unless a range
  admits them;
* whatever the dataclass's own ``__post_init__`` refuses (its message is prefixed with the key path).

Types are read from the dataclass annotations: ``int``, ``float`` (ints accepted), ``str``, ``bool``, ``None``
and unions with it, ``tuple[X, ...]``, ``tuple[X, Y]``, ``list[X]``, ``Mapping[str, X]``/``dict``, ``Literal``,
``StrEnum``/``IntEnum`` subclasses (by value), nested dataclasses and ``Any``. Lists become tuples where a tuple is
declared, enum strings become members. :func:`dump` is the inverse (plain data for YAML or JSON), and
:func:`read_yaml` refuses duplicate keys, which PyYAML would otherwise silently resolve to the last value.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
import types
import typing
from collections.abc import Mapping, Sequence
from functools import cache
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, TypeVar

import yaml

__all__ = [
    "ConfigError",
    "ConfigTypeError",
    "Range",
    "ranges",
    "range_problems",
    "outside",
    "check_ranges",
    "load",
    "load_as",
    "load_value",
    "dump",
    "read_yaml",
    "field_types",
    "field_docs",
    "has_default",
    "schema",
]

T = TypeVar("T")


class ConfigError(ValueError):
    """A config value refused by the strict loader; the message names the source and the key path."""


class ConfigTypeError(TypeError, ConfigError):
    """A config value of the wrong type (a TypeError, as style rule 14 asks, and a :class:`ConfigError`)."""


def _where(source: str, path: str) -> str:
    return f"{source}: {path or '<root>'}"


# ----- YAML without duplicate keys ----------------------------------------------------------------------


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with the same key twice (PyYAML keeps the last one silently)."""


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: dict[Any, yaml.Mark] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key!r} (first at line {seen[key].line + 1})",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def read_yaml(path: str | os.PathLike[str] | Traversable) -> Any:
    """Parse a YAML (or JSON) file, refusing duplicate keys; errors name the file.

    Raises:
        FileNotFoundError: no such file.
        ConfigError: not valid YAML, or a duplicate key.
    """
    source = str(path)
    text = path.read_text(encoding="utf-8") if hasattr(path, "read_text") else Path(path).read_text(encoding="utf-8")
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from None


def load_value(text: str, *, what: str = "config") -> tuple[Any, str]:
    """A config given on a command line: a JSON/YAML mapping inline, the path of a YAML/JSON file, or a section of
    one as ``PATH#dotted.key`` (``config/config.yaml#evaluation.nll``: the pipeline config's section of a stage).

    Returns:
        (the parsed data, the source to name in errors).

    Raises:
        ConfigError: not valid JSON/YAML, or no such section in the file.
    """
    stripped = text.strip()
    if stripped.startswith(("{", "[")):
        try:
            return json.loads(stripped), f"{what} (inline JSON)"
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{what} (inline JSON): not valid JSON: {exc}") from None
    path, _, section = stripped.partition("#")
    data = read_yaml(path)
    walked: list[str] = []
    for key in filter(None, section.split(".")):
        if not isinstance(data, Mapping) or key not in data:
            keys = sorted(data) if isinstance(data, Mapping) else []
            raise ConfigError(f"{path}: no section {'.'.join([*walked, key])!r} (keys there: {keys})")
        data, walked = data[key], [*walked, key]
    return data, stripped


# ----- types --------------------------------------------------------------------------------------------


@cache
def field_types(cls: type) -> dict[str, Any]:
    """The resolved annotation of every field of dataclass ``cls``."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def has_default(f: dataclasses.Field) -> bool:
    """Whether a dataclass field may be omitted (it has a default or a default factory)."""
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


_has_default = has_default


def default_of(f: dataclasses.Field) -> Any:
    """A field's default value (its factory called), or :data:`dataclasses.MISSING`."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


@cache
def field_docs(cls: type) -> dict[str, str]:
    """Each field's documentation, one line of plain text: a docstring under the field, or its entry in the
    ``Attributes:`` section of the class docstring (the two styles the project's dataclasses use); inherited fields
    are documented by the class that declares them."""
    import ast
    import inspect
    import textwrap

    docs: dict[str, str] = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        docs.update(_attributes_section(klass.__doc__ or ""))
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, body[1:], strict=False):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = " ".join(after.value.value.split())
    names = {f.name for f in dataclasses.fields(cls)}
    return {name: text for name, text in docs.items() if name in names}


def _attributes_section(docstring: str) -> dict[str, str]:
    """``name: text`` entries (with their indented continuation lines) of a Google-style ``Attributes:`` section."""
    import inspect

    entries: dict[str, list[str]] = {}
    inside, current, indent = False, None, None
    for line in inspect.cleandoc(docstring).splitlines():
        stripped = line.strip()
        if stripped == "Attributes:":
            inside, current, indent = True, None, None
            continue
        if not inside:
            continue
        if not stripped:
            current = None
            continue
        depth = len(line) - len(line.lstrip())
        if indent is None:
            indent = depth
        if depth < indent:
            break
        head, sep, rest = stripped.partition(":")
        if depth == indent and sep and all(part.strip().isidentifier() for part in head.split(",")):
            names = [n.strip() for n in head.split(",")]
            current = names
            for name in names:
                entries[name] = [rest.strip()]
        elif current is not None:
            for name in current:
                entries[name].append(stripped)
    return {name: " ".join(part for part in parts if part) for name, parts in entries.items()}


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if tp is Any:
        return "any value"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return f"one of {[m.value for m in tp]}"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if origin is typing.Literal:
        return f"one of {list(typing.get_args(tp))}"
    if origin in (tuple, list, Sequence):
        return "a list"
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        return "a mapping"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _type_error(value: Any, tp: Any, source: str, path: str) -> ConfigError:
    return ConfigTypeError(f"{_where(source, path)}: expected {_describe(tp)}, got {type(value).__name__} {value!r}")


def _same_container(value: Any, tp: Any) -> bool:
    """Whether ``value`` is a list and ``tp`` a list type, or ``value`` a mapping and ``tp`` a mapping or dataclass."""
    origin = typing.get_origin(tp)
    if isinstance(value, list | tuple):
        return origin in (tuple, list, Sequence) or tp in (tuple, list)
    if isinstance(value, Mapping):
        return dataclasses.is_dataclass(tp) or origin in (dict, Mapping) or tp in (dict, Mapping)
    return False


def _convert(value: Any, tp: Any, source: str, path: str, complete: bool = False) -> Any:
    """``value`` checked against ``tp`` and converted (lists to tuples, strings to enum members)."""
    if tp is Any:
        return value
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        shaped = []  # the errors of alternatives whose container kind (list or mapping) the value has
        for arg in (a for a in args if a is not type(None)):
            try:
                return _convert(value, arg, source, path, complete)
            except ConfigError as exc:
                errors.append(exc)
                if _same_container(value, arg):
                    shaped.append(exc)
        if len(errors) == 1 and not isinstance(errors[0], ConfigTypeError):
            raise errors[0]  # the right type, a wrong value: that alternative's own message
        if len(shaped) == 1:
            raise shaped[0]  # a list where a list or a mapping belongs: the list's own (inner) problem
        raise _type_error(value, tp, source, path)
    if tp is type(None):
        if value is not None:
            raise _type_error(value, tp, source, path)
        return None
    if origin is typing.Literal:
        if not any(value == a and type(value) is type(a) for a in args):  # True is not 1, 1.0 not 1
            raise ConfigError(f"{_where(source, path)}: unknown value {value!r}; accepted: {list(args)}")
        return value
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        accepted = [m.value for m in tp]
        if isinstance(value, tp):
            return value
        if isinstance(value, bool) or value not in accepted:
            raise ConfigError(f"{_where(source, path)}: unknown value {value!r}; accepted: {accepted}")
        return tp(value)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        return load(tp, value, source=source, path=path, complete=complete)
    if tp is bool:
        if not isinstance(value, bool):
            raise _type_error(value, tp, source, path)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _type_error(value, tp, source, path)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _type_error(value, tp, source, path)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise _type_error(value, tp, source, path)
        return value
    if origin in (tuple, list, Sequence) or tp in (tuple, list):
        if not isinstance(value, list | tuple):
            raise _type_error(value, tp, source, path)
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            if len(value) != len(args):
                raise ConfigError(f"{_where(source, path)}: expected {len(args)} items, got {len(value)}: {value!r}")
            items = [
                _convert(v, a, source, f"{path}[{i}]", complete)
                for i, (v, a) in enumerate(zip(value, args, strict=True))
            ]
        else:
            item_tp = args[0] if args else Any
            items = [_convert(v, item_tp, source, f"{path}[{i}]", complete) for i, v in enumerate(value)]
        return items if origin is list or tp is list else tuple(items)
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise _type_error(value, tp, source, path)
        key_tp, value_tp = args if args else (Any, Any)
        return {
            _convert(k, key_tp, source, f"{path}.{k}"): _convert(
                v, value_tp, source, f"{path}.{k}" if path else str(k), complete
            )
            for k, v in value.items()
        }
    if isinstance(tp, type):
        if not isinstance(value, tp):
            raise _type_error(value, tp, source, path)
        return value
    raise TypeError(f"config loader: unsupported annotation {tp!r} at {path}")


# ----- ranges -------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Range:
    """The values a numeric setting accepts: what a real run could use, not merely what the type holds.

    A dataclass declares its fields' ranges in a ``RANGES`` class attribute (``ClassVar[dict[str, Range]]``, merged
    along the class's bases); the loader refuses a value outside its range before the dataclass is built, naming
    the key, the range and the note. A range applies to every number of a field: each item of a list, each value
    of a mapping (None items are left alone: they mean "off"). NaN is never in range; an infinity only where
    ``high`` is ``math.inf`` (``grad_clip: inf``, no clipping).

    Attributes:
        low: the least value (None: no lower bound).
        high: the greatest value (None: no upper bound, but finite; ``math.inf``: infinity admitted).
        low_open: ``low`` itself is excluded (``lr`` lies in (0, 1]).
        high_open: ``high`` itself is excluded.
        note: what the setting is and what a real run uses, shown with a refusal (``AdamW epsilon; runs use
            1e-8``).
    """

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    note: str = ""

    def __contains__(self, value: object) -> bool:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if isinstance(value, float) and math.isnan(value):
            return False
        if isinstance(value, float) and math.isinf(value) and not (value > 0 and self.high == math.inf):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def describe(self) -> str:
        """What the range asks, as a message says it: ``in [1, 100,000,000]``, ``in (0, 1]``, ``> 0``."""
        low = None if self.low is None else _number(self.low)
        high = None if self.high is None or self.high == math.inf else _number(self.high)
        if high is None:
            return "a finite number" if low is None else f"{'>' if self.low_open else '>='} {low}"
        if low is None:
            return f"{'<' if self.high_open else '<='} {high}"
        return f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"


def _number(value: float) -> str:
    if isinstance(value, int) or float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:g}"


def ranges(cls: type) -> dict[str, Range]:
    """The ranges dataclass ``cls`` declares for its fields (``RANGES``, a subclass's entries over its bases')."""
    merged: dict[str, Range] = {}
    for klass in reversed(cls.__mro__):
        merged.update(klass.__dict__.get("RANGES", {}))
    return merged


def _numbers(value: Any, label: str) -> typing.Iterator[tuple[str, Any]]:
    """(label, number) of every number in a field's value: itself, the items of a list, the values of a mapping."""
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _numbers(item, f"{label}[{i}]")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _numbers(item, f"{label}.{key}")
    elif value is not None and not isinstance(value, bool | str | enum.Enum):
        yield label, value


def outside(bounds: Range, value: Any, label: str) -> list[str]:
    """``label: must be in ..., got X`` for every number of ``value`` (a field's value) outside ``bounds``."""
    note = f" ({bounds.note})" if bounds.note else ""
    return [
        f"{where}: must be {bounds.describe()}{note}, got {number!r}"
        for where, number in _numbers(value, label)
        if number not in bounds
    ]


def range_problems(cls: type, values: Mapping[str, Any]) -> list[str]:
    """``key: must be in ..., got X`` for every number of ``values`` (field name -> value) outside its range."""
    declared = ranges(cls)
    return [
        problem for key, value in values.items() if key in declared for problem in outside(declared[key], value, key)
    ]


def check_ranges(obj: Any) -> None:
    """Refuse a dataclass instance (from its ``__post_init__``) holding a number outside its field's range, so an
    instance built in code is held to the ranges the loader enforces.

    Raises:
        ValueError: ``key: must be in ..., got X`` for the first such number.
    """
    values = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init}
    problems = range_problems(type(obj), values)
    if problems:
        raise ValueError(problems[0])


# ----- load and dump ------------------------------------------------------------------------------------


def load(cls: type[T], data: Any, *, source: str = "<config>", path: str = "", complete: bool = False) -> T:
    """Build dataclass ``cls`` from plain data, strictly (see the module docstring).

    Args:
        cls: a dataclass.
        data: a mapping of its field names to plain values.
        source: where the data came from (a file path), named in every error.
        path: the key path of ``data`` inside the source (``training.optim``), named in every error.
        complete: refuse missing keys even where the dataclass has a default (documents that spell out every
            setting, such as recipe files; applies to nested dataclasses too).

    Raises:
        ConfigError: unknown, missing or mistyped keys, unknown enum values, or a refused invariant.
    """
    if not isinstance(data, Mapping):
        raise ConfigTypeError(f"{_where(source, path)}: expected a mapping, got {type(data).__name__} {data!r}")
    declared = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(str(k) for k in data if k not in declared)
    missing = [name for name, f in declared.items() if (complete or not _has_default(f)) and name not in data]
    if unknown or missing:
        raise ConfigError(
            f"{_where(source, path)}: unknown keys {unknown}, missing keys {missing}; expected {list(declared)}"
        )
    hints = field_types(cls)
    kwargs = {
        key: _convert(value, hints[key], source, f"{path}.{key}" if path else key, complete)
        for key, value in data.items()
    }
    problems = range_problems(cls, kwargs)
    if problems:  # before __post_init__: a setting out of its range is named as itself, not by what it breaks
        raise ConfigError(f"{source}: {path}.{problems[0]}" if path else f"{source}: {problems[0]}")
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        kind = ConfigTypeError if isinstance(exc, TypeError) else ConfigError
        raise kind(_invariant_message(source, path, str(exc), declared)) from None


def load_as(tp: Any, data: Any, *, source: str = "<config>", path: str = "") -> Any:
    """A value of annotation ``tp`` (a dataclass, ``X | None``, a mapping of dataclasses, ...) from plain data,
    as strictly as :func:`load` builds a dataclass's fields."""
    return _convert(data, tp, source, path)


def _invariant_message(source: str, path: str, message: str, fields: Mapping[str, Any]) -> str:
    """A ``__post_init__`` message under the key path: 'key: detail' of a field becomes 'path.key: detail'."""
    head, sep, _ = message.partition(":")
    if sep and head.split(".")[0].split("[")[0] in fields:
        return f"{source}: {path}.{message}" if path else f"{source}: {message}"
    return f"{_where(source, path)}: {message}"


def dump(value: Any) -> Any:
    """Plain data (dicts, lists, str, int, float, bool, None) of a config; :func:`load` reads it back."""
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: dump(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
    if isinstance(value, Mapping):
        return {dump(k): dump(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [dump(v) for v in value]
    return value


# ----- schema (the Snakemake schema is generated from it) ----------------------------------------------


def schema(tp: Any) -> dict[str, Any]:
    """A JSON-schema fragment of an annotation or dataclass: what the loader accepts, as types and keys."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return {}
    if dataclasses.is_dataclass(tp):
        declared = [f for f in dataclasses.fields(tp) if f.init]
        hints, docs = field_types(tp), field_docs(tp)
        properties = {}
        for f in declared:
            fragment = schema(hints[f.name])
            properties[f.name] = {"description": docs[f.name], **fragment} if f.name in docs else fragment
        return {
            "type": "object",
            "additionalProperties": False,
            "required": sorted(f.name for f in declared if not _has_default(f)),
            "properties": properties,
        }
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [schema(a) for a in args]}
    if tp is type(None):
        return {"type": "null"}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"enum": [m.value for m in tp]}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    if origin in (tuple, list, Sequence) or tp in (tuple, list):
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            return {"type": "array", "prefixItems": [schema(a) for a in args], "minItems": len(args)}
        return {"type": "array", "items": schema(args[0]) if args else {}}
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        return {"type": "object", "additionalProperties": schema(args[1]) if args else {}}
    return {}
