"""The recipe comparisons with the paper: training loss, validation NLL, inference policies and downstream accuracy,
each recipe measured against BF16 (see :mod:`ue5m3.experiments.comparisons`)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from ue5m3.experiments.agreement import Criterion, Tolerance, with_agreement
from ue5m3.experiments.comparisons.common import BASELINE, Record, reference_by_recipe

__all__ = [
    "TRAINING_TOLERANCE",
    "VALIDATION_TOLERANCE",
    "DOWNSTREAM_TOLERANCE",
    "training_gaps",
    "training_vs_paper",
    "validation_nll_tables",
    "validation_vs_paper",
    "policy_sensitivity_vs_paper",
    "downstream_vs_paper",
]


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
    return _gap_to_bf16(by_recipe), _gap_to_bf16(reference_by_recipe(paper))


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
        compare=table["recipe"] != BASELINE,
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
    bf16 = main[main["recipe"] == BASELINE][["seed", "step", "nll"]].rename(columns={"nll": "bf16_nll"})
    main = main.assign(percent=_seed_percent_vs_bf16(main, bf16, "nll"))
    grouped = main.groupby(["recipe", "step"])
    ours = grouped["nll"].agg(["mean", "min", "max"])
    ours["seeds"] = grouped["seed"].nunique()
    ours["low"], ours["high"] = grouped["low"].min(), grouped["high"].max()
    ours = ours.reset_index()
    bf16_ours = ours[ours["recipe"] == BASELINE].set_index("step")["mean"]
    ours["percent_vs_bf16"] = 100 * (ours["step"].map(bf16_ours) - ours["mean"]) / ours["step"].map(bf16_ours)
    ours["percent_vs_bf16_min"] = grouped["percent"].min().to_numpy()
    ours["percent_vs_bf16_max"] = grouped["percent"].max().to_numpy()
    return ours, _paper_percent_vs_bf16(paper)


def _paper_percent_vs_bf16(paper: pd.DataFrame) -> pd.DataFrame:
    """The reference NLL table keyed by recipe, with the percent vs BF16 at the same step appended."""
    paper = reference_by_recipe(paper)
    bf16_paper = paper[paper["recipe"] == BASELINE].set_index("step")["nll"]
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
        compare=table["recipe"] != BASELINE,
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
    bf16 = at_last[at_last["recipe"] == BASELINE][["seed", "step", "nll"]].rename(columns={"nll": "bf16_nll"})
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
    paper = reference_by_recipe(paper).rename(columns={"score_percent": "paper"})
    table = ours.merge(paper[["recipe", "benchmark", "paper"]], on=["recipe", "benchmark"], how="left")
    for side, column in (("ours", "mean"), ("paper", "paper")):
        baseline = table[table["recipe"] == BASELINE].set_index("benchmark")[column]
        table[f"gap_to_bf16_{side}"] = table[column] - table["benchmark"].map(baseline)
    return with_agreement(
        table,
        ours="gap_to_bf16_ours",
        paper="gap_to_bf16_paper",
        tolerance=DOWNSTREAM_TOLERANCE,
        compare=table["recipe"] != BASELINE,
    )
