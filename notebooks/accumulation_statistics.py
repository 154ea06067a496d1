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
# Statistical consequences of the probe-matched FP32 accumulation (paper appendix C).
#
# Draws the tables that `ue5m3 accumulation-stats` writes, beside the paper's numbers from
# `ue5m3.reference` (never typed in): (a) the RTZ magnitude bias and gain error per operand distribution,
# (b) near cancellation: RMS residue and share of outputs mapped to exactly 0 per residual sigma, and
# (c) the final-grid sweep. It also writes our numbers beside the paper's as a CSV. Runs under Snakemake
# (`rule accumulation_figures`), papermill, nbmake, or by hand from the repository root or `notebooks/`.
import matplotlib.pyplot as plt
import pandas as pd

from ue5m3 import reference
from ue5m3.artifacts import write_csv
from ue5m3.experiments import comparisons
from ue5m3.plotting import OURS_COLOR, format_number, notebook_setup, paper_vs_ours, save_figure

# %% tags=["parameters"]
rtz_bias_csv = "results/accumulation/rtz_bias.csv"
cancellation_csv = "results/accumulation/cancellation.csv"
grid_sweep_csv = "results/accumulation/grid_sweep.csv"
rtz_bias_pdf = "figures/accumulation_rtz_bias.pdf"
cancellation_pdf = "figures/accumulation_cancellation.pdf"
grid_sweep_pdf = "figures/accumulation_grid_sweep.pdf"
comparison_csv = "figures/accumulation_vs_paper.csv"
# Series of our RTZ-bias results: (operands, variant) -> colour and marker.
bias_series = {
    ("bf16", "rtz"): (OURS_COLOR, "o"),
    ("bf16", "rne"): (OURS_COLOR, "x"),
    ("nvfp4_dequantized", "rtz"): ("#ff7f0e", "s"),
    ("nvfp4", "rtz"): ("#d62728", "D"),
}
# Line style per accumulation variant (the gridded variants often coincide, hence different line styles).
variant_styles = {
    "rne": {"color": "#1f77b4", "marker": "o", "linestyle": "-"},
    "rtz": {"color": "#d62728", "marker": "s", "linestyle": "-"},
    "rne_grid": {"color": "#2ca02c", "marker": "^", "linestyle": "--"},
    "rtz_grid": {"color": "#9467bd", "marker": "v", "linestyle": ":"},
}

# %%
notebook_setup(
    globals(),
    rtz_bias_csv="input.rtz_bias",
    cancellation_csv="input.cancellation",
    grid_sweep_csv="input.grid_sweep",
    rtz_bias_pdf="output.rtz_bias",
    cancellation_pdf="output.cancellation",
    grid_sweep_pdf="output.grid_sweep",
    comparison_csv="output.comparison",
)
bias = pd.read_csv(rtz_bias_csv)
cancel = pd.read_csv(cancellation_csv)
sweep = pd.read_csv(grid_sweep_csv)
paper = reference.load("accumulation_statistics")
paper_bias = paper[paper["table"].str.startswith("rtz_bias")]
paper_sweep = paper[paper["table"].str.startswith("grid_sweep")]
# Our numbers beside the paper's: the paper's bias table is RTZ accumulation of BF16 operands.
comparison = comparisons.accumulation_vs_paper(bias, sweep, paper)
write_csv(comparison_csv, comparison.to_dict("records"), list(comparison.columns))

# %%
# (a) RTZ bias in ppm: magnitude bias with independent operands, gain error with correlated ones. Encoded
# NVFP4 products are short, so their FP32 accumulation is mostly exact and RTZ has little to truncate.
distributions = list(dict.fromkeys(bias["distribution"]))
fig, axes = plt.subplots(1, 2, sharey=True, figsize=(7.0, 3.4))
for ax, metric, title in zip(
    axes, ["magnitude_bias_ppm", "gain_error_ppm"], ["magnitude bias (rho = 0)", "gain error (rho > 0)"], strict=True
):
    positions = dict(zip(distributions, range(len(distributions)), strict=True))
    for i, ((operands, variant), (color, marker)) in enumerate(bias_series.items()):
        table = bias[(bias["metric"] == metric) & (bias["operands"] == operands) & (bias["variant"] == variant)]
        x = [positions[d] + 0.08 * (i - 1.5) for d in table["distribution"]]
        ax.plot(
            x, table["value_ppm"], color=color, marker=marker, linestyle="none", label=f"ours: {operands} {variant}"
        )
    table = paper_bias[paper_bias["metric"] == metric]
    ax.plot(
        [positions[d] for d in table["distribution_or_grid"]],
        table["value"],
        **(paper_vs_ours["paper"] | {"label": "paper: bf16 rtz"}),
    )
    ax.axhline(0.0, color="0.5", linewidth=0.8)
    ax.set_xticks(
        range(len(distributions)), labels=[d.replace("_", " ") for d in distributions], rotation=30, ha="right"
    )
    ax.set_title(title)
