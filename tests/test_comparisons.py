"""Tests for ue5m3.experiments.comparisons (the figures' *_vs_paper.csv tables) and plotting.notebook_setup.

Every input is a small hand-made table; the expected frames are worked out by hand (values chosen exact in
binary, so equality is exact) and compared column by column, row by row, in order.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ue5m3 import reference, stages
from ue5m3.artifacts import write_csv
from ue5m3.experiments import comparisons
from ue5m3.experiments.agreement import AGREEMENT_COLUMNS

NAN = float("nan")


def _missing_as_none(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.astype(object).where(frame.notna(), None)


def _assert_frame(actual: pd.DataFrame, expected: dict[str, list], **kwargs) -> None:
    """``actual`` has exactly ``expected``'s columns (in order) and values (every missing cell equal: NaN, NA, None)."""
    assert list(actual.columns) == list(expected)
    pd.testing.assert_frame_equal(
        _missing_as_none(actual.reset_index(drop=True)),
        _missing_as_none(pd.DataFrame(expected)),
        check_dtype=False,
        check_exact=True,
        **kwargs,
    )


def _cells(series: pd.Series) -> list:
    """A column's values with every missing cell (NaN, NA) as None."""
    return [None if pd.isna(v) else v for v in series]


def _csv(tmp_path: Path, table: pd.DataFrame) -> str:
    """The table as the notebooks write it."""
    path = tmp_path / "table.csv"
    write_csv(path, table.to_dict("records"), list(table.columns))
    return path.read_text()


# --- accumulation ----------------------------------------------------------------------------------------


def test_accumulation_vs_paper_matches_bf16_rtz_bias_and_the_grid_sweep_in_the_papers_order():
    paper = pd.DataFrame(
        {
            "table": ["rtz_bias_k", "rtz_bias_k", "rtz_bias_k", "grid_sweep_s", "grid_sweep_s"],
            "distribution_or_grid": ["gaussian", "gaussian", "laplace", "none", "1/256"],
            "metric": ["magnitude_bias_ppm", "gain_error_ppm", "magnitude_bias_ppm", "rmse", "rmse"],
            "value": [-1.0, -2.0, -3.0, 5e-6, 2e-4],
        }
    )
    rtz_bias = pd.DataFrame(
        {
            "distribution": ["gaussian", "gaussian", "gaussian", "gaussian"],
            "operands": ["bf16", "bf16", "nvfp4", "bf16"],
            "rho": [0.0, 0.0, 0.0, 0.25],
            "metric": ["magnitude_bias_ppm", "magnitude_bias_ppm", "magnitude_bias_ppm", "gain_error_ppm"],
            "variant": ["rtz", "rne", "rtz", "rtz"],
            "value_ppm": [-0.5, 0.125, -9.0, -0.75],
        }
    )
    grid_sweep = pd.DataFrame(
        {
            "sigma": [2**-12] * 3,
            "scale": [1.0] * 3,
            "grid": ["1/256", "none", "1/256"],
            "denominator": [256, NAN, 256],
            "metric": ["rmse", "rmse", "mapped_to_zero_pct"],
            "value": [3e-4, 6e-6, 100.0],
        }
    )
    table = comparisons.accumulation_vs_paper(rtz_bias, grid_sweep, paper)
    _assert_frame(
        table.drop(columns=AGREEMENT_COLUMNS),
        {
            "table": ["rtz_bias_k", "rtz_bias_k", "rtz_bias_k", "grid_sweep_s", "grid_sweep_s"],
            "distribution_or_grid": ["gaussian", "gaussian", "laplace", "none", "1/256"],
            "metric": ["magnitude_bias_ppm", "gain_error_ppm", "magnitude_bias_ppm", "rmse", "rmse"],
            "paper": [-1.0, -2.0, -3.0, 5e-6, 2e-4],
            "ours": [-0.5, -0.75, NAN, 6e-6, 3e-4],  # nvfp4 and rne rows ignored; no laplace run
        },
    )
    assert _cells(table["difference"]) == [0.5, 1.25, None, 6e-6 - 5e-6, 3e-4 - 2e-4]
    assert _cells(table["relative_difference"])[:2] == [0.5, 0.625]
    # 50% and 62.5% off a 10% bound, no laplace run of ours, 20% and 50% off a 5% RMSE bound
    assert _cells(table["verdict"]) == ["contradicted", "contradicted", "not run", "contradicted", "contradicted"]
    tolerances = comparisons.ACCUMULATION_TOLERANCES
    assert _cells(table["tolerance"]) == [tolerances[m].describe() for m in table["metric"]]


