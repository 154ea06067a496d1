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

The 4/6 rule (:func:`four_over_six`) follows fouroversix's PyTorch reference (``fouroversix`` 1.0.5,
``quantize/pytorch/reference.py``: ``quantize_to_nvfp4`` and ``select_fouroversix``) operation for operation in FP32:
the 6-candidate u6 = (a_B / F) * G with G = (256 * F) / g, the 4-candidate u4 = u6 * 1.5, each capped and RNE onto the
scale format; each candidate's payload round_E2M1(x * fp32(1 / (S * (1/G)))) under RNE; its block error from the
dequantized values ((payload * S) * g) / (T * F), in that order; the 4-candidate kept where its error is strictly
lower (ties keep 6). The block sums run in the order of torch's CPU sum of a contiguous 16-element FP32 row, which is
what fouroversix's reference computes on a CPU: two 8-lane vectors added lane by lane, then the eight lanes in order
from 0 (:func:`block_error_sum`); a 16x16 tile's 256 errors in that sum's order for 32 vectors (four accumulators of
eight vectors each, added in order, then the lanes). The fused kernels sum in the same order.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple, Protocol

import numpy as np
import torch

from ue5m3.numerics import formats
from ue5m3.numerics.formats import FloatFormat, Rounding
from ue5m3.numerics.schemes import BlockScheme, ScaleOrder, ScaleRule, Selection