axes[0].set_ylabel("ppm")
axes[1].legend(loc="center right")
save_figure(fig, rtz_bias_pdf)

# %%
# (b) Near cancellation: 64 partials (32 and their negatives) plus a residual of standard deviation sigma.
# Top: RMS error of the output against the exact residual (symlog axis, so exact zeros show as 0);
# bottom: share of outputs that are exactly 0. The paper's RTZ RMS at sigma = 2^-12 (grid
# sweep, no snap) is marked.
sigmas = sorted(cancel["sigma"].unique())
scales = sorted(cancel["scale"].unique())
fig, axes = plt.subplots(2, len(scales), sharex=True, figsize=(3.5 * len(scales), 5.0), squeeze=False)
for column, scale in enumerate(scales):
    for row, metric in enumerate(["rmse", "mapped_to_zero_pct"]):
        ax = axes[row, column]
        table = cancel[(cancel["scale"] == scale) & (cancel["metric"] == metric)]
        for variant, group in table.groupby("variant", sort=False):
            x = [sigmas.index(s) for s in group["sigma"]]
            ax.plot(x, group["value"], label=variant, **variant_styles[variant])
        ax.set_title(f"partial scale {format_number(scale)}" if row == 0 else "")
    floor = cancel.loc[(cancel["scale"] == scale) & (cancel["metric"] == "rmse") & (cancel["value"] > 0), "value"].min()
    axes[0, column].set_yscale("symlog", linthresh=floor)
    axes[0, column].set_ylim(bottom=0)
sweep_sigma, sweep_scale = sweep["sigma"].iloc[0], sweep["scale"].iloc[0]
if sweep_sigma in sigmas and sweep_scale in scales:
    none = paper_sweep[(paper_sweep["distribution_or_grid"] == "none") & (paper_sweep["metric"] == "rmse")]
    axes[0, scales.index(sweep_scale)].plot(
        [sigmas.index(sweep_sigma)] * len(none), none["value"], **(paper_vs_ours["paper"] | {"label": "paper: rtz"})
    )
axes[0, 0].set_ylabel("RMS error")
axes[1, 0].set_ylabel("mapped to 0 (%)")
for ax in axes[1]:
    ax.set_xticks(range(len(sigmas)), labels=[format_number(s) for s in sigmas])
    ax.set_xlabel("residual sigma")
axes[1, 0].legend(*axes[0, 0].get_legend_handles_labels(), loc="center left")
save_figure(fig, cancellation_pdf)

# %%
# (c) Final-grid sweep at sigma = 2^-12, partial scale 1: RTZ accumulation snapped to 1/d. Every accumulator
# within half a grid step of 0 becomes exactly 0; 1/1024 zeroes about 95% of these residuals.
grids = list(dict.fromkeys(sweep["grid"]))
fig, axes = plt.subplots(1, 3, figsize=(8.0, 2.9))
for ax, (metric, label) in zip(
    axes,
    {"mapped_to_zero_pct": "mapped to 0 (%)", "signal_gain": "signal gain", "rmse": "RMSE"}.items(),
    strict=True,
):
    table = sweep[sweep["metric"] == metric]
    ax.plot([grids.index(g) for g in table["grid"]], table["value"], **paper_vs_ours["ours"])
    table = paper_sweep[paper_sweep["metric"] == metric]
    ax.plot([grids.index(g) for g in table["distribution_or_grid"]], table["value"], **paper_vs_ours["paper"])
    ax.set_xticks(range(len(grids)), labels=grids, rotation=45)
    ax.set_title(label)
axes[2].set_yscale("log")
axes[0].legend()
save_figure(fig, grid_sweep_pdf)
