"""Fault injection (issue 28, item 4; docs/reliability.md lists every case class with its outcome).

Each case feeds the project something wrong and asserts that it is refused before any work with a message naming
the key or the file, or recovered from, and that nothing valid was deleted:

* bad settings, generated from the ranges the config dataclasses declare (``config.Range``): every number of the
  default pipeline config, every run setting and optimizer setting, just outside its range, far outside it and
  NaN; a numeric field added to any config section is covered when it is added, and one without a range fails
  the coverage test;
* checkpoint corruptions: truncated and flipped files, malformed manifests, renamed, foreign and half-written
  folders, another run's checkpoint, an unreadable file, no write permission, a read-only file system and a full
  disk (a small tmpfs; mounting needs root, elsewhere those cases skip, saying why);
* kill points inside a save: the disk as a SIGKILL at each point of the save leaves it, resumed;
* torn and altered data records (shard index, offsets, corpus manifest, tokenizer, the resolved run config) and
  data prepared for another vocabulary;
* the command line: thread counts, and a write the file system refuses (exit 74).
"""

from __future__ import annotations

import ast
import contextlib
import copy
import dataclasses
import errno
import functools
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
import types
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import torch

from helpers.data import fixture_config
from helpers.files import file_digests
from helpers.threads import torch_threads
from helpers.training import same_tensors, token_stream, train_config
from ue5m3 import config, pipeline
from ue5m3.artifacts import StorageError, TornFileError
from ue5m3.data import build_data, check_prepared, open_data
from ue5m3.pipeline import check, jobs
from ue5m3.pipeline.sections import PipelineConfig
from ue5m3.training import checkpoint
from ue5m3.training import loop as train
from ue5m3.training.config import OptimConfig, TrainConfig, read_run_config
from ue5m3.training.identity import RunIdentityError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[1]
SOURCE = "config/config.yaml"


@functools.cache
def _shipped() -> dict:
    return config.read_yaml(ROOT / "config" / "config.yaml")


def _default() -> dict:
    """The shipped pipeline config, a copy of its one reading (parsing it takes longer than refusing a bad value)."""
    return copy.deepcopy(_shipped())


# ----- bad settings, generated from the dataclasses' ranges ---------------------------------------------


def _numeric(tp: object) -> bool:
    """Whether an annotation holds numbers (an int or float, itself or inside a list, union or mapping)."""
    if tp in (int, float):
        return True
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType, tuple, list, Mapping, dict):
        return any(_numeric(a) for a in args if a is not Ellipsis)
    return False


def _dataclasses_in(tp: object) -> Iterator[type]:
    if dataclasses.is_dataclass(tp):
        yield tp  # type: ignore[misc]
    for arg in typing.get_args(tp):
        yield from _dataclasses_in(arg)


def _verb_configs() -> set[type]:
    """The dataclass each verb loads its ``--config`` into (read from the CLI's sources, so a new verb counts)."""
    found = set()
    for path in sorted((ROOT / "src" / "ue5m3" / "cli").glob("*.py")):
        tree = ast.parse(path.read_text())
        names = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ue5m3"):
                for alias in node.names:
                    names[alias.asname or alias.name] = (node.module, alias.name)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "load_stage_config":
                dotted = ast.unparse(node.args[0]).split(".")
                module, attr = names[dotted[0]]
                value = __import__(module, fromlist=[attr])
                for part in [attr, *dotted[1:]]:
                    value = getattr(value, part)
                found.add(value)
    return found


def _config_classes() -> list[type]:
    """Every config dataclass reachable from the pipeline config, the run config and the verbs' configs."""
    seen: dict[type, None] = {}
    pending = [PipelineConfig, TrainConfig, *sorted(_verb_configs(), key=lambda c: c.__name__)]
    while pending:
        cls = pending.pop()
        if cls in seen:
            continue
        seen[cls] = None
        for tp in config.field_types(cls).values():
            pending.extend(_dataclasses_in(tp))
    return sorted(seen, key=lambda c: f"{c.__module__}.{c.__name__}")


CLASSES = _config_classes()
RESTATED = check.restated()


def _range_of(cls: type, name: str) -> config.Range | None:
    """The range of a field: its own, or that of the job setting it restates."""
    own = config.ranges(cls).get(name)
    if own is not None:
        return own
    job, key = RESTATED.get(cls, {}).get(name, (None, None))
    return None if job is None else config.ranges(job)[key]


