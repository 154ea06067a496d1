"""An early warning of a run going wrong, read from the scale telemetry it logs (issue 26, item 6).

Each logged record of a run's ``metrics.jsonl`` holds the step's scale telemetry per FP4 linear and operand role
(:mod:`ue5m3.layers.telemetry`). :func:`scan` reads the records in step order and flags a logged step when one of
the thresholds of :class:`WarningConfig` is crossed by any (linear, role) entry, or by the step's block counts over
all linears:

* ``headroom_margin``: T * rho / U of a held reference (Proposition 1: blocks saturate once it exceeds 1; rho is the
  tensor's amax over the reference it is scaled by, U the scale format's max) reached ``headroom_margin`` (0.5: half
  of the headroom is used up before the reference is refreshed);
* ``saturated_share``: the share of the quantized blocks whose ideal scale saturated the scale format, over the
  entries scaled by a held reference;
* ``top_code_share``: the share of nonzero blocks whose scale sits at the format's top code, in an entry scaled by a
  held reference (with a current reference the tensor's amax block sits at T by construction: the top code where
  T is the format's max, as E4M3's 448 is);
* ``zero_rounded_share``: the share of the quantized blocks whose scale rounded to zero before the repair (a T too
  small for the tensor's spread of block maxima);
* ``bottom_code_share``: the share of an entry's nonzero blocks whose scale sits at the format's smallest positive
  code (the same, in a format without the repair, as E4M3);
* ``underflowed_share``: the share of the quantized blocks that were nonzero and quantized to all zeros.

The defaults are set from the healthy runs of the CPU DAG (docs/format_study.md, "Early warning"): none of them
reaches any threshold. :func:`diverged` is the divergence the warning is validated against (a loss a stated number
of nats above the run's first logged loss or above its healthy twin's, or a step that stopped on a non-finite
value), and
:func:`warnings_table` gives one row per run: when it was flagged, by which condition, when it diverged and the lead
(tests/test_early_warning.py: runs with injected instabilities are flagged before they diverge, healthy runs are
not flagged).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from ue5m3 import stages
from ue5m3.config import Range

__all__ = ["WarningConfig", "Flag", "scan", "diverged", "read_records", "warnings_table", "WARNING_COLUMNS"]

_SHARE = Range(0, 1, low_open=True, note="a share of blocks in (0, 1]")


@dataclass(frozen=True, kw_only=True)
class WarningConfig:
    """The thresholds of the early warning (any one crossed flags the step) and the divergence it is judged by.

    Attributes:
        headroom_margin: the held-reference headroom margin T * rho / U at which a step is flagged (Proposition 1:
            1 is saturation).
        saturated_share: the share of a step's quantized blocks with a saturated scale (the linears and roles scaled
            by a held reference).
        top_code_share: the share of an entry's nonzero blocks at the scale format's top code (held references).
        zero_rounded_share: the share of a step's quantized blocks whose scale rounded to zero before repair.
        bottom_code_share: the share of an entry's nonzero blocks at the scale format's smallest positive code.
        underflowed_share: the share of a step's quantized blocks that were nonzero and quantized to all zeros.
        divergence_rise: a run has diverged at the first logged step whose loss exceeds its first logged loss by
            this many nats (or at a step that stopped on a non-finite value).
    """

    headroom_margin: float = 0.5
    saturated_share: float = 1e-4
    top_code_share: float = 1e-3
    zero_rounded_share: float = 0.25
    bottom_code_share: float = 0.05
    underflowed_share: float = 1e-3
    divergence_rise: float = 1.0

    RANGES: ClassVar[dict[str, Range]] = {
        "headroom_margin": Range(0, 1, low_open=True, note="T * rho / U of Proposition 1: 1 is saturation"),
        "saturated_share": _SHARE,
        "top_code_share": _SHARE,
        "zero_rounded_share": _SHARE,
        "bottom_code_share": _SHARE,
        "underflowed_share": _SHARE,
        "divergence_rise": Range(0, 100, low_open=True, note="nats above the first logged loss"),
    }


@dataclass(frozen=True)
class Flag:
    """A flagged logged step: its step and each crossed condition with the value that crossed it (the largest)."""

    step: int
    reasons: Mapping[str, float]

    def describe(self) -> str:
        return "; ".join(f"{key} {value:.3g}" for key, value in sorted(self.reasons.items()))


def _share(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0


def _crossed(record: Mapping[str, Any], cfg: WarningConfig) -> dict[str, float]:
    """The conditions one logged record crosses, each with its value."""
    entries = [fields for roles in record.get("telemetry", {}).values() for fields in roles.values()]
    # the entries scaled by a held reference (a headroom margin is defined): only there can a block reach the top
    # code or saturate unplanned (with a current reference the tensor's amax block sits at T by construction, at
    # the top code where T is the format's max, as E4M3's 448 is)
    held = [e for e in entries if e.get("headroom_margin") is not None]
    if not entries:
        return {}

    def total(key: str, of: Sequence[Mapping[str, Any]]) -> float:
        return sum(e.get(key) or 0 for e in of)

    values = {
        "headroom_margin": max((e["headroom_margin"] for e in held), default=0.0),
        "saturated_share": _share(total("saturated_blocks", held), total("quantized_blocks", held)),
        "top_code_share": max((e["top_code_share"] or 0.0 for e in held), default=0.0),
        "zero_rounded_share": _share(total("zero_rounded_blocks", entries), total("quantized_blocks", entries)),
        "bottom_code_share": max((e.get("bottom_code_share") or 0.0 for e in entries), default=0.0),
        "underflowed_share": _share(total("underflowed_blocks", entries), total("quantized_blocks", entries)),
    }
    return {key: value for key, value in values.items() if value >= getattr(cfg, key)}


def scan(records: Iterable[Mapping[str, Any]], cfg: WarningConfig | None = None) -> list[Flag]:
    """Every flagged logged step of a run's records (``metrics.jsonl``), in step order; [] for a healthy run or
    one without FP4 linears."""
    cfg = cfg if cfg is not None else WarningConfig()
    out = []
    for record in sorted(records, key=lambda r: int(r["step"])):
        reasons = _crossed(record, cfg)
        if reasons:
            out.append(Flag(int(record["step"]), reasons))
    return out


def diverged(
    records: Sequence[Mapping[str, Any]],
    cfg: WarningConfig | None = None,
    *,
    twin: Sequence[Mapping[str, Any]] | None = None,
    stopped_at: int | None = None,
) -> int | None:
    """The step a run diverged at: the first logged step whose loss is not finite or exceeds by
    ``cfg.divergence_rise`` its first logged loss (a blow-up), or with ``twin`` (the healthy run of the same seed
    and data) that run's loss at the same step (a departure: a run that stalls departs without blowing up); else
    ``stopped_at`` (the step a run stopped on with a non-finite value), else None."""
    cfg = cfg if cfg is not None else WarningConfig()
    ordered = sorted(records, key=lambda r: int(r["step"]))
    healthy = {int(r["step"]): float(r["loss"]) for r in twin} if twin is not None else None
    if ordered:
        first = float(ordered[0]["loss"])
        for record in ordered:
            step, loss = int(record["step"]), float(record["loss"])
            base = first if healthy is None else healthy.get(step)
            if not math.isfinite(loss) or (base is not None and loss > base + cfg.divergence_rise):
                return step
    return stopped_at


def read_records(run_dir: str | Path) -> list[dict[str, Any]]:
    """The logged records of a run (finished or not: a diverged run stops early)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"run {run_dir} has no metrics.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


