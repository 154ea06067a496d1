"""What the rules start: each job's settings built from the typed pipeline config, as the verbs load them.

A rule passes its verb one ``--config`` (JSON of the job's stage config, built here), the paths it reads and
writes, and the wildcards that say which job it is; nothing else. :func:`run_settings` builds a training run's
:class:`~ue5m3.training.config.TrainConfig` fields, :func:`parity_settings` a parity run's, :func:`throughput_settings`
a throughput run's and :func:`job_config` any other stage's.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

from ue5m3 import config
from ue5m3.pipeline.sections import RUN_KEYS, RUN_OPTIONAL_KEYS, PipelineConfig
from ue5m3.training.loss import HEAD_CHUNK

__all__ = [
    "CONTROL_VARIANTS",
    "GROUPS",
    "run_dir",
    "run_settings",
    "run_execution",
    "parity_settings",
    "throughput_settings",
    "job_config",
    "kept_checkpoints",
    "launcher",
    "signal_margin_s",
    "LAUNCHER_FIELDS",
    "plan_config",
    "staging_dir",
    "prepare_data_settings",
    "training_slurm_extra",
    "plan_job_name",
    "PLANNED_RULES",
]

CONTROL_VARIANTS = ("t448", "override")
"""The two runs of the override control: the recipe as it is, and with the T = 2048 target override."""
GROUPS = ("main", "control")


def run_dir(cfg: PipelineConfig, group: str, variant: str, seed: int | str) -> str:
    """results/train/{group}/{variant}/seed{seed}: checkpoints, metrics and final.json of one run."""
    return os.path.join(cfg.results_dir, "train", group, variant, f"seed{seed}")


def staging_dir(cfg: PipelineConfig) -> str:
    """Where rule ``stage_data`` puts the files of the data config's ``hf://`` URIs: ``<data_dir>/hub``."""
    return os.path.join(cfg.data.data_dir, "hub")


def prepare_data_settings(cfg: PipelineConfig) -> dict[str, Any]:
    """The data config the preparation jobs read: every ``hf://`` URI replaced by its staged local copy (rule
    ``stage_data`` downloads them on the login node), so that no compute job reaches the hub."""
    from ue5m3.data.hub import staged_path

    data = config.dump(cfg.data)
    for key in ("stream_a_files", "stream_b_files"):
        data[key] = [staged_path(u, staging_dir(cfg)) if u.startswith("hf://") else u for u in data[key]]
    return data


def _control_overrides(cfg: PipelineConfig, variant: str) -> dict[str, Any]:
    if variant == "t448":
        return {}
    control = cfg.control
    return {
        "name": f"{control.recipe}_t{int(control.override['target'])}_override",
        "target_overrides": [control.override],
    }


def run_execution(cfg: PipelineConfig, group: str, variant: str) -> str:
    """``emulated`` or ``native_te``: the main runs take it from ``training.execution`` (per recipe), the control's
    are emulated."""
    if group != "main":
        return "emulated"
    return str(cfg.training.execution.get(variant, "emulated"))


def run_settings(cfg: PipelineConfig, group: str, variant: str, seed: int | str) -> dict[str, Any]:
    """The settings of one training run (``ue5m3 train-config`` validates and writes them)."""
    main = group == "main"
    section = cfg.training if main else cfg.control
    return {
        "execution": run_execution(cfg, group, variant),
        "run_dir": run_dir(cfg, group, variant, seed),
        "model": section.model,
        "model_overrides": dict(section.model_overrides),
        "recipe": variant if main else cfg.control.recipe,
        "recipe_overrides": {} if main else _control_overrides(cfg, variant),
        "seed": int(seed),
        "data": config.dump(cfg.data),
        "restart_on_change": True,  # a run directory of changed settings is moved aside, never mixed
        **{key: config.dump(getattr(section, key)) for key in RUN_KEYS},
        **{key: config.dump(getattr(section, key)) for key in RUN_OPTIONAL_KEYS if getattr(section, key) is not None},
    }