def _numbers(value: object) -> list[float]:
    if isinstance(value, list | tuple):
        return [n for item in value for n in _numbers(item)]
    if isinstance(value, Mapping):
        return [n for item in value.values() for n in _numbers(item)]
    return [] if value is None or isinstance(value, bool | str) else [value]  # type: ignore[list-item]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_numeric_setting_declares_the_range_a_real_run_could_use(cls):
    """A new int or float field of a config section fails here until it has a range (its own, or the job's it
    restates), and every default lies in its range."""
    hints = config.field_types(cls)
    assert set(config.ranges(cls)) <= set(hints), f"{cls.__name__}.RANGES names no field"
    for f in dataclasses.fields(cls):
        if not f.init or not _numeric(hints[f.name]):
            continue
        bounds = _range_of(cls, f.name)
        assert bounds is not None, f"{cls.__name__}.{f.name} has no range: declare one in {cls.__name__}.RANGES"
        if config.has_default(f):
            default = config.default_of(f)
            assert all(n in bounds for n in _numbers(default)), f"{cls.__name__}.{f.name}: default {default!r}"


def _outside(bounds: config.Range, integer: bool) -> list[float]:
    """Values just outside a range, far above it and (floats) not a number."""
    bad: list[float] = []
    if bounds.low is not None:
        bad.append(bounds.low if bounds.low_open else bounds.low - 1)
    if bounds.high is not None and bounds.high != math.inf:
        step = 1 if integer else max(1.0, abs(bounds.high))  # a float step that moves a float as large as the bound
        bad.append(bounds.high if bounds.high_open else bounds.high + step)
        bad.append(2**64 if integer else 1e300)
    floats = [math.nan] if not integer else []
    return floats + [int(v) if integer else float(v) for v in bad]


def _only_ints(tp: object) -> bool:
    return not _has_float(tp)


def _has_float(tp: object) -> bool:
    return tp is float or any(_has_float(a) for a in typing.get_args(tp) if a is not Ellipsis)


def _pipeline_cases() -> list[tuple[str, object, str]]:
    """(dotted key, bad value, the label the message must name) for every number of the default pipeline config."""
    loaded = pipeline.load(_default(), source=SOURCE)
    cases = []
    for path, section in check._sections_with_paths(loaded, ""):  # what the pipeline check walks
        hints = config.field_types(type(section))
        for f in dataclasses.fields(section):
            bounds = _range_of(type(section), f.name)
            if bounds is None or not _numeric(hints[f.name]):
                continue
            key = f"{path}.{f.name}" if path else f.name
            current = getattr(section, f.name)
            listed = isinstance(current, tuple) and (typing.get_origin(hints[f.name]) is tuple or current)
            for bad in _outside(bounds, _only_ints(hints[f.name])):
                if listed:
                    cases.append((key, [bad, *config.dump(current)[1:]], f"{key}[0]"))
                else:
                    cases.append((key, bad, key))
    return cases


PIPELINE_CASES = _pipeline_cases()


def _set(cfg: dict, dotted: str, value: object) -> None:
    *parents, last = dotted.split(".")
    node = cfg
    for key in parents:
        if not isinstance(node.get(key), dict):
            node[key] = {}  # a section the file leaves to its defaults
        node = node[key]
    node[last] = value


def test_the_generated_cases_cover_every_section_of_the_pipeline_config():
    sections = {key.split(".")[0] for key, _, _ in PIPELINE_CASES}
    numeric = {
        name
        for name, tp in config.field_types(PipelineConfig).items()
        if any(_numeric(t) for c in _dataclasses_in(tp) for t in config.field_types(c).values())
    }
    assert numeric <= sections and len(PIPELINE_CASES) > 250


@pytest.mark.parametrize(("key", "value", "label"), PIPELINE_CASES, ids=[f"{k}={v!r}" for k, v, _ in PIPELINE_CASES])
def test_a_pipeline_setting_outside_its_range_is_refused_naming_its_key(key, value, label):
    cfg = _default()
    _set(cfg, key, value)
    with pytest.raises(config.ConfigError) as err:
        pipeline.load(cfg, source=SOURCE)
    message = str(err.value)  # the range's message, or the section's own check of the key (seeds: non-negative)
    number = value[0] if isinstance(value, list) else value
    assert "nothing was started" in message and f"\n  {label}: " in message and f"got {number!r}" in message, message


def _run_settings() -> dict:
    loaded = pipeline.load(_default(), source=SOURCE)
    return jobs.run_settings(loaded, "main", loaded.training.recipes[0], loaded.training.seeds[0])


def _minimal() -> dict:
    return {"run_dir": "run", "model": "dense_debug", "recipe": "bf16", "seed": 0, "steps": 4, "micro_batch": 1}


@pytest.mark.parametrize("key", sorted(config.ranges(TrainConfig)))
def test_a_run_setting_outside_its_range_is_refused_by_the_loader_and_in_code(key):
    """What ``ue5m3 train-config`` loads and what code builds are held to the same ranges, named by key."""
    settings = _run_settings()
    for bad in _outside(config.ranges(TrainConfig)[key], integer=isinstance(settings.get(key, 0), int)):
        with pytest.raises(config.ConfigError, match=rf"^run\.yaml: {key}: must be "):
            config.load(TrainConfig, {**settings, key: bad}, source="run.yaml")
        built = {**_minimal(), "data": None, "accumulation": 1, key: bad}
        with pytest.raises(ValueError, match=rf"^{key}: must be "):
            TrainConfig(**built)


