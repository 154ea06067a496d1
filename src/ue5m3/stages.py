"""The registry of the reproduction's stages and results: which part of the paper each stage reproduces, which rule
makes each part of ``results/``, and the paper's names of its recipes.

:data:`STAGES` maps each stage of the reproduction to the paper's section it reproduces (the README's table, the
report's categories and the rules' comments all come from it); the figures and tables each stage draws are in
:mod:`ue5m3.figures`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "Stage",
    "STAGES",
    "stage",
    "category",
    "placement",
    "PRODUCERS",
    "producer",
    "RECIPE_LABELS",
    "label",
]


@dataclass(frozen=True)
class Stage:
    """One stage of the reproduction and the part of the paper it reproduces."""

    name: str
    title: str
    paper: str  # the paper's section(s), as the paper numbers them
    order: int  # its place in the report


STAGES: tuple[Stage, ...] = (
    Stage("claims", "The paper's claims, decided", "sections 5-7 and appendices A-C", 0),
    Stage("range_analysis", "Range of the block-scale formats", "sections 4.1 and 5.2", 1),
    Stage("accumulation", "Statistics of the probe-matched FP32 accumulation", "appendix C", 2),
    Stage("training", "Pretraining quality and stability", "sections 7.1-7.3", 3),
    Stage("override_control", "The T = 2048 override control", "section 5.2", 4),
    Stage("validation", "Validation loss", "section 7.4", 5),
    Stage("policy_sensitivity", "Quantized-inference policies", "appendix A", 6),
    Stage("scale_snapshot", "Checkpoint scale-target snapshot", "section 5.3", 7),
    Stage("downstream", "Downstream evaluation", "section 7.5", 8),
    Stage("identification", "Modelling native NVFP4 GEMM outputs", "section 6 and appendix B", 9),
    Stage("grid_control", "The grid-regression control", "appendix C", 10),
    Stage("throughput", "Native NVFP4 execution ablation", "section 7.6 (table 10)", 11),
    Stage("conformance", "Conformance with other FP4 implementations", "beyond the paper", 12),
    Stage("format_study", "The block-scale format study", "beyond the paper", 13),
    Stage("scale_telemetry", "Scale telemetry and the early warning", "beyond the paper (its Proposition 1)", 14),
)


def stage(name: str) -> Stage:
    """The stage named ``name``."""
    for entry in STAGES:
        if entry.name == name:
            return entry
    raise KeyError(f"unknown stage {name!r}; stages: {[s.name for s in STAGES]}")


def category(stage_name: str) -> str:
    """A stage's report category: its place, title and the paper's section. The place is zero-padded: the report's
    menu sorts categories by name, which put "10" before "2"."""
    s = stage(stage_name)
    return f"{s.order:0{len(str(len(STAGES) - 1))}d} {s.title} ({placement(stage_name)})"


def placement(stage_name: str) -> str:
    """Where a stage sits in the paper, as the report, README and rule files write it: 'paper section 5.2', or
    'beyond the paper'."""
    paper = stage(stage_name).paper
    return paper if paper.startswith("beyond") else f"paper {paper}"


PRODUCERS: tuple[tuple[str, str], ...] = (
    ("results/range_analysis/*", "range_analysis"),
    ("results/accumulation/*", "accumulation_stats"),
    ("results/train/summary/*", "training_summary"),
    ("results/train/main/*", "train_run"),
    ("results/train/control/*", "train_control"),
    ("results/eval/nll/*", "evaluate_nll"),
    ("results/eval/snapshot/*", "scale_snapshot"),
    ("results/eval/downstream/*", "evaluate_downstream"),
    ("results/identify/fits/*", "identify_fit"),
    ("results/identify/parity/*", "identify_parity"),
    ("results/identify/grid_control/*", "grid_control"),
    ("results/throughput/*", "throughput"),
    ("results/conformance/*", "conformance"),
    ("results/format_study/*", "format_study"),
    ("results/plan/*", "plan"),
)
"""The rule that writes each part of ``results/`` (a figure notebook run by hand names it for a missing input)."""


def producer(path: str) -> str | None:
    """The rule that makes a result path (or glob pattern) under ``results/``; None for any other path."""
    import fnmatch

    for pattern, rule in PRODUCERS:
        if fnmatch.fnmatchcase(path, pattern) or path.startswith(pattern.removesuffix("*")):
            return rule
    return None


RECIPE_LABELS: dict[str, str] = {
    "bf16": "BF16",
    "ue5m3_b16": "UE5M3 B16 (proposed)",
    "ue5m3_b32": "UE5M3 B32",
    "ue5m3_torch_control": "UE5M3 B16 torch control",
    "ue5m3_te_settings": "UE5M3 B16 TE settings",
    "nvfp4_te": "TE NVFP4",
    "nvfp4_no_rht_all_linears": "NVFP4 no RHT, all linears",
    "mxfp4": "MXFP4",
    "ue5m3_b16_t2048_override": "UE5M3 B16, T = 2048 override",
}
"""The paper's names of its configurations (experiments spec section 1), as every figure and table shows them."""


def label(recipe: str) -> str:
    """A recipe's label in figures and tables: the paper's name for its configurations, else the recipe's own
    name (a recipe the paper did not run, such as a study's)."""
    return RECIPE_LABELS.get(recipe, recipe)
