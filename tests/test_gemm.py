"""GEMM output models against a scalar reference in exact rational arithmetic (fractions)."""

from fractions import Fraction

import numpy as np
import pytest
import torch

from helpers.rational import fp32 as _fp32
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
    """The GEMM as MMA-Sim's released package computes it (``mmasim`` 2.1.1, ``TCGen05MMABlockScale``, k = 64,
    chained along K), then times alpha in FP32: the peer itself, not a transcription of its code."""
    pytest.importorskip("mmasim", reason="mmasim is not installed (pip install 'ue5m3[conformance]')")
    from ue5m3.conformance.adapters.mmasim import block_scaled_accumulator

    return block_scaled_accumulator(a_q, b_q) * gemm.alpha(a_q, b_q)


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


@pytest.mark.parametrize(
    ("backend", "exact_path"), [("torch", "_block_partials"), ("cpu_kernel", "cpu_kernel.probe_exact_outputs")]
)
def test_probe_matched_exact_path_handles_huge_exponent_gaps_inside_a_slice(monkeypatch, backend, exact_path):
    # Blocks of wildly different magnitude in one 64-slice push the products past FP64's 53 bits,
    # forcing the TwoSum/round-to-odd path (torch ops, or its C transcription); the result must still be the
    # exact-sum rounding.
    if backend == "cpu_kernel" and not gemm.cpu_kernel.available():
        pytest.skip("no C compiler for the CPU kernel")
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
    owner, _, name = exact_path.rpartition(".")
    module = gemm.cpu_kernel if owner else gemm
    original = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs))
    for rounding in ("rtz", "rne"):
        got = gemm.matmul(a_q, b_q, "probe_matched", cross_slice_rounding=rounding, final_grid=None, backend=backend)
        assert torch.equal(got, reference_probe_matched(a_q, b_q, rounding=rounding, grid=None))
    assert calls, "the exact TwoSum path was not exercised"


def test_one_b_operand_in_many_gemms_gives_the_bits_of_a_fresh_one_each_time(monkeypatch):
    # a cached weight is the same QuantizedTensor in every GEMM of its epoch: what the GEMM derives from it alone
    # (its scale extremes, the columns its span check sends to the exact path) is formed once and must not leak
    # from one A operand to the next
    if not gemm.cpu_kernel.available():
        pytest.skip("no C compiler for the CPU kernel")
    exact = []
    original = gemm.cpu_kernel.probe_exact_outputs

    def recording(out, *args, rows, cols, **kwargs):
        exact.append((rows.tolist(), cols.tolist()))
        return original(out, *args, rows=rows, cols=cols, **kwargs)

    monkeypatch.setattr(gemm.cpu_kernel, "probe_exact_outputs", recording)
    g = torch.Generator().manual_seed(9)
    b = torch.randn(64, 5, generator=g)
    b[:16, :2] *= 2.0**-14  # two columns whose slices span too many bits for an FP64 sum: the exact path's
    b[48:, :2] *= 2.0**10
    b_q = quantize(b, "ue5m3_b16", axis=0)
    for spread in (False, True, False, True):  # A rows with and without such slices
        a = torch.randn(3, 64, generator=g)
        if spread:
            a[:2, :16] *= 2.0**10
            a[:2, 48:] *= 2.0**-14
        a_q = quantize(a, "ue5m3_b16")
        exact.clear()
        got = gemm.matmul(a_q, b_q, "probe_matched")
        assert exact == [([0, 1] if spread else [], [0, 1])]
        assert torch.equal(got, gemm.matmul(a_q, quantize(b, "ue5m3_b16", axis=0), "probe_matched"))
        assert torch.equal(got, reference_probe_matched(a_q, b_q))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("spread", [0.0, 10.0])
@pytest.mark.parametrize("scheme", ["ue5m3_b16", "nvfp4", "mxfp4"])
def test_mma_sim_equals_the_mmasim_package(seed, spread, scheme):
    a_q, b_q = _operands(seed, scheme=scheme, spread=spread)
    assert torch.equal(gemm.matmul(a_q, b_q, "mma_sim"), reference_mma_sim(a_q, b_q))


