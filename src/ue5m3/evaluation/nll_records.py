"""The NLL records' statistics and table, without torch: what the claims, the power analysis and the notebooks read.

:mod:`ue5m3.evaluation.nll` writes the records (it runs models, so it imports torch); this module only reads them
(:func:`load_results`) and holds the record-level statistics they use (:func:`order_summary`, :func:`t_quantile`,
:func:`percent_vs_bf16`), so that a notebook or summary that draws NLL results never pays torch's import.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pandas only where the table is built: the evaluation jobs that import this module never build it
    import pandas as pd

__all__ = ["t_quantile", "order_summary", "percent_vs_bf16", "load_results"]


def t_quantile(p: float, df: int) -> float:
    """Quantile of Student's t with ``df`` degrees of freedom (Simpson-integrated CDF, bisection; p in (0.5, 1))."""
    if not 0.5 < p < 1 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df >= 1, got p={p!r}, df={df!r}")
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf(t: float, n: int = 4000) -> float:
        xs = np.linspace(0.0, t, n + 1)
        ys = np.exp(log_norm - (df + 1) / 2 * np.log1p(xs * xs / df))
        return 0.5 + (t / n / 3) * (ys[0] + ys[-1] + 4 * ys[1:-1:2].sum() + 2 * ys[2:-1:2].sum())

    low, high = 0.0, 1.0
    while cdf(high) < p:
        high *= 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if cdf(mid) < p else (low, mid)
    return (low + high) / 2


def order_summary(values: Sequence[float], *, level: float = 0.95) -> dict[str, float | int | None]:
    """Mean, min, max and a Student-t interval of NLL over evaluation orders (interval None for one order)."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        raise ValueError("order_summary needs at least one order's NLL")
    mean = float(data.mean())
    out: dict[str, float | int | None] = {
        "orders": int(data.size),
        "mean": mean,
        "min": float(data.min()),
        "max": float(data.max()),
        "t_low": None,
        "t_high": None,
    }
    if data.size > 1:
        half = t_quantile(1 - (1 - level) / 2, data.size - 1) * float(data.std(ddof=1)) / math.sqrt(data.size)
        out["t_low"], out["t_high"] = mean - half, mean + half
    return out


def percent_vs_bf16(bf16: float, candidate: float) -> float:
    """100 * (bf16 - candidate) / bf16: positive when the candidate's NLL is lower than BF16's."""
    return 100.0 * (bf16 - candidate) / bf16


def load_results(paths: Sequence[str | Path]) -> pd.DataFrame:
    """The records written by :func:`run_nll` as one table (one row per checkpoint, recipe, seed and policy).

    Columns: recipe, seed, step, policy, gemm_output_model, nll, low, high (the bootstrap interval, or the
    range over evaluation orders for the order-dependent replay), orders, checkpoint_sha256.
    """
    import pandas as pd

    rows = []
    for path in map(Path, paths):
        record = json.loads(path.read_text())
        if "order_summary" in record:
            low, high = record["order_summary"]["min"], record["order_summary"]["max"]
        else:
            low, high = record["bootstrap_95"]["low"], record["bootstrap_95"]["high"]
        rows.append(
            {
                "recipe": record["run_recipe"],
                "seed": record["seed"],
                "step": record["checkpoint_step"],
                "policy": record["policy"],
                "gemm_output_model": record["gemm_output_model"],
                "nll": record["nll"],
                "low": low,
                "high": high,
                "orders": len(record["order_nll"]),
                "checkpoint_sha256": record["checkpoint_sha256"],
            }
        )
    return pd.DataFrame(rows).sort_values(["recipe", "seed", "step", "policy"], ignore_index=True)
