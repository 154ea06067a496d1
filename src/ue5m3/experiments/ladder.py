"""A scale ladder sized by power: how many seeds each claim of the paper needs, at which scale, for what cost.

The paper ran one seed per configuration; its gaps between recipes (0.04-0.18 in training loss at 8B) are of the
size of the seed spread our CPU-scale runs show. This module answers, per claim of the claims table
(:mod:`ue5m3.experiments.claims`) that a paired statistic decides, how many paired seeds a two-sided paired t-test
at alpha 0.05 needs to find the paper's effect with 80% power, and, per rung of a ladder of budgets (two CPU cores
overnight, one GPU for a day, one node of 4 GPUs for a day, the paper's 32 GPUs), which claims its config can decide
and what its training costs.

* **Power** (:mod:`ue5m3.experiments.power`): exact, from the noncentral t distribution; an equivalence claim ("as
  good as") is decided when the 95% interval lies inside its margin.
* **Spread** (:func:`spread_from_curves`): the SD over seeds of the per-seed paired difference of final-window mean
  losses, from real runs (the CPU DAG's: :data:`CPU_WINDOWS` ships the final windows of the runs measured for
  docs/experiments.md), split into the part the window's own noise explains (the scatter of the per-step paired
  differences about a line within each window, pooled over seeds, divided by the window's points) and the rest,
  the trajectory part (the recipe's effect differing from seed to seed).
* **Scaling** (:func:`rung_sd`), a stated assumption, not a measurement: the window part shrinks as one over the
  square root of the tokens in the final window (each logged loss is the mean over one step's tokens; the paired
  per-token differences of one batch average out); for the trajectory part nothing here measures how it changes
  with model size or training tokens (the paper ran one seed), so the ladder gives two numbers of seeds: *held*
  (the trajectory part kept at its CPU value: the conservative one) and *shrunk* (the whole SD shrinking with the
  window's tokens). A claim is decidable at a rung when the rung's seeds reach the held number, decidable only if
  the spread shrinks when they reach the shrunk one, and not decidable otherwise.
* **Cost**: each training run's GPU-hours from :func:`ue5m3.plan.cost.microbatch_seconds` (the plan's own
  estimate) times microbatches per step, steps and GPUs, on the slowest GPU type its partition may hold; compute
  only (the plan, ``snakemake plan``, adds the collectives' unoverlapped share and checks memory). Loading and costing
  the rungs needs the pipeline, which imports this package's stage configs, so it lives above both, on the CLI's
  floor: :mod:`ue5m3.cli.rungs`, behind the verb ``ue5m3 ladder``.
* **Rungs** (:data:`RUNGS`): one config per rung (``config/study_cpu.yaml``, ``config/study_gpu_day.yaml``,
  ``config/study_node_day.yaml``, and ``config/paper.yaml`` for the paper's 32 GPUs), each merged over
  ``config/config.yaml`` as Snakemake merges ``--configfile`` (:func:`rung_data`).

``ue5m3 ladder --write docs/experiments.md`` (from the checkout's root) regenerates the tables of docs/experiments.md
(between its ``ladder`` markers; :mod:`ue5m3.experiments.ladder_docs` renders them); ``--curves
results/train/summary/main/curves.csv`` takes the spread from other runs (e.g. the CPU rung's own) instead of
:data:`CPU_WINDOWS`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ue5m3 import config, reference
from ue5m3.experiments.claims import CLAIMS, Claim
from ue5m3.experiments.comparisons.common import reference_by_recipe
from ue5m3.experiments.power import seeds_needed

__all__ = [
    "Spread",
    "spread_from_curves",
    "paper_window_sd",
    "rung_sd",
    "Rung",
    "RUNGS",
    "merge_configs",
    "rung_data",
    "RungSummary",
    "ClaimSizing",
    "claim_sizings",
    "decisions",
    "effect_for",
    "CPU_WINDOWS",
    "CPU_DAG_SECONDS_PER_RUN",
]

ROOT = Path(__file__).resolve().parents[3]
"""The repository root (the rung configs are read from its ``config/``)."""

CPU_WINDOWS = Path(__file__).with_name("ladder_cpu_windows.csv")
"""The final windows (recipe, seed, step, loss) of the CPU-scale runs the docs' ladder was measured from: the
default CPU DAG's model, data and 150 steps (config/config.yaml), seeds 1-3 of the recipes the largest claims
compare, trained for this table (docs/experiments.md says where and how long)."""

CPU_DAG_SECONDS_PER_RUN = 25.5 * 60 / 14
"""Wall seconds of the CPU DAG on 2 quiet cores per training run, its evaluation included: ``make reproduce`` ran
its 128 jobs (10 main and 4 control runs of 150 steps, their NLL, downstream, snapshot and analyses) in 25 min 31 s
(docs/performance.md, 2026-12-01). The CPU rung's time is this times its runs: an extrapolation, not a measurement."""

