"""The scale telemetry of training runs as tables: per logged step, per FP4 linear and operand role, and summaries.

Each logged record of a run's ``metrics.jsonl`` holds, under ``telemetry``, the scale telemetry of that step per
converted linear and operand role (:mod:`ue5m3.layers.telemetry`, :data:`~ue5m3.layers.telemetry.ROLE_FIELDS`): the
block counts since the previous logged step, and the logged step's sampled fields (scale-code range, the shares at
the top and bottom codes, the headroom margin T * rho / U of Proposition 1 for held references, the E2M1 dead-zone
share and the SR share). :func:`load` reads them into one long table; :func:`per_recipe` aggregates it over linears
and seeds per recipe, step and role (what the telemetry figure draws), :func:`run_totals` over each whole run (what
the format study's table and the early-warning table show). Runs without FP4 linears (BF16, native TE) have none.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from ue5m3.layers.telemetry import ROLE_FIELDS

__all__ = ["FIELDS", "KEYS", "load", "per_recipe", "run_totals", "COUNTED"]

FIELDS = ROLE_FIELDS
"""The fields of each (linear, role) entry."""

KEYS = ["recipe", "seed", "run", "step", "linear", "role"]
"""The columns that identify a row of :func:`load`."""

COUNTED = ("zero_rounded_blocks", "saturated_blocks", "underflowed_blocks")
"""The block counts whose shares of the quantized blocks the summaries report."""


def _rows(run: str, recipe: str, seed: int, record: dict) -> list[dict]:
    return [
        {"recipe": recipe, "seed": seed, "run": run, "step": int(record["step"]), "linear": linear, "role": role,
         **{key: fields.get(key) for key in FIELDS}}
        for linear, roles in record.get("telemetry", {}).items()
        for role, fields in roles.items()
    ]  # fmt: skip


def load(run_dirs: Sequence[str | Path]) -> pd.DataFrame:
    """Every logged step's telemetry of finished runs, one row per (run, step, linear, role) (:data:`KEYS` then
    :data:`FIELDS`; a field nothing defined is missing), labelled by the recipe and seed of the run's ``final.json``.

    Raises:
        FileNotFoundError: a run without ``final.json`` (unfinished) or without metrics.
    """
    rows: list[dict] = []
    for run_dir in map(Path, run_dirs):
        final_path, metrics = run_dir / "final.json", run_dir / "metrics.jsonl"
        if not final_path.is_file():
            raise FileNotFoundError(f"run {run_dir} has no final.json: it has not finished")
        if not metrics.is_file():
            raise FileNotFoundError(f"run {run_dir} has no metrics.jsonl")
        final = json.loads(final_path.read_text())
        for line in metrics.read_text().splitlines():
            if line.strip():
                rows.extend(_rows(str(run_dir), final["recipe"], int(final["seed"]), json.loads(line)))
    frame = pd.DataFrame(rows, columns=KEYS + list(FIELDS))
    return frame.astype({key: "Float64" for key in FIELDS if key not in ("quantized_blocks", *COUNTED)})


def _shares(grouped: pd.core.groupby.DataFrameGroupBy) -> pd.DataFrame:
    """Per group: the block counts' shares of the quantized blocks, the range and the sampled fields."""
    summed = grouped[["quantized_blocks", *COUNTED]].sum()
    out = pd.DataFrame(index=summed.index)
    for key in COUNTED:
        share = summed[key] / summed["quantized_blocks"]
        out[key.replace("_blocks", "_share")] = share.where(summed["quantized_blocks"] > 0)
    out["scale_log2_min"] = grouped["scale_log2_min"].min()
    out["scale_log2_max"] = grouped["scale_log2_max"].max()
    for key in ("top_code_share", "bottom_code_share", "dead_zone_share", "sr_share"):
        out[key] = grouped[key].mean()
    out["headroom_margin"] = grouped["headroom_margin"].max()
    return out


def per_recipe(frame: pd.DataFrame) -> pd.DataFrame:
    """Per recipe, step and role, over linears and seeds: the block counts as shares of the quantized blocks, the
    lowest and highest scale (log2), the mean top/bottom-code, dead-zone and SR shares, the largest headroom
    margin."""
    return _shares(frame.groupby(["recipe", "step", "role"], sort=True)).reset_index()


def run_totals(frame: pd.DataFrame) -> pd.DataFrame:
    """Per recipe and seed, over the whole run (every linear, role and logged step): the block counts as shares of
    the quantized blocks, the scale range, the mean sampled shares and the largest headroom margin."""
    return _shares(frame.groupby(["recipe", "seed"], sort=True)).reset_index()
