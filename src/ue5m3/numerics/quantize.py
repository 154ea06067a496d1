"""Block quantization: FP4 payloads with per-block scales, one code path for every scheme and every backend.

:func:`quantize` block-quantizes a tensor under a :class:`~ue5m3.numerics.schemes.BlockScheme` (numerics spec
section 3) and returns a :class:`~ue5m3.numerics.quantized.QuantizedTensor` holding payload, scale codes, decoded
scales, the tensor reference and diagnostics (blocks whose scale rounded to zero, blocks that saturated the scale
format). It is a short function over the parts of a quantization, each in its own module:

* :mod:`~ue5m3.numerics.arguments` -- every argument checked up front, naming the argument;
* :mod:`~ue5m3.numerics.schemes` -- what to compute: element format, block size, scale format, scale rule (data);
* :mod:`~ue5m3.numerics.layout` -- how the tensor is cut into blocks (1D along any axis, or 2D tiles; ragged shapes
  zero-padded as Transformer Engine pads them);
* the tensor reference g -- the current max|x| or a held (possibly stale) one, checked finite (here);
* :mod:`~ue5m3.numerics.backend` -- who computes it: the torch reference or a fused kernel (C, Triton), the same
  bits on each;
* :mod:`~ue5m3.numerics.encode` with a function of :mod:`~ue5m3.numerics.scale_rules` -- the torch reference: pure
  encoding apart from the scale choice, which it receives as a function; :mod:`ue5m3.numerics.kernels.adapters`
  -- the same quantization handed to a fused kernel;
* :mod:`~ue5m3.numerics.quantized` -- the results and their packed storage form.

Stochastic rounding draws its bits from Philox4x32-10 keyed by a :class:`~ue5m3.numerics.philox.RandomStream`
and each element's global index (:class:`~ue5m3.numerics.philox.ElementIndex`), on every backend the same.
:func:`quantize_both_axes` quantizes a 2-D tensor in 1D blocks along both axes (an FP4 linear's X and dY), from one
read of the tensor on the Triton backend. The public names of the parts are re-exported here, so
``quantize.QuantizedTensor`` and ``quantize.get_scheme`` keep working.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from ue5m3.numerics import encode, formats, philox
from ue5m3.numerics.arguments import (
    check_backend,
    check_input,
    check_quantize_arguments,
    check_request_fields,
    resolve_scheme,
)
from ue5m3.numerics.backend import Backend, fused_kernel, triton_by_default, triton_reason
from ue5m3.numerics.checks import DeferredChecks, nonfinite_message
from ue5m3.numerics.formats import Rounding
from ue5m3.numerics.kernels.adapters import (
    KernelCall,
    fits_two_axis_kernel,
    quantize_both_axes_on_triton,
    quantize_on_kernel,
)
from ue5m3.numerics.layout import BlockLayout
from ue5m3.numerics.quantized import PackedQuantized, QuantizedTensor, pack_fp4, unpack_fp4
from ue5m3.numerics.scale_rules import SCALE_RULES
from ue5m3.numerics.schemes import SCHEMES, BlockScheme, DequantizeOrder, ScaleOrder, ScaleRule, get_scheme

__all__ = [
    "ScaleRule",
    "ScaleOrder",
    "DequantizeOrder",
    "BlockScheme",
    "SCHEMES",
    "get_scheme",
    "Backend",
    "QuantizedTensor",
    "PackedQuantized",
    "quantize",
    "AxisQuantization",
    "quantize_both_axes",
    "fake_quantize",
    "pack_fp4",
    "unpack_fp4",
]


def quantize(
    x: torch.Tensor,
    scheme: str | BlockScheme,
    *,
    tensor_amax: torch.Tensor | float | None = None,
    target: float | None = None,
    rounding: Rounding | str = Rounding.RNE,
    two_d: bool = False,
    axis: int = -1,
    random_bits: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    stream: philox.RandomStream | None = None,
    index: philox.ElementIndex | None = None,
    name: str = "x",
    backend: Backend | str = Backend.AUTO,
    checks: DeferredChecks | None = None,
) -> QuantizedTensor:
    """Block-quantize ``x`` (computed in FP32) under ``scheme``.

    Args:
        x: finite floating-point tensor; ragged shapes are zero-padded to whole blocks (scales keep the padded grid).
        scheme: a name in :data:`SCHEMES` or a :class:`BlockScheme`.
        tensor_amax: tensor reference g (e.g. a held, possibly stale, amax: a float or a one-element tensor on x's
            device or the CPU); defaults to max|x| now.
        target: overrides the scheme's target T.
        rounding: payload rounding (scales are always RNE).
        two_d: BxB tiles of a 2-D tensor instead of 1D blocks along ``axis``.
        axis: the blocked axis (the GEMM reduction dimension) for 1D blocks.
        random_bits: explicit per-element random integers for stochastic rounding, shaped like ``x`` (tests).
        generator: a CPU generator that seeds a fresh random stream when neither ``random_bits`` nor ``stream`` is
            given.
        stream: the Philox stream of this quantization (run seed, module, role, step, microbatch).
        index: where ``x`` sits in the logical tensor whose global indices key the bits (shards).
        name: tensor name for error messages.
        backend: see :class:`Backend`; results do not depend on it.
        checks: record the finiteness checks of ``x`` and ``tensor_amax`` on their device instead of reading them
            now (no host synchronisation; :meth:`DeferredChecks.raise_if_any` raises later, naming the tensor).

    Returns:
        A :class:`QuantizedTensor`.

    Raises:
        TypeError: an argument of the wrong type or dtype (:mod:`ue5m3.numerics.arguments`), naming it.
        ValueError: non-finite input or reference, bad shapes or devices, unknown scheme, rounding or backend, or a
            kernel backend for a case its kernel does not cover.
    """
    rounding, backend = check_quantize_arguments(
        "quantize()",
        x,
        tensor_amax=tensor_amax,
        target=target,
        rounding=rounding,
        two_d=two_d,
        axis=axis,
        random_bits=random_bits,
        generator=generator,
        stream=stream,
        index=index,
        name=name,
        backend=backend,
        checks=checks,
    )
    scheme = resolve_scheme(scheme, target=target, tensor_amax=tensor_amax, name=name)
    x = x.to(torch.float32)
    layout = BlockLayout.of(x, scheme.block_size, axis, two_d, name)
    kernel = fused_kernel(x, scheme, backend, name)
    if rounding.random_bit_count and random_bits is None and stream is None:
        stream = formats.anonymous_stream(generator)
    bits = _payload_bits(x, rounding, random_bits, generator, stream, index, name, kernel_draws=kernel is not None)
    # on the CPU, outside the Triton path (whose CPU run under the interpreter stands for a device's), the reference
    # is read and checked on the host
    g = _reference(x, tensor_amax, name, checks, current=kernel is not None, host=kernel != "triton")
    if kernel is None:
        rule = SCALE_RULES[scheme.scale_rule]
        blocks = layout.to_blocks(x)
        return encode.quantize_blocks(
            blocks, layout, scheme, rounding, rule, tensor_amax=g, random_bits=bits, name=name, checks=checks
        )
    draws = stream if bits is None and rounding.random_bit_count else None  # the kernel draws the stream's bits
    call = KernelCall(scheme, rounding, layout, g, draws, index, name)
    if kernel == "triton" and layout.axis == 0 and fits_two_axis_kernel(layout, x) and bits is None:
        # 1D blocks along the first axis of a 2-D tensor: read in place by the two-axis kernel (no transposed copy)
        return quantize_both_axes_on_triton(x, None, call, transposed=False)[1]
    return quantize_on_kernel(kernel, layout.to_blocks(x), call, bits)


def _payload_bits(
    x: torch.Tensor,
    rounding: Rounding,
    random_bits: torch.Tensor | None,
    generator: torch.Generator | None,
    stream: philox.RandomStream | None,
    index: philox.ElementIndex | None,
    name: str,
    *,
    kernel_draws: bool,
) -> torch.Tensor | None:
    """The random bits of the payload's stochastic rounding, shaped like ``x``: explicit ones checked, else the
    stream's Philox bits; None for deterministic roundings and where a fused kernel draws the stream's bits itself."""
    if random_bits is not None or not rounding.random_bit_count:
        return formats.check_random_bits(x, rounding, random_bits, generator)
    if kernel_draws:
        return None
    return philox.random_bits(
        stream, tuple(x.shape), rounding.random_bit_count, index=index, name=name, device=x.device
    )


# ----- the tensor reference -------------------------------------------------------------------------------


def _reference(
    x: torch.Tensor,
    tensor_amax: torch.Tensor | float | None,
    name: str,
    checks: DeferredChecks | None,
    *,
    current: bool,
    host: bool = False,
) -> torch.Tensor | None:
    """The tensor reference g of one quantization: the held ``tensor_amax`` checked, or x's current amax when
    ``current`` (the kernels' paths); None leaves it to the torch path, which takes it from its block maxima. With a
    held reference x is still checked finite, by the one pass an amax takes."""
    if tensor_amax is None and not current:
        return None
    amax = _checked_amax(x, name, checks, host=host)
    return amax if tensor_amax is None else _held_reference(tensor_amax, name, checks, host=host)


def _checked_amax(x: torch.Tensor, name: str, checks: DeferredChecks | None, *, host: bool = False) -> torch.Tensor:
    """max|x| as a 0-dim FP32 tensor from one pass that also checks finiteness (aminmax propagates NaN and Inf):
    deferred into ``checks`` when given, else raised now naming the tensor. With ``host``, a CPU tensor's two extremes
    are read and combined on the host (reading is free there, and a finite tensor leaves nothing to defer)."""
    if host and x.device.type == "cpu" and x.numel():
        low, high = (float(v) for v in torch.aminmax(x))
        if math.isfinite(low) and math.isfinite(high):
            return torch.tensor(abs(max(-low, high)), dtype=torch.float32)
    zero = torch.zeros((), device=x.device)
    low, high = torch.aminmax(x) if x.numel() else (zero, zero)
    current = torch.maximum(-low, high).abs()  # abs: an all-zero tensor's amax is +0.0, as on the torch path
    if checks is not None:
        checks.defer(name, ~torch.isfinite(current), nonfinite_message(name))
    elif not bool(torch.isfinite(current)):
        formats.check_finite(x, name)
    return current


def _held_reference(
    tensor_amax: torch.Tensor | float, name: str, checks: DeferredChecks | None, *, host: bool = False
) -> torch.Tensor:
    """A given tensor reference as a 0-dim FP32 tensor, checked finite and >= 0 (deferred for device tensors when
    ``checks`` is given; with ``host`` a CPU tensor is read, and passes with nothing deferred)."""
    if host and isinstance(tensor_amax, torch.Tensor) and tensor_amax.device.type == "cpu" and tensor_amax.numel() == 1:
        g = tensor_amax.to(torch.float32).reshape(())
        value = float(g)
        if math.isfinite(value) and value >= 0:
            return g
    if isinstance(tensor_amax, torch.Tensor) and checks is not None:
        g = tensor_amax.to(torch.float32).reshape(())
        checks.defer(
            f"{name}.tensor_amax", ~torch.isfinite(g) | (g < 0), f"tensor_amax for {name!r} must be finite and >= 0"
        )
        return g
    g = torch.as_tensor(tensor_amax, dtype=torch.float32).reshape(())
    if not bool(torch.isfinite(g)) or bool(g < 0):
        raise ValueError(f"tensor_amax for {name!r} must be finite and >= 0, got {float(g)!r}")
    return g


# ----- both axes from one read ------------------------------------------------------------------------------


@dataclass(frozen=True)
class AxisQuantization:
    """The per-call settings of one of the two quantizations :func:`quantize_both_axes` computes (the keyword
    arguments of :func:`quantize` that may differ between them)."""

    rounding: Rounding | str = Rounding.RNE
    target: float | None = None
    tensor_amax: torch.Tensor | float | None = None
    stream: philox.RandomStream | None = None
    index: philox.ElementIndex | None = None
    name: str = "x"


def quantize_both_axes(
    x: torch.Tensor,
    scheme: str | BlockScheme,
    last: AxisQuantization,
    first: AxisQuantization,
    *,
    transposed: bool = False,
    backend: Backend | str = Backend.AUTO,
    checks: DeferredChecks | None = None,
) -> tuple[QuantizedTensor, QuantizedTensor]:
    """A 2-D ``x`` quantized in 1D blocks along both axes: the two results of
    ``quantize(x, scheme, axis=-1, **last)`` and ``quantize(x, scheme, axis=0, **first)`` (or, with
    ``transposed=True``, ``quantize(x.t(), scheme, axis=-1, **first)``: the same blocks as the A operand of a
    backward GEMM), bit for bit, with stochastic roundings drawn in that order.

    On the Triton backend, where x's dimensions are multiples of the block, one kernel reads x once and writes both
    (the second already transposed); elsewhere this is the two calls. FP4 training quantizes X (forward and wgrad
    copies) and dY (dgrad and wgrad copies) this way.

    Raises:
        TypeError, ValueError: as :func:`quantize`, naming the request (``last.target``, ...).
    """
    x = _check_both_axes_arguments(x, last, first, transposed, checks)
    backend = check_backend("quantize_both_axes()", backend)
    scheme = get_scheme(scheme)
    if x.ndim != 2:
        raise ValueError(f"quantize_both_axes takes a 2-D tensor; {last.name!r} has shape {tuple(x.shape)}")
    for request in (last, first):  # each side's scheme checked before any work (its target, its reference)
        resolve_scheme(scheme, target=request.target, tensor_amax=request.tensor_amax, name=request.name)
    fused = backend is Backend.TRITON or (backend is Backend.AUTO and triton_by_default(x.device))
    layout = BlockLayout.of(x, scheme.block_size, -1, False, last.name)
    if not (fused and fits_two_axis_kernel(layout, x) and triton_reason(x, scheme) is None):
        first_x, first_axis = (x.t(), -1) if transposed else (x, 0)
        return (
            quantize(x, scheme, axis=-1, backend=backend, checks=checks, **_call_arguments(last)),
            quantize(first_x, scheme, axis=first_axis, backend=backend, checks=checks, **_call_arguments(first)),
        )
    x = x.to(torch.float32)
    current = _checked_amax(x, last.name, checks)
    references = [
        current if r.tensor_amax is None else _held_reference(r.tensor_amax, r.name, checks) for r in (last, first)
    ]
    first_layout = (
        BlockLayout.of(x.t(), scheme.block_size, -1, False, first.name)
        if transposed
        else BlockLayout.of(x, scheme.block_size, 0, False, first.name)
    )
    calls = [
        _kernel_call(scheme, request, request_layout, g)
        for request, request_layout, g in zip((last, first), (layout, first_layout), references, strict=True)
    ]
    return quantize_both_axes_on_triton(x, *calls, transposed=transposed)


def _check_both_axes_arguments(
    x: object, last: object, first: object, transposed: object, checks: object
) -> torch.Tensor:
    caller = "quantize_both_axes()"
    for label, request in (("last", last), ("first", first)):
        if not isinstance(request, AxisQuantization):
            raise TypeError(f"{caller}: {label} must be an AxisQuantization, got {type(request).__name__}")
        if not isinstance(request.name, str):
            raise TypeError(f"{caller}: {label}.name must be a str, got {type(request.name).__name__}")
    x = check_input(caller, x, last.name, checks)
    for label, request in (("last", last), ("first", first)):
        check_request_fields(caller, f"{label}.", x, **_call_arguments(request))
    if not isinstance(transposed, bool):
        raise TypeError(f"{caller}: transposed must be a bool, got {type(transposed).__name__}")
    return x


def _call_arguments(request: AxisQuantization) -> dict:
    return {f.name: getattr(request, f.name) for f in dataclasses.fields(request)}


def _kernel_call(scheme: BlockScheme, request: AxisQuantization, layout: BlockLayout, g: torch.Tensor) -> KernelCall:
    """One side of the two-axis kernel, settled as :func:`quantize` settles its arguments (a fresh stream for a
    stochastic rounding without one)."""
    rounding = Rounding(request.rounding)
    stream = request.stream
    if rounding.random_bit_count and stream is None:
        stream = formats.anonymous_stream(None)
    return KernelCall(
        scheme=scheme.with_target(request.target) if request.target is not None else scheme,
        rounding=rounding,
        layout=layout,
        tensor_amax=g,
        stream=stream if rounding.random_bit_count else None,
        index=request.index,
        name=request.name,
    )


def fake_quantize(x: torch.Tensor, scheme: str | BlockScheme, **kwargs) -> torch.Tensor:
    """Quantize then dequantize (FP32, shaped like ``x``); keyword arguments as :func:`quantize`."""
    return quantize(x, scheme, **kwargs).dequantize()
