"""The pipeline config as dataclasses: one section per stage, each setting with one home and one name.

``config/config.yaml`` (CPU scale) and ``config/paper.yaml`` (merged over it, as Snakemake merges
``--configfile``) load into :class:`PipelineConfig`. A section is either a stage's own config (``range_analysis``
is :class:`~ue5m3.experiments.range_analysis.RangeAnalysisConfig`, ``evaluation.nll`` is
:class:`~ue5m3.evaluation.nll.NllConfig`, ...), which the stage's verb receives as its ``--config``, or a section
that says which jobs the DAG starts (recipes, seeds, steps to evaluate) around such configs. Where a section
restates the run settings of a job (the training runs' ``steps``, the throughput runs' ``batch_size``), the field
is required here and its default lives only in the job's dataclass; ``tests/test_pipeline_sections.py`` holds the
two types together.

The JSON schema of the pipeline config (``workflow/schemas/config.schema.yaml``) is generated from these classes
(:mod:`ue5m3.pipeline.schema`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from ue5m3.config import Range
from ue5m3.conformance.run import ConformanceConfig
from ue5m3.data import DataConfig
from ue5m3.data.hub import TokenizerSource
from ue5m3.evaluation.inference import InferencePolicy
from ue5m3.evaluation.nll import NllConfig
from ue5m3.evaluation.olmes.run import DownstreamConfig
from ue5m3.evaluation.snapshot import SnapshotConfig
from ue5m3.experiments.accumulation import AccumulationConfig
from ue5m3.experiments.format_study import FormatStudyConfig
from ue5m3.experiments.range_analysis import RangeAnalysisConfig
from ue5m3.experiments.training_summary import SummaryConfig
from ue5m3.identify.candidates import CandidateGrid
from ue5m3.identify.grid_control import GridControlConfig
from ue5m3.identify.oracles import check_spec
from ue5m3.identify.parity import ParityConfig
from ue5m3.identify.probes import CorpusConfig
from ue5m3.identify.run import WitnessConfig
from ue5m3.layers.native_te import Execution
from ue5m3.plan.run import PlanSettings
from ue5m3.training.config import OptimConfig, TrainConfig

__all__ = [
    "TrainingSection",
    "ControlSection",
    "EvaluationSection",
    "WitnessEntry",
    "FitEntry",
    "ParityEntry",
    "IdentificationSection",
    "ThroughputRun",
    "ThroughputSection",
    "PipelineConfig",
    "RunPlacement",
    "RUN_KEYS",
    "RUN_OPTIONAL_KEYS",
]

RUN_KEYS = ("steps", "micro_batch", "accumulation", "log_every", "checkpoint_every", "keep_every", "optim")
"""The run settings a training section passes to each of its runs' :class:`~ue5m3.training.config.TrainConfig`."""

RUN_OPTIONAL_KEYS = (
    "global_batch",
    "checkpoint_every_minutes",
    "activation_checkpointing",
    "checkpoint_kinds",
    "ssd_groups_per_pass",
    "loss_chunk",
    "param_dtype",
    "fp4_weight_dtype",
    "gradient_sync",
    "fsdp_reshard_after_forward",
    "fsdp_prefetch",
)
"""The run settings a training section may set for its runs (null or absent: the run's default, which lives in
:class:`~ue5m3.training.config.TrainConfig` alone): batch, wall-time checkpoints, memory and FSDP2."""


@dataclass(frozen=True, kw_only=True)
class RunPlacement:
    """Where a training section's runs run and how their memory is spent (both training sections share these).

    Attributes:
        nodes: nodes of each run's job.
        gpus_per_node: GPUs per node (0: the run is a CPU job, placed by the profile).
        partition: the SLURM partition of the GPU runs (required when ``gpus_per_node`` > 0; the plan checks the
            GPU types ``plan.partitions`` says it may hold).
        global_batch ... fsdp_prefetch: :data:`RUN_OPTIONAL_KEYS`, passed to every run when set (their meaning and
            defaults: :class:`~ue5m3.training.config.TrainConfig`).
    """

    nodes: int = 1
    gpus_per_node: int = 0
    partition: str | None = None
    global_batch: int | None = None
    checkpoint_every_minutes: float | None = None
    activation_checkpointing: str | None = None
    checkpoint_kinds: tuple[str, ...] | None = None
    ssd_groups_per_pass: int | None = None
    loss_chunk: int | None = None
    param_dtype: str | None = None
    fp4_weight_dtype: str | None = None
    gradient_sync: str | None = None
    fsdp_reshard_after_forward: str | None = None
    fsdp_prefetch: int | None = None

    RANGES: ClassVar[dict[str, Range]] = {
        "nodes": Range(1, 4096, note="nodes of each run's job; the paper: 8"),
        "gpus_per_node": Range(0, 64, note="GPUs per node, 0: a CPU job; the paper: 4"),
        **{key: TrainConfig.RANGES[key] for key in RUN_OPTIONAL_KEYS if key in TrainConfig.RANGES},
    }

    def _check_placement(self) -> None:
        if self.nodes < 1:
            raise ValueError(f"nodes: at least 1, got {self.nodes!r}")
        if self.gpus_per_node < 0:
            raise ValueError(f"gpus_per_node: 0 (a CPU job) or more, got {self.gpus_per_node!r}")
        if self.nodes > 1 and not self.gpus_per_node:
            raise ValueError(f"nodes: {self.nodes} nodes of CPU jobs; multi-node runs are GPU runs (gpus_per_node)")

    @property
    def world_size(self) -> int:
        return self.nodes * max(self.gpus_per_node, 1)