@pytest.mark.parametrize("key", sorted(config.ranges(OptimConfig)))
def test_an_optimizer_setting_outside_its_range_is_refused_in_code_too(key):
    for bad in _outside(config.ranges(OptimConfig)[key], integer=key == "warmup_steps"):
        value = (bad, 0.95) if key == "betas" else bad
        with pytest.raises(ValueError, match=rf"^{key}(\[0\])?: must be "):
            OptimConfig(**{key: value})


# ----- checkpoint corruptions -----------------------------------------------------------------------------


def _cfg(root: Path, **kw) -> TrainConfig:
    """helpers.training's run config: 4 steps, one microbatch each, a checkpoint every 2 steps (steps 2 and 4), all
    kept."""
    return train_config(root, steps=4, accumulation=1, checkpoint_every=2, **kw)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished 4-step run (checkpoints 2 and 4); each test works on a copy (:func:`_copy_of`)."""
    root = tmp_path_factory.mktemp("trained")
    with torch_threads(1):
        train.train(_cfg(root), token_stream())
    return root


def _copy_of(trained: Path, tmp_path: Path) -> tuple[TrainConfig, Path]:
    shutil.copytree(trained / "run", tmp_path / "run")
    return _cfg(tmp_path), tmp_path / "run" / "checkpoints"


def _model(folder: Path) -> dict:
    return torch.load(folder / "model.pt", map_location="cpu", weights_only=True)


def _rewrite_manifest(folder: Path, change) -> None:
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps(change(manifest)))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))


def _without(key: str):
    def change(manifest: dict) -> dict:
        del manifest["files"][key]
        return manifest

    return change


def _foreign_file(folder: Path) -> None:
    (folder / "model.pt.bak").write_bytes(b"a copy someone left here")


def _empty(folder: Path) -> None:
    for path in folder.iterdir():
        path.unlink()


def _edited_fingerprint(manifest: dict) -> dict:
    manifest["meta"]["fingerprint"] = "0" * 64
    return manifest


CORRUPTIONS = {
    # case: (what is done to step-00000004, what the warning names)
    "truncated model.pt": (lambda f: _truncate(f / "model.pt"), "model.pt is truncated"),
    "truncated trainer.pt": (lambda f: _truncate(f / "trainer.pt"), "trainer.pt is truncated"),
    "zero-length optimizer.pt": (lambda f: (f / "optimizer.pt").write_bytes(b""), "optimizer.pt is truncated"),
    "flipped byte in model.pt": (lambda f: _flip(f / "model.pt"), "model.pt is corrupted (SHA-256 mismatch)"),
    "flipped byte in optimizer.pt": (lambda f: _flip(f / "optimizer.pt"), "optimizer.pt is corrupted"),
    "torn manifest": (lambda f: _truncate(f / "manifest.json"), "manifest.json is corrupted (torn or edited)"),
    "manifest {}": (lambda f: (f / "manifest.json").write_text("{}"), "is malformed: it has no ['step', 'files']"),
    "manifest a list": (lambda f: (f / "manifest.json").write_text("[]"), "is malformed: expected a mapping"),
    "manifest without model.pt": (
        lambda f: (_rewrite_manifest(f, _without("model.pt")), (f / "model.pt").unlink()),
        "lists no ['model.pt']",
    ),
    "manifest without trainer.pt": (lambda f: _rewrite_manifest(f, _without("trainer.pt")), "lists no ['trainer.pt']"),
    "manifest files a list": (
        lambda f: _rewrite_manifest(f, lambda m: {**m, "files": list(m["files"])}),
        "files must be a non-empty mapping",
    ),
    "manifest step a string": (lambda f: _rewrite_manifest(f, lambda m: {**m, "step": "4"}), "step must be an int"),
    "manifest sha256 not hex": (
        lambda f: _rewrite_manifest(
            f, lambda m: {**m, "files": {**m["files"], "model.pt": {**m["files"]["model.pt"], "sha256": "xyz"}}}
        ),
        "files['model.pt'].sha256 must be 64 lower-case hex digits",
    ),
    "manifest of another step": (lambda f: _rewrite_manifest(f, lambda m: {**m, "step": 2}), "named for step 4"),
    "edited fingerprint": (lambda f: _rewrite_manifest(f, _edited_fingerprint), "is not the SHA-256 of the identity"),
    "no manifest": (lambda f: (f / "manifest.json").unlink(), "has no manifest.json"),
    "empty folder": (_empty, "has no manifest.json"),
    "deleted model.pt": (lambda f: (f / "model.pt").unlink(), "model.pt is missing"),
    "a foreign file copied in": (_foreign_file, "holds files its manifest.json does not list: ['model.pt.bak']"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_a_corrupted_newest_checkpoint_is_passed_over_by_evaluation_and_set_aside_by_a_resume(trained, tmp_path, case):
    """Evaluation reads the older checkpoint with a warning naming the folder and the fault, moving nothing; the
    resume's search (``newest_valid``, what ``train`` calls first) sets the folder aside byte for byte as
    ``*.invalid`` and takes the older one, which stays as it was."""
    corrupt, named = CORRUPTIONS[case]
    _, root = _copy_of(trained, tmp_path)
    newest = root / "step-00000004"
    corrupt(newest)
    bad, older = file_digests(newest), file_digests(root / "step-00000002")
    with pytest.warns(UserWarning, match="step-00000004") as seen:
        _, _, path = _evaluation_weights(tmp_path / "run")
    assert path.name == "step-00000002" and named in str(seen[0].message), str(seen[0].message)
    assert newest.is_dir() and file_digests(newest) == bad
    with pytest.warns(
        UserWarning, match=r"step-00000004.*kept aside as .*step-00000004\.invalid.*step-00000002"
    ) as seen:
        path, manifest = checkpoint.newest_valid(root)
    assert path.name == "step-00000002" and manifest["step"] == 2 and named in str(seen[0].message)
    assert not newest.exists() and file_digests(root / "step-00000004.invalid") == bad
    assert file_digests(root / "step-00000002") == older


@pytest.mark.parametrize("case", ["truncated model.pt", "manifest {}"])
def test_a_run_whose_newest_checkpoint_is_corrupted_resumes_from_the_older_one_to_the_same_bits(
    trained, tmp_path, case
):
    corrupt, _ = CORRUPTIONS[case]
    cfg, root = _copy_of(trained, tmp_path)
    (tmp_path / "run" / "final.json").unlink()
    corrupt(root / "step-00000004")
    bad, older = file_digests(root / "step-00000004"), file_digests(root / "step-00000002")
    with pytest.warns(UserWarning, match=r"step-00000004.*kept aside as .*step-00000004\.invalid.*step-00000002"):
        final = json.loads(train.train(cfg, token_stream()).read_text())
    assert file_digests(root / "step-00000004.invalid") == bad and file_digests(root / "step-00000002") == older
    assert final["checkpoint"].endswith("step-00000004") and final["step"] == 4
    assert checkpoint.verify(root / "step-00000004", complete=True)["step"] == 4
    assert same_tensors(_model(root / "step-00000004"), _model(trained / "run" / "checkpoints" / "step-00000004"))


def _evaluation_weights(run_dir: Path):
    from ue5m3.evaluation.inference import load_checkpoint_weights

    return load_checkpoint_weights(run_dir)


def test_a_folder_renamed_to_a_later_step_is_not_that_step(trained, tmp_path):
    """step-00000004 moved to step-00000010: never read as step 10 (the issue's silent wrong result: a 10-step run
    "finished" with the step-4 weights), passed over by evaluation, set aside by a resume; the 4-step run it came
    from resumes from step 2 and its final.json names a checkpoint whose manifest says step 4."""
    shutil.copytree(trained / "run", tmp_path / "run")
    root = tmp_path / "run" / "checkpoints"
    (tmp_path / "run" / "final.json").unlink()
    os.replace(root / "step-00000004", root / "step-00000010")
    cfg = train_config(tmp_path, steps=10, accumulation=1, checkpoint_every=2)
    renamed, older = file_digests(root / "step-00000010"), file_digests(root / "step-00000002")
    with pytest.warns(UserWarning, match=r"step-00000010 is named for step 10 but its manifest says step 4"):
        _, _, path = _evaluation_weights(tmp_path / "run")
    assert path.name == "step-00000002"
    with pytest.raises(checkpoint.CheckpointError, match="named for step 10 but its manifest says step 4"):
        checkpoint.at_step(root, 10)
    # a 10-step run: the renamed folder is set aside (it is no step-10 checkpoint of any run), then step 2 is
    # refused as a 4-step run's; nothing is deleted
    with (
        pytest.warns(UserWarning, match=r"kept aside as .*step-00000010\.invalid"),
        pytest.raises(RunIdentityError, match="steps: checkpoint 4, config 10"),
    ):
        train.train(cfg, token_stream())
    assert sorted(p.name for p in root.iterdir()) == ["step-00000002", "step-00000010.invalid"]
    assert file_digests(root / "step-00000010.invalid") == renamed and file_digests(root / "step-00000002") == older
    os.replace(root / "step-00000010.invalid", root / "step-00000010")
    # the same run (4 steps) with its newest renamed: set aside, resumed from step 2, final.json at step 4
    with pytest.warns(UserWarning, match=r"kept aside as .*step-00000010\.invalid"):
        final = json.loads(train.train(_cfg(tmp_path), token_stream()).read_text())
    assert final["step"] == 4 and final["checkpoint"].endswith("step-00000004")
    assert (root / "step-00000010.invalid" / "model.pt").is_file()


def test_a_manifest_whose_step_and_folder_were_both_edited_is_caught_by_the_trainers_state(trained, tmp_path):
    cfg, root = _copy_of(trained, tmp_path)
    shutil.copytree(root / "step-00000002", root / "step-00000003")
    _rewrite_manifest(root / "step-00000003", lambda m: {**m, "step": 3})
    with pytest.raises(checkpoint.CheckpointError, match="trainer.pt records step 2 but the manifest says step 3"):
        checkpoint.verify(root / "step-00000003", complete=True)


def test_a_second_set_aside_of_the_same_step_keeps_the_first(trained, tmp_path):
    cfg, root = _copy_of(trained, tmp_path)
    (tmp_path / "run" / "final.json").unlink()
    (root / "step-00000004.invalid").mkdir()
    (root / "step-00000004.invalid" / "evidence").write_text("an earlier bad checkpoint")
    (root / "step-00000004" / "model.pt").write_bytes(b"")
    with pytest.warns(UserWarning, match=r"kept aside as .*step-00000004\.invalid-2"):
        train.train(cfg, token_stream())
    assert (root / "step-00000004.invalid" / "evidence").read_text() == "an earlier bad checkpoint"


def test_another_runs_checkpoint_copied_in_is_refused_naming_what_differs_and_moves_nothing(trained, tmp_path):
    other = _cfg(tmp_path / "other", optim=OptimConfig(lr=1e-3))
    train.train(other, token_stream())
    cfg, root = _copy_of(trained, tmp_path)
    (tmp_path / "run" / "final.json").unlink()
    shutil.rmtree(root / "step-00000004")
    shutil.copytree(Path(other.run_dir) / "checkpoints" / "step-00000004", root / "step-00000004")
    before = file_digests(root)
    with pytest.raises(
        RunIdentityError, match=r"belongs to another run(.|\n)*optim.lr: checkpoint 0.001, config 0.003"
    ):
        train.train(cfg, token_stream())
    assert file_digests(root) == before


def test_foreign_folders_are_left_alone_and_a_half_written_save_is_removed(trained, tmp_path):
    cfg, root = _copy_of(trained, tmp_path)
    (tmp_path / "run" / "final.json").unlink()
    shutil.rmtree(root / "step-00000004")
    foreign = {"step-final": "x", "step-4": "x", "backup": "x", "step-00000002-copy": "x"}
    for name, text in foreign.items():
        (root / name).mkdir()
        (root / name / "note").write_text(text)
    (root / "step-00000009").write_text("a file, not a folder")
    half = root / ".step-00000004.k1ll3d"  # what a SIGKILL inside a save leaves
    half.mkdir()
    (half / "model.pt").write_bytes(b"partial")
    train.train(cfg, token_stream())
    assert not half.exists()
    assert all((root / name / "note").read_text() == "x" for name in foreign)
    assert (root / "step-00000009").read_text() == "a file, not a folder"
    assert [s for s, _ in checkpoint.checkpoints(root)] == [2, 4]


# ----- kill points inside a save ---------------------------------------------------------------------------


class _DiskAtEachPoint:
    """Copies the run directory at every point of a checkpoint save where a SIGKILL leaves a different disk: after
    the temporary directory is made, after each file is written, after each fsync of the commit, after the rename.
    Copy ``k`` is the disk a process killed at point ``k`` leaves (nothing of the save's own clean-up has run), so one
    save gives every kill point."""

    def __init__(self, monkeypatch, run_dir: Path, images: Path) -> None:
        self.run_dir, self.images, self.points = run_dir, images, []
        torch_save, fsync, mkdtemp, replace = checkpoint._torch_save, checkpoint._fsync, tempfile.mkdtemp, os.replace

        def point(name: str) -> None:
            shutil.copytree(self.run_dir, self.images / str(len(self.points)), symlinks=True)
            self.points.append(name)

        def saving(obj, path):
            torch_save(obj, path)
            point(f"wrote {path.name}")

        def syncing(path):
            fsync(path)
            point(f"synced {path.name}")

        def making(*args, **kw):
            made = mkdtemp(*args, **kw)
            point("made the temporary directory")
            return made

        def renaming(src, dst):
            replace(src, dst)
            if Path(src).name.startswith(".step-"):
                point(f"renamed to {Path(dst).name}")

        monkeypatch.setattr(checkpoint, "_torch_save", saving)
        monkeypatch.setattr(checkpoint, "_fsync", syncing)
        monkeypatch.setattr(checkpoint.tempfile, "mkdtemp", making)
        monkeypatch.setattr(checkpoint.os, "replace", renaming)


def _resumable(trained: Path, tmp_path: Path) -> TrainConfig:
    """A copy of the finished run as a kill after step 2 left it: its next save is step 4's."""
    cfg, root = _copy_of(trained, tmp_path)
    shutil.rmtree(root / "step-00000004")
    (tmp_path / "run" / "final.json").unlink()
    return cfg


def test_a_run_killed_at_any_point_of_a_save_resumes_to_the_uninterrupted_bits(trained, tmp_path, monkeypatch):
    """A kill anywhere inside step 4's save: the rerun removes the half-written temporary directory (or finds the
    renamed checkpoint complete and writes only final.json), never touches step 2, and ends with the uninterrupted
    run's weights."""
    cfg = _resumable(trained, tmp_path)
    older = file_digests(Path(cfg.run_dir) / "checkpoints" / "step-00000002")
    images = tmp_path / "images"
    with monkeypatch.context() as patched:
        disk = _DiskAtEachPoint(patched, Path(cfg.run_dir), images)
        train.train(cfg, token_stream())
    points = disk.points  # a point added to the save is a kill point this test must reach: list it here
    assert points[5].startswith("synced .step-00000004.") and points[:5] + points[6:] == [
        "made the temporary directory",
        "wrote model.pt",
        "wrote optimizer.pt",
        "wrote trainer.pt",
        "synced manifest.json",
        "renamed to step-00000004",
        "synced checkpoints",
    ], points
    expected = _model(trained / "run" / "checkpoints" / "step-00000004")
    for k, point in enumerate(disk.points):
        image = dataclasses.replace(cfg, run_dir=str(images / str(k)))
        root = images / str(k) / "checkpoints"
        final = json.loads(train.train(image, token_stream()).read_text())
        assert [p.name for p in sorted(root.iterdir())] == ["step-00000002", "step-00000004"], point  # no temporary
        assert file_digests(root / "step-00000002") == older and final["step"] == 4, point
        assert same_tensors(_model(root / "step-00000004"), expected), point


# ----- the file system refuses: full, read-only, no permission ----------------------------------------------


@pytest.fixture
def mount(tmp_path):
    """``mount(size)``: a fresh tmpfs of ``size`` bytes (root only; the test skips with the reason elsewhere),
    unmounted after the test. Its parent is world-traversable, so a process without privileges reaches it."""
    mounted: list[Path] = []

    def make(size: int) -> Path:
        if os.geteuid() != 0:
            pytest.skip("mounting a small tmpfs needs root (this user cannot mount)")
        where = Path(tempfile.mkdtemp(prefix="ue5m3-faults-"))
        where.chmod(0o755)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            where.rmdir()
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode})")
        mounted.append(where)
        return where

    yield make
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)
        where.rmdir()