def test_accumulation_tolerances_pass_a_share_within_3_points_and_an_rmse_within_5_percent():
    paper = pd.DataFrame(
        {
            "table": ["grid_sweep_s"] * 4,
            "distribution_or_grid": ["1/2048", "1/4096", "1/2048", "1/4096"],
            "metric": ["mapped_to_zero_pct", "mapped_to_zero_pct", "rmse", "rmse"],
            "value": [67.5, 37.5, 1.0, 1.0],
        }
    )
    grid_sweep = pd.DataFrame(
        {
            "sigma": [2**-12] * 4,
            "scale": [1.0] * 4,
            "grid": ["1/2048", "1/4096", "1/2048", "1/4096"],
            "denominator": [2048, 4096, 2048, 4096],
            "metric": ["mapped_to_zero_pct", "mapped_to_zero_pct", "rmse", "rmse"],
            "value": [70.5, 41.0, 1.046875, 0.9375],
        }
    )
    empty_bias = pd.DataFrame(columns=["distribution", "operands", "rho", "metric", "variant", "value_ppm"])
    table = comparisons.accumulation_vs_paper(empty_bias, grid_sweep, paper)
    assert _cells(table["difference"]) == [3.0, 3.5, 0.046875, -0.0625]
    assert _cells(table["verdict"]) == ["reproduced", "contradicted", "reproduced", "contradicted"]


def test_accumulation_vs_paper_has_a_row_for_every_row_of_the_shipped_reference():
    paper = reference.load("accumulation_statistics")
    empty_bias = pd.DataFrame(columns=["distribution", "operands", "rho", "metric", "variant", "value_ppm"])
    empty_sweep = pd.DataFrame(columns=["sigma", "scale", "grid", "denominator", "metric", "value"])
    table = comparisons.accumulation_vs_paper(empty_bias, empty_sweep, paper)
    assert list(table.columns) == ["table", "distribution_or_grid", "metric", "paper", "ours", *AGREEMENT_COLUMNS]
    assert table["paper"].tolist() == paper["value"].tolist()
    assert table["ours"].isna().all()
    assert (table["verdict"] == "not run").all() and table["tolerance"].notna().all()  # every metric has one


# --- training: paired against BF16 -----------------------------------------------------------------------


def _windows() -> pd.DataFrame:
    """Two seeds of BF16 and ue5m3_b16, one of mxfp4 (seed 1 only)."""
    return pd.DataFrame(
        {
            "recipe": ["bf16", "bf16", "ue5m3_b16", "ue5m3_b16", "mxfp4"],
            "seed": [1, 2, 1, 2, 1],
            "final_window_mean_loss": [3.0, 3.5, 3.25, 3.5, 4.0],
        }
    )


def _paper_training() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "config": ["bf16", "ue5m3_b16", "nvfp4_te"],
            "final_window_mean_loss": [2.0, 2.5, 2.75],
            "endpoint_loss": [1.875, 2.5, 2.625],
            "endpoint_grad_norm": [0.0625, 0.125, 0.5],
        }
    )


def test_training_vs_paper_pairs_each_recipe_with_bf16s_run_of_the_same_seed():
    table = comparisons.training_vs_paper(_windows(), _paper_training())
    assert table["recipe"].tolist() == ["mxfp4", "nvfp4_te", "ue5m3_b16"]  # BF16 is the baseline: no row
    assert table["label"].tolist() == ["MXFP4", "TE NVFP4", "UE5M3 B16 (proposed)"]
    assert _cells(table["loss"]) == [4.0, None, 3.375] and _cells(table["paper_loss"]) == [None, 2.75, 2.5]
    row = table.set_index("recipe").loc["ue5m3_b16"]
    assert row["seeds"] == 2 and row["effect"] == 0.125  # seed 1: +0.25, seed 2: 0.0
    assert row["paper_effect"] == 0.5 and row["interval_low"] < 0 < row["interval_high"]
    assert row["verdict"] == "inconclusive"
    assert table.set_index("recipe").loc["nvfp4_te", "verdict"] == "not run"  # only the paper ran it
    mxfp4 = table.set_index("recipe").loc["mxfp4"]
    assert mxfp4["seeds"] == 1 and pd.isna(mxfp4["interval_low"]) and mxfp4["verdict"] == "inconclusive"


