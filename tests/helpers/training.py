"""The training tests' run config, token stream and readers of what a run leaves behind (its latest checkpoint's
states, its metrics records), shared by tests/test_train.py, test_reliability.py, test_stops.py, test_faults.py,
test_global_batch.py, test_activation_checkpointing.py and the multi-process tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from ue5m3.data import RandomTokenStream
from ue5m3.training import checkpoint
from ue5m3.training.config import OptimConfig, TrainConfig

# The NVIDIA recipes keep the final 8 layers in BF16; the 2-layer debug model keeps its final one.
LAST_LAYER_BF16 = {"bf16_layers": {"first": 0, "last": 1, "kind": None}}


def train_config(tmp_path: Path, recipe: str = "ue5m3_b16", steps: int = 6, **kw) -> TrainConfig:
    """A dense_debug run in ``tmp_path / "run"`` without data (random tokens): seed 3, 2 microbatches of 2 per step,
    a checkpoint every 2 steps (10 kept), learning rate 3e-3; ``kw`` overrides any setting."""
    values = dict(
        run_dir=str(tmp_path / "run"),
        model="dense_debug",
        recipe=recipe,
        seed=3,
        steps=steps,
        micro_batch=2,
        accumulation=2,
        data=None,
        checkpoint_every=2,
        keep_checkpoints=10,
        optim=OptimConfig(lr=3e-3),
    )
    values.update(kw)
    return TrainConfig(**values)


def token_stream() -> RandomTokenStream:
    """The random token stream the training tests train on: vocabulary 4096, sequences of 64."""
    return RandomTokenStream(4096, 64)


def final_state(run_dir: str | Path) -> tuple[dict, dict]:
    """The model and optimizer states of a run's latest (full, one-process) checkpoint."""
    parts, _ = checkpoint.load(checkpoint.latest(Path(run_dir) / "checkpoints"))
    return parts["model"], parts["optimizer"]


def final_model(run_dir: str | Path) -> dict:
    """The model state of a run's latest (full, one-process) checkpoint."""
    return final_state(run_dir)[0]


def same_tensors(a: dict, b: dict) -> bool:
    """Whether two state dicts have the same keys and equal tensors under each."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def metric_records(run_dir: str | Path) -> list[dict]:
    """A run's metrics records, in order, without their timing (``tokens_per_s``)."""
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "tokens_per_s"} for line in lines]


def step_losses(run_dir: str | Path) -> list[float]:
    """The loss of each step a run recorded, in order."""
    return [record["loss"] for record in metric_records(run_dir)]


def rewind(run_dir: Path, to: Path, step: int) -> Path:
    """A copy of a finished run at ``to`` as it stood after checkpoint ``step`` (as if the job had ended there)."""
    shutil.copytree(run_dir, to)
    (to / "final.json").unlink()
    for later, path in checkpoint.checkpoints(to / "checkpoints"):
        if later > step:
            shutil.rmtree(path)
    return to
