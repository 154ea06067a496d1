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
# # The block-scale format study and the scale telemetry (beyond the paper)
#
# The paper compares UE5M3 with E4M3 block scales through its two recipes. The study (`config/study_formats.yaml`,
# docs/format_study.md) trains the alternatives side by side: E4M3 scales at T = 448 and 256 with and without 4/6
# selection, UE5M3 under its three top-code conventions at T in {448, 2048, 8192}, UE8M0 with the floor and RCEIL
# rules at blocks 16 and 32, and UE5M3 references refreshed every D in {1, 10, 50, 200} steps, every other setting
# fixed (the recipes of `ue5m3/layers/recipe_files/study`). This notebook draws whatever recipes the config trained
# (the tables of `ue5m3 format-study`): on the default pipeline, its five recipes against the proposed one.
#
# - **`format_study_table.csv`**: one row per recipe: its numerics and how it differs from the reference arm
#   (`ue5m3_t448`, else the proposed `ue5m3_b16`), its final-window mean training loss, its effect against the
#   reference and against BF16, paired per seed (`ue5m3.experiments.paired`), each with a 95% t interval, the
#   minimum detectable effect at 80% power and a verdict (lower, higher, inconclusive, or identical when every
#   seed's runs ended on the same loss), and its runs' scale telemetry: the shares of saturated, zero-rounded and
#   underflowed blocks, the largest headroom margin T * rho / U of a held reference (the paper's Proposition 1) and
#   the mean E2M1 dead-zone share.
# - **`format_study.pdf`**: the paired effects against the reference and against BF16, one row per recipe, grouped
#   by scale-format family.
# - **`scale_telemetry.pdf`**: the scale telemetry per recipe over training, per operand role (X, W, dY): the
#   headroom margin of held references, the share of blocks whose scale rounded to zero, the E2M1 dead-zone share.
# - **`early_warning.csv`**: per run, the first logged step the early warning flags (`ue5m3.experiments.early_warning`:
#   stated thresholds on the telemetry), the condition, the step the loss diverged (if it did) and the lead.

# %%
import json
import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ue5m3 import stages
from ue5m3.plotting import FORMAT_COLORS, OURS_COLOR, add_caption, notebook_setup, save_figure, save_table

# %% tags=["parameters"]
study_csv = "results/format_study/study.csv"
telemetry_csv = "results/format_study/telemetry.csv"
warnings_csv = "results/format_study/warnings.csv"
provenance_json = "results/format_study/provenance.json"
run_jsons = "results/train/main/*/seed*/final.json"  # a glob: every finished main run
figure_pdf = "figures/format_study.pdf"
table_csv = "figures/format_study_table.csv"
telemetry_pdf = "figures/scale_telemetry.pdf"
early_warning_csv = "figures/early_warning.csv"

# %%
notebook_setup(
    globals(),
    study_csv="input.study",
    telemetry_csv="input.telemetry",
    warnings_csv="input.warnings",
    provenance_json="input.provenance",
    run_jsons="input.runs",
    figure_pdf="output.figure",
    table_csv="output.table",
    telemetry_pdf="output.telemetry",
    early_warning_csv="output.warnings",
)
table = pd.read_csv(study_csv)
save_table(table_csv, table, list(table.columns))
warnings = pd.read_csv(warnings_csv)
save_table(early_warning_csv, warnings.drop(columns="run"), [c for c in warnings.columns if c != "run"])
settings = json.loads(Path(provenance_json).read_text())["config"]
configs = [json.loads(Path(p).read_text())["config"] for p in run_jsons]
reference = ", ".join(table.loc[table["verdict"] == "reference", "recipe"]) or "none trained"
setup = f"{configs[0]['model']}, {configs[0]['steps']} steps, seeds {sorted({c['seed'] for c in configs})}"
setup += f"; reference arm: {reference}"
print(table[["family", "recipe", "differs_from_reference", "effect", "interval_low", "interval_high", "verdict"]])
print(warnings[["recipe", "seed", "warned_step", "warning", "diverged_step"]])

# %% [markdown]
# ## Paired effects against the reference arm and against BF16
#
# Each row is a recipe: the mean over seeds of its final-window loss minus the baseline's of the same seed, the bar
# its 95% t interval (none for one seed, nor for identical runs), coloured by its scale-format family; left of zero is
# a lower loss. The verdict is written beside each row.