def test_training_vs_paper_reproduces_when_the_interval_excludes_zero_on_the_papers_side():
    windows = pd.DataFrame(
        {
            "recipe": ["bf16"] * 3 + ["ue5m3_b16"] * 3,
            "seed": [1, 2, 3] * 2,
            "final_window_mean_loss": [3.0, 3.5, 4.0, 3.25, 3.75, 4.375],
        }
    )
    table = comparisons.training_vs_paper(windows, _paper_training()).set_index("recipe")
    assert table.loc["ue5m3_b16", "verdict"] == "reproduced"  # +0.25, +0.25, +0.375: worse than BF16, as the paper
    flipped = windows.assign(final_window_mean_loss=[3.0, 3.5, 4.0, 2.75, 3.25, 3.625])
    table = comparisons.training_vs_paper(flipped, _paper_training()).set_index("recipe")
    assert table.loc["ue5m3_b16", "verdict"] == "contradicted"


def test_a_paired_table_writes_missing_cells_empty(tmp_path):
    text = _csv(tmp_path, comparisons.training_vs_paper(_windows(), _paper_training()))
    assert "nan" not in text.lower() and "<NA>" not in text
    assert text.splitlines()[2].startswith("nvfp4_te,TE NVFP4,,2.75,,,,,,")


# --- validation NLL --------------------------------------------------------------------------------------


def _nll_results() -> pd.DataFrame:
    rows = [
        ("bf16", 1, 10, "bf16", 4.0),
        ("bf16", 2, 10, "bf16", 5.0),
        ("bf16", 1, 20, "bf16", 3.0),
        ("bf16", 2, 20, "bf16", 3.0),
        ("ue5m3_b16", 1, 10, "cold_d50_replay", 4.0),
        ("ue5m3_b16", 2, 10, "cold_d50_replay", 4.5),
        ("ue5m3_b16", 1, 20, "cold_d50_replay", 3.5),
        ("ue5m3_b16", 1, 20, "current_tensor", 9.0),  # the sensitivity run: not the recipe's main policy
        ("ue5m3_b16", 2, 20, "cold_d50_replay", 3.25),
    ]
    table = pd.DataFrame(rows, columns=["recipe", "seed", "step", "policy", "nll"])
    return table.assign(low=table["nll"] - 0.25, high=table["nll"] + 0.25)  # each run's order or bootstrap range


def _paper_nll() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "config": ["bf16", "bf16", "bf16", "ue5m3_b16", "ue5m3_b16", "nvfp4_te"],
            "step": [50, 100, 200, 100, 200, 200],
            "nll": [3.0, 2.0, 2.5, 2.125, 2.25, 2.5],
            "inference_policy": ["none", "none", "none", "cold_d50_replay", "cold_d50_replay", "current_tensor"],
        }
    )


def test_validation_nll_tables_keep_the_main_policy_and_spread_over_seeds_and_orders():
    ours, paper = comparisons.validation_nll_tables(_nll_results(), _paper_nll())
    _assert_frame(
        ours,
        {
            "recipe": ["bf16", "bf16", "ue5m3_b16", "ue5m3_b16"],
            "step": [10, 20, 10, 20],
            "mean": [4.5, 3.0, 4.25, 3.375],
            "min": [4.0, 3.0, 4.0, 3.25],
            "max": [5.0, 3.0, 4.5, 3.5],
            "seeds": [2, 2, 2, 2],
            "low": [3.75, 2.75, 3.75, 3.0],  # the widest single evaluation of the group
            "high": [5.25, 3.25, 4.75, 3.75],
            "percent_vs_bf16": [0.0, 0.0, 100 * (4.5 - 4.25) / 4.5, -12.5],  # of the seed means: 100 (b - x) / b
            # each seed against BF16's run of the same seed: 100 (4 - 4) / 4 and 100 (5 - 4.5) / 5 at step 10
            "percent_vs_bf16_min": [0.0, 0.0, 0.0, 100 * (3.0 - 3.5) / 3.0],
            "percent_vs_bf16_max": [0.0, 0.0, 10.0, 100 * (3.0 - 3.25) / 3.0],
        },
    )
    assert paper["percent_vs_bf16"].tolist()[-1] == 0.0  # 100 (2.5 - 2.5) / 2.5 for nvfp4_te at step 200


