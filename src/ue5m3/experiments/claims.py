"""The paper's claims, each with the experiment of the pipeline that tests it and a verdict that can say "not yet".

The paper reports one seed per configuration and describes its differences as descriptive (section 7.1). This
module states each claim as a comparison of two configurations (or a measurement) and decides it from our runs:
paired over seeds (:mod:`ue5m3.experiments.paired`) where both configurations train per seed, by the experiment's
tolerance where a measurement is compared, or ``not run`` where the experiment needs what this scale lacks (native
Blackwell, a study recipe the default pipeline does not train). :func:`claims_table` writes ``figures/claims.csv``,
the report's front page; the paper's values come from the shipped reference tables (:mod:`ue5m3.reference`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import pandas as pd

from ue5m3 import reference, stages
from ue5m3.experiments.comparisons.common import reference_by_recipe
from ue5m3.experiments.paired import (
    PAIRED_COLUMNS,
    PAIRED_DTYPES,
    Direction,
    Verdict,
    effect_row,
    judge,
    paired_effect,
)

__all__ = ["Claim", "CLAIMS", "ClaimInputs", "claims_table", "CLAIMS_COLUMNS"]

Kind = Literal["training", "validation", "downstream", "policies", "control", "throughput", "identification"]


@dataclass(frozen=True)
class Claim:
    """One claim of the paper: what it says, where, which experiment tests it and which two sides it compares."""

    key: str
    statement: str
    paper_section: str
    experiment: str  # the figure or table of figures/ that shows it
    kind: Kind
    metric: str
    treatment: str
    baseline: str
    direction: Direction
    benchmark: str | None = None  # downstream claims: the aggregate compared


CLAIMS: tuple[Claim, ...] = (
    Claim(
        "training_loss_vs_te",
        "The proposed UE5M3 B16 recipe ends with a lower final-window training loss than TE NVFP4",
        "section 7.3",
        "training_final_window.pdf",
        "training",
        "final-window mean training loss",
        "ue5m3_b16",
        "nvfp4_te",
        Direction.LOWER,
    ),
    Claim(
        "validation_nll_vs_te",
        "At the last checkpoint UE5M3 B16 has a lower validation NLL than TE NVFP4, each under its inference policy",
        "section 7.4",
        "validation_nll.pdf",
        "validation",
        "validation NLL at the last checkpoint",
        "ue5m3_b16",
        "nvfp4_te",
        Direction.LOWER,
    ),
    Claim(
        "core9_vs_te",
        "UE5M3 B16 scores higher than TE NVFP4 on Core 9",
        "section 7.5",
        "downstream.pdf",
        "downstream",
        "Core 9 accuracy (points)",
        "ue5m3_b16",
        "nvfp4_te",
        Direction.HIGHER,
        "core_9mcqa_olmes",
    ),
    Claim(
        "mmlu_vs_te",
        "UE5M3 B16 scores higher than TE NVFP4 on MMLU",
        "section 7.5",
        "downstream.pdf",
        "downstream",
        "MMLU accuracy (points)",
        "ue5m3_b16",
        "nvfp4_te",
        Direction.HIGHER,
        "mmlu_olmes",
    ),
    Claim(
        "no_rht_with_ue5m3",
        "Without RHT and with every linear in FP4, UE5M3 scales train to a lower loss than E4M3 scales (the native "
        "no-RHT/all-linears ablation): RHT is not needed with UE5M3",
        "sections 7.3 and 8",
        "training_final_window.pdf",
        "training",
        "final-window mean training loss",
        "ue5m3_b16",
        "nvfp4_no_rht_all_linears",
        Direction.LOWER,
    ),
    Claim(
        "periodic_references",
        "Periodic tensor references (cold D = 50 replay) are as good as current ones at inference",
        "appendix A",
        "policy_sensitivity.pdf",
        "policies",
        "validation NLL, cold D = 50 replay minus current tensor",
        "cold_d50_replay",
        "current_tensor",
        Direction.EQUIVALENT,
    ),
    Claim(
        "selective_sr",
        "Stochastic rounding of the backward upstream gradients lowers the loss against round-to-nearest",
        "section 5.2",
        "training_final_window.pdf",
        "training",
        "final-window mean training loss",
        "ue5m3_b16",
        "ue5m3_b16_rne_gradients",
        Direction.LOWER,
    ),
    Claim(
        "native_throughput",
        "Removing RHT and the BF16 final blocks raises native NVFP4 model-body throughput by 21.2%",
        "section 7.6 (table 10)",
        "throughput_ablation.pdf",
        "throughput",
        "model-body tokens/s, ablation over TE recipe",
        "nvfp4_no_rht_all_linears",
        "nvfp4_te",
        Direction.HIGHER,
    ),
    Claim(
        "identification",
        "Native NVFP4 GEMM outputs are reproduced by 64-wide slices, RTZ combination and the 1/1024 product lattice",
        "section 6",
        "emulator_identification.pdf",
        "identification",
        "the identified output model",
        "w64-exact-rtz-g1024",
        "native Blackwell",
        Direction.EQUIVALENT,
    ),
    Claim(
        "override_control",
        "T = 2048 on the wgrad dY of the final layers' second MLP matrix lowers the 350M control's loss",
        "section 5.2",
        "control_override.pdf",
        "control",
        "final-window mean training loss",
        "ue5m3_b16_t2048_override",
        "ue5m3_b16",
        Direction.LOWER,
    ),
)
"""Every claim the claims table decides, in the order of the paper's argument."""

