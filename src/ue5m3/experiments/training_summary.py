"""Training summaries: curves, final-window means, stability counters and the spread over seeds.

The paper reports, per configuration and one seed: 250-step moving means of the training loss (moving median
of the gradient norm), the mean of the final 10 logged losses and the endpoint loss and gradient norm, and
how many losses above 3 and gradient norms above 1 were logged after the first checkpoint. This module
computes the same quantities from our runs' ``metrics.jsonl`` (with the smoothing window rescaled to our
logging interval) and adds what one seed cannot show: the spread over seeds.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pandas as pd

from ue5m3 import config
from ue5m3.artifacts import provenance, write_csv, write_json
from ue5m3.config import Range

__all__ = ["SummaryConfig", "load_runs", "smooth", "final_window", "by_recipe", "run"]


@dataclass(frozen=True, kw_only=True)
class SummaryConfig:
    """Settings of ``ue5m3 summarize-training`` (the pipeline's ``training.summary``).

    Attributes:
        final_window: logged points whose mean loss is a run's final-window loss (the paper: the final 10 points,
            logged every 25 steps: steps 29,775 to 30,000).
        smoothing_steps: window of the moving mean of the loss (moving median of the gradient norm) in optimizer
            steps, rescaled to each run's logging interval (the paper: 250).
    """

    final_window: int = 10
    smoothing_steps: int = 250

    RANGES: ClassVar[dict[str, Range]] = {
        "final_window": Range(1, 10**6, note="logged points of the final window; the paper: 10"),
        "smoothing_steps": Range(1, 10**7, note="optimizer steps of the moving window; the paper: 250"),
    }

    def __post_init__(self) -> None:
        for key in ("final_window", "smoothing_steps"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}: a positive int, got {getattr(self, key)!r}")


def load_runs(run_dirs: Sequence[str | Path]) -> pd.DataFrame:
    """All logged metrics of finished runs, one row per (run, step), labelled by recipe and seed.

    Raises:
        FileNotFoundError: a run without ``final.json`` (unfinished) or without metrics.
    """
    frames = []
    for run_dir in map(Path, run_dirs):
        final_path = run_dir / "final.json"
        if not final_path.is_file():
            raise FileNotFoundError(f"run {run_dir} has no final.json: it has not finished")
        final = json.loads(final_path.read_text())
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
        if not rows:
            raise FileNotFoundError(f"run {run_dir} logged no metrics")
        frame = pd.DataFrame(rows)
        frame["run"] = str(run_dir)
        frame["recipe"] = final["recipe"]
        frame["seed"] = final["seed"]
        frame["steps"] = final["config"]["steps"]
        frame["log_every"] = final["config"]["log_every"]
        frames.append(frame)
    return pd.concat(frames, ignore_index=True).sort_values(["recipe", "seed", "step"], ignore_index=True)


def smooth(df: pd.DataFrame, window_steps: int) -> pd.DataFrame:
    """Moving mean of the loss and moving median of the gradient norm over ``window_steps`` optimizer steps."""
    out = []
    for _, run in df.groupby("run", sort=False):
        points = max(1, round(window_steps / int(run["log_every"].iloc[0])))
        run = run.copy()
        run["loss_smoothed"] = run["loss"].rolling(points, min_periods=1).mean()
        run["grad_norm_smoothed"] = run["grad_norm"].rolling(points, min_periods=1).median()
        out.append(run)
    return pd.concat(out, ignore_index=True)


def final_window(df: pd.DataFrame, points: int) -> pd.DataFrame:
    """Per run: mean of the last ``points`` logged losses, endpoint loss and gradient norm, stability counts.

    Counts of losses above 3 and gradient norms above 1 include only steps after the first twelfth of the run
    (the paper counts after its first checkpoint, step 2,500 of 30,000).
    """
    rows = []
    for (recipe, seed), run in df.groupby(["recipe", "seed"], sort=True):
        after = run[run["step"] > run["steps"].iloc[0] / 12]
        rows.append(
            {
                "recipe": recipe,
                "seed": int(seed),
                "final_window_mean_loss": float(run["loss"].tail(points).mean()),
                "endpoint_loss": float(run["loss"].iloc[-1]),
                "endpoint_grad_norm": float(run["grad_norm"].iloc[-1]),
                "losses_above_3": int((after["loss"] > 3).sum()),
                "grad_norms_above_1": int((after["grad_norm"] > 1).sum()),
                "saturated_blocks": int(run.get("saturated_blocks", pd.Series([0])).sum()),
                "zero_rounded_blocks": int(run.get("zero_rounded_blocks", pd.Series([0])).sum()),
            }
        )
    return pd.DataFrame(rows)


def by_recipe(windows: pd.DataFrame) -> pd.DataFrame:
    """Mean, standard deviation, min and max over seeds of each recipe's final-window mean loss."""
    grouped = windows.groupby("recipe")["final_window_mean_loss"]
    table = grouped.agg(["mean", "std", "min", "max", "count"]).reset_index()
    table = table.rename(
        columns={
            "count": "seeds",
            "mean": "final_window_mean_loss",
            "std": "seed_std",
            "min": "seed_min",
            "max": "seed_max",
        }
    )
    return table.fillna({"seed_std": 0.0})


def run(run_dirs: Sequence[str | Path], out_dir: str | Path, cfg: SummaryConfig | None = None) -> dict[str, Path]:
    """Write curves.csv, final_window.csv, by_recipe.csv and provenance.json under ``out_dir``."""
    cfg = cfg if cfg is not None else SummaryConfig()
    out = Path(out_dir)
    metrics = smooth(load_runs(run_dirs), cfg.smoothing_steps)
    windows = final_window(metrics, cfg.final_window)
    summary = by_recipe(windows)
    paths = {"curves": out / "curves.csv", "final_window": out / "final_window.csv", "by_recipe": out / "by_recipe.csv"}
    columns = [
        "recipe",
        "seed",
        "step",
        "loss",
        "loss_smoothed",
        "grad_norm",
        "grad_norm_smoothed",
        "lr",
        "tokens_per_s",
    ]
    write_csv(paths["curves"], metrics[columns].to_dict("records"), columns)
    write_csv(paths["final_window"], windows.to_dict("records"), list(windows.columns))
    write_csv(paths["by_recipe"], summary.to_dict("records"), list(summary.columns))
    paths["provenance"] = out / "provenance.json"
    settings = {"runs": [str(r) for r in run_dirs], **config.dump(cfg)}
    write_json(paths["provenance"], provenance("summarize-training", settings))
    return paths