def test_validation_vs_paper_pairs_seeds_at_the_same_fraction_of_training():
    table = comparisons.validation_vs_paper(_nll_results(), _paper_nll())
    keys = list(zip(table["recipe"], table["training_fraction"], strict=True))
    assert keys == [("nvfp4_te", 1.0), ("ue5m3_b16", 0.5), ("ue5m3_b16", 1.0)]
    row = table.iloc[1]  # ours 10 / 20 beside the paper's 100 / 200
    assert (row["step"], row["paper_step"], row["seeds"]) == (10, 100, 2)
    assert row["effect"] == -0.25 and row["paper_effect"] == 0.125  # seeds: 0.0 and -0.5; paper 2.125 - 2.0
    assert row["verdict"] == "inconclusive"
    assert table.iloc[0]["verdict"] == "not run" and table.iloc[0]["paper_effect"] == 0.0


# --- policy sensitivity ----------------------------------------------------------------------------------


def test_policy_sensitivity_is_an_equivalence_against_the_papers_policy():
    rows = [
        ("ue5m3_b16", 1, 20, "cold_d50_replay", 3.0),
        ("ue5m3_b16", 2, 20, "cold_d50_replay", 4.0),
        ("ue5m3_b16", 3, 20, "cold_d50_replay", 5.0),
        ("ue5m3_b16", 1, 20, "current_tensor", 3.0 + 2**-12),
        ("ue5m3_b16", 2, 20, "current_tensor", 4.0 + 2**-12),
        ("ue5m3_b16", 3, 20, "current_tensor", 5.0 + 2**-11),
        ("ue5m3_b16", 1, 20, "calibrated_frozen", 3.5),
        ("ue5m3_b16", 1, 10, "current_tensor", 9.0),  # not the last step
    ]
    results = pd.DataFrame(rows, columns=["recipe", "seed", "step", "policy", "nll"])
    table = comparisons.policy_sensitivity_vs_paper(results, _paper_nll(), recipe="ue5m3_b16")
    assert table["policy"].tolist() == ["calibrated_frozen", "current_tensor"]
    assert set(table["reference_policy"]) == {"cold_d50_replay"} and (table["margin"] == 0.25).all()  # |2.25 - 2.5|
    current = table.set_index("policy").loc["current_tensor"]
    assert current["seeds"] == 3 and current["verdict"] == "reproduced"  # within +-0.25
    assert table.set_index("policy").loc["calibrated_frozen", "verdict"] == "inconclusive"  # one seed


# --- scale snapshot --------------------------------------------------------------------------------------


def test_scale_snapshot_vs_paper_sums_modules_per_checkpoint_and_target():
    counts = pd.DataFrame(
        {
            "module": ["a", "a", "b", "b", "a", "a"],
            "target": [448.0, 2048.0, 448.0, 2048.0, 448.0, 2048.0],
            "dy_amax": [1.0] * 6,
            "blocks": [16, 16, 32, 32, 16, 16],
            "zero_blocks": [1, 1, 0, 0, 0, 0],
            "below_2^-17": [0, 0, 2, 0, 0, 0],
            "below_2^-18": [0, 0, 1, 0, 0, 0],
            "zero_rounded_before_repair": [0, 0, 1, 0, 0, 0],
            "saturated": [0, 0, 0, 0, 0, 3],
            "recipe": ["ue5m3_b16"] * 4 + ["bf16"] * 2,
        }
    )
    paper = pd.DataFrame(
        {
            "config": ["ue5m3_b16"] * 4,
            "target": [448.0, 448.0, 2048.0, 2048.0],
            "metric": ["zero_rounded_before_repair", "saturated"] * 2,
            "value": [0, 0, 0, 0],
        }
    )
    table = comparisons.scale_snapshot_vs_paper(counts, paper)
    assert table["recipe"].tolist() == ["ue5m3_b16"] * 10 + ["bf16"] * 10  # the order given
    assert table["label"].tolist() == [stages.label("ue5m3_b16")] * 10 + [stages.label("bf16")] * 10
    first = table.iloc[:5]
    assert first["target"].tolist() == [448.0] * 5 and first["modules"].tolist() == [2] * 5
    assert first["blocks"].tolist() == [48] * 5
    assert first["metric"].tolist() == comparisons.SNAPSHOT_METRICS
    assert first["ours"].tolist() == [1, 2, 1, 1, 0]
    assert _cells(first["paper"]) == [None, None, None, 0, 0]
    # one zero-rounded code where the paper had none
    assert _cells(first["verdict"]) == [None, None, None, "contradicted", "reproduced"]
    assert _cells(table["verdict"])[-5:] == [None] * 5  # the paper has no bf16 rows here


