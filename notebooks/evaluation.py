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
# # Held-out evaluation: validation NLL, the inference-policy sensitivity and the checkpoint scale snapshot
#
# Drawn from the records `ue5m3 evaluate-nll` and `ue5m3 scale-snapshot` write, beside the paper's numbers from
# `ue5m3.reference` (never typed in). Our checkpoints come from CPU-scale runs (the captions state the settings
# read from the records), the paper's from Nemotron-H 8B runs with one seed, so the comparable quantity is **each
# recipe's NLL against BF16's run of the same seed** at the same point of training, judged against the paper's
# difference: reproduced, contradicted or inconclusive (`ue5m3.experiments.paired`). The figures show the percent
# against BF16, `100 (BF16 - x) / BF16` (positive: better than BF16).
#
# - **`validation_nll.pdf`**: NLL per checkpoint and recipe under each recipe's inference policy (cold D = 50
#   replay for the UE5M3 recipes, current scaling for NVFP4; experiments spec section 4). Ours: the mean over
#   seeds, the band the seed range, the error bars each evaluation's own interval (the range over evaluation
#   orders for the order-dependent replay, a bootstrap 95% interval otherwise). Paper: section 7.4 (at step 30,000
#   proposed B16 2.32230 against TE NVFP4 2.32592).
# - **`validation_vs_bf16.pdf`**: the percent against BF16 over the fraction of training, so that our short run and
#   the paper's 30,000 steps line up; ours with the range over seeds (each seed against BF16's run of that seed).
# - **`policy_sensitivity.pdf`**: the proposed recipe's NLL at the last checkpoint under each other inference
#   policy minus its NLL under the policy the paper used (cold D = 50 replay), paired per seed, with its interval
#   and the equivalence margin (the paper's headline gap between B16 and TE NVFP4). Read against the paper's
#   inference appendix: its three policies differ by at most 8.99e-5 NLL at step 30,000.
# - **`scale_snapshot.pdf`**: where the wgrad dY block scales of the late MLP down projections land in UE5M3 for
#   T = 448 and 2048 (section 5.3), and the counts of zero-rounded and saturated codes beside the paper's (none for
#   either target). One sequence at one checkpoint: it illustrates codebook placement, not the D = 50 history.
#
# Tables: **`validation_vs_paper.csv`** (checkpoints paired by fraction of training) and
# **`policy_sensitivity_vs_paper.csv`** with the paired effect (`effect`, `interval_low`, `interval_high`, `mde`),
# the paper's effect and the `verdict`; **`scale_snapshot_vs_paper.csv`** with `difference`, `tolerance` and
# `verdict` (the counts must equal the paper's).

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ue5m3 import reference, stages
from ue5m3.evaluation.nll_records import load_results
from ue5m3.experiments import comparisons
from ue5m3.numerics.formats import UE5M3
from ue5m3.plotting import (
    OURS_COLOR,
    PAPER_COLOR,
    add_caption,
    format_number,
    notebook_setup,
    save_figure,
    save_table,
    scale_caption,
)