def _fill(where: Path, leave: int) -> Path:
    """Fill the file system holding ``where`` until ``leave`` bytes are free."""
    free = os.statvfs(where).f_bavail * os.statvfs(where).f_frsize
    filler = where / "filler"
    with open(filler, "wb") as handle:
        handle.truncate(0)
        chunk = b"\0" * (1 << 20)
        left = free - leave
        while left > 0:
            handle.write(chunk[: min(left, len(chunk))])
            left -= len(chunk)
    return filler


def test_a_full_disk_during_a_save_names_the_file_and_keeps_the_older_checkpoint(trained, mount, tmp_path):
    """The disk fills up inside step 4's save: a StorageError naming the file being written, ENOSPC and the fix;
    step 2 as it was, no temporary directory left; with space freed the same run resumes to the uninterrupted
    bits."""
    disk = mount(48 << 20)  # one 16 MB checkpoint and the run's records fit; a second does not
    shutil.copytree(_resumable(trained, tmp_path).run_dir, disk / "run")
    cfg = dataclasses.replace(_cfg(tmp_path), run_dir=str(disk / "run"))
    root = disk / "run" / "checkpoints"
    older = file_digests(root / "step-00000002")
    filler = _fill(disk, leave=1 << 20)
    with pytest.raises(StorageError) as err:
        train.train(cfg, token_stream())
    message = str(err.value)
    assert err.value.errno == errno.ENOSPC and f"saving checkpoint {root / 'step-00000004'} failed at " in message
    assert re.search(r"/\.step-00000004\.[^/]+/\w+\.pt: No space left on device \(ENOSPC\)", message), message
    assert "free space there" in message and "nothing was deleted" in message
    assert [p.name for p in root.iterdir()] == ["step-00000002"] and file_digests(root / "step-00000002") == older
    filler.unlink()
    final = json.loads(train.train(cfg, token_stream()).read_text())
    assert final["step"] == 4
    assert same_tensors(_model(root / "step-00000004"), _model(trained / "run" / "checkpoints" / "step-00000004"))


