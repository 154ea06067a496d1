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
# # Emulator identification (paper section 6, appendix B; gemm spec section 3)
#
# A fit matches an oracle (a GEMM whose output rule is unknown) against a grid of candidate output models on a probe
# corpus (`ue5m3 fit-emulator`) and counts, per candidate, the probe cells it reproduces bit for bit. The paper's
# oracle is native Blackwell (Transformer Engine NVFP4); at CPU scale ours are synthetic oracles, emulators with a
# hidden output model, on smaller corpora (the caption states which and how many cells), so the counts do not
# compare but the *pattern* does: which variants reproduce every cell.
#
# - **`emulator_identification.pdf`**: the share of cells matched, in the paper's four tables (appendix B): the
#   order tests per slice width and rounding (the paper: only 64-wide RTZ matches all 258), the final-grid sweep
#   (1/1024 is the coarsest grid that keeps all 258), the BF16 witness ladder and the broad probes. Grey bars are
#   the paper's shares, markers ours, one series per fit. A synthetic oracle hiding the probe-matched model should
#   reproduce the paper's pattern; one hiding a Hopper-like model should not.
# - **`emulator_identification_vs_paper.csv`**: counts and shares per fit and table row with `difference`,
#   `relative_difference`, `tolerance` and `verdict`: a fit of a hardware oracle reproduces a row when both sides
#   reproduce every cell, or neither does; a synthetic oracle's rows test the fitter, not the hardware, and are
#   `not run` (the claims table says what a native Blackwell fit would decide).
# - **`parity.csv`**: not a paper comparison: two GEMM backends compared per tensor group after one forward and
#   backward and N AdamW steps (the paper's 1.2B control is exact parity: zero loss difference, zero gradient
#   error).

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from ue5m3 import reference
from ue5m3.experiments import comparisons
from ue5m3.plotting import OURS_COLOR, PAPER_COLOR, add_caption, notebook_setup, save_figure, save_table, scale_caption

# %% tags=["parameters"]
summary_jsons = "results/identify/fits/*/summary.json"  # a glob: every fit
table_csvs = "results/identify/fits/*/tables.csv"  # the same fits, in the same (sorted) order
parity_jsons = "results/identify/parity/*.json"  # every parity comparison
figure_pdf = "figures/emulator_identification.pdf"
table_csv = "figures/emulator_identification_vs_paper.csv"
parity_csv = "figures/parity.csv"
# Caption label -> the identification table whose cell count it is (ours from tables.csv, the paper's from the
# reference: both sides' totals).
cell_counts = {
    "order-test cells": "order_tests_group_width",
    "witness cells": "bf16_witnesses",
    "broad cells": "packed_random_cells_fp32_exact",
}

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
paper = reference.load("emulator_identification")
# Our rows in the fitter's order, then the paper's rows we have no counterpart for; shares and agreement columns.
oracles = {name: fit["oracle"].get("recorded", fit["oracle"]).get("kind", "?") for name, fit in fits.items()}
hardware = [name for name, kind in oracles.items() if kind != "emulator"]
table = comparisons.emulator_identification_vs_paper(ours, paper, hardware_fits=hardware)
save_table(table_csv, table, list(table.columns))
for name, fit in fits.items():
    print(f"{name}: oracle {fit['oracle']}; identified {fit['identified']}; best {fit['best']}; cells {fit['cells']}")
totals = ours.groupby("experiment")["total"].max()
setup = scale_caption(
    {"fits": [f"{name} ({kind})" for name, kind in oracles.items()]}
    | {label: int(totals[experiment]) for label, experiment in cell_counts.items() if experiment in totals},
    {"oracle": "native Blackwell, Transformer Engine NVFP4"}
    | {label: int(paper.loc[paper["experiment"] == e, "total"].max()) for label, e in cell_counts.items()},
)
verdicts = table.dropna(subset=["verdict", "fit"]).groupby("fit")["verdict"]
verdict = "; ".join(
    f"{fit}: " + ", ".join(f"{n} {v}" for v, n in rows.value_counts().items()) for fit, rows in verdicts
)

# %% [markdown]
# ## The four identification tables
#
# One panel per table (the broad probes in two): the share of cells matched bit for bit, the paper's as grey bars,
# ours as one marker series per fit. Variants only one side ran have a bar or markers only.

# %%
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
fig, axes = plt.subplots(len(experiments), 1, figsize=(7.5, 2.1 * len(experiments) + 1.0))
for ax, (experiment, title) in zip(axes, experiments.items(), strict=True):
    rows = table[table["experiment"] == experiment]
    variants = list(dict.fromkeys(rows["variant"]))
    x = {v: i for i, v in enumerate(variants)}
    ref = rows.dropna(subset=["paper_share"]).drop_duplicates("variant")
    ax.bar(
        [x[v] for v in ref["variant"]],
        ref["paper_share"],
        color=PAPER_COLOR,
        alpha=0.35,
        width=0.6,
        label="paper (native Blackwell)",
    )
    for (marker, color), (fit, group) in zip(
        styles, rows.dropna(subset=["share"]).groupby("fit", sort=True), strict=False
    ):
        ax.plot(
            [x[v] for v in group["variant"]],
            group["share"],
            marker=marker,
            linestyle="none",
            color=color,
            label=f"ours: {fit}",
        )
    ax.set_xticks(range(len(variants)), labels=variants, fontsize=7, rotation=15)
    ax.set_ylim(0, 1.08)
    ax.set_ylabel("matched")
    ax.set_title(title, fontsize=9)
fig.legend(*axes[0].get_legend_handles_labels(), loc="outside upper center", ncols=3, fontsize=7)
add_caption(
    fig,
    f"{setup}\nQualitative (both match every cell, or neither): agreeing rows per fit: {verdict} "
    "(emulator_identification_vs_paper.csv). Paper: section 6, appendix B.",
)
save_figure(fig, figure_pdf)

# %% [markdown]
# ## Backend parity
#
# Two GEMM backends compared per tensor group (loss, logits, gradients, parameters, optimizer state) after one
# training run each: bit-equal elements, relative L2, largest absolute and ULP differences. Printed and written to
# `parity.csv`; no figure.

# %%
parity = comparisons.parity_table([(path, json.loads(Path(path).read_text())) for path in parity_jsons])
save_table(parity_csv, parity, list(parity.columns))
print(parity.to_string(index=False))