# %% tags=["parameters"]
nll_jsons = "results/eval/nll/*/seed*/step*/*.json"  # a glob: every validation-NLL result
snapshot_counts = "results/eval/snapshot/*/seed*/counts.csv"  # every snapshot
snapshot_histograms = "results/eval/snapshot/*/seed*/histograms.csv"  # the same snapshots, same order
nll_pdf = "figures/validation_nll.pdf"
vs_bf16_pdf = "figures/validation_vs_bf16.pdf"
sensitivity_pdf = "figures/policy_sensitivity.pdf"
snapshot_pdf = "figures/scale_snapshot.pdf"
table_csv = "figures/validation_vs_paper.csv"
sensitivity_csv = "figures/policy_sensitivity_vs_paper.csv"
snapshot_csv = "figures/scale_snapshot_vs_paper.csv"
# The paper's evaluation (experiments spec sections 4 and 7), in the captions' terms.
paper_setup = {
    "model": "nemotron_h_8b",
    "sequences": 768,
    "tokens each": 8192,
    "last checkpoint": 30000,
    "seeds": [42],
    "replay orders": 1,
}
paper_snapshot_setup = {"checkpoints": ["bf16", "ue5m3_b16"], "modules": 4, "targets": [448.0, 2048.0]}
baseline_recipe = "nvfp4_te"  # the dashed reference of the policy sensitivity (the paper compares with it)
clip_percent = -12.0  # lower limit of the paper's percent-vs-BF16 panel; points below it are named in the caption

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
    sensitivity_csv="output.sensitivity_table",
    snapshot_csv="output.snapshot_table",
)
results = load_results(nll_jsons)
reference_nll = reference.load("validation_nll")
# ours: each recipe under its main policy (the sensitivity runs add other policies at the last step only)
ours, paper = comparisons.validation_nll_tables(results, reference_nll)
table = comparisons.validation_vs_paper(results, reference_nll)
save_table(table_csv, table, list(table.columns))
# the sensitivity recipe is the one evaluated under several policies
sensitivity_recipe = results.groupby("recipe")["policy"].nunique().idxmax()
sensitivity = comparisons.policy_sensitivity_vs_paper(results, reference_nll, recipe=sensitivity_recipe)
save_table(sensitivity_csv, sensitivity, list(sensitivity.columns))
counts = pd.concat([pd.read_csv(p).assign(recipe=Path(p).parts[-3]) for p in snapshot_counts], ignore_index=True)
snapshot = comparisons.scale_snapshot_vs_paper(counts, reference.load("scale_snapshot"))
save_table(snapshot_csv, snapshot, list(snapshot.columns))
colors = {recipe: f"C{i}" for i, recipe in enumerate(sorted(set(ours["recipe"]) | set(paper["recipe"])))}
record = json.loads(Path(nll_jsons[0]).read_text())
setup = scale_caption(
    {
        "model": record["model"],
        "sequences": record["sequences"],
        "tokens each": record["tokens"] // record["sequences"],
        "last checkpoint": int(results["step"].max()),
        "seeds": sorted(results["seed"].unique().tolist()),
        "replay orders": int(results["orders"].max()),
    },
    paper_setup,
)

# %% [markdown]
# ## (a) Validation NLL and (b) percent against BF16
#
# (a) Left ours, right the paper's; the two y-axes differ (a CPU-scale model is far from an 8B one). (b) Both
# sides over the fraction of training; `validation_vs_paper.csv` pairs the checkpoints at equal fractions and
# states the verdict of each.

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4.3))
for recipe, rows in ours.groupby("recipe"):
    style = {"color": colors[recipe], "label": stages.label(recipe), "markersize": 3}
    left.fill_between(rows["step"], rows["min"], rows["max"], color=colors[recipe], alpha=0.2)
    interval = [rows["mean"] - rows["low"], rows["high"] - rows["mean"]]
    left.errorbar(rows["step"], rows["mean"], yerr=interval, fmt="o-", elinewidth=0.6, capsize=1.5, **style)
for recipe, rows in paper.groupby("recipe"):
    right.plot(
        rows["step"], rows["nll"], "s--", color=colors[recipe], label=stages.label(recipe), markersize=3, alpha=0.8
    )
left.set(xlabel="step", ylabel="validation NLL", title="ours (band: seed range; bars: orders or bootstrap 95%)")
right.set(xlabel="step", title="paper (8B, one seed)")
left.title.set_fontsize(8)
left.legend(fontsize=6), right.legend(fontsize=6)
add_caption(fig, setup + "\nPaper: section 7.4 and its validation figure; each recipe's policy: experiments spec 4.")
save_figure(fig, nll_pdf)

fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4.3))
for frame in (ours, paper):
    frame["training_fraction"] = frame["step"] / frame["step"].max()