def _trainer_parts() -> dict:
    return {"model": {"w": torch.arange(4.0)}, "trainer": {"step": 6}}


def test_a_save_to_a_read_only_file_system_names_the_path_and_changes_nothing(trained, mount, tmp_path, capsys):
    disk = mount(40 << 20)
    shutil.copytree(trained / "run", disk / "run")
    root = disk / "run" / "checkpoints"
    before = file_digests(disk / "run")
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    with pytest.raises(StorageError, match=r"Read-only file system \(EROFS\); .*remount it read-write") as err:
        checkpoint.save(root, 6, _trainer_parts(), meta={})
    assert str(root / "step-00000006") in str(err.value)
    # the trainer stops at its lock; through the CLI: the path, the fix, exit 74, no traceback
    with pytest.raises(OSError, match=re.escape(str(disk / "run" / ".lock"))) as raw:
        train.train(dataclasses.replace(_cfg(tmp_path), run_dir=str(disk / "run")), token_stream())
    assert raw.value.errno == errno.EROFS
    from ue5m3 import cli

    assert cli.main(["range-analysis", "--out-dir", str(disk / "analysis")]) == 74
    err_text = capsys.readouterr().err
    assert f"{disk / 'analysis'}" in err_text and "EROFS" in err_text and "Traceback" not in err_text
    # evaluation reads a read-only run
    _, _, path = _evaluation_weights(disk / "run")
    assert path.name == "step-00000004" and file_digests(disk / "run") == before


