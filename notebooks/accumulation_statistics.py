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

# %% [markdown]
# # Statistical consequences of the probe-matched FP32 accumulation (paper appendix C)
#
# The probe-matched GEMM model (paper section 6) sums each 64-wide K-slice exactly, rounds it once to FP32 and
# adds the slices with round-toward-zero (RTZ); optionally the output snaps to a 1/d lattice. These figures, drawn
# from the tables `ue5m3 accumulation-stats` writes, show what that does to the numbers, beside the paper's
# appendix-C values (`ue5m3.reference`, never typed in):
#
# - **`accumulation_rtz_bias.pdf`**: RTZ's bias in ppm per operand distribution, the magnitude bias with
#   independent operands and the gain error with correlated ones. Read against the appendix-C bias table (BF16
#   operands, K = 4,096): the paper reports about -1.1 to -1.4 ppm for RTZ and RNE within about 0.004 ppm of
#   zero; our BF16 RTZ points should sit on the paper's hollow markers, RNE on zero. Encoded NVFP4 products are
#   short, so their FP32 accumulation is mostly exact and RTZ has little to truncate.
# - **`accumulation_cancellation.pdf`**: near cancellation (partials that cancel up to a small residual): the RMS
#   error against the exact residual and the share of outputs mapped to exactly 0. Read against the paper's
#   cancellation paragraph: exact cancellation at scale 1 gives RNE about 6.3e-7, RTZ about 5.4e-6 and both
#   gridded variants exactly 0; the paper's RTZ RMS at sigma = $2^{-12}$ is marked.
# - **`accumulation_grid_sweep.pdf`**: the final-grid sweep at sigma = $2^{-12}$, our line over the paper's
#   markers. Any accumulator within half a grid step of 0 becomes exactly 0, so 1/1024 zeroes about 95% of these
#   residuals.
#
# **`accumulation_vs_paper.csv`** puts every reference number beside ours with `difference`, `relative_difference`,
# `tolerance` and `verdict` (reproduced or contradicted). Both sides ran the same experiment (at CPU scale with
# fewer dot products per cell, see each caption), so the tolerances are sampling spreads: 10% for the ppm biases
# (the paper's own gaussian and
# gaussian-sigma-32 rows, one statistic, differ by 3%), 3 percentage points for shares of 4,096 trials, 5% for
# RMS errors, 0.05 for the signal gain. One seed: the results hold no seed spread to draw.

# %%
import json
import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from ue5m3 import reference
from ue5m3.experiments import comparisons
from ue5m3.plotting import (
    OURS_COLOR,
    add_caption,
    format_number,
    notebook_setup,
    paper_vs_ours,
    save_figure,
    save_table,
    scale_caption,
)

# %% tags=["parameters"]
rtz_bias_csv = "results/accumulation/rtz_bias.csv"
cancellation_csv = "results/accumulation/cancellation.csv"
grid_sweep_csv = "results/accumulation/grid_sweep.csv"
provenance_json = "results/accumulation/provenance.json"
rtz_bias_pdf = "figures/accumulation_rtz_bias.pdf"
cancellation_pdf = "figures/accumulation_cancellation.pdf"
grid_sweep_pdf = "figures/accumulation_grid_sweep.pdf"
comparison_csv = "figures/accumulation_vs_paper.csv"
# The paper's setup (appendix C; gemm spec section 4): the captions print ours (from the provenance) beside it.
paper_setup = {"seed": 20260721, "K": 4096, "dots per cell": 4096, "trials": 4096, "slice": 64, "grid": "1/1024"}
# Caption label -> key of our provenance's config.
setup_keys = {
    "seed": "seed",
    "K": "k",
    "dots per cell": "dots",
    "trials": "cancellation_trials",
    "slice": "slice_width",
    "grid": "grid",
}
# Series of our RTZ-bias results: (operands, variant) -> colour and marker.
bias_series = {
    ("bf16", "rtz"): (OURS_COLOR, "o"),
    ("bf16", "rne"): (OURS_COLOR, "x"),
    ("nvfp4_dequantized", "rtz"): ("#ff7f0e", "s"),
    ("nvfp4", "rtz"): ("#d62728", "D"),
}
operand_names = {"bf16": "BF16", "nvfp4": "NVFP4", "nvfp4_dequantized": "NVFP4 dequantized"}
# Style per accumulation variant. The gridded variants coincide wherever the snap decides the output, so they
# differ in marker fill and size as well as line style, and each variant is shifted a little along x.
variant_styles = {
    "rne": {"color": "#1f77b4", "marker": "o", "linestyle": "-", "markersize": 4},
    "rtz": {"color": "#d62728", "marker": "s", "linestyle": "-", "markersize": 4},
    "rne_grid": {"color": "#2ca02c", "marker": "^", "linestyle": "--", "markersize": 7, "markerfacecolor": "none"},
    "rtz_grid": {"color": "#9467bd", "marker": "v", "linestyle": ":", "markersize": 4},
}
variant_shift = {"rne": -0.12, "rtz": -0.04, "rne_grid": 0.04, "rtz_grid": 0.12}

