"""The plan stage: every GPU-sized job of the pipeline checked against the GPUs it may land on, before it is submitted.

:func:`run` writes, under ``out_dir``: ``plan.csv`` (one row per job and GPU type: the per-rank memory terms and
their peak, whether it fits, the collectives per step, the step time and its source, the run's hours, the job time
limit and signal margin, the jobs and retries it needs and whether the budget covers it; :data:`COLUMNS`),
``plan.md`` (its GPU rows as a Markdown table, :func:`markdown`) and ``plan.json`` (its provenance and settings).
Memory is counted on the meta device from the project's own build (:mod:`ue5m3.plan.memory`), collectives from
the run's FSDP2 units (:mod:`ue5m3.plan.collectives`), time by the roofline estimate or a GPU check's measurement
(:mod:`ue5m3.plan.cost`). Jobs of identical settings (seeds of one recipe) are measured once.

The Mamba-2 scan has two backends (the model's ``ssd_backend``: the pure-PyTorch ``torch`` scan, the Triton
``mamba_ssm`` one where it is installed), and the row keeps one (job, GPU type) per line: its memory terms are the
job's own backend's (``ssd_backend``; empty for a model without Mamba-2 layers), and for a GPU training job whose
model has Mamba-2 layers the ``other_scan_*`` columns give the same step run with the other backend
(``other_scan``): its activations, transient, peak and whether it fits (parameters, gradients, optimizer state and
FP4 caches are the same under both). Each backend is its own meta step (:mod:`ue5m3.plan.ssd`: mamba_ssm's scan as
the allocations of its source), so the other scan costs one more measurement per such setting. The refusal reads
the job's own backend.

The workflow reads the plan before it submits a training job (:func:`refusal`): a job that does not fit a GPU
its partition may hold, or whose runs cannot finish within the budget's jobs, is refused naming the numbers; the
training rules take their retries, time limits and signal margins from the plan.
"""

from __future__ import annotations

import csv
import dataclasses
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from ue5m3 import config as config_loader
from ue5m3 import models
from ue5m3.artifacts import atomic_path, provenance, write_csv, write_json
from ue5m3.config import Range
from ue5m3.logs import progress_over
from ue5m3.models.nemotron_h import SSD_BACKENDS
from ue5m3.plan import collectives, cost, memory, ssd
from ue5m3.plan.gpus import GpuType, gpu_type
from ue5m3.training.build import build_shell
from ue5m3.training.config import TrainConfig

__all__ = ["PlanJob", "PlanSettings", "PlanConfig", "run", "COLUMNS", "read_plan", "refusal", "job_resources", "GB"]

logger = logging.getLogger(__name__)

GB = 1e9
"""Plans state memory in GB of 10^9 bytes, as the datasheets state GPU memory."""


@dataclass(frozen=True, kw_only=True)
class PlanJob:
    """One job to plan.

    Attributes:
        name: the job's name, unique in the plan (``<rule>/<wildcards>``, as the workflow names it).
        rule: the workflow rule that runs it (the training rules take their retries and limits from the plan).
        kind: ``train`` (an optimizer step per step), ``snapshot`` or ``throughput`` (forward and backward only).
        settings: the run's :class:`~ue5m3.training.config.TrainConfig` fields (for ``throughput``, one run per
            recipe the job times, ``throughput_recipes``; the largest is the job's).
        sequence_length: tokens per sequence.
        steps: optimizer steps (train) or timed steps (snapshot: 1).
        nodes: nodes of the job.
        gpus_per_node: GPUs per node (0: a CPU job).
        partition: the SLURM partition (None: a CPU job, or the profile's default).
        native: the run's FP4 linears run natively (Transformer Engine on FP4 tensor cores).
        throughput_recipes: the recipes a throughput job times after BF16.
    """

    name: str
    rule: str
    kind: Literal["train", "snapshot", "throughput"]
    settings: Mapping[str, Any]
    sequence_length: int
    steps: int
    nodes: int = 1
    gpus_per_node: int = 0
    partition: str | None = None
    native: bool = False
    throughput_recipes: tuple[str, ...] = ()

    RANGES: ClassVar[dict[str, Range]] = {
        "sequence_length": Range(1, 2**20, note="tokens per sequence"),
        "steps": Range(1, 10**7, note="optimizer or timed steps"),
        "nodes": Range(1, 4096, note="nodes of the job"),
        "gpus_per_node": Range(0, 64, note="GPUs per node, 0: a CPU job"),
    }

    @property
    def world_size(self) -> int:
        return self.nodes * max(self.gpus_per_node, 1)


