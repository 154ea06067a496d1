"""A tiny trained run for the evaluation tests: 2 steps of dense_debug on tiny prepared fixture data. The session
fixtures ``tiny_run`` and ``tiny_bf16_run`` of tests/conftest.py train it once for every test that reads one."""

from __future__ import annotations

from pathlib import Path

from helpers.data import fixture_config
from helpers.threads import torch_threads
from ue5m3.data import DataConfig, RandomTokenStream, build_data
from ue5m3.training import loop as train
from ue5m3.training.config import OptimConfig, TrainConfig


def make_run(root: Path, recipe: str = "ue5m3_b16") -> tuple[Path, DataConfig]:
    """A 2-step dense_debug run in ``root / "run"`` whose data section points at tiny prepared fixture data (in
    ``root / "data"``: a BPE of 300 tokens, sequences of 64, 4 validation and 2 calibration windows)."""
    config = fixture_config(root, sequence_length=64, validation_windows=4, calibration_windows=2)
    build_data(config)
    cfg = TrainConfig(
        run_dir=str(root / "run"),
        model="dense_debug",
        model_overrides={"vocab_size": 300},  # the trained BPE's size
        recipe=recipe,
        seed=5,
        steps=2,
        micro_batch=1,
        accumulation=1,
        data=config.to_dict(),
        checkpoint_every=2,
        optim=OptimConfig(lr=3e-3),
    )
    with torch_threads(1):
        train.train(cfg, RandomTokenStream(300, 64, seed=0))
    return root / "run", config