# %%
notebook_setup(
    globals(),
    rtz_bias_csv="input.rtz_bias",
    cancellation_csv="input.cancellation",
    grid_sweep_csv="input.grid_sweep",
    provenance_json="input.provenance",
    rtz_bias_pdf="output.rtz_bias",
    cancellation_pdf="output.cancellation",
    grid_sweep_pdf="output.grid_sweep",
    comparison_csv="output.comparison",
)
bias = pd.read_csv(rtz_bias_csv)
cancel = pd.read_csv(cancellation_csv)
sweep = pd.read_csv(grid_sweep_csv)
settings = json.loads(Path(provenance_json).read_text())["config"]
paper = reference.load("accumulation_statistics")
paper_bias = paper[paper["table"].str.startswith("rtz_bias")]
paper_sweep = paper[paper["table"].str.startswith("grid_sweep")]
# Our numbers beside the paper's, with the agreement columns: the paper's bias table is RTZ accumulation of BF16
# operands.
comparison = comparisons.accumulation_vs_paper(bias, sweep, paper)
save_table(comparison_csv, comparison, list(comparison.columns))
ours_setup = {label: settings[key] for label, key in setup_keys.items()}
setup = scale_caption(ours_setup | {"grid": f"1/{ours_setup['grid']}"}, paper_setup)
agreed = int((comparison["verdict"] == "reproduced").sum())
judged = int(comparison["verdict"].notna().sum())
print(f"{agreed} of {judged} reference numbers reproduced within their tolerance")

# %% [markdown]
# ## (a) RTZ bias
#
# Left: magnitude bias with independent operands; right: gain error with correlated ones (rho from the settings).
# Filled markers are ours, hollow black ones the paper's BF16 RTZ values; the legend sits below the panels so that
# it hides no point.

# %%
distributions = list(dict.fromkeys(bias["distribution"]))
positions = dict(zip(distributions, range(len(distributions)), strict=True))
fig, axes = plt.subplots(1, 2, sharey=True, figsize=(7.0, 4.1))
titles = ["magnitude bias (rho = 0)", f"gain error (rho = {settings['gain_rho']:g})"]
for ax, metric, title in zip(axes, ["magnitude_bias_ppm", "gain_error_ppm"], titles, strict=True):
    for i, ((operands, variant), (color, marker)) in enumerate(bias_series.items()):
        table = bias[(bias["metric"] == metric) & (bias["operands"] == operands) & (bias["variant"] == variant)]
        x = [positions[d] + 0.08 * (i - 1.5) for d in table["distribution"]]
        ax.plot(
            x,
            table["value_ppm"],
            color=color,
            marker=marker,
            linestyle="none",
            label=f"ours: {operand_names[operands]} {variant.upper()}",
        )
    table = paper_bias[paper_bias["metric"] == metric]
    ax.plot(
        [positions[d] for d in table["distribution_or_grid"]],
        table["value"],
        **(paper_vs_ours["paper"] | {"label": "paper: BF16 RTZ"}),
    )
    ax.axhline(0.0, color="0.5", linewidth=0.8)
    ax.set_xticks(
        range(len(distributions)), labels=[d.replace("_", " ") for d in distributions], rotation=30, ha="right"
    )
    ax.set_title(title)
axes[0].set_ylabel("ppm")
fig.legend(*axes[0].get_legend_handles_labels(), loc="outside upper center", ncols=5, fontsize=7)
add_caption(
    fig,
    f"{setup}\nOne seed; per cell {settings['dots']:,} dot products of K = {settings['k']:,}, exact "
    f"{settings['slice_width']}-wide slices rounded once to FP32. Paper: appendix C, bias table.",
)
save_figure(fig, rtz_bias_pdf)

