"""Tests for the block-scale format study stage (ue5m3.experiments.format_study), the telemetry tables it reads
(ue5m3.experiments.scale_telemetry) and the early warning's rules (ue5m3.experiments.early_warning) on written runs.

The runs here are written by hand (final.json and metrics.jsonl as the trainer writes them), so every number of the
tables is known: the paired effects against scipy's t quantile, the telemetry shares against sums done here.
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import scipy.stats

from ue5m3 import config, stages
from ue5m3.experiments import early_warning, format_study, scale_telemetry
from ue5m3.experiments.early_warning import WarningConfig

ROLES = ("activation", "weight", "upstream_gradient")
SEEDS = (1, 2, 3)
# final-window losses per recipe and seed: e4m3 higher than the reference on every seed, ue8m0 mixed, the d200 arm
# the same bits as the reference (a factor that changed nothing)
LOSSES = {
    "ue5m3_t448": {1: 6.10, 2: 6.30, 3: 6.20},
    "e4m3_t448": {1: 6.20, 2: 6.42, 3: 6.29},
    "ue8m0_rceil_b16": {1: 6.05, 2: 6.40, 3: 6.18},
    "ue5m3_t448_d200": {1: 6.10, 2: 6.30, 3: 6.20},
    "bf16": {1: 6.00, 2: 6.21, 3: 6.12},
}


def _fields(quantized, saturated=0, zero_rounded=0, underflowed=0, margin=None, top=0.0, bottom=0.0, dead=0.25):
    counts = {"quantized_blocks": quantized, "zero_rounded_blocks": zero_rounded, "saturated_blocks": saturated,
              "underflowed_blocks": underflowed}  # fmt: skip
    sampled = {"scale_log2_min": -3.0, "scale_log2_max": 2.0, "top_code_share": top, "bottom_code_share": bottom,
               "headroom_margin": margin, "dead_zone_share": dead, "sr_share": None}  # fmt: skip
    return counts | sampled


def _record(step, loss, **fields):
    telemetry = {linear: {role: _fields(**fields) for role in ROLES} for linear in ("layers.0.up", "layers.0.down")}
    return {"step": step, "loss": loss, "grad_norm": 1.0, "lr": 1e-3, "telemetry": telemetry}


def _write_run(root, recipe, seed, records):
    run = root / recipe / f"seed{seed}"
    run.mkdir(parents=True)
    (run / "final.json").write_text(json.dumps({"recipe": recipe, "seed": seed, "config": {"recipe": recipe,
                                                "seed": seed, "steps": 10, "log_every": 5}}))  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


@pytest.fixture
def study(tmp_path):
    runs = []
    for recipe, by_seed in LOSSES.items():
        for seed, loss in by_seed.items():
            if recipe == "bf16":
                records = [{"step": s, "loss": loss, "grad_norm": 1.0, "lr": 1e-3, "telemetry": {}} for s in (5, 10)]
            else:
                saturated = 3 if recipe == "ue8m0_rceil_b16" else 0
                records = [_record(5, loss, quantized=100, saturated=saturated, zero_rounded=2, margin=0.1 * seed),
                           _record(10, loss, quantized=300, underflowed=6, margin=0.05)]  # fmt: skip
            runs.append(_write_run(tmp_path / "runs", recipe, seed, records))
    rows = [{"recipe": r, "seed": s, "final_window_mean_loss": v} for r, by in LOSSES.items() for s, v in by.items()]
    pd.DataFrame(rows).to_csv(tmp_path / "final_window.csv", index=False)
    return runs, tmp_path / "final_window.csv"


def _t_interval(differences):
    n = len(differences)
    mean = sum(differences) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in differences) / (n - 1))
    half = scipy.stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    mde = (scipy.stats.t.ppf(0.975, n - 1) + scipy.stats.t.ppf(0.8, n - 1)) * sd / math.sqrt(n)
    return mean, mean - half, mean + half, mde


def test_the_table_pairs_every_arm_with_the_reference_and_bf16_per_seed(study):
    runs, final_window = study
    telemetry = scale_telemetry.load(runs)
    table = format_study.study_table(pd.read_csv(final_window), scale_telemetry.run_totals(telemetry))
    assert list(table.columns) == format_study.STUDY_COLUMNS
    # grouped by family (E4M3, UE5M3, UE8M0, BF16), the reference's family in order of its numbers
    assert list(table["recipe"]) == ["e4m3_t448", "ue5m3_t448", "ue5m3_t448_d200", "ue8m0_rceil_b16", "bf16"]
    rows = table.set_index("recipe")
    for arm in ("e4m3_t448", "ue8m0_rceil_b16"):
        differences = [LOSSES[arm][s] - LOSSES["ue5m3_t448"][s] for s in SEEDS]
        mean, low, high, mde = _t_interval(differences)
        assert rows.loc[arm, "effect"] == pytest.approx(mean, rel=1e-12)
        assert rows.loc[arm, "interval_low"] == pytest.approx(low, rel=1e-9)
        assert rows.loc[arm, "interval_high"] == pytest.approx(high, rel=1e-9)
        assert rows.loc[arm, "mde"] == pytest.approx(mde, rel=1e-9)
        against_bf16 = _t_interval([LOSSES[arm][s] - LOSSES["bf16"][s] for s in SEEDS])
        assert rows.loc[arm, "effect_vs_bf16"] == pytest.approx(against_bf16[0], rel=1e-12)
        assert rows.loc[arm, "interval_low_vs_bf16"] == pytest.approx(against_bf16[1], rel=1e-9)
    assert rows.loc["e4m3_t448", "interval_low"] > 0 and rows.loc["e4m3_t448", "verdict"] == "higher"
    assert rows.loc["ue8m0_rceil_b16", "verdict"] == "inconclusive"  # -0.05, +0.10, -0.02: the interval spans 0
    assert rows.loc["ue5m3_t448_d200", "verdict"] == "identical"
    assert (rows.loc["ue5m3_t448", "verdict"], rows.loc["bf16", "verdict_vs_bf16"]) == ("reference", "baseline")
    assert rows.loc["e4m3_t448", "differs_from_reference"] == "scale e4m3; D = 1"
    assert rows.loc["ue5m3_t448_d200", "differs_from_reference"] == "D = 200"
    assert rows.loc["bf16", "differs_from_reference"] == "no FP4"
    assert rows.loc["ue5m3_t448", "final_window_mean_loss"] == pytest.approx(6.2)
    # the telemetry columns: over both logged steps, both linears, three roles and three seeds
    assert rows.loc["ue8m0_rceil_b16", "saturated_share"] == pytest.approx(3 / 400)
    assert rows.loc["ue5m3_t448", "saturated_share"] == 0
    assert rows.loc["ue5m3_t448", "zero_rounded_share"] == pytest.approx(2 / 400)
    assert rows.loc["ue5m3_t448", "underflowed_share"] == pytest.approx(6 / 400)
    assert rows.loc["ue5m3_t448", "headroom_margin"] == pytest.approx((0.1 + 0.2 + 0.3) / 3)  # the mean of the runs'
    assert pd.isna(rows.loc["bf16", "saturated_share"])


def test_the_proposed_recipe_is_the_reference_when_the_studys_is_not_trained(study):
    _, final_window = study
    frame = pd.read_csv(final_window)
    frame = frame[frame["recipe"] != "ue5m3_t448"]
    frame = pd.concat([frame, pd.DataFrame([{"recipe": "ue5m3_b16", "seed": s, "final_window_mean_loss": 6.2}
                                            for s in SEEDS])])  # fmt: skip
    table = format_study.study_table(frame).set_index("recipe")
    assert table.loc["ue5m3_b16", "verdict"] == "reference"
    assert table.loc["ue5m3_t448_d200", "differs_from_reference"] == "T = 448; D = 200; 0 target override(s)"
    assert table.loc["e4m3_t448", "effect"] == pytest.approx((6.20 + 6.42 + 6.29) / 3 - 6.2)


def test_describe_states_each_arms_numerics():
    assert format_study.describe("e4m3_t256_4over6") == {"family": "e4m3", "scale_format": "e4m3", "block_size": 16,
        "target": 256.0, "interval": 1, "scale_rule": "four_over_six", "selection": "mae"}  # fmt: skip
    assert format_study.describe("ue8m0_floor_b32") == {"family": "ue8m0", "scale_format": "ue8m0", "block_size": 32,
        "target": None, "interval": 1, "scale_rule": "mx_floor", "selection": None}  # fmt: skip
    assert format_study.describe("ue5m3_alto_t8192")["scale_format"] == "ue5m3_alto"
    assert format_study.describe("ue5m3_b16")["target"] == "448/2048"  # the override's target beside the roles'


def test_run_writes_the_tables_and_the_config_is_checked(study, tmp_path):
    runs, final_window = study
    cfg = config.load(format_study.FormatStudyConfig, {"warning": {"headroom_margin": 0.25}}, source="test")
    paths = format_study.run(cfg, tmp_path / "out", runs, final_window)
    assert set(paths) == {"study", "telemetry", "run_telemetry", "warnings", "provenance"}
    study_csv = pd.read_csv(paths["study"])
    assert list(study_csv.columns) == format_study.STUDY_COLUMNS and len(study_csv) == len(LOSSES)
    telemetry = pd.read_csv(paths["telemetry"])
    up = telemetry[(telemetry["recipe"] == "ue8m0_rceil_b16") & (telemetry["step"] == 5)]
    assert set(up["role"]) == set(ROLES) and up["saturated_share"].tolist() == [3 / 100] * 3
    warnings = pd.read_csv(paths["warnings"]).set_index(["recipe", "seed"])
    # margin 0.1 * seed at step 5 against 0.25: seeds 3 flagged there, every FP4 run at step 10 (underflow 2%)
    assert warnings.loc[("ue5m3_t448", 3), "warned_step"] == 5
    assert warnings.loc[("ue5m3_t448", 1), "warned_step"] == 10
    assert "underflowed_share 0.02" in warnings.loc[("ue5m3_t448", 1), "warning"]
    assert pd.isna(warnings.loc[("bf16", 1), "warned_step"])
    assert warnings.loc[("bf16", 1), "label"] == stages.label("bf16")  # the paper's name beside the recipe
    provenance = json.loads(paths["provenance"].read_text())
    assert provenance["command"] == "format-study" and provenance["config"]["warning"]["headroom_margin"] == 0.25
    with pytest.raises(config.ConfigError, match="level"):
        config.load(format_study.FormatStudyConfig, {"level": 1.5}, source="test")
    with pytest.raises(ValueError, match="unknown recipe 'ue5m3_b64'"):
        format_study.FormatStudyConfig(references=("ue5m3_b64",))


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"margin": 0.5}, "headroom_margin"),
        ({"saturated": 1}, "saturated_share"),  # 6 of 60,000 blocks: 1e-4
        ({"top": 0.001}, "top_code_share"),
        ({"zero_rounded": 2500}, "zero_rounded_share"),  # 15,000 of 60,000
        ({"bottom": 0.05}, "bottom_code_share"),
        ({"underflowed": 10}, "underflowed_share"),
    ],
)
def test_each_threshold_flags_the_step_that_reaches_it_and_not_one_below(fields, reason):
    below = {key: value * 0.99 if isinstance(value, float) else value - 1 for key, value in fields.items()}
    held = {"quantized": 10_000, "margin": 0.1}  # scaled by held references
    records = [_record(5, 6.0, **held), _record(10, 6.0, **{**held, **below}), _record(15, 6.0, **{**held, **fields})]
    flagged = early_warning.scan(records)
    assert [f.step for f in flagged] == [15]
    assert list(flagged[0].reasons) == [reason]


def test_saturation_and_the_top_code_under_current_references_are_not_flagged():
    """E4M3 at T = 448 (its max) puts each tensor's amax block at the top code by construction, and its ideal
    scale may round past it: with a current reference (no headroom margin) neither is a warning."""
    assert early_warning.scan([_record(5, 6.0, quantized=100, saturated=1, top=0.09, margin=None)]) == []
    flagged = early_warning.scan([_record(5, 6.0, quantized=100, saturated=1, top=0.09, margin=0.1)])
    assert set(flagged[0].reasons) == {"saturated_share", "top_code_share"}


def test_divergence_is_a_nat_above_the_first_logged_loss_or_a_non_finite_stop():
    records = [{"step": s, "loss": v} for s, v in ((5, 6.0), (10, 4.0), (15, 6.9), (20, 7.01), (25, 9.0))]
    assert early_warning.diverged(records) == 20
    assert early_warning.diverged(records, WarningConfig(divergence_rise=2.0)) == 25
    assert early_warning.diverged(records[:3], stopped_at=17) == 17
    assert early_warning.diverged(records[:3]) is None
    assert early_warning.diverged([{"step": 5, "loss": 6.0}, {"step": 10, "loss": float("nan")}]) == 10
    assert early_warning.scan([{"step": 5, "loss": 6.0, "telemetry": {}}]) == []  # a BF16 run: nothing to read


def test_the_study_config_trains_the_study_arms_beside_bf16_and_passes_the_pipeline_check():
    """config/study_formats.yaml merged over config/config.yaml as Snakemake merges it: the main runs are every
    study arm and BF16, each with an inference policy (the whole config is checked), and nothing else differs."""
    from pathlib import Path

    from ue5m3 import pipeline
    from ue5m3.layers import recipes

    root = Path(__file__).resolve().parents[1]
    base, study = (config.read_yaml(root / "config" / name) for name in ("config.yaml", "study_formats.yaml"))

    def merge(into, over):
        out = dict(into)
        for key, value in over.items():
            out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        return out

    assert set(study) == {"training", "evaluation"} and set(study["training"]) == {"recipes"}
    assert set(study["evaluation"]) == {"policies"}
    cfg = pipeline.load(merge(base, study), source="config/study_formats.yaml")
    assert sorted(cfg.training.recipes) == sorted(["bf16", *recipes.study_names()])
    assert (cfg.training.model, cfg.training.steps) == (base["training"]["model"], base["training"]["steps"])
