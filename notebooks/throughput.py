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
# # The throughput ablation (paper table 10; experiments spec section 6)
#
# `ue5m3 throughput` times the model body (every block and the final norm; no data loading, embedding, head,
# optimizer or communication) for synchronised forward + backward steps at batch 1: the BF16 body first, then the TE
# recipe (`nvfp4_te`: RHT on the wgrad operands, the final 8 layers in BF16, 96 FP4 + 16 BF16 linears at 8B) and the
# no-RHT/all-linears ablation (`nvfp4_no_rht_all_linears`: 112 + 0), once per configured run. The paper timed the
# two recipes natively on one GB200: 3,212.39 and 3,893.87 tokens/s, +21.2%.
#
# - **`throughput_ablation.pdf`**, left: tokens/s per recipe in each of our runs (labelled with the execution path,
#   device and model) beside the paper's native numbers (hatched), on a log axis. Right: the ablation's speed-up
#   over the TE recipe within each run. Read it against table 10 only for a native run (Transformer Engine on a
#   Blackwell GPU, `config/paper.yaml`); an emulated run, such as the default CPU-scale one (the 8B block pattern at
#   debug width, so the same linears are FP4 and BF16), times the software emulation, whose cost says nothing about
#   the native kernels' speed.
# - **`throughput_vs_paper.csv`**: each of our rows (tokens/s, time per 100 steps, ratio to BF16, speed-up over the
#   TE recipe, linear counts) beside the paper's row of the same recipe, with `difference`, `relative_difference`,
#   `tolerance` and `verdict` for the speed-up of native runs (within 10%; an emulated run times the emulation, so
#   its rows of the native claim are `not run`).

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.patches import Patch

from ue5m3 import reference, stages
from ue5m3.experiments import comparisons
from ue5m3.plotting import (
    PAPER_COLOR,
    add_caption,
    format_number,
    notebook_setup,
    save_figure,
    save_table,
    scale_caption,
)

# %% tags=["parameters"]
tables = "results/throughput/*/throughput.csv"  # a glob: every throughput run
provenances = "results/throughput/*/provenance.json"  # the same runs, same order
figure_pdf = "figures/throughput_ablation.pdf"
table_csv = "figures/throughput_vs_paper.csv"
# Bar colour per recipe (the paper's bars: the same colours, hatched).
recipe_colors = {"bf16": "0.6", "nvfp4_te": "#ff7f0e", "nvfp4_no_rht_all_linears": "#d62728"}
# The paper's protocol (experiments spec section 6), in the provenance's keys.
paper_setup = {"model": "nemotron_h_8b", "batch_size": 1, "sequence_length": 1024, "measured_steps": 100}

# %%
notebook_setup(
    globals(),
    tables="input.tables",
    provenances="input.provenances",
    figure_pdf="output.figure",
    table_csv="output.table",
)
ours = pd.concat([pd.read_csv(path) for path in tables], ignore_index=True)
table = comparisons.throughput_vs_paper(ours, reference.load("throughput_ablation"))
save_table(table_csv, table, list(table.columns))
print(table.drop(columns="tolerance").to_string(index=False))
settings = [json.loads(Path(path).read_text())["config"] for path in provenances]
setups = [
    f"{s['run']} ({s['execution']} on {s['device']}): " + scale_caption({k: s[k] for k in paper_setup}, paper_setup)
    for s in settings
]

# %% [markdown]
# ## Tokens/s per recipe and the no-RHT/all-linears speed-up
#
# Left, log axis: CPU-scale emulation and native Blackwell differ by orders of magnitude. Right: tokens/s of the
# ablation over the TE recipe's, measured within each run (1 = as fast); the paper's bar is +21.2%.

# %%
paper = table.drop_duplicates("recipe").dropna(subset=["paper_tokens_per_s"])
sources = [("paper: native TE\nNemotron-H 8B, one GB200", paper, "paper_tokens_per_s", "paper_speedup_vs_nvfp4_te")]
for run, group in table.groupby("run", sort=False):
    first, last = group.iloc[0], group.iloc[-1]  # the BF16 baseline first, a recipe of the run's execution last
    linears = int(first["fp4_linears"] + first["bf16_linears"])
    where = f"{last['execution']} on {first['device']}\n{first['device_name']}"
    label = f"ours ({run}): {where}\n{first['model']}, {linears} linears"
    sources.append((label, group, "tokens_per_s", "speedup_vs_nvfp4_te"))
fig, (left, right) = plt.subplots(1, 2, figsize=(9.0, 3.8), width_ratios=[3, 2])
edges = {"edgecolor": "black", "linewidth": 0.5}
width = 0.8 / len(recipe_colors)
for i, (_, rows, value, speedup) in enumerate(sources):
    hatch = "//" if i == 0 else None
    for j, (recipe, color) in enumerate(recipe_colors.items()):
        found = rows[rows["recipe"] == recipe]
        if found.empty:
            continue
        x, y = i + (j - (len(recipe_colors) - 1) / 2) * width, float(found[value].iloc[0])
        left.bar(x, y, width=width, color=color, hatch=hatch, **edges)
        left.annotate(format_number(y), (x, y), ha="center", va="bottom", fontsize=6)
    found = rows[rows["recipe"] == "nvfp4_no_rht_all_linears"].dropna(subset=[speedup])
    if not found.empty:
        y = float(found[speedup].iloc[0])
        right.bar(i, y, width=0.6, color=recipe_colors["nvfp4_no_rht_all_linears"], hatch=hatch, **edges)
        right.annotate(f"{100 * (y - 1):+.1f}%", (i, y), ha="center", va="bottom", fontsize=7)
left.set_xticks(range(len(sources)), labels=[s[0] for s in sources], fontsize=7)
left.set_yscale("log")
left.set_ylim(top=left.get_ylim()[1] * 10)  # room for the legend above the bars
left.set_ylabel("model-body tokens/s")
left.set_title("model-body throughput (emulated: the emulation's cost)")
handles = [Patch(facecolor=color, label=stages.label(recipe), **edges) for recipe, color in recipe_colors.items()]
left.legend(handles=[*handles, Patch(facecolor="white", hatch="//", label="paper (native)", **edges)], ncol=2)
right.axhline(1.0, color=PAPER_COLOR, linewidth=0.8)
right.set_xticks(range(len(sources)), labels=[s[0].split(":")[0] for s in sources], fontsize=7)
right.set_ylabel("tokens/s over the TE recipe's")
right.set_title("no-RHT/all-linears speed-up")
judged = table[table["execution"] == "native_te"]["verdict"].dropna()
verdict = (
    f"{int((judged == 'reproduced').sum())} of {len(judged)} native speed-ups reproduce the paper's within 10%"
    if len(judged)
    else "No native run here"
)
lines = dict.fromkeys(line for setup in setups for line in setup.splitlines())  # the paper's line once
add_caption(
    fig,
    "\n".join(lines) + f"\nRatios are within one run. {verdict} (throughput_vs_paper.csv); emulated runs time the "
    "emulation and are not judged. Paper: table 10.",
)
save_figure(fig, figure_pdf)
