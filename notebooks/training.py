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
# Training curves, final-window losses, stability counters and the T = 2048 override control.
#
# Draws the tables that `ue5m3 summarize-training` writes for our runs (several seeds per recipe) beside the
# paper's single-seed 8B and 350M numbers from `ue5m3.reference` (never typed in). Scales differ (CPU-scale
# models and tokens vs 8B / 188B tokens), so the comparable quantity is each recipe's gap to BF16.
import matplotlib.pyplot as plt
import pandas as pd

from ue5m3 import reference
from ue5m3.artifacts import write_csv
from ue5m3.experiments import comparisons
from ue5m3.plotting import OURS_COLOR, PAPER_COLOR, notebook_setup, save_figure

# %% tags=["parameters"]
curves_csv = "results/train/summary/main/curves.csv"
final_window_csv = "results/train/summary/main/final_window.csv"
by_recipe_csv = "results/train/summary/main/by_recipe.csv"
control_curves_csv = "results/train/summary/control/curves.csv"
control_final_window_csv = "results/train/summary/control/final_window.csv"
loss_pdf = "figures/training_loss.pdf"
final_window_pdf = "figures/training_final_window.pdf"
stability_pdf = "figures/training_stability.pdf"
control_pdf = "figures/control_override.pdf"
table_csv = "figures/training_vs_paper.csv"

# %%
notebook_setup(
    globals(),
    curves_csv="input.curves",
    final_window_csv="input.final_window",
    by_recipe_csv="input.by_recipe",
    control_curves_csv="input.control_curves",
    control_final_window_csv="input.control_final_window",
    loss_pdf="output.loss",
    final_window_pdf="output.final_window",
    stability_pdf="output.stability",
    control_pdf="output.control",
    table_csv="output.table",
)
curves, windows, by_recipe = pd.read_csv(curves_csv), pd.read_csv(final_window_csv), pd.read_csv(by_recipe_csv)
control_windows = pd.read_csv(control_final_window_csv)
paper = reference.load("training_loss_final")
paper_control = reference.load("control_350m_final_window")
ours_gap, paper_gap = comparisons.training_gaps(by_recipe, paper)
table = comparisons.training_vs_paper(by_recipe, paper)
write_csv(table_csv, table.to_dict("records"), list(table.columns))

# %%
# (a) smoothed training loss per recipe: mean over seeds, band = min..max over seeds
fig, ax = plt.subplots(figsize=(6.5, 4))
for i, (recipe, runs) in enumerate(curves.groupby("recipe")):
    per_step = runs.groupby("step")["loss_smoothed"]
    line = ax.plot(
        per_step.mean().index, per_step.mean(), label=f"{recipe} ({runs['seed'].nunique()} seeds)", color=f"C{i}"
    )
    ax.fill_between(per_step.min().index, per_step.min(), per_step.max(), color=line[0].get_color(), alpha=0.2)
ax.set(xlabel="optimizer step", ylabel="training loss (moving mean)", title="Training loss, CPU scale (ours)")
ax.legend(fontsize=7)
save_figure(fig, loss_pdf)

# (b) gap of each recipe's final-window mean loss to BF16: ours (seed spread as error bar) beside the paper's 8B
fig, ax = plt.subplots(figsize=(7, 4))
order = [r for r in paper_gap["recipe"] if r in set(ours_gap["recipe"])] + sorted(
    set(ours_gap["recipe"]) - set(paper_gap["recipe"])
)
order += [r for r in paper_gap["recipe"] if r not in order]
x = range(len(order))
ours_idx, paper_idx = ours_gap.set_index("recipe"), paper_gap.set_index("recipe")
ax.bar(
    [i - 0.2 for i in x],
    [ours_idx["gap_to_bf16"].get(r, float("nan")) for r in order],
    width=0.4,
    yerr=[ours_idx["seed_std"].get(r, 0.0) for r in order],
    color=OURS_COLOR,
    label="ours (CPU scale, mean ± std over seeds)",
)
ax.bar(
    [i + 0.2 for i in x],
    [paper_idx["gap_to_bf16"].get(r, float("nan")) for r in order],
    width=0.4,
    color="white",
    edgecolor=PAPER_COLOR,
    hatch="//",
    label="paper (8B, 30k steps, one seed)",
)
ax.set_xticks(list(x), order, rotation=30, ha="right", fontsize=7)
ax.axhline(0, color="black", linewidth=0.6)
ax.set(ylabel="final-window mean loss − BF16", title="Final-window loss gap to BF16")
ax.legend(fontsize=7)
save_figure(fig, final_window_pdf)

# %%
# (c) stability counters (ours) beside the paper's endpoint gradient norms
fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.5))
counts = windows.groupby("recipe")[["losses_above_3", "grad_norms_above_1"]].sum()
counts.plot.bar(ax=left, color=[OURS_COLOR, "C1"], fontsize=7)
left.set(title="ours: logged events after the first twelfth", ylabel="count (all seeds)", xlabel="")
paper_gap.set_index("recipe")["endpoint_grad_norm"].plot.bar(
    ax=right, color="white", edgecolor=PAPER_COLOR, hatch="//", fontsize=7
)
right.set(title="paper: endpoint gradient norm (8B)", xlabel="")
save_figure(fig, stability_pdf)

# (d) the override control: ours per seed beside the paper's 350M final-window losses
fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.5))
for variant, runs in control_windows.groupby("recipe"):
    left.plot(runs["seed"], runs["final_window_mean_loss"], "o-", label=variant)
left.set(xlabel="seed", ylabel="final-window mean loss", title="ours: T = 448 vs override")
left.legend(fontsize=7)
for configuration, points in paper_control.groupby("configuration"):
    right.plot(
        points["step"],
        points["training_loss"],
        "o-",
        label=f"{configuration} (mean {points['training_loss'].mean():.4f})",
    )
right.set(xlabel="step", title="paper: 350M final window")
right.legend(fontsize=6)
save_figure(fig, control_pdf)