@contextlib.contextmanager
def _unprivileged(owned: Path):
    """Act as a user without privileges (root: ``nobody``, its effective uid, ``owned`` given to it; another user:
    itself) inside the block."""
    if os.geteuid() != 0:
        yield
        return
    nobody = 65534
    try:
        for path in [owned, *owned.rglob("*")]:
            os.chown(path, nobody, nobody, follow_symlinks=False)
        os.setegid(nobody)
        os.seteuid(nobody)
    except OSError as err:  # a user namespace without that user, say
        os.setegid(0)
        pytest.skip(f"cannot act as the unprivileged user {nobody} here ({err})")
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


@pytest.fixture
def shared(tmp_path) -> Iterator[Path]:
    """A directory another user can reach (pytest's own tmp_path is the owner's alone)."""
    where = Path(tempfile.mkdtemp(prefix="ue5m3-faults-"))
    where.chmod(0o755)
    yield where
    shutil.rmtree(where, ignore_errors=True)


def test_a_save_without_write_permission_names_the_directory_and_the_fix(trained, shared):
    shutil.copytree(trained / "run", shared / "run")
    root = shared / "run" / "checkpoints"
    before = file_digests(root)
    with _unprivileged(shared / "run"):
        root.chmod(0o555)
        try:
            with pytest.raises(StorageError, match=r"Permission denied \(EACCES\); permission denied: make") as err:
                checkpoint.save(root, 6, _trainer_parts(), meta={})
        finally:
            root.chmod(0o755)
    assert str(root / "step-00000006") in str(err.value) and file_digests(root) == before


