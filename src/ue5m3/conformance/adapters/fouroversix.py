"""Four Over Six (``fouroversix`` 1.0.5, mit-han-lab, arXiv 2512.02010): its PyTorch reference quantizer.

:func:`reference_quantize` runs ``fouroversix.quantize.pytorch.reference.quantize_to_fp4`` (the code behind
``QuantizeBackend.pytorch``) on the CPU for NVFP4 under a scale rule (``abs_max``, ``mae``, ``mse``, ``static_4``,
``static_6``), 1D blocks of 16 or 16x16 tiles, and returns its payload values and block scales in our layout.
fouroversix installs on a CPU machine only with ``SKIP_CUDA_BUILD=1`` and ``--no-build-isolation`` after torch
(README, Installing).

Where its arithmetic does not define an E2M1 result (:func:`undefined_blocks`) we do not compare: its E2M1 rounding
has no saturation, so a scaled value of 7 or more (a block whose E4M3 scale is subnormal and rounded far down)
becomes 8, outside E2M1; and a block whose scale is zero gets payload 0 where the TE-style encoder of this project
writes +-6 (both dequantize to 0).
"""

from __future__ import annotations

import torch

__all__ = ["DISTRIBUTION", "IMPORT_NAME", "SCALE_RULES", "reference_quantize", "undefined_blocks"]

DISTRIBUTION = "fouroversix"
IMPORT_NAME = "fouroversix"
SCALE_RULES = ("abs_max", "mae", "mse", "static_4", "static_6")


def reference_quantize(
    x: torch.Tensor, scale_rule: str, *, two_d: bool = False, tensor_amax: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """fouroversix's reference NVFP4 quantization of a 2-D FP32 ``x`` (columns a multiple of 16; rows too for
    ``two_d``): (payload values [rows, cols] FP32, block scales [rows, cols / 16] FP32, per tile for ``two_d``:
    [rows / 16, cols / 16]).

    Raises:
        ImportError: fouroversix is not installed.
    """
    from fouroversix.quantize.pytorch.reference import quantize_to_fp4
    from fouroversix.utils import DataType, ScaleRule

    values, scales, _ = quantize_to_fp4(
        x.to(torch.float32),
        x_amax=None if tensor_amax is None else tensor_amax.reshape(()).to(torch.float32),
        block_scale_2d=two_d,
        fp4_format=DataType.nvfp4,
        scale_rule=ScaleRule(scale_rule),
        pack_values=False,
        use_blackwell_scale_layout=False,
    )
    rows, cols = x.shape
    scales = scales.to(torch.float32).reshape(rows, cols // 16)
    return values.to(torch.float32).reshape(rows, cols), scales[::16] if two_d else scales


def undefined_blocks(payload: torch.Tensor, scales: torch.Tensor, *, two_d: bool = False) -> torch.Tensor:
    """Bool, shaped like ``scales``: blocks where fouroversix's arithmetic leaves E2M1 (a payload value beyond 6) or
    whose scale is zero (payload 0 there, +-6 under TE's encoder; both decode to 0)."""
    rows, cols = payload.shape
    beyond = payload.abs() > 6
    if two_d:
        beyond = beyond.reshape(rows // 16, 16, cols // 16, 16).any(3).any(1)
    else:
        beyond = beyond.reshape(rows, cols // 16, 16).any(-1)
    return beyond | (scales == 0)
