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
# Dynamic range of the block-scale formats (paper section 1).
#
# Draws the tables that `ue5m3 range-analysis` writes: (a) the positive codebooks of E4M3 (the NVFP4
# block scale) and UE5M3, (b) the headroom U / T before a stale reference saturates the scales, and
# (c) the worked example: which block amax values stay representable for a tensor reference g.
# Every number on the figures comes from the tables. Runs under Snakemake (`rule range_figures`),
# papermill, nbmake, or by hand from the repository root or `notebooks/`.
import matplotlib.pyplot as plt
import pandas as pd

from ue5m3.plotting import FORMAT_COLORS, format_number, notebook_setup, save_figure

# %% tags=["parameters"]
formats_csv = "results/range_analysis/formats.csv"
codebooks_csv = "results/range_analysis/codebooks.csv"
headroom_csv = "results/range_analysis/headroom.csv"
worked_example_csv = "results/range_analysis/worked_example.csv"
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

# %%
# (a) Positive finite codebooks, one rug per format; the same 3 fraction bits give the same spacing
# inside a binade, UE5M3 just covers many more binades.
fig, axes = plt.subplots(len(codebook_formats), 1, sharex=True, figsize=(6.0, 1.3 * len(codebook_formats) + 0.6))
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
save_figure(fig, codebooks_pdf)

# %%
# (b) Headroom U / T: how far the current amax may outgrow a stale reference before the block scales
# saturate. The targets of the worked example are marked and labelled.
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
save_figure(fig, headroom_pdf)

# %%
# (c) Worked example: for reference g, the block amax values a UE5M3 scale can represent at each target,
# from the smallest nonzero one to saturation; the tick marks a block whose amax equals g and its code.
fig, ax = plt.subplots(figsize=(6.0, 0.8 + 0.7 * len(worked)))
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
save_figure(fig, worked_example_pdf)