CPU_TOKENS_PER_POINT = 8 * 128
"""Tokens behind one logged loss of the CPU runs: one step of 8 sequences of 128 tokens."""


# -- spread ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spread:
    """The spread of a paired final-window difference (treatment minus baseline), measured over seeds.

    Attributes:
        treatment, baseline: the recipes compared.
        seeds: the seeds both ran.
        effect: the mean paired difference of final-window mean losses.
        sd: its standard deviation over seeds.
        window_sd: the part of ``sd`` the window's own noise explains: the pooled residual SD of the per-step paired
            differences about a line within each window, over the square root of the window's points.
        points: logged points per window.
        tokens_per_point: tokens behind one logged loss (one step's batch).
    """

    treatment: str
    baseline: str
    seeds: tuple[int, ...]
    effect: float
    sd: float
    window_sd: float
    points: int
    tokens_per_point: int

    @property
    def trajectory_sd(self) -> float:
        """What the window's noise does not explain (0 when it explains more than the observed spread)."""
        return math.sqrt(max(self.sd**2 - self.window_sd**2, 0.0))

    @property
    def window_tokens(self) -> int:
        return self.points * self.tokens_per_point


def spread_from_curves(
    curves: pd.DataFrame, treatment: str, baseline: str, *, points: int, tokens_per_point: int
) -> Spread:
    """The paired spread of ``treatment`` against ``baseline`` from logged losses (columns recipe, seed, step,
    loss; a ``curves.csv`` of the training summary, or :data:`CPU_WINDOWS`), over the last ``points`` logged steps.

    Raises:
        ValueError: fewer than 2 seeds in common, windows of different steps, or fewer than 3 points.
    """
    if points < 3:
        raise ValueError(f"a window of {points} points leaves no residual about its line; at least 3")
    sides = {}
    for name in (treatment, baseline):
        rows = curves[curves["recipe"] == name]
        sides[name] = {int(seed): run.sort_values("step").tail(points) for seed, run in rows.groupby("seed")}
    seeds = tuple(sorted(set(sides[treatment]) & set(sides[baseline])))
    if len(seeds) < 2:
        raise ValueError(f"{treatment} against {baseline}: {len(seeds)} seed(s) in common, a spread needs 2")
    means, residuals = [], []
    for seed in seeds:
        a, b = sides[treatment][seed], sides[baseline][seed]
        if list(a["step"]) != list(b["step"]) or len(a) != points:
            raise ValueError(f"seed {seed}: {treatment} and {baseline} did not log the same {points} final steps")
        d = a["loss"].to_numpy(float) - b["loss"].to_numpy(float)
        x = a["step"].to_numpy(float)
        residuals.append(d - np.polyval(np.polyfit(x, d, 1), x))
        means.append(float(d.mean()))
    per_point = math.sqrt(sum(float((r**2).sum()) for r in residuals) / (len(seeds) * (points - 2)))
    return Spread(
        treatment=treatment,
        baseline=baseline,
        seeds=seeds,
        effect=float(np.mean(means)),
        sd=float(np.std(means, ddof=1)),
        window_sd=per_point / math.sqrt(points),
        points=points,
        tokens_per_point=tokens_per_point,
    )


PAPER_TOKENS_PER_STEP = 768 * 8192
"""Tokens behind one logged loss of the paper's runs (768 sequences of 8,192 tokens)."""