# --- downstream ------------------------------------------------------------------------------------------


def _downstream(recipe: str, seed: int, core9: float, mmlu: float | None, **extra) -> comparisons.Record:
    path = f"results/eval/downstream/{recipe}/seed{seed}/step8/cold_d50_replay.json"
    aggregates = {"core9_evaluated": {"macro": core9}, "mmlu": {"best": mmlu}, **extra}
    return path, {"policy": "cold_d50_replay", "aggregates": aggregates}


def test_downstream_scores_read_recipe_and_seed_from_the_path_and_drop_missing_scores():
    records = [
        _downstream("bf16", 1, 0.5, 0.25, mmlu_pro_mc=0.125),
        _downstream("bf16", 2, 0.75, None),  # MMLU unscored, MMLU-Pro absent
        (Path("/abs/eval/downstream/mxfp4/seed7/step8/current_tensor.json"), _downstream("x", 1, 0.25, 0.5)[1]),
    ]
    scores = comparisons.downstream_scores(records)
    assert list(zip(scores["recipe"], scores["seed"], scores["benchmark"], scores["score"], strict=True)) == [
        ("bf16", 1, "core_9mcqa_olmes", 50.0),
        ("bf16", 1, "mmlu_olmes", 25.0),
        ("bf16", 1, "mmlu_pro_mc", 12.5),
        ("bf16", 2, "core_9mcqa_olmes", 75.0),
        ("mxfp4", 7, "core_9mcqa_olmes", 25.0),
        ("mxfp4", 7, "mmlu_olmes", 50.0),
    ]


def test_downstream_vs_paper_pairs_per_seed_and_benchmark():
    records = [
        _downstream("bf16", 1, 0.5, 0.25),
        _downstream("bf16", 2, 0.75, 0.5),
        _downstream("ue5m3_b16", 1, 0.625, 0.375),
        _downstream("ue5m3_b16", 2, 0.75, 0.5),
    ]
    paper = pd.DataFrame(
        {
            "config": ["bf16", "bf16", "ue5m3_b16"],
            "benchmark": ["core_9mcqa_olmes", "mmlu_olmes", "core_9mcqa_olmes"],
            "score_percent": [65.0, 40.0, 64.0],
            "examples": [18320, 28084, 18320],
        }
    )
    table = comparisons.downstream_vs_paper(records, paper)
    assert table["benchmark"].tolist() == ["core_9mcqa_olmes", "mmlu_olmes"]
    core = table.iloc[0]
    assert core["recipe"] == "ue5m3_b16" and core["score"] == 68.75 and core["paper_score"] == 64.0
    assert core["effect"] == 6.25 and core["paper_effect"] == -1.0 and core["verdict"] == "inconclusive"
    mmlu = table.iloc[1]
    assert mmlu["effect"] == 6.25 and pd.isna(mmlu["paper_effect"])  # 12.5 and 0.0 points; no paper number
    assert mmlu["verdict"] == "inconclusive"


# --- emulator identification -----------------------------------------------------------------------------


