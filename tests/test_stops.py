"""Stops and rolling checkpoints (ue5m3.training.stops): Ctrl-C checkpoints and stops as SIGTERM does, a second
Ctrl-C stops at once while a launcher's forwarded copy does not, the ranks agree on the stop flag and the wall-time
schedule in one all-reduce, and a run checkpointed by wall time resumes to the uninterrupted run's bits with the
same identity."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
import yaml

from helpers.training import final_model, metric_records, same_tensors, token_stream, train_config
from ue5m3.data import RandomTokenStream
from ue5m3.training import checkpoint, stops
from ue5m3.training import loop as train
from ue5m3.training.config import TrainConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _config(tmp_path, name="run", steps=6, **kw) -> TrainConfig:
    return train_config(tmp_path, steps=steps, **{"accumulation": 1, "run_dir": str(tmp_path / name), **kw})


def _steps_of(run_dir: str | Path) -> list[int]:
    return [step for step, _ in checkpoint.checkpoints(Path(run_dir) / "checkpoints")]


class _Clock:
    """A monotonic clock that moves only when told (``stops.monotonic`` replaced by it)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(stops, "monotonic", fake)
    return fake


class _Signalling(RandomTokenStream):
    """A stream that sends this process ``signum`` as it draws each microbatch of ``at`` (1-based), moving
    ``clock`` by ``advance`` seconds first."""

    def __init__(self, signum, at, clock=None, advance=0.0):
        super().__init__(4096, 64)
        self.signum, self.at, self.clock, self.advance, self.drawn = signum, set(at), clock, advance, 0

    def next_batch(self, batch_size):
        self.drawn += 1
        if self.drawn in self.at:
            if self.clock is not None:
                self.clock.now += self.advance
            os.kill(os.getpid(), self.signum)
        return super().next_batch(batch_size)


# ----- Ctrl-C -------------------------------------------------------------------------------------------


def test_ctrl_c_checkpoints_the_step_and_stops_then_the_same_command_resumes_to_the_uninterrupted_run(tmp_path):
    cfg = _config(tmp_path, checkpoint_every=4)
    previous = signal.getsignal(signal.SIGINT)
    with pytest.raises(stops.Stopped) as stopped:
        train.train(cfg, _Signalling(signal.SIGINT, at=[3]))  # during step 3: not a checkpoint step
    assert stopped.value.code == 128 + signal.SIGINT
    assert _steps_of(cfg.run_dir) == [3]
    assert signal.getsignal(signal.SIGINT) is previous  # the trainer's handler is gone with it
    train.train(cfg, token_stream())
    reference = _config(tmp_path, "reference", checkpoint_every=4)
    train.train(reference, token_stream())
    assert same_tensors(final_model(cfg.run_dir), final_model(reference.run_dir))
    assert metric_records(cfg.run_dir) == metric_records(reference.run_dir)


def test_a_forwarded_copy_of_the_ctrl_c_is_the_same_ctrl_c(tmp_path, clock):
    """torchrun forwards the terminal's SIGINT to its workers, which have it from the terminal too: a second SIGINT
    sooner than SAME_INTERRUPT_S after the first still checkpoints and stops."""
    cfg = _config(tmp_path, checkpoint_every=4, accumulation=2)
    # both in step 3 (its microbatches 5 and 6), half SAME_INTERRUPT_S apart
    stream = _Signalling(signal.SIGINT, at=[5, 6], clock=clock, advance=stops.SAME_INTERRUPT_S / 2)
    with pytest.raises(stops.Stopped) as stopped:
        train.train(cfg, stream)
    assert stopped.value.code == 128 + signal.SIGINT
    assert _steps_of(cfg.run_dir) == [3]


def test_a_second_ctrl_c_stops_at_once_without_a_checkpoint_of_the_step_in_progress(tmp_path, clock):
    cfg = _config(tmp_path, checkpoint_every=2, accumulation=2)
    # the first Ctrl-C in step 3's first microbatch, the second in its second one, a while later
    stream = _Signalling(signal.SIGINT, at=[5, 6], clock=clock, advance=stops.SAME_INTERRUPT_S)
    with pytest.raises(stops.Interrupted):
        train.train(cfg, stream)
    assert _steps_of(cfg.run_dir) == [2]  # step 3 given up; no temporary directory left behind
    assert not [p for p in (Path(cfg.run_dir) / "checkpoints").iterdir() if p.name.startswith(".")]
    train.train(cfg, token_stream())
    reference = _config(tmp_path, "reference", checkpoint_every=2, accumulation=2)
    train.train(reference, token_stream())
    assert same_tensors(final_model(cfg.run_dir), final_model(reference.run_dir))