def paper_window_sd() -> tuple[float, float, int]:
    """The window part of the paired SD at the paper's own scale, from its published per-step losses of the 350M
    control (T = 2048 override minus T = 448, 10 logged points, the same batches): (mean difference, window SD,
    window tokens). The one spread the paper's data show; it checks the window part's scaling in order of
    magnitude only (another pair of configurations, another model)."""
    table = reference.load("control_350m_final_window")
    wide = table.pivot(index="step", columns="configuration", values="training_loss").sort_index()
    d = (wide["final_four_w2_wgrad_dY_T2048"] - wide["default_T448"]).to_numpy(float)
    x = wide.index.to_numpy(float)
    residual = d - np.polyval(np.polyfit(x, d, 1), x)
    per_point = math.sqrt(float((residual**2).sum()) / (len(d) - 2))
    return float(d.mean()), per_point / math.sqrt(len(d)), len(d) * PAPER_TOKENS_PER_STEP


def rung_sd(spread: Spread, window_tokens: int, *, hold_trajectory: bool) -> float:
    """The paired SD expected at a rung whose final window holds ``window_tokens`` tokens (the module docstring's
    assumption): the window part scaled by sqrt(CPU window tokens / the rung's), the trajectory part held at its
    CPU value (``hold_trajectory``) or scaled with it."""
    ratio = spread.window_tokens / window_tokens
    if hold_trajectory:
        return math.sqrt(spread.trajectory_sd**2 + spread.window_sd**2 * ratio)
    return spread.sd * math.sqrt(ratio)


# -- rungs -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rung:
    """One rung of the ladder: a budget and the config that spends it.

    Attributes:
        key: short name.
        title: what the budget is.
        configs: the config files merged, in order, over config/config.yaml (as ``--configfile`` merges them).
        budget_gpu_hours: the GPU-hours the rung may spend on training (None: CPU, or the paper's own runs).
        command: how to run it.
        effect: the effect each claim is sized for: ``paper`` (the paper's, at 8B) or ``measured`` (the CPU runs'
            own, for the claims measured at CPU scale: the scale-appropriate size of the effect there).
        same_scale: the rung trains at the measured runs' own scale (model, tokens, steps), so its spread is held,
            never shrunk, and the docs also say what the measured effect itself would need there.
        wall_s: the rung's measured wall time on its machine (None: not run whole; the CPU rung's time is then an
            extrapolation from the CPU DAG's time per run).
    """

    key: str
    title: str
    configs: tuple[str, ...]
    budget_gpu_hours: float | None
    command: str
    effect: str = "paper"
    same_scale: bool = False
    wall_s: float | None = None


RUNGS: tuple[Rung, ...] = (
    Rung(
        "cpu",
        "CPU, 2 cores (seeds sized for the largest paper effect)",
        ("config/study_cpu.yaml",),
        None,
        "snakemake --cores 2 claims_figures --configfile config/study_cpu.yaml",
        "paper",
        same_scale=True,
        wall_s=4712.0,  # docs/experiments.md: 1 h 18 min 32 s on 2 cores shared with a test session (an upper bound)
    ),
    Rung(
        "gpu_day",
        "one GPU for a day (24 GPU-h)",
        ("config/study_gpu_day.yaml",),
        24.0,
        "snakemake --profile cluster claims_figures --configfile config/study_gpu_day.yaml",
    ),
    Rung(
        "node_day",
        "one node of 4 GPUs for a day (96 GPU-h)",
        ("config/study_node_day.yaml",),
        96.0,
        "snakemake --profile cluster claims_figures --configfile config/study_node_day.yaml",
    ),
    Rung(
        "paper",
        "the paper's 32 GPUs (its runs, one seed)",
        ("config/paper.yaml",),
        None,
        "snakemake --profile cluster --configfile config/paper.yaml",
    ),
)
"""The ladder, cheapest first."""


def merge_configs(base: dict, over: Mapping) -> dict:
    """``over`` merged into ``base`` mapping by mapping, as Snakemake's ``update_config`` merges ``--configfile``."""
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            merge_configs(base[key], value)
        else:
            base[key] = value
    return base


def rung_data(rung: Rung, root: Path = ROOT) -> dict:
    """The rung's merged config data: its files over config/config.yaml (loaded and checked by
    :func:`ue5m3.cli.rungs.rung_config`)."""
    data = config.read_yaml(root / "config" / "config.yaml")
    for name in rung.configs:
        data = merge_configs(data, config.read_yaml(root / name))
    return data


