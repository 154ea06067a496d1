"""Transformer Engine's NVFP4 reference quantizer, which cannot run here (TE needs CUDA): a transcription.

Re-implemented from ``transformer_engine/pytorch/custom_recipes/quantization_nvfp4.py``
(``NVFP4QuantizerRef._quantize_blockwise_reference`` and ``cast_to_fp4x2``) as read at commit
1a4d3b0da24039197519537286a3edc6d316c954 of NVIDIA/TransformerEngine: G = min((448 * 6) / g, FP32 max), 1 if that is 0;
block scale E4M3(clamp(a_B * (G * fp32(1/6)), +-448)) by torch's RNE cast; encode multiplier
min(1 / (s * (1/G)), FP32 max); payload by TE's threshold table on clamp(x * multiplier, +-6), which maps -0.0 (and
every value in [-0, +0.25]) to code 0, +0.0.
"""

from __future__ import annotations

import torch

__all__ = ["SOURCE", "reference_quantize"]

SOURCE = "transcription@1a4d3b0da24039197519537286a3edc6d316c954"
_FP32_MAX = torch.finfo(torch.float32).max


def _cast_to_fp4(v: torch.Tensor) -> torch.Tensor:
    """TE's ``cast_to_fp4x2`` thresholds as values: [0, 0.25] -> +0, (0.25, 0.75) -> 0.5, [0.75, 1.25] -> 1, ...,
    > 5 -> 6, and the mirror image below zero, where [-0.25, -0) -> -0; -0.0 itself lands in the first, +0."""
    m = v.abs()
    magnitude = torch.where(
        m <= 0.25,
        0.0,
        torch.where(
            m < 0.75,
            0.5,
            torch.where(
                m <= 1.25,
                1.0,
                torch.where(
                    m < 1.75, 1.5, torch.where(m <= 2.5, 2.0, torch.where(m < 3.5, 3.0, torch.where(m <= 5, 4.0, 6.0)))
                ),
            ),
        ),
    )
    negative = v < 0  # -0.0 is not below zero: it takes the positive code
    return torch.where(negative, -magnitude, magnitude)


def reference_quantize(x: torch.Tensor, tensor_amax: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(payload values [rows, cols], block scales [rows, cols / 16]) of a 2-D FP32 ``x`` (columns a multiple of 16)."""
    rows, cols = x.shape
    g = x.abs().max() if tensor_amax is None else tensor_amax.reshape(())
    six, e4m3_max = torch.tensor(6.0), torch.tensor(448.0)
    encode = torch.minimum(torch.div(e4m3_max * six, g), torch.tensor(_FP32_MAX))
    encode = torch.where(encode == 0, torch.ones_like(encode), encode)
    decode_global = torch.div(1.0, encode)
    blocks = x.reshape(rows, cols // 16, 16)
    vec_max = blocks.abs().amax(-1, keepdim=True)
    scale = torch.minimum(vec_max * (encode * torch.reciprocal(six)), torch.tensor(_FP32_MAX))
    scale = torch.clamp(scale, -448.0, 448.0).to(torch.float8_e4m3fn).to(torch.float32)
    multiplier = torch.minimum(torch.div(1.0, scale * decode_global), torch.tensor(_FP32_MAX))
    payload = _cast_to_fp4(torch.clamp(blocks * multiplier, -6.0, 6.0))
    return payload.reshape(rows, cols), scale.squeeze(-1)