for recipe, rows in ours[ours["recipe"] != "bf16"].groupby("recipe"):
    style = {"color": colors[recipe], "label": stages.label(recipe), "markersize": 3}
    left.fill_between(rows["training_fraction"], rows["percent_vs_bf16_min"], rows["percent_vs_bf16_max"], **{
        "color": colors[recipe], "alpha": 0.2})  # fmt: skip
    left.plot(rows["training_fraction"], rows["percent_vs_bf16"], "o-", **style)
for recipe, rows in paper[paper["recipe"] != "bf16"].groupby("recipe"):
    right.plot(rows["training_fraction"], rows["percent_vs_bf16"], "s--", color=colors[recipe], markersize=3, **{
        "label": stages.label(recipe)})  # fmt: skip
for ax, title in ((left, "ours (band: seed range, each seed against its BF16 run)"), (right, "paper (8B, one seed)")):
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set(xlabel="fraction of training", ylabel="percent vs BF16 (100 (BF16 − x) / BF16)", title=title)
    ax.title.set_fontsize(8)
    ax.legend(fontsize=6)
right.set_ylim(max(paper["percent_vs_bf16"].min(), clip_percent) - 0.5, max(paper["percent_vs_bf16"].max(), 0) + 0.5)
off_scale = paper[paper["percent_vs_bf16"] < clip_percent].itertuples()
note = "".join(
    f" Paper: {stages.label(r.recipe)} at step {r.step:,} ({r.percent_vs_bf16:.0f}%) is off scale." for r in off_scale
)
tally = ", ".join(f"{n} {v}" for v, n in table["verdict"].value_counts().items())
add_caption(
    fig, f"{setup}\nPaired verdicts of the NLL against BF16 per checkpoint: {tally} (validation_vs_paper.csv).{note}"
)
save_figure(fig, vs_bf16_pdf)

# %% [markdown]
# ## (c) Inference-policy sensitivity
#
# The proposed recipe's percent against BF16 at our last checkpoint under each policy: ours as the mean over seeds
# (thick bar: seed range; thin line: the widest single evaluation's interval), the paper's as a hollow marker at
# the policy it evaluated with. The dashed lines are TE NVFP4 at the same checkpoint on each side: the paper's
# finding is that every policy stays above it (a lower NLL).

# %%
fig, ax = plt.subplots(figsize=(7.2, 4.3))
x = np.arange(len(sensitivity))
effect = sensitivity["effect"].astype(float)
err = [
    (effect - sensitivity["interval_low"].astype(float)).fillna(0),
    (sensitivity["interval_high"].astype(float) - effect).fillna(0),
]
ax.errorbar(x, effect, yerr=err, fmt="o", color=OURS_COLOR, capsize=4, label="ours: mean paired difference (95% t)")
margin = float(sensitivity["margin"].iloc[0]) if len(sensitivity) else 0.0
ax.axhspan(-margin, margin, color="0.85", label="equivalence margin (the paper's B16 − TE NVFP4 gap)")
spread = float(reference.load("inference_policy_spread")["value"].iloc[0])
ax.axhspan(-spread, spread, color=PAPER_COLOR, alpha=0.6, label="paper: largest difference between its policies")
ax.axhline(0, color="black", linewidth=0.6)
reference_policy = sensitivity["reference_policy"].iloc[0] if len(sensitivity) else "cold_d50_replay"
ax.set_xticks(x, [f"{p}\n{v}" for p, v in zip(sensitivity["policy"], sensitivity["verdict"], strict=True)], fontsize=7)
ax.set_xlim(-0.5, len(sensitivity) - 0.5)
ax.set(
    ylabel=f"NLL − NLL under {reference_policy}",
    title=f"{stages.label(sensitivity_recipe)}: inference policy, last step",
)
ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.0, 0.5))  # beside the axes: it hides no point
add_caption(
    fig,
    f"{setup}\nPaired per seed at our last checkpoint; each policy's verdict is under its name "
    "(policy_sensitivity_vs_paper.csv).",
)
save_figure(fig, sensitivity_pdf)

