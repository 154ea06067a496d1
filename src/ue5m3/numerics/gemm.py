"""GEMM output models: how an FP4 GEMM forms its FP32 result from two block-quantized operands.

gemm spec section 2. All models take the same operands: A [M, K] quantized along K (``axis=-1``) and
B [K, N] quantized along K (``axis=0``), with equal block sizes. "Encoded" operands are payload * scale value
(exact in BF16); alpha = (g_A * g_B) / ((T_A * 6) * (T_B * 6)) in FP32 maps encoded products back to real units.

* ``decoded``: dequantize both operands to FP32 and matmul (what most FP4 emulators do).
* ``encoded_fp32``: FP32 matmul of the encoded operands, then times alpha (the paper's torch control).
* ``probe_matched``: the paper's model of native Blackwell NVFP4 GEMMs: K is cut into consecutive slices of
  ``slice_width`` (64); each slice's dot product is the exact sum rounded once to FP32; slices are combined in K
  order with FP32 additions rounded toward zero (``cross_slice_rounding="rtz"``) or to nearest; the encoded
  accumulator is optionally snapped to a 1/``final_grid`` lattice with ties to even; then times alpha.
* ``mma_sim``: Blackwell block-scaled MMA as MMA-Sim's released package computes it (``mmasim`` 2.1.1,
  ``mmasim.nv_ptx.sim.TCGen05MMABlockScale`` for k = 64: ``arithmetic/fdpa.py`` ``MMA_GST_FDPA`` with G = 16,
  F = 35, RZ-FP32, L_max = 64, e_zero = -139; arXiv 2511.10909; gemm spec 2.4): per 64-wide instruction, four
  16-element group sums (16 also inside 32-element MXFP4 blocks), each exact and unnormalised, carried at the sum
  of its two scale exponents; the accumulator and the four terms are aligned to the largest of those exponents
  and C's, each truncated toward zero 35 bits below it, summed exactly and truncated to FP32. A group whose
  products are all zero, or whose scale product is zero, takes the exponent e_zero = -139 and so sets no alignment
  (a group whose nonzero products cancel keeps its scale exponent); a zero C takes e_zero too. The repository at
  c7851383, which this model followed before, let an all-zero-product group set the alignment. UE5M3 scales
  (not an MMA-Sim type) are read as MMA-Sim reads FP16 ones: the same minimum normal exponent, -14.

Exactness. Slice sums are computed with an FP64 matmul when every partial sum is provably exact in FP64 (the
exponent span of the slice's products plus log2 of the slice width fits in 53 bits, checked per row of A and
column of B); the remaining rows and columns are recomputed from integer 16-block sums with error-free
transformations (TwoSum) and round-to-odd before the final FP32 rounding, which is exact whenever all
products of the slice lie within 106 bits of each other. That covers every UE5M3 and NVFP4 operand; MXFP4
operands whose block scales differ by more than about 2^40 inside one slice are the documented exception.
tests/test_gemm.py checks every model against a scalar reference in exact rational arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import StrEnum
from typing import TypeVar

import numpy as np
import torch

from ue5m3.numerics.backend import Backend, exact_fp32, triton_by_default, triton_device_reason, triton_import_reason
from ue5m3.numerics.exact import add_rounded, check_grid, rtz_fp64_to_fp32, snap, twosum_chain_to_fp32
from ue5m3.numerics.formats import Rounding
from ue5m3.numerics.kernels import cpu as cpu_kernel
from ue5m3.numerics.quantized import QuantizedTensor
from ue5m3.numerics.scale_rules import host_target_f

T = TypeVar("T")

__all__ = [
    "OutputModel",
    "alpha",
    "matmul",
    "prepare_operand",
    "check_operands",
    "blocked_along_k",
    "fused_step",
    "mma_sim_step",
    "DEFAULT_TILE_ELEMENTS",
]

# Intermediate elements per chunk (FP64 slice sums or block partials): bounds memory to about 128 MB each.
DEFAULT_TILE_ELEMENTS = 1 << 24


class OutputModel(StrEnum):
    """The GEMM output models (one spelling each)."""

    DECODED = "decoded"
    ENCODED_FP32 = "encoded_fp32"
    PROBE_MATCHED = "probe_matched"
    MMA_SIM = "mma_sim"


# ----- operands -----------------------------------------------------------------------------------------


def _operand_factor(q: QuantizedTensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, T*F) of one operand as 0-dim FP32 tensors on its device; (1, 1) for schemes without a tensor scale or
    with g == 0 (chosen on the device: nothing is read back to the host)."""
    scheme = q.scheme
    one = torch.ones((), dtype=torch.float32, device=q.tensor_amax.device)
    if not scheme.uses_tensor_amax:  # every rule with a tensor scale (4/6 included) needs its factor here
        return one, one
    g = q.tensor_amax.to(torch.float32)
    target_f = torch.tensor(float(scheme.target), dtype=torch.float32) * scheme.element.max_finite
    zero = g == 0
    return torch.where(zero, one, g), torch.where(zero, one, target_f.to(one.device))


def _host_operand_factor(q: QuantizedTensor) -> tuple[np.float32, np.float32]:
    """:func:`_operand_factor` of a CPU operand, read and formed on the host as NumPy float32 scalars."""
    one = np.float32(1.0)
    g = np.float32(float(q.tensor_amax)) if q.scheme.uses_tensor_amax else one
    if g == 0 or not q.scheme.uses_tensor_amax:
        return one, one
    return g, host_target_f(q.scheme)


def alpha(a_q: QuantizedTensor, b_q: QuantizedTensor, *, host: bool = False) -> torch.Tensor:
    """alpha = (g_A * g_B) / ((T_A * 6) * (T_B * 6)) in FP32 (a factor is 1 for an operand without one); with
    ``host``, for CPU operands, the same FP32 operations on the host (NumPy float32 scalars: IEEE single precision,
    as torch's), as the C kernel's GEMM takes it."""
    if host and a_q.tensor_amax.device.type == "cpu" and b_q.tensor_amax.device.type == "cpu":
        (g_a, d_a), (g_b, d_b) = _host_operand_factor(a_q), _host_operand_factor(b_q)
        with np.errstate(over="ignore", under="ignore"):
            return torch.tensor(float((g_a * g_b) / (d_a * d_b)), dtype=torch.float32)
    g_a, d_a = _operand_factor(a_q)
    g_b, d_b = _operand_factor(b_q)
    return (g_a * g_b) / (d_a * d_b)


def check_operands(a_q: QuantizedTensor, b_q: QuantizedTensor) -> tuple[int, int, int, int]:
    """(M, K, N, block) of A [M, K] quantized along K and B [K, N] along K or in 2D tiles; ValueError otherwise."""
    if len(a_q.shape) != 2 or len(b_q.shape) != 2:
        raise ValueError(f"matmul needs 2-D operands, got A {tuple(a_q.shape)} and B {tuple(b_q.shape)}")
    (m, k), (k_b, n) = a_q.shape, b_q.shape
    if k != k_b:
        raise ValueError(f"inner dimensions differ: A is {tuple(a_q.shape)}, B is {tuple(b_q.shape)}")
    if a_q.layout.two_d or a_q.layout.axis != 1:
        raise ValueError("A must be quantized in 1D blocks along K (axis=-1)")
    if not b_q.layout.two_d and b_q.layout.axis != 0:
        raise ValueError("B must be quantized along K (axis=0) or in 2D tiles")
    block = a_q.scheme.block_size
    if b_q.scheme.block_size != block:
        raise ValueError(f"block sizes differ: A {block}, B {b_q.scheme.block_size}")
    return m, k, n, block


