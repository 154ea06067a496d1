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
# # Downstream accuracy (paper section 7.5)
#
# OLMES-style Core 9 (the macro over the Core 9 tasks we evaluate, each the better of its multiple-choice and
# cloze formulation), MMLU, and MMLU-Pro MC where the results have it, at our last evaluated checkpoint under each
# recipe's inference policy, beside the paper's step-30,000 aggregates from `ue5m3.reference` (never typed in).
# MMLU-Pro here is lm-eval's `leaderboard_mmlu_pro` (hub only, cluster config): its prompt is not OLMES's, so it is
# only roughly comparable to the paper's (docs/evaluation_tasks.md).
#
# - **`downstream.pdf`**, top row: accuracy in percent, ours (mean over seeds, error bars the seed range) beside
#   the paper's 8B. A CPU-scale model scores near chance on a few examples per task (the caption states how many),
#   so the levels do not compare. Bottom row: each recipe's accuracy minus BF16's of the same seed in points (ours:
#   mean and 95% t interval over seeds), beside the paper's, with each pair's verdict. Read against section 7.5: at
#   8B every FP4 recipe trails BF16 on Core 9 and MMLU, and proposed B16 minus TE NVFP4 is +0.13, +1.01 and +0.01
#   points on Core 9, MMLU and MMLU-Pro MC (the claims table decides those).
# - **`downstream_vs_paper.csv`**: per benchmark and recipe, both sides' accuracies, our paired effect against BF16
#   (`effect`, `interval_low`, `interval_high`, `mde`), the paper's effect and the `verdict`.

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt

from ue5m3 import plotting, reference, stages
from ue5m3.experiments import comparisons
from ue5m3.plotting import OURS_COLOR, PAPER_COLOR, add_caption, notebook_setup, save_figure, save_table, scale_caption

# %% tags=["parameters"]
downstream_jsons = "results/eval/downstream/*/seed*/step*/*.json"  # a glob: every downstream result
figure_pdf = "figures/downstream.pdf"
table_csv = "figures/downstream_vs_paper.csv"
# The paper's evaluation (experiments spec section 5), in the captions' terms.
paper_setup = {
    "model": "nemotron_h_8b",
    "checkpoint": 30000,
    "examples per task": "all",
    "seeds": [42],
    "max length": 2048,
}

# %%
notebook_setup(globals(), downstream_jsons="input", figure_pdf="output.figure", table_csv="output.table")
records = [(path, json.loads(Path(path).read_text())) for path in downstream_jsons]
table = comparisons.downstream_vs_paper(records, reference.load("olmes_aggregates"))
save_table(table_csv, table, list(table.columns))
first = records[0][1]
setup = scale_caption(
    {
        "model": first["model"],
        "checkpoint": first["checkpoint_step"],
        "examples per task": first["config"]["examples"] or "all",
        "seeds": sorted({record["seed"] for _, record in records}),
        "max length": first["config"]["max_length"],
    },
    paper_setup,
)
scores = comparisons.downstream_scores(records)
tally = ", ".join(f"{n} {v}" for v, n in table["verdict"].value_counts().items())

# %% [markdown]
# ## Accuracy and the gap to BF16
#
# One column per benchmark. Our error bars are the seed range; in the bottom row a recipe's range is its seeds'
# accuracies against BF16's mean. The paper's bars are single runs.

# %%
benchmarks = ["core_9mcqa_olmes", "mmlu_olmes"] + (["mmlu_pro_mc"] if "mmlu_pro_mc" in set(scores["benchmark"]) else [])
notes = {"core_9mcqa_olmes": " (our evaluated tasks)", "mmlu_pro_mc": " (lm-eval prompt)"}
paper = reference.load("olmes_aggregates").set_index(["config", "benchmark"])["score_percent"]
fig, axes = plt.subplots(2, len(benchmarks), figsize=(4.5 * len(benchmarks), 6.4), squeeze=False)
for column, benchmark in enumerate(benchmarks):
    levels = scores[scores["benchmark"] == benchmark].groupby("recipe")["score"].agg(["mean", "min", "max"])
    x = range(len(levels))
    top, bottom = axes[0, column], axes[1, column]
    err = [levels["mean"] - levels["min"], levels["max"] - levels["mean"]]
    top.bar([i - 0.2 for i in x], levels["mean"], 0.4, yerr=err, color=OURS_COLOR, capsize=3, label="ours (seed range)")
    top.bar([i + 0.2 for i in x], [paper.get((r, benchmark)) for r in levels.index], 0.4, color=PAPER_COLOR, **{
        "label": "paper (8B)"})  # fmt: skip
    top.set_xticks(list(x), [stages.label(r) for r in levels.index], fontsize=6.5)
    top.set(ylabel="accuracy (%)", title=benchmark + notes.get(benchmark, ""))
    plotting.paired_effects(bottom, table[table["benchmark"] == benchmark], ylabel="accuracy − BF16 (points)")
fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="outside upper center", ncols=2, fontsize=7)
axes[1, 0].legend(fontsize=6)
add_caption(fig, f"{setup}\nPaired verdicts against BF16: {tally} (downstream_vs_paper.csv). Paper: section 7.5.")
save_figure(fig, figure_pdf)
