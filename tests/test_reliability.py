"""Run identity and fault tolerance of training (docs/reliability.md has the table of what is covered): foreign
checkpoints refused naming what differs, settings changes started afresh with the old run kept aside, resume from
the newest checkpoint that verifies, killed saves cleaned, one trainer per run directory, SIGTERM/SIGUSR1
checkpoint-and-stop, torn metrics lines, non-finite steps stopped before they are stepped or saved."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from pathlib import Path

import pytest
import torch

from helpers.training import LAST_LAYER_BF16, final_model, same_tensors, token_stream, train_config
from ue5m3.data import RandomTokenStream
from ue5m3.training import checkpoint
from ue5m3.training import loop as train
from ue5m3.training.config import OptimConfig, TrainConfig
from ue5m3.training.identity import RunIdentityError, fingerprint
from ue5m3.training.stops import Stopped

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _config(tmp_path, recipe="ue5m3_b16", steps=4, **kw) -> TrainConfig:
    """helpers.training's run config with one microbatch per step."""
    return train_config(tmp_path, recipe=recipe, steps=steps, **{"accumulation": 1, **kw})


# ----- run identity -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"optim": OptimConfig(lr=1e-3)}, "optim.lr: checkpoint 0.003, config 0.001"),
        ({"steps": 6}, "steps: checkpoint 2, config 6"),
        ({"micro_batch": 4}, "global_micro_batch"),
        ({"seed": 4}, "seed: checkpoint 3, config 4"),
        ({"recipe": "nvfp4_te", "recipe_overrides": LAST_LAYER_BF16}, "recipe.name"),
        ({"recipe": "bf16"}, "recipe.gemm.model"),
        ({"model_overrides": {"hidden_size": 64}}, "model_config.hidden_size: checkpoint 128, config 64"),
        ({"cold_scale_resume": True}, "cold_scale_resume"),
    ],
)
def test_a_checkpoint_of_another_run_is_refused_naming_what_differs(tmp_path, change, named):
    cfg = _config(tmp_path, steps=2)
    train.train(cfg, token_stream())
    with pytest.raises(RunIdentityError, match="belongs to another run") as err:
        train.train(dataclasses.replace(cfg, **change), token_stream())
    assert named in str(err.value)


def test_settings_that_do_not_shape_the_trajectory_resume(tmp_path):
    cfg = _config(tmp_path)
    train.train(cfg, token_stream(), stop_after=2)
    train.train(
        dataclasses.replace(cfg, log_every=2, checkpoint_every=1, keep_checkpoints=3, backend="torch"), token_stream()
    )
    reference = _config(tmp_path / "reference")
    train.train(reference, token_stream())
    assert same_tensors(final_model(cfg.run_dir), final_model(reference.run_dir))


