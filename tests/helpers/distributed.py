"""Multi-process training on CPU (gloo): the worker script and the command lines that launch it, shared by
tests/test_train_distributed.py, test_checkpoint_verification.py and test_global_batch.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

WORKER = Path(__file__).with_name("distributed_worker.py")


def worker_command(nproc: int, config: Path, log: Path | None = None) -> list[str]:
    """The command line that trains the run configured in ``config`` on ``nproc`` processes: torchrun for more than
    one, or when collectives are logged to ``log``; a plain interpreter for one."""
    args = [str(WORKER), str(config), *([str(log)] if log is not None else [])]
    if nproc > 1 or log is not None:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), *args]
    return [sys.executable, *args]


def run_distributed(
    tmp_path: Path,
    name: str,
    nproc: int,
    micro_batch: int,
    recipe: str,
    *,
    steps: int = 3,
    every: int = 3,
    data_parallel: str = "auto",
    log: Path | None = None,
    env: dict | None = None,
    **settings,
) -> Path:
    """Train run ``name`` (dense_debug, seed 5, random tokens) in ``tmp_path / name`` on ``nproc`` processes, a
    checkpoint every ``every`` steps; returns the run directory."""
    run_dir = tmp_path / name
    cfg = {
        "run_dir": str(run_dir),
        "model": "dense_debug",
        "recipe": recipe,
        "seed": 5,
        "steps": steps,
        "micro_batch": micro_batch,
        "accumulation": 1,
        "data": None,
        "checkpoint_every": every,
        "keep_checkpoints": 4,
        "optim": {"lr": 3e-3},
        "data_parallel": data_parallel,
        **settings,
    }
    path = tmp_path / f"{name}-{nproc}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    command = worker_command(nproc, path, log)
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir
