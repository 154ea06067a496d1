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
# Downstream accuracy (OLMES-style Core 9 over the tasks we evaluate, MMLU, and MMLU-Pro MC where the results have
# it) at the last evaluated step, mean over seeds with the seed range, beside the paper's 8B aggregates from
# `ue5m3.reference` (never typed in). MMLU-Pro is lm-eval's `leaderboard_mmlu_pro` (hub only, cluster config): its
# prompt is not OLMES's, so it is only roughly comparable to the paper's (docs/evaluation_tasks.md).
import json
from pathlib import Path

import matplotlib.pyplot as plt

from ue5m3 import reference
from ue5m3.artifacts import write_csv
from ue5m3.experiments import comparisons
from ue5m3.plotting import OURS_COLOR, PAPER_COLOR, notebook_setup, save_figure

# %% tags=["parameters"]
downstream_jsons: list = []  # filled by Snakemake (results/eval/downstream/<recipe>/seed<s>/step<n>/<policy>.json)
figure_pdf = "figures/downstream.pdf"
table_csv = "figures/downstream_vs_paper.csv"

# %%
notebook_setup(globals(), downstream_jsons="input", figure_pdf="output.figure", table_csv="output.table")
records = [(path, json.loads(Path(path).read_text())) for path in downstream_jsons]
table = comparisons.downstream_vs_paper(records, reference.load("olmes_aggregates"))
write_csv(table_csv, table.to_dict("records"), list(table.columns))

# %%
benchmarks = ["core_9mcqa_olmes", "mmlu_olmes"] + (["mmlu_pro_mc"] if "mmlu_pro_mc" in set(table["benchmark"]) else [])
notes = {"core_9mcqa_olmes": " (our evaluated tasks)", "mmlu_pro_mc": " (lm-eval prompt)"}
fig, axes = plt.subplots(1, len(benchmarks), figsize=(4.5 * len(benchmarks), 3.6), squeeze=False)
for ax, benchmark in zip(axes[0], benchmarks, strict=True):
    rows = table[table["benchmark"] == benchmark].sort_values("recipe").reset_index(drop=True)
    x = range(len(rows))
    err = [rows["mean"] - rows["min"], rows["max"] - rows["mean"]]
    ax.bar([i - 0.2 for i in x], rows["mean"], 0.4, yerr=err, color=OURS_COLOR, capsize=3, label="ours (seed range)")
    ax.bar([i + 0.2 for i in x], rows["paper"], 0.4, color=PAPER_COLOR, label="paper (8B)")
    ax.set_xticks(list(x), rows["recipe"], fontsize=7, rotation=20)
    ax.set(ylabel="accuracy (%)", title=benchmark + notes.get(benchmark, ""))
    ax.legend(fontsize=6)
save_figure(fig, figure_pdf)
