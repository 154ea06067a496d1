"""Running the downstream evaluation (ue5m3.evaluation.olmes.run): the offline lm-eval suites end to end on the
random debug model, the shared task dir, and evaluate_run with the hub task."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers.olmes import DOCS_PER_TASK, needs_wheel, read_docs
from ue5m3.evaluation import olmes
from ue5m3.evaluation.olmes import run as olmes_run
from ue5m3.evaluation.olmes import tasks as olmes_tasks


@needs_wheel
def test_lm_eval_runs_offline_end_to_end_and_scores_match_direct_loglikelihoods(tmp_path):
    from helpers.lm_eval_tools import ByteTokenizer, Unit
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


@pytest.fixture(scope="module")
def winogrande_hellaswag(tmp_path_factory):
    """WinoGrande and HellaSwag, MC and RC, ``DOCS_PER_TASK`` docs each: the same files as test_olmes_tasks's Core 9
    fixture holds for them (the subsample is per task and deterministic)."""
    task_dir = tmp_path_factory.mktemp("core9")
    olmes.build_core9_tasks(task_dir, ["winogrande", "hellaswag"], n=DOCS_PER_TASK)
    return task_dir


@needs_wheel
def test_winogrande_and_hellaswag_run_offline_end_to_end_with_olmes_scoring(winogrande_hellaswag):
    """Multiple-input WinoGrande RC (context per choice), WinoGrande MC and HellaSwag RC (per-char) via lm-eval."""
    from lm_eval.api.instance import Instance

    from helpers.lm_eval_tools import ByteTokenizer, Unit
    from ue5m3 import models
    from ue5m3.evaluation.lm_eval import UE5M3LM

    task_dir = winogrande_hellaswag
    names = ["ue5m3_winogrande_mc", "ue5m3_winogrande_rc", "ue5m3_hellaswag_rc"]
    net = models.build("dense_debug", device="cpu", generator=torch.Generator().manual_seed(0)).eval()
    lm = UE5M3LM(Unit(net), ByteTokenizer(), batch_size=8, max_length=512)
    out = olmes.run_suite(lm, task_dir, names, log_samples=False)
    assert lm.n_units == DOCS_PER_TASK * (2 + 2 + 4) // 8

    manifest = json.loads((task_dir / olmes.MANIFEST).read_text())
    for name in names:
        hits = 0
        for d in read_docs(task_dir, name):
            pairs = olmes_tasks._requests_of(d)
            lls = [s for s, _ in lm.loglikelihood([Instance("loglikelihood", {}, p, 0) for p in pairs])]
            if manifest[name]["metric"] == "acc_norm":
                lls = [ll / len(cont) for ll, (_, cont) in zip(lls, pairs, strict=True)]
            hits += max(range(len(lls)), key=lls.__getitem__) == d["gold"]
        assert out["scores"][name] == pytest.approx(hits / DOCS_PER_TASK)
    assert out["aggregates"]["core9"]["winogrande"]["best"] == max(
        out["scores"]["ue5m3_winogrande_mc"], out["scores"]["ue5m3_winogrande_rc"]
    )
    assert out["aggregates"]["core9"]["_macro"] is None


def test_mmlu_pro_mc_is_a_downstream_task_with_nothing_to_build(tmp_path):
    assert olmes.HUB_TASKS == {"mmlu_pro_mc": "leaderboard_mmlu_pro"}
    assert olmes_run._task_sets(["arc_easy", "mmlu_pro_mc", "arc_easy", "mmlu_pro_mc"]) == (
        ["arc_easy"],
        [],
        ["mmlu_pro_mc"],
    )
    assert olmes.build_tasks(tmp_path / "tasks", ["mmlu_pro_mc"]) == []  # built in lm-eval, downloaded when run
    for wrong in ("mmlu_pro", "nope"):  # the errors point at the right name
        with pytest.raises(ValueError, match="mmlu_pro_mc"):
            olmes_run._task_sets([wrong])


@pytest.mark.parametrize(
    "tasks",
    [["mmlu_pro_mc"], pytest.param(["arc_easy", "mmlu_pro_mc"], marks=needs_wheel)],
    ids=["alone", "with_core9"],
)
def test_evaluate_run_puts_mmlu_pro_beside_the_offline_suites(
    local_mmlu_pro, tiny_bf16_run, tmp_path, monkeypatch, tasks
):
    """evaluate_run with the hub task (its config pointed at the local copy, the hub check stubbed)."""
    import functools

    manager, rows = local_mmlu_pro
    run_dir, _ = tiny_bf16_run
    checked = []
    monkeypatch.setattr(  # evaluate_run looks both up in ue5m3.evaluation.olmes.run
        olmes_run, "check_hub_access", lambda t: checked.append(list(t)) or {"TIGER-Lab/MMLU-Pro": "c0ffee"}
    )
    monkeypatch.setattr(olmes_run, "run_hub_suite", functools.partial(olmes.run_hub_suite, task_manager=manager))
    record = olmes.evaluate_run(
        run_dir,
        tmp_path / "out.json",
        policy="bf16",
        task_dir=tmp_path / "tasks",
        cfg=olmes.DownstreamConfig(tasks=tuple(tasks), examples=4, limit=3),
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


def _no_absolute_path_in(task_dir) -> list[str]:
    """Files of ``task_dir`` that name an absolute path of the folder (or of its parent)."""
    here = str(task_dir.resolve().parent)
    return [p.name for p in task_dir.iterdir() if p.is_file() and here in p.read_text(errors="replace")]


@needs_wheel
def test_a_task_folder_scores_the_same_after_it_is_moved(tmp_path):
    """The YAMLs name their docs relative to the folder (through its loader): built in one place, moved, scored from
    the new place with the same scores; the sidecars move along and the folder is not rebuilt there."""
    from helpers.lm_eval_tools import ByteTokenizer, Unit
    from ue5m3 import models
    from ue5m3.evaluation.lm_eval import UE5M3LM

    built = tmp_path / "a" / "tasks"
    wanted = ["arc_easy", "winogrande", "mmlu_anatomy"]  # shared contexts, multiple-input WinoGrande RC, MMLU
    names = olmes.build_tasks(built, wanted, n=3)
    assert _no_absolute_path_in(built) == []
    net = models.build("dense_debug", device="cpu", generator=torch.Generator().manual_seed(0)).eval()
    here = olmes.run_suite(UE5M3LM(Unit(net), ByteTokenizer(), max_length=4096), built, names, log_samples=False)
    sha = olmes_run._tasks_sha256(built, names)

    moved = tmp_path / "b" / "elsewhere"
    moved.parent.mkdir()
    built.rename(moved)
    docs = {p.name: p.stat().st_mtime_ns for p in moved.glob("*.jsonl")}
    assert olmes.build_tasks(moved, wanted, n=3) == names  # the manifest and build record moved with it
    assert {p.name: p.stat().st_mtime_ns for p in moved.glob("*.jsonl")} == docs  # nothing rebuilt
    there = olmes.run_suite(UE5M3LM(Unit(net), ByteTokenizer(), max_length=4096), moved, names, log_samples=False)
    assert there["scores"] == here["scores"] and there["aggregates"] == here["aggregates"]
    assert olmes_run._tasks_sha256(moved, names) == sha


@needs_wheel
def test_a_folder_built_with_absolute_paths_is_rewritten_relocatable(tmp_path):
    """A folder written by an earlier version (YAMLs with ``dataset_path: json`` and an absolute ``data_files``, no
    loader) is made relocatable by the next build_tasks; its docs stay as they are."""
    names = olmes.build_tasks(tmp_path / "tasks", ["arc_easy"], n=2)
    old = tmp_path / "tasks" / f"{names[0]}.yaml"
    current = old.read_text()
    absolute = json.dumps(str((tmp_path / "tasks" / f"{names[0]}.jsonl").resolve()))
    old.write_text(
        current.replace(
            f'custom_dataset: !function ue5m3_task_data.load\ndataset_kwargs:\n  data_file: "{names[0]}.jsonl"\n',
            f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {absolute}\n",
        )
    )
    (tmp_path / "tasks" / olmes.LOADER).unlink()
    assert "dataset_path: json" in old.read_text()
    olmes.build_tasks(tmp_path / "tasks", ["arc_easy"], n=2)
    assert old.read_text() == current and (tmp_path / "tasks" / olmes.LOADER).is_file()
    assert _no_absolute_path_in(tmp_path / "tasks") == []


def test_the_folder_loader_imports_nothing_of_ue5m3():
    """lm-eval alone reads a task folder (``lm_eval --include_path``): its loader needs datasets only."""
    import ast

    from ue5m3.evaluation.olmes import task_data

    tree = ast.parse(Path(task_data.__file__).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= {"__future__", "pathlib", "typing", "datasets"}
