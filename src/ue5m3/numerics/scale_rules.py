"""Scale rules: how each block's scale is chosen, one plain function per :class:`~ue5m3.numerics.schemes.ScaleRule`.

Block quantization is pure encoding apart from the scale choice (as in gfloat's ``quantize_block``, which receives
its scale rule as a callable): :func:`ue5m3.numerics.encode.quantize_blocks` receives one of these functions and
encodes every block with the scales it returns. :data:`SCALE_RULES` maps each rule name of a scheme to its
function; the fused kernels implement the same rules once more in C and Triton (selected by the same names), and
tests/test_cpu_kernel.py and tests/test_triton_quantize.py hold their bits equal to these.

A scale rule is called as ``rule(blocks, block_amax, tensor_amax=g, global_scale=G, scheme=scheme)`` with

* ``blocks``: the block view (..., n_blocks, B) of the FP32 input (zero padding included), so a rule may read the
  values themselves, not only their maxima (a rule that picks per block among candidate scales by the error they
  give, as NVIDIA's "4/6" selection does, needs them);
* ``block_amax``: max|x| per block, (..., n_blocks, 1) FP32;
* ``tensor_amax``: the tensor reference g, 0-dim FP32 (stale or current);
* ``global_scale``: G = (T * F) / g from :func:`tensor_global_scale` (1 for rules without a tensor scale);

and returns :class:`BlockScales`: the values the scale format holds (after any repair), which blocks rounded to a
zero scale and which ideal scales exceeded the format's max (diagnostics).

The tensor-scaled rule (spec 3.1, 3.2) in FP32: G = (T * F) / g (capped at FP32 max, 1 when g = 0); ideal block
scale u = a_B * (G * (1/F)) in exactly that order (:class:`~ue5m3.numerics.schemes.ScaleOrder` selects TE's older
order or torchao's); u = min(u, scale max); RNE onto the scale format (scales are never stochastically rounded).
The MX rules (spec 3.3) read the exponent field of a_B's FP32 bit pattern and never cast.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple, Protocol

import torch

from ue5m3.numerics import formats
from ue5m3.numerics.formats import FloatFormat, Rounding
from ue5m3.numerics.schemes import BlockScheme, ScaleOrder, ScaleRule

__all__ = [
    "FP32_MAX",
    "BlockScales",
    "ScaleRuleFunction",
    "SCALE_RULES",
    "tensor_global_scale",
    "tensor_factors",
    "tensor_scaled",
    "mx_floor",
    "mx_ceil",
    "mx_rceil",
    "mx_round_log2",
]

FP32_MAX = torch.finfo(torch.float32).max


class BlockScales(NamedTuple):
    """What a scale rule returns, each (..., n_blocks, 1) like the block maxima."""

    values: torch.Tensor  # FP32 values the scale format holds, after any zero-scale repair
    zero_rounded: torch.Tensor  # bool: the scale rounded to zero (before repair)
    saturated: torch.Tensor  # bool: the ideal scale exceeded the scale format's max


class ScaleRuleFunction(Protocol):
    """The signature every scale rule has (see the module docstring for what each argument holds)."""

    def __call__(
        self,
        blocks: torch.Tensor,
        block_amax: torch.Tensor,
        *,
        tensor_amax: torch.Tensor,
        global_scale: torch.Tensor,
        scheme: BlockScheme,
    ) -> BlockScales: ...


# ----- the tensor scale ---------------------------------------------------------------------------------


def _global_scale(target: float, element_max: float, amax: torch.Tensor) -> torch.Tensor:
    """G = (T * F) / g in FP32, capped at FP32 max; 1 when g == 0 or G underflows to 0."""
    numerator = torch.tensor(target, dtype=torch.float32) * torch.tensor(element_max, dtype=torch.float32)
    g = torch.clamp(numerator / amax, max=FP32_MAX)
    return torch.where((amax == 0) | (g == 0), torch.ones_like(g), g)


def tensor_global_scale(scheme: BlockScheme, g: torch.Tensor) -> torch.Tensor:
    """The scheme's G for reference g (0-dim FP32); 1 for schemes without a tensor scale."""
    if scheme.uses_tensor_amax:
        return _global_scale(float(scheme.target), scheme.element.max_finite, g)
    return torch.ones((), dtype=torch.float32)


def _torchao_per_tensor(scheme: BlockScheme, g: torch.Tensor) -> torch.Tensor:
    """torchao's per-tensor divisor g / (T * F) (1 when g == 0), FP32."""
    per_tensor = g / (torch.tensor(float(scheme.target), dtype=torch.float32) * scheme.element.max_finite)
    return torch.where(g == 0, torch.ones_like(per_tensor), per_tensor)


