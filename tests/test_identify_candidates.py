"""Tests of ue5m3.identify.candidates: candidate names and parameters, the grid, and the candidates' accumulation
against the GEMM layer and a scalar reference in exact rationals."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from helpers.rational import fp32 as _round_fp32
from helpers.rational import snap as _snap
from ue5m3.identify import candidate_grid, parse
from ue5m3.identify.candidates import Candidate, accumulate_cells
from ue5m3.numerics import gemm
from ue5m3.numerics.quantize import quantize


@pytest.mark.parametrize(
    "name", ["w64-exact-rtz-g1024", "wK-exact-rne", "w32-fused13-rtz-p128", "w64-fused35-rtz", "w16-exact-rne-g4096"]
)
def test_candidate_names_round_trip(name: str) -> None:
    assert parse(name).name == name


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"slice_width": 64, "rounding": "sf"}, "rounding"),
        ({"slice_width": 64, "final_grid": 1000}, "final_grid"),
        ({"slice_width": None, "partial_bits": 13}, "fused"),
        ({"slice_width": 64, "partial_bits": 48}, "partial_bits"),
        ({"slice_width": 64, "promotion": 96}, "promotion"),
        ({"slice_width": 64, "promotion": 64}, "promotion"),
    ],
)
def test_candidate_rejects_bad_parameters(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Candidate(**kwargs)


def test_parse_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="cannot parse candidate 'w64-rtz'"):
        parse("w64-rtz")


def test_grid_sizes() -> None:
    grid = candidate_grid()
    # 5 widths x 2 roundings x 6 grids, MMA-Sim, and the exact sum under each grid
    assert len(grid) == 60 + 1 + 6
    assert len({c.name for c in grid}) == len(grid)


def _operands(scheme: str, m: int, k: int, n: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=gen) * torch.exp2(
        torch.randint(-8, 8, (m, k // 16), generator=gen)
    ).repeat_interleave(16, 1)
    b = torch.randn(k, n, generator=gen) * torch.exp2(
        torch.randint(-8, 8, (k // 16, n), generator=gen)
    ).repeat_interleave(16, 0)
    return quantize(a, scheme, axis=1), quantize(b, scheme, axis=0)


@pytest.mark.parametrize("scheme", ["nvfp4", "ue5m3_b16"])
@pytest.mark.parametrize(
    ("width", "rounding", "grid"), [(64, "rtz", 1024), (64, "rne", None), (32, "rtz", None), (128, "rne", 4096)]
)
def test_exact_candidates_equal_probe_matched_gemm(scheme: str, width: int, rounding: str, grid: int | None) -> None:
    a_q, b_q = _operands(scheme, 12, 256, 10, seed=width)
    full = gemm.matmul(a_q, b_q, "probe_matched", slice_width=width, cross_slice_rounding=rounding, final_grid=grid)
    products = a_q.encoded().double()[:, None, :] * b_q.encoded().double().T[None, :, :]  # [M, N, K]
    cand = Candidate(slice_width=width, rounding=rounding, final_grid=grid)
    out = accumulate_cells(products.reshape(-1, 256), cand, block=16) * gemm.alpha(a_q, b_q)
    assert torch.equal(out.view(torch.int32), full.reshape(-1).view(torch.int32))


def test_fused35_is_the_leading_bit_reading_not_mma_sims_scale_exponent_alignment() -> None:
    """Sub-block sums +8 and -8 at scale 2^-20 cancel beside a term 2^-54: w64-fused35-rtz aligns on the terms'
    leading bits and truncates it; MMA-Sim (gemm's mma_sim) aligns on the scale exponents and keeps it."""
    a = torch.zeros(1, 64)
    a[0, :8], a[0, 16:24], a[0, 30] = 2.0**-20, -(2.0**-20), 6 * 2.0**-20
    a[0, 32], a[0, 62] = 0.5 * 2.0**-52, 6 * 2.0**-52
    b = torch.zeros(64, 1)
    b[:30, 0], b[31, 0], b[32, 0], b[63, 0] = 1.0, 6.0, 0.5, 6.0
    a_q, b_q = quantize(a, "mxfp4"), quantize(b, "mxfp4", axis=0)
    products = a_q.encoded().double()[:, None, :] * b_q.encoded().double().T[None, :, :]
    fused = accumulate_cells(products.reshape(-1, 64), parse("w64-fused35-rtz"), block=16)
    assert float(fused) == 0.0 and float(gemm.matmul(a_q, b_q, "mma_sim")) == 2.0**-54


# ----- scalar reference in exact rationals -----------------------------------------------------------------------


def _truncate(t: Fraction, quantum: Fraction) -> Fraction:
    n = abs(t) // quantum
    return (n if t >= 0 else -n) * quantum


def _reference(products: list[Fraction], c: Candidate, block: int) -> Fraction:
    width = c.slice_width or len(products)
    span = c.promotion or width
    products = products + [Fraction(0)] * (-len(products) % span)
    outer, inner = Fraction(0), Fraction(0)
    for j in range(len(products) // width):
        chunk = products[j * width : (j + 1) * width]
        if c.partial_bits is None:
            inner = _round_fp32(inner + _round_fp32(sum(chunk), "rne"), c.rounding.value)
        else:
            terms = [sum(chunk[i : i + block]) for i in range(0, width, block)] + [inner]
            nonzero = [abs(t) for t in terms if t != 0]
            if nonzero:
                top = max(math.floor(math.log2(float(t))) for t in nonzero)  # floats suffice: exact powers of two
                top = max(e for e in range(top - 1, top + 2) if Fraction(2) ** e <= max(nonzero))
                quantum = Fraction(2) ** (top - c.partial_bits)
                inner = _round_fp32(sum(_truncate(t, quantum) for t in terms), c.rounding.value)
        if c.promotion is not None and ((j + 1) * width) % c.promotion == 0:
            outer, inner = _round_fp32(outer + inner, "rne"), Fraction(0)
    acc = inner if c.promotion is None else _round_fp32(outer + inner, "rne")
    return _snap(acc, c.final_grid)


@pytest.mark.parametrize(
    ("name", "block"),
    [("w32-fused13-rtz-p128", 1), ("w32-fused14-rne", 1), ("w64-fused35-rtz", 16), ("w16-exact-rtz-p64-g2048", 16),
     ("wK-exact-rne-g1024", 16), ("w64-exact-rtz", 16), ("w32-exact-rne-p96", 16), ("w48-exact-rtz", 16)],
)  # fmt: skip
def test_candidates_against_exact_rationals(name: str, block: int) -> None:
    gen = torch.Generator().manual_seed(len(name))
    k = 272  # not a multiple of every slice: exercises the zero padding of the last slice
    scale = torch.exp2(torch.randint(-30, 12, (6, k), generator=gen).to(torch.float64))
    products = torch.randint(-64, 65, (6, k), generator=gen).to(torch.float64) * scale
    out = accumulate_cells(products, parse(name), block=block)
    for row in range(6):
        expected = _reference([Fraction(float(p)) for p in products[row]], parse(name), block)
        assert Fraction(float(out[row])) == expected, (name, row)


@pytest.mark.parametrize(
    ("model", "package_model"), [("mma_sim_hopper_fp8", "hopper_wgmma"), ("mma_sim_blackwell_fp8", "blackwell_tcgen05")]
)
@pytest.mark.parametrize("spread", [0.0, 5.0])
def test_mma_sims_fp8_models_equal_the_mmasim_package(model, package_model, spread) -> None:
    """E4M3 operands over a wide exponent range, zero rows and columns: the identification's MMA-Sim FP8 models
    (alignment on operand exponents, e_zero, Hopper's 13-bit output) equal mmasim 2.1.1 bit for bit."""
    pytest.importorskip("mmasim", reason="mmasim is not installed (pip install 'ue5m3[conformance]')")
    from ue5m3.conformance.adapters.mmasim import fp8_gemm
    from ue5m3.identify.mma_models import t_fdpa_chain

    g = torch.Generator().manual_seed(int(spread) + 3)
    a = torch.randn(6, 192, generator=g) * torch.exp2(spread * torch.randn(6, 192, generator=g))
    b = torch.randn(192, 4, generator=g) * torch.exp2(spread * torch.randn(192, 4, generator=g))
    a, b = (torch.nan_to_num(t.clamp(-448, 448).to(torch.float8_e4m3fn).float()) for t in (a, b))
    a[0, :64], b[::3, 1] = 0.0, 0.0
    rows, cols = torch.arange(6).repeat_interleave(4), torch.arange(4).repeat(6)
    expected = fp8_gemm(a, b, package_model)[rows, cols].contiguous()
    got = t_fdpa_chain(a[rows], b[:, cols].t(), model)
    assert torch.equal(got.view(torch.int32), expected.view(torch.int32))