def test_emulator_identification_vs_paper_appends_the_papers_unmatched_rows(tmp_path):
    ours = pd.DataFrame(
        {
            "experiment": ["order", "order", "order", "witness"],
            "variant": ["rne_16", "rne_16", "rne_8", "group64"],
            "candidate": ["c1", "c2", "c1", "c1"],
            "passed": [5, 7, 1, 6],
            "total": [10, 10, 10, 7],
            "fit": ["fit_a", "fit_a", "fit_a", "fit_b"],
        }
    )
    paper = pd.DataFrame(
        {
            "experiment": ["order", "witness", "witness"],
            "variant": ["rne_16", "decoded", "group64"],
            "passed": [143, 0, 6],
            "total": [258, 7, 7],
        }
    )
    table = comparisons.emulator_identification_vs_paper(ours, paper, hardware_fits=["fit_a", "fit_b"])
    assert list(table.columns) == comparisons.EMULATOR_IDENTIFICATION_COLUMNS
    assert {c: str(table[c].dtype) for c in ("passed", "total", "paper_passed", "paper_total")} == dict.fromkeys(
        ("passed", "total", "paper_passed", "paper_total"), "Int64"
    )
    assert _csv(tmp_path, table.drop(columns=["difference", "relative_difference", "tolerance"])) == (
        "fit,experiment,variant,candidate,passed,total,paper_passed,paper_total,share,paper_share,verdict\n"
        f"fit_a,order,rne_16,c1,5,10,143,258,0.5,{143 / 258!r},reproduced\n"
        f"fit_a,order,rne_16,c2,7,10,143,258,0.7,{143 / 258!r},reproduced\n"
        "fit_a,order,rne_8,c1,1,10,,,0.1,,\n"
        f"fit_b,witness,group64,c1,6,7,6,7,{6 / 7!r},{6 / 7!r},reproduced\n"
        ",witness,decoded,,,,0,7,,0.0,not run\n"
    )
    assert table["tolerance"].eq(comparisons.IDENTIFICATION_TOLERANCE.describe()).all()


def test_emulator_identification_agrees_when_both_or_neither_side_matches_every_cell():
    variants = ["rtz_64", "rtz_32", "rne_16", "rtz_16"]
    ours = pd.DataFrame(
        {
            "experiment": ["order"] * 4,
            "variant": variants,
            "candidate": ["c"] * 4,
            "passed": [64, 64, 3, 60],
            "total": [64] * 4,
            "fit": ["f"] * 4,
        }
    )
    paper = pd.DataFrame(
        {"experiment": ["order"] * 4, "variant": variants, "passed": [258, 251, 143, 258], "total": [258] * 4}
    )
    table = comparisons.emulator_identification_vs_paper(ours, paper, hardware_fits=["f"])
    assert _cells(table["verdict"]) == ["reproduced", "contradicted", "reproduced", "contradicted"]
    synthetic = comparisons.emulator_identification_vs_paper(ours, paper)  # an emulator's fit tests the fitter
    assert _cells(synthetic["verdict"]) == ["not run"] * 4


def test_emulator_identification_vs_paper_covers_the_shipped_reference_once_per_candidate():
    paper = reference.load("emulator_identification")
    ours = paper.assign(candidate="probe_matched", fit="f")
    table = comparisons.emulator_identification_vs_paper(ours, paper)
    assert len(table) == len(paper)  # every reference row matched, nothing appended
    assert table["passed"].tolist() == table["paper_passed"].tolist() == paper["passed"].tolist()


# --- grid-regression control -----------------------------------------------------------------------------


