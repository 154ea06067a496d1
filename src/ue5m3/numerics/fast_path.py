"""Which tile-slices of a probe_matched GEMM the Triton kernels compute on their exact path: the kernels' fast-path
rule (:mod:`ue5m3.numerics.kernels.triton_gemm`: ``FAST_BOUND``, ``MIN_SHIFT``/``MAX_SHIFT``, ``MAX_DEPTH``) restated
in torch, so that the share of tile-slices on the exact path can be measured on the CPU, without Triton
(benchmarks/exact_share.py, docs/performance.md). The bits of the GEMM never depend on it; its cost does.
"""

from __future__ import annotations

import torch

from ue5m3.numerics.gemm import blocked_along_k, check_operands
from ue5m3.numerics.quantized import QuantizedTensor

__all__ = ["probe_paths"]

# the kernels' constants, as kernels/triton_gemm.py defines them
_FAST_BOUND, _SHIFT_RANGE, _MAX_DEPTH, _FAST_MBITS = 2.0**23, (-30, 50), 24, 6


def _slice_bounds(twice_payload: torch.Tensor, scale: torch.Tensor, mbits: int, width: int) -> tuple[torch.Tensor, ...]:
    """Per vector (the rows of [vectors, K]) and K-slice, the preparation pass's two bounds L1 = sum |a'| and
    M = max |a'| times 2^depth (FP32, inf where the slice is not covered: too deep, a shift out of range)."""
    vectors, k = twice_payload.shape
    p = twice_payload.reshape(vectors, k // width, width)
    s = scale.reshape(vectors, k // width, width).to(torch.float32)
    nonzero = (p != 0) & (s > 0)
    exponent = ((s.view(torch.int32) >> 23) & 0xFF) - 127  # floor(log2 s) of normal scales
    top = torch.where(nonzero, exponent, -1000).amax(-1)
    top = torch.where(top > -1000, top, 0)
    depth = torch.where(nonzero, top[..., None] - exponent, 0).amax(-1)
    factor = mbits - top
    clamped = factor.clamp(-126, 127)
    value = torch.where(nonzero, p * (s * torch.ldexp(torch.ones_like(s), clamped[..., None])), 0.0).abs()
    shift = top - mbits - 1
    covered = (depth <= _MAX_DEPTH) & (shift >= _SHIFT_RANGE[0]) & (shift <= _SHIFT_RANGE[1]) & (factor == clamped)
    widen = torch.ldexp(torch.ones_like(top, dtype=torch.float32), depth.clamp(max=_MAX_DEPTH))
    inf = torch.tensor(float("inf"))
    l1 = torch.where(covered, value.double().sum(-1).float() * widen, inf)
    largest = torch.where(covered, value.amax(-1) * widen, inf)
    return l1, largest


def _tile_max(bound: torch.Tensor, tile: int) -> torch.Tensor:
    """[vectors, slices] -> [tiles, slices]: the largest bound of each tile's vectors (past the end: 0)."""
    vectors, slices = bound.shape
    padded = torch.zeros(-(-vectors // tile) * tile, slices, dtype=bound.dtype)
    padded[:vectors] = bound
    return padded.reshape(-1, tile, slices).amax(1)


def probe_paths(
    a_q: QuantizedTensor, b_q: QuantizedTensor, *, slice_width: int = 64, block_m: int = 128, block_n: int = 64
) -> torch.Tensor:
    """Which tile-slices of A @ B the Triton probe_matched kernels compute on their exact path (True) rather than
    their fast path: bool [row tiles, column tiles, slices] for output tiles of ``block_m`` x ``block_n`` (the GPU
    tiles of ``triton_gemm.PROBE_TILES`` by default). The kernels' rule restated in torch on the CPU (no Triton):
    a tile-slice is fast where L1_A * M_B or M_A * L1_B is below 2^23, the tile's largest row bounds against its
    largest column bounds. It equals the kernels' ``paths=True`` flags (tests/test_triton_gemm.py) except where
    a product lies within FP32 rounding of 2^23 (the kernel sums L1 in another order). The bits of the GEMM do
    not depend on it; its cost does (docs/performance.md)."""
    _, k, _, block = check_operands(a_q, b_q)
    if slice_width % block or k % slice_width:
        raise ValueError(f"probe_paths needs K ({k}) a multiple of the slice width ({slice_width}) of whole blocks")
    a2, sa = (t.detach().cpu() for t in blocked_along_k(a_q, "A", block))
    b2, sb = (t.detach().cpu() for t in blocked_along_k(b_q, "B", block))
    mbits = (a_q.scheme.scale.mantissa_bits, b_q.scheme.scale.mantissa_bits)
    l1_a, max_a = (_tile_max(t, block_m) for t in _slice_bounds(a2, sa, mbits[0], slice_width))
    l1_b, max_b = (_tile_max(t, block_n) for t in _slice_bounds(b2.t(), sb.t(), mbits[1], slice_width))
    bound = _FAST_BOUND if all(0 <= b <= _FAST_MBITS for b in mbits) else 0.0
    fast = (l1_a[:, None] * max_b[None] < bound) | (max_a[:, None] * l1_b[None] < bound)  # NaN (inf * 0): exact
    return ~fast
