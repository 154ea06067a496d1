"""The recipe comparisons with the paper: training loss, validation NLL, inference policies and downstream accuracy,
each recipe measured against BF16 per seed (see :mod:`ue5m3.experiments.comparisons`).

Every run of a seed starts from the same weights and data order under every recipe, so each table pairs a recipe's
run with BF16's run of the same seed (:mod:`ue5m3.experiments.paired`): the per-seed difference, its mean, a
Student-t interval over seeds and the minimum detectable effect at 80% power, beside the paper's difference of the
same two configurations. The verdict asks whether the interval excludes zero on the paper's side (reproduced), on
the other side (contradicted), or not (inconclusive; the MDE says how large an effect these seeds could have
seen). A recipe only the paper ran is ``not run``; BF16 itself is the baseline and has no verdict.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd

from ue5m3 import stages
from ue5m3.experiments.comparisons.common import BASELINE, Record, reference_by_recipe
from ue5m3.experiments.paired import PAIRED_COLUMNS, PAIRED_DTYPES, Direction, Verdict, effect_row, judge, paired_effect

__all__ = [
    "paired_against_baseline",
    "training_vs_paper",
    "validation_nll_tables",
    "validation_vs_paper",
    "policy_sensitivity_vs_paper",
    "downstream_scores",
    "downstream_vs_paper",
    "POLICY_MARGIN_RULE",
]


def _direction(paper_effect: float | None) -> Direction | None:
    """The paper's claim about an effect it reports: its sign (None: the paper reports none)."""
    if paper_effect is None or pd.isna(paper_effect):
        return None
    return Direction.LOWER if paper_effect < 0 else Direction.HIGHER


def _judged(treatment: Mapping[int, float], baseline: Mapping[int, float], paper_effect: float | None) -> dict:
    """The paired columns of one comparison: our effect against the baseline, the paper's, the verdict."""
    paper_effect = None if paper_effect is None or pd.isna(paper_effect) else float(paper_effect)
    direction = _direction(paper_effect)
    if not treatment or not baseline or not set(treatment) & set(baseline):
        return effect_row(None, paper_effect, Verdict.NOT_RUN)
    effect = paired_effect(treatment, baseline)
    verdict = Verdict.INCONCLUSIVE if direction is None else judge(effect, direction)
    return effect_row(effect, paper_effect, verdict)


def _by_seed(frame: pd.DataFrame, by: str, value: str) -> dict[str, dict[int, float]]:
    """``by`` value -> seed -> ``value`` (one row per run)."""
    return {k: dict(zip(f["seed"].astype(int), f[value].astype(float), strict=True)) for k, f in frame.groupby(by)}


def paired_against_baseline(
    values: pd.DataFrame, *, value: str, group: list[str], paper_effects: Mapping[tuple, float] | None = None
) -> pd.DataFrame:
    """Each recipe's paired effect on ``value`` against BF16 within each ``group`` (e.g. the step).

    Args:
        values: one row per run and group: recipe, seed, the ``group`` columns and ``value``.
        value: the compared column.
        group: the columns (besides recipe) that must match between a recipe's run and BF16's.
        paper_effects: (recipe, *group values) -> the paper's effect of the same comparison.

    Returns:
        One row per (group, recipe) other than BF16: the group columns, recipe, label, then
        :data:`~ue5m3.experiments.paired.PAIRED_COLUMNS`.
    """
    paper_effects = paper_effects or {}
    rows = []
    for key, frame in values.groupby(group, sort=True) if group else [((), values)]:
        key = key if isinstance(key, tuple) else (key,)
        runs = _by_seed(frame, "recipe", value)
        baseline = runs.get(BASELINE, {})
        where = dict(zip(group, key, strict=True))
        for recipe in sorted(r for r in runs if r != BASELINE):
            judged = _judged(runs[recipe], baseline, paper_effects.get((recipe, *key)))
            rows.append({**where, "recipe": recipe, "label": stages.label(recipe), **judged})
    return pd.DataFrame(rows, columns=[*group, "recipe", "label", *PAIRED_COLUMNS])


def _not_run(recipes: Iterable[str], paper_effects: Mapping[str, float], extra: Mapping[str, object]) -> list[dict]:
    """Rows for recipes the paper ran and we did not."""
    return [
        {**extra, "recipe": r, "label": stages.label(r), **effect_row(None, paper_effects[r], Verdict.NOT_RUN)}
        for r in recipes
    ]