@dataclass(frozen=True, kw_only=True)
class PlanSettings:
    """What the plan checks jobs against: the pipeline config's ``plan`` section.

    Attributes:
        partitions: the GPU types each partition may hold (names of :mod:`ue5m3.plan.gpus`).
        time_limit_hours: the partitions' time limit per job.
        max_jobs_per_run: the jobs (the first and its resubmissions) the budget allows one run.
        restart_minutes: what a resubmitted job spends before training again (queue start, build, resume).
        storage_gbps: checkpoint write bandwidth per node (GB/s).
        network_gbps: inter-node bandwidth per GPU (Gb/s; within a node, the GPU type's NVLink).
        memory_reserve: the share of a GPU's memory kept for the CUDA context, NCCL's buffers and the caching
            allocator's rounding and fragmentation.
        gpu_records: GPU-check records whose measured step times replace the estimate.
    """

    partitions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    time_limit_hours: float = 72.0
    max_jobs_per_run: int = 8
    restart_minutes: float = 20.0
    storage_gbps: float = 2.0
    network_gbps: float = 400.0
    memory_reserve: float = 0.08
    gpu_records: tuple[str, ...] = ()

    RANGES: ClassVar[dict[str, Range]] = {
        "time_limit_hours": Range(0.25, 24 * 31, note="a partition's time limit in hours"),
        "max_jobs_per_run": Range(1, 1000, note="jobs one run may take (the first and its resubmissions)"),
        "restart_minutes": Range(0, 24 * 60, note="minutes a resubmitted job takes to train again"),
        "storage_gbps": Range(0.01, 1e4, low_open=True, note="checkpoint write bandwidth per node, GB/s"),
        "network_gbps": Range(1, 1e5, note="inter-node bandwidth per GPU, Gb/s"),
        "memory_reserve": Range(0, 0.5, high_open=True, note="share of GPU memory kept back"),
    }

    def __post_init__(self) -> None:
        for partition, types in self.partitions.items():
            if not types:
                raise ValueError(f"partitions.{partition}: at least one GPU type")
            for i, name in enumerate(types):
                try:
                    gpu_type(name)
                except ValueError as err:
                    raise ValueError(f"partitions.{partition}[{i}]: {err}") from None