def _check_seeds(seeds: tuple[int, ...]) -> None:
    if not seeds:
        raise ValueError("seeds: at least one seed, got []")
    for i, seed in enumerate(seeds):
        if seed < 0:
            raise ValueError(f"seeds[{i}]: a seed is a non-negative int, got {seed!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds: duplicate seeds {list(seeds)!r} (two runs would share a directory)")


@dataclass(frozen=True, kw_only=True)
class TrainingSection(RunPlacement):
    """The main training runs (paper sections 7.1-7.3, experiments spec sections 1-2): one run per recipe and seed,
    each with the run settings below (their defaults and checks: :class:`~ue5m3.training.config.TrainConfig`).

    Attributes:
        model: the model of every run (:func:`ue5m3.models.names`).
        model_overrides: model config fields to replace (the tokenizer's vocabulary, a block pattern).
        recipes: the recipes trained, one run per recipe and seed (:func:`ue5m3.layers.recipes.names`).
        seeds: the seeds of every recipe (paired: each seed's runs share data order and initial weights).
        steps: optimizer steps of every run.
        micro_batch: sequences per microbatch and rank.
        accumulation: microbatches per optimizer step.
        log_every: steps between metric records.
        checkpoint_every: steps between checkpoints.
        keep_every: checkpoints at multiples of this step are kept for evaluation (0: none).
        optim: AdamW and its schedule.
        execution: the execution path of a recipe whose runs are not emulated (``native_te``: Transformer
            Engine NVFP4 on the Blackwell partition); a recipe not named here runs emulated.
        native_partition: the SLURM partition of the ``native_te`` runs.
        summary: the training summaries' final window and smoothing (both groups of runs).
        nodes, gpus_per_node, partition and the optional run settings: :class:`RunPlacement`.
    """

    model: str
    model_overrides: Mapping[str, Any]
    recipes: tuple[str, ...]
    seeds: tuple[int, ...]
    steps: int
    micro_batch: int
    accumulation: int
    log_every: int
    checkpoint_every: int
    keep_every: int
    optim: OptimConfig
    execution: Mapping[str, Execution] = field(default_factory=dict)
    native_partition: str = "blackwell"
    summary: SummaryConfig = field(default_factory=SummaryConfig)

    def __post_init__(self) -> None:
        if not self.recipes:
            raise ValueError("recipes: at least one recipe, got []")
        if len(set(self.recipes)) != len(self.recipes):
            raise ValueError(f"recipes: duplicate recipes {list(self.recipes)!r}")
        _check_seeds(self.seeds)
        self._check_placement()
        for recipe in self.execution:
            if recipe not in self.recipes:
                raise ValueError(f"execution.{recipe}: names no run (recipes: {list(self.recipes)})")


@dataclass(frozen=True, kw_only=True)
class ControlSection(RunPlacement):
    """The T = 2048 override control (paper section 5.2, the 350M dense model): the recipe with and without the
    target override, one run per variant and seed.

    Attributes:
        model: the control's model.
        model_overrides: model config fields to replace.
        recipe: the control's recipe (the proposed one).
        override: the target override of the ``override`` variant: an entry of a recipe's ``target_overrides``
            (operand, module pattern, layers, target).
        seeds: the seeds of both variants.
        steps: optimizer steps of every run.
        micro_batch: sequences per microbatch and rank.
        accumulation: microbatches per optimizer step.
        log_every: steps between metric records.
        checkpoint_every: steps between checkpoints.
        keep_every: checkpoints at multiples of this step are kept (0: none).
        optim: AdamW and its schedule.
        nodes, gpus_per_node, partition and the optional run settings: :class:`RunPlacement`.
    """

    model: str
    model_overrides: Mapping[str, Any]
    recipe: str
    override: Mapping[str, Any]
    seeds: tuple[int, ...]
    steps: int
    micro_batch: int
    accumulation: int
    log_every: int
    checkpoint_every: int
    keep_every: int
    optim: OptimConfig

    def __post_init__(self) -> None:
        _check_seeds(self.seeds)
        self._check_placement()


