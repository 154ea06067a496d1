"""The block-scale format study: every trained recipe described by its numerics and compared, paired over seeds,
with the study's reference arm and with BF16.

The study (issue 26, item 4; docs/format_study.md; ``config/study_formats.yaml``) trains the arms of
``ue5m3/layers/recipe_files/study`` side by side: E4M3 scales at T = 448 and 256 with and without 4/6 selection,
UE5M3 under its three top-code conventions at T in {448, 2048, 8192}, UE8M0 with the floor and RCEIL rules at blocks
16 and 32, and UE5M3 references refreshed every D in {1, 10, 50, 200} steps, each one factor (or one format with its
own lifecycle) away from the reference arm ``ue5m3_t448`` (UE5M3, T = 448, D = 50: the proposed recipe without its
T = 2048 override). Every recipe's run of a seed starts from the same weights and data, so each arm's effect is the
per-seed difference of its final-window training loss (:mod:`ue5m3.experiments.paired`).

:func:`study_table` works on whatever recipes a config trained: each row describes its recipe (scale format, block,
targets, D, scale rule, selection) and how it differs from the reference, with its paired effect against the
reference (the first of :data:`REFERENCES` that was trained) and against BF16 (when trained), each with a 95% t
interval, the minimum detectable effect and a verdict (:data:`VERDICTS`), and the run's scale telemetry totals
(:func:`ue5m3.experiments.scale_telemetry.run_totals`). On the default pipeline's recipes the reference is the
proposed recipe.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from ue5m3 import config, stages
from ue5m3.artifacts import provenance, write_csv, write_json
from ue5m3.config import Range
from ue5m3.experiments import early_warning, scale_telemetry
from ue5m3.experiments.paired import Direction, PairedEffect, Verdict, judge, paired_effect
from ue5m3.layers import recipes
from ue5m3.numerics.schemes import get_scheme

__all__ = [
    "REFERENCES",
    "FAMILIES",
    "VERDICTS",
    "describe",
    "differences",
    "study_table",
    "STUDY_COLUMNS",
    "FormatStudyConfig",
    "run",
]

REFERENCES = ("ue5m3_t448", "ue5m3_b16")
"""The reference arm, by preference: the study's, else the proposed recipe (the default pipeline's runs)."""

FAMILIES = ("e4m3", "ue5m3", "ue8m0", "bf16")
"""The scale-format families in the order the table and figure show them (UE5M3's conventions are one family)."""

VERDICTS = {
    Verdict.REPRODUCED: "lower",
    Verdict.CONTRADICTED: "higher",
    Verdict.INCONCLUSIVE: "inconclusive",
    Verdict.NOT_RUN: "not run",
}
"""An arm's verdict against a baseline: its loss is lower (the 95% interval below zero), higher, or neither
(inconclusive); ``identical`` when every seed's runs ended with the same loss (the same bits: a factor that changed
nothing), ``not run`` when the baseline was not trained."""

STUDY_COLUMNS = [
    "family",
    "recipe",
    "label",
    "scale_format",
    "block_size",
    "target",
    "interval",
    "scale_rule",
    "selection",
    "differs_from_reference",
    "seeds",
    "final_window_mean_loss",
    "effect",
    "interval_low",
    "interval_high",
    "mde",
    "verdict",
    "effect_vs_bf16",
    "interval_low_vs_bf16",
    "interval_high_vs_bf16",
    "verdict_vs_bf16",
    "saturated_share",
    "zero_rounded_share",
    "underflowed_share",
    "headroom_margin",
    "dead_zone_share",
]
"""The columns of ``figures/format_study_table.csv``."""


def _targets(recipe: recipes.Recipe) -> float | str | None:
    values = {cfg.target for cfg in recipe.roles.values()} | {o.target for o in recipe.target_overrides}
    if not values or values == {None}:
        return None
    return values.pop() if len(values) == 1 else "/".join(f"{t:g}" for t in sorted(values))


def describe(name: str) -> dict[str, Any]:
    """A recipe's numerics as the table states them: family, scale format, block, target(s), D, rule, selection."""
    recipe = recipes.get(name)
    if not recipe.is_quantized:
        return {"family": "bf16", "scale_format": None, "block_size": None, "target": None, "interval": None,
                "scale_rule": None, "selection": None}  # fmt: skip
    scheme = get_scheme(recipe.scheme)
    return {
        "family": scheme.scale.name.split("_")[0],
        "scale_format": scheme.scale.name,
        "block_size": scheme.block_size,
        "target": _targets(recipe),
        "interval": recipe.interval,
        "scale_rule": scheme.scale_rule.value,
        "selection": None if scheme.selection is None else scheme.selection.value,
    }


def _value(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _role_settings(recipe: recipes.Recipe) -> dict[str, str]:
    """Each role's rounding, tiling and RHT in the table's words (``dY rounding sr_te``, ``X RHT``)."""
    short = {"activation": "X", "weight": "W", "upstream_gradient": "dY"}
    out = {}
    for role, cfg in recipe.roles.items():
        name = short[role.value]
        out[f"{name} rounding"] = f"{name} {cfg.rounding.value}"
        out[f"{name} 2D"] = f"{name} {'2D tiles' if cfg.two_d else '1D blocks'}"
        out[f"{name} RHT"] = f"{name} {'RHT' if cfg.rht else 'no RHT'}"
    return out


def differences(name: str, reference: str) -> str:
    """How recipe ``name`` differs from ``reference``, in the table's words ("" when only the name differs)."""
    arm, ref = recipes.get(name), recipes.get(reference)
    if not arm.is_quantized:
        return "no FP4"
    out = []
    a, r = describe(name), describe(reference)
    for key, label in (("scale_format", "scale"), ("block_size", "block"), ("target", "T ="), ("interval", "D ="),
                       ("scale_rule", "rule"), ("selection", "4/6")):  # fmt: skip
        if a[key] != r[key]:
            out.append(f"{label} {_value(a[key]) if a[key] is not None else 'none'}")
    settings, ref_settings = _role_settings(arm), _role_settings(ref)
    out += [text for key, text in settings.items() if ref_settings.get(key) != text]
    if arm.bf16_layers != ref.bf16_layers:
        out.append(f"BF16 layers {config.dump(arm.bf16_layers)}")
    if (arm.gemm.model, arm.gemm.final_grid) != (ref.gemm.model, ref.gemm.final_grid):
        grid = f"1/{arm.gemm.final_grid} lattice" if arm.gemm.final_grid else "no lattice"
        out.append(f"GEMM {arm.gemm.model.value}, {grid}")
    if arm.target_overrides != ref.target_overrides:
        out.append(f"{len(arm.target_overrides)} target override(s)")
    return "; ".join(out)


def _verdict(effect: PairedEffect | None) -> str:
    if effect is not None and all(d == 0 for d in effect.differences):
        return "identical"
    return VERDICTS[judge(effect, Direction.LOWER)]


def _effect(
    losses: Mapping[str, dict[int, float]], arm: str, baseline: str | None, level: float, power: float
) -> PairedEffect | None:
    if baseline is None or baseline not in losses or arm == baseline or not set(losses[arm]) & set(losses[baseline]):
        return None
    return paired_effect(losses[arm], losses[baseline], level=level, power=power)


def _order(name: str) -> tuple:
    d = describe(name)
    numbers = [v if isinstance(v, (int, float)) else -1 for v in (d["target"], d["block_size"], d["interval"])]
    return (
        FAMILIES.index(d["family"]) if d["family"] in FAMILIES else len(FAMILIES),
        d["scale_format"] or "",
        *numbers,
        name,
    )


def study_table(
    final_window: pd.DataFrame,
    totals: pd.DataFrame | None = None,
    *,
    references: Sequence[str] = REFERENCES,
    baseline: str = "bf16",
    level: float = 0.95,
    power: float = 0.8,
) -> pd.DataFrame:
    """One row per trained recipe (:data:`STUDY_COLUMNS`), grouped by scale-format family.

    Args:
        final_window: the training summary's ``final_window.csv`` (recipe, seed, final_window_mean_loss).
        totals: :func:`~ue5m3.experiments.scale_telemetry.run_totals` of the runs' telemetry (None or empty: the
            telemetry columns stay empty).
        references: the reference arm, the first of these that was trained.
        baseline: the second baseline (BF16), when trained.
        level, power: the intervals' confidence level and the MDE's power.
    """
    losses = {
        recipe: dict(zip(rows["seed"].astype(int), rows["final_window_mean_loss"].astype(float), strict=True))
        for recipe, rows in final_window.groupby("recipe")
    }
    reference = next((r for r in references if r in losses), None)
    baseline_bf16 = baseline if baseline in losses else None
    telemetry = (
        totals.groupby("recipe").mean(numeric_only=True) if totals is not None and len(totals) else pd.DataFrame()
    )
    rows = []
    for name in sorted(losses, key=_order):
        vs_ref = _effect(losses, name, reference, level, power)
        vs_bf16 = _effect(losses, name, baseline_bf16, level, power)
        found = telemetry.loc[name] if name in telemetry.index else {}
        rows.append(
            {
                **describe(name),
                "recipe": name,
                "label": stages.label(name),
                "differs_from_reference": "reference" if name == reference else
                (differences(name, reference) if reference else None),
                "seeds": len(losses[name]),
                "final_window_mean_loss": sum(losses[name].values()) / len(losses[name]),
                "effect": vs_ref.mean if vs_ref else None,
                "interval_low": vs_ref.low if vs_ref else None,
                "interval_high": vs_ref.high if vs_ref else None,
                "mde": vs_ref.mde if vs_ref else None,
                "verdict": "reference" if name == reference else _verdict(vs_ref),
                "effect_vs_bf16": vs_bf16.mean if vs_bf16 else None,
                "interval_low_vs_bf16": vs_bf16.low if vs_bf16 else None,
                "interval_high_vs_bf16": vs_bf16.high if vs_bf16 else None,
                "verdict_vs_bf16": "baseline" if name == baseline_bf16 else _verdict(vs_bf16),
                **{key: found.get(key) for key in STUDY_COLUMNS[-5:]},
            }
        )  # fmt: skip
    table = pd.DataFrame(rows, columns=STUDY_COLUMNS)
    floats = [c for c in STUDY_COLUMNS if c.startswith(("effect", "interval_", "mde", "final_window")) or
              c.endswith(("_share", "margin"))]  # fmt: skip
    return table.astype({c: "Float64" for c in floats} | {"seeds": "Int64", "block_size": "Int64", "interval": "Int64"})


@dataclass(frozen=True, kw_only=True)
class FormatStudyConfig:
    """Configuration of ``ue5m3 format-study`` (the pipeline's ``format_study`` section).

    Attributes:
        references: the reference arm, by preference: the first of these the runs trained (the study's
            ``ue5m3_t448``, else the proposed recipe on the default pipeline's runs).
        baseline: the second baseline every arm is compared with when it was trained (BF16).
        level: the confidence level of the paired t intervals.
        power: the power of the minimum detectable effect.
        warning: the early warning's thresholds (:class:`~ue5m3.experiments.early_warning.WarningConfig`).
    """

    references: tuple[str, ...] = REFERENCES
    baseline: str = "bf16"
    level: float = 0.95
    power: float = 0.8
    warning: early_warning.WarningConfig = field(default_factory=early_warning.WarningConfig)

    RANGES: ClassVar[dict[str, Range]] = {
        "level": Range(0.5, 1, low_open=True, high_open=True, note="a confidence level; the tables use 0.95"),
        "power": Range(0.5, 1, low_open=True, high_open=True, note="the MDE's power; the tables use 0.8"),
    }

    def __post_init__(self) -> None:
        if not self.references:
            raise ValueError("references: at least one reference arm, got []")
        for name in (*self.references, self.baseline):
            recipes.get(name)  # an unknown recipe is named with the known ones


def run(
    cfg: FormatStudyConfig, out_dir: str | Path, runs: Sequence[str | Path], final_window: str | Path
) -> dict[str, Path]:
    """Write the study's tables under ``out_dir``: study.csv (:func:`study_table`), telemetry.csv (per recipe, step
    and role: :func:`~ue5m3.experiments.scale_telemetry.per_recipe`), run_telemetry.csv (per run:
    :func:`~ue5m3.experiments.scale_telemetry.run_totals`), warnings.csv (the early warning per run:
    :func:`~ue5m3.experiments.early_warning.warnings_table`) and provenance.json.

    Args:
        runs: the finished run directories (each with final.json and metrics.jsonl).
        final_window: the training summary's final_window.csv of those runs.
    """
    out = Path(out_dir)
    telemetry = scale_telemetry.load(runs)
    totals = scale_telemetry.run_totals(telemetry)
    table = study_table(pd.read_csv(final_window), totals, references=cfg.references, baseline=cfg.baseline,
                        level=cfg.level, power=cfg.power)  # fmt: skip
    tables = {
        "study": table,
        "telemetry": scale_telemetry.per_recipe(telemetry),
        "run_telemetry": totals,
        "warnings": early_warning.warnings_table(runs, cfg.warning),
    }
    paths = {}
    for name, frame in tables.items():
        paths[name] = out / f"{name}.csv"
        records = frame.astype(object).where(frame.notna(), None).to_dict("records")
        write_csv(paths[name], records, list(frame.columns))
    paths["provenance"] = out / "provenance.json"
    settings = {"runs": [str(r) for r in runs], "final_window": str(final_window), **config.dump(cfg)}
    write_json(paths["provenance"], provenance("format-study", settings))
    return paths