__all__ = [
    "FP32_MAX",
    "BlockScales",
    "ScaleRuleFunction",
    "SCALE_RULES",
    "tensor_global_scale",
    "tensor_factors",
    "host_tensor_factors",
    "host_target_f",
    "tensor_scaled",
    "mx_floor",
    "mx_ceil",
    "mx_rceil",
    "mx_round_log2",
    "four_over_six",
    "block_error_sum",
    "FOUR_OVER_SIX_FACTOR",
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


def host_target_f(scheme: BlockScheme) -> np.float32:
    """T * F, the FP32 product of the scheme's target and its element format's largest value, as a NumPy float32."""
    return np.float32(float(scheme.target)) * np.float32(scheme.element.max_finite)


def host_tensor_factors(scheme: BlockScheme, g: float) -> tuple[float, float, float]:
    """:func:`tensor_factors` for a reference g held on the host (a CPU tensor's value): the same FP32 operations on
    NumPy float32 scalars (IEEE single precision, round to nearest even, as torch's CPU ops), returned as Python
    floats. A CPU quantization forms them without a dozen 0-dim tensor ops (``tests/test_cpu_kernel.py`` checks
    both paths bit for bit, zero, tiny and huge references included)."""
    one = np.float32(1.0)
    if not scheme.uses_tensor_amax:
        return 1.0, 1.0, 1.0
    amax = np.float32(g)
    target_f = host_target_f(scheme)
    if amax == 0:
        scale = one
    else:
        with np.errstate(over="ignore", under="ignore"):
            scale = min(target_f / amax, np.float32(FP32_MAX))
        scale = one if scale == 0 else scale
    decode_scale = one / scale
    per_tensor = one
    if scheme.scale_rule is ScaleRule.TENSOR_SCALED and scheme.scale_order is ScaleOrder.TORCHAO and amax != 0:
        with np.errstate(under="ignore"):
            per_tensor = amax / target_f
    return float(scale), float(decode_scale), float(per_tensor)


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


def _format_scales(ideal: torch.Tensor, scheme: BlockScheme) -> BlockScales:
    """Ideal scales capped at the scale format's max, RNE onto it (scales are always RNE), zeros repaired where the
    scheme says so."""
    scale_fmt = scheme.scale
    saturated = ideal > scale_fmt.max_finite
    values = formats.round_magnitude(torch.clamp(ideal, max=scale_fmt.max_finite), scale_fmt, Rounding.RNE, None)
    zero = values == 0
    if scheme.zero_scale_repair:
        values = torch.where(zero, torch.ones_like(values), values)
    return BlockScales(values, zero, saturated)


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
    return _format_scales(_ideal_scale(block_amax, tensor_amax, global_scale, scheme), scheme)


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


FOUR_OVER_SIX_FACTOR = 1.5  # the 4-candidate's ideal scale is the 6-candidate's times 6/4, one FP32 product


def block_error_sum(errors: torch.Tensor) -> torch.Tensor:
    """Sum (..., L) non-negative FP32 errors over the last axis in the order of torch's CPU sum of a contiguous row
    (what fouroversix's reference computes on a CPU), for L = 16 and L = 256: (..., 1).

    16: lanes k and k + 8 added, then the eight lane sums one after another from 0. 256 (a 16x16 tile): the 32
    8-lane vectors v_i summed as acc_k = v_k + v_{k+4} + ... + v_{k+28} (k = 0..3, in i order), then
    ((acc_0 + acc_1) + acc_2) + acc_3, then the lanes in order.
    """
    length = errors.shape[-1]
    if length == 16:
        lanes = errors[..., :8] + errors[..., 8:]
    elif length == 256:
        vectors = errors.reshape(*errors.shape[:-1], 8, 4, 8)  # (..., i, k, lane): vector 4i + k
        acc = vectors[..., 0, :, :]
        for i in range(1, 8):
            acc = acc + vectors[..., i, :, :]
        lanes = ((acc[..., 0, :] + acc[..., 1, :]) + acc[..., 2, :]) + acc[..., 3, :]
    else:
        raise ValueError(f"block_error_sum takes 16 or 256 errors per block, got {length}")
    total = lanes[..., 0:1]
    for k in range(1, 8):
        total = total + lanes[..., k : k + 1]
    return total


def _block_error(
    blocks: torch.Tensor, scales: torch.Tensor, g: torch.Tensor, global_scale: torch.Tensor, scheme: BlockScheme
) -> torch.Tensor:
    """The candidate's block error: its RNE payload dequantized as ((payload * S) * g) / (T * F), in FP32."""
    element = scheme.element
    multiplier = torch.clamp(torch.reciprocal(scales * torch.reciprocal(global_scale)), max=FP32_MAX)
    scaled = torch.clamp(blocks * multiplier, -element.max_finite, element.max_finite)
    payload = torch.copysign(formats.round_magnitude(scaled.abs(), element, Rounding.RNE, None), scaled)
    target_f = torch.tensor(float(scheme.target), dtype=torch.float32) * element.max_finite
    difference = ((payload * scales) * g) / target_f - blocks
    if scheme.selection is Selection.ABS_MAX:
        return torch.amax(difference.abs(), dim=-1, keepdim=True)
    errors = difference.abs() if scheme.selection is Selection.MAE else difference * difference
    return block_error_sum(errors)


def four_over_six(
    blocks: torch.Tensor,
    block_amax: torch.Tensor,
    *,
    tensor_amax: torch.Tensor,
    global_scale: torch.Tensor,
    scheme: BlockScheme,
) -> BlockScales:
    """4/6: the block scale that maps a_B to 6 or the one that maps it to 4, whichever gives the lower block error
    under RNE (6 on ties); diagnostics are the chosen candidate's."""
    six = _format_scales(_ideal_scale(block_amax, tensor_amax, global_scale, scheme), scheme)
    four_ideal = _ideal_scale(block_amax, tensor_amax, global_scale, scheme) * FOUR_OVER_SIX_FACTOR
    four = _format_scales(four_ideal, scheme)
    take_four = _block_error(blocks, four.values, tensor_amax, global_scale, scheme) < _block_error(
        blocks, six.values, tensor_amax, global_scale, scheme
    )
    return BlockScales(*(torch.where(take_four, f, s) for f, s in zip(four, six, strict=True)))


SCALE_RULES: Mapping[ScaleRule, ScaleRuleFunction] = MappingProxyType(
    {
        ScaleRule.TENSOR_SCALED: tensor_scaled,
        ScaleRule.MX_FLOOR: mx_floor,
        ScaleRule.MX_CEIL: mx_ceil,
        ScaleRule.MX_RCEIL: mx_rceil,
        ScaleRule.MX_ROUND_LOG2: mx_round_log2,
        ScaleRule.FOUR_OVER_SIX: four_over_six,
    }
)
