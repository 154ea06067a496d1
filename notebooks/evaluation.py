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
# Validation NLL over checkpoints, percent against BF16, the inference-policy sensitivity and the checkpoint
# scale-target snapshot, beside the paper's 8B numbers from `ue5m3.reference` (never typed in).
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from ue5m3 import reference
from ue5m3.artifacts import write_csv
from ue5m3.evaluation.nll import load_results
from ue5m3.experiments import comparisons
from ue5m3.plotting import OURS_COLOR, PAPER_COLOR, notebook_setup, save_figure

# %% tags=["parameters"]
nll_jsons: list = []  # filled by Snakemake (results/eval/nll/<recipe>/seed<s>/step<n>/<policy>.json)
snapshot_counts: list = []
snapshot_histograms: list = []
nll_pdf = "figures/validation_nll.pdf"
vs_bf16_pdf = "figures/validation_vs_bf16.pdf"
sensitivity_pdf = "figures/policy_sensitivity.pdf"
snapshot_pdf = "figures/scale_snapshot.pdf"
table_csv = "figures/validation_vs_paper.csv"

# %%
notebook_setup(
    globals(),
    nll_jsons="input.nll",
    snapshot_counts="input.snapshot_counts",
    snapshot_histograms="input.snapshot_histograms",
    nll_pdf="output.nll",
    vs_bf16_pdf="output.vs_bf16",
    sensitivity_pdf="output.sensitivity",
    snapshot_pdf="output.snapshot",
    table_csv="output.table",
)
results = load_results(nll_jsons)
reference_nll = reference.load("validation_nll")
# ours: each recipe under its main policy (the sensitivity runs add other policies at the last step only)
ours, paper = comparisons.validation_nll_tables(results, reference_nll)
table = comparisons.validation_vs_paper(results, reference_nll)
write_csv(table_csv, table.to_dict("records"), list(table.columns))
colors = {recipe: f"C{i}" for i, recipe in enumerate(sorted(set(ours["recipe"]) | set(paper["recipe"])))}

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.8))
for recipe, rows in ours.groupby("recipe"):
    left.plot(rows["step"], rows["mean"], "o-", color=colors[recipe], label=recipe, markersize=3)
    left.fill_between(rows["step"], rows["min"], rows["max"], color=colors[recipe], alpha=0.2)
for recipe, rows in paper.groupby("recipe"):
    right.plot(rows["step"], rows["nll"], "s--", color=colors[recipe], label=recipe, markersize=3, alpha=0.8)
left.set(xlabel="step", ylabel="validation NLL", title="ours (CPU scale; band: seeds x orders)")
right.set(xlabel="step", title="paper (8B, one seed)")
left.legend(fontsize=6), right.legend(fontsize=6)
save_figure(fig, nll_pdf)

fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.8), sharey=False)
for recipe, rows in ours[ours["recipe"] != "bf16"].groupby("recipe"):
    left.plot(rows["step"], rows["percent_vs_bf16"], "o-", color=colors[recipe], label=recipe, markersize=3)
for recipe, rows in paper[paper["recipe"] != "bf16"].groupby("recipe"):
    right.plot(rows["step"], rows["percent_vs_bf16"], "s--", color=colors[recipe], label=recipe, markersize=3)
for ax, title in ((left, "ours"), (right, "paper")):
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set(xlabel="step", ylabel="percent vs BF16 (100 (bf16 - x) / bf16)", title=title)
    ax.legend(fontsize=6)
save_figure(fig, vs_bf16_pdf)

# %%
last = results["step"].max()
sensitivity = results[(results["step"] == last) & (results["recipe"] == "ue5m3_b16")]
fig, ax = plt.subplots(figsize=(5, 3.5))
for i, (_policy, rows) in enumerate(sensitivity.groupby("policy")):
    ax.errorbar(
        [i] * len(rows),
        rows["nll"],
        yerr=[rows["nll"] - rows["low"], rows["high"] - rows["nll"]],
        fmt="o",
        color=OURS_COLOR,
        capsize=3,
    )
ax.set_xticks(range(sensitivity["policy"].nunique()), sorted(sensitivity["policy"].unique()), fontsize=7)
ax.set(ylabel="validation NLL", title=f"Proposed B16, step {last}: inference policy (ours, per seed)")
save_figure(fig, sensitivity_pdf)

counts = pd.concat([pd.read_csv(p).assign(source=Path(p).parts[-3]) for p in snapshot_counts])
hists = pd.concat([pd.read_csv(p).assign(source=Path(p).parts[-3]) for p in snapshot_histograms])
fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
for (source, quantity), rows in hists.groupby(["source", "quantity"]):
    if quantity.startswith("raw_code"):
        left.step(rows["bin_low"], rows["count"], where="post", label=f"{source}: {quantity}")
left.set(xlabel="log10 |value|", ylabel="blocks", title="raw scale codes of late down_proj wgrad dY")
left.legend(fontsize=6)
summary = counts.groupby(["source", "target"])[["zero_rounded_before_repair", "saturated", "blocks"]].sum()
right.axis("off")
right.table(
    cellText=summary.reset_index().values,
    colLabels=["run", "T", "zero-rounded", "saturated", "blocks"],
    loc="center",
    fontsize=7,
)
right.set_title("snapshot counts (ours)", color=PAPER_COLOR)
save_figure(fig, snapshot_pdf)