@dataclass(frozen=True)
class RungSummary:
    """What a rung's config trains and costs.

    Attributes:
        rung: the rung.
        model: the main runs' model and its parameters (millions).
        recipes, seeds: the main runs' recipes and seeds.
        steps, tokens_per_step, tokens_per_run: the main runs' length.
        window_tokens: tokens in the final window (its logged points times a step's tokens).
        control_seeds: seeds of the override control's two variants.
        runs: training runs (main and control).
        gpu: the GPU types the runs are costed on ("" for CPU).
        gpu_hours: the training runs' GPU-hours (0 for CPU).
        validation_tokens: tokens of the held-out windows the validation NLL averages.
    """

    rung: Rung
    model: str
    parameters_m: float
    recipes: tuple[str, ...]
    seeds: tuple[int, ...]
    steps: int
    tokens_per_step: int
    tokens_per_run: int
    window_tokens: int
    control_seeds: tuple[int, ...]
    runs: int
    gpu: str
    gpu_hours: float
    validation_tokens: int


# -- claims ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimSizing:
    """How one claim is sized: the spread it is sized by, the paper's effect, and what its decision needs.

    Attributes:
        claim: the claim.
        paper_effect: the paper's effect (treatment minus baseline; None where the paper gives none).
        spread: the measured spread it is sized by (None: not sized, see ``note``).
        window: ``training`` (the final training window) or ``validation`` (the held-out windows).
        margin: an equivalence claim's margin.
        note: where the spread comes from, or why the claim is not sized.
        needs: what a rung must train or hold to decide it (recipes; ``control``; ``native``).
    """

    claim: Claim
    paper_effect: float | None
    spread: Spread | None
    window: str
    margin: float | None
    note: str
    needs: tuple[str, ...]


def _paper_training_gap(treatment: str, baseline: str) -> float | None:
    table = reference_by_recipe(reference.load("training_loss_final")).set_index("recipe")["final_window_mean_loss"]
    if treatment not in table or baseline not in table:
        return None
    return float(table[treatment] - table[baseline])


def _paper_validation_gap(treatment: str, baseline: str) -> float:
    paper = reference_by_recipe(reference.load("validation_nll"))
    last = paper[paper["step"] == paper["step"].max()].set_index("recipe")["nll"]
    return float(last[treatment] - last[baseline])


def claim_sizings(curves: pd.DataFrame, *, points: int, tokens_per_point: int) -> list[ClaimSizing]:
    """One sizing per claim of :data:`~ue5m3.experiments.claims.CLAIMS`, from the runs' logged losses ``curves``."""
    trained = set(curves["recipe"])

    def spread(claim: Claim) -> Spread | None:
        if {claim.treatment, claim.baseline} <= trained:
            return spread_from_curves(
                curves, claim.treatment, claim.baseline, points=points, tokens_per_point=tokens_per_point
            )
        return None

    out = []
    for claim in CLAIMS:
        sides = (claim.treatment, claim.baseline)
        if claim.kind == "training":
            measured = spread(claim)
            paper = _paper_training_gap(*sides)
            if paper is None:
                note = f"the paper gives no value for {claim.baseline} (no such recipe ships): nothing to size by"
                out.append(ClaimSizing(claim, None, None, "training", None, note, sides))
                continue
            note = "measured: CPU runs" if measured else f"not sized: {' or '.join(sides)} not among the measured runs"
            out.append(ClaimSizing(claim, paper, measured, "training", None, note, sides))
        elif claim.kind == "validation":
            proxy = next((c for c in CLAIMS if c.kind == "training" and (c.treatment, c.baseline) == sides), None)
            measured = spread(proxy) if proxy else None
            note = (
                "assumed: the training-loss pair's spread, its window part scaled to the held-out windows' tokens "
                "(no NLL evaluation ran for this table)"
            )
            out.append(ClaimSizing(claim, _paper_validation_gap(*sides), measured, "validation", None, note, sides))
        elif claim.kind == "downstream":
            note = (
                "not sized: the CPU DAG scores near chance on 20 examples per task, a spread that says nothing of "
                "8B; the seed-to-seed spread of these aggregates is not measured anywhere here"
            )
            out.append(ClaimSizing(claim, None, None, "downstream", None, note, sides))
        elif claim.kind == "policies":
            paper = reference_by_recipe(reference.load("validation_nll"))
            last = paper[paper["step"] == paper["step"].max()].set_index("recipe")["nll"]
            margin = abs(float(last["ue5m3_b16"] - last["nvfp4_te"]))
            note = (
                "not sized: no NLL evaluation of the policies ran for this table; the paper's policies differ by "
                f"9e-5 against a margin of {margin:.3f}, so 2 seeds decide it wherever their spread is as small"
            )
            out.append(ClaimSizing(claim, 0.0, None, "validation", margin, note, ("ue5m3_b16",)))
        elif claim.kind == "control":
            paper_mean, _, _ = paper_window_sd()
            note = "not sized: the override control's runs were not measured for this table"
            out.append(ClaimSizing(claim, paper_mean, None, "training", None, note, ("control",)))
        else:  # throughput, identification: one native measurement, no seeds
            note = "a measurement, not paired over seeds: one native run on a Blackwell GPU decides it"
            out.append(ClaimSizing(claim, None, None, claim.kind, None, note, ("native",)))
    return out


