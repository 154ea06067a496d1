"""GEMM output models against a scalar reference in exact rational arithmetic (fractions)."""

from fractions import Fraction

import pytest
import torch

from rational import fp32 as _fp32
from ue5m3.numerics import gemm
from ue5m3.numerics.quantize import quantize


def _encoded(q, rows_first: bool):
    enc = q.encoded().double()
    return [[Fraction(float(v)) for v in row] for row in (enc if rows_first else enc.T)]


def reference_probe_matched(a_q, b_q, width=64, rounding="rtz", grid=1024):
    a, b = _encoded(a_q, True), _encoded(b_q, False)
    alpha = Fraction(float(gemm.alpha(a_q, b_q)))
    out = []
    for row in a:
        out_row = []
        for col in b:
            acc = Fraction(0)
            for j in range(0, len(row), width):
                p = _fp32(sum(x * y for x, y in zip(row[j : j + width], col[j : j + width], strict=True)))
                acc = _fp32(acc + p, rounding)
            if grid:
                scaled = acc * grid
                acc = Fraction(round(scaled), grid)  # Python round of a Fraction: half to even
            out_row.append(float(_fp32(acc * alpha)))
        out.append(out_row)
    return torch.tensor(out, dtype=torch.float32)


def reference_mma_sim(a_q, b_q):
    a, b = _encoded(a_q, True), _encoded(b_q, False)
    alpha = Fraction(float(gemm.alpha(a_q, b_q)))
    out = []
    for row in a:
        out_row = []
        for col in b:
            acc = Fraction(0)
            for j in range(0, len(row), 64):
                terms = [
                    sum(x * y for x, y in zip(row[i : i + 16], col[i : i + 16], strict=True))
                    for i in range(j, j + 64, 16)
                ]
                terms.append(acc)
                nonzero = [abs(t) for t in terms if t != 0]
                if not nonzero:
                    acc = Fraction(0)
                    continue
                top = max(nonzero)
                exponent = top.numerator.bit_length() - top.denominator.bit_length()
                if Fraction(2) ** exponent > top:
                    exponent -= 1
                quantum = Fraction(2) ** (exponent - 35)
                total = sum(int(t / quantum) * quantum for t in terms)  # int() truncates toward zero
                acc = _fp32(total, "rtz")
            out_row.append(float(_fp32(acc * alpha)))
        out.append(out_row)
    return torch.tensor(out, dtype=torch.float32)