def training_vs_paper(final_window: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """Each recipe's final-window mean loss against BF16, paired per seed, beside the paper's gap to BF16.

    Args:
        final_window: ``final_window.csv`` of ``ue5m3 summarize-training`` (recipe, seed, final_window_mean_loss, ...).
        paper: ``reference.load("training_loss_final")``.

    Returns:
        One row per recipe other than BF16 on either side, sorted by recipe: recipe, label, loss (our mean over
        seeds), paper_loss, then :data:`~ue5m3.experiments.paired.PAIRED_COLUMNS` (effect = recipe minus BF16).
    """
    theirs = reference_by_recipe(paper).set_index("recipe")["final_window_mean_loss"]
    paper_gap = (theirs - theirs[BASELINE]).drop(BASELINE)
    table = paired_against_baseline(
        final_window, value="final_window_mean_loss", group=[], paper_effects={(r,): g for r, g in paper_gap.items()}
    )
    table = pd.concat(
        [table, pd.DataFrame(_not_run(sorted(set(paper_gap.index) - set(table["recipe"])), paper_gap, {}))],
        ignore_index=True,
    )
    loss = final_window.groupby("recipe")["final_window_mean_loss"].mean()
    table.insert(2, "loss", table["recipe"].map(loss).astype("Float64"))
    table.insert(3, "paper_loss", table["recipe"].map(theirs).astype("Float64"))
    return table.sort_values("recipe", ignore_index=True).astype(PAIRED_DTYPES)


def _main_policy_rows(results: pd.DataFrame) -> pd.DataFrame:
    """Each recipe's evaluations under its main policy (its most frequent one: the sensitivity runs add other
    policies at the last step only)."""
    main_policy = results["recipe"].map(lambda r: results[results["recipe"] == r]["policy"].mode()[0])
    return results[results["policy"] == main_policy]


def validation_nll_tables(results: pd.DataFrame, paper: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Validation NLL per recipe and step with its percent against BF16 and its spreads, ours and the paper's (the
    figures' data; the verdicts are :func:`validation_vs_paper`'s).

    Ours keeps each recipe's main policy and aggregates over seeds. The percent is ``100 (bf16 - x) / bf16`` at the
    same step, so positive means better than BF16: of the seed means, and its range over seeds with each seed
    paired with BF16's run of the same seed. low and high bound every single evaluation of the group: the range over
    evaluation orders for the order-dependent replay, the bootstrap 95% interval for a stateless policy.

    Returns:
        ``(ours, paper)``: ours with columns recipe, step, mean, min, max (NLL over seeds), seeds, low, high,
        percent_vs_bf16, percent_vs_bf16_min, percent_vs_bf16_max (sorted by recipe and step); the reference
        table with config renamed recipe and percent_vs_bf16 appended.
    """
    main = _main_policy_rows(results)
    bf16 = main[main["recipe"] == BASELINE][["seed", "step", "nll"]].rename(columns={"nll": "bf16_nll"})
    baseline = main.merge(bf16, on=["seed", "step"], how="left")["bf16_nll"].set_axis(main.index)
    main = main.assign(percent=100 * (baseline - main["nll"]) / baseline)
    grouped = main.groupby(["recipe", "step"])
    ours = grouped["nll"].agg(["mean", "min", "max"])
    ours["seeds"] = grouped["seed"].nunique()
    ours["low"], ours["high"] = grouped["low"].min(), grouped["high"].max()
    ours = ours.reset_index()
    bf16_ours = ours[ours["recipe"] == BASELINE].set_index("step")["mean"]
    ours["percent_vs_bf16"] = 100 * (ours["step"].map(bf16_ours) - ours["mean"]) / ours["step"].map(bf16_ours)
    ours["percent_vs_bf16_min"] = grouped["percent"].min().to_numpy()
    ours["percent_vs_bf16_max"] = grouped["percent"].max().to_numpy()
    return ours, _paper_with_percent(paper)


def _paper_with_percent(paper: pd.DataFrame) -> pd.DataFrame:
    """The reference NLL table keyed by recipe, with the percent vs BF16 at the same step appended."""
    paper = reference_by_recipe(paper)
    bf16_paper = paper[paper["recipe"] == BASELINE].set_index("step")["nll"]
    paper["percent_vs_bf16"] = 100 * (paper["step"].map(bf16_paper) - paper["nll"]) / paper["step"].map(bf16_paper)
    return paper


def validation_vs_paper(results: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """Each recipe's validation NLL against BF16 at each checkpoint, paired per seed, beside the paper's NLL
    difference at the same fraction of training.

    The two sides' checkpoints differ (ours every few steps of a short CPU run, the paper's every 2,500 of 30,000),
    so rows pair by ``training_fraction``: the step over the side's last evaluated step (both evaluate to the end of
    training, and their learning-rate schedules have the same shape). Equal fractions are equal floats (IEEE
    division is correctly rounded), so 25 / 150 pairs with 5,000 / 30,000. Each recipe under its main policy.

    Returns:
        One row per (recipe, training_fraction) other than BF16 on either side: training_fraction, recipe, label,
        step (ours), paper_step, nll (our mean over seeds), paper_nll, then
        :data:`~ue5m3.experiments.paired.PAIRED_COLUMNS` (effect = recipe minus BF16, in NLL).
    """
    main = _main_policy_rows(results).copy()
    main["training_fraction"] = main["step"] / main["step"].max()
    theirs = reference_by_recipe(paper)
    theirs["training_fraction"] = theirs["step"] / theirs["step"].max()
    indexed = theirs.set_index(["recipe", "training_fraction"])["nll"]
    bf16 = theirs[theirs["recipe"] == BASELINE].set_index("training_fraction")["nll"]
    paper_effects = {(r, f): nll - bf16[f] for (r, f), nll in indexed.items() if r != BASELINE and f in bf16.index}
    table = paired_against_baseline(main, value="nll", group=["training_fraction"], paper_effects=paper_effects)
    ours_keys = set(zip(table["recipe"], table["training_fraction"], strict=True))
    missing = sorted(k for k in paper_effects if k not in ours_keys)
    table = pd.concat(
        [
            table,
            pd.DataFrame(
                [
                    {"training_fraction": f, "recipe": r, "label": stages.label(r)}
                    | effect_row(None, paper_effects[(r, f)], Verdict.NOT_RUN)
                    for r, f in missing
                ]
            ),
        ],
        ignore_index=True,
    )
    steps = main.groupby("training_fraction")["step"].first()
    nll = main.groupby(["recipe", "training_fraction"])["nll"].mean()
    keys = list(zip(table["recipe"], table["training_fraction"], strict=True))
    table.insert(3, "step", table["training_fraction"].map(steps).astype("Int64"))
    table.insert(4, "paper_step", table["training_fraction"].map(theirs.groupby("training_fraction")["step"].first()))
    table.insert(5, "nll", pd.array([nll.get(k) for k in keys], dtype="Float64"))
    table.insert(6, "paper_nll", pd.array([indexed.get(k) for k in keys], dtype="Float64"))
    table["paper_step"] = table["paper_step"].astype("Int64")
    return table.sort_values(["recipe", "training_fraction"], ignore_index=True).astype(PAIRED_DTYPES)


POLICY_MARGIN_RULE = (
    "equivalent within the paper's headline NLL gap between the proposed recipe and TE NVFP4 at its last checkpoint"
)
"""What makes two inference policies "as good as" each other: a difference smaller than the effect the paper
reports between its two main recipes (a policy choice that moved NLL by that much would change the headline)."""


def policy_sensitivity_vs_paper(results: pd.DataFrame, paper: pd.DataFrame, *, recipe: str) -> pd.DataFrame:
    """One recipe's validation NLL under each inference policy at our last checkpoint, against the policy the paper
    evaluated it with, paired per seed: an equivalence claim (appendix A: the policies differ by less than
    ``8.99e-5`` NLL at step 30,000) judged with the margin :data:`POLICY_MARGIN_RULE`.

    Args:
        results: :func:`ue5m3.evaluation.nll.load_results` of the NLL records; must hold ``recipe`` at its last step.
        paper: ``reference.load("validation_nll")``.
        recipe: the recipe whose policies are compared (the config's ``evaluation.sensitivity_recipe``).

    Returns:
        One row per policy other than the paper's, sorted: recipe, label, policy, reference_policy, step, nll (our
        mean over seeds), margin, then :data:`~ue5m3.experiments.paired.PAIRED_COLUMNS` (effect = this policy minus
        the paper's policy, in NLL; the paper's effect is unknown per policy).
    """
    theirs = reference_by_recipe(paper)
    at_end = theirs[theirs["step"] == theirs["step"].max()].set_index("recipe")
    reference_policy = at_end.loc[recipe, "inference_policy"]
    margin = abs(float(at_end.loc["ue5m3_b16", "nll"]) - float(at_end.loc["nvfp4_te", "nll"]))
    last = results["step"].max()
    rows = results[(results["recipe"] == recipe) & (results["step"] == last)]
    by_policy = _by_seed(rows, "policy", "nll")
    baseline = by_policy.get(reference_policy, {})
    out = []
    for policy in sorted(p for p in by_policy if p != reference_policy):
        if baseline and set(baseline) & set(by_policy[policy]):
            effect = paired_effect(by_policy[policy], baseline)
            judged = effect_row(effect, None, judge(effect, Direction.EQUIVALENT, margin=margin))
        else:
            judged = effect_row(None, None, Verdict.NOT_RUN)
        out.append(
            {
                "recipe": recipe,
                "label": stages.label(recipe),
                "policy": policy,
                "reference_policy": reference_policy,
                "step": int(last),
                "nll": sum(by_policy[policy].values()) / len(by_policy[policy]),
                "margin": margin,
                **judged,
            }
        )
    columns = ["recipe", "label", "policy", "reference_policy", "step", "nll", "margin", *PAIRED_COLUMNS]
    return pd.DataFrame(out, columns=columns).astype(PAIRED_DTYPES)


def downstream_scores(records: Iterable[Record]) -> pd.DataFrame:
    """One row per (run, benchmark) of ``ue5m3 evaluate-downstream`` results at
    ``.../<recipe>/seed<s>/step<n>/<policy>.json``: recipe, seed, policy, benchmark (``core_9mcqa_olmes``: the macro
    over the Core 9 tasks evaluated; ``mmlu_olmes``: MMLU's best formulation; ``mmlu_pro_mc``, absent or None at CPU
    scale: dropped) and score in percent."""
    rows = []
    for path, record in records:
        parts = Path(path).parts
        base = {"recipe": parts[-4], "seed": int(parts[-3].removeprefix("seed")), "policy": record["policy"]}
        aggregates = record["aggregates"]
        rows.append({**base, "benchmark": "core_9mcqa_olmes", "score": aggregates["core9_evaluated"]["macro"]})
        rows.append({**base, "benchmark": "mmlu_olmes", "score": aggregates["mmlu"]["best"]})
        rows.append({**base, "benchmark": "mmlu_pro_mc", "score": aggregates.get("mmlu_pro_mc")})
    scores = pd.DataFrame(rows, columns=["recipe", "seed", "policy", "benchmark", "score"]).dropna(subset=["score"])
    return scores.assign(score=scores["score"].astype(float) * 100).reset_index(drop=True)


def downstream_vs_paper(records: Iterable[Record], paper: pd.DataFrame) -> pd.DataFrame:
    """Each recipe's downstream accuracy against BF16 per benchmark, paired per seed, beside the paper's gap.

    Args:
        records: ``(path, record)`` per result (:func:`downstream_scores`).
        paper: ``reference.load("olmes_aggregates")``.

    Returns:
        One row per (benchmark, recipe) other than BF16 that we scored, sorted: benchmark, recipe, label, score (our
        mean over seeds, percent), paper_score, then :data:`~ue5m3.experiments.paired.PAIRED_COLUMNS` (effect =
        recipe minus BF16, in points).
    """
    scores = downstream_scores(records)
    theirs = reference_by_recipe(paper).set_index(["recipe", "benchmark"])["score_percent"]
    bf16 = {b: s for (r, b), s in theirs.items() if r == BASELINE}
    paper_effects = {(b, r): s - bf16[b] for (r, b), s in theirs.items() if r != BASELINE and b in bf16}
    swapped = {(r, b): e for (b, r), e in paper_effects.items()}
    table = paired_against_baseline(scores, value="score", group=["benchmark"], paper_effects=swapped)
    mean = scores.groupby(["recipe", "benchmark"])["score"].mean()
    keys = list(zip(table["recipe"], table["benchmark"], strict=True))
    table.insert(3, "score", pd.array([mean.get(k) for k in keys], dtype="Float64"))
    table.insert(4, "paper_score", pd.array([theirs.get(k) for k in keys], dtype="Float64"))
    return table.sort_values(["benchmark", "recipe"], ignore_index=True).astype(PAIRED_DTYPES)