def test_grid_regression_control_vs_paper_means_and_bit_identity_per_arm(tmp_path):
    rows = [
        ("bf16", "none", 1, 0.5, "b1"),
        ("bf16", "none", 2, 0.25, "b2"),
        ("rne", "none", 1, 1.0, "x"),
        ("rne", "256", 1, 1.0, "x"),
        ("rne", "none", 2, 2.0, "y"),  # another seed may end elsewhere: identity is per seed
        ("rne", "256", 2, 2.0, "y"),
        ("sr", "none", 1, 3.0, "s"),
        ("sr", "256", 1, 4.0, "t"),  # a grid changed this seed's run: the arm is not bit-identical
        ("sr", "none", 2, 5.0, "u"),
        ("sr", "256", 2, 5.0, "u"),
    ]
    runs = pd.DataFrame(rows, columns=["rounding", "grid", "seed", "final_eval_mse", "params_sha256"])
    paper = pd.DataFrame(
        {
            "arm": ["bf16", "rne", "rtz", "rne", "sr"],
            "metric": ["mean_final_eval_mse"] * 3 + ["bit_identical_across_grids"] * 2,
            "value": [0.375, 1.5, 0.75, 1.0, 1.0],
        }
    )
    table = comparisons.grid_regression_control_vs_paper(runs, paper)
    mse, same = comparisons.GRID_CONTROL_TOLERANCES.values()
    _assert_frame(
        table,
        {
            "arm": ["bf16", "rne", "rtz", "sr", "rne", "sr"],
            "metric": ["mean_final_eval_mse"] * 4 + ["bit_identical_across_grids"] * 2,
            "ours": [0.375, 1.5, NAN, 4.25, 1.0, 0.0],
            "paper": [0.375, 1.5, 0.75, NAN, 1.0, 1.0],
            "difference": [0.0, 0.0, None, None, 0.0, -1.0],
            "relative_difference": [0.0, 0.0, None, None, 0.0, -1.0],
            "tolerance": [mse.describe()] * 4 + [same.describe()] * 2,
            "verdict": ["reproduced", "reproduced", "not run", None, "reproduced", "contradicted"],
        },
    )
    assert _csv(tmp_path, table.drop(columns="tolerance")).splitlines()[1:] == [
        "bf16,mean_final_eval_mse,0.375,0.375,0.0,0.0,reproduced",
        "rne,mean_final_eval_mse,1.5,1.5,0.0,0.0,reproduced",
        "rtz,mean_final_eval_mse,,0.75,,,not run",
        "sr,mean_final_eval_mse,4.25,,,,",
        "rne,bit_identical_across_grids,1.0,1.0,0.0,0.0,reproduced",
        "sr,bit_identical_across_grids,0.0,1.0,-1.0,-1.0,contradicted",
    ]


def test_grid_regression_control_mse_agrees_within_10_percent():
    runs = pd.DataFrame(
        {
            "rounding": ["rne", "sr"],
            "grid": ["none"] * 2,
            "seed": [1, 1],
            "final_eval_mse": [1.09375, 0.875],
            "params_sha256": ["a", "b"],
        }
    )
    paper = pd.DataFrame({"arm": ["rne", "sr"], "metric": ["mean_final_eval_mse"] * 2, "value": [1.0, 1.0]})
    table = comparisons.grid_regression_control_vs_paper(runs, paper)
    # 9.4% and 12.5% off; identity rows: no paper
    assert _cells(table["verdict"]) == ["reproduced", "contradicted", None, None]


# --- parity ----------------------------------------------------------------------------------------------


def _group(elements: int, equal: int, rel_l2: float, max_abs: float, ulp: int) -> dict:
    keys = ("elements", "bitwise_equal_elements", "rel_l2", "max_abs_diff", "max_ulp")
    return dict(zip(keys, (elements, equal, rel_l2, max_abs, ulp), strict=True))


def test_parity_table_one_row_per_report_and_group():
    records = [
        (
            "results/identify/parity/cpu_vs_torch.json",
            {
                "report": {
                    "backends": {"a": "torch", "b": "cpu_kernel"},
                    "groups": {"loss": _group(1, 1, 0.0, 0.0, 0), "params": _group(64, 60, 0.5, 0.25, 2)},
                }
            },
        ),
        (
            Path("/x/native.json"),
            {"report": {"backends": {"a": "torch", "b": "native_te"}, "groups": {"grads": _group(8, 0, 1.0, 2.0, 9)}}},
        ),
    ]
    _assert_frame(
        comparisons.parity_table(records),
        {
            "comparison": ["cpu_vs_torch", "cpu_vs_torch", "native"],
            "backend_a": ["torch", "torch", "torch"],
            "backend_b": ["cpu_kernel", "cpu_kernel", "native_te"],
            "group": ["loss", "params", "grads"],
            "elements": [1, 64, 8],
            "bitwise_equal": [1, 60, 0],
            "rel_l2": [0.0, 0.5, 1.0],
            "max_abs_diff": [0.0, 0.25, 2.0],
            "max_ulp": [0, 2, 9],
        },
    )


def test_parity_table_without_reports_still_has_its_columns(tmp_path):
    table = comparisons.parity_table([])
    assert table.empty
    assert _csv(tmp_path, table) == ",".join(comparisons.PARITY_COLUMNS) + "\n"
