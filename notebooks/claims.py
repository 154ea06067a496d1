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
# # The paper's claims, decided (sections 5-7 and appendices A-C)
#
# Each claim of the paper is a comparison of two configurations (or a measurement), tested by one experiment of the
# pipeline (`ue5m3.experiments.claims`). Where both configurations train per seed, our effect is paired over seeds
# (every recipe's run of a seed starts from the same weights and data) with a 95% t interval and the minimum
# detectable effect at 80% power; the verdict is **reproduced** when the interval excludes zero on the paper's side,
# **contradicted** when it excludes zero on the other side, **inconclusive** otherwise, and **not run** where the
# experiment needs what this scale lacks (native Blackwell, a study's recipe).
#
# - **`claims.csv`**: one row per claim, the verdict first, with the paper's section, the experiment, the scale it
#   ran at, the paired effect, its interval and MDE, the paper's effect and a note. The report opens with it.
# - **`claims_effects.pdf`**: each claim's effect in units of the paper's (1 = the paper's effect; for the equivalence
#   claim, in units of its margin), our interval as a bar, so the claims of different units share one axis: a claim
#   is decidable at this scale when its bar is short next to 1.

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ue5m3.evaluation.nll_records import load_results
from ue5m3.experiments import claims, comparisons
from ue5m3.plotting import OURS_COLOR, PAPER_COLOR, add_caption, notebook_setup, save_figure, save_table

# %% tags=["parameters"]
final_window_csv = "results/train/summary/main/final_window.csv"
control_final_window_csv = "results/train/summary/control/final_window.csv"
nll_jsons = "results/eval/nll/*/seed*/step*/*.json"  # a glob: every validation-NLL result
downstream_jsons = "results/eval/downstream/*/seed*/step*/*.json"  # every downstream result
throughput_csvs = "results/throughput/*/throughput.csv"  # every throughput run
fit_jsons = "results/identify/fits/*/summary.json"  # every emulator fit
run_jsons = "results/train/main/*/seed*/final.json"  # the main runs (their model names the scale)
figure_pdf = "figures/claims_effects.pdf"
table_csv = "figures/claims.csv"

# %%
notebook_setup(
    globals(),
    final_window_csv="input.final_window",
    control_final_window_csv="input.control_final_window",
    nll_jsons="input.nll",
    downstream_jsons="input.downstream",
    throughput_csvs="input.throughput",
    fit_jsons="input.fits",
    run_jsons="input.runs",
    figure_pdf="output.figure",
    table_csv="output.table",
)
model = json.loads(Path(run_jsons[0]).read_text())["config"]["model"]
inputs = claims.ClaimInputs(
    final_window=pd.read_csv(final_window_csv),
    control_final_window=pd.read_csv(control_final_window_csv),
    nll=load_results(nll_jsons),
    downstream=comparisons.downstream_scores([(p, json.loads(Path(p).read_text())) for p in downstream_jsons]),
    throughput=pd.concat([pd.read_csv(p) for p in throughput_csvs], ignore_index=True),
    fits={Path(p).parent.name: json.loads(Path(p).read_text()) for p in fit_jsons},
    scale="paper" if model == "nemotron_h_8b" else "cpu",
)
table = claims.claims_table(inputs)
save_table(table_csv, table, list(table.columns))
print(table[["verdict", "claim", "seeds", "effect", "interval_low", "interval_high", "paper_effect"]].to_string())

# %% [markdown]
# ## Every claim on one axis
#
# Each row is a claim: our paired effect divided by the paper's effect (equivalence: by its margin), the bar its
# 95% interval, the hollow marker the paper's own value (1). Rows without a marker of ours were not run here.

# %%
scale = table["paper_effect"].astype(float).abs()
margin = table["note"].str.extract(r"margin ([0-9.e-]+)")[0].astype(float)
scale = scale.fillna(margin)
y = np.arange(len(table))[::-1]
rel = table["effect"].astype(float) / scale
low, high = table["interval_low"].astype(float) / scale, table["interval_high"].astype(float) / scale
sign = np.sign(table["paper_effect"].astype(float)).fillna(1.0)
fig, ax = plt.subplots(figsize=(8, 0.45 * len(table) + 1.6))
ax.errorbar(rel * sign, y, xerr=[(rel - low).abs().fillna(0), (high - rel).abs().fillna(0)], fmt="o", color=OURS_COLOR,
            capsize=3, label="ours: paired effect / |paper effect| (95% t)")  # fmt: skip
ax.plot(np.where(table["paper_effect"].notna(), 1.0, np.nan), y, "o", mfc="none", color=PAPER_COLOR, label="paper")
ax.axvline(0, color="black", linewidth=0.6)
ax.set_yticks(y, [f"{c}  [{v}]" for c, v in zip(table["claim"], table["verdict"], strict=True)], fontsize=7)
ax.set(
    xlabel="effect in units of the paper's effect (its sign: 1 is the paper's direction)", title="The paper's claims"
)
ax.set_xlim(-4, 4)
ax.legend(fontsize=7, loc="lower right")
tally = ", ".join(f"{n} {v}" for v, n in table["verdict"].value_counts().items())
add_caption(
    fig,
    f"Scale: {inputs.scale} ({model}). Verdicts: {tally}. Effects beyond the axis are clipped; claims.csv holds them.",
)
save_figure(fig, figure_pdf)