def test_an_unreadable_checkpoint_file_stops_the_resume_naming_it_and_sets_nothing_aside(trained, shared, tmp_path):
    """Not a fault of the checkpoint: the resume stops (it does not go back to step 2 and lose steps 3-4)."""
    shutil.copytree(trained / "run", shared / "run")
    (shared / "run" / "final.json").unlink()
    root = shared / "run" / "checkpoints"
    before = file_digests(root)
    cfg = dataclasses.replace(_cfg(tmp_path), run_dir=str(shared / "run"))
    with _unprivileged(shared / "run"):
        (root / "step-00000004" / "model.pt").chmod(0)
        try:
            with pytest.raises(checkpoint.CheckpointUnreadable, match=r"step-00000004/model\.pt") as err:
                train.train(cfg, token_stream())
        finally:
            (root / "step-00000004" / "model.pt").chmod(0o644)
    assert "ermission" in str(err.value)
    assert sorted(p.name for p in root.iterdir()) == ["step-00000002", "step-00000004"] and file_digests(root) == before


# ----- torn and mismatched data records ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """Prepared data of the OLMo-mix fixture records (real BPE, vocabulary 300); each test works on a copy."""
    data = fixture_config(tmp_path_factory.mktemp("prepared"))
    build_data(data)
    return data


def _data_copy(prepared, tmp_path: Path, **overrides):
    shutil.copytree(prepared.data_dir, tmp_path / "data")
    return dataclasses.replace(prepared, data_dir=str(tmp_path / "data"), **overrides)