# %% [markdown]
# ## (b) Near cancellation
#
# Partials that cancel exactly plus a residual of standard deviation sigma added to the last one. Top: RMS error
# of the output against the exact residual, on a symmetric-log axis whose linear part ends one decade below the
# smallest nonzero error, so that an exact 0 has a tick of its own; bottom: share of outputs that are exactly 0.
# The gridded variants coincide wherever the snap decides (shifted apart along x; the hollow triangles are
# `rne_grid`). The paper's RTZ RMS at sigma = $2^{-12}$, scale 1 (its grid sweep, no snap) is the hollow circle.

# %%
sigmas = sorted(cancel["sigma"].unique())
scales = sorted(cancel["scale"].unique())
fig, axes = plt.subplots(2, len(scales), sharex=True, figsize=(3.6 * len(scales), 5.6), squeeze=False)
for column, scale in enumerate(scales):
    for row, metric in enumerate(["rmse", "mapped_to_zero_pct"]):
        ax = axes[row, column]
        table = cancel[(cancel["scale"] == scale) & (cancel["metric"] == metric)]
        for variant, group in table.groupby("variant", sort=False):
            x = [sigmas.index(s) + variant_shift[variant] for s in group["sigma"]]
            ax.plot(x, group["value"], label=variant, **variant_styles[variant])
        ax.set_title(f"partial scale {format_number(scale)}" if row == 0 else "")
    rmse = cancel[(cancel["scale"] == scale) & (cancel["metric"] == "rmse")]["value"]
    low = math.floor(math.log10(rmse[rmse > 0].min())) - 1  # the linear part: a decade below the smallest error
    high = math.floor(math.log10(rmse.max())) + 1
    axes[0, column].set_yscale("symlog", linthresh=10.0**low, linscale=0.5)
    exponents = range(low + 1, high + 1)
    axes[0, column].set_yticks([0.0, *(10.0**e for e in exponents)], ["0", *(f"$10^{{{e}}}$" for e in exponents)])
    axes[0, column].set_ylim(-(10.0**low) / 4, 10.0**high)
sweep_sigma, sweep_scale = sweep["sigma"].iloc[0], sweep["scale"].iloc[0]
if sweep_sigma in sigmas and sweep_scale in scales:
    none = paper_sweep[(paper_sweep["distribution_or_grid"] == "none") & (paper_sweep["metric"] == "rmse")]
    axes[0, scales.index(sweep_scale)].plot(
        [sigmas.index(sweep_sigma) + variant_shift["rtz"]] * len(none),
        none["value"],
        **(paper_vs_ours["paper"] | {"label": "paper: rtz", "markersize": 8}),
    )
axes[0, 0].set_ylabel("RMS error")
axes[1, 0].set_ylabel("mapped to 0 (%)")
for ax in axes[1]:
    ax.set_xticks(range(len(sigmas)), labels=[format_number(s) for s in sigmas])
    ax.set_xlabel("residual sigma")
fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="outside upper center", ncols=5, fontsize=7)
add_caption(
    fig,
    f"{setup}\nOne seed; {settings['cancellation_trials']:,} trials of {settings['cancellation_partials']} partials "
    f"per point, grid 1/{settings['grid']}. Paper: appendix C, near cancellation.",
)
save_figure(fig, cancellation_pdf)

# %% [markdown]
# ## (c) Final-grid sweep
#
# RTZ accumulation snapped to 1/d at sigma = $2^{-12}$, partial scale 1: share mapped to 0, the signal gain (how much
# of the residual survives) and the RMS error, our line over the paper's hollow markers. `accumulation_vs_paper.csv`
# holds the agreement verdict of each point.

# %%
grids = list(dict.fromkeys(sweep["grid"]))
fig, axes = plt.subplots(1, 3, figsize=(8.0, 3.3))
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
add_caption(
    fig,
    f"{setup}\nOne seed; sigma = {format_number(settings['sweep_sigma'])}, partial scale "
    f"{format_number(settings['sweep_scale'])}, {settings['cancellation_trials']:,} trials; {agreed} of "
    f"{judged} appendix-C numbers reproduced within tolerance (accumulation_vs_paper.csv).",
)
save_figure(fig, grid_sweep_pdf)
