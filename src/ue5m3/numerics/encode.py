"""The torch reference of block quantization: pure encoding, apart from the scale choice it receives.

:func:`quantize_blocks` is the portable path of :func:`ue5m3.numerics.quantize.quantize` and the reference the
fused kernels are held to bit for bit. It takes the block view of the input
(:class:`~ue5m3.numerics.layout.BlockLayout`) and a scale rule (a function of :mod:`ue5m3.numerics.scale_rules`,
received as gfloat's ``quantize_block`` receives its scale function), and computes, in FP32 (numerics spec 3.1
and 3.2):

1. the block maxima a_B, and the current tensor reference g = max a_B when none is held;
2. G = (T * F) / g and 1/G;
3. the block scales, from the rule;
4. the decoded block scales S = scale * (1/G);
5. the payload, by :func:`encode_blocks`: round_E2M1(clamp(x * fp32(1/S), -F, F)), reciprocal then multiply as the
   kernels do (a division can cross an E2M1 midpoint for stale references).

Nothing here depends on which rule chose the scales, so a new rule is one function and a new backend implements this
encoding once.
"""

from __future__ import annotations

import torch

from ue5m3.numerics import formats
from ue5m3.numerics.checks import DeferredChecks, nonfinite_message
from ue5m3.numerics.formats import FloatFormat, Rounding
from ue5m3.numerics.layout import BlockLayout
from ue5m3.numerics.quantized import QuantizedTensor
from ue5m3.numerics.scale_rules import FP32_MAX, ScaleRuleFunction, tensor_global_scale
from ue5m3.numerics.schemes import BlockScheme

__all__ = ["encode_blocks", "quantize_blocks"]


def encode_blocks(
    blocks: torch.Tensor,
    decode_scales: torch.Tensor,
    element: FloatFormat,
    rounding: Rounding,
    random_bits: torch.Tensor | None,
) -> torch.Tensor:
    """The payload of ``blocks`` (..., n_blocks, B) under decoded block scales S (..., n_blocks, 1): element values
    round(clamp(x * fp32(1/S), -F, F)) in FP32, signs kept (``random_bits`` in block view, for stochastic rounding).
    """
    # Reciprocal then multiply, as the kernels do (a division can cross an E2M1 midpoint for stale references); the
    # reciprocal of a zero scale (NVFP4 has no repair) is capped at FP32 max, as TE's encode multiplier is.
    multiplier = torch.clamp(torch.reciprocal(decode_scales), max=FP32_MAX)
    element_max = element.max_finite
    scaled = torch.clamp(blocks * multiplier, -element_max, element_max)
    magnitude = formats.round_magnitude(scaled.abs(), element, rounding, random_bits)
    return torch.copysign(magnitude, scaled)


def quantize_blocks(
    blocks: torch.Tensor,
    layout: BlockLayout,
    scheme: BlockScheme,
    rounding: Rounding,
    scale_rule: ScaleRuleFunction,
    *,
    tensor_amax: torch.Tensor | None,
    random_bits: torch.Tensor | None,
    name: str,
    checks: DeferredChecks | None,
) -> QuantizedTensor:
    """Quantize the block view ``blocks`` of a finite FP32 tensor laid out by ``layout``.

    Args:
        blocks: (..., n_blocks, B) FP32, from ``layout.to_blocks``.
        layout: the input's block layout (the result keeps it).
        scheme: the block scheme (its target already applied).
        rounding: payload rounding.
        scale_rule: chooses the block scales (see :mod:`ue5m3.numerics.scale_rules`).
        tensor_amax: the held reference g, 0-dim FP32 and already checked; None takes the current max|x|.
        random_bits: per-element random integers shaped like the input, for stochastic rounding.
        name: tensor name for error messages.
        checks: defer the finiteness check of the current reference to the device.

    Raises:
        ValueError: the tensor holds Inf or NaN (when ``tensor_amax`` is None and ``checks`` is None).
    """
    block_amax = torch.amax(blocks.abs(), dim=-1, keepdim=True)  # NaN propagates into the check below
    g = tensor_amax
    if g is None:
        g = block_amax.max() if block_amax.numel() else torch.zeros((), dtype=torch.float32, device=blocks.device)
        if checks is not None:
            checks.defer(name, ~torch.isfinite(g), nonfinite_message(name))
        elif not bool(torch.isfinite(block_amax).all()):
            formats.check_finite(blocks, name)  # the padding is finite: the count is the input's
    global_scale = tensor_global_scale(scheme, g)
    global_decode_scale = torch.reciprocal(global_scale)
    scales = scale_rule(blocks, block_amax, tensor_amax=g, global_scale=global_scale, scheme=scheme)
    decode_scales = scales.values * global_decode_scale
    block_bits = layout.to_blocks(random_bits) if random_bits is not None else None
    return QuantizedTensor(
        scheme=scheme,
        rounding=rounding,
        layout=layout,
        tensor_amax=g,
        global_scale=global_scale,
        global_decode_scale=global_decode_scale,
        block_amax=block_amax,
        scale_values=scales.values,
        decode_scales_blocks=decode_scales,
        payload_blocks=encode_blocks(blocks, decode_scales, scheme.element, rounding, block_bits),
        zero_rounded_blocks=scales.zero_rounded.sum(),
        saturated_blocks=scales.saturated.sum(),
    )