def _mx_operands(a_blocks, b_blocks):
    """MXFP4 operands [1, K] and [K, 1] from (payload list, scale exponent) per 32-block: each block gets one
    element of magnitude 6 where the other operand is zero, so the OCP floor rule gives exactly scale 2^e."""

    def build(blocks, spare):
        values = []
        for payload, e in blocks:
            block = list(payload) + [0.0] * (32 - len(payload))
            block[spare] = 6.0
            values += [v * 2.0**e for v in block]
        return torch.tensor(values, dtype=torch.float32)

    a, b = build(a_blocks, 30), build(b_blocks, 31)  # spare slots 30 (A) and 31 (B) meet zeros
    return quantize(a[None, :], "mxfp4"), quantize(b[:, None], "mxfp4", axis=0)


def _ones_at(*positions, value=1.0):
    out = [0.0] * 30
    for p in positions:
        out[p] = value
    return out


def test_mma_sim_aligns_on_scale_exponents_not_leading_bits():
    """Two sub-block sums of +8 and -8 at scale exponent -20 (unnormalised: their leading bit is -17) cancel. The
    quantum is 2^(-20-35) = 2^-55, so a small block's term 2^-54 survives; aligning on the leading bits (2^-52)
    would truncate it to zero."""
    cancel = [1.0] * 8 + [0.0] * 8 + [-1.0] * 8 + [0.0] * 6
    a_q, b_q = _mx_operands(
        [(cancel, -20), (_ones_at(0, value=0.5), -52)], [([1.0] * 30, 0), (_ones_at(0, value=0.5), 0)]
    )
    got = gemm.matmul(a_q, b_q, "mma_sim")
    assert torch.equal(got, reference_mma_sim(a_q, b_q))
    assert float(got) == 2.0**-54


def test_mma_sim_zero_sum_sub_block_still_sets_the_alignment():
    """A sub-block whose products cancel to zero at scale exponent 20 sets the quantum to 2^-15, so a tiny block
    (2^-22) beside it is truncated away; ignoring zero terms would keep it."""
    a_blocks = [(_ones_at(0, 1, value=1.0), 20), (_ones_at(0, value=1.0), -22)]
    a_blocks[0] = ([1.0, -1.0] + [0.0] * 28, 20)
    b_blocks = [([1.0, 1.0] + [0.0] * 28, 0), (_ones_at(0), 0)]
    a_q, b_q = _mx_operands(a_blocks, b_blocks)
    got = gemm.matmul(a_q, b_q, "mma_sim")
    assert torch.equal(got, reference_mma_sim(a_q, b_q))
    assert float(got) == 0.0
    kept = _mx_operands([([0.0] * 30, 0), (_ones_at(0, value=1.0), -22)], [([0.0] * 30, 0), (_ones_at(0), 0)])
    assert float(gemm.matmul(*kept, "mma_sim")) == 2.0**-22  # the zero block at scale 1 truncates nothing here


def test_mma_sim_all_zero_product_group_sets_no_alignment():
    """mmasim 2.1.1: a group whose products are all zero takes e_zero = -139, so a zero block at scale 2^20 beside
    a tiny block (2^-22) leaves it whole; the repository at c7851383 let the zero group set the quantum 2^-15 and
    truncated the tiny block away."""
    a_q, b_q = _mx_operands([([0.0] * 30, 20), (_ones_at(0), -22)], [([1.0] * 30, 0), (_ones_at(0), 0)])
    got = gemm.matmul(a_q, b_q, "mma_sim")
    assert torch.equal(got, reference_mma_sim(a_q, b_q))
    assert float(got) == 2.0**-22


@pytest.mark.parametrize(
    "a_exponents,b_exponents",
    [((-127, -127), (-127, -127)), ((-127, 60), (-127, 60)), ((60, -127), (-100, 60)), ((125, 0), (-127, 0))],
)
def test_mma_sim_equals_mmasim_at_ue8m0_scale_extremes(a_exponents, b_exponents):
    """Scale exponents down to UE8M0's -127 (sums below e_zero, so a zero C sets the alignment) and up to 125."""
    g = torch.Generator().manual_seed(sum(a_exponents) + 7 * sum(b_exponents) + 1000)

    def blocks(exponents):
        return [([float(v) for v in torch.randint(-4, 5, (30,), generator=g) * 0.5], e) for e in exponents]

    a_q, b_q = _mx_operands(blocks(a_exponents) * 2, blocks(b_exponents) * 2)  # K = 128: two instructions
    got, expected = gemm.matmul(a_q, b_q, "mma_sim"), reference_mma_sim(a_q, b_q)
    assert torch.equal(got.view(torch.int32), expected.view(torch.int32))


