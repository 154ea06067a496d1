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
import pandas as pd

from ue5m3 import reference
from ue5m3.artifacts import write_csv
from ue5m3.plotting import OURS_COLOR, PAPER_COLOR, apply_style, save_figure

apply_style()

# %% tags=["parameters"]
downstream_jsons: list = []  # filled by Snakemake (results/eval/downstream/<recipe>/seed<s>/step<n>/<policy>.json)
figure_pdf = "figures/downstream.pdf"
table_csv = "figures/downstream_vs_paper.csv"

# %%
if "snakemake" in globals():
    smk = globals()["snakemake"]  # injected by Snakemake's notebook: directive
    downstream_jsons, figure_pdf, table_csv = list(smk.input), smk.output.figure, smk.output.table
rows = []
for path in downstream_jsons:
    record, parts = json.loads(Path(path).read_text()), Path(path).parts
    base = {"recipe": parts[-4], "seed": int(parts[-3].removeprefix("seed")), "policy": record["policy"]}
    aggregates = record["aggregates"]
    rows.append({**base, "benchmark": "core_9mcqa_olmes", "score": aggregates["core9_evaluated"]["macro"]})
    rows.append({**base, "benchmark": "mmlu_olmes", "score": aggregates["mmlu"]["best"]})
    rows.append({**base, "benchmark": "mmlu_pro_mc", "score": aggregates.get("mmlu_pro_mc")})  # absent at CPU scale
ours = pd.DataFrame(rows).dropna(subset=["score"])
ours["score"] *= 100
ours = ours.groupby(["recipe", "benchmark"])["score"].agg(["mean", "min", "max", "count"]).reset_index()
paper = reference.load("olmes_aggregates").rename(columns={"config": "recipe", "score_percent": "paper"})
table = ours.merge(paper[["recipe", "benchmark", "paper"]], on=["recipe", "benchmark"], how="left")
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