@dataclass(frozen=True, kw_only=True)
class EvaluationSection:
    """Held-out evaluation (paper sections 5.3, 7.4, 7.5 and appendix A; experiments spec sections 4, 5 and 7).

    Attributes:
        steps: the checkpoints evaluated (each a checkpoint the runs keep).
        policies: each trained recipe's inference policy (the paper: cold D = 50 replay for the UE5M3 recipes,
            current tensor scaling for the TE-style ones).
        nll: the validation-NLL settings.
        sensitivity_recipe: the recipe evaluated under every policy of ``sensitivity_policies`` at the last step.
        sensitivity_policies: the policies of that sensitivity study.
        snapshot_recipes: the recipes whose last checkpoint gets the scale-target snapshot (first seed).
        snapshot: the snapshot's settings.
        downstream_recipes: the recipes scored downstream at the last evaluated step, under their policy.
        downstream: the downstream tasks and settings.
        partition: the SLURM partition of the evaluation jobs (NLL, downstream, snapshot) when they run on a GPU.
        gpus: GPUs per evaluation job (0: CPU jobs; the snapshot's one forward and backward is planned on them).
        nll_job: what one validation-NLL job evaluates under its policy: ``run`` (every evaluated checkpoint of a run
            in one process: one start-up and import, the held-out windows read once; the sensitivity policies stay
            one job per seed at the last step) or ``checkpoint`` (one job per checkpoint: on a GPU cluster each
            checkpoint's evaluation runs beside the others). The results are the same bytes either way.
    """

    steps: tuple[int, ...]
    policies: Mapping[str, InferencePolicy]
    nll: NllConfig = field(default_factory=NllConfig)
    sensitivity_recipe: str
    sensitivity_policies: tuple[InferencePolicy, ...]
    snapshot_recipes: tuple[str, ...]
    snapshot: SnapshotConfig = field(default_factory=SnapshotConfig)
    downstream_recipes: tuple[str, ...]
    downstream: DownstreamConfig
    partition: str | None = None
    gpus: int = 0
    nll_job: Literal["run", "checkpoint"] = "run"

    RANGES: ClassVar[dict[str, Range]] = {"gpus": Range(0, 1, note="GPUs per evaluation job, 0: a CPU job")}

    def __post_init__(self) -> None:
        if not self.steps:
            raise ValueError("steps: at least one checkpoint step, got []")
        if self.gpus not in (0, 1):
            raise ValueError(f"gpus: 0 (CPU jobs) or 1 (one GPU per evaluation), got {self.gpus!r}")


@dataclass(frozen=True, kw_only=True)
class WitnessEntry(WitnessConfig):
    """The witness GEMM of the probe corpora: a linear of one training run of the DAG.

    Attributes:
        group: the run's group, ``main`` or ``control``.
        variant: its recipe (main) or variant (control: ``t448`` or ``override``).
        seed: its seed.
    """

    group: Literal["main", "control"]
    variant: str
    seed: int


@dataclass(frozen=True, kw_only=True)
class FitEntry:
    """One emulator fit: an oracle recorded on a corpus, and the candidates fitted to it.

    Attributes:
        corpus: the probe corpus (a key of ``identification.corpora``).
        oracle: the oracle (``emulator:<candidate>``, ``hopper_fp8[:fast]``, ``native_te_nvfp4``).
        candidates: the candidate grid; null: ``identification.candidates``.
        partition: the SLURM partition of a hardware oracle's recording job.
    """

    corpus: str
    oracle: str
    candidates: CandidateGrid | None = None
    partition: str | None = None

    def __post_init__(self) -> None:
        check_spec(self.oracle)

    @property
    def on_hardware(self) -> bool:
        """Whether the oracle is hardware (its recording runs on a GPU of ``partition``)."""
        return not self.oracle.startswith("emulator:")


@dataclass(frozen=True, kw_only=True)
class ParityEntry(ParityConfig):
    """One backend parity comparison: a short training run of its own under two backends.

    Attributes:
        model: the run's model.
        model_overrides: model config fields to replace.
        recipe: the run's recipe.
        recipe_overrides: recipe keys to replace (the paper's parity run: SR off, its BF16 layers).
        sequence_length: tokens per sequence.
        partition: the SLURM partition when a backend is ``native_te``.
    """

    model: str
    model_overrides: Mapping[str, Any]
    recipe: str
    recipe_overrides: Mapping[str, Any] = field(default_factory=dict)
    sequence_length: int
    partition: str | None = None

    @property
    def native(self) -> bool:
        return "native_te" in (self.backend_a, self.backend_b)


