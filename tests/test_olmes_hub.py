"""MMLU-Pro (mmlu_pro_mc, ue5m3.evaluation.olmes.hub): lm-eval's built-in leaderboard_mmlu_pro, which needs the
Hugging Face hub; refused clearly without it, and run end to end on a local copy of its config."""

from __future__ import annotations

import pytest
import torch

from helpers.olmes import lm_eval_mmlu_pro_dir
from ue5m3.evaluation import olmes


@pytest.fixture
def no_network(monkeypatch):
    """Any socket connection or name lookup fails at once, so nothing here can reach (or wait on) the network."""
    import socket

    def refuse(*args, **kwargs):
        raise OSError("network access is disabled in this test")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)


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
            cfg=olmes.DownstreamConfig(tasks=("arc_easy", "mmlu_pro_mc")),
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


def mmlu_pro_block(row: dict) -> str:
    """lm-eval's leaderboard_mmlu_pro rendering of a question (utils.doc_to_text): no "Question: ", no leading space."""
    return (
        row["question"] + "\n" + "".join(f"{'ABCDEFGHIJ'[j]}. {o}\n" for j, o in enumerate(row["options"])) + "Answer:"
    )


def test_mmlu_pro_task_config_runs_end_to_end_offline_on_a_local_copy(local_mmlu_pro, monkeypatch):
    """The MC scoring path of lm-eval's leaderboard_mmlu_pro config (5-shot, letters A-J, acc) and the aggregate key."""
    from lm_eval.api.instance import Instance

    from helpers.lm_eval_tools import ByteTokenizer, Unit
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