WARNING_COLUMNS = [
    "recipe", "label", "seed", "run", "logged_steps", "warned_step", "warning", "diverged_step", "lead_steps"
]  # fmt: skip
"""The columns of :func:`warnings_table`."""


def warnings_table(run_dirs: Sequence[str | Path], cfg: WarningConfig | None = None) -> pd.DataFrame:
    """One row per run (:data:`WARNING_COLUMNS`): the first flagged step and its conditions, the divergence step
    and the lead (steps from the warning to the divergence; negative: flagged only after it), recipe and seed from
    the run's ``final.json`` (or ``config.resolved.json`` for a run that stopped)."""
    rows = []
    for run_dir in map(Path, run_dirs):
        records = read_records(run_dir)
        meta = {}
        for name in ("final.json", "config.resolved.json"):
            if (run_dir / name).is_file():
                meta = json.loads((run_dir / name).read_text())
                meta = meta.get("config", meta)
                break
        flagged = scan(records, cfg)
        step = diverged(records, cfg)
        warned = flagged[0].step if flagged else None
        recipe = meta.get("recipe")
        rows.append(
            {"recipe": recipe, "label": stages.label(recipe) if recipe else None, "seed": meta.get("seed"),
             "run": str(run_dir), "logged_steps": len(records),
             "warned_step": warned, "warning": flagged[0].describe() if flagged else None, "diverged_step": step,
             "lead_steps": step - warned if step is not None and warned is not None else None}
        )  # fmt: skip
    return pd.DataFrame(rows, columns=WARNING_COLUMNS).astype(
        {"seed": "Int64", "warned_step": "Int64", "diverged_step": "Int64", "lead_steps": "Int64"}
    )
