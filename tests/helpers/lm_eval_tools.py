"""Helpers of the lm-eval tests: a toy tokenizer and inference wrapper for ``UE5M3LM``, a tiny local task folder
written by the project's own task writer (no OLMES data needed), and lm-eval's command line in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from ue5m3.evaluation import olmes

__all__ = ["ByteTokenizer", "Unit", "TINY_TASK", "write_tiny_task", "run_lm_eval_cli"]


class ByteTokenizer:
    """Toy tokenizer: one id per UTF-8 byte, offset past PAD/BOS/EOS (0, 1, 2)."""

    eos_id = 2
    bos_id = 1

    def encode(self, text: str) -> list[int]:
        return [3 + b for b in text.encode("utf-8")]


class Unit:
    """Minimal inference wrapper: ``forward_unit`` counts its calls and records the input shapes."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.calls: list[tuple[int, ...]] = []

    def forward_unit(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.calls.append(tuple(input_ids.shape))
        return self.model(input_ids)


TINY_TASK = "ue5m3_tiny_mc"
_TINY_DOCS = [
    {"id": "0", "context": "the quick brown fox", "choices": [" jumps", " dog", " lazy"], "gold": 0},
    {"id": "1", "context": "over the lazy", "choices": [" fox", " dog"], "gold": 1},
    {"id": "2", "context": "the lazy dog", "choices": [" jumps", " quick"], "gold": 0},
]


def write_tiny_task(task_dir: Path) -> str:
    """A task folder holding one multiple-choice task of three short docs, written as the builders write theirs
    (docs and manifest here, the YAML and the loader by :func:`ue5m3.evaluation.olmes.write_configs`)."""
    task_dir.mkdir(parents=True, exist_ok=True)
    with (task_dir / f"{TINY_TASK}.jsonl").open("w") as f:
        f.writelines(json.dumps(d) + "\n" for d in _TINY_DOCS)
    manifest = {TINY_TASK: {"suite": "core9", "task": "tiny", "formulation": "mc", "metric": "acc", "n_docs": 3}}
    (task_dir / olmes.MANIFEST).write_text(json.dumps(manifest))
    olmes.write_configs(task_dir)
    return TINY_TASK


def run_lm_eval_cli(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``command`` (lm-eval's own CLI or ``ue5m3 lm-eval``, as a list after the interpreter) offline in ``cwd``."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, *command], cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )
