"""Our numbers beside the paper's: the ``figures/*_vs_paper.csv`` tables (and the backend parity table).

Each figure notebook writes, next to its figures, one CSV that puts this project's measurements row by row
beside the numbers the paper reports (:mod:`ue5m3.reference`; never typed in). The tables are built here, as
pure functions of the result tables the pipeline writes and the reference table as
:func:`ue5m3.reference.load` returns it, so they are tested and the notebooks only load, call and draw:

- :func:`accumulation_vs_paper` (appendix C): RTZ magnitude bias and gain error of BF16 operands, and the
  final-grid sweep, one row per reference row;
- :func:`training_vs_paper`: each recipe's final-window mean loss and its gap to BF16, ours (mean and spread
  over seeds) beside the paper's 8B single-seed numbers; the gap is the comparable quantity, scales differ;
- :func:`validation_vs_paper`: held-out NLL per recipe and checkpoint (ours: mean, min and max over seeds and
  evaluation orders under each recipe's main policy) and its percent against BF16, beside the paper's;
- :func:`downstream_vs_paper`: Core 9, MMLU and MMLU-Pro MC accuracy in percent (mean, min, max and number
  of seeds) beside the paper's step-30,000 aggregates;
- :func:`emulator_identification_vs_paper`: per fit, the cells each GEMM output model reproduces bit for bit
  in the paper's identification tables, beside the paper's native-Blackwell counts;
- :func:`grid_regression_control_vs_paper`: the tiny grid-regression control's mean final eval MSE per arm
  and whether each arm is bit-identical across the final grids, ours beside the paper's;
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

__all__ = [
    "accumulation_vs_paper",
    "training_gaps",
    "training_vs_paper",
    "validation_nll_tables",
    "validation_vs_paper",
    "downstream_vs_paper",
    "EMULATOR_IDENTIFICATION_COLUMNS",
    "emulator_identification_vs_paper",
    "grid_regression_control_vs_paper",
    "PARITY_COLUMNS",
    "parity_table",
]

Record = tuple[str | os.PathLike[str], Mapping[str, Any]]
"""A JSON result as ``(path, parsed record)``; some tables read identity (recipe, seed, name) off the path."""


def _by_recipe(paper: pd.DataFrame) -> pd.DataFrame:
    """A reference table keyed by this project's recipe names (the reference files call the column config)."""
    return paper.rename(columns={"config": "recipe"})


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
        Columns table, distribution_or_grid, metric, paper, ours; one row per reference row in the
        reference's order (ours empty where we have no counterpart).
    """
    bf16_rtz = rtz_bias[(rtz_bias["operands"] == "bf16") & (rtz_bias["variant"] == "rtz")]
    ours = pd.concat(
        [
            bf16_rtz.rename(columns={"distribution": "distribution_or_grid", "value_ppm": "ours"}),
            grid_sweep.rename(columns={"grid": "distribution_or_grid", "value": "ours"}),
        ]
    )[["distribution_or_grid", "metric", "ours"]]
    return paper.rename(columns={"value": "paper"}).merge(ours, on=["distribution_or_grid", "metric"], how="left")


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
        endpoint_grad_norm, gap_to_bf16_paper (empty cells where a side lacks the recipe).
    """
    ours, theirs = training_gaps(by_recipe, paper)
    table = ours.merge(theirs, on="recipe", how="outer", suffixes=("_ours", "_paper")).sort_values("recipe")
    return table.reset_index(drop=True)


