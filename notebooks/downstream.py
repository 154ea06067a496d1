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
#   so the levels do not compare. Bottom row: each recipe's accuracy minus BF16's in points on both sides, the
#   comparable quantity. Read against section 7.5: at 8B every FP4 recipe trails BF16 on Core 9 and MMLU, and
#   proposed B16 minus TE NVFP4 is +0.13, +1.01 and +0.01 points on Core 9, MMLU and MMLU-Pro MC.
# - **`downstream_vs_paper.csv`**: both sides' accuracies and gaps to BF16 with `difference`,
#   `relative_difference`, `tolerance` and `agrees`; the verdict is qualitative (the same sign of the gap to BF16)
#   and at CPU scale mostly decided by sampling noise, which the tolerance column says.

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt

from ue5m3 import reference
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
        "examples per task": first["config"]["n"] or "all",
        "seeds": sorted({record["seed"] for _, record in records}),
        "max length": first["config"]["max_length"],
    },
    paper_setup,
)
agreed = table["agrees"].dropna()

# %% [markdown]
# ## Accuracy and the gap to BF16
#
# One column per benchmark. Our error bars are the seed range; in the bottom row a recipe's range is its seeds'
# accuracies against BF16's mean. The paper's bars are single runs.

# %%
benchmarks = ["core_9mcqa_olmes", "mmlu_olmes"] + (["mmlu_pro_mc"] if "mmlu_pro_mc" in set(table["benchmark"]) else [])
notes = {"core_9mcqa_olmes": " (our evaluated tasks)", "mmlu_pro_mc": " (lm-eval prompt)"}
fig, axes = plt.subplots(2, len(benchmarks), figsize=(4.5 * len(benchmarks), 6.2), squeeze=False, sharex="col")
for column, benchmark in enumerate(benchmarks):
    rows = table[table["benchmark"] == benchmark].sort_values("recipe").reset_index(drop=True)
    x = range(len(rows))
    err = [rows["mean"] - rows["min"], rows["max"] - rows["mean"]]
    top, bottom = axes[0, column], axes[1, column]
    top.bar([i - 0.2 for i in x], rows["mean"], 0.4, yerr=err, color=OURS_COLOR, capsize=3, label="ours (seed range)")
    top.bar([i + 0.2 for i in x], rows["paper"], 0.4, color=PAPER_COLOR, label="paper (8B)")
    top.set(ylabel="accuracy (%)", title=benchmark + notes.get(benchmark, ""))
    bottom.bar([i - 0.2 for i in x], rows["gap_to_bf16_ours"], 0.4, yerr=err, color=OURS_COLOR, capsize=3)
    bottom.bar([i + 0.2 for i in x], rows["gap_to_bf16_paper"], 0.4, color=PAPER_COLOR)
    bottom.axhline(0, color="black", linewidth=0.6)
    bottom.set(ylabel="accuracy − BF16 (points)")
    bottom.set_xticks(list(x), rows["recipe"], fontsize=7, rotation=20)
fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="outside upper center", ncols=2, fontsize=7)
add_caption(
    fig,
    f"{setup}\nQualitative: the gap to BF16 has the paper's sign for {int(agreed.sum())} of {len(agreed)} "
    "recipe-benchmark pairs (downstream_vs_paper.csv). Paper: section 7.5.",
)
save_figure(fig, figure_pdf)