# %% [markdown]
# ## (d) Checkpoint scale snapshot
#
# Left: the raw UE5M3 scale codes u = a_B T / g of the captured wgrad dY^T blocks (summed over the captured
# modules), one curve per checkpoint and target; the dotted lines are UE5M3's smallest subnormal and largest
# finite value, so codes left of the first would round to zero and right of the second saturate. Right: the counts
# beside the paper's (section 5.3: none zero-rounded before repair and none saturated for either target).

# %%
hists = pd.concat([pd.read_csv(p).assign(recipe=Path(p).parts[-3]) for p in snapshot_histograms], ignore_index=True)
codes = hists[hists["quantity"].str.startswith("raw_code")]
codes = codes.groupby(["recipe", "quantity", "bin_low"], sort=False)["count"].sum().reset_index()
fig, (left, right) = plt.subplots(1, 2, figsize=(9.5, 4.1), width_ratios=[1.1, 1])
for (recipe, quantity), rows in codes.groupby(["recipe", "quantity"], sort=False):
    target = quantity.removeprefix("raw_code_t")
    left.step(rows["bin_low"], rows["count"], where="post", label=f"{stages.label(recipe)}, T = {target}")
bounds = [np.log10(UE5M3.min_subnormal), np.log10(UE5M3.max_finite)]
for bound, name in zip(bounds, ["min subnormal", "max finite"], strict=True):
    left.axvline(bound, color="0.4", linestyle=":", linewidth=1.0)
    left.annotate(
        f"UE5M3 {name}",
        (bound, 1.0),
        xycoords=("data", "axes fraction"),
        rotation=90,
        ha="right",
        va="top",
        fontsize=6,
        color="0.3",
    )
nonzero = codes[codes["count"] > 0]["bin_low"]
left.set_xlim(min(nonzero.min(), bounds[0]) - 0.5, max(nonzero.max(), bounds[1]) + 0.5)
left.set(xlabel="log10 raw scale code", ylabel="blocks", title="raw scale codes of the late down_proj wgrad dY")
left.title.set_fontsize(8)
left.legend(fontsize=6, loc="center left")
compared = snapshot[snapshot["metric"].isin(["zero_rounded_before_repair", "saturated"])]
cells = []
for (recipe, target), rows in compared.groupby(["recipe", "target"], sort=False):
    by_metric = rows.set_index("metric")
    cell = [stages.label(recipe), format_number(target), f"{int(rows['blocks'].iloc[0]):,}"]
    for metric in ("zero_rounded_before_repair", "saturated"):
        paper_value = by_metric.loc[metric, "paper"]
        cell.append(f"{by_metric.loc[metric, 'ours']} / {'-' if pd.isna(paper_value) else paper_value}")
    verdicts = set(rows["verdict"].dropna())
    cell.append("-" if not verdicts else "reproduced" if verdicts == {"reproduced"} else ", ".join(sorted(verdicts)))
    cells.append(cell)
right.axis("off")
grid = right.table(
    cellText=cells,
    colLabels=["checkpoint", "T", "blocks", "zero-rounded\nours / paper", "saturated\nours / paper", "verdict"],
    loc="center",
    cellLoc="center",
)
grid.auto_set_font_size(False)
grid.set_fontsize(7)
grid.scale(1.0, 1.6)
right.set_title("snapshot counts beside the paper's (section 5.3)", fontsize=8)
snapshot_settings = {
    "checkpoints": list(dict.fromkeys(counts["recipe"])),
    "modules": int(counts["module"].nunique()),
    "targets": sorted(counts["target"].unique().tolist()),
}
add_caption(
    fig,
    scale_caption(snapshot_settings, paper_snapshot_setup)
    + "\nOne held-out sequence, one training-mode forward and backward at the last checkpoint, no update "
    "(scale_snapshot_vs_paper.csv).",
)
save_figure(fig, snapshot_pdf)