def validation_nll_tables(results: pd.DataFrame, paper: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Validation NLL per recipe and step with its percent against BF16, ours and the paper's.

    Ours keeps each recipe's main policy (its most frequent one: the sensitivity runs add other policies at
    the last step only) and aggregates over seeds and evaluation orders. The percent is
    ``100 (bf16 - x) / bf16`` at the same step, so positive means better than BF16.

    Args:
        results: :func:`ue5m3.evaluation.nll.load_results` of the NLL records (recipe, seed, step, policy,
            nll, ...); must hold ``bf16`` at every step it holds.
        paper: ``reference.load("validation_nll")``.

    Returns:
        ``(ours, paper)``: ours with columns recipe, step, mean, min, max, percent_vs_bf16 (sorted by recipe
        and step); the reference table with config renamed recipe and percent_vs_bf16 appended.
    """
    main_policy = results["recipe"].map(lambda r: results[results["recipe"] == r]["policy"].mode()[0])
    main = results[results["policy"] == main_policy]
    ours = main.groupby(["recipe", "step"])["nll"].agg(["mean", "min", "max"]).reset_index()
    bf16_ours = ours[ours["recipe"] == "bf16"].set_index("step")["mean"]
    ours["percent_vs_bf16"] = 100 * (ours["step"].map(bf16_ours) - ours["mean"]) / ours["step"].map(bf16_ours)
    paper = _by_recipe(paper)
    bf16_paper = paper[paper["recipe"] == "bf16"].set_index("step")["nll"]
    paper["percent_vs_bf16"] = 100 * (paper["step"].map(bf16_paper) - paper["nll"]) / paper["step"].map(bf16_paper)
    return ours, paper


def validation_vs_paper(results: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """Validation NLL and percent vs BF16 per recipe and step, ours beside the paper's
    (see :func:`validation_nll_tables`).

    Returns:
        One row per (recipe, step) on either side: recipe, step, mean, min, max, percent_vs_bf16_ours, nll,
        inference_policy, percent_vs_bf16_paper (mean/min/max are ours, nll and inference_policy the
        paper's; empty where a side lacks the point).
    """
    ours, theirs = validation_nll_tables(results, paper)
    return ours.merge(theirs, on=["recipe", "step"], how="outer", suffixes=("_ours", "_paper"))


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
        (seeds) and paper (the paper's percent, empty where it has none).
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
    return ours.merge(paper[["recipe", "benchmark", "paper"]], on=["recipe", "benchmark"], how="left")


EMULATOR_IDENTIFICATION_COLUMNS = [
    "fit",
    "experiment",
    "variant",
    "candidate",
    "passed",
    "total",
    "paper_passed",
    "paper_total",
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
        passed and total empty). Counts are nullable integers (``Int64``).
    """
    paper = paper.rename(columns={"passed": "paper_passed", "total": "paper_total"})
    table = tables.merge(paper, on=["experiment", "variant"], how="left")
    keys = set(zip(tables["experiment"], tables["variant"], strict=True))
    extra = paper[[(e, v) not in keys for e, v in zip(paper["experiment"], paper["variant"], strict=True)]]
    table = pd.concat([table, extra], ignore_index=True)
    table = table.astype({c: "Int64" for c in ("passed", "total", "paper_passed", "paper_total")})
    return table[EMULATOR_IDENTIFICATION_COLUMNS]


def grid_regression_control_vs_paper(runs: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """Mean final eval MSE and bit identity across grids per arm of the grid-regression control, beside the paper's.

    An arm (a rounding: ``rne``, ``sr``; ``bf16`` is unquantized and has no grids) is bit-identical when, for
    every seed, all its runs across the final grids end with the same parameter hash.

    Args:
        runs: ``runs.csv`` of ``ue5m3 grid-control`` (rounding, grid, seed, final_eval_mse, params_sha256, ...).
        paper: ``reference.load("grid_regression_control")``.

    Returns:
        One row per arm on either side (outer merge on the MSE): arm, ours (mean final eval MSE over seeds and
        grids), paper, paper_bit_identical, ours_bit_identical (1 or 0; empty for bf16 and arms we lack).
    """
    quantized = runs[runs["rounding"] != "bf16"]
    identical = quantized.groupby(["rounding", "seed"])["params_sha256"].nunique().eq(1).groupby("rounding").all()
    ours = runs.groupby("rounding")["final_eval_mse"].mean().rename("ours").reset_index()
    ours = ours.rename(columns={"rounding": "arm"})
    mse = paper[paper["metric"] == "mean_final_eval_mse"].rename(columns={"value": "paper"})[["arm", "paper"]]
    same = paper[paper["metric"] == "bit_identical_across_grids"].rename(columns={"value": "paper_bit_identical"})
    table = ours.merge(mse, on="arm", how="outer").merge(same[["arm", "paper_bit_identical"]], on="arm", how="left")
    table["ours_bit_identical"] = table["arm"].map(lambda arm: int(identical[arm]) if arm in identical else None)
    return table


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
