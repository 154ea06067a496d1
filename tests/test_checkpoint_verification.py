"""A checkpoint is verified once per resume, the ranks together: each rank hashes only its share of the files (the
shards it reads back and its turn of the metadata), every file is hashed by one rank exactly once, and the resumed
run is still the uninterrupted one. On two CPU processes (gloo)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.distributed import run_distributed
from helpers.training import rewind, same_tensors, step_losses
from ue5m3.training import checkpoint
from ue5m3.training.manifest import verification_share

STEP2 = Path("checkpoints") / "step-00000002"


def _hashed(prefix: Path, rank: int, under: Path) -> list[str]:
    """The files under ``under`` that rank ``rank`` hashed while verifying, relative to it, in order."""
    log = Path(f"{prefix}.{rank}.jsonl")
    lines = log.read_text().splitlines() if log.exists() else []
    paths = [Path(json.loads(line)["path"]) for line in lines]
    return [p.relative_to(under).as_posix() for p in paths if p.is_relative_to(under)]


def _same_weights(a: Path, b: Path) -> bool:
    return same_tensors(checkpoint.load_model_state(a), checkpoint.load_model_state(b))


def _resume_logging_hashes(tmp_path: Path, name: str, nproc: int) -> tuple[Path, Path, dict, Path]:
    """A two-rank run of 4 steps, then run ``name``: the same run resumed from its step-2 checkpoint on ``nproc``
    ranks (the same global micro-batch), logging the files verification hashes. Returns (the run, the resumed run,
    the step-2 checkpoint's manifest, the hash logs' prefix)."""
    run = run_distributed(tmp_path, "run", 2, micro_batch=2, recipe="bf16", steps=4, every=2)
    resumed = rewind(run, tmp_path / name, 2)
    prefix = tmp_path / "hashes"
    env = {"UE5M3_LOG_HASHES": str(prefix)}
    run_distributed(tmp_path, name, nproc, micro_batch=4 // nproc, recipe="bf16", steps=4, every=2, env=env)
    return run, resumed, json.loads((resumed / STEP2 / "manifest.json").read_text()), prefix


@pytest.mark.slow
def test_two_ranks_verify_a_checkpoint_once_each_hashing_only_its_own_shards_and_its_turn_of_the_metadata(tmp_path):
    run, resumed, manifest, prefix = _resume_logging_hashes(tmp_path, "resumed", 2)
    hashed = {rank: _hashed(prefix, rank, resumed / STEP2) for rank in (0, 1)}
    every = sorted(hashed[0] + hashed[1])
    assert every == sorted(manifest["files"])  # every file hashed, each by one rank, once
    for rank in (0, 1):
        shards = {name for name in hashed[rank] if name.endswith(".distcp")}
        assert shards == {f"model/__{rank}_0.distcp", f"optimizer/__{rank}_0.distcp"}  # the shards it reads back
        assert sorted(hashed[rank]) == list(verification_share(manifest, rank, 2))
    # and the resumed run is the uninterrupted one, bit for bit
    assert _same_weights(resumed / "checkpoints" / "step-00000004", run / "checkpoints" / "step-00000004")
    assert step_losses(resumed) == step_losses(run)


@pytest.mark.slow
def test_one_rank_resuming_a_two_rank_checkpoint_hashes_each_file_once(tmp_path):
    _, one, manifest, prefix = _resume_logging_hashes(tmp_path, "one", 1)
    assert sorted(_hashed(prefix, 0, one / STEP2)) == sorted(manifest["files"])  # once each, not three times
