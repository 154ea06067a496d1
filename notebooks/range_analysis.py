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
# # Dynamic range of the block-scale formats (paper sections 4.1 and 5.2)
#
# What the figures show, all computed from the format definitions by `ue5m3 range-analysis` (analytic: no
# sampling, so there is no seed spread and no CPU-scale shortcut; the numbers are the paper's own quantities):
#
# - **`range_codebooks.pdf`**: every positive finite value of E4M3 (NVFP4's block scale) and of UE5M3 on one log
#   axis. Read against section 4.1: both have three fraction bits, so the spacing within a binade is the same;
#   UE5M3's largest value is about 137x E4M3's (61,440 vs 448) and its smallest subnormal 256x smaller
#   ($2^{-17}$ vs $2^{-9}$).
# - **`range_headroom.pdf`**: the headroom U / T, how far a tensor's amax may outgrow a stale reference before the
#   block scales saturate, against the target T. Read against section 5.2: about 137x at T = 448 and 30x at
#   T = 2048 (61,440 / 2,048) for UE5M3, and none at T = 448 for E4M3.
# - **`range_worked_example.pdf`**: for a tensor reference g, the block amax values UE5M3 scales can represent at
#   each example target, from the smallest nonzero one to saturation. Read against section 5.2: T = 2048 moves
#   the smallest representable block about 4.6x (2,048 / 448) closer to zero at the cost of headroom.
#
# Each figure's caption states the settings read from the tables' provenance. The figures stand on their own;
# there is no `*_vs_paper.csv` table because the paper's numbers here are exact consequences of the formats.

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from ue5m3.plotting import FORMAT_COLORS, add_caption, format_number, notebook_setup, save_figure

# %% tags=["parameters"]
formats_csv = "results/range_analysis/formats.csv"
codebooks_csv = "results/range_analysis/codebooks.csv"
headroom_csv = "results/range_analysis/headroom.csv"
worked_example_csv = "results/range_analysis/worked_example.csv"
provenance_json = "results/range_analysis/provenance.json"
codebooks_pdf = "figures/range_codebooks.pdf"
headroom_pdf = "figures/range_headroom.pdf"
worked_example_pdf = "figures/range_worked_example.pdf"
codebook_formats = ["E4M3", "UE5M3"]

# %%
notebook_setup(
    globals(),
    formats_csv="input.formats",
    codebooks_csv="input.codebooks",
    headroom_csv="input.headroom",
    worked_example_csv="input.worked_example",
    provenance_json="input.provenance",
    codebooks_pdf="output.codebooks",
    headroom_pdf="output.headroom",
    worked_example_pdf="output.worked_example",
)
# The library spells format names in lower case (`ue5m3`); the figures use the paper's spelling.
formats = pd.read_csv(formats_csv)
formats = formats.set_index(formats["name"].str.upper())
codebooks = pd.read_csv(codebooks_csv)
codebooks["format"] = codebooks["format"].str.upper()
headroom = pd.read_csv(headroom_csv)
headroom["scale_format"] = headroom["scale_format"].str.upper()
worked = pd.read_csv(worked_example_csv).sort_values("target")
settings = json.loads(Path(provenance_json).read_text())["config"]
analytic = "Analytic (format definitions only, identical at CPU and paper scale), from ue5m3 range-analysis"

# %% [markdown]
# ## (a) Codebooks
#
# One rug per format: each line is a positive finite code. The annotated ends are the smallest subnormal and the
# largest finite value, the two numbers section 4.1 compares.

# %%
fig, axes = plt.subplots(len(codebook_formats), 1, sharex=True, figsize=(6.0, 1.3 * len(codebook_formats) + 0.9))
for ax, name in zip(axes, codebook_formats, strict=True):
    info = formats.loc[name]
    values = codebooks.loc[(codebooks["format"] == name) & (codebooks["value"] > 0), "value"]
    ax.vlines(values, 0, 1, color=FORMAT_COLORS[name], linewidth=0.5)
    for key, label, align in (("min_subnormal", "min subnormal", "left"), ("max_finite", "max", "right")):
        if pd.notna(info[key]):
            ax.annotate(
                f"{label} {format_number(info[key])}",
                (info[key], 1.0),
                xytext=(0, 3),
                textcoords="offset points",
                ha=align,
                va="bottom",
            )
    ax.set(xscale="log", ylim=(0, 1.5), yticks=[])
    ax.grid(False)
    ax.set_title(f"{name}: {info['positive_finite_codes']} positive finite codes", loc="left")