@pytest.mark.parametrize("scheme", ["nvfp4", "mxfp4", "ue5m3_b16"])
def test_mma_sim_equals_mmasim_on_sparse_operands_with_zero_groups_and_zero_scales(scheme):
    """Zero blocks (NVFP4: scale 0, no repair), zero products where the operands' zeros meet, spread scales."""
    g = torch.Generator().manual_seed(17)
    a = torch.randn(6, 256, generator=g) * torch.exp2(12 * torch.randn(6, 16, generator=g)).repeat_interleave(16, 1)
    b = torch.randn(256, 5, generator=g) * torch.exp2(12 * torch.randn(16, 5, generator=g)).repeat_interleave(16, 0)
    a[:, 16:48], b[64:96, 2], a[1, ::2], b[1::2, 3] = 0.0, 0.0, 0.0, 0.0
    a[2, 128:144] = 1e-38  # an NVFP4 scale that rounds to zero
    a_q, b_q = quantize(a, scheme), quantize(b, scheme, axis=0)
    assert torch.equal(gemm.matmul(a_q, b_q, "mma_sim"), reference_mma_sim(a_q, b_q))


def test_mma_sim_sums_32_element_mxfp4_blocks_as_two_16_element_sub_blocks():
    """C = 2 (first instruction), then -1 products at elements 0 and 16 of one 32-block with scale 2^-35: each
    16-half is -2^-35, half a quantum (2^-34), truncated to 0 on its own -> exactly 2.0; one 32-element term
    would be -2^-34, one quantum, giving 2 - 2^-23 after RTZ."""
    first = ([2.0] + [0.0] * 29, 0)
    a_blocks = [first, (_ones_at(), 0), (_ones_at(0, 16, value=-1.0), -35), (_ones_at(), 0)]
    b_blocks = [(_ones_at(0), 0), (_ones_at(), 0), (_ones_at(0, 16), 0), (_ones_at(), 0)]
    a_q, b_q = _mx_operands(a_blocks, b_blocks)
    got = gemm.matmul(a_q, b_q, "mma_sim")
    assert torch.equal(got, reference_mma_sim(a_q, b_q))
    assert float(got) == 2.0
    together = [first, (_ones_at(), 0), (_ones_at(0, 1, value=-1.0), -35), (_ones_at(), 0)]
    b_together = [(_ones_at(0), 0), (_ones_at(), 0), (_ones_at(0, 1), 0), (_ones_at(), 0)]
    assert float(gemm.matmul(*_mx_operands(together, b_together), "mma_sim")) == float(np.float32(2 - 2.0**-23))


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


@pytest.mark.parametrize("model", ["decoded", "encoded_fp32", "probe_matched", "mma_sim"])
def test_gemm_models_stay_fp32_under_an_enclosing_bf16_autocast(model):
    a_q, b_q = _operands(3)
    plain = gemm.matmul(a_q, b_q, model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = gemm.matmul(a_q, b_q, model)
    assert inside.dtype == torch.float32 and torch.equal(inside, plain)


def test_output_head_stays_fp32_under_an_enclosing_bf16_autocast():
    from ue5m3.models.layers import OutputHead

    head = OutputHead(64, 32)
    torch.nn.init.normal_(head.weight)
    x = torch.randn(4, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = head(x)
    assert inside.dtype == torch.float32 and torch.equal(inside, head(x))


@pytest.mark.parametrize("model", ["decoded", "encoded_fp32", "probe_matched", "mma_sim"])
@pytest.mark.parametrize(("m", "n"), [(0, 16), (4, 0)])
def test_an_empty_gemm_returns_fp32_zeros_of_its_shape(model, m, n):
    a = quantize(torch.zeros(m, 64), "nvfp4")
    b = quantize(torch.randn(64, n), "nvfp4", axis=0)
    out = gemm.matmul(a, b, model)
    assert out.shape == (m, n) and out.dtype == torch.float32
