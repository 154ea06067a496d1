"""Argument types shared by the verbs of the ``ue5m3`` command line."""

from __future__ import annotations

import argparse
from typing import TypeVar

from ue5m3.evaluation.policies import InferencePolicy

T = TypeVar("T")

__all__ = [
    "non_negative_int",
    "thread_count",
    "add_config_option",
    "load_stage_config",
    "POLICIES",
    "add_checkpoint_options",
    "print_paths",
]

POLICIES = tuple(p.value for p in InferencePolicy)
"""The inference policies (a torch-free enum: building the parser imports no torch)."""


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def thread_count(text: str) -> int:
    """A CPU thread count: an int in [1, 1024] (more than the machine's cores is allowed, none is not)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a thread count, an integer in [1, 1024], got {text!r}") from None
    if not 1 <= value <= 1024:
        raise argparse.ArgumentTypeError(f"expected a thread count, an integer in [1, 1024], got {text!r}")
    return value


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


def add_checkpoint_options(parser: argparse.ArgumentParser, *, policy: bool, many: bool = False) -> None:
    """``--run-dir`` and ``--step`` of a verb that reads one checkpoint (and ``--policy`` when it runs inference);
    ``many``: ``--step`` may be given several times (a list, None without one)."""
    parser.add_argument("--run-dir", required=True, help="the training run directory")
    if many:
        parser.add_argument(
            "--step",
            type=int,
            action="append",
            default=None,
            help="checkpoint step, once per --out (default: the newest, for one --out)",
        )
    else:
        parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest)")
    if policy:
        parser.add_argument(
            "--policy",
            required=True,
            choices=POLICIES,
            help="activation reference policy of quantized inference (paper appendix A): current_tensor (each "
            "activation's own amax), cold_d50_replay (D = 50 sample-and-hold from a cold start, one refresh per 50 "
            "work units), calibrated_frozen (max amax over the calibration windows, then frozen) or bf16 (no FP4)",
        )


def print_paths(paths: dict) -> int:
    """Print a verb's declared outputs, one ``name: path`` line each; the verb's exit code (0)."""
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0
