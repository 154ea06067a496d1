"""The fused kernels seen from the quantizer: settled quantizations in, :class:`QuantizedTensor` results out.

The kernels (:mod:`ue5m3.numerics.kernels.cpu`, :mod:`ue5m3.numerics.kernels.triton_quantize`) speak a flat
language: 2-D FP32 blocks ``(N, L)``, the scale rule and order by name, the scale format as its max and exponent
range, the tensor scale as G, 1/G and torchao's divisor, Philox streams with block base indices. This module
translates one settled quantization (:class:`KernelCall`) into that language and the kernels' flat outputs back into
a :class:`~ue5m3.numerics.quantized.QuantizedTensor` in the caller's block layout, for the single-axis kernels
(:func:`quantize_on_kernel`) and the Triton two-axis kernel that reads a 2-D tensor once and writes its blocks
along both axes (:func:`quantize_both_axes_on_triton`).

The kernels are imported only when a call reaches them: importing this module loads neither the C library nor
Triton.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ue5m3.numerics import philox
from ue5m3.numerics.formats import Rounding
from ue5m3.numerics.layout import BlockLayout
from ue5m3.numerics.quantized import QuantizedTensor
from ue5m3.numerics.scale_rules import host_tensor_factors, tensor_factors
from ue5m3.numerics.schemes import BlockScheme, ScaleRule

__all__ = ["KernelCall", "fits_two_axis_kernel", "quantize_on_kernel", "quantize_both_axes_on_triton"]


@dataclass(frozen=True)
class KernelCall:
    """One quantization with its arguments settled (checked and defaulted by the caller), as a kernel receives it."""

    scheme: BlockScheme  # the target override already applied
    rounding: Rounding
    layout: BlockLayout
    tensor_amax: torch.Tensor  # g, 0-dim FP32 on the input's device, checked (or its check deferred)
    stream: philox.RandomStream | None  # the Philox stream to draw from; None: deterministic, or explicit bits
    index: philox.ElementIndex | None
    name: str


def fits_two_axis_kernel(layout: BlockLayout, x: torch.Tensor) -> bool:
    """Whether the two-axis kernel reads x in place: a 2-D tensor in 1D blocks, both dimensions whole blocks."""
    b = layout.block_size
    return x.ndim == 2 and not layout.two_d and x.shape[0] % b == 0 and x.shape[1] % b == 0


def _scheme_arguments(scheme: BlockScheme) -> dict:
    """The scale rule and scale format as both kernels take them."""
    s = scheme.scale
    return {
        "rule": scheme.scale_rule.value,
        "order": scheme.scale_order.value,
        "scale_max": s.max_finite,
        "scale_mantissa_bits": s.mantissa_bits,
        "scale_min_exponent": s.min_exponent,
        "scale_max_exponent": s.max_exponent,
        "zero_scale_repair": scheme.zero_scale_repair,
        "selection": None if scheme.selection is None else scheme.selection.value,
    }


def _selection_arguments(scheme: BlockScheme, g: torch.Tensor, *, on_host: bool) -> dict:
    """What the 4/6 rule reads beyond the other rules' arguments: the tensor reference g (a host float for the CPU
    kernel, the 0-dim device tensor for Triton) and T * F (the FP32 product); nothing for the other rules."""
    if scheme.scale_rule is not ScaleRule.FOUR_OVER_SIX:
        return {}
    target_f = float(torch.tensor(float(scheme.target), dtype=torch.float32) * scheme.element.max_finite)
    return {"tensor_amax": float(g) if on_host else g, "target_f": target_f}


def quantize_on_kernel(
    kernel: str, blocks: torch.Tensor, call: KernelCall, random_bits: torch.Tensor | None
) -> QuantizedTensor:
    """Quantize the block view ``blocks`` (..., n_blocks, B) of a checked FP32 tensor on ``kernel`` ('cpu_kernel'
    or 'triton'), with explicit ``random_bits`` shaped like the input or the bits of ``call.stream``."""
    if kernel == "triton":
        from ue5m3.numerics.kernels import triton_quantize as fused
    else:
        from ue5m3.numerics.kernels import cpu as fused

    layout = call.layout
    if kernel == "triton":  # Triton reads the 0-dim device tensors in the kernel (no sync)
        factors = tensor_factors(call.scheme, call.tensor_amax)
        global_scale, global_decode_scale, per_tensor = factors
    else:  # the CPU kernel takes host floats, formed on the host (reading a CPU tensor is free)
        global_scale, global_decode_scale, per_tensor = host_tensor_factors(call.scheme, float(call.tensor_amax))
        factors = (_scalar(global_scale), _scalar(global_decode_scale), None)
    length = blocks.shape[-1]
    if kernel != "triton" and blocks.ndim >= 3 and blocks.stride(-1) != 1:  # the CPU kernel reads a strided view
        flat = blocks.flatten(0, -3)  # a view for 2-D inputs (blocks along tokens of a transposed operand included)
    else:  # (..., n_blocks, L) -> (N, L): a view for 1D blocks along the last axis, a copy otherwise
        flat = blocks.reshape(-1, length)
    flat_bits = layout.to_blocks(random_bits).reshape(-1, length) if random_bits is not None else None
    stream = call.stream
    out = fused.quantize_blocks(
        flat,
        **_scheme_arguments(call.scheme),
        global_scale=global_scale,
        global_decode_scale=global_decode_scale,
        per_tensor=per_tensor,
        rounding=call.rounding.value,
        random_bits=flat_bits,
        philox=None if stream is None else (stream, *_block_indices(layout, call, flat.device, kernel)),
        **_selection_arguments(call.scheme, call.tensor_amax, on_host=kernel != "triton"),
    )
    return _from_kernel(out, call, factors, blocks.shape)


def _block_indices(layout: BlockLayout, call: KernelCall, device: torch.device, kernel: str) -> tuple:
    """The block view's global indices; the C kernel's are shared between calls (the Triton path's CPU run under the
    interpreter stands for a device's, which makes them per call)."""
    return layout.block_indices(call.index, call.name, device, reuse=kernel != "triton")


def _scalar(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32)


def _from_kernel(
    out: dict[str, torch.Tensor],
    call: KernelCall,
    factors: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    block_view: tuple[int, ...],
) -> QuantizedTensor:
    """A fused kernel's flat outputs (per block, and the payload [n_blocks, block]) as a quantized tensor whose
    block view is ``block_view``; ``factors`` are the tensor scale's (G, 1/G, torchao's divisor) it was given."""
    block_shape = block_view[:-1]
    global_scale, global_decode_scale, _ = factors
    if "zero_rounded_blocks" in out:  # the C kernel's adapter counted its flags (one histogram)
        zero_rounded, saturated = out["zero_rounded_blocks"], out["saturated_blocks"]
    else:
        flags = out["flags"]
        zero_rounded, saturated = (flags & 1).sum(dtype=torch.int64), ((flags >> 1) & 1).sum(dtype=torch.int64)
    return QuantizedTensor(
        scheme=call.scheme,
        rounding=call.rounding,
        layout=call.layout,
        tensor_amax=call.tensor_amax,
        global_scale=global_scale,
        global_decode_scale=global_decode_scale,
        block_amax=out["block_amax"].reshape(*block_shape, 1),
        scale_values=out["scales"].reshape(*block_shape, 1),
        decode_scales_blocks=out["decode"].reshape(*block_shape, 1),
        payload_blocks=out["payload"].reshape(block_view),
        zero_rounded_blocks=zero_rounded,
        saturated_blocks=saturated,
        lost_blocks=out.get("lost_blocks"),
    )


def quantize_both_axes_on_triton(
    x: torch.Tensor, last: KernelCall | None, first: KernelCall | None, *, transposed: bool
) -> tuple[QuantizedTensor | None, QuantizedTensor | None]:
    """The Triton two-axis kernel on a checked 2-D FP32 ``x`` (both dimensions whole blocks): ``last`` in blocks
    along x's last axis, ``first`` along its first axis (laid out as x.t()'s last axis when ``transposed``); None
    for an axis not asked for. The two calls share the scheme but for its target."""
    from ue5m3.numerics.kernels import triton_quantize

    rows, cols = x.shape
    factors, requests = {}, {}
    for side, call in (("last", last), ("first", first)):
        if call is None:
            requests[side] = None
            continue
        base, strides = (call.index or philox.ElementIndex()).strides(tuple(call.layout.shape), call.name)
        # the global index of x's element (r, c): layout coordinates (r, c), or (c, r) for the transposed layout
        stride_row, stride_col = (strides[1], strides[0]) if side == "first" and transposed else strides
        factors[side] = tensor_factors(call.scheme, call.tensor_amax)
        requests[side] = triton_quantize.AxisRequest(
            *factors[side],
            rounding=call.rounding.value,
            stream=call.stream,
            base=base,
            stride_row=stride_row,
            stride_col=stride_col,
            **_selection_arguments(call.scheme, call.tensor_amax, on_host=False),
        )
    scheme = (last or first).scheme
    out_last, out_first = triton_quantize.quantize_both_axes(
        x, block=scheme.block_size, **_scheme_arguments(scheme), last=requests["last"], first=requests["first"]
    )
    block = scheme.block_size
    return (
        None if last is None else _from_kernel(out_last, last, factors["last"], (rows, cols // block, block)),
        None if first is None else _from_kernel(out_first, first, factors["first"], (cols, rows // block, block)),
    )
