"""MMA-Sim (``mmasim`` 2.1.1, Microsoft, arXiv 2511.10909): its released models of NVIDIA's MMA instructions.

* :func:`block_scaled_accumulator` -- Blackwell ``tcgen05.mma`` block-scaled FP4 (``TCGen05MMABlockScale``, k = 64:
  ``MMA_GST_FDPA`` with G = 16, F = 35, RZ-FP32, e_zero = -139) over a whole GEMM, the instruction chained along K
  with D fed back as C: the encoded accumulator that ``gemm.matmul(..., "mma_sim")`` multiplies by alpha. The package
  accepts NVFP4 (E2M1, UE4M3 scales, block 16), MXFP4 (UE8M0, block 32) and block-16 UE8M0; UE5M3 scales, which it
  does not name, are handed to its arithmetic as FP16 values (exact, and FP16's minimum normal exponent is UE5M3's,
  -14), the reading ``mma_sim`` extends to UE5M3.
* :func:`fp8_gemm` -- Hopper ``wgmma`` (F = 13, output truncated to E8M13, 32-element steps) and Blackwell
  ``tcgen05.mma`` kind::f8f6f4 (F = 25, RZ-FP32, 32-element steps) FP8 E4M3 GEMMs, for emulator identification.

The package is imported inside each function (``pip install 'ue5m3[conformance]'``).
"""

from __future__ import annotations

import torch

from ue5m3.numerics.formats import E4M3, UE5M3, UE8M0
from ue5m3.numerics.quantized import QuantizedTensor

__all__ = ["DISTRIBUTION", "IMPORT_NAME", "instruction_name", "block_scaled_accumulator", "fp8_gemm", "FP8_MODELS"]

DISTRIBUTION = "mmasim"
IMPORT_NAME = "mmasim"

# MMA-Sim's FP8 GEMM models: (architecture, class, instruction shape and types)
FP8_MODELS = {
    "hopper_wgmma": ("Hopper", "WGMMA", "m64n8k32.f32.e4m3.e4m3"),
    "blackwell_tcgen05": ("Blackwell", "TCGen05MMA", "m128n8k32.kind::f8f6f4.f32.e4m3.e4m3"),
}


def instruction_name(a_q: QuantizedTensor) -> str | None:
    """The ``TCGen05MMABlockScale`` instruction for the operands' scheme, or None where MMA-Sim names none (UE5M3)."""
    scale, block = a_q.scheme.scale, a_q.scheme.block_size
    if scale == E4M3 and block == 16:
        return "m128n8k64.kind::mxf4nvf4.block16.f32.e2m1.e2m1.ue4m3"
    if scale == UE8M0 and block in (16, 32):
        return f"m128n8k64.kind::mxf4nvf4.block{block}.f32.e2m1.e2m1.ue8m0"
    return None


def _scales(q: QuantizedTensor, operand: str) -> torch.Tensor:
    """Block scales laid out as MMA-Sim reads them: A [M, K/block], B [K/block, N] (2D tiles expanded per column),
    in the dtype of the scale format (FP16 for UE5M3)."""
    scales = q.scales
    if q.layout.two_d:
        scales = scales.repeat_interleave(q.scheme.block_size, 1)[:, : q.shape[1]]
    dtype = {E4M3: torch.float8_e4m3fn, UE8M0: torch.float8_e8m0fnu, UE5M3: torch.float16}.get(q.scheme.scale)
    if dtype is None:
        raise ValueError(f"MMA-Sim takes E4M3, UE8M0 (or, read as FP16, UE5M3) scales, not {q.scheme.scale.name!r}")
    return scales.to(dtype)


def block_scaled_accumulator(a_q: QuantizedTensor, b_q: QuantizedTensor) -> torch.Tensor:
    """MMA-Sim's encoded FP32 accumulator of A [M, K] (quantized along K) times B [K, N] (quantized along K), K a
    multiple of 64: its k = 64 block-scaled instruction chained along K from C = 0.

    Raises:
        ImportError: mmasim is not installed.
        ValueError: a scheme MMA-Sim cannot take.
    """
    from mmasim.arithmetic import fdpa
    from mmasim.nv_ptx.sim import TCGen05MMABlockScale

    name = instruction_name(a_q)
    if name is not None:
        operation = TCGen05MMABlockScale("Blackwell", name)
    else:  # UE5M3: MMA-Sim's own k = 64 arithmetic with the scales as FP16
        operation = fdpa.MMA_GST_FDPA(G=16, F=35, rho="RZ-FP32", L_max=64, e_zero=-139)
    a, b = a_q.payload.to(torch.float32), b_q.payload.to(torch.float32)
    c = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float32)
    return operation(a, b, c, _scales(a_q, "A"), _scales(b_q, "B"))


def fp8_gemm(a: torch.Tensor, b: torch.Tensor, model: str) -> torch.Tensor:
    """MMA-Sim's FP8 E4M3 GEMM [M, K] @ [K, N] (K a multiple of 32) from C = 0, under one of :data:`FP8_MODELS`:
    the FP32 result of the instruction chained along K (no scaling)."""
    from mmasim.nv_ptx import sim

    arch, cls, shape = FP8_MODELS[model]
    operation = getattr(sim, cls)(arch, shape)
    c = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float32)
    return operation(a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn), c)