def tensor_factors(scheme: BlockScheme, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(G, 1/G, torchao's per-tensor divisor) of one quantization, as 0-dim FP32 tensors on g's device: what the
    fused kernels read in place of the tensor reference."""
    scale = tensor_global_scale(scheme, g).to(g.device)
    decode_scale = torch.reciprocal(scale)
    per_tensor = torch.ones((), dtype=torch.float32, device=g.device)
    if scheme.scale_rule is ScaleRule.TENSOR_SCALED and scheme.scale_order is ScaleOrder.TORCHAO:
        per_tensor = _torchao_per_tensor(scheme, g)
    return scale, decode_scale, per_tensor


# ----- the rules ----------------------------------------------------------------------------------------


def _ideal_scale(
    block_amax: torch.Tensor, g: torch.Tensor, global_scale: torch.Tensor, scheme: BlockScheme
) -> torch.Tensor:
    inv_f = torch.tensor(1.0, dtype=torch.float32) / scheme.element.max_finite  # the FP32 constant 1/F
    if scheme.scale_order is ScaleOrder.TE:
        # G * (1/F) first, then times a_B: reassociating moves exact midpoints (spec's 38,912 case).
        return block_amax * (global_scale * inv_f)
    if scheme.scale_order is ScaleOrder.TE_LEGACY:
        return (block_amax / scheme.element.max_finite) * global_scale
    return (block_amax / scheme.element.max_finite) / _torchao_per_tensor(scheme, g)


def _power_of_two(exponent: torch.Tensor) -> torch.Tensor:
    return torch.ldexp(torch.ones_like(exponent, dtype=torch.float32), exponent.to(torch.int32))


def _power_of_two_scales(exponent: torch.Tensor, scale_fmt: FloatFormat) -> BlockScales:
    """2^exponent, saturating at the scale format's exponent range; no power of two rounds to zero."""
    saturated = exponent > scale_fmt.max_exponent
    exponent = torch.clamp(exponent, min=scale_fmt.min_exponent, max=scale_fmt.max_exponent)
    return BlockScales(_power_of_two(exponent), torch.zeros_like(saturated), saturated)


def tensor_scaled(
    blocks: torch.Tensor,
    block_amax: torch.Tensor,
    *,
    tensor_amax: torch.Tensor,
    global_scale: torch.Tensor,
    scheme: BlockScheme,
) -> BlockScales:
    """The paper's UE5M3 and TE's NVFP4 block scale: the ideal scale in the scheme's FP32 order, capped at the
    scale format's max and RNE onto it; zero scales repaired to 1.0 where the scheme says so."""
    scale_fmt = scheme.scale
    ideal = _ideal_scale(block_amax, tensor_amax, global_scale, scheme)
    saturated = ideal > scale_fmt.max_finite
    ideal = torch.clamp(ideal, max=scale_fmt.max_finite)
    values = formats.round_magnitude(ideal, scale_fmt, Rounding.RNE, None)  # scales are always RNE
    zero = values == 0
    if scheme.zero_scale_repair:
        values = torch.where(zero, torch.ones_like(values), values)
    return BlockScales(values, zero, saturated)


def _exponent_field_scales(block_amax: torch.Tensor, scheme: BlockScheme, *, ceil: bool) -> BlockScales:
    # Exponent bits of a_B (FP32 bit pattern), never a dtype cast: zero gives field 0 -> minimum scale.
    bits = block_amax.view(torch.int32)
    exponent = ((bits >> 23) & 0xFF) - 127
    if ceil:
        exponent = exponent + ((bits & 0x7FFFFF) != 0).to(exponent.dtype)
    return _power_of_two_scales(exponent - scheme.element.max_exponent, scheme.scale)


def mx_floor(
    blocks: torch.Tensor,
    block_amax: torch.Tensor,
    *,
    tensor_amax: torch.Tensor,
    global_scale: torch.Tensor,
    scheme: BlockScheme,
) -> BlockScales:
    """OCP MXFP4: 2^(floor(log2 a_B) - emax(element))."""
    return _exponent_field_scales(block_amax, scheme, ceil=False)


def mx_ceil(
    blocks: torch.Tensor,
    block_amax: torch.Tensor,
    *,
    tensor_amax: torch.Tensor,
    global_scale: torch.Tensor,
    scheme: BlockScheme,
) -> BlockScales:
    """torchao's CEIL mode: 2^(ceil(log2 a_B) - emax(element))."""
    return _exponent_field_scales(block_amax, scheme, ceil=True)


def mx_rceil(
    blocks: torch.Tensor,
    block_amax: torch.Tensor,
    *,
    tensor_amax: torch.Tensor,
    global_scale: torch.Tensor,
    scheme: BlockScheme,
) -> BlockScales:
    """torchao's RCEIL, TE's ``float_to_e8m0``: 2^ceil(log2(a_B * fp32(1/F))) from the product's bits."""
    # descale = a_B * fp32(1/F), its biased exponent rounded up from the bits; FP32 subnormals round up only
    # above 2^-127 (the UE8M0 minimum, mantissa 0x400000); saturating at the scale format's max.
    descale = block_amax * (torch.tensor(1.0, dtype=torch.float32) / scheme.element.max_finite)
    bits = descale.view(torch.int32)
    biased, mantissa = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    up = torch.where(biased == 0, mantissa > 0x400000, mantissa != 0)
    return _power_of_two_scales(biased + up.to(biased.dtype) - 127, scheme.scale)


def mx_round_log2(
    blocks: torch.Tensor,
    block_amax: torch.Tensor,
    *,
    tensor_amax: torch.Tensor,
    global_scale: torch.Tensor,
    scheme: BlockScheme,
) -> BlockScales:
    """The authors' MXFP4 baseline: the tensor-scaled ideal scale, then the power of two nearest in log2 (FP64)."""
    scale_fmt = scheme.scale
    ideal = _ideal_scale(block_amax, tensor_amax, global_scale, scheme)
    saturated = ideal > scale_fmt.max_finite
    exponent = torch.round(torch.log2(ideal.to(torch.float64)))
    exponent = torch.clamp(torch.nan_to_num(exponent, neginf=-1e4), scale_fmt.min_exponent, scale_fmt.max_exponent)
    return BlockScales(_power_of_two(exponent), torch.zeros_like(saturated), saturated)


SCALE_RULES: Mapping[ScaleRule, ScaleRuleFunction] = MappingProxyType(
    {
        ScaleRule.TENSOR_SCALED: tensor_scaled,
        ScaleRule.MX_FLOOR: mx_floor,
        ScaleRule.MX_CEIL: mx_ceil,
        ScaleRule.MX_RCEIL: mx_rceil,
        ScaleRule.MX_ROUND_LOG2: mx_round_log2,
    }
)
