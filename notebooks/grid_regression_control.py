# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     notebook_metadata_filter: language_info
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
#   language_info:
#     name: python
# ---

# %%
# The tiny grid-regression control (paper appendix C; gemm spec section 4).
#
# A 256-256-64 SiLU teacher-student regression trained 500 AdamW steps per seed in BF16 and in UE5M3 B16 with
# probe-matched GEMMs, unsnapped and snapped to each final grid, with RNE or stochastic dY rounding
# (`ue5m3 grid-control`). Shows whether every run is bit-identical across the six grids, the training loss,
# and the mean final eval MSE beside the paper's from `ue5m3.reference` (never typed in).
import json
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from ue5m3 import reference
from ue5m3.artifacts import write_csv
from ue5m3.experiments import comparisons
from ue5m3.plotting import OURS_COLOR, PAPER_COLOR, notebook_setup, save_figure

# %% tags=["parameters"]
runs_csv = "results/identify/grid_control/runs.csv"
curves_csv = "results/identify/grid_control/curves.csv"
summary_json = "results/identify/grid_control/summary.json"
figure_pdf = "figures/grid_regression_control.pdf"
table_csv = "figures/grid_regression_control_vs_paper.csv"

# %%
notebook_setup(
    globals(),
    runs_csv="input.runs",
    curves_csv="input.curves",
    summary_json="input.summary",
    figure_pdf="output.figure",
    table_csv="output.table",
)
runs = pd.read_csv(runs_csv, dtype={"grid": str})
curves = pd.read_csv(curves_csv, dtype={"grid": str})
summary = json.loads(Path(summary_json).read_text())
# Bit identity per arm: one distinct final-parameter hash per seed across all grids.
table = comparisons.grid_regression_control_vs_paper(runs, reference.load("grid_regression_control"))
write_csv(table_csv, table.to_dict("records"), list(table.columns))
print(table.to_string(index=False))
print("bitwise identical across grids, per seed/rounding:", summary["bitwise_identical_across_grids"])

# %%
# Left: training loss (mean over seeds) per arm and grid; identical runs draw on top of each other.
# Right: mean final eval MSE, ours beside the paper's.
fig, (left, right) = plt.subplots(1, 2, figsize=(8.5, 3.4))
styles = {"bf16": ("0.2", "-"), "rne": (OURS_COLOR, "-"), "sr": ("#d62728", "--")}
for (arm, grid), group in curves.groupby(["rounding", "grid"], sort=True):
    color, linestyle = styles.get(arm, ("0.5", ":"))
    mean = group.groupby("step")["loss"].mean()
    label = arm if grid == "none" else None
    left.plot(mean.index, mean.values, color=color, linestyle=linestyle, linewidth=0.9, label=label)
left.set_yscale("log")
left.set_xlabel("step")
left.set_ylabel("training MSE")
left.legend(title="arm (all grids)")
arms = list(table["arm"])
x = range(len(arms))
right.bar([i - 0.2 for i in x], table["ours"], width=0.4, color=OURS_COLOR, label="ours")
right.bar([i + 0.2 for i in x], table["paper"], width=0.4, color=PAPER_COLOR, alpha=0.5, label="paper")
right.set_xticks(list(x), labels=arms)
right.set_yscale("log")
right.set_ylabel("mean final eval MSE")
right.legend()
save_figure(fig, figure_pdf)
