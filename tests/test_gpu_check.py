"""The GPU check's CPU-side behaviour: it fails closed without CUDA and fills the docs section from its JSON."""

import sys

import pytest
import torch

from helpers.benchmark_scripts import load_benchmark
from ue5m3.layers.linear import layer_index


def _module():
    return load_benchmark("gpu_check")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the check would really run")
def test_without_cuda_the_check_says_so_and_writes_nothing(tmp_path, capsys):
    out, docs = tmp_path / "check.json", tmp_path / "performance.md"
    docs.write_text("x\n<!-- gpu-check:begin -->\nold\n<!-- gpu-check:end -->\n")
    assert _module().main(["--out", str(out), "--docs", str(docs)]) == 2
    assert "no CUDA device" in capsys.readouterr().out
    assert not out.exists() and "old" in docs.read_text()


def test_results_fill_the_docs_section_between_its_markers(tmp_path):
    check = _module()
    docs = tmp_path / "performance.md"
    docs.write_text("# Performance\n\nbefore\n<!-- gpu-check:begin -->\nstale\n<!-- gpu-check:end -->\nafter\n")
    result = {
        "date": "2026-12-01",
        "gpu": "NVIDIA H200",
        "torch": "2.13.0",
        "triton": "3.9.0",
        "cases": 3,
        "identical": 2,
        "different": ["quantize nvfp4 sr 2d"],
        "benchmarks": [
            {"case": "copy (x.clone())", "seconds": 0.001, "copy_bandwidth_fraction": 1.0},
            {"case": "probe_matched mlp", "seconds": 0.01, "bf16_mm_seconds": 0.004, "x_bf16": 2.5},
            {"case": "FP4 linear", "seconds": 0.02, "x_bf16": 1.9, "peak_mib": 900.0, "bf16_peak_mib": 500.0},
            {
                "case": "nemotron_h_8b 2 layers, ue5m3_b16",
                "seconds": 0.5,
                "tokens_per_s": 8192.0,
                "peak_memory_gib": 30.0,
                "x_bf16": 1.8,
            },
        ],
        "identification": [
            {
                "case": "Hopper FP8 identification, use_fast_accum=False",
                "identified": ["w32-fused13-rtz-p128"],
                "best": "w32-fused13-rtz-p128",
                "cells": 900,
                "best_score": 900,
                "seconds": 12.0,
            }
        ],
    }
    result["compiled"] = {
        "capability": 90,
        "kernels": {
            "probe fast": {
                "registers": 127,
                "stack_bytes": 0,
                "shared_bytes": 73728,
                "ctas_per_sm": 2,
                "mma": 4,
                "fp64": 0,
            }
        },
    }
    result["section_seconds"] = {"identity": 41.0, "gemm": 12.4}
    check.update_docs(docs, check.render_markdown(result))
    text = docs.read_text()
    assert "stale" not in text and text.startswith("# Performance\n\nbefore\n") and text.endswith("after\n")
    assert "NVIDIA H200" in text and "2 of 3 cases identical; different: quantize nvfp4 sr 2d" in text
    assert "| probe_matched mlp | 0.0100 | 2.50 x BF16 |" in text and "8192 tokens/s, 30.0 GiB peak" in text
    assert "| FP4 linear, peak 900 MiB (BF16 500 MiB) | 0.0200 | 1.90 x BF16 |" in text
    assert "use_fast_accum=False (900 cells, 12 s): w32-fused13-rtz-p128." in text
    assert "Compiled for sm_90" in text and "| probe fast | 127 | 0 | 73728 | 2 | 4 | 0 |" in text
    assert "Time per part: identity 41 s, gemm 12 s." in text
    plain = tmp_path / "plain.md"
    plain.write_text("no markers\n")
    with pytest.raises(ValueError, match="no '<!-- gpu-check:begin -->'"):
        check.update_docs(plain, "s")