def _can_train(sizing: ClaimSizing, cfg: Any) -> bool:
    needs = set(sizing.needs)
    if "native" in needs:
        native_runs = [e for e in cfg.throughput.runs.values() if e.execution == "native_te"]
        return bool(native_runs) and any(f.oracle == "native_te_nvfp4" for f in cfg.identification.fits.values())
    if "control" in needs:
        return True
    return needs <= set(cfg.training.recipes)


def effect_for(sizing: ClaimSizing, rung: Rung) -> float | None:
    """The effect ``sizing``'s claim is sized for at ``rung``: the CPU runs' own where the rung sizes for measured
    effects and the claim's spread was measured on its own pair (training loss), else the paper's."""
    own = sizing.spread is not None and sizing.window == "training" and sizing.note.startswith("measured")
    return sizing.spread.effect if rung.effect == "measured" and own else sizing.paper_effect


def decisions(sizing: ClaimSizing, summary: RungSummary, cfg: Any) -> dict[str, Any]:
    """Whether ``sizing``'s claim is decidable at the rung: seeds needed (held and shrunk spreads), and a word. At the
    measured runs' own scale (a rung sized for the measured effect, the CPU rung) both spreads are the held one."""
    out: dict[str, Any] = {"held": None, "shrunk": None, "sd_held": None, "sd_shrunk": None}
    if not _can_train(sizing, cfg):
        return {**out, "decidable": "not trained"}
    if "native" in sizing.needs:
        return {**out, "decidable": "yes (one native run)"}
    if sizing.spread is None or sizing.paper_effect is None:
        return {**out, "decidable": "not sized"}
    window = summary.window_tokens if sizing.window == "training" else summary.validation_tokens
    sd_held = rung_sd(sizing.spread, window, hold_trajectory=True)
    # at the measured runs' own scale (the CPU rung: their model and tokens, only logged more densely) the trajectory
    # part is a measurement, not an extrapolation: it cannot shrink, so the held number is the only one
    same_scale = summary.rung.same_scale or summary.rung.effect == "measured"
    sd_shrunk = sd_held if same_scale else rung_sd(sizing.spread, window, hold_trajectory=False)
    effect = effect_for(sizing, summary.rung)
    held = seeds_needed(effect, sd_held, margin=sizing.margin)
    shrunk = seeds_needed(effect, sd_shrunk, margin=sizing.margin)
    seeds = len(summary.seeds) if "control" not in sizing.needs else len(summary.control_seeds)
    if seeds < 2:
        word = "no (one seed: no interval)"
    elif held is not None and seeds >= held:
        word = "yes"
    elif shrunk is not None and seeds >= shrunk:
        word = "if the spread shrinks"
    else:
        word = "no"
    return {"held": held, "shrunk": shrunk, "sd_held": sd_held, "sd_shrunk": sd_shrunk, "decidable": word}