axes[-1].set_xlabel("positive finite value")
add_caption(fig, f"{analytic}. Compare paper section 4.1: max ratio and smallest-subnormal ratio of the two formats.")
save_figure(fig, codebooks_pdf)

# %% [markdown]
# ## (b) Headroom against the target
#
# A stale reference saturates the block scales once the current amax exceeds U / T times it; the dashed lines mark
# the worked example's targets, labelled with their headroom. Below the dotted line (U / T < 1) a format cannot
# even hold the current amax at that target.

# %%
fig, ax = plt.subplots()
for name, table in headroom.sort_values("target").groupby("scale_format"):
    ax.plot(table["target"], table["headroom"], marker="o", color=FORMAT_COLORS[name], label=name)
for target in worked["target"].unique():
    ax.axvline(target, color="0.6", linestyle="--", linewidth=0.8)
    for row in headroom[headroom["target"] == target].itertuples():
        ax.annotate(
            f"{row.headroom:.5g}×",
            (row.target, row.headroom),
            xytext=(4, 4),
            textcoords="offset points",
            color=FORMAT_COLORS[row.scale_format],
        )
ax.axhline(1.0, color="0.4", linestyle=":", linewidth=1.0, label="no headroom")
targets = sorted(headroom["target"].unique())
ax.set(xscale="log", yscale="log", xlabel="target T", ylabel="headroom U / T")
ax.set_xticks(targets, labels=[format_number(t) for t in targets])
ax.minorticks_off()
ax.legend()
listed = ", ".join(format_number(t) for t in settings["targets"])
add_caption(fig, f"{analytic}; targets T = {listed}. Paper section 5.2: about 137× at T = 448, 30× at T = 2048.")
save_figure(fig, headroom_pdf)

# %% [markdown]
# ## (c) Worked example
#
# For reference g, the band is the range of nonzero block amax values a UE5M3 scale represents at each target;
# the tick marks a block whose amax equals g, labelled with its scale code. Raising T slides the band towards
# zero: smaller blocks stay representable, the saturation point comes closer.

# %%
fig, ax = plt.subplots(figsize=(6.0, 1.1 + 0.7 * len(worked)))
for i, row in enumerate(worked.itertuples()):
    ax.hlines(
        i,
        row.smallest_block_amax,
        row.largest_block_amax,
        color=FORMAT_COLORS["UE5M3"],
        linewidth=8,
        alpha=0.35,
    )
    ax.plot(row.reference_amax, i, marker="|", markersize=12, color="black")
    ax.annotate(
        f"g = {format_number(row.reference_amax)}: code {format_number(row.code_at_reference)}",
        (row.reference_amax, i),
        xytext=(0, 11),
        textcoords="offset points",
        ha="center",
    )
    ax.annotate(
        format_number(row.smallest_block_amax),
        (row.smallest_block_amax, i),
        xytext=(0, -10),
        textcoords="offset points",
        ha="left",
        va="top",
    )
    ax.annotate(
        f"{format_number(row.largest_block_amax)} ({row.headroom:.5g}× g)",
        (row.largest_block_amax, i),
        xytext=(0, -10),
        textcoords="offset points",
        ha="right",
        va="top",
    )
ax.set(xscale="log", xlabel="nonzero block amax representable with UE5M3 scales", ylim=(-0.8, len(worked) - 0.2))
ax.set_yticks(range(len(worked)), labels=[f"T = {format_number(t)}" for t in worked["target"]])
ax.grid(axis="y", visible=False)
example = ", ".join(format_number(t) for t in settings["example_targets"])
add_caption(fig, f"{analytic}; g = {format_number(settings['example_reference'])} at T = {example}.")
save_figure(fig, worked_example_pdf)