@dataclass(frozen=True, kw_only=True)
class IdentificationSection:
    """Emulator identification (paper section 6 and appendices B-C; gemm spec sections 3-4).

    Attributes:
        witness: the GEMM witnesses are mined from; null: no witness probes.
        corpora: the probe corpora by name.
        candidates: the default candidate grid of the fits.
        fits: the fits by name.
        parity: the backend parity comparisons by name.
        grid_control: the tiny grid-regression control.
    """

    witness: WitnessEntry | None
    corpora: Mapping[str, CorpusConfig]
    candidates: CandidateGrid = field(default_factory=CandidateGrid)
    fits: Mapping[str, FitEntry]
    parity: Mapping[str, ParityEntry]
    grid_control: GridControlConfig = field(default_factory=GridControlConfig)

    def __post_init__(self) -> None:
        for name, fit in self.fits.items():
            if fit.corpus not in self.corpora:
                raise ValueError(
                    f"fits.{name}.corpus: unknown corpus {fit.corpus!r}; identification.corpora has "
                    f"{sorted(self.corpora)}"
                )


@dataclass(frozen=True, kw_only=True)
class ThroughputRun:
    """One throughput job (its settings: :class:`~ue5m3.experiments.throughput.ThroughputConfig`).

    Attributes:
        execution: ``emulated`` or ``native_te``.
        device: ``cpu``, ``cuda`` or ``cuda:N``.
        recipes: the recipes timed after the BF16 body.
        partition: the SLURM partition of a CUDA run.
    """

    execution: Execution
    device: str
    recipes: tuple[str, ...]
    partition: str | None = None

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")


@dataclass(frozen=True, kw_only=True)
class ThroughputSection:
    """The throughput ablation (paper section 7.6, table 10): the settings every run shares, and the runs.

    Attributes:
        model: the model whose body is timed.
        model_overrides: model config fields to replace.
        batch_size: sequences per step.
        sequence_length: tokens per sequence.
        warmup_steps: untimed steps first.
        measured_steps: timed steps.
        seed: initial weights, inputs and stochastic-rounding streams.
        runs: the throughput jobs by name.
    """

    model: str
    model_overrides: Mapping[str, Any]
    batch_size: int
    sequence_length: int
    warmup_steps: int
    measured_steps: int
    seed: int
    runs: Mapping[str, ThroughputRun]


@dataclass(frozen=True, kw_only=True)
class PipelineConfig:
    """The whole pipeline: ``config/config.yaml`` (CPU scale) or ``config/paper.yaml`` merged over it.

    Attributes:
        launcher: the command that starts the ``ue5m3`` CLI in a training job (``ue5m3`` here; srun + torchrun on
            the cluster), with ``{nodes}``, ``{tasks}`` and ``{procs_per_node}`` filled from the job's resources.
        results_dir: where rules write tables (relative to the repository root, or absolute).
        figures_dir: where the notebooks write the figures.
        range_analysis: the range analysis of the block-scale formats.
        conformance: the FP4 conformance matrix against the peer implementations (beyond the paper).
        accumulation: the statistics of the probe-matched FP32 accumulation.
        data: the pretraining data.
        tokenizer_source: a pinned hub tokenizer that rule fetch_tokenizer downloads into ``data.tokenizer_path``;
            null: none (the BPE is trained offline).
        training: the main training runs.
        control: the T = 2048 override control.
        evaluation: the held-out evaluation.
        identification: the emulator identification.
        throughput: the throughput ablation.
        plan: the GPUs each partition may hold and the job budget the plan checks every GPU job against.
        format_study: the block-scale format study's comparisons and the early warning's thresholds (beyond the
            paper; docs/format_study.md).
    """

    launcher: str = "ue5m3"
    results_dir: str = "results"
    figures_dir: str = "figures"
    range_analysis: RangeAnalysisConfig = field(default_factory=RangeAnalysisConfig)
    conformance: ConformanceConfig = field(default_factory=ConformanceConfig)
    accumulation: AccumulationConfig = field(default_factory=AccumulationConfig)
    data: DataConfig
    tokenizer_source: TokenizerSource | None = None
    training: TrainingSection
    control: ControlSection
    evaluation: EvaluationSection
    identification: IdentificationSection
    throughput: ThroughputSection
    plan: PlanSettings = field(default_factory=PlanSettings)
    format_study: FormatStudyConfig = field(default_factory=FormatStudyConfig)

    def __post_init__(self) -> None:
        for key in ("launcher", "results_dir", "figures_dir"):
            if not getattr(self, key):
                raise ValueError(f"{key}: must not be empty")
