"""benchmarks/exact_share.py on the CPU: every FP4 GEMM of a small model's training microbatch counted once per role,
with the counts fast_path.probe_paths gives for the operands, and the summary's shares weighted by tile-slices."""

import pytest
import torch

from helpers.benchmark_scripts import load_benchmark


def test_every_gemm_of_a_microbatch_is_counted_with_its_role():
    from ue5m3 import models
    from ue5m3.layers import recipes
    from ue5m3.training.config import model_layers

    share = load_benchmark("exact_share")
    overrides = {"vocab_size": 256}
    model = models.build("dense_debug", device="cpu", generator=torch.Generator().manual_seed(0), **overrides)
    linears = len(models.eligible_linears(model))
    recipe = recipes.get("ue5m3_b16").for_model(model_layers("dense_debug", overrides))
    tokens = torch.randint(0, 256, (1, 65), generator=torch.Generator().manual_seed(1))
    rows = share.capture(model, recipe, tokens, tiles=(64, 64))
    fp4 = {r["layer"] for r in rows}
    assert 0 < len(fp4) <= linears and sorted(r["gemm"] for r in rows) == sorted(["fprop", "dgrad", "wgrad"] * len(fp4))
    assert all(0 <= r["exact"] <= r["tile_slices"] and r["exact"] <= r["flagged_tile_slices"] for r in rows)
    fprop = next(r for r in rows if r["gemm"] == "fprop")
    m, k, n = fprop["shape"]
    assert m == 64 and fprop["tile_slices"] == -(-m // 64) * -(-n // 64) * (k // 64)


def test_the_summary_weights_every_tile_slice_alike():
    share = load_benchmark("exact_share")
    rows = [
        {"layer": "a", "gemm": "fprop", "exact": 1, "flagged_tile_slices": 4, "tile_slices": 8},
        {"layer": "b", "gemm": "fprop", "exact": 0, "flagged_tile_slices": 0, "tile_slices": 2},
        {"layer": "a", "gemm": "wgrad", "exact": 6, "flagged_tile_slices": 6, "tile_slices": 6},
    ]
    summary = share.summarise(rows)
    assert summary["share"] == pytest.approx(7 / 16) and summary["flagged_share"] == pytest.approx(10 / 16)
    assert summary["per_gemm"] == {"fprop": pytest.approx(0.1), "wgrad": 1.0}
    assert summary["flagged_per_gemm"] == {"fprop": pytest.approx(0.4), "wgrad": 1.0}
    assert [r["layer"] + r["gemm"] for r in summary["largest"]] == ["awgrad", "afprop", "bfprop"]
