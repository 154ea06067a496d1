"""Our numbers beside the paper's: the ``figures/*_vs_paper.csv`` tables (and the backend parity table).

Each figure notebook writes, next to its figures, one CSV that puts this project's measurements row by row
beside the numbers the paper reports (:mod:`ue5m3.reference`; never typed in). The tables are built here, as
pure functions of the result tables the pipeline writes and the reference table as
:func:`ue5m3.reference.load` returns it, so they are tested and the notebooks only load, call and draw.

Every comparison table ends with the same four agreement columns
(:func:`ue5m3.experiments.agreement.with_agreement`): our value minus the paper's, that difference over the
paper's magnitude, the tolerance in words (its rule and why it means something there) and the verdict. Each
table's tolerance is a module constant here (``*_TOLERANCE`` or ``*_TOLERANCES``, per metric). Where both sides
ran the same experiment (accumulation statistics, the tiny grid control) it is a sampling spread; where our runs
are CPU scale beside the paper's 8B runs the comparison is qualitative (the sign of an effect against BF16).

- :func:`accumulation_vs_paper` (appendix C): RTZ magnitude bias and gain error of BF16 operands, and the
  final-grid sweep, one row per reference row;
- :func:`training_vs_paper`: each recipe's final-window mean loss and its gap to BF16, ours (mean and spread
  over seeds) beside the paper's 8B single-seed numbers; the gap is the comparable quantity, scales differ;
- :func:`validation_vs_paper`: held-out NLL per recipe and checkpoint (ours: mean, min and max over seeds, and
  the widest single-evaluation interval: the replay's order range or a bootstrap interval) and its percent
  against BF16, beside the paper's at the same fraction of training;
- :func:`policy_sensitivity_vs_paper`: one recipe's NLL under each inference policy at the last checkpoint, as
  percent against BF16, beside the paper's for the policy it used;
- :func:`scale_snapshot_vs_paper` (section 5.3): zero-rounded and saturated scale codes of the checkpoint
  snapshot, beside the paper's (none);
- :func:`downstream_vs_paper`: Core 9, MMLU and MMLU-Pro MC accuracy in percent (mean, min, max and number
  of seeds) and its gap to BF16, beside the paper's step-30,000 aggregates;
- :func:`emulator_identification_vs_paper`: per fit, the cells each GEMM output model reproduces bit for bit
  in the paper's identification tables, beside the paper's native-Blackwell counts;
- :func:`grid_regression_control_vs_paper`: the tiny grid-regression control's mean final eval MSE per arm
  and whether each arm is bit-identical across the final grids, ours beside the paper's, one row per metric;
- :func:`throughput_vs_paper` (table 10): model-body tokens/s, time per 100 steps and the speed-up of the
  no-RHT/all-linears ablation over the TE recipe within each of our runs, beside the paper's native numbers;
- :func:`parity_table`: not a paper comparison but the other table a notebook builds: two GEMM backends
  compared per tensor group after one training run each.

The pipeline's CSVs are these frames written with :func:`ue5m3.artifacts.write_csv` (columns in frame
order), so a frame's columns, row order, values and dtypes are the file's contents; changing any of them
changes a pipeline output.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from ue5m3.experiments.agreement import AGREEMENT_COLUMNS, Criterion, Tolerance, with_agreement

__all__ = [
    "ACCUMULATION_TOLERANCES",
    "TRAINING_TOLERANCE",
    "VALIDATION_TOLERANCE",
    "DOWNSTREAM_TOLERANCE",
    "IDENTIFICATION_TOLERANCE",
    "GRID_CONTROL_TOLERANCES",
    "SNAPSHOT_TOLERANCE",
    "THROUGHPUT_TOLERANCE",
    "accumulation_vs_paper",
    "training_gaps",
    "training_vs_paper",
    "validation_nll_tables",
    "validation_vs_paper",
    "policy_sensitivity_vs_paper",
    "SNAPSHOT_METRICS",
    "scale_snapshot_vs_paper",
    "downstream_vs_paper",
    "EMULATOR_IDENTIFICATION_COLUMNS",
    "emulator_identification_vs_paper",
    "grid_regression_control_vs_paper",
    "THROUGHPUT_COLUMNS",
    "throughput_vs_paper",
    "PARITY_COLUMNS",
    "parity_table",
]

Record = tuple[str | os.PathLike[str], Mapping[str, Any]]
"""A JSON result as ``(path, parsed record)``; some tables read identity (recipe, seed, name) off the path."""


def _by_recipe(paper: pd.DataFrame) -> pd.DataFrame:
    """A reference table keyed by this project's recipe names (the reference files call the column config)."""
    return paper.rename(columns={"config": "recipe"})


# --- agreement with the paper ----------------------------------------------------------------------------

_BASELINE = "bf16"  # the recipe every gap and percent is measured against


ACCUMULATION_TOLERANCES: dict[str, Tolerance] = {
    "magnitude_bias_ppm": Tolerance(
        criterion=Criterion.CLOSE,
        relative=0.10,
        reason="Monte-Carlo estimates: the paper's gaussian and gaussian_sigma32 rows, one statistic, differ by 3%",
    ),
    "gain_error_ppm": Tolerance(
        criterion=Criterion.CLOSE,
        relative=0.10,
        reason="Monte-Carlo estimates: the paper's gaussian and gaussian_sigma32 rows, one statistic, differ by 3%",
    ),
    "mapped_to_zero_pct": Tolerance(
        criterion=Criterion.CLOSE,
        absolute=3.0,
        reason="percentage points: about 3 standard deviations of the difference of two shares of 4,096 trials",
    ),
    "signal_gain": Tolerance(
        criterion=Criterion.CLOSE, absolute=0.05, reason="a least-squares gain estimated from 4,096 trials"
    ),
    "rmse": Tolerance(
        criterion=Criterion.CLOSE,
        relative=0.05,
        reason="about 3 standard deviations of the difference of two RMS estimates over 4,096 trials",
    ),
}
"""Per metric of :func:`accumulation_vs_paper`: the same experiment at both scales, so the bounds are sampling
spreads (a binomial share of n trials has standard deviation sqrt(p (1 - p) / n), under 0.8 points at n = 4,096;
an RMS estimate's relative standard error is about 1 / sqrt(2 n), 1.1%)."""

TRAINING_TOLERANCE = Tolerance(
    criterion=Criterion.SIGN,
    reason="CPU-scale runs beside the paper's 8B, 30,000-step ones: only the direction of the gap to BF16 compares",
)
"""Of :func:`training_vs_paper`: each recipe's gap to BF16 (the BF16 row itself is not compared)."""

VALIDATION_TOLERANCE = Tolerance(
    criterion=Criterion.SIGN,
    reason="CPU-scale runs beside the paper's 8B ones at the same fraction of training: only the direction of "
    "the percent vs BF16 compares",
)
"""Of :func:`validation_vs_paper` and :func:`policy_sensitivity_vs_paper`: the percent vs BF16."""

DOWNSTREAM_TOLERANCE = Tolerance(
    criterion=Criterion.SIGN,
    reason="a near-chance CPU-scale model on a few examples per task beside the paper's 8B on the full suites: "
    "only the direction of the gap to BF16 compares",
)
"""Of :func:`downstream_vs_paper`: each recipe's accuracy gap to BF16, in points."""

IDENTIFICATION_TOLERANCE = Tolerance(
    criterion=Criterion.COMPLETE,
    reason="shares of different probe corpora, and at CPU scale a synthetic oracle stands in for native "
    "Blackwell: identification asks which output models reproduce every cell",
)
"""Of :func:`emulator_identification_vs_paper`: the share of cells matched bit for bit."""

GRID_CONTROL_TOLERANCES: dict[str, Tolerance] = {
    "mean_final_eval_mse": Tolerance(
        criterion=Criterion.CLOSE,
        relative=0.10,
        reason="the paper's experiment and seeds on other hardware; single seeds' MSEs differ by about 5%",
    ),
    "bit_identical_across_grids": Tolerance(criterion=Criterion.CLOSE, reason="a yes/no finding, 1 = bit-identical"),
}
"""Per metric of :func:`grid_regression_control_vs_paper` (the tiny control runs at the paper's own scale)."""

SNAPSHOT_TOLERANCE = Tolerance(
    criterion=Criterion.CLOSE, reason="block counts of one held-out sequence; the paper found none for either target"
)
"""Of :func:`scale_snapshot_vs_paper`: zero-rounded and saturated scale codes."""


# --- the tables ------------------------------------------------------------------------------------------


def accumulation_vs_paper(rtz_bias: pd.DataFrame, grid_sweep: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """The paper's appendix-C accumulation numbers, each beside ours.

    The paper's bias table is RTZ accumulation of BF16 operands, so only those rows of ``rtz_bias`` are
    matched; the grid sweep matches on grid label (``none``, ``1/256``, ...) and metric.

    Args:
        rtz_bias: ``rtz_bias.csv`` of ``ue5m3 accumulation-stats`` (distribution, operands, rho, metric,
            variant, value_ppm).
        grid_sweep: its ``grid_sweep.csv`` (sigma, scale, grid, denominator, metric, value).
        paper: ``reference.load("accumulation_statistics")``.

    Returns:
        Columns table, distribution_or_grid, metric, paper, ours and :data:`AGREEMENT_COLUMNS` (tolerance per
        metric: :data:`ACCUMULATION_TOLERANCES`); one row per reference row in the reference's order (ours empty
        where we have no counterpart).
    """
    bf16_rtz = rtz_bias[(rtz_bias["operands"] == "bf16") & (rtz_bias["variant"] == "rtz")]
    ours = pd.concat(
        [
            bf16_rtz.rename(columns={"distribution": "distribution_or_grid", "value_ppm": "ours"}),
            grid_sweep.rename(columns={"grid": "distribution_or_grid", "value": "ours"}),
        ]
    )[["distribution_or_grid", "metric", "ours"]]
    table = paper.rename(columns={"value": "paper"}).merge(ours, on=["distribution_or_grid", "metric"], how="left")
    return with_agreement(table, ours="ours", paper="paper", tolerance=ACCUMULATION_TOLERANCES, by="metric")


def _gap_to_bf16(table: pd.DataFrame) -> pd.DataFrame:
    bf16 = table.set_index("recipe").loc["bf16", "final_window_mean_loss"]
    return table.assign(gap_to_bf16=table["final_window_mean_loss"] - bf16)


def training_gaps(by_recipe: pd.DataFrame, paper: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Both sides' final-window mean loss with ``gap_to_bf16`` (the recipe's loss minus BF16's) added.

    Args:
        by_recipe: ``by_recipe.csv`` of ``ue5m3 summarize-training`` (recipe, final_window_mean_loss,
            seed_std, seed_min, seed_max, seeds); must hold ``bf16``.
        paper: ``reference.load("training_loss_final")``.

    Returns:
        ``(ours, paper)``: ``by_recipe`` and the reference table (its config column renamed recipe), each
        with a gap_to_bf16 column appended.
    """
    return _gap_to_bf16(by_recipe), _gap_to_bf16(_by_recipe(paper))


def training_vs_paper(by_recipe: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """Each recipe's final-window mean loss and gap to BF16, ours beside the paper's (see :func:`training_gaps`).

    Returns:
        One row per recipe on either side, sorted by recipe: recipe, final_window_mean_loss_ours, seed_std,
        seed_min, seed_max, seeds, gap_to_bf16_ours, final_window_mean_loss_paper, endpoint_loss,
        endpoint_grad_norm, gap_to_bf16_paper (empty cells where a side lacks the recipe), then
        :data:`AGREEMENT_COLUMNS` on the gap to BF16 (:data:`TRAINING_TOLERANCE`; BF16 itself not compared).
    """
    ours, theirs = training_gaps(by_recipe, paper)
    table = ours.merge(theirs, on="recipe", how="outer", suffixes=("_ours", "_paper")).sort_values("recipe")
    table = table.reset_index(drop=True)
    return with_agreement(
        table,
        ours="gap_to_bf16_ours",
        paper="gap_to_bf16_paper",
        tolerance=TRAINING_TOLERANCE,
        compare=table["recipe"] != _BASELINE,
    )


def _seed_percent_vs_bf16(rows: pd.DataFrame, bf16: pd.DataFrame, column: str) -> pd.Series:
    """``100 (bf16 - x) / bf16`` per row, against BF16's NLL of the same seed and step (empty without one)."""
    baseline = rows.merge(bf16, on=["seed", "step"], how="left")["bf16_nll"].set_axis(rows.index)
    return 100 * (baseline - rows[column]) / baseline


def validation_nll_tables(results: pd.DataFrame, paper: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Validation NLL per recipe and step with its percent against BF16 and its spreads, ours and the paper's.

    Ours keeps each recipe's main policy (its most frequent one: the sensitivity runs add other policies at
    the last step only) and aggregates over seeds. The percent is ``100 (bf16 - x) / bf16`` at the same step, so
    positive means better than BF16: of the seed means, and its range over seeds with each seed paired with BF16's
    run of the same seed. low and high bound every single evaluation of the group: the range over evaluation
    orders for the order-dependent replay (cold D = 50), the bootstrap 95% interval for a stateless policy.

    Args:
        results: :func:`ue5m3.evaluation.nll.load_results` of the NLL records (recipe, seed, step, policy,
            nll, low, high, ...); must hold ``bf16`` at every step it holds.
        paper: ``reference.load("validation_nll")``.

    Returns:
        ``(ours, paper)``: ours with columns recipe, step, mean, min, max (NLL over seeds), seeds, low, high,
        percent_vs_bf16, percent_vs_bf16_min, percent_vs_bf16_max (sorted by recipe and step); the reference
        table with config renamed recipe and percent_vs_bf16 appended.
    """
    main_policy = results["recipe"].map(lambda r: results[results["recipe"] == r]["policy"].mode()[0])
    main = results[results["policy"] == main_policy]
    bf16 = main[main["recipe"] == _BASELINE][["seed", "step", "nll"]].rename(columns={"nll": "bf16_nll"})
    main = main.assign(percent=_seed_percent_vs_bf16(main, bf16, "nll"))
    grouped = main.groupby(["recipe", "step"])
    ours = grouped["nll"].agg(["mean", "min", "max"])
    ours["seeds"] = grouped["seed"].nunique()
    ours["low"], ours["high"] = grouped["low"].min(), grouped["high"].max()
    ours = ours.reset_index()
    bf16_ours = ours[ours["recipe"] == _BASELINE].set_index("step")["mean"]
    ours["percent_vs_bf16"] = 100 * (ours["step"].map(bf16_ours) - ours["mean"]) / ours["step"].map(bf16_ours)
    ours["percent_vs_bf16_min"] = grouped["percent"].min().to_numpy()
    ours["percent_vs_bf16_max"] = grouped["percent"].max().to_numpy()
    return ours, _paper_percent_vs_bf16(paper)


def _paper_percent_vs_bf16(paper: pd.DataFrame) -> pd.DataFrame:
    """The reference NLL table keyed by recipe, with the percent vs BF16 at the same step appended."""
    paper = _by_recipe(paper)
    bf16_paper = paper[paper["recipe"] == _BASELINE].set_index("step")["nll"]
    paper["percent_vs_bf16"] = 100 * (paper["step"].map(bf16_paper) - paper["nll"]) / paper["step"].map(bf16_paper)
    return paper


def validation_vs_paper(results: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """Validation NLL and percent vs BF16 per recipe, ours beside the paper's at the same fraction of training
    (see :func:`validation_nll_tables`).

    The two sides' checkpoints differ (ours every few steps of a short CPU run, the paper's every 2,500 of
    30,000), so rows pair by ``training_fraction``: the step over the side's last evaluated step (both sides
    evaluate up to the end of training, and their learning-rate schedules have the same shape). Equal fractions
    are equal floats (IEEE division is correctly rounded), so 25 / 150 pairs with 5,000 / 30,000.

    Returns:
        One row per (recipe, training_fraction) on either side, sorted by both: recipe, training_fraction,
        step_ours, mean, min, max, seeds, low, high, percent_vs_bf16_ours, percent_vs_bf16_min,
        percent_vs_bf16_max (ours), step_paper, nll, inference_policy, percent_vs_bf16_paper (the paper's), then
        :data:`AGREEMENT_COLUMNS` on the percent vs BF16 (:data:`VALIDATION_TOLERANCE`; BF16 not compared).
        Empty cells where a side lacks the point.
    """
    ours, theirs = validation_nll_tables(results, paper)
    ours["training_fraction"] = ours["step"] / ours["step"].max()
    theirs["training_fraction"] = theirs["step"] / theirs["step"].max()
    table = ours.merge(theirs, on=["recipe", "training_fraction"], how="outer", suffixes=("_ours", "_paper"))
    table = table.sort_values(["recipe", "training_fraction"]).reset_index(drop=True)
    table = table.astype({"step_ours": "Int64", "step_paper": "Int64", "seeds": "Int64"})
    first = ["recipe", "training_fraction", "step_ours"]
    table = table[first + [c for c in table.columns if c not in first]]
    return with_agreement(
        table,
        ours="percent_vs_bf16_ours",
        paper="percent_vs_bf16_paper",
        tolerance=VALIDATION_TOLERANCE,
        compare=table["recipe"] != _BASELINE,
    )


def policy_sensitivity_vs_paper(results: pd.DataFrame, paper: pd.DataFrame, *, recipe: str) -> pd.DataFrame:
    """One recipe's validation NLL under each inference policy at our last checkpoint, as percent vs BF16,
    beside the paper's percent for the policy the paper evaluated that recipe with (at its last checkpoint).

    Each seed's percent pairs with BF16's run of the same seed; the order range turns each seed's low/high NLL
    (orders for the replay, bootstrap 95% for stateless policies) into percent the same way.

    Args:
        results: as for :func:`validation_nll_tables`; must hold ``bf16`` and ``recipe`` at its last step.
        paper: ``reference.load("validation_nll")``.
        recipe: the recipe whose policies are compared (the config's ``evaluation.sensitivity_recipe``).

    Returns:
        One row per policy, sorted: policy, step, seeds, nll_mean, nll_min, nll_max, percent_vs_bf16 (mean over
        seeds), percent_vs_bf16_min, percent_vs_bf16_max (over seeds), interval_percent_low and
        interval_percent_high (the widest single-evaluation interval), paper_step, paper_nll and
        paper_percent_vs_bf16 (empty for a policy the paper did not use), then :data:`AGREEMENT_COLUMNS` on the
        percent (:data:`VALIDATION_TOLERANCE`).
    """
    last = results["step"].max()
    at_last = results[results["step"] == last]
    bf16 = at_last[at_last["recipe"] == _BASELINE][["seed", "step", "nll"]].rename(columns={"nll": "bf16_nll"})
    rows = at_last[at_last["recipe"] == recipe]
    rows = rows.assign(
        percent=_seed_percent_vs_bf16(rows, bf16, "nll"),
        percent_low=_seed_percent_vs_bf16(rows, bf16, "high"),  # a higher NLL is a lower percent
        percent_high=_seed_percent_vs_bf16(rows, bf16, "low"),
    )
    grouped = rows.groupby("policy")
    table = pd.DataFrame(
        {
            "step": grouped["step"].first(),
            "seeds": grouped["seed"].nunique(),
            "nll_mean": grouped["nll"].mean(),
            "nll_min": grouped["nll"].min(),
            "nll_max": grouped["nll"].max(),
            "percent_vs_bf16": grouped["percent"].mean(),
            "percent_vs_bf16_min": grouped["percent"].min(),
            "percent_vs_bf16_max": grouped["percent"].max(),
            "interval_percent_low": grouped["percent_low"].min(),
            "interval_percent_high": grouped["percent_high"].max(),
        }
    ).reset_index()
    theirs = _paper_percent_vs_bf16(paper)
    theirs = theirs[(theirs["recipe"] == recipe) & (theirs["step"] == theirs["step"].max())]
    theirs = theirs.set_index("inference_policy")
    table["paper_step"] = table["policy"].map(theirs["step"]).astype("Int64")
    table["paper_nll"] = table["policy"].map(theirs["nll"]).astype("Float64")
    table["paper_percent_vs_bf16"] = table["policy"].map(theirs["percent_vs_bf16"]).astype("Float64")
    return with_agreement(table, ours="percent_vs_bf16", paper="paper_percent_vs_bf16", tolerance=VALIDATION_TOLERANCE)


SNAPSHOT_METRICS = ["zero_blocks", "below_2^-17", "below_2^-18", "zero_rounded_before_repair", "saturated"]
"""Block counts of a ``ue5m3 scale-snapshot`` counts.csv, in the table's order."""


def scale_snapshot_vs_paper(counts: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """The checkpoint snapshot's block counts per checkpoint and target, summed over the captured modules, beside
    the paper's (section 5.3: no zero-rounded or saturated scale codes before repair for either target).

    Args:
        counts: every snapshot's ``counts.csv`` (module, target, blocks and :data:`SNAPSHOT_METRICS`) stacked,
            with a ``recipe`` column naming the checkpoint's recipe.
        paper: ``reference.load("scale_snapshot")`` (config, target, metric, value).

    Returns:
        One row per (recipe, target, metric), in the order of the recipes as given, targets ascending and
        :data:`SNAPSHOT_METRICS`: recipe, target, modules, blocks, metric, ours, paper (empty for metrics the paper
        does not report), then :data:`AGREEMENT_COLUMNS` (:data:`SNAPSHOT_TOLERANCE`).
    """
    grouped = counts.groupby(["recipe", "target"], sort=False)
    sums = grouped[["blocks", *SNAPSHOT_METRICS]].sum().assign(modules=grouped["module"].nunique())
    sums = sums.reset_index()
    order = {recipe: i for i, recipe in enumerate(dict.fromkeys(counts["recipe"]))}
    sums = sums.sort_values(["recipe", "target"], key=lambda c: c.map(order) if c.name == "recipe" else c)
    table = sums.melt(
        id_vars=["recipe", "target", "modules", "blocks"],
        value_vars=SNAPSHOT_METRICS,
        var_name="metric",
        value_name="ours",
    )
    rank = {metric: i for i, metric in enumerate(SNAPSHOT_METRICS)}
    table = table.sort_values(
        ["recipe", "target", "metric"],
        key=lambda c: c.map(order) if c.name == "recipe" else c.map(rank) if c.name == "metric" else c,
    )
    reference = _by_recipe(paper).rename(columns={"value": "paper"})
    table = table.merge(reference, on=["recipe", "target", "metric"], how="left").reset_index(drop=True)
    table["paper"] = table["paper"].astype("Int64")
    return with_agreement(
        table, ours="ours", paper="paper", tolerance=SNAPSHOT_TOLERANCE, compare=table["paper"].notna()
    )


def downstream_vs_paper(records: Iterable[Record], paper: pd.DataFrame) -> pd.DataFrame:
    """Downstream accuracy in percent per recipe and benchmark, ours over seeds beside the paper's.

    Each record is one ``ue5m3 evaluate-downstream`` result at ``.../<recipe>/seed<s>/step<n>/<policy>.json``;
    it scores ``core_9mcqa_olmes`` (the macro over the Core 9 tasks we evaluated, ``core9_evaluated``),
    ``mmlu_olmes`` (MMLU's best formulation) and ``mmlu_pro_mc`` (absent or ``None`` at CPU scale: dropped).

    Args:
        records: ``(path, record)`` per result; the recipe and seed are read from the path.
        paper: ``reference.load("olmes_aggregates")``.

    Returns:
        One row per (recipe, benchmark) we scored, sorted by both: recipe, benchmark, mean, min, max, count
        (seeds), paper (the paper's percent, empty where it has none), gap_to_bf16_ours and gap_to_bf16_paper
        (each side's accuracy minus its BF16 accuracy on the benchmark, in points; empty without a BF16 row),
        then :data:`AGREEMENT_COLUMNS` on the gap (:data:`DOWNSTREAM_TOLERANCE`; BF16 itself not compared).
    """
    rows = []
    for path, record in records:
        parts = Path(path).parts
        base = {"recipe": parts[-4], "seed": int(parts[-3].removeprefix("seed")), "policy": record["policy"]}
        aggregates = record["aggregates"]
        rows.append({**base, "benchmark": "core_9mcqa_olmes", "score": aggregates["core9_evaluated"]["macro"]})
        rows.append({**base, "benchmark": "mmlu_olmes", "score": aggregates["mmlu"]["best"]})
        rows.append({**base, "benchmark": "mmlu_pro_mc", "score": aggregates.get("mmlu_pro_mc")})
    ours = pd.DataFrame(rows).dropna(subset=["score"])
    ours["score"] *= 100
    ours = ours.groupby(["recipe", "benchmark"])["score"].agg(["mean", "min", "max", "count"]).reset_index()
    paper = _by_recipe(paper).rename(columns={"score_percent": "paper"})
    table = ours.merge(paper[["recipe", "benchmark", "paper"]], on=["recipe", "benchmark"], how="left")
    for side, column in (("ours", "mean"), ("paper", "paper")):
        baseline = table[table["recipe"] == _BASELINE].set_index("benchmark")[column]
        table[f"gap_to_bf16_{side}"] = table[column] - table["benchmark"].map(baseline)
    return with_agreement(
        table,
        ours="gap_to_bf16_ours",
        paper="gap_to_bf16_paper",
        tolerance=DOWNSTREAM_TOLERANCE,
        compare=table["recipe"] != _BASELINE,
    )


EMULATOR_IDENTIFICATION_COLUMNS = [
    "fit",
    "experiment",
    "variant",
    "candidate",
    "passed",
    "total",
    "paper_passed",
    "paper_total",
    "share",
    "paper_share",
    *AGREEMENT_COLUMNS,
]
"""Columns of :func:`emulator_identification_vs_paper`."""


def emulator_identification_vs_paper(tables: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """Cells matched bit for bit per fit and identification table row, beside the paper's native counts.

    Args:
        tables: every fit's ``tables.csv`` (``ue5m3 fit-emulator``: experiment, variant, candidate, passed,
            total) stacked, with a ``fit`` column naming the fit of each row.
        paper: ``reference.load("emulator_identification")``.

    Returns:
        :data:`EMULATOR_IDENTIFICATION_COLUMNS`: our rows in the given order with the paper's counts for
        their (experiment, variant), then the paper's rows we have no counterpart for (fit, candidate,
        passed and total empty). Counts are nullable integers (``Int64``); share and paper_share are each
        side's passed / total, compared by :data:`IDENTIFICATION_TOLERANCE`.
    """
    paper = paper.rename(columns={"passed": "paper_passed", "total": "paper_total"})
    table = tables.merge(paper, on=["experiment", "variant"], how="left")
    keys = set(zip(tables["experiment"], tables["variant"], strict=True))
    extra = paper[[(e, v) not in keys for e, v in zip(paper["experiment"], paper["variant"], strict=True)]]
    table = pd.concat([table, extra], ignore_index=True)
    table = table.astype({c: "Int64" for c in ("passed", "total", "paper_passed", "paper_total")})
    table["share"] = (table["passed"] / table["total"]).astype("Float64")
    table["paper_share"] = (table["paper_passed"] / table["paper_total"]).astype("Float64")
    table = with_agreement(table, ours="share", paper="paper_share", tolerance=IDENTIFICATION_TOLERANCE)
    return table[EMULATOR_IDENTIFICATION_COLUMNS]


_GRID_METRICS = ["mean_final_eval_mse", "bit_identical_across_grids"]


def grid_regression_control_vs_paper(runs: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """Mean final eval MSE and bit identity across grids per arm of the grid-regression control, beside the paper's.

    An arm (a rounding: ``rne``, ``sr``; ``bf16`` is unquantized and has no grids) is bit-identical when, for
    every seed, all its runs across the final grids end with the same parameter hash.

    Args:
        runs: ``runs.csv`` of ``ue5m3 grid-control`` (rounding, grid, seed, final_eval_mse, params_sha256, ...).
        paper: ``reference.load("grid_regression_control")`` (arm, metric, value).

    Returns:
        One row per (metric, arm) on either side, mean_final_eval_mse rows first, arms sorted: arm, metric, ours
        (the mean final eval MSE over seeds and grids, or 1 / 0 for bit-identical or not; no bit-identity row for
        bf16), paper, then :data:`AGREEMENT_COLUMNS` (:data:`GRID_CONTROL_TOLERANCES`).
    """
    quantized = runs[runs["rounding"] != _BASELINE]
    identical = quantized.groupby(["rounding", "seed"])["params_sha256"].nunique().eq(1).groupby("rounding").all()
    mse = runs.groupby("rounding")["final_eval_mse"].mean()
    ours = pd.concat(
        [
            pd.DataFrame({"arm": mse.index, "metric": "mean_final_eval_mse", "ours": mse.to_numpy()}),
            pd.DataFrame(
                {"arm": identical.index, "metric": "bit_identical_across_grids", "ours": identical.astype(float)}
            ),
        ],
        ignore_index=True,
    )
    table = ours.merge(paper.rename(columns={"value": "paper"}), on=["arm", "metric"], how="outer")
    table = table.sort_values(["metric", "arm"], key=lambda c: c.map(_GRID_METRICS.index) if c.name == "metric" else c)
    table = table.reset_index(drop=True)[["arm", "metric", "ours", "paper"]]
    return with_agreement(table, ours="ours", paper="paper", tolerance=GRID_CONTROL_TOLERANCES, by="metric")


THROUGHPUT_COLUMNS = [
    "run",
    "execution",
    "device",
    "device_name",
    "model",
    "recipe",
    "fp4_linears",
    "bf16_linears",
    "rht",
    "tokens_per_s",
    "wall_s_100_steps",
    "ratio_to_bf16",
    "speedup_vs_nvfp4_te",
    "paper_fp4_linears",
    "paper_bf16_linears",
    "paper_rht",
    "paper_tokens_per_s",
    "paper_wall_s_100_steps",
    "paper_speedup_vs_nvfp4_te",
    *AGREEMENT_COLUMNS,
]
"""Columns of :func:`throughput_vs_paper`."""

_TE_RECIPE = "nvfp4_te"  # the paper's reference row of table 10: speed-ups are against it

THROUGHPUT_TOLERANCE = Tolerance(
    criterion=Criterion.CLOSE,
    relative=0.10,
    reason="native NVFP4 on one Blackwell GPU with the paper's protocol; the GPU, the Transformer Engine version "
    "and the Mamba-2 scan (pure PyTorch unless mamba_ssm) differ from the paper's GB200 run and change the share "
    "of time in the FP4 linears",
)
"""Of :func:`throughput_vs_paper`: the no-RHT/all-linears speed-up over the TE recipe of a native run. Emulated
rows are not compared: they time the software emulation, which says nothing about the native kernels' speed."""


def throughput_vs_paper(ours: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """Each of our throughput rows beside the paper's native row of the same recipe (table 10).

    The speed-up is tokens/s over the TE recipe's tokens/s in the same run (our runs time both recipes on the same
    machine; the paper's +21.2% is 3,893.87 / 3,212.39). Times per 100 steps are ours scaled from the measured
    steps. Our emulated rows measure the emulation's cost on their device, not the native kernels' speed.

    Args:
        ours: the ``throughput.csv`` tables of ``ue5m3 throughput`` concatenated (run, recipe, execution, ...).
        paper: ``reference.load("throughput_ablation")``.

    Returns:
        :data:`THROUGHPUT_COLUMNS`, one row per row of ``ours`` in its order (paper columns empty for recipes
        the paper did not time, such as the BF16 baseline; speed-up empty in a run without the TE recipe). Only
        the ablation's speed-up in native runs is judged (:data:`THROUGHPUT_TOLERANCE`).
    """
    reference = _by_recipe(paper).set_index("recipe")
    te = ours[ours["recipe"] == _TE_RECIPE].set_index("run")["tokens_per_second"]
    table = pd.DataFrame(
        {
            "run": ours["run"],
            "execution": ours["execution"],
            "device": ours["device"],
            "device_name": ours["device_name"],
            "model": ours["model"],
            "recipe": ours["recipe"],
            "fp4_linears": ours["fp4_linears"],
            "bf16_linears": ours["bf16_linears"],
            "rht": ours["rht"],
            "tokens_per_s": ours["tokens_per_second"],
            "wall_s_100_steps": ours["seconds_per_step"] * 100,
            "ratio_to_bf16": ours["ratio_to_bf16"],
            "speedup_vs_nvfp4_te": ours["tokens_per_second"] / ours["run"].map(te),
        }
    ).reset_index(drop=True)
    paper_speedup = reference["tokens_per_s"] / reference.loc[_TE_RECIPE, "tokens_per_s"]
    for column, values in (
        ("paper_fp4_linears", reference["fp4_linears"]),
        ("paper_bf16_linears", reference["bf16_linears"]),
        ("paper_rht", reference["rht"]),
        ("paper_tokens_per_s", reference["tokens_per_s"]),
        ("paper_wall_s_100_steps", reference["wall_s_100_steps"]),
        ("paper_speedup_vs_nvfp4_te", paper_speedup),
    ):
        table[column] = table["recipe"].map(values)
    # nullable dtypes: a cell without a counterpart is written empty (never "nan"), counts stay integers
    floats = ("speedup_vs_nvfp4_te", "paper_tokens_per_s", "paper_wall_s_100_steps", "paper_speedup_vs_nvfp4_te")
    table = table.astype(
        {"paper_fp4_linears": "Int64", "paper_bf16_linears": "Int64", "paper_rht": "string"}
        | dict.fromkeys(floats, "Float64")
    )
    judged = (table["execution"] == "native_te") & (table["recipe"] == "nvfp4_no_rht_all_linears")
    table = with_agreement(
        table,
        ours="speedup_vs_nvfp4_te",
        paper="paper_speedup_vs_nvfp4_te",
        tolerance=THROUGHPUT_TOLERANCE,
        compare=judged,
    )
    return table[THROUGHPUT_COLUMNS]


PARITY_COLUMNS = [
    "comparison",
    "backend_a",
    "backend_b",
    "group",
    "elements",
    "bitwise_equal",
    "rel_l2",
    "max_abs_diff",
    "max_ulp",
]
"""Columns of :func:`parity_table`."""


def parity_table(records: Iterable[Record]) -> pd.DataFrame:
    """Parity of two GEMM backends (one forward/backward and N AdamW steps each), one row per tensor group.

    Args:
        records: ``(path, record)`` per parity result (``results/identify/parity/<name>.json``); the
            comparison is named by the file stem, the record's ``report`` holds the backends and the groups.

    Returns:
        :data:`PARITY_COLUMNS`, rows in record then group order.
    """
    rows = []
    for path, record in records:
        report = record["report"]
        for group, c in report["groups"].items():
            rows.append(
                {
                    "comparison": Path(path).stem,
                    "backend_a": report["backends"]["a"],
                    "backend_b": report["backends"]["b"],
                    "group": group,
                    "elements": c["elements"],
                    "bitwise_equal": c["bitwise_equal_elements"],
                    "rel_l2": c["rel_l2"],
                    "max_abs_diff": c["max_abs_diff"],
                    "max_ulp": c["max_ulp"],
                }
            )
    return pd.DataFrame(rows, columns=PARITY_COLUMNS)
