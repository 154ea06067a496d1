"""ue5m3.artifacts' provenance records: torch's numerics settings where the process loaded torch, and nothing that
loads it where the process only reads tables and draws (the figure notebooks, the summary and claims verbs)."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from ue5m3.artifacts import provenance

DRAWING_MODULES = (
    "ue5m3.plotting",
    "ue5m3.experiments.claims",
    "ue5m3.experiments.comparisons",
    "ue5m3.experiments.training_summary",
    "ue5m3.evaluation.nll_records",
)


def test_the_drawing_modules_load_no_torch_and_their_provenance_says_so():
    script = "; ".join(
        [*(f"import {m}" for m in DRAWING_MODULES), "import sys, json", "from ue5m3.artifacts import provenance"]
        + ["print(json.dumps([sorted(m for m in ('torch',) if m in sys.modules), provenance('x', {})]))"]
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    loaded, record = json.loads(out.stdout.splitlines()[-1])
    assert loaded == [], "a module that only reads tables and draws imported torch"
    assert record["torch_numerics"] is None


def test_a_process_that_loaded_torch_records_its_numerics_settings():
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        numerics = provenance("x", {})["torch_numerics"]
    finally:
        torch.set_float32_matmul_precision(previous)
    deterministic = torch.are_deterministic_algorithms_enabled()
    assert numerics == {"float32_matmul_precision": "high", "deterministic_algorithms": deterministic}