CLAIMS_COLUMNS = [
    "verdict",
    "claim",
    "statement",
    "paper_section",
    "experiment",
    "scale",
    "metric",
    "treatment",
    "baseline",
    *[c for c in PAIRED_COLUMNS if c != "verdict"],
    "note",
]
"""The columns of ``figures/claims.csv``: the verdict first."""

THROUGHPUT_TOLERANCE = 0.10
"""A native speed-up within 10% of the paper's reproduces it (one GB200 against another Blackwell part)."""


@dataclass(frozen=True)
class ClaimInputs:
    """What the claims are decided from (each may be empty: its claims are then ``not run``).

    Attributes:
        final_window: the main runs' ``final_window.csv`` (recipe, seed, final_window_mean_loss).
        control_final_window: the override control's ``final_window.csv``.
        nll: :func:`ue5m3.evaluation.nll.load_results` of the NLL records.
        downstream: :func:`ue5m3.experiments.comparisons.downstream_scores` of the downstream records.
        throughput: the throughput runs' tables stacked (run, execution, recipe, tokens_per_second).
        fits: fit name -> its ``summary.json`` (oracle, identified).
        scale: ``cpu`` or ``paper``, the scale the runs ran at.
    """

    final_window: pd.DataFrame
    control_final_window: pd.DataFrame
    nll: pd.DataFrame
    downstream: pd.DataFrame
    throughput: pd.DataFrame
    fits: Mapping[str, Mapping[str, Any]]
    scale: str


def _by_seed(frame: pd.DataFrame, column: str, key: str, value: str) -> dict[int, float]:
    rows = frame[frame[column] == key] if len(frame) else frame
    return {int(s): float(v) for s, v in zip(rows.get("seed", []), rows.get(value, []), strict=True)}


def _paired(claim: Claim, treatment: dict[int, float], baseline: dict[int, float], paper: float | None, **kw) -> dict:
    if not treatment or not baseline or not set(treatment) & set(baseline):
        missing = [n for n, side in ((claim.treatment, treatment), (claim.baseline, baseline)) if not side]
        note = f"not trained at this scale: {', '.join(missing)}" if missing else "no seed in common"
        return effect_row(None, paper, Verdict.NOT_RUN) | {"note": note}
    effect = paired_effect(treatment, baseline)
    return effect_row(effect, paper, judge(effect, claim.direction, **kw)) | {"note": ""}


def _paper_training(recipe: str, baseline: str) -> float:
    table = reference_by_recipe(reference.load("training_loss_final")).set_index("recipe")["final_window_mean_loss"]
    return float(table[recipe] - table[baseline]) if recipe in table and baseline in table else None


def _training(claim: Claim, inputs: ClaimInputs) -> dict:
    frame, value = inputs.final_window, "final_window_mean_loss"
    treatment, baseline = (_by_seed(frame, "recipe", r, value) for r in (claim.treatment, claim.baseline))
    return _paired(claim, treatment, baseline, _paper_training(claim.treatment, claim.baseline))


def _main_policy_at_last(nll: pd.DataFrame) -> pd.DataFrame:
    if nll.empty:
        return nll
    last = nll[nll["step"] == nll["step"].max()]
    main = last["recipe"].map(lambda r: nll[nll["recipe"] == r]["policy"].mode()[0])
    return last[last["policy"] == main]


def _validation(claim: Claim, inputs: ClaimInputs) -> dict:
    rows = _main_policy_at_last(inputs.nll)
    treatment, baseline = (_by_seed(rows, "recipe", r, "nll") for r in (claim.treatment, claim.baseline))
    paper = reference_by_recipe(reference.load("validation_nll"))
    last = paper[paper["step"] == paper["step"].max()].set_index("recipe")["nll"]
    return _paired(claim, treatment, baseline, float(last[claim.treatment] - last[claim.baseline]))


def _downstream(claim: Claim, inputs: ClaimInputs) -> dict:
    scores = inputs.downstream
    rows = scores[scores["benchmark"] == claim.benchmark] if len(scores) else scores
    treatment, baseline = (_by_seed(rows, "recipe", r, "score") for r in (claim.treatment, claim.baseline))
    paper = reference_by_recipe(reference.load("olmes_aggregates")).set_index(["recipe", "benchmark"])["score_percent"]
    effect = paper[(claim.treatment, claim.benchmark)] - paper[(claim.baseline, claim.benchmark)]
    return _paired(claim, treatment, baseline, float(effect))


def _policies(claim: Claim, inputs: ClaimInputs) -> dict:
    """The proposed recipe's policies at the last checkpoint, equivalent within the paper's headline NLL gap."""
    nll = inputs.nll
    paper = reference_by_recipe(reference.load("validation_nll"))
    last = paper[paper["step"] == paper["step"].max()].set_index("recipe")["nll"]
    margin = abs(float(last["ue5m3_b16"] - last["nvfp4_te"]))
    spread = reference.load("inference_policy_spread")
    paper_spread = float(spread["value"].iloc[0])
    rows = nll[(nll["recipe"] == "ue5m3_b16") & (nll["step"] == nll["step"].max())] if len(nll) else nll
    treatment, baseline = (_by_seed(rows, "policy", p, "nll") for p in (claim.treatment, claim.baseline))
    out = _paired(claim, treatment, baseline, None, margin=margin)
    out["note"] = (
        f"equivalence margin {margin:.5f} NLL (the paper's B16 - TE NVFP4 gap); the paper's policies differ by at "
        f"most {paper_spread:g}" + (f"; {out['note']}" if out["note"] else "")
    )
    return out


def _control(claim: Claim, inputs: ClaimInputs) -> dict:
    frame, value = inputs.control_final_window, "final_window_mean_loss"
    treatment, baseline = (_by_seed(frame, "recipe", r, value) for r in (claim.treatment, claim.baseline))
    paper = reference.load("control_350m_final_window").groupby("configuration")["training_loss"].mean()
    return _paired(claim, treatment, baseline, float(paper["final_four_w2_wgrad_dY_T2048"] - paper["default_T448"]))


def _throughput(claim: Claim, inputs: ClaimInputs) -> dict:
    paper = reference_by_recipe(reference.load("throughput_ablation")).set_index("recipe")["tokens_per_s"]
    paper_ratio = float(paper[claim.treatment] / paper[claim.baseline]) - 1
    frame = inputs.throughput
    native = frame[frame["execution"] == "native_te"] if len(frame) else frame
    if native.empty:
        note = "needs Transformer Engine on a Blackwell GPU (the emulated runs time the emulation, not the hardware)"
        return effect_row(None, paper_ratio, Verdict.NOT_RUN) | {"note": note}
    tokens = native.set_index("recipe")["tokens_per_second"]
    ours = float(tokens[claim.treatment] / tokens[claim.baseline]) - 1
    close = abs(ours - paper_ratio) <= THROUGHPUT_TOLERANCE * abs(paper_ratio)
    verdict = Verdict.REPRODUCED if close else Verdict.CONTRADICTED
    row = effect_row(None, paper_ratio, verdict) | {"effect": ours, "seeds": None}
    return row | {"note": f"within {THROUGHPUT_TOLERANCE:.0%} of the paper's speed-up reproduces it; one run"}


def _oracle_kind(summary: Mapping[str, Any]) -> str:
    """What computed a fit's labels: the recorded oracle's kind for a recording (``emulator``, ``native_te_nvfp4``)."""
    oracle = summary["oracle"]
    return str(oracle.get("recorded", oracle).get("kind"))


def _identification(claim: Claim, inputs: ClaimInputs) -> dict:
    hardware = {n: s for n, s in inputs.fits.items() if _oracle_kind(s) == "native_te_nvfp4"}
    if not hardware:
        synthetic = ", ".join(f"{n}: {s.get('identified') or 'none'}" for n, s in sorted(inputs.fits.items()))
        note = "needs a native Blackwell oracle; here synthetic oracles test the fitter only" + (
            f" ({synthetic})" if synthetic else ""
        )
        return effect_row(None, None, Verdict.NOT_RUN) | {"note": note}
    identified = sorted({c for s in hardware.values() for c in s.get("identified") or []})
    verdict = Verdict.REPRODUCED if claim.treatment in identified else Verdict.CONTRADICTED
    return effect_row(None, None, verdict) | {"note": f"identified: {', '.join(identified) or 'none'}"}


_DECIDE = {
    "training": _training,
    "validation": _validation,
    "downstream": _downstream,
    "policies": _policies,
    "control": _control,
    "throughput": _throughput,
    "identification": _identification,
}


def _side(name: str) -> str:
    return stages.label(name) if name in stages.RECIPE_LABELS else name


def claims_table(inputs: ClaimInputs, claims: tuple[Claim, ...] = CLAIMS) -> pd.DataFrame:
    """One row per claim: the verdict first, then the claim, its section and experiment, the scale it ran at, what
    is compared, our paired effect (interval, MDE), the paper's effect and a note (:data:`CLAIMS_COLUMNS`)."""
    rows = []
    for claim in claims:
        decided = _DECIDE[claim.kind](claim, inputs)
        rows.append(
            {
                "claim": claim.key,
                "statement": claim.statement,
                "paper_section": claim.paper_section,
                "experiment": claim.experiment,
                "scale": inputs.scale,
                "metric": claim.metric,
                "treatment": _side(claim.treatment),
                "baseline": _side(claim.baseline),
                **decided,
            }
        )
    return pd.DataFrame(rows, columns=CLAIMS_COLUMNS).astype(PAIRED_DTYPES)
