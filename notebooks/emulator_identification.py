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
# Emulator identification (paper section 6, appendix B; gemm spec section 3).
#
# For each fit (an oracle matched against the candidate grid on a probe corpus, `ue5m3 fit-emulator`) the share
# of probe cells each output model reproduces bit for bit, in the paper's four tables -- order tests per slice
# width and rounding, the final-grid sweep, the BF16 witness ladder and the broad probes -- beside the paper's
# native-Blackwell counts from `ue5m3.reference` (never typed in). Also writes the parity reports as a table.
import json
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from ue5m3 import reference
from ue5m3.artifacts import write_csv
from ue5m3.experiments import comparisons
from ue5m3.plotting import OURS_COLOR, PAPER_COLOR, notebook_setup, save_figure

# %% tags=["parameters"]
summary_jsons: list = []  # filled by Snakemake (results/identify/fits/<fit>/summary.json)
table_csvs: list = []  # results/identify/fits/<fit>/tables.csv, same order
parity_jsons: list = []  # results/identify/parity/<name>.json
figure_pdf = "figures/emulator_identification.pdf"
table_csv = "figures/emulator_identification_vs_paper.csv"
parity_csv = "figures/parity.csv"

# %%
notebook_setup(
    globals(),
    summary_jsons="input.summaries",
    table_csvs="input.tables",
    parity_jsons="input.parity",
    figure_pdf="output.figure",
    table_csv="output.table",
    parity_csv="output.parity",
)
fits = {Path(path).parent.name: json.loads(Path(path).read_text()) for path in summary_jsons}
ours = pd.concat([pd.read_csv(path).assign(fit=Path(path).parent.name) for path in table_csvs], ignore_index=True)
# Our rows in the fitter's order, then the paper's rows we have no counterpart for.
table = comparisons.emulator_identification_vs_paper(ours, reference.load("emulator_identification"))
write_csv(table_csv, table.to_dict("records"), list(table.columns))
for name, fit in fits.items():
    print(f"{name}: oracle {fit['oracle']}; identified {fit['identified']}; best {fit['best']}; cells {fit['cells']}")

# %%
# One panel per table: share of cells matched bit for bit (ours: one marker series per fit; paper: grey bars).
experiments = {
    "order_tests_group_width": "order tests: slice width x rounding",
    "order_tests_final_grid": "order tests: final grid",
    "bf16_witnesses": "BF16 witnesses",
    "packed_random_cells_fp32_exact": "broad probes: packed random",
    "te_quantized_wide_cells_exact": "broad probes: quantized wide",
}
styles = list(
    zip(
        ["o", "s", "D", "^", "v", "P"], [OURS_COLOR, "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"], strict=True
    )
)
fig, axes = plt.subplots(len(experiments), 1, figsize=(7.5, 2.1 * len(experiments)))
for ax, (experiment, title) in zip(axes, experiments.items(), strict=True):
    rows = table[table["experiment"] == experiment]
    variants = list(dict.fromkeys(rows["variant"]))
    x = {v: i for i, v in enumerate(variants)}
    ref = rows.dropna(subset=["paper_passed"]).drop_duplicates("variant")
    ax.bar(
        [x[v] for v in ref["variant"]],
        ref["paper_passed"] / ref["paper_total"],
        color=PAPER_COLOR,
        alpha=0.35,
        width=0.6,
        label="paper (native Blackwell)",
    )
    for (marker, color), (fit, group) in zip(
        styles, rows.dropna(subset=["passed"]).groupby("fit", sort=True), strict=False
    ):
        ax.plot(
            [x[v] for v in group["variant"]],
            group["passed"] / group["total"],
            marker=marker,
            linestyle="none",
            color=color,
            label=f"ours: {fit}",
        )
    ax.set_xticks(range(len(variants)), labels=variants, fontsize=7, rotation=15)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("matched")
    ax.set_title(title, fontsize=9)
axes[0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, 1.0), framealpha=0.9)
save_figure(fig, figure_pdf)

# %%
# Parity of two GEMM backends over one forward/backward and N AdamW steps, per tensor group.
parity = comparisons.parity_table([(path, json.loads(Path(path).read_text())) for path in parity_jsons])
write_csv(parity_csv, parity.to_dict("records"), list(parity.columns))
print(parity.to_string(index=False))
