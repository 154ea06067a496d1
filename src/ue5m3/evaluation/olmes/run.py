"""Running the downstream evaluation: the offline lm-eval call, the shared task dir, and one checkpoint end to end.

:func:`run_suite` scores an lm-eval ``LM`` on tasks built in a task dir (offline variables set for the call) and
adds the aggregates. Task names ``arc_easy`` ... (Core 9 folders), ``mmlu`` (all subjects) or ``mmlu_<subject>``
select what :func:`build_tasks` writes (both formulations each) into a task dir shared by all runs (built once under
a file lock; a ``ue5m3_build.json`` sidecar records ``n`` and the seed, so a dir built with other settings is
refused; the dir names no absolute path, so it can be moved: :mod:`~ue5m3.evaluation.olmes.tasks`); the hub task
``mmlu_pro_mc`` has nothing to build. :func:`evaluate_run` scores a checkpoint under one
inference policy through :class:`ue5m3.evaluation.lm_eval.UE5M3LM`, in lm-eval's fixed request order,
``batch_size`` requests per work unit: the hub check first, then the task dir, the continuation-length check, the
offline suites, and the hub suite (:mod:`ue5m3.evaluation.olmes.hub`) in a separate lm-eval call.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ue5m3 import config
from ue5m3.config import Range
from ue5m3.evaluation.olmes.aggregate import aggregate
from ue5m3.evaluation.olmes.hub import HUB_MANIFEST, HUB_TASKS, check_hub_access, run_hub_suite
from ue5m3.evaluation.olmes.tasks import (
    CORE9,
    MANIFEST,
    SUBSAMPLE_SEED,
    build_core9_tasks,
    build_mmlu_tasks,
    check_continuation_lengths,
    mmlu_subjects,
    write_configs,
)

__all__ = ["DownstreamConfig", "BUILD_RECORD", "run_suite", "build_tasks", "evaluate_run"]


@dataclass(frozen=True, kw_only=True)
class DownstreamConfig:
    """Settings of ``ue5m3 evaluate-downstream`` (the pipeline's ``evaluation.downstream``).

    Attributes:
        tasks: Core 9 task folders (``arc_easy``, ..., ``csqa``, ``socialiqa``), ``mmlu`` (every subject),
            ``mmlu_<subject>``, or the hub task ``mmlu_pro_mc`` (lm-eval's ``leaderboard_mmlu_pro``).
        examples: examples per task subsampled into the shared task dir; null: every example.
        seed: seed of that subsample (the paper's OLMES subsample seed).
        limit: lm-eval's per-task limit on top of the subsample (tests); null: none.
        batch_size: requests per forward, the inference policy's work unit (the paper: 8).
        max_length: most tokens per row; null: the run's training sequence length (longer inputs are
            left-truncated).
        force_bf16: allow policy ``bf16`` on a quantized run.
    """

    tasks: tuple[str, ...]
    examples: int | None = None
    seed: int = SUBSAMPLE_SEED
    limit: int | None = None
    batch_size: int = 8
    max_length: int | None = None
    force_bf16: bool = False

    RANGES: ClassVar[dict[str, Range]] = {
        "examples": Range(1, 10**7, note="examples per task, null: all"),
        "seed": Range(0, 2**63 - 1, note="a seed"),
        "limit": Range(1, 10**7, note="lm-eval's per-task limit, null: none"),
        "batch_size": Range(1, 2**16, note="requests per forward; the paper: 8"),
        "max_length": Range(1, 2**20, note="tokens per row, null: the run's sequence length"),
    }

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError("tasks: at least one task, got []")
        for key in ("examples", "limit", "max_length"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ValueError(f"{key}: a positive int or null, got {value!r}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size: a positive int, got {self.batch_size!r}")


def run_suite(
    lm: Any,
    task_dir: str | os.PathLike[str],
    tasks: Sequence[str] | None = None,
    limit: int | float | None = None,
    *,
    num_fewshot: int = 0,
    **simple_evaluate_kwargs: Any,
) -> dict[str, Any]:
    """Evaluate ``lm`` (an lm-eval ``LM`` instance) offline on tasks built in ``task_dir``; add the aggregates.

    ``num_fewshot`` stays 0 for tasks built here (their shots are inside the context). HF_HUB_OFFLINE and
    HF_DATASETS_OFFLINE are set to 1 for the call and restored afterwards.

    Returns:
        ``{"scores": {task: primary score}, "aggregates": aggregate(...), "results": lm-eval's results dict}``.
    """
    import lm_eval
    from lm_eval.tasks import TaskManager

    manifest = json.loads((Path(task_dir) / MANIFEST).read_text())
    names = list(manifest) if tasks is None else list(tasks)
    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    os.environ.update({k: "1" for k in saved})
    try:
        out = lm_eval.simple_evaluate(
            model=lm,
            tasks=names,
            task_manager=TaskManager(include_path=str(task_dir), include_defaults=False),
            num_fewshot=num_fewshot,
            limit=limit,
            **simple_evaluate_kwargs,
        )
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    results = out["results"]
    scores = {n: float(results[n][f"{manifest[n]['metric']},none"]) for n in names}
    return {"scores": scores, "aggregates": aggregate(scores, manifest), "results": results}


BUILD_RECORD = "ue5m3_build.json"
"""Sidecar in a task dir: ``{"n": .., "seed": .., "tasks": [...]}`` of what :func:`build_tasks` wrote."""


def _task_sets(tasks: Iterable[str]) -> tuple[list[str], list[str], list[str]]:
    """Split downstream task names into Core 9 tasks, MMLU subjects and hub tasks (:data:`HUB_TASKS`)."""
    core, subjects, hub = [], [], []
    known = None
    for name in tasks:
        if name in CORE9:
            core.append(name)
        elif name in HUB_TASKS:
            hub.append(name)
        elif name == "mmlu":
            subjects.extend(mmlu_subjects())
        elif name.startswith("mmlu_"):
            known = set(mmlu_subjects()) if known is None else known
            if name[5:] not in known:
                raise ValueError(
                    f"unknown MMLU subject {name[5:]!r} in {name!r}; MMLU-Pro (from the hub) is mmlu_pro_mc"
                )
            subjects.append(name[5:])
        else:
            raise ValueError(
                f"unknown downstream task {name!r}; expected a Core 9 task {CORE9}, mmlu, mmlu_<subject> or "
                f"a hub task {tuple(HUB_TASKS)}"
            )
    return list(dict.fromkeys(core)), list(dict.fromkeys(subjects)), list(dict.fromkeys(hub))


def check_task_names(tasks: Iterable[str]) -> None:
    """Refuse a downstream task name that is no Core 9 task, ``mmlu``, ``mmlu_<subject>`` or hub task. The MMLU
    subjects are checked against the OLMES task data when those are here (before ``ue5m3 fetch-olmes-data``, only
    the form ``mmlu_<subject>`` is; the job checks the subject).

    Raises:
        ValueError: naming the task and the accepted names.
    """
    tasks = list(tasks)
    try:
        _task_sets(tasks)
    except ImportError:  # no task data yet: every name but the MMLU subjects
        _task_sets([t for t in tasks if t != "mmlu" and not t.startswith("mmlu_")])


def build_tasks(
    task_dir: str | os.PathLike[str], tasks: Iterable[str], *, n: int | None = None, seed: int = SUBSAMPLE_SEED
) -> list[str]:
    """Make sure ``task_dir`` holds the MC and RC lm-eval tasks of ``tasks``; build what is missing.

    Safe to call from concurrent processes (an exclusive ``fcntl`` lock on ``<task_dir>.lock``). Hub tasks
    (``mmlu_pro_mc``) are accepted and have nothing to build: lm-eval's built-in task downloads its data when run.

    Returns:
        The lm-eval task names of the offline ``tasks`` (``ue5m3_<task>_<mc|rc>``, ``ue5m3_mmlu_<subject>_<mc|rc>``).

    Raises:
        ValueError: an unknown task, or ``task_dir`` was built with another ``n`` or seed.
        FileNotFoundError: the wheel lacks a task's OLMES requests.
    """
    import fcntl

    core, subjects, _ = _task_sets(tasks)
    out = Path(task_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    names = [f"ue5m3_{t}_{f}" for t in core for f in ("mc", "rc")]
    names += [f"ue5m3_mmlu_{s}_{f}" for s in subjects for f in ("mc", "rc")]
    with open(out.parent / f"{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record_path = out / BUILD_RECORD
        record = json.loads(record_path.read_text()) if record_path.exists() else {"n": n, "seed": seed, "tasks": []}
        if (record["n"], record["seed"]) != (n, seed):
            raise ValueError(
                f"{out} was built with n={record['n']}, seed={record['seed']}; asked for n={n}, seed={seed} "
                "(use another task dir)"
            )
        manifest_path = out / MANIFEST
        have = set(json.loads(manifest_path.read_text())) if manifest_path.exists() else set()
        if have:  # a folder built by an earlier version (YAMLs naming absolute paths): made relocatable
            write_configs(out)
        missing_core = [t for t in core if not {f"ue5m3_{t}_mc", f"ue5m3_{t}_rc"} <= have]
        missing_mmlu = [s for s in subjects if not {f"ue5m3_mmlu_{s}_mc", f"ue5m3_mmlu_{s}_rc"} <= have]
        if missing_core:
            build_core9_tasks(out, missing_core, n=n, seed=seed)
        if missing_mmlu:
            build_mmlu_tasks(out, missing_mmlu, n=n, seed=seed)
        record["tasks"] = sorted(set(record["tasks"]) | set(names))
        out.mkdir(parents=True, exist_ok=True)
        record_path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return names


def _tasks_sha256(task_dir: Path, names: Sequence[str]) -> str:
    import hashlib

    digest = hashlib.sha256()
    for name in sorted(names):
        digest.update(name.encode() + b"\0" + (task_dir / f"{name}.jsonl").read_bytes())
    return digest.hexdigest()


def evaluate_run(
    run_dir: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    policy: str,
    task_dir: str | os.PathLike[str],
    cfg: DownstreamConfig,
    step: int | None = None,
) -> dict[str, Any]:
    """Score one checkpoint on the offline suites (and any hub task) and write the JSON result atomically.

    Args:
        run_dir: the training run directory; its tokenizer is ``<data.data_dir>/tokenizer.json`` (or
            ``data.tokenizer_path``).
        out: the JSON result to write.
        policy: the inference policy (``ue5m3.evaluation.inference.InferencePolicy`` value).
        task_dir: where the lm-eval tasks are (built by :func:`build_tasks` if missing).
        cfg: the tasks and settings (:class:`DownstreamConfig`). A hub task is checked with
            :func:`check_hub_access` before anything else and run after the offline suites in a separate lm-eval
            call; the subsample is not applied to it.
        step: checkpoint step (default: the newest).

    Returns:
        The record written: ``scores`` (task -> formulation -> primary score; ``mmlu_pro_mc`` -> ``{"mc": acc}``),
        ``aggregates`` (:func:`aggregate`, with ``mmlu_pro_mc`` the MMLU-Pro accuracy or ``None``, plus
        ``core9_evaluated`` = macro of max(MC, RC) over the Core 9 tasks scored), the checkpoint identity, the
        hub datasets' revisions and the request order and work-unit count.

    Raises:
        HubAccessError: a hub task was asked for and the hub cannot be used (before any model work).
    """
    from ue5m3.artifacts import provenance, write_json
    from ue5m3.data import data_paths, open_tokenizer
    from ue5m3.evaluation.inference import load_for_inference
    from ue5m3.evaluation.lm_eval import UE5M3LM
    from ue5m3.training.config import read_run_config

    tasks, limit = cfg.tasks, cfg.limit
    _, _, hub = _task_sets(tasks)
    hub_revisions = check_hub_access(hub) if hub else {}
    names = build_tasks(task_dir, tasks, n=cfg.examples, seed=cfg.seed)
    run = read_run_config(run_dir)
    data = run.require_data()
    tokenizer = open_tokenizer(data)
    length = int(cfg.max_length) if cfg.max_length is not None else int(data.sequence_length)
    check_continuation_lengths(task_dir, names, tokenizer.encode, length, limit)
    loaded = load_for_inference(run_dir, step, policy=policy, force_bf16=cfg.force_bf16)
    lm = UE5M3LM(loaded, tokenizer, batch_size=cfg.batch_size, max_length=length)
    if names:
        suite = run_suite(lm, task_dir, names, limit=limit, log_samples=False)
        manifest = json.loads((Path(task_dir) / MANIFEST).read_text())
    else:
        suite, manifest = {"scores": {}, "aggregates": aggregate({}, {})}, {}
    scores: dict[str, dict[str, float]] = {}
    for name, score in suite["scores"].items():
        m = manifest[name]
        key = m["task"] if m["suite"] == "core9" else f"mmlu_{m['task']}"
        scores.setdefault(key, {})[m["formulation"]] = score
    aggregates = suite["aggregates"]
    counts = {
        name: manifest[name]["n_docs"] if limit is None else min(manifest[name]["n_docs"], limit) for name in names
    }
    hub_names = [HUB_TASKS[t] for t in hub]
    if hub:
        hub_suite = run_hub_suite(lm, hub, limit=limit, check_hub=False, log_samples=False)
        for name, score in hub_suite["scores"].items():
            m = HUB_MANIFEST[name]
            scores[m["task"]] = {m["formulation"]: score}
        aggregates["mmlu_pro_mc"] = hub_suite["aggregates"]["mmlu_pro_mc"]
        counts.update(hub_suite["n_samples"])
    core = {t: v["best"] for t, v in aggregates["core9"].items() if t != "_macro"}
    aggregates["core9_evaluated"] = {"tasks": sorted(core), "macro": sum(core.values()) / len(core) if core else None}
    settings = {
        "run_dir": str(run_dir),
        "step": step,
        "policy": str(policy),
        "task_dir": str(task_dir),
        **config.dump(cfg),
        "max_length": length,
    }
    record = provenance(
        "evaluate-downstream",
        settings,
        **loaded.identity,
        tokenizer=str(data_paths(data).tokenizer),
        lm_eval_tasks=names + hub_names,
        tasks_sha256=_tasks_sha256(Path(task_dir), names),
        hub_datasets=hub_revisions,
        examples=counts,
        request_order="lm-eval's order, never re-sorted; batch k of the run is the policy's work unit k",
        work_units=lm.n_units,
        forward_units=loaded.units,
        scores=scores,
        aggregates=aggregates,
    )
    write_json(out, record)
    return record