@pytest.mark.triton
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # numpy's 1/0 for a zero NVFP4 scale, as on the GPU
def test_the_bit_identity_suite_passes_in_the_interpreter(monkeypatch):
    """The quick identity suite, device set to the CPU under TRITON_INTERPRET=1 at smaller sizes: the check's own
    code paths run before it ever meets a GPU, and every case is identical there too."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1" or torch.cuda.is_available():
        pytest.skip("runs the Triton kernels in the interpreter on a machine without a GPU")
    check = _module()
    monkeypatch.setattr(check, "DEVICE", "cpu")
    small = {"quantize": (64, 128), "both_axes": (96, 160), "gemm": (80, 256, 96), "linear": (64, 128, 192)}
    monkeypatch.setattr(check, "SIZES", small)
    cases = check.bit_identity(quick=True)
    assert len(cases) > 40
    assert [c["case"] for c in cases if not c["equal"]] == []


@pytest.mark.triton
@pytest.mark.slow
def test_the_gemm_benchmarks_run_in_the_interpreter(monkeypatch):
    """The GEMM benchmark's code paths (the Gaussian case, the exact path forced, B prepared once, outlier channels
    and their exact-path share) on the CPU under TRITON_INTERPRET=1 at one small shape: the rows it writes, not
    the times (never asserted)."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1" or torch.cuda.is_available():
        pytest.skip("runs the Triton kernels in the interpreter on a machine without a GPU")
    check = _module()
    monkeypatch.setattr(check, "DEVICE", "cpu")
    monkeypatch.setattr(check, "SHAPES_8B", {"attention q/o": (64, 128, 64)})
    rows = check.bench_gemm(repeats=1, quick=True)
    assert [r["case"].split(" (")[0] for r in rows] == [
        "probe_matched attention q/o 64x128x64",
        "probe_matched attention q/o, fast path off",
        "probe_matched attention q/o, B prepared once",
        "probe_matched attention q/o, 1% outlier channels x100",
        "probe_matched attention q/o, 1% outlier channels x1000",
    ]
    assert all(r["seconds"] > 0 and r["x_bf16"] > 0 for r in rows)
    assert 0.0 <= rows[3]["exact_share"] <= rows[4]["exact_share"] <= 1.0


@pytest.mark.triton
@pytest.mark.slow
def test_the_captured_operand_benchmark_runs_in_the_interpreter(monkeypatch):
    """The real-operand benchmark's code paths (one microbatch captured, its last block's GEMMs timed through the
    Triton kernel beside their exact-path share) on the CPU under TRITON_INTERPRET=1, on the pipeline's 12-block CPU
    training model at 64 tokens (wgrad K: a whole slice): the rows it writes, not the times."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1" or torch.cuda.is_available():
        pytest.skip("runs the Triton kernels in the interpreter on a machine without a GPU")
    check = _module()
    monkeypatch.setattr(check, "DEVICE", "cpu")
    overrides = {"vocab_size": 512, "hybrid_override_pattern": "*-M-M-M-M-M-"}
    monkeypatch.setattr(check, "CAPTURED", {"model": "nemotron_h_debug", "overrides": overrides, "sequence": 64})
    path = list(sys.path)
    rows = check.bench_captured(repeats=1, quick=True)
    assert sys.path == path  # the sibling script is loaded by its path: benchmarks/ names would shadow modules
    *gemms, together = rows
    assert gemms and all(
        r["case"].startswith("probe_matched captured nemotron_h_debug init backbone.layers.") for r in gemms
    )
    assert {r["case"].split()[5] for r in gemms} == {"fprop", "dgrad", "wgrad"}
    assert len({layer_index(r["case"].split()[4]) for r in gemms}) == 1  # quick: the last block only
    assert all(r["seconds"] > 0 and r["x_bf16"] > 0 and 0.0 <= r["exact_share"] <= 1.0 for r in gemms)
    assert together["case"].startswith(f"probe_matched captured nemotron_h_debug init, the {len(gemms)} GEMMs")
    assert 0.0 <= together["captured"]["share"] <= together["captured"]["flagged_share"] <= 1.0
