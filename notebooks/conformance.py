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
# # The FP4 conformance matrix (beyond the paper)
#
# Every peer implementation that runs on a CPU (and a transcription of Transformer Engine's reference, which needs
# CUDA) against this project, operation by operation, on one corpus of tensors, as `ue5m3 conformance` judged it:
#
# - **`conformance.pdf`**: the matrix, one cell per operation (row) and peer (column), coloured by its verdict
#   (bit-exact, within N ulp, equal in distribution, different, not installed or not run); a differing cell names
#   the known difference that explains it.
# - **`conformance_matrix.csv`**: the same cells as a table, with counts, causes, counterexample files and the
#   peers' versions.

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.colors import ListedColormap

from ue5m3.plotting import add_caption, notebook_setup, save_figure, save_table

# %% tags=["parameters"]
matrix_csv = "results/conformance/conformance.csv"
provenance_json = "results/conformance/conformance.json"
figure_pdf = "figures/conformance.pdf"
table_csv = "figures/conformance_matrix.csv"

# %%
notebook_setup(
    globals(),
    matrix_csv="input.matrix",
    provenance_json="input.provenance",
    figure_pdf="output.figure",
    table_csv="output.table",
)
cells = pd.read_csv(matrix_csv, keep_default_na=False)
record = json.loads(Path(provenance_json).read_text())
verdicts = ["bit_exact", "within_ulp", "equal_in_distribution", "different", "not_installed", "not_run"]
colours = ["#2e8b57", "#e0c040", "#4682b4", "#c0392b", "#bbbbbb", "#888888"]
versions = {peer: version for peer, version in record["peers"].items()}
cells["column"] = [
    f"{p}\n{versions.get(p, '')}" + ("\n(transcription)" if s != "package" else "")
    for p, s in zip(cells["peer"], cells["source"], strict=True)
]

# %% [markdown]
# ## The matrix
#
# One cell per (operation, peer), coloured by its verdict; a differing cell names the first known difference that
# explains it (the table lists them all, with the counterexample files).

# %%
grid = cells.pivot_table(index="operation", columns="column", values="verdict", aggfunc="first")
grid = grid.loc[list(dict.fromkeys(cells["operation"]))]
codes = grid.apply(lambda col: col.map(lambda v: verdicts.index(v) if isinstance(v, str) else float("nan")))
fig, ax = plt.subplots(figsize=(2.0 + 1.3 * grid.shape[1], 1.0 + 0.42 * grid.shape[0]))
ax.imshow(codes.to_numpy(dtype=float), cmap=ListedColormap(colours), vmin=-0.5, vmax=len(verdicts) - 0.5, aspect="auto")
lookup = cells.set_index(["operation", "column"])
for i, operation in enumerate(grid.index):
    for j, column in enumerate(grid.columns):
        if (operation, column) in lookup.index:
            cell = lookup.loc[(operation, column)]
            known = cell["known_difference"].split(";")[0]
            text = cell["verdict"].replace("_", " ") + (f"\n{known}" if known else "")
            ax.text(j, i, text, ha="center", va="center", fontsize=6, color="white")
ax.set_xticks(range(grid.shape[1]), labels=grid.columns, fontsize=7)
ax.set_yticks(range(grid.shape[0]), labels=grid.index, fontsize=7)
ax.grid(False)
counts = ", ".join(f"{v.replace('_', ' ')} {n}" for v, n in record["verdicts"].items() if n)
# Wall time stays in results/conformance/: a figure is the same bytes on every rerun.
add_caption(fig, f"{counts}; corpus SHA-256 {record['corpus_sha256'][:12]}.")
save_figure(fig, figure_pdf)
table_columns = [c for c in cells.columns if c not in ("column", "seconds")]
save_table(table_csv, cells[table_columns], table_columns)