def _operands(seed, m=3, k=128, n=4, scheme="ue5m3_b16", spread=0.0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g) * torch.exp2(spread * torch.randn(m, k // 16, generator=g)).repeat_interleave(
        16, 1
    )
    b = torch.randn(k, n, generator=g) * torch.exp2(spread * torch.randn(k // 16, n, generator=g)).repeat_interleave(
        16, 0
    )
    return quantize(a, scheme, axis=-1), quantize(b, scheme, axis=0)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("spread", [0.0, 6.0, 20.0])
@pytest.mark.parametrize("rounding,grid", [("rtz", 1024), ("rtz", None), ("rne", None), ("rne", 4096)])
def test_probe_matched_equals_exact_rational_reference(seed, spread, rounding, grid):
    a_q, b_q = _operands(seed, spread=spread)
    got = gemm.matmul(a_q, b_q, "probe_matched", cross_slice_rounding=rounding, final_grid=grid)
    assert torch.equal(got, reference_probe_matched(a_q, b_q, rounding=rounding, grid=grid))


@pytest.mark.parametrize("scheme", ["nvfp4", "ue5m3_b32"])
def test_probe_matched_equals_reference_for_other_schemes(scheme):
    a_q, b_q = _operands(11, scheme=scheme, spread=4.0)
    assert torch.equal(gemm.matmul(a_q, b_q, "probe_matched"), reference_probe_matched(a_q, b_q))


def test_probe_matched_exact_path_handles_huge_exponent_gaps_inside_a_slice(monkeypatch):
    # Blocks of wildly different magnitude in one 64-slice push the products past FP64's 53 bits,
    # forcing the TwoSum/round-to-odd path; the result must still be the exact-sum rounding.
    g = torch.Generator().manual_seed(5)
    a = torch.randn(2, 64, generator=g)
    a[:, :16] *= 2.0**10
    a[:, 48:] *= 2.0**-14
    b = torch.randn(64, 3, generator=g)
    b[:16] *= 2.0**-14
    b[48:] *= 2.0**10
    a_q, b_q = quantize(a, "ue5m3_b16"), quantize(b, "ue5m3_b16", axis=0)
    assert int(a_q.zero_rounded_blocks) == 0 and int(a_q.saturated_blocks) == 0
    calls = []
    original = gemm._block_partials
    monkeypatch.setattr(gemm, "_block_partials", lambda *args: calls.append(1) or original(*args))
    for rounding in ("rtz", "rne"):
        got = gemm.matmul(a_q, b_q, "probe_matched", cross_slice_rounding=rounding, final_grid=None)
        assert torch.equal(got, reference_probe_matched(a_q, b_q, rounding=rounding, grid=None))
    assert calls, "the exact TwoSum path was not exercised"


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("spread", [0.0, 10.0])
def test_mma_sim_equals_exact_rational_reference(seed, spread):
    a_q, b_q = _operands(seed, spread=spread)
    assert torch.equal(gemm.matmul(a_q, b_q, "mma_sim"), reference_mma_sim(a_q, b_q))


def test_decoded_and_encoded_models_agree_with_their_definitions():
    a_q, b_q = _operands(3)
    assert torch.equal(gemm.matmul(a_q, b_q, "decoded"), a_q.dequantize() @ b_q.dequantize())
    assert torch.equal(gemm.matmul(a_q, b_q, "encoded_fp32"), (a_q.encoded() @ b_q.encoded()) * gemm.alpha(a_q, b_q))


def test_alpha_follows_the_spec_formula_in_fp32():
    a_q, b_q = _operands(4)
    expected = (a_q.tensor_amax * b_q.tensor_amax) / (torch.tensor(2688.0) * torch.tensor(2688.0))
    assert torch.equal(gemm.alpha(a_q, b_q), expected)


def test_grid_snap_zeroes_the_dead_zone_of_the_encoded_accumulator():
    # Every encoded accumulator in [-1/2048, 1/2048] becomes 0 on the 1/1024 grid.
    acc = torch.tensor([1 / 2048, -1 / 2048, 1 / 2049, 3 / 2048], dtype=torch.float32)
    snapped = torch.round(acc * 1024) / 1024
    assert snapped.tolist() == [0.0, -0.0, 0.0, 2 / 1024]


def test_two_d_weight_operand_gives_the_same_result_as_reading_its_tiles():
    g = torch.Generator().manual_seed(8)
    x, w = torch.randn(4, 64, generator=g), torch.randn(32, 64, generator=g)
    x_q = quantize(x, "ue5m3_b16")
    wt_q = quantize(w.T.contiguous(), "ue5m3_b16", two_d=True)
    assert torch.equal(gemm.matmul(x_q, wt_q, "probe_matched"), reference_probe_matched(x_q, wt_q))


def test_bad_operands_are_refused_clearly():
    a_q, b_q = _operands(0, k=96)
    with pytest.raises(ValueError, match="multiple of slice_width"):
        gemm.matmul(a_q, b_q, "probe_matched")
    with pytest.raises(ValueError, match="axis=0"):
        gemm.matmul(a_q, quantize(torch.randn(96, 16), "ue5m3_b16", axis=-1), "decoded")
    with pytest.raises(ValueError, match="final_grid"):
        gemm.matmul(*_operands(0), "probe_matched", final_grid=1000)


def test_memory_bounded_tiling_gives_identical_results():
    a_q, b_q = _operands(9, m=37, n=11)
    full = gemm.matmul(a_q, b_q, "probe_matched")
    assert torch.equal(full, gemm.matmul(a_q, b_q, "probe_matched", tile_elements=16))
    assert torch.equal(gemm.matmul(a_q, b_q, "mma_sim"), gemm.matmul(a_q, b_q, "mma_sim", tile_elements=16))


def test_fused_slice_combination_equals_the_torch_reference_path(monkeypatch):
    a_q, b_q = _operands(21, m=43, k=256, n=27, spread=8.0)  # full 8x8 tiles and edge tiles
    for rounding in ("rtz", "rne"):
        fused = gemm.matmul(a_q, b_q, "probe_matched", cross_slice_rounding=rounding)
        with monkeypatch.context() as patch:
            patch.setattr(gemm.cpu_kernel, "available", lambda: False)
            reference = gemm.matmul(a_q, b_q, "probe_matched", cross_slice_rounding=rounding)
        assert torch.equal(fused, reference)


@pytest.mark.slow
def test_paper_sized_gemm_runs_within_bounded_memory(tmp_path):
    """The 8192x2048x6144 forward GEMM of the paper's witnesses under probe_matched, in a fresh process."""
    import json
    import subprocess
    import sys

    script = tmp_path / "big_gemm.py"
    script.write_text(
        "import json, resource, torch\n"
        "from ue5m3.numerics import gemm\nfrom ue5m3.numerics.quantize import quantize\n"
        "torch.manual_seed(0)\n"
        "a = quantize(torch.randn(8192, 2048), 'ue5m3_b16')\n"
        "b = quantize(torch.randn(2048, 6144), 'ue5m3_b16', two_d=True)  # W^T tiles, as in fprop\n"
        "out = gemm.matmul(a, b, 'probe_matched')\n"
        "ok = bool(torch.isfinite(out).all()) and out.shape == (8192, 6144)\n"
        "print(json.dumps({'ok': ok, 'peak_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))\n"
    )
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900, check=True)
    record = json.loads(result.stdout.splitlines()[-1])
    assert record["ok"]
    assert record["peak_mib"] < 8 * 1024  # the machine has 24 GiB; operands and result alone take about 1 GiB


def test_fused_step_refuses_sums_that_fp64_cannot_hold_exactly():
    from ue5m3.numerics.gemm import fused_step

    terms = torch.ones(256, 3, dtype=torch.float64)  # 257 terms with the accumulator: 9 bits of carries
    assert torch.equal(fused_step(terms, torch.zeros(3), bits=43), torch.full((3,), 256.0))
    with pytest.raises(ValueError, match="257 terms truncated at 44 bits"):
        fused_step(terms, torch.zeros(3), bits=44)