def _index(data) -> Path:
    return Path(data.data_dir) / "tokens" / data.stream_names[0] / "train" / "index.json"


def _offsets(data) -> Path:
    return sorted(_index(data).parent.glob("*.offsets.npy"))[0]


def _corpus_manifest(data) -> Path:
    return Path(data.data_dir) / "corpus" / "manifest.json"


def _without_key(path: Path, key: str) -> None:
    record = json.loads(path.read_text())
    del record[key]
    path.write_text(json.dumps(record))


DATA_FAULTS = {
    # case: (what is done to the copy, the error, what the message must say besides the file)
    "torn index.json": (lambda d: _truncate(_index(d)), TornFileError, "is not a complete JSON record"),
    "index.json without vocab_size": (
        lambda d: _without_key(_index(d), "vocab_size"),
        ValueError,
        "is not a token-shard index (missing or malformed: ['vocab_size'])",
    ),
    "truncated offsets.npy": (lambda d: _truncate(_offsets(d)), ValueError, "is cut short or is not a .npy array"),
    "deleted offsets.npy": (lambda d: _offsets(d).unlink(), FileNotFoundError, "is missing (listed in its index.json)"),
    "torn corpus manifest": (lambda d: _truncate(_corpus_manifest(d)), TornFileError, "is not a complete JSON"),
    "corpus manifest {}": (
        lambda d: _corpus_manifest(d).write_text("{}"),
        ValueError,
        "is not a corpus manifest (no 'files' with their SHA-256)",
    ),
    "edited tokenizer.json": (
        lambda d: (Path(d.data_dir) / "tokenizer.json").write_text(
            (Path(d.data_dir) / "tokenizer.json").read_text().replace('"<eos>"', '"<EOS>"', 1) + " "
        ),
        ValueError,
        "is not the tokenizer the token shards were prepared with",
    ),
    "deleted tokenizer.json": (
        lambda d: (Path(d.data_dir) / "tokenizer.json").unlink(),
        FileNotFoundError,
        "the tokenizer the token shards were prepared with is gone",
    ),
}
_NAMED = {
    "torn index.json": _index,
    "index.json without vocab_size": _index,
    "truncated offsets.npy": _offsets,
    "deleted offsets.npy": _offsets,
    "torn corpus manifest": _corpus_manifest,
    "corpus manifest {}": _corpus_manifest,
    "edited tokenizer.json": lambda d: Path(d.data_dir) / "tokenizer.json",
    "deleted tokenizer.json": lambda d: Path(d.data_dir) / "tokenizer.json",
}


@pytest.mark.parametrize("case", sorted(DATA_FAULTS))
def test_a_torn_or_altered_data_record_is_named_with_how_to_make_it_again(prepared, tmp_path, case):
    fault, error, says = DATA_FAULTS[case]
    data = _data_copy(prepared, tmp_path)
    named = _NAMED[case](data)  # before the fault: a deleted file's path
    fault(data)
    before = file_digests(Path(data.data_dir))
    with pytest.raises(error) as err:
        open_data(data)
    message = str(err.value)
    assert str(named) in message and says in message, message
    assert "prepare" in message and "ue5m3 prepare-data" in message or "restore it" in message, message
    assert file_digests(Path(data.data_dir)) == before


def test_data_prepared_with_another_vocabulary_is_refused_before_the_run_directory_is_made(prepared, tmp_path):
    """The issue's silent acceptance: a config whose vocabulary is not the prepared data's trained."""
    data = _data_copy(prepared, tmp_path, vocab_size=320)
    with pytest.raises(ValueError, match=r"prepared with vocab_size 300, but data.vocab_size is 320") as err:
        check_prepared(data)
    assert str(_index(data)) in str(err.value)
    cfg = dataclasses.replace(_cfg(tmp_path), data=data, model_overrides={"vocab_size": 320})
    with pytest.raises(ValueError, match=r"data.vocab_size is 320"):
        train.train(cfg)
    assert not Path(cfg.run_dir).exists()


def test_a_torn_resolved_run_config_is_named_with_how_to_write_it_again(trained, tmp_path):
    _copy_of(trained, tmp_path)
    path = tmp_path / "run" / "config.resolved.json"
    _truncate(path)
    with pytest.raises(
        TornFileError, match=rf"^{re.escape(str(path))} is not a complete JSON record .*rerun `ue5m3 train`"
    ):
        read_run_config(tmp_path / "run")


# ----- the command line --------------------------------------------------------------------------------------


@pytest.mark.parametrize("threads", ["0", "-1", "1025", "two"])
def test_train_threads_outside_1_to_1024_is_a_usage_error_naming_the_option(threads, capsys):
    from ue5m3 import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "--config", "run.yaml", "--threads", threads])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --threads: expected a thread count, an integer in [1, 1024]" in err and repr(threads) in err