@dataclass(frozen=True, kw_only=True)
class PlanConfig(PlanSettings):
    """Settings of ``ue5m3 plan``: the ``plan`` section's settings (:class:`PlanSettings`) and the jobs to plan
    (the workflow lists every GPU-sized job of the pipeline: ``ue5m3.pipeline.jobs.plan_config``).

    Attributes:
        jobs: the jobs to plan.
    """

    jobs: tuple[PlanJob, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        names = [job.name for job in self.jobs]
        if len(set(names)) != len(names):
            raise ValueError(f"jobs: duplicate job names {sorted({n for n in names if names.count(n) > 1})}")
        for job in self.jobs:
            if job.gpus_per_node and job.partition not in self.partitions:
                raise ValueError(
                    f"jobs.{job.name}: partition {job.partition!r} holds no GPU types in partitions "
                    f"({sorted(self.partitions)}); name the GPU types it may hold"
                )


COLUMNS = [
    "job",
    "rule",
    "kind",
    "recipe",
    "model",
    "execution",
    "partition",
    "gpu",
    "nodes",
    "gpus_per_node",
    "world_size",
    "micro_batch",
    "accumulation",
    "sequence_length",
    "steps",
    "parameters_gb",
    "gradients_gb",
    "optimizer_gb",
    "fp4_caches_gb",
    "activations_gb",
    "transient_gb",
    "peak_gb",
    "reserve_gb",
    "gpu_memory_gb",
    "fits",
    "memory_basis",
    "ssd_backend",
    "other_scan",
    "other_scan_activations_gb",
    "other_scan_transient_gb",
    "other_scan_peak_gb",
    "other_scan_fits",
    "all_gathers",
    "all_gather_gb",
    "reduce_scatters",
    "reduce_scatter_gb",
    "all_reduce_gb",
    "link_gb",
    "microbatch_seconds",
    "step_seconds",
    "step_time_source",
    "run_hours",
    "gpu_hours",
    "time_limit_hours",
    "signal_margin_minutes",
    "jobs_needed",
    "retries",
    "max_jobs",
    "covers",
    "refusal",
]


def _train_config(settings: Mapping[str, Any]) -> TrainConfig:
    return config_loader.load(TrainConfig, dict(settings), source="plan job")


def _memory(job: PlanJob, sms: int = ssd.DEFAULT_SM_COUNT) -> tuple[memory.MemoryTerms, str, TrainConfig]:
    """The job's memory terms (the largest of a throughput job's recipes) and how they were counted (``sms``: the
    SM count a ``mamba_ssm`` scan is planned on)."""
    cfg = _train_config(job.settings)
    basis = "meta step"
    if job.native:  # Transformer Engine does not run here: its emulated twin (the same recipe, model, parallelism)
        basis = "meta step of the emulated twin (Transformer Engine does not run here)"
        cfg = dataclasses.replace(cfg, execution="emulated")
    if job.kind == "snapshot":  # gradients only where the hooked modules' dY needs them, as the snapshot runs
        from ue5m3.evaluation import snapshot

        def needed(model):
            return snapshot._needs_grad(model, snapshot.default_modules(model))

        terms = memory.training_memory(cfg, 1, job.sequence_length, optimizer=False, trainable=needed, sms=sms)
        return terms, f"{basis}; gradients of the blocks from the first hooked one", cfg
    if job.kind == "train":
        return memory.training_memory(cfg, job.world_size, job.sequence_length, sms=sms), basis, cfg
    terms = [
        memory.training_memory(
            dataclasses.replace(cfg, recipe=recipe), job.world_size, job.sequence_length, optimizer=False, sms=sms
        )
        for recipe in ("bf16", *job.throughput_recipes)
    ]
    return max(terms, key=lambda t: t.peak), f"{basis}; the largest of its recipes", cfg


def scan_backend(cfg: TrainConfig) -> str:
    """The Mamba-2 scan backend of the run's model ("" for a model without Mamba-2 layers)."""
    model_cfg = models.config(cfg.model, **cfg.model_overrides)
    if isinstance(model_cfg, models.NemotronHConfig) and "M" in model_cfg.hybrid_override_pattern:
        return model_cfg.ssd_backend
    return ""


def _other_scan(job: PlanJob, cfg: TrainConfig, sms: int) -> tuple[str, memory.MemoryTerms] | None:
    """A GPU training job whose model has Mamba-2 layers: the other scan backend and the step's memory terms under
    it (``cfg``: the job's measured config, :func:`_memory`); None for any other job."""
    own = scan_backend(cfg)
    if job.kind != "train" or not job.gpus_per_node or not own:
        return None
    other = next(b for b in SSD_BACKENDS if b != own)
    overrides = {**cfg.model_overrides, "ssd_backend": other}
    other_cfg = dataclasses.replace(cfg, model_overrides=overrides)
    return other, memory.training_memory(other_cfg, job.world_size, job.sequence_length, sms=sms)


def _signal_margin_minutes(terms: memory.MemoryTerms, job: PlanJob, step_seconds: float, storage: float) -> int:
    """Minutes before the time limit that SLURM's signal must come: finish the step, write the node's checkpoint
    shards (masters and optimizer state) twice over the storage bandwidth, then a minute; at least 5."""
    checkpoint_bytes = (terms.parameters + terms.optimizer) * max(job.gpus_per_node, 1)
    seconds = step_seconds + 2 * checkpoint_bytes / (storage * GB) + 60
    return max(5, math.ceil(seconds / 60))


def _row(
    job: PlanJob,
    cfg: TrainConfig,
    terms: memory.MemoryTerms,
    basis: str,
    comm: collectives.StepCollectives,
    gpu: GpuType | None,
    plan: PlanConfig,
    other: tuple[str, memory.MemoryTerms] | None = None,
) -> dict[str, Any]:
    world = job.world_size
    accumulation = cfg.accumulation_for(world) if job.kind == "train" else 1
    tokens = cfg.micro_batch * job.sequence_length
    row: dict[str, Any] = {
        "job": job.name,
        "rule": job.rule,
        "kind": job.kind,
        "recipe": cfg.recipe if job.kind != "throughput" else "+".join(("bf16", *job.throughput_recipes)),
        "model": cfg.model,
        "execution": "native_te" if job.native else "emulated",
        "partition": job.partition or "",
        "gpu": gpu.name if gpu else "cpu",
        "nodes": job.nodes,
        "gpus_per_node": job.gpus_per_node,
        "world_size": world,
        "micro_batch": cfg.micro_batch,
        "accumulation": accumulation,
        "sequence_length": job.sequence_length,
        "steps": job.steps,
        **{
            f"{name}_gb": getattr(terms, name) / GB
            for name in ("parameters", "gradients", "optimizer", "fp4_caches", "activations", "transient")
        },
        "peak_gb": terms.peak / GB,
        "memory_basis": basis,
        "ssd_backend": scan_backend(cfg),
        "other_scan": other[0] if other else "",
        "other_scan_activations_gb": other[1].activations / GB if other else None,
        "other_scan_transient_gb": other[1].transient / GB if other else None,
        "other_scan_peak_gb": other[1].peak / GB if other else None,
        "all_gathers": comm.all_gathers,
        "all_gather_gb": comm.all_gather_bytes / GB,
        "reduce_scatters": comm.reduce_scatters,
        "reduce_scatter_gb": comm.reduce_scatter_bytes / GB,
        "all_reduce_gb": comm.all_reduce_bytes / GB,
        "link_gb": collectives.link_bytes(comm, world) / GB,
        "time_limit_hours": plan.time_limit_hours,
        "max_jobs": plan.max_jobs_per_run,
    }
    if gpu is None:  # a CPU job: its memory is the host's; the estimate is of GPUs only
        return {**row, "reserve_gb": 0.0, "gpu_memory_gb": None, "fits": None, "other_scan_fits": None,
                "step_time_source": "none"}  # fmt: skip
    reserve = plan.memory_reserve * gpu.memory
    fits = terms.peak + reserve <= gpu.memory
    row["other_scan_fits"] = other[1].peak + reserve <= gpu.memory if other else None
    eff = cost.Efficiency()
    native = job.native and gpu.nvfp4 is not None
    measured = cost.measured_seconds(plan.gpu_records, gpu.name, cfg.model, cfg.recipe, tokens)
    compute = measured if measured is not None else cost.microbatch_seconds(cfg, gpu, tokens, eff, native=native)
    bandwidth = gpu.nvlink if job.nodes == 1 else plan.network_gbps * 1e9 / 8
    units = max(comm.reduce_scatters // (accumulation if cfg.gradient_sync == "every_microbatch" else 1), 1)
    step = (
        cost.communication_seconds(collectives.link_bytes(comm, world), units, compute * accumulation, bandwidth, eff)
        if job.kind == "train"
        else compute * (1 + 1)
    )  # snapshot/throughput: forward + backward per timed step
    run_seconds = step * job.steps
    margin = _signal_margin_minutes(terms, job, step, plan.storage_gbps)
    usable = plan.time_limit_hours * 3600 - margin * 60 - plan.restart_minutes * 60
    jobs_needed = math.ceil(run_seconds / usable) if usable > 0 else math.inf
    row.update(
        {
            "reserve_gb": reserve / GB,
            "gpu_memory_gb": gpu.memory / GB,
            "fits": fits,
            "microbatch_seconds": compute,
            "step_seconds": step,
            "step_time_source": "measured" if measured is not None else "estimate",
            "run_hours": run_seconds / 3600,
            "gpu_hours": run_seconds / 3600 * world,
            "signal_margin_minutes": margin,
            "jobs_needed": jobs_needed,
            "retries": max(jobs_needed - 1, 0) if math.isfinite(jobs_needed) else None,
            "covers": jobs_needed <= plan.max_jobs_per_run,
        }
    )
    row["refusal"] = _refusal_text(row)
    return row


def _refusal_text(row: Mapping[str, Any]) -> str:
    """Why the workflow must not submit the job ("" if nothing)."""
    reasons = []
    if row.get("fits") is False:
        reasons.append(
            f"needs {row['peak_gb']:.1f} GB per GPU (parameters {row['parameters_gb']:.1f}, gradients "
            f"{row['gradients_gb']:.1f}, optimizer {row['optimizer_gb']:.1f}, FP4 caches {row['fp4_caches_gb']:.1f}, "
            f"activations {row['activations_gb']:.1f}, transient {row['transient_gb']:.1f}) + {row['reserve_gb']:.1f} "
            f"reserve, more than a {row['gpu']}'s {row['gpu_memory_gb']:.0f} GB"
        )
    if row.get("covers") is False:
        reasons.append(
            f"needs {row['run_hours']:.0f} h ({row['jobs_needed']} jobs of {row['time_limit_hours']:.0f} h on "
            f"{row['gpu']}), more than max_jobs_per_run {row['max_jobs']} allows"
        )
    return "; ".join(reasons)


def _collectives(job: PlanJob, cfg: TrainConfig) -> collectives.StepCollectives:
    if job.kind != "train":
        return collectives.StepCollectives(0, 0, 0, 0, 0, 0)
    model, _ = build_shell(cfg, cfg.resolved_recipe(), world_size=job.world_size)
    return collectives.step_collectives(model, cfg, job.world_size)


def _measure_key(job: PlanJob, sms: int = ssd.DEFAULT_SM_COUNT) -> tuple:
    """What a job's memory depends on: its settings but the seed and run directory, its shape, and the SM count a
    ``mamba_ssm`` scan is planned on."""
    settings = {k: v for k, v in job.settings.items() if k not in ("seed", "run_dir", "restart_on_change")}
    if job.native:  # measured as its emulated twin (_memory)
        settings["execution"] = "emulated"
    return (
        job.kind,
        repr(sorted(settings.items(), key=str)),
        job.sequence_length,
        job.world_size,
        job.native,
        job.throughput_recipes,
        sms,
    )


def run(cfg: PlanConfig, out_dir: str | Path) -> dict[str, Path]:
    """Plan every job of ``cfg`` on each GPU type its partition may hold; write plan.csv and plan.json."""
    out = Path(out_dir)
    started = time.perf_counter()
    measured: dict[tuple, tuple] = {}
    rows = []
    for job in progress_over(cfg.jobs, "plan", unit="job", logger=logger):
        gpus = [gpu_type(name) for name in cfg.partitions.get(job.partition, ())] if job.gpus_per_node else [None]
        sms = ssd.sm_count(gpu.name for gpu in gpus if gpu is not None)
        key = _measure_key(job, sms)
        if key not in measured:
            terms, basis, train_cfg = _memory(job, sms)
            other = _other_scan(job, train_cfg, sms)
            measured[key] = (terms, basis, train_cfg, _collectives(job, train_cfg), other)
        terms, basis, train_cfg, comm, other = measured[key]
        for gpu in gpus:
            rows.append(_row(job, train_cfg, terms, basis, comm, gpu, cfg, other))
        logger.info(f"planned {job.name}: {terms.peak / GB:.1f} GB per rank at world size {job.world_size}")
    paths = {"plan": out / "plan.csv", "table": out / "plan.md", "provenance": out / "plan.json"}
    write_csv(paths["plan"], rows, COLUMNS)
    with atomic_path(paths["table"]) as tmp:
        tmp.write_text(markdown(rows), encoding="utf-8")
    record = provenance("plan", config_loader.dump(cfg), seconds=time.perf_counter() - started, measured=len(measured))
    write_json(paths["provenance"], record)
    return paths


_TABLE = (
    ("job", "job", "{}"),
    ("gpu", "GPU", "{}"),
    ("world_size", "GPUs", "{}"),
    ("accumulation", "micro-batches", "{}"),
    ("parameters_gb", "params", "{:.1f}"),
    ("gradients_gb", "grads", "{:.1f}"),
    ("optimizer_gb", "AdamW", "{:.1f}"),
    ("fp4_caches_gb", "FP4 caches", "{:.1f}"),
    ("activations_gb", "activations", "{:.1f}"),
    ("transient_gb", "transient", "{:.1f}"),
    ("peak_gb", "peak GB", "{:.1f}"),
    ("gpu_memory_gb", "of", "{:.0f}"),
    ("fits", "fits", "{}"),
    ("link_gb", "link GB/step", "{:.0f}"),
    ("step_seconds", "s/step", "{:.1f}"),
    ("run_hours", "run h", "{:.0f}"),
    ("jobs_needed", "jobs", "{}"),
    ("covers", "covered", "{}"),
)


def markdown(rows: list[Mapping[str, Any]]) -> str:
    """The plan as a Markdown table (plan.md; docs/performance.md shows the paper config's): memory terms in GB per
    rank, the link traffic per step, the step time and the jobs the run needs; GPU rows only."""
    lines = ["| " + " | ".join(title for _, title, _ in _TABLE) + " |", "|" + "---|" * len(_TABLE)]
    for row in rows:
        if row["gpu"] == "cpu":
            continue
        cells = [
            fmt.format(row[key]) if row.get(key) not in (None, "") else "" for key, _, fmt in _TABLE
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def read_plan(path: str | Path) -> list[dict[str, str]]:
    """The rows of a plan.csv (strings, as written)."""
    with Path(path).open(newline="") as handle:
        return list(csv.DictReader(handle))


def refusal(rows: list[Mapping[str, str]], job: str) -> str:
    """Why ``job`` must not be submitted, from its plan rows ("" if it may be; every GPU type its partition may
    hold must fit and be covered)."""
    reasons = [f"{r['gpu']}: {r['refusal']}" for r in rows if r["job"] == job and r["refusal"]]
    return "; ".join(reasons)


def job_resources(rows: list[Mapping[str, str]], job: str) -> dict[str, int]:
    """The time limit (minutes), signal margin (minutes) and retries the plan gives ``job``: the largest over the
    GPU types its partition may hold (a CPU job: none)."""
    mine = [r for r in rows if r["job"] == job and r["gpu"] != "cpu"]
    if not mine:
        return {}
    hours = max(float(r["run_hours"]) for r in mine)
    limit = float(mine[0]["time_limit_hours"]) * 60
    margin = max(int(r["signal_margin_minutes"]) for r in mine)
    retries = max(int(r["retries"] or 0) for r in mine)
    # a run that needs less than one job asks for what it needs (margin and restart included), not the limit
    runtime = min(limit, math.ceil(hours * 60 + margin + 30)) if retries == 0 else limit
    return {"runtime": int(runtime), "signal_margin": margin, "retries": retries}
