"""Argument types shared by the verbs of the ``ue5m3`` command line."""

from __future__ import annotations

import argparse
from typing import TypeVar

T = TypeVar("T")

__all__ = [
    "json_object",
    "optional_count",
    "positive_float",
    "none_or_int",
    "add_config_option",
    "load_stage_config",
]


def json_object(text: str) -> dict:
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON ({err}): {text[:80]!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {type(value).__name__}")
    return value


def optional_count(text: str) -> int | None:
    if text.lower() in ("none", "null", "all"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'all', got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'all', got {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text!r}")
    return value


def none_or_int(text: str) -> int | None:
    if text.lower() in ("none", "null", "exact", "k"):
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'none', got {text!r}") from None


def add_config_option(parser: argparse.ArgumentParser, dataclass_name: str, *, required: bool = False) -> None:
    """The ``--config`` option of a stage verb: its settings as one JSON object or YAML/JSON file."""
    default = "" if required else " Omitted keys (or the whole option) take the dataclass defaults."
    parser.add_argument(
        "--config",
        required=required,
        default=None,
        help=f"the stage's settings ({dataclass_name}): a JSON object or the path of a YAML/JSON file.{default}",
    )


def load_stage_config(cls: type[T], text: str | None) -> T:
    """The stage config ``cls`` from a ``--config`` value through the strict loader (defaults when None).

    Raises:
        ConfigError: unknown, missing or mistyped keys, naming the source (the file, or the inline JSON).
    """
    from ue5m3 import config

    if text is None:
        return config.load(cls, {}, source="defaults")
    data, source = config.load_value(text, what="--config")
    return config.load(cls, data, source=source)