def blocked_along_k(q: QuantizedTensor, operand: str, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(2 * payload) as exact integers in FP32 and per-element scale values, both laid out [rows, K] for A
    or [K, cols] for B; 2D-tiled B is expanded to per-element scales, which covers it too."""
    twice_payload = q.payload * 2  # integers in [-12, 12]
    scale = q.scales
    if q.layout.two_d:
        scale = scale.repeat_interleave(block, 0).repeat_interleave(block, 1)
    elif operand == "A":
        scale = scale.repeat_interleave(block, 1)
    else:
        scale = scale.repeat_interleave(block, 0)
    rows, cols = twice_payload.shape
    return twice_payload, scale[:rows, :cols]  # ragged tiles: the padded grid's extra cells hold no operand


def _span_bits(q: QuantizedTensor, operand: str, block: int, width: int, n: int) -> torch.Tensor:
    """Per slice and row (A) or column (B): an upper bound on the bit positions the slice's encoded values span,
    from the leading bit of the largest to the lowest bit of the finest (encoded = payload * scale, payload quantum
    1/2, scale quantum 2^(exponent - mantissa_bits)). From per-block data only: the leading bit is bounded by the
    element format's max times the block scale, and blocks whose input is all zero do not count. Returns
    [rows, slices] for A, [slices, cols] for B."""
    scale = q.scales.to(torch.float64)
    nonzero = q.layout.scales_from_blocks(q.block_amax) > 0
    if q.layout.two_d:  # [K/B, N/B] tiles -> one entry per column
        scale = scale.repeat_interleave(block, 1)[:, :n]
        nonzero = nonzero.repeat_interleave(block, 1)[:, :n]
    if operand == "B":  # [K/B, cols] -> the A-like layout [cols, K/B]
        scale, nonzero = scale.t(), nonzero.t()
    _, lead = torch.frexp(scale * q.scheme.element.max_finite)  # |payload * scale| < 2^lead
    _, exp_scale = torch.frexp(scale)
    lead = torch.where(nonzero, lead, torch.full_like(lead, -(1 << 20)))
    lowest = torch.where(nonzero, exp_scale - 1 - q.scheme.scale.mantissa_bits - 1, torch.full_like(exp_scale, 1 << 20))
    per_slice = width // block
    rows = scale.shape[0]
    hi = lead.reshape(rows, -1, per_slice).amax(-1)
    lo = lowest.reshape(rows, -1, per_slice).amin(-1)
    span = torch.clamp(hi - lo, min=0)
    return span if operand == "A" else span.t()


def _span_max(q: QuantizedTensor, operand: str, block: int, width: int, n: int) -> torch.Tensor:
    """The largest of :func:`_span_bits` over the slices of each A row or B column (int32 [rows] or [n]), computed
    by the C kernel from the same per-block data."""
    scales = q.scales.to(torch.float32).contiguous()
    amax = q.layout.scales_from_blocks(q.block_amax).contiguous()
    row_div = 1
    if operand == "B":  # [K/B, cols] -> the A-like layout [cols, K/B] (a view); 2D tiles: one grid row per block
        scales, amax = scales.t(), amax.t()
        row_div = block if q.layout.two_d else 1
    rows = scales.shape[0] if operand == "A" else n
    return cpu_kernel.slice_span_max(
        scales,
        amax,
        rows=rows,
        row_div=row_div,
        per_slice=width // block,
        element_max=q.scheme.element.max_finite,
        mbits=q.scheme.scale.mantissa_bits,
    )


def _once(q: QuantizedTensor, key: tuple, compute: Callable[..., T]) -> T:
    """``compute(q, *key[1:])``, a value of ``q``'s tensors alone, formed once per quantized tensor: a cached weight
    is the same operand in every GEMM of its epoch (an evaluation's thousands of work units), and a quantized
    tensor's tensors are not written after :func:`~ue5m3.numerics.quantize.quantize` made them."""
    memo = q.__dict__.setdefault("_gemm_memo", {})  # beside the frozen fields, as functools.cached_property stores
    if key not in memo:
        memo[key] = compute(q, *key[1:])
    return memo[key]


def _beyond_budget(q: QuantizedTensor, operand: str, block: int, width: int, n: int, budget: int) -> torch.Tensor:
    """:func:`_beyond` of ``q``'s slice spans (:func:`_span_max`) as GEMM operand ``operand``."""
    return _beyond(_span_max(q, operand, block, width, n), budget)


def _beyond(spans: torch.Tensor, budget: int) -> torch.Tensor:
    """The indices of the rows (or columns) whose largest slice span exceeds ``budget``: one read of the largest
    first, as nearly always none does."""
    if not spans.numel() or int(spans.max()) <= budget:
        return spans.new_empty(0, dtype=torch.int64)
    return torch.nonzero(spans > budget).flatten()


def _encoded_fp64(twice_payload: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Exact encoded values payload * scale in FP64, formed in FP32 unless a scale is huge: (2p) * s * 0.5 has at
    most 8 significant bits and, for scales >= 2^-127, is a multiple of 2^-149, so only overflow can be inexact."""
    if scale.device.type == "cpu" and float(scale.max()) <= 2.0**100:
        return (twice_payload * scale * 0.5).to(torch.float64)
    # on an accelerator, skip the host read: the FP64 product is exact for every scale
    return twice_payload.to(torch.float64) * scale.to(torch.float64) * 0.5


def _block_partials(a2: torch.Tensor, sa: torch.Tensor, b2: torch.Tensor, sb: torch.Tensor, block: int) -> torch.Tensor:
    """Exact FP64 16-block dot products with both scales applied: [K/block, rows, cols]."""
    m, k = a2.shape
    n = b2.shape[1]
    nb = k // block
    # integer block sums in FP32 are exact: |sum| <= 32 * 144
    a_blocks = a2.reshape(m, nb, block).permute(1, 0, 2)  # [nb, M, block]
    b_blocks = b2.reshape(nb, block, n)  # [nb, block, N]
    sums = torch.bmm(a_blocks, b_blocks).to(torch.float64)  # [nb, M, N]
    scale_a = sa.reshape(m, nb, block)[:, :, 0].T.to(torch.float64)  # [nb, M]
    scale_b = sb.reshape(nb, block, n)[:, 0, :].to(torch.float64)  # [nb, N]
    return sums * scale_a[:, :, None] * scale_b[:, None, :] * 0.25  # exact: <= 13 + 8 bits


def _take_rows(ops: dict[str, torch.Tensor], rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """The operands restricted to some output rows (the A side)."""
    return {**ops, **{key: ops[key][rows] for key in ("a2", "sa", "enc_a", "span_a")}}


def _exact_operands(
    a_q: QuantizedTensor,
    b_q: QuantizedTensor,
    block: int,
    width: int,
    blocked: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """Everything the exact probe_matched path reads: integer payloads and per-element scales (``blocked``, as
    :func:`blocked_along_k` gives them for A and B), FP64 encoded values and the per-row/column slice spans."""
    a2, sa, b2, sb = blocked
    n = b2.shape[1]
    return {
        "a2": a2,
        "sa": sa,
        "b2": b2,
        "sb": sb,
        "enc_a": _encoded_fp64(a2, sa),
        "enc_b": _encoded_fp64(b2, sb),
        "span_a": _span_bits(a_q, "A", block, width, n),
        "span_b": _span_bits(b_q, "B", block, width, n),
    }


def _probe_matched_rows(
    ops: dict[str, torch.Tensor], block: int, width: int, rounding: Rounding, final_grid: int | None
) -> torch.Tensor:
    """probe_matched through torch ops for (a subset of) the outputs, exact for any exponent spans."""
    a2, sa, enc_a, span_a = (ops[key] for key in ("a2", "sa", "enc_a", "span_a"))
    b2, sb, enc_b, span_b = (ops[key] for key in ("b2", "sb", "enc_b", "span_b"))
    m, k = enc_a.shape
    n, slices = enc_b.shape[1], k // width
    # [M, K] -> [S, M, width] @ [S, width, N] -> [S, M, N]: exact FP64 slice sums wherever the spans allow
    partials = torch.bmm(enc_a.reshape(m, slices, width).transpose(0, 1), enc_b.reshape(slices, width, n))
    guard = math.ceil(math.log2(width))
    # FP64 is exact for a slice when span_A + span_B + guard <= 53; split that budget between rows and columns.
    row_budget, col_budget = (53 - guard) // 2, 53 - guard - (53 - guard) // 2
    bad_a, bad_b = span_a > row_budget, span_b > col_budget  # [M, S], [S, N]
    if partials.device.type != "cpu":
        # Device-generic form with no host read and no data-dependent shape: every slice's exact TwoSum sum is
        # formed and taken where the spans need it (the CPU path below recomputes only those).
        parts = _block_partials(a2, sa, b2, sb, block)  # [K/block, M, N]
        per = width // block
        exact = torch.stack([twosum_chain_to_fp32(parts[j * per : (j + 1) * per]) for j in range(slices)])
        bad = bad_a.t()[:, :, None] | bad_b[:, None, :]  # [S, M, N]
        partials = torch.where(bad, exact.to(torch.float64), partials)
    for j in torch.nonzero(bad_a.any(0) | bad_b.any(1)).flatten().tolist() if partials.device.type == "cpu" else []:
        cols = slice(j * width, (j + 1) * width)
        bad_rows, bad_cols = torch.nonzero(bad_a[:, j]).flatten(), torch.nonzero(bad_b[j]).flatten()
        if bad_rows.numel():  # recompute from exact 16-block sums with TwoSum and round-to-odd
            parts = _block_partials(a2[bad_rows][:, cols], sa[bad_rows][:, cols], b2[cols], sb[cols], block)
            partials[j, bad_rows] = twosum_chain_to_fp32(parts).to(torch.float64)
        if bad_cols.numel():
            parts = _block_partials(a2[:, cols], sa[:, cols], b2[cols][:, bad_cols], sb[cols][:, bad_cols], block)
            partials[j][:, bad_cols] = twosum_chain_to_fp32(parts).to(torch.float64)
    acc = torch.zeros(m, n, dtype=torch.float32, device=partials.device)
    for partial in partials:
        p32 = partial.to(torch.float32)  # the one RNE rounding of the exact slice sum
        acc = add_rounded(acc, p32, rounding)
    return snap(acc, final_grid)


def fused_step(
    terms: torch.Tensor, acc: torch.Tensor, *, bits: int, rounding: Rounding | str = Rounding.RTZ
) -> torch.Tensor:
    """One fused MMA step: the terms [n, ...] (FP64, exact) and the FP32 accumulator [...] are aligned to the
    largest leading bit among them, each truncated toward zero ``bits`` below it, summed exactly and rounded once
    to FP32 (RTZ, or RNE): the leading-bit reading of a fused MMA step (identification candidates ``fused<b>``).
    MMA-Sim's Blackwell instruction aligns on the scale exponents instead: :func:`mma_sim_step`.

    Raises:
        ValueError: the truncated terms could carry more than FP64's 53 bits in sum (bits + 1 + log2(n + 1)).
    """
    rounding = Rounding(rounding)
    count = terms.shape[0] + 1
    if bits < 0 or bits + 1 + math.ceil(math.log2(count)) > 53:
        raise ValueError(f"a fused step of {count} terms truncated at {bits} bits is not exact in FP64")
    everything = torch.cat([terms, acc.to(torch.float64)[None]])
    _, exps = torch.frexp(everything)  # |t| < 2^exp
    exps = torch.where(everything != 0, exps, torch.full_like(exps, -(1 << 20)))
    quantum = torch.ldexp(torch.ones_like(everything[0]), (exps.amax(0) - 1 - bits).clamp(min=-1074))
    # every truncated term is a multiple of the quantum below 2^(bits + 1) of them: the FP64 sum is exact
    total = (torch.trunc(everything / quantum) * quantum).sum(0)
    return rtz_fp64_to_fp32(total) if rounding is Rounding.RTZ else total.to(torch.float32)


MMA_SIM_SUB_BLOCK = 16  # MMA-Sim forms one term per 16 elements, also inside 32-element MXFP4 blocks
MMA_SIM_FRACTION_BITS = 35  # kept below the largest exponent by Blackwell's k=64 FP4 instructions
MMA_SIM_ZERO_EXPONENT = -139  # e_zero: the exponent of a zero C, of an all-zero-product group, of a zero scale


def _scale_exponents(scale: torch.Tensor, min_exponent: int) -> torch.Tensor:
    """MMA-Sim's exponent of each block scale: floor(log2 s) clamped at the format's minimum normal exponent
    (subnormal scales keep a significand below 1); a zero scale's group is given e_zero by the caller (int64)."""
    _, e = torch.frexp(scale.to(torch.float64))
    return torch.clamp(e.to(torch.int64) - 1, min=min_exponent)


def _group_exponents(
    exp_a: torch.Tensor, exp_b: torch.Tensor, zero_a: torch.Tensor, zero_b: torch.Tensor, no_products: torch.Tensor
) -> torch.Tensor:
    """[groups, M, N] alignment exponents: the two scale exponents' sum, or e_zero where either scale is zero or
    every product of the group is zero (MMA-Sim's ``apply_e_zero``); a group whose products cancel keeps its sum."""
    summed = exp_a[:, :, None] + exp_b[:, None, :]
    zero = zero_a[:, :, None] | zero_b[:, None, :] | no_products
    return torch.where(zero, torch.full_like(summed, MMA_SIM_ZERO_EXPONENT), summed)


def mma_sim_step(terms: torch.Tensor, exponents: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    """One Blackwell block-scaled MMA instruction as MMA-Sim computes it (``nv_fused_dot_add_with_block_scale``).

    Args:
        terms: [n, ...] exact FP64 sub-block sums with both block scales applied (16 products each).
        exponents: [n, ...] int64 sums of the two block scales' exponents (the terms' alignment exponents,
            not their leading bits: an unnormalised sub-block sum sits up to ~11 bits above it, and a sub-block
            whose nonzero products cancel still counts), e_zero (-139) for a group whose products are all zero or
            whose scale product is zero.
        acc: [...] the FP32 accumulator C.

    The largest of the exponents and C's (FP32 rules, zero -> e_zero) sets the quantum 2^(max - 35); C and every
    term are truncated toward zero onto it, summed exactly, and the sum is truncated to FP32 (RTZ, subnormals
    kept, +0 for zero and for a sum that truncates to zero, inf from 2^128 up).
    """
    acc64 = acc.to(torch.float64)
    _, ec = torch.frexp(acc64)
    ec = torch.clamp(ec.to(torch.int64) - 1, min=-126)
    ec = torch.where(acc64 == 0, torch.full_like(ec, MMA_SIM_ZERO_EXPONENT), ec)
    top = torch.maximum(exponents.amax(0), ec)
    quantum = torch.ldexp(torch.ones_like(acc64), (top - MMA_SIM_FRACTION_BITS).to(torch.int32))
    # every truncated term is an integer below 2^48 quanta: the FP64 sum is exact
    total = torch.trunc(acc64 / quantum) * quantum + (torch.trunc(terms / quantum) * quantum).sum(0)
    total = total + 0.0  # an exact zero is +0.0
    out = rtz_fp64_to_fp32(total) + 0.0  # MMA-Sim's "-0.0 to +0.0": a sum truncated to zero is +0.0 too
    return torch.where(total.abs() >= 2.0**128, torch.copysign(torch.full_like(out, math.inf), out), out)


def _mma_sim_tile(a2, sa, b2, sb, width, min_exp_a, min_exp_b) -> torch.Tensor:
    sub = MMA_SIM_SUB_BLOCK
    parts = _block_partials(a2, sa, b2, sb, sub)  # [K/16, M, N] exact FP64
    m, k = a2.shape
    n = b2.shape[1]
    # [M, K] -> [K/16, M, 16] @ [K/16, 16, N]: a group has a nonzero product iff the sum of |products| is nonzero
    magnitudes = torch.bmm(a2.abs().reshape(m, k // sub, sub).transpose(0, 1), b2.abs().reshape(k // sub, sub, n))
    scale_a = sa.reshape(m, k // sub, sub)[:, :, 0].T  # [K/16, M]
    scale_b = sb.reshape(k // sub, sub, -1)[:, 0, :]  # [K/16, N]
    exponents = _group_exponents(
        _scale_exponents(scale_a, min_exp_a),
        _scale_exponents(scale_b, min_exp_b),
        scale_a == 0,
        scale_b == 0,
        magnitudes == 0,
    )
    per_instr = width // sub
    acc = torch.zeros(parts.shape[1:], dtype=torch.float32, device=parts.device)
    for j in range(parts.shape[0] // per_instr):
        chunk = slice(j * per_instr, (j + 1) * per_instr)
        acc = mma_sim_step(parts[chunk], exponents[chunk], acc)
    return acc


def _probe_kernel(
    a_q: QuantizedTensor, b_q: QuantizedTensor, block: int, width: int, rtz: bool, grid: int | None, alpha
) -> torch.Tensor:
    """The fused probe_matched GEMM: the FP32 payload kernel where it applies (AVX2, blocks of 16 or 32, scales
    within 2^+-100 and of at most 6 significant bits, so every FP32 product and sub-block sum stays normal and
    exact), else the FP64 encoded one."""
    # the positive ones (0: none), each operand's read once per quantized tensor
    largest, smallest = cpu_kernel.combine_extremes(
        _once(a_q, ("extremes",), lambda q: cpu_kernel.scale_extremes(q.scale_values)),
        _once(b_q, ("extremes",), lambda q: cpu_kernel.scale_extremes(q.scale_values)),
    )
    in_range = largest <= 2.0**100 and (smallest == 0.0 or smallest >= 2.0**-100)
    narrow = max(a_q.scheme.scale.mantissa_bits, b_q.scheme.scale.mantissa_bits) <= 5
    if cpu_kernel.has_payload_gemm() and block % 16 == 0 and not a_q.layout.two_d and in_range and narrow:
        return cpu_kernel.probe_gemm_payload(
            a_q.payload,
            a_q.scales,
            b_q.payload,
            b_q.scales,
            block=block,
            column_block=block if b_q.layout.two_d else 1,
            width=width,
            rtz=rtz,
            grid=grid,
            alpha=float(alpha),
        )
    huge = largest > 2.0**100  # FP32 encoded values could overflow
    enc_a = a_q.encoded() if not huge else _encoded_fp64(*blocked_along_k(a_q, "A", block))
    enc_b = b_q.encoded() if not huge else _encoded_fp64(*blocked_along_k(b_q, "B", block))
    return cpu_kernel.probe_gemm(enc_a, enc_b, width=width, rtz=rtz, grid=grid, alpha=float(alpha))


def _triton_reason(a_q: QuantizedTensor) -> str | None:
    """Why the Triton probe_matched kernel cannot take these operands (None if it can)."""
    reason = triton_import_reason("triton_gemm")
    if reason is not None:
        return reason
    if a_q.scheme.block_size % 16:
        return f"block size {a_q.scheme.block_size} (the kernel takes multiples of 16)"
    return triton_device_reason(a_q.payload_blocks.device)


def _use_kernel(backend: Backend, model: OutputModel, a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the fused C kernel computes this probe_matched GEMM; ``cpu_kernel`` refuses what it cannot take."""
    if backend in (Backend.TORCH, Backend.TRITON):
        return False
    reason = None
    if a.device.type != "cpu" or b.device.type != "cpu":
        reason = f"operands on {a.device.type}/{b.device.type}"
    elif not cpu_kernel.available():
        reason = cpu_kernel.unavailable_reason()
    if backend is Backend.CPU_KERNEL and reason is not None:
        raise ValueError(
            f"backend='cpu_kernel' cannot compute this {model.value} GEMM: {reason}; use 'torch' or 'auto'"
        )
    return reason is None


def matmul(
    a_q: QuantizedTensor,
    b_q: QuantizedTensor,
    model: OutputModel | str = OutputModel.PROBE_MATCHED,
    *,
    slice_width: int = 64,
    cross_slice_rounding: Rounding | str = Rounding.RTZ,
    final_grid: int | None = 1024,
    tile_elements: int = DEFAULT_TILE_ELEMENTS,
    backend: Backend | str = Backend.AUTO,
    prepared_b: object | None = None,
) -> torch.Tensor:
    """FP32 result of A @ B under one GEMM output model.

    Args:
        a_q: A [M, K], quantized along K (``axis=-1``).
        b_q: B [K, N], quantized along K (``axis=0``) or in 2D tiles.
        model: see :class:`OutputModel`.
        slice_width: K-slice width of ``probe_matched`` (multiple of the block size) and ``mma_sim`` (64).
        cross_slice_rounding: ``rtz`` or ``rne`` additions between slices (``probe_matched``).
        final_grid: denominator of the encoded-accumulator lattice (``probe_matched``), or None for no snap.
        tile_elements: intermediate elements per chunk (FP64 slice sums or block partials), bounding memory.
        backend: who computes ``probe_matched`` (:class:`~ue5m3.numerics.backend.Backend`; the other models are
            plain torch on every backend); results do not depend on it.
        prepared_b: what :func:`prepare_operand` returned for ``b_q`` (e.g. a weight's, kept for the step); None
            prepares B in this call where the kernel needs it. The same bits either way.

    Returns:
        FP32 tensor [M, N].
    """
    with exact_fp32(a_q.payload_blocks.device):
        return _matmul(
            a_q,
            b_q,
            OutputModel(model),
            slice_width,
            cross_slice_rounding,
            final_grid,
            tile_elements,
            backend,
            prepared_b,
        )


def _takes_triton(model: OutputModel, backend: Backend, q: QuantizedTensor) -> bool:
    """Whether this GEMM runs on the Triton kernels; backend='triton' that cannot take it raises, naming why."""
    if model not in (OutputModel.PROBE_MATCHED, OutputModel.MMA_SIM):
        return False
    if not (backend is Backend.TRITON or (backend is Backend.AUTO and triton_by_default(q.payload_blocks.device))):
        return False
    reason = _triton_reason(q)
    if reason is not None and backend is Backend.TRITON:
        raise ValueError(f"backend='triton' cannot compute this {model.value} GEMM: {reason}; use 'auto' or 'torch'")
    return reason is None


def prepare_operand(
    b_q: QuantizedTensor,
    model: OutputModel | str = OutputModel.PROBE_MATCHED,
    *,
    slice_width: int = 64,
    backend: Backend | str = Backend.AUTO,
) -> object | None:
    """B [K, N] as the probe_matched Triton kernels read it (FP16 slice values on common exponents, their shifts and
    the tiles' bounds), for :func:`matmul`'s ``prepared_b``: a weight's, computed once per step instead of in every
    GEMM of every microbatch. None where :func:`matmul` would not run the Triton probe_matched kernels (nothing to
    prepare)."""
    model, backend = OutputModel(model), Backend(backend)
    if model is not OutputModel.PROBE_MATCHED or len(b_q.shape) != 2 or not _takes_triton(model, backend, b_q):
        return None
    from ue5m3.numerics.kernels import triton_gemm
    from ue5m3.numerics.kernels.launch import run

    block = b_q.scheme.block_size
    if slice_width % 16 or slice_width % block or b_q.shape[0] % slice_width:
        return None
    prepared, launch = triton_gemm.prepare_operand(
        b_q.payload.to(torch.float32),
        b_q.scales.to(torch.float32),
        operand="B",
        block=block,
        column_block=block if b_q.layout.two_d else 1,
        width=slice_width,
        mbits=b_q.scheme.scale.mantissa_bits,
    )
    run([launch], b_q.payload_blocks.device)
    return prepared


def _matmul(
    a_q, b_q, model, slice_width, cross_slice_rounding, final_grid, tile_elements, backend, prepared_b
) -> torch.Tensor:
    backend = Backend(backend)
    cross_slice_rounding = Rounding(cross_slice_rounding)
    m, k, n, block = check_operands(a_q, b_q)
    if model is OutputModel.DECODED:
        return torch.matmul(a_q.dequantize(), b_q.dequantize())
    if model is OutputModel.ENCODED_FP32:
        return torch.matmul(a_q.encoded(), b_q.encoded()) * alpha(a_q, b_q)
    if cross_slice_rounding not in (Rounding.RTZ, Rounding.RNE):
        raise ValueError(f"cross_slice_rounding must be 'rtz' or 'rne', got {cross_slice_rounding.value!r}")
    if model is OutputModel.MMA_SIM and slice_width != 64:
        raise ValueError(f"mma_sim models 64-wide instructions; slice_width must be 64, got {slice_width!r}")
    if slice_width % block or k % slice_width:
        raise ValueError(f"K={k} must be a multiple of slice_width={slice_width}, itself a multiple of {block}")
    check_grid(final_grid, "final_grid")
    if m == 0 or n == 0 or k == 0:  # an empty sum is +0.0 under every output model
        return torch.zeros(m, n, dtype=torch.float32, device=a_q.payload_blocks.device)
    guard = math.ceil(math.log2(slice_width))
    row_budget = (53 - guard) // 2
    use_triton = _takes_triton(model, backend, a_q)
    rtz = cross_slice_rounding is Rounding.RTZ
    if use_triton:  # complete in-kernel (a fast path where exact, the TwoSum chain elsewhere): no host read
        scale = alpha(a_q, b_q)
        from ue5m3.numerics.kernels import triton_gemm, triton_mma_sim

        operands = (a_q.payload, a_q.scales, b_q.payload, b_q.scales)
        layout = {"block": block, "column_block": block if b_q.layout.two_d else 1, "alpha": scale}
        if model is OutputModel.MMA_SIM:
            return triton_mma_sim.mma_sim_payload(
                *operands,
                min_exponent_a=a_q.scheme.scale.min_exponent,
                min_exponent_b=b_q.scheme.scale.min_exponent,
                **layout,
            )
        # exact TwoSum slice sums in the kernel
        mbits = (a_q.scheme.scale.mantissa_bits, b_q.scheme.scale.mantissa_bits)
        return triton_gemm.probe_gemm_payload(
            *operands,
            width=slice_width,
            rtz=rtz,
            grid=final_grid,
            scale_mantissa_bits=mbits,
            prepared_b=prepared_b,
            **layout,
        )
    if model is OutputModel.PROBE_MATCHED and _use_kernel(backend, model, a_q.payload_blocks, b_q.payload_blocks):
        # Fused slice-wise GEMM of the FP32 encoded operands (bit-identical to the torch path where FP64 slice
        # sums are exact, checked per block); outputs touching an inexact slice go through the exact path.
        # the per-block span check in one C pass per operand (the largest slice span of each row and column)
        bad_rows = _once(a_q, ("beyond", "A", block, slice_width, n, row_budget), _beyond_budget)
        bad_cols = _once(b_q, ("beyond", "B", block, slice_width, n, 53 - guard - row_budget), _beyond_budget)
        scale = alpha(a_q, b_q, host=True)
        out = _probe_kernel(a_q, b_q, block, slice_width, rtz, final_grid, scale)
        if bad_rows.numel() or bad_cols.numel():  # the torch exact path's arithmetic, in C, on those outputs only
            cpu_kernel.probe_exact_outputs(
                out,
                a_q.payload,
                a_q.scales,
                b_q.payload,
                b_q.scales,
                rows=bad_rows,
                cols=bad_cols,
                block=block,
                column_block=block if b_q.layout.two_d else 1,
                width=slice_width,
                rtz=rtz,
                grid=final_grid,
                alpha=float(scale),
            )
        return out
    scale = alpha(a_q, b_q)
    a2, sa = blocked_along_k(a_q, "A", block)
    b2, sb = blocked_along_k(b_q, "B", block)
    out = torch.empty(m, n, dtype=torch.float32, device=a2.device)
    if model is OutputModel.MMA_SIM:
        rows_per_tile = max(1, tile_elements // max(n * (k // MMA_SIM_SUB_BLOCK), 1))
        for r0 in range(0, m, rows_per_tile):
            rows = slice(r0, min(m, r0 + rows_per_tile))
            out[rows] = _mma_sim_tile(
                a2[rows], sa[rows], b2, sb, slice_width, a_q.scheme.scale.min_exponent, b_q.scheme.scale.min_exponent
            )
        return out * scale
    slices = k // slice_width
    ops = _exact_operands(a_q, b_q, block, slice_width, (a2, sa, b2, sb))
    rows_per_tile = max(1, tile_elements // max(n * slices, 1))
    for r0 in range(0, m, rows_per_tile):
        rows = torch.arange(r0, min(m, r0 + rows_per_tile), device=a2.device)
        out[rows] = _probe_matched_rows(_take_rows(ops, rows), block, slice_width, cross_slice_rounding, final_grid)
    return out * scale