def test_the_train_verb_exits_130_without_a_traceback_on_a_second_ctrl_c(tmp_path, monkeypatch, caplog):
    def interrupted(cfg, **kwargs):
        raise stops.Interrupted("a second Ctrl-C: stopped at once, without a checkpoint of the step in progress")

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(_config(tmp_path).to_dict()))
    monkeypatch.setattr(train, "train", interrupted)
    with caplog.at_level("INFO", logger="ue5m3.training.loop"), pytest.raises(SystemExit) as exited:
        train.main(str(path))
    assert exited.value.code == 130
    assert "rerun to resume from the newest checkpoint" in caplog.text


# ----- rolling checkpoints by wall time -----------------------------------------------------------------


class _Ticking(RandomTokenStream):
    """A stream whose every microbatch takes ``minutes`` of the fake clock."""

    def __init__(self, clock, minutes):
        super().__init__(4096, 64)
        self.clock, self.minutes = clock, minutes

    def next_batch(self, batch_size):
        self.clock.now += 60 * self.minutes
        return super().next_batch(batch_size)


def test_a_run_checkpoints_by_wall_time_and_resumes_from_it_to_the_uninterrupted_run(tmp_path, clock):
    """Every step takes 12 minutes; with checkpoint_every_minutes 30 the checkpoints fall after steps 3 and 6 (36
    minutes each), beside the final one. The run stopped after step 7 (killed) resumes from step 6 with the same
    identity (the setting dropped), and ends with the bits of a run that never checkpointed by wall time."""
    cfg = _config(tmp_path, steps=8, checkpoint_every=100, checkpoint_every_minutes=30)
    assert train.train(cfg, _Ticking(clock, minutes=12), stop_after=7) is None
    assert _steps_of(cfg.run_dir) == [3, 6]
    resumed = _config(tmp_path, steps=8, checkpoint_every=100)  # not part of the identity: it resumes
    train.train(resumed, token_stream())
    assert _steps_of(cfg.run_dir) == [3, 6, 8]  # rolling checkpoints like the others (keep_checkpoints 10)
    reference = _config(tmp_path, "reference", steps=8, checkpoint_every=100)
    train.train(reference, token_stream())
    assert _steps_of(reference.run_dir) == [8]
    assert same_tensors(final_model(cfg.run_dir), final_model(reference.run_dir))
    assert metric_records(cfg.run_dir) == metric_records(reference.run_dir)


def test_wall_time_checkpoints_are_due_after_the_interval_since_the_last_save(clock):
    rolling = stops.WallClockCheckpoints(30)
    clock.now += 29 * 60
    assert not rolling.due()
    clock.now += 60
    assert rolling.due()
    rolling.saved()
    assert not rolling.due()
    clock.now += 30 * 60
    assert rolling.due()
    assert not stops.WallClockCheckpoints(0).due()  # off
    for bad in (-1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="checkpoint_every_minutes"):
            stops.WallClockCheckpoints(bad)


@pytest.mark.parametrize("bad", [-1, float("inf"), True, "30"])
def test_checkpoint_every_minutes_is_checked_where_it_enters(tmp_path, bad):
    with pytest.raises((ValueError, TypeError), match="checkpoint_every_minutes"):
        TrainConfig.from_dict({**_config(tmp_path).to_dict(), "checkpoint_every_minutes": bad})


# ----- the ranks agree ----------------------------------------------------------------------------------


def _poll_on_rank(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        requests = stops.StopRequests()
        results = [requests.poll(torch.device("cpu")).__dict__]  # nothing asked
        results.append(requests.poll(torch.device("cpu"), checkpoint_due=rank == 0).__dict__)  # rank 0's clock
        if rank == 1:
            requests.signum = int(signal.SIGTERM)  # rank 1 alone was signalled
        results.append(requests.poll(torch.device("cpu")).__dict__)
        Path(f"{out}.{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def test_the_ranks_agree_on_a_stop_and_a_due_checkpoint_that_only_one_of_them_saw(tmp_path):
    import torch.multiprocessing as mp

    init = f"file://{tmp_path / 'store'}"
    mp.spawn(_poll_on_rank, args=(2, init, str(tmp_path / "poll")), nprocs=2, join=True)
    for rank in (0, 1):
        results = json.loads((tmp_path / f"poll.{rank}.json").read_text())
        assert results == [
            {"signum": None, "checkpoint_due": False},
            {"signum": None, "checkpoint_due": True},
            {"signum": int(signal.SIGTERM), "checkpoint_due": False},
        ], rank