def parity_settings(cfg: PipelineConfig, name: str) -> dict[str, Any]:
    """The training settings of one parity comparison's run."""
    entry = cfg.identification.parity[name]
    return {
        "run_dir": os.path.join(cfg.results_dir, "identify", "parity", "runs", name),
        "model": entry.model,
        "model_overrides": dict(entry.model_overrides),
        "recipe": entry.recipe,
        "recipe_overrides": config.dump(entry.recipe_overrides),
        "seed": 0,
        "data": {**config.dump(cfg.data), "sequence_length": entry.sequence_length},
        "steps": entry.steps,
        "micro_batch": entry.batch_size or 1,
        "accumulation": 1,
        "log_every": 1,
        "checkpoint_every": entry.steps,
        "keep_every": 0,
        "optim": config.dump(cfg.training.optim),
    }


def throughput_settings(cfg: PipelineConfig, name: str) -> dict[str, Any]:
    """The settings of one throughput run (``ue5m3 throughput`` loads them with its strict loader): the section's
    shared settings and the run's own (``partition`` is the cluster's business and stays out)."""
    section, entry = cfg.throughput, cfg.throughput.runs[name]
    shared = {f.name: getattr(section, f.name) for f in dataclasses.fields(section) if f.name != "runs"}
    own = {f.name: getattr(entry, f.name) for f in dataclasses.fields(entry) if f.name != "partition"}
    return config.dump({"run": name, **shared, **own})


def job_config(section: Any, cls: type, **job: Any) -> dict[str, Any]:
    """The ``--config`` of a stage verb: the fields of ``cls`` that ``section`` (a typed section, or a mapping) holds,
    plus the job's own values; what neither names takes the default of ``cls``."""
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    if isinstance(section, Mapping):
        picked = {k: v for k, v in section.items() if k in names}
    else:
        picked = {k: getattr(section, k) for k in names if hasattr(section, k)}
    return config.dump({**picked, **job})


def kept_checkpoints(steps: int, checkpoint_every: int, keep_every: int, keep: int) -> set[int]:
    """The checkpoint steps a finished run still holds (the trainer's pruning rule)."""
    written = sorted({*range(checkpoint_every, steps + 1, checkpoint_every), steps})
    protected = set(range(keep_every, steps + 1, keep_every)) if keep_every else set()
    return set(written[-keep:]) | (protected & set(written))


LAUNCHER_FIELDS = ("nodes", "tasks", "procs_per_node", "signal_margin_s")

_SIGNAL = re.compile(r"--signal[= ](?:[RB]+:)?\w+(?:@(\d+))?")
TORCHRUN_SHUTDOWN_S = 30
"""torchrun's own shutdown timeout (torch 2.13): what ``{signal_margin_s}`` is when the job asks for no signal."""


def signal_margin_s(resources: Mapping[str, Any]) -> int:
    """The seconds between SLURM's warning signal and the job's time limit: the ``@N`` of the ``--signal`` option in
    the job's ``slurm_extra`` (SLURM's default 60 without ``@``), or :data:`TORCHRUN_SHUTDOWN_S` for a job that asks
    for none (it is signalled only by ``scancel`` or a preemption, then killed after the cluster's grace time)."""
    found = _SIGNAL.findall(str(resources.get("slurm_extra") or ""))
    if not found:
        return TORCHRUN_SHUTDOWN_S
    return int(found[-1] or 60)  # the last --signal wins, as on sbatch's command line


def training_slurm_extra(signal_margin_minutes: int) -> str:
    """The ``slurm_extra`` of a GPU training job: the whole nodes, one task (torchrun) per node, and SIGTERM to every
    process of the step the plan's signal margin before the time limit (quoted for the SLURM plugin's shell)."""
    return f"'--exclusive --ntasks-per-node=1 --signal=TERM@{int(signal_margin_minutes) * 60}'"


def launcher(template: str, resources: Mapping[str, Any]) -> str:
    """A training job's launch command from the config's ``launcher`` template and the job's resources.

    ``{nodes}`` is the ``nodes`` resource (1 without one), ``{tasks}`` the ``tasks`` resource (one per node without
    one), ``{procs_per_node}`` the GPUs per node of a ``gres: gpu:N`` request, else the ``procs_per_node``
    resource, else 1, and ``{signal_margin_s}`` the profile's signal margin (:func:`signal_margin_s`), which the
    paper's launcher gives torchrun as its ``--shutdown-timeout``: torchrun forwards SLURM's signal to its workers
    and kills them after that timeout, so they get the whole margin to write their checkpoint. All come from what
    the job asked for, so the command is the same inside SLURM (whose jobstep plugin strips ``SLURM_*`` variables)
    and outside it.
    """
    nodes = int(resources.get("nodes") or 1)
    procs = resources.get("procs_per_node")
    gres = str(resources.get("gres") or "")
    if gres.startswith("gpu:"):
        procs = int(gres.rsplit(":", 1)[-1])
    tasks = int(resources.get("tasks") or nodes)
    margin = signal_margin_s(resources)
    return template.format(nodes=nodes, tasks=tasks, procs_per_node=int(procs or 1), signal_margin_s=margin)


