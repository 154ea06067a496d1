"""A run states its global batch in sequences (TrainConfig.global_batch): the accumulation follows from the world size
and the micro-batch, a world size that does not divide it is refused at start naming the numbers, and the run has
the identity of the same run stated as an accumulation. The shipped runs' fingerprints are those they had before
``global_batch`` existed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from helpers.distributed import worker_command
from helpers.training import final_model, same_tensors, train_config
from ue5m3.data import RandomTokenStream
from ue5m3.training import loop as train
from ue5m3.training.config import TrainConfig
from ue5m3.training.identity import fingerprint, run_identity

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _fingerprint(settings: dict, world: int) -> str:
    cfg = TrainConfig.from_dict({"run_dir": "run", **settings})
    return fingerprint(run_identity(cfg, cfg.resolved_recipe(), world))


def _cpu_data() -> dict:
    data = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["data"]
    return {**data, "data_dir": "/nonexistent/ue5m3-data"}  # no prepared data: the identity's hashes are null


_CPU = {"steps": 150, "micro_batch": 8, "log_every": 5, "checkpoint_every": 25, "keep_every": 25}
_PAPER_8B = {"model": "nemotron_h_8b", "model_overrides": {"vocab_size": 131072}, "seed": 42, "data": None}
_PAPER_8B.update(steps=30000, micro_batch=1, optim={"lr": 0.0008})

# (settings, world size, the fingerprint computed before global_batch existed, at commit 86820c2)
SHIPPED = {
    "cpu main ue5m3_b16": (
        {
            "model": "nemotron_h_debug",
            "model_overrides": {"vocab_size": 4096, "hybrid_override_pattern": "*-M-M-M-M-M-"},
            "recipe": "ue5m3_b16",
            "seed": 1,
            "optim": {"lr": 0.003},
            **_CPU,
        },
        1,
        "6619d70842a2aa883d6a0af2d71f66e3d8d711bcb1e0f8dd6d2534d2ab5685cf",
    ),
    "cpu control t448 on 2 ranks": (
        {
            "model": "dense_debug",
            "model_overrides": {"vocab_size": 4096, "num_hidden_layers": 4},
            "recipe": "ue5m3_b16",
            "seed": 1,
            "optim": {"lr": 0.003},
            **_CPU,
        },
        2,
        "0e5590e80323cd22c6784a726c68cf1b488b0152546bbf4700a15ec7ddcb611c",
    ),
    "paper 8B ue5m3_b16 on 32 GPUs": (
        {**_PAPER_8B, "recipe": "ue5m3_b16"},
        32,
        "1344734797285e77fed9c80bf5ebd6219fc6c1d1fbefba9111a59e1a6502107f",
    ),
    "paper 8B nvfp4_te native on 32 GPUs": (
        {**_PAPER_8B, "recipe": "nvfp4_te", "execution": "native_te"},
        32,
        "38c81b5633a9441262ccf0a1686bc967b169c8bc02470a0add873219fa162f50",
    ),
}


@pytest.mark.parametrize("name", list(SHIPPED))
def test_the_shipped_runs_keep_their_fingerprints_stated_as_accumulation_or_as_global_batch(name):
    settings, world, before = SHIPPED[name]
    data = {"data": _cpu_data()} if "data" not in settings else {}
    accumulation = 24 if world == 32 else 1
    assert _fingerprint({**settings, **data, "accumulation": accumulation}, world) == before
    global_batch = settings["micro_batch"] * accumulation * world  # 768 for the paper's runs
    assert _fingerprint({**settings, **data, "global_batch": global_batch}, world) == before


def test_the_accumulation_follows_from_the_global_batch_and_the_world_size(tmp_path):
    cfg = train_config(tmp_path, micro_batch=1, accumulation=0, global_batch=768)
    assert [cfg.accumulation_for(world) for world in (1, 4, 32, 768)] == [768, 192, 24, 1]
    # the 350M control on one 4-GPU node is the paper's 768 x 8,192, not 1 x 24 x 4 = 96 sequences
    assert 1 * cfg.accumulation_for(4) * 4 == 768
    assert train_config(tmp_path, accumulation=24).accumulation_for(32) == 24  # stated: any world size


@pytest.mark.parametrize("world", [5, 1024])
def test_a_world_size_that_does_not_divide_the_global_batch_is_refused_naming_the_numbers(tmp_path, world):
    cfg = train_config(tmp_path, micro_batch=1, accumulation=0, global_batch=768)
    with pytest.raises(ValueError, match=rf"global_batch: 768 .* {world} rank\(s\) of micro_batch 1: .* 1 x {world}"):
        cfg.accumulation_for(world)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"accumulation": 2, "global_batch": 8}, r"global_batch: give global_batch \(8\) or accumulation \(2\)"),
        ({"accumulation": 0, "global_batch": 0}, r"accumulation: give accumulation .* or global_batch"),
        ({"accumulation": 0, "global_batch": 7}, r"global_batch: 7 sequences per step is not a multiple of micro"),
        ({"accumulation": 0, "global_batch": -8}, r"global_batch"),
        ({"accumulation": -1}, r"accumulation"),
        ({"accumulation": 0, "global_batch": True}, r"global_batch"),
    ],
)
def test_batch_settings_are_refused_where_they_enter_naming_the_key(tmp_path, settings, message):
    values = {**train_config(tmp_path).to_dict(), **settings}
    with pytest.raises((ValueError, TypeError), match=message):
        TrainConfig.from_dict(values)


def test_a_run_stated_by_its_global_batch_trains_and_resumes_as_the_same_run_stated_by_accumulation(tmp_path):
    stated = train_config(tmp_path, steps=4, micro_batch=2, accumulation=2, run_dir=str(tmp_path / "stated"))
    train.train(stated, RandomTokenStream(4096, 64), stop_after=2)
    # the same directory continued by the global-batch form of the run: the same identity, so it resumes
    derived = train_config(tmp_path, steps=4, micro_batch=2, accumulation=0, global_batch=4, run_dir=stated.run_dir)
    train.train(derived, RandomTokenStream(4096, 64))
    reference = train_config(tmp_path, steps=4, micro_batch=2, accumulation=2, run_dir=str(tmp_path / "reference"))
    train.train(reference, RandomTokenStream(4096, 64))
    assert same_tensors(final_model(stated.run_dir), final_model(reference.run_dir))


@pytest.mark.slow
def test_two_ranks_refuse_a_global_batch_they_cannot_split_before_touching_the_run_directory(tmp_path):
    run_dir = tmp_path / "run"
    values = {**train_config(tmp_path, micro_batch=2, accumulation=0, global_batch=6).to_dict()}
    values["run_dir"] = str(run_dir)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(values))
    result = subprocess.run(worker_command(2, path), capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert result.returncode != 0
    assert "global_batch: 6 sequences per step cannot be split over 2 rank(s) of micro_batch 2" in result.stderr
    assert "2 x 2 = 4" in result.stderr
    assert not run_dir.exists()