# %%
fig, axes = plt.subplots(1, 2, figsize=(9.5, 0.42 * len(table) + 2.2), sharey=True, layout="constrained")
y = np.arange(len(table))[::-1]
colors = [FORMAT_COLORS.get(str(f).upper(), OURS_COLOR) if f != "bf16" else "0.4" for f in table["family"]]
for ax, suffix, verdicts, title in (
    (axes[0], "", "verdict", "against the reference arm"),
    (axes[1], "_vs_bf16", "verdict_vs_bf16", "against BF16"),
):
    effect = table[f"effect{suffix}"].astype(float).to_numpy()
    low, high = table[f"interval_low{suffix}"].astype(float), table[f"interval_high{suffix}"].astype(float)
    err = np.vstack([np.nan_to_num(effect - low.to_numpy()), np.nan_to_num(high.to_numpy() - effect)])
    for i, color in enumerate(colors):
        ax.errorbar(effect[i], y[i], xerr=err[:, i : i + 1], fmt="none", ecolor=color, capsize=2, linewidth=1)
    ax.scatter(effect, y, c=colors, s=14, zorder=3)
    for yi, v in zip(y, table[verdicts], strict=True):
        ax.annotate(str(v), (1, yi), xytext=(-3, 0), textcoords="offset points", fontsize=6, va="center", ha="right",
                    color="0.35", xycoords=("axes fraction", "data"))  # fmt: skip
    ax.axvline(0, color="black", linewidth=0.6)
    ax.set_title(title)
fig.supxlabel(f"final-window loss difference, paired per seed ({settings['level']:.0%} t interval)", fontsize=8)
names = [stages.label(r) for r in table["recipe"]]
differs = [d if isinstance(d, str) and d != "reference" else "" for d in table["differs_from_reference"]]
axes[0].set_yticks(y, [f"{n}\n{textwrap.shorten(d, 60)}" if d else n for n, d in zip(names, differs, strict=True)],
                   fontsize=6)  # fmt: skip
add_caption(
    fig,
    f"Ours: {setup}. Colour: scale-format family (UE5M3 blue, E4M3 red, UE8M0 green, BF16 grey). Beyond the paper: "
    "it compares only its two recipes' formats.",
)
save_figure(fig, figure_pdf)

# %% [markdown]
# ## The scale telemetry over training
#
# Per operand role (columns) and recipe (lines), over the logged steps, the mean over linears and seeds: the largest
# headroom margin T * rho / U of a held reference (blocks saturate above 1), the share of blocks whose scale rounded
# to zero before repair, and the share of nonzero elements in E2M1's dead zone. Recipes with current references
# have no margin; BF16 has no telemetry.

# %%
telemetry = pd.read_csv(telemetry_csv)
rows = (("headroom_margin", "headroom margin T·ρ/U"), ("zero_rounded_share", "zero-rounded blocks"),
        ("dead_zone_share", "E2M1 dead-zone share"))  # fmt: skip
roles = ("activation", "weight", "upstream_gradient")
fig, axes = plt.subplots(len(rows), len(roles), figsize=(9.5, 6.5), sharex=True, layout="constrained", squeeze=False)
cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
for i, (_recipe, frame) in enumerate(telemetry.groupby("recipe", sort=False)):
    for col, role in enumerate(roles):
        part = frame[frame["role"] == role].sort_values("step")
        for row, (key, _) in enumerate(rows):
            values = part[key].astype(float)
            if values.notna().any():
                axes[row][col].plot(part["step"], values, color=cycle[i % len(cycle)], linewidth=0.9)
for col, role in enumerate(roles):
    axes[0][col].set_title({"activation": "X", "weight": "W", "upstream_gradient": "dY"}[role])
    axes[-1][col].set_xlabel("step")
    axes[0][col].axhline(1.0, color="black", linewidth=0.5, linestyle=":")
for row, (_, label) in enumerate(rows):
    axes[row][0].set_ylabel(label)
handles = [plt.Line2D([], [], color=cycle[i % len(cycle)], label=stages.label(r))
           for i, r in enumerate(telemetry["recipe"].drop_duplicates())]  # fmt: skip
if handles:
    fig.legend(handles=handles, loc="outside upper center", ncols=4, fontsize=6)
add_caption(fig, f"Ours: {setup}. The dotted line is Proposition 1's saturation bound. Beyond the paper.")
save_figure(fig, telemetry_pdf)