PLANNED_RULES = {"main": "train_run", "control": "train_control"}
"""The training rules whose jobs the plan checks before they are submitted (by run group)."""


def plan_job_name(group: str, variant: str, seed: int | str) -> str:
    """A training job's name in the plan: ``<rule>/<group>/<variant>/seed<seed>``."""
    return f"{PLANNED_RULES[group]}/{group}/{variant}/seed{seed}"


def plan_config(cfg: PipelineConfig) -> dict[str, Any]:
    """The ``--config`` of ``ue5m3 plan``: the ``plan`` section and every GPU-sized job of the pipeline (each
    training run of both groups, placed as its section says, each scale snapshot and each throughput run on a GPU)."""
    planned = []
    for group, section in (("main", cfg.training), ("control", cfg.control)):
        variants = cfg.training.recipes if group == "main" else CONTROL_VARIANTS
        for variant in variants:
            native = run_execution(cfg, group, variant) == "native_te"
            for seed in section.seeds:
                settings = run_settings(cfg, group, variant, seed)
                planned.append(
                    {
                        "name": plan_job_name(group, variant, seed),
                        "rule": PLANNED_RULES[group],
                        "kind": "train",
                        "settings": settings,
                        "sequence_length": cfg.data.sequence_length,
                        "steps": section.steps,
                        "nodes": section.nodes,
                        "gpus_per_node": section.gpus_per_node,
                        "partition": cfg.training.native_partition if native else section.partition,
                        "native": native,
                    }
                )
    evaluation, seed = cfg.evaluation, cfg.training.seeds[0]
    for recipe in evaluation.snapshot_recipes:  # one BF16 forward and backward of the checkpoint, every block
        planned.append(  # recomputed (ue5m3.evaluation.snapshot.run_snapshot), on one GPU or the CPU
            {
                "name": f"scale_snapshot/{recipe}/seed{seed}",
                "rule": "scale_snapshot",
                "kind": "snapshot",
                "settings": {
                    "run_dir": run_dir(cfg, "main", recipe, seed),
                    "model": cfg.training.model,
                    "model_overrides": dict(cfg.training.model_overrides),
                    "recipe": "bf16",
                    "seed": seed,
                    "steps": 1,
                    "micro_batch": 1,
                    "accumulation": 1,
                    "data": config.dump(cfg.data),
                    "activation_checkpointing": "every_block",
                    "loss_chunk": HEAD_CHUNK,
                },
                "sequence_length": cfg.data.sequence_length,
                "steps": 1,
                "gpus_per_node": evaluation.gpus,
                "partition": evaluation.partition if evaluation.gpus else None,
            }
        )
    tp = cfg.throughput
    for name, entry in tp.runs.items():
        if not entry.on_gpu:
            continue
        planned.append(
            {
                "name": f"throughput/{name}",
                "rule": "throughput",
                "kind": "throughput",
                "settings": {
                    "run_dir": os.path.join(cfg.results_dir, "throughput", name),
                    "model": tp.model,
                    "model_overrides": dict(tp.model_overrides),
                    "recipe": "bf16",
                    "seed": tp.seed,
                    "steps": tp.warmup_steps + tp.measured_steps,
                    "micro_batch": tp.batch_size,
                    "accumulation": 1,
                    "data": {**config.dump(cfg.data), "sequence_length": tp.sequence_length},
                },
                "sequence_length": tp.sequence_length,
                "steps": tp.measured_steps,
                "gpus_per_node": 1,
                "partition": entry.partition,
                "native": entry.execution == "native_te",
                "throughput_recipes": list(entry.recipes),
            }
        )
    return config.dump({**config.dump(cfg.plan), "jobs": planned})
