"""Downstream evaluation of a trained run (``olmes.evaluate_run``) and the ``evaluate-downstream``/``lm-eval`` verbs."""

import json
import sys

import pytest

from helpers.olmes import needs_wheel
from ue5m3 import cli
from ue5m3.data import data_paths
from ue5m3.evaluation import olmes


@pytest.mark.parametrize("verb", ["evaluate-downstream", "lm-eval"])
def test_verb_help(verb, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([verb, "--help"])
    assert exit_info.value.code == 0
    assert f"ue5m3 {verb}" in capsys.readouterr().out


def test_lm_eval_verb_passes_the_remaining_arguments_to_lm_eval(monkeypatch):
    import lm_eval.__main__ as lm_main
    from lm_eval.api.registry import get_model

    seen = []
    monkeypatch.setattr(lm_main, "cli_evaluate", lambda: seen.append(list(sys.argv)))
    args = ["--model", "ue5m3", "--model_args", "run_dir=r,policy=bf16", "--tasks", "t"]
    assert cli.main(["lm-eval", *args]) == 0
    assert cli.main(["lm-eval", "--", "run", "--help"]) == 0
    assert seen == [["lm-eval", *args], ["lm-eval", "run", "--help"]]
    assert get_model("ue5m3").__name__ == "UE5M3LM"


def test_unknown_task_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown downstream task"):
        olmes.build_tasks(tmp_path / "tasks", ["nope"])


@needs_wheel
def test_evaluate_run_writes_scores_aggregates_and_provenance(tiny_run, tmp_path):
    run_dir, data = tiny_run
    out = tmp_path / "out" / "cold.json"
    tasks = ["arc_easy", "mmlu_anatomy"]
    code = cli.main(
        [
            "evaluate-downstream",
            "--run-dir", str(run_dir),
            "--policy", "cold_d50_replay",
            "--tasks-dir", str(tmp_path / "tasks"),
            "--config", json.dumps({"tasks": tasks, "examples": 6, "limit": 4}),
            "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    record = json.loads(out.read_text())
    assert set(record["scores"]) == {"arc_easy", "mmlu_anatomy"}
    assert set(record["scores"]["arc_easy"]) == {"mc", "rc"}
    assert all(0 <= v <= 1 for t in record["scores"].values() for v in t.values())
    aggregates = record["aggregates"]
    assert aggregates["core9"]["_macro"] is None  # not all nine tasks
    assert aggregates["core9_evaluated"]["tasks"] == ["arc_easy"]
    assert aggregates["mmlu"]["best"] == max(aggregates["mmlu"]["mc"], aggregates["mmlu"]["rc"])
    assert record["examples"] == dict.fromkeys(record["lm_eval_tasks"], 4)
    assert record["policy"] == "cold_d50_replay" and record["checkpoint_step"] == 2
    assert record["work_units"] == record["forward_units"] > 0
    assert record["tokenizer"] == str(data_paths(data).tokenizer)
    assert record["config"]["max_length"] == data.sequence_length
    # same inputs, same scores and request order (fixed order, fresh policy state)
    again = olmes.evaluate_run(
        run_dir,
        tmp_path / "again.json",
        policy="cold_d50_replay",
        task_dir=tmp_path / "tasks",
        cfg=olmes.DownstreamConfig(tasks=tuple(tasks), examples=6, limit=4),
    )
    assert again["scores"] == record["scores"] and again["tasks_sha256"] == record["tasks_sha256"]
    with pytest.raises(ValueError, match="built with n=6"):
        olmes.build_tasks(tmp_path / "tasks", tasks, n=7)