def test_restart_on_change_keeps_the_old_run_aside_and_trains_afresh(tmp_path):
    cfg = _config(tmp_path, steps=2)
    train.train(cfg, token_stream())
    old_state = final_model(cfg.run_dir)
    changed = dataclasses.replace(cfg, optim=OptimConfig(lr=1e-3))
    with pytest.warns(UserWarning, match="moved the old run to"):
        final = train.train(changed, token_stream(), restart_on_change=True)
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("run.superseded-")]
    assert len(aside) == 1 and same_tensors(final_model(aside[0]), old_state)  # nothing lost
    record = json.loads(final.read_text())
    assert record["config"]["optim"]["lr"] == 1e-3 and record["step"] == 2
    fresh = _config(tmp_path / "fresh", steps=2, optim=OptimConfig(lr=1e-3))
    train.train(fresh, token_stream())
    assert same_tensors(final_model(cfg.run_dir), final_model(fresh.run_dir))  # trained from step 0, not resumed
    metrics = [json.loads(line)["step"] for line in (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines()]
    assert metrics == [1, 2]


def test_provenance_records_the_source_hash_and_the_manifest_the_identity(tmp_path):
    cfg = _config(tmp_path, steps=2)
    record = json.loads(train.train(cfg, token_stream()).read_text())
    assert len(record["source_sha256"]) == 64
    manifest = checkpoint.verify(checkpoint.latest(Path(cfg.run_dir) / "checkpoints"))
    assert manifest["meta"]["fingerprint"] == fingerprint(manifest["meta"]["identity"])
    assert manifest["meta"]["identity"]["recipe"]["name"] == "ue5m3_b16"


# ----- crash safety -------------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["zero_length_model", "empty_directory", "missing_manifest"])
def test_resume_falls_back_to_the_newest_checkpoint_that_verifies(tmp_path, fault):
    cfg = _config(tmp_path, steps=6)
    train.train(cfg, token_stream(), stop_after=4)
    newest = checkpoint.latest(Path(cfg.run_dir) / "checkpoints")
    if fault == "zero_length_model":
        (newest / "model.pt").write_bytes(b"")
    elif fault == "missing_manifest":
        (newest / "manifest.json").unlink()
    else:
        for path in newest.iterdir():
            path.unlink()
    with pytest.warns(UserWarning, match=r"step-00000004.*kept aside as .*step-00000004.invalid.*step-00000002"):
        train.train(cfg, token_stream())
    reference = _config(tmp_path / "reference", steps=6)
    train.train(reference, token_stream())
    assert same_tensors(final_model(cfg.run_dir), final_model(reference.run_dir))
    assert (Path(cfg.run_dir) / "checkpoints" / "step-00000004.invalid").is_dir()  # the evidence is kept


def test_no_verifying_checkpoint_is_an_error_naming_each_file(tmp_path):
    cfg = _config(tmp_path, steps=2)
    train.train(cfg, token_stream())
    for _, path in checkpoint.checkpoints(Path(cfg.run_dir) / "checkpoints"):
        (path / "optimizer.pt").write_bytes(b"")
    with pytest.raises(checkpoint.CheckpointError, match=r"no checkpoint .* verifies.*optimizer.pt is truncated"):
        train.train(cfg, token_stream())


def test_only_step_directories_count_and_killed_saves_are_removed(tmp_path):
    cfg = _config(tmp_path, steps=4)
    train.train(cfg, token_stream(), stop_after=2)
    root = Path(cfg.run_dir) / "checkpoints"
    (root / "step-final").mkdir()  # sorts after step-00000002 by name
    (root / "step-00000002-copy").mkdir()
    leftover = root / ".step-00000004.x1y2"  # what a SIGKILL inside a save leaves
    leftover.mkdir()
    (leftover / "model.pt").write_bytes(b"partial")
    assert checkpoint.latest(root).name == "step-00000002"
    train.train(cfg, token_stream())
    assert not leftover.exists() and (root / "step-final").is_dir()
    assert [step for step, _ in checkpoint.checkpoints(root)] == [2, 4]


def test_a_second_trainer_on_the_same_run_directory_is_refused(tmp_path):
    cfg = _config(tmp_path, steps=2)
    with checkpoint.RunLock(cfg.run_dir), pytest.raises(checkpoint.RunLockedError, match=f"pid {os.getpid()}"):
        train.train(cfg, token_stream())
    assert not (Path(cfg.run_dir) / "metrics.jsonl").exists()  # nothing written by the refused trainer
    train.train(cfg, token_stream())  # the lock is gone with its holder


class _SignallingStream(RandomTokenStream):
    """Sends ``signum`` to this process while drawing batch ``at`` (mid-step, as a preemption arrives)."""

    def __init__(self, signum: int, at: int) -> None:
        super().__init__(4096, 64)
        self.signum, self.at, self.drawn = signum, at, 0

    def next_batch(self, batch_size):
        self.drawn += 1
        if self.drawn == self.at:
            os.kill(os.getpid(), self.signum)
        return super().next_batch(batch_size)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_sigterm_and_sigusr1_checkpoint_the_step_and_stop_then_the_same_command_resumes(tmp_path, signum):
    cfg = _config(tmp_path, steps=6, checkpoint_every=4)
    previous = signal.getsignal(signum)
    with pytest.raises(Stopped) as stopped:
        train.train(cfg, _SignallingStream(signum, at=3))  # during step 3: not a checkpoint step
    assert stopped.value.code == 128 + signum
    root = Path(cfg.run_dir) / "checkpoints"
    assert [step for step, _ in checkpoint.checkpoints(root)] == [3]
    assert signal.getsignal(signum) is previous  # the trainer's handlers are gone with it
    train.train(cfg, token_stream())
    reference = _config(tmp_path / "reference", steps=6, checkpoint_every=4)
    train.train(reference, token_stream())
    assert same_tensors(final_model(cfg.run_dir), final_model(reference.run_dir))


def test_a_torn_last_metrics_line_is_dropped_with_a_warning_naming_the_file(tmp_path):
    cfg = _config(tmp_path, steps=4)
    train.train(cfg, token_stream(), stop_after=2)
    metrics = Path(cfg.run_dir) / "metrics.jsonl"
    with open(metrics, "a") as handle:
        handle.write('{"step": 3, "loss": 8.1')  # a kill during the write of step 3's record
    with pytest.warns(UserWarning, match=r"metrics.jsonl: line 3 is torn"):
        train.train(cfg, token_stream())
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [1, 2, 3, 4]


def test_a_malformed_metrics_line_before_the_end_is_an_error_naming_the_line(tmp_path):
    cfg = _config(tmp_path, steps=4)
    train.train(cfg, token_stream(), stop_after=2)
    metrics = Path(cfg.run_dir) / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join([lines[0], "garbage", lines[1]]) + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 2 is not a metrics record"):
        train.train(cfg, token_stream())


# ----- numerical guards ---------------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", ["bf16", "ue5m3_b16"])
def test_a_non_finite_loss_stops_any_run_before_it_is_stepped_or_checkpointed(tmp_path, recipe, monkeypatch):
    cfg = _config(tmp_path, recipe=recipe, steps=6)
    original = train.loss_fn
    calls = {"n": 0}

    def poisoned(model, inputs, targets, **kwargs):
        calls["n"] += 1
        loss = original(model, inputs, targets, **kwargs)
        return loss * float("nan") if calls["n"] == 3 else loss

    monkeypatch.setattr(train, "loss_fn", poisoned)
    with pytest.raises(train.NonFiniteError, match="step 3: "):
        train.train(cfg, token_stream())
    root = Path(cfg.run_dir) / "checkpoints"
    assert [step for step, _ in checkpoint.checkpoints(root)] == [2]
    assert all(torch.isfinite(t).all() for t in final_model(cfg.run_dir).values())
    assert not (Path(cfg.run_dir) / "final.json").exists()


# ----- kill and resume ----------------------------------------------------------------------------------

_TRAIN_IN_A_SUBPROCESS = """
import sys, torch
from ue5m3.data import RandomTokenStream
from ue5m3.training import loop
from ue5m3.training.config import TrainConfig
torch.set_num_threads(int(sys.argv[2]))
loop.train(TrainConfig.from_yaml(sys.argv[1]), RandomTokenStream(4096, 64))
"""


def _write_config(cfg: TrainConfig, path: Path) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(cfg.to_dict()))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_a_trainer_killed_from_outside_resumes_to_the_uninterrupted_result(tmp_path, signum):
    """A real process killed (SIGKILL: no handler runs; SIGTERM: the checkpoint-and-stop path) once its first
    checkpoint exists, then resumed with another thread count: the same bits as a run never interrupted."""
    import subprocess
    import sys
    import time

    cfg = _config(tmp_path, steps=12, checkpoint_every=2)
    config_path = _write_config(cfg, tmp_path / "config.yaml")
    process = subprocess.Popen(
        [sys.executable, "-c", _TRAIN_IN_A_SUBPROCESS, str(config_path), "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    first = Path(cfg.run_dir) / "checkpoints" / "step-00000002"
    deadline = time.monotonic() + 240
    while not first.exists() and process.poll() is None:
        assert time.monotonic() < deadline, "no checkpoint within the time limit"
        time.sleep(0.01)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=240)
    # SIGKILL: killed where it stood; SIGTERM: a checkpoint of the step in progress, then exit 128 + 15
    assert process.returncode == (-signum if signum == signal.SIGKILL else 128 + signum), stderr
    assert not (Path(cfg.run_dir) / "final.json").exists()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        train.train(cfg, token_stream())
    finally:
        torch.set_num_threads(threads)
    reference = _config(tmp_path / "reference", steps=12, checkpoint_every=2)
    train.train(reference, token_stream())
    assert same_tensors(final_model(cfg.run_dir), final_model(reference.run_dir))
    lines = (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(1, 13))


def test_a_run_stopped_after_its_last_checkpoint_writes_only_the_final_record_on_resume(tmp_path):
    cfg = _config(tmp_path, steps=4)
    assert train.train(cfg, token_stream(), stop_after=4) is None  # killed between the last checkpoint and final.json
    assert not (Path(cfg.run_dir) / "final.json").exists()
    state = final_model(cfg.run_dir)
    record = json.loads(train.train(cfg, token_stream()).read_text())
    assert record["step"] == 4 and same_tensors(final_model(cfg.run_dir), state)


def test_recipe_layers_the_model_does_not_have_are_refused_naming_the_key_and_the_depth(tmp_path):
    final_8 = r"recipe: bf16_layers: selects the last 8 layers, but model 'dense_debug' has 2 layers"
    with pytest.raises(ValueError, match=final_8):
        _config(tmp_path, recipe="nvfp4_te")
    beyond = {"bf16_layers": [1, 44]}
    with pytest.raises(ValueError, match=r"recipe: bf16_layers\[1\]: layer 44 does not exist in model 'dense_debug'"):
        _config(tmp_path, recipe="nvfp4_te", recipe_overrides=beyond)
