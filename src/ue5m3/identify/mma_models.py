"""MMA-Sim's released hardware models as identification candidates (``mmasim`` 2.1.1; arXiv 2511.10909).

The fitted candidates (:mod:`.candidates`) see only each cell's exact products. MMA-Sim's models also read the
operands: a product's alignment exponent is the sum of its operands' exponents (e_a + e_b, each clamped at its
format's minimum normal exponent), not its leading bit, and a zero product takes the exponent e_zero. They are
evaluated here on the probes' operands, beside the fitted candidates, so a fit names which of them matches:

* ``mma_sim_hopper_fp8``: Hopper ``wgmma`` with FP8 E4M3 operands (``WGMMA("Hopper", "m64nNk32.f32.e4m3.e4m3")``:
  ``MMA_T_FDPA`` with F = 13, output RZ-E8M13, 32 products per step, e_zero = -133): each step's 32 products and C
  aligned to the largest exponent, truncated toward zero 13 bits below it, summed exactly, and the sum truncated to
  13 fraction bits (an FP32 with the low 10 bits cleared);
* ``mma_sim_hopper_fp8_p128``: the same chain restarted every 128 of K and added into an FP32 accumulator (RNE), as
  CUTLASS/cuBLAS promote Hopper FP8 tensor-core sums (``use_fast_accum`` off);
* ``mma_sim_blackwell_fp8``: Blackwell ``tcgen05.mma`` kind::f8f6f4 (F = 25, RZ-FP32, 32 per step, e_zero = -133);
* ``mma_sim_blackwell_fp4``: block-scaled FP4 probes through ``gemm.matmul(..., "mma_sim")`` (MMA-Sim's k = 64
  block-scaled instruction).

tests/test_identify_candidates.py holds the FP8 models equal to the ``mmasim`` package bit for bit.
"""

from __future__ import annotations

import torch

from ue5m3.identify.probes import FP8, Probe
from ue5m3.numerics.gemm import matmul

__all__ = ["MODELS", "applies", "model_outputs", "t_fdpa_chain"]

MODELS = ("mma_sim_hopper_fp8", "mma_sim_hopper_fp8_p128", "mma_sim_blackwell_fp8", "mma_sim_blackwell_fp4")
# (fraction bits F, output fraction bits, K per promotion or None)
_FP8_MODELS = {
    "mma_sim_hopper_fp8": (13, 13, None),
    "mma_sim_hopper_fp8_p128": (13, 13, 128),
    "mma_sim_blackwell_fp8": (25, 23, None),
}
_E_ZERO = -133  # MMA-Sim's exponent of a zero product or accumulator, FP32-output FP8 instructions
_STEP = 32  # products per FP8 instruction step (32 bytes of K)


def _normalize(x: torch.Tensor, min_exponent: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(significand, exponent) with 1 <= |s| < 2 above ``min_exponent``, subnormals at it (FP64, int64)."""
    s, e = torch.frexp(x.to(torch.float64))
    s, e = s * 2, e.to(torch.int64) - 1
    low = e < min_exponent
    s = torch.where(low, torch.ldexp(s, (e - min_exponent).to(torch.int32)), s)
    return s, torch.where(low | (s == 0), torch.full_like(e, min_exponent), e)


def _step(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, fraction_bits: int, output_bits: int) -> torch.Tensor:
    """One T-FDPA step: a, b [C, L] E4M3 values, c [C] FP32 -> [C] FP32."""
    sa, ea = _normalize(a, -6)
    sb, eb = _normalize(b, -6)
    sc, ec = _normalize(c, -126)
    s = torch.cat([sa * sb, sc[:, None]], dim=1)
    e = torch.cat([ea + eb, ec[:, None]], dim=1)
    e = torch.where(s == 0, torch.full_like(e, _E_ZERO), e)
    top = e.amax(1, keepdim=True)
    # each term truncated toward zero F bits below the top exponent: exact in FP64 (at most 8 + F bits each)
    total = (torch.trunc(torch.ldexp(s, (e - top + fraction_bits).to(torch.int32))) * 2.0**-fraction_bits).sum(1)
    value = torch.ldexp(total, top.squeeze(1).to(torch.int32))
    vs, ve = _normalize(value, -126)
    vs = torch.trunc(vs * 2.0**output_bits) * 2.0**-output_bits  # round toward zero to the output's bits
    out = torch.ldexp(vs, ve.to(torch.int32)).to(torch.float32)
    return out + 0.0  # -0.0 to +0.0


def t_fdpa_chain(a: torch.Tensor, b: torch.Tensor, model: str) -> torch.Tensor:
    """The cells' FP32 results: a, b [C, K] E4M3 operand rows (K a multiple of 32), under an FP8 model."""
    fraction_bits, output_bits, promotion = _FP8_MODELS[model]
    cells, k = a.shape
    outer = torch.zeros(cells, dtype=torch.float32)
    inner = torch.zeros(cells, dtype=torch.float32)
    for j in range(0, k, _STEP):
        inner = _step(a[:, j : j + _STEP], b[:, j : j + _STEP], inner, fraction_bits, output_bits)
        if promotion is not None and (j + _STEP) % promotion == 0:
            outer, inner = outer + inner, torch.zeros_like(inner)
    return inner if promotion is None else outer + inner


def applies(model: str, probe: Probe) -> bool:
    """Whether ``model`` computes this probe's kind of GEMM (FP8 models FP8 probes, the FP4 one block-scaled ones)."""
    k = probe.a.shape[1]
    if model == "mma_sim_blackwell_fp4":
        return probe.scheme != FP8 and k % 64 == 0
    return probe.scheme == FP8 and k % _STEP == 0


def model_outputs(probe: Probe, model: str) -> torch.Tensor:
    """FP32 [C] outputs of the probe's cells under one of :data:`MODELS` (:func:`applies` must hold)."""
    if model == "mma_sim_blackwell_fp4":
        return matmul(*probe.quantized(), "mma_sim")[probe.rows, probe.cols].to(torch.float32)
    a = probe.a[probe.rows]
    b = probe.b[:, probe.cols].t()
    return t_fdpa_chain(a, b, model)
