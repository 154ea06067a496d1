"""The FP4 matmul of a linear layer: one autograd Function whose three GEMMs quantize each operand by its slot.

    fprop   Y  [T, out]  = X    [T, in]   @ W^T [in, out]    X and W^T along in
    dgrad   dX [T, in]   = dY   [T, out]  @ W   [out, in]    dY and W along out
    wgrad   dW [out, in] = dY^T [out, T]  @ X   [T, in]      dY^T and X along tokens

(the operand settings per GEMM are the table of :mod:`ue5m3.layers.linear`, gemm spec section 1).
:class:`FP4Matmul` takes X, W and one frozen :class:`LinearCall`, what the layer resolved for this call: its
:class:`LinearPolicy`, whether stochastic rounding is on, X's and W's references (already taken), the handle that
takes dY's, the Philox streams of dY's two copies, the weight cache and the layer's device-side diagnostics. It
never sees the module. ``forward`` is fprop; ``backward`` has two blocks, dgrad and wgrad.

Every operand quantization goes through :func:`quantize_operands`: one tensor (X, dY or W) and the operands made of
it; X's fprop and wgrad copies, and dY's dgrad and wgrad copies, come from one read of the tensor where they can.
Every GEMM goes through :func:`run_gemm` and counts its two operands into the layer's accumulator
(:mod:`ue5m3.layers.telemetry`). Tests replace those two functions to record the calls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from ue5m3.layers import telemetry
from ue5m3.layers.recipes import GemmConfig, Operand, OperandSpec
from ue5m3.layers.telemetry import OperandChecks
from ue5m3.layers.weight_cache import WeightCache
from ue5m3.numerics import gemm, hadamard
from ue5m3.numerics.backend import Backend
from ue5m3.numerics.checks import DeferredChecks
from ue5m3.numerics.formats import Rounding
from ue5m3.numerics.philox import ElementIndex, RandomStream
from ue5m3.numerics.quantize import AxisQuantization, BlockScheme, QuantizedTensor, quantize, quantize_both_axes
from ue5m3.numerics.scaling import OperandRole

__all__ = ["LinearPolicy", "OperandCall", "LinearCall", "FP4Matmul", "quantize_operands", "run_gemm"]


@dataclass(frozen=True)
class LinearPolicy:
    """Everything one FP4 linear needs to know, resolved once at conversion.

    Attributes:
        module: the module's name (the scale-state key).
        scheme: the block scheme (targets per operand come from ``operands``).
        operands: the six resolved operand settings.
        gemm: the GEMM output model and its parameters.
        backend: who computes the quantizations and GEMMs (the same bits on every backend).
    """

    module: str
    scheme: BlockScheme
    operands: dict[Operand, OperandSpec]
    gemm: GemmConfig
    backend: Backend = Backend.AUTO


# Per slot: its name after the module's (in messages), the axis of its source tensor (X [T, in], dY [T, out] or
# W [out, in]) its blocks run along, and whether the GEMM takes the source's transpose.
_SLOTS: dict[Operand, tuple[str, int, bool]] = {
    Operand.FPROP_ACTIVATION: ("fprop.x", -1, False),  # X [T, in] along in
    Operand.FPROP_WEIGHT: ("fprop.w", -1, True),  # W^T [in, out] along in
    Operand.DGRAD_UPSTREAM_GRADIENT: ("dgrad.dy", -1, False),  # dY [T, out] along out
    Operand.DGRAD_WEIGHT: ("dgrad.w", 0, False),  # W [out, in] along out
    Operand.WGRAD_UPSTREAM_GRADIENT: ("wgrad.dyt", 0, True),  # dY^T [out, T] along tokens
    Operand.WGRAD_ACTIVATION: ("wgrad.x", 0, False),  # X [T, in] along tokens
}


@dataclass(frozen=True, eq=False)
class OperandCall:
    """One operand quantization of a linear: its spec, tensor reference (None: its current amax) and name, whether
    stochastic rounding is on (off in inference), and the Philox stream and global element index of its bits."""

    spec: OperandSpec
    reference: torch.Tensor | None
    name: str
    stochastic: bool = True
    stream: RandomStream | None = None
    index: ElementIndex | None = None

    def settings(self) -> AxisQuantization:
        """What :func:`~ue5m3.numerics.quantize.quantize` is called with: the spec's rounding (RNE when stochastic
        rounding is off), target and reference; the stream and index only for a stochastic rounding."""
        spec = self.spec
        rounding = spec.rounding if self.stochastic or spec.rounding.random_bit_count == 0 else Rounding.RNE
        stochastic_now = Rounding(rounding).random_bit_count > 0
        return AxisQuantization(
            rounding=rounding,
            target=spec.target,
            tensor_amax=self.reference,
            stream=self.stream if stochastic_now else None,
            index=self.index if stochastic_now else None,
            name=self.name,
        )


@dataclass(frozen=True, eq=False)
class LinearCall:
    """The frozen per-call policy of :class:`FP4Matmul`: what a layer resolved for one call.

    The Function changes nothing here but the layer's diagnostics (``counts`` and ``checks``, on the device) and
    its weight cache (whose entries give the bits recomputing would).

    Attributes:
        policy: the layer's :class:`LinearPolicy`.
        stochastic: whether stochastic roundings draw random bits (False at inference: they round to nearest even).
        activation_reference: X's tensor reference, taken for this call (None: the scheme has no tensor scale).
        weight_reference: W's, likewise.
        upstream_reference: ``(dY, checks) -> reference``, taken once in the backward pass for both dY copies
            (None without references).
        dy_bits: per stochastic dY slot, the Philox stream and the element index that places the operand (dY
            [T, out], dY^T [out, T]) in the global microbatch; empty without an SR state (each stochastic
            quantization then seeds a fresh stream from torch's generator).
        weights: the layer's weight-quantization cache, keyed on ``weight_epoch`` for this call.
        weight_epoch: the scale state's weight epoch at this call (None without a scale state).
        counts: the layer's int64 [6, 4] accumulator on the operands' device (:mod:`ue5m3.layers.telemetry`).
        checks: the layer's deferred finiteness checks.
        sample: where this call records its scale telemetry (a step the run logs), or None (no sampling).
        backward: whether a backward pass can follow (grad mode was on when the layer was called). Without one X's
            wgrad copy is not made: ``needs_input_grad`` still says the weight wants a gradient under ``no_grad``.
    """

    policy: LinearPolicy
    stochastic: bool
    activation_reference: torch.Tensor | None
    weight_reference: torch.Tensor | None
    upstream_reference: Callable[[torch.Tensor, DeferredChecks], torch.Tensor] | None
    dy_bits: Mapping[Operand, tuple[RandomStream, ElementIndex | None]]
    weights: WeightCache
    weight_epoch: int | None
    counts: torch.Tensor
    checks: OperandChecks
    sample: telemetry.TelemetrySample | None = None
    backward: bool = True

    def operand(self, operand: Operand, reference: torch.Tensor | None) -> OperandCall:
        """The quantization of slot ``operand`` in this call; an RHT copy is scaled by its current amax instead of
        ``reference``."""
        spec = self.policy.operands[operand]
        stream, index = self.dy_bits.get(operand, (None, None))
        name = f"{self.policy.module}.{_SLOTS[operand][0]}"
        return OperandCall(spec, None if spec.rht else reference, name, self.stochastic, stream, index)


def quantize_operands(
    tensor: torch.Tensor,
    *operands: OperandCall,
    scheme: BlockScheme,
    backend: Backend = Backend.AUTO,
    checks: DeferredChecks | None = None,
) -> tuple[QuantizedTensor, ...]:
    """Quantize ``tensor`` for each GEMM operand made of it, as its spec says: the single place every operand
    quantization of a linear passes through.

    Args:
        tensor: X [T, in], dY [T, out] or W [out, in]; each operand's slot gives the axis its blocks run along and
            whether the GEMM takes the transpose (dY^T, W^T).
        operands: the operands this pass needs, in order. The copy along the features and the copy along tokens
            of X or dY come from one read of the tensor (:func:`~ue5m3.numerics.quantize.quantize_both_axes`, one
            kernel on the Triton backend) when both are 1D and the token copy is not Hadamard-transformed; any
            other operand is quantized on its own, an RHT copy after the transform along tokens.
        scheme: the block scheme (each spec sets its target).
        backend: who computes the quantizations (the same bits on every backend).
        checks: where the finiteness checks are deferred (None: raised now).

    Returns:
        One quantized tensor per operand, in order.
    """
    if len(operands) == 2 and _pairable(*operands):
        along_features, along_tokens = operands
        return quantize_both_axes(
            tensor,
            scheme,
            along_features.settings(),
            along_tokens.settings(),
            transposed=_SLOTS[along_tokens.spec.operand][2],
            backend=backend,
            checks=checks,
        )
    return tuple(_quantize_one(tensor, operand, scheme, backend, checks) for operand in operands)


def _pairable(along_features: OperandCall, along_tokens: OperandCall) -> bool:
    """Whether one tensor's two quantizations can come from one read: the first along the last axis, the second
    along tokens, both 1D, and the token copy not Hadamard-transformed (it has its own input and current amax)."""
    first, second = _SLOTS[along_features.spec.operand], _SLOTS[along_tokens.spec.operand]
    layouts = first[1:] == (-1, False) and second[1] == 0
    return layouts and not (along_features.spec.two_d or along_tokens.spec.two_d or along_tokens.spec.rht)


def _quantize_one(
    tensor: torch.Tensor, operand: OperandCall, scheme: BlockScheme, backend: Backend, checks: DeferredChecks | None
) -> QuantizedTensor:
    spec, settings = operand.spec, operand.settings()
    _, axis, transposed = _SLOTS[spec.operand]
    if spec.rht:  # only wgrad copies (recipes check it), so along tokens: RHT of [features, T], in BF16 as TE does
        tensor = hadamard.rht(tensor.t(), out_dtype=torch.bfloat16).to(torch.float32).t()  # back to [T, features]
    if transposed:  # the same blocks, laid out as the GEMM reads them: [T, out] -> [out, T], [out, in] -> [in, out]
        tensor, axis = tensor.t(), 0 if axis == -1 else -1
    return quantize(
        tensor,
        scheme,
        tensor_amax=settings.tensor_amax,
        target=settings.target,
        rounding=settings.rounding,
        two_d=spec.two_d,
        axis=axis,
        name=operand.name,
        backend=backend,
        stream=settings.stream,
        index=settings.index,
        checks=checks,
    )


def run_gemm(
    a_q: QuantizedTensor,
    b_q: QuantizedTensor,
    config: GemmConfig,
    *,
    backend: Backend = Backend.AUTO,
    prepared_b: object | None = None,
) -> torch.Tensor:
    """A @ B under the configured output model (FP32 result); ``prepared_b``: B's prepared operand, if held."""
    return gemm.matmul(
        a_q,
        b_q,
        config.model.value,
        slice_width=config.slice_width,
        cross_slice_rounding=config.cross_slice_rounding,
        final_grid=config.final_grid,
        backend=backend,
        prepared_b=prepared_b,
    )


def _quantize(
    call: LinearCall, tensor: torch.Tensor, operands: Sequence[Operand], reference: torch.Tensor | None
) -> tuple[QuantizedTensor, ...]:
    """``tensor`` quantized for the slots ``operands``, which share ``reference``."""
    policy = call.policy
    calls = [call.operand(operand, reference) for operand in operands]
    quantized = quantize_operands(tensor, *calls, scheme=policy.scheme, backend=policy.backend, checks=call.checks)
    if call.sample is not None:
        for operand_call, q in zip(calls, quantized, strict=True):
            _observe(call.sample, tensor, operand_call, q)
    return quantized


def _observe(sample: telemetry.TelemetrySample, tensor: torch.Tensor, call: OperandCall, q: QuantizedTensor) -> None:
    """Record ``q``'s scale telemetry, with ``tensor`` as its quantizer received it (transposed for dY^T and W^T;
    Hadamard-transformed again for an RHT copy: a sampled step pays for it, the others do not)."""
    spec = call.spec
    if spec.role is OperandRole.WEIGHT:  # once per slot and step, however often the cache misses
        if spec.operand in sample.weights_seen:
            return
        sample.weights_seen.add(spec.operand)
    if spec.rht:  # as _quantize_one transforms it: along tokens, in BF16
        tensor = hadamard.rht(tensor.t(), out_dtype=torch.bfloat16).to(torch.float32).t()
    source = tensor.t() if _SLOTS[spec.operand][2] else tensor
    stochastic = Rounding(call.settings().rounding).random_bit_count > 0
    held = call.reference is not None and sample.held(spec.role)
    telemetry.observe(sample, spec.operand, q, source, stochastic=stochastic, held=held)


def _weight(call: LinearCall, operand: Operand, weight: torch.Tensor) -> tuple[QuantizedTensor, object | None]:
    """The weight quantized for ``operand`` (W^T along in, or W along out) and its prepared GEMM operand, from the
    layer's cache when its rounding is deterministic (the same bits: the weight and its held reference do not change
    within an epoch); the prepared operand is None where nothing holds one (the GEMM then prepares B itself)."""

    def make() -> QuantizedTensor:
        return _quantize(call, weight, (operand,), call.weight_reference)[0]

    def prepare(q: QuantizedTensor) -> object | None:
        config = call.policy.gemm
        return gemm.prepare_operand(q, config.model.value, slice_width=config.slice_width, backend=call.policy.backend)

    if Rounding(call.policy.operands[operand].rounding).random_bit_count:
        return make(), None
    return call.weights.get(operand, weight, call.weight_epoch, make, prepare, kernel=pack_kernel(call.policy.backend))


def pack_kernel(backend: Backend) -> bool | None:
    """How a backend packs the FP4 linear's saved and cached quantizations (``QuantizedTensor.pack(kernel=...)``):
    'triton' with the Triton kernel, 'torch' and 'cpu_kernel' with torch ops, 'auto' by the device."""
    return {Backend.TRITON: True, Backend.AUTO: None}.get(Backend(backend), False)


def _gemm(
    call: LinearCall,
    a: tuple[Operand, QuantizedTensor],
    b: tuple[Operand, QuantizedTensor],
    prepared_b: object | None = None,
) -> torch.Tensor:
    """A @ B (FP32), its two operands counted into the layer's accumulator."""
    for operand, q in (a, b):
        telemetry.count(call.counts, operand, q)
    return run_gemm(a[1], b[1], call.policy.gemm, backend=call.policy.backend, prepared_b=prepared_b)


class FP4Matmul(torch.autograd.Function):
    """Y = X W^T with FP4 operands: ``FP4Matmul.apply(x [T, in] FP32, weight [out, in], call: LinearCall)``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, call: LinearCall) -> torch.Tensor:
        # X along in for fprop and, if wgrad will run, along tokens for it (the same reference), quantized now so
        # that the backward holds the packed copy instead of X
        wgrad = ctx.needs_input_grad[1] and call.backward
        slots = (Operand.FPROP_ACTIVATION, Operand.WGRAD_ACTIVATION) if wgrad else (Operand.FPROP_ACTIVATION,)
        x_q, *wgrad_x = _quantize(call, x, slots, call.activation_reference)
        # W^T [in, out] along in (2D tiles: W^T's tiles are W's, transposed)
        wt_q, wt_prepared = _weight(call, Operand.FPROP_WEIGHT, weight)
        # fprop: [T, in] @ [in, out] -> Y [T, out] FP32
        y = _gemm(call, (Operand.FPROP_ACTIVATION, x_q), (Operand.FPROP_WEIGHT, wt_q), wt_prepared)
        packed = wgrad_x[0].pack(kernel=pack_kernel(call.policy.backend)) if wgrad_x else None
        # autograd holds the packed tensors (save_for_backward: dropped and recomputed under activation
        # checkpointing); ctx keeps only their layout, so nothing else keeps them alive
        ctx.save_for_backward(weight, *(packed.tensors() if packed is not None else ()))
        ctx.wgrad_x = packed.with_tensors((None,) * len(packed.tensors())) if packed is not None else None
        ctx.x_dtype, ctx.call = x.dtype, call
        return y

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):
        weight, *saved = ctx.saved_tensors
        call: LinearCall = ctx.call
        dgrad, wgrad = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dy = grad_y.to(torch.float32)  # [T, out]
        # one dY reference for both backward GEMMs; X and W reuse their forward references
        ref_dy = call.upstream_reference(dy, call.checks) if call.upstream_reference is not None else None
        slots = [
            slot
            for slot, needed in ((Operand.DGRAD_UPSTREAM_GRADIENT, dgrad), (Operand.WGRAD_UPSTREAM_GRADIENT, wgrad))
            if needed
        ]
        dy_q = dict(zip(slots, _quantize(call, dy, slots, ref_dy), strict=True))  # dY [T, out], dY^T [out, T]
        grad_x = grad_w = None
        if dgrad:
            # ----- dgrad: dX [T, in] = dY [T, out] @ W [out, in], both along out
            # W in the same 2D tiles as the forward pass
            w_q, w_prepared = _weight(call, Operand.DGRAD_WEIGHT, weight)
            dgrad_dy = (Operand.DGRAD_UPSTREAM_GRADIENT, dy_q[Operand.DGRAD_UPSTREAM_GRADIENT])
            grad_x = _gemm(call, dgrad_dy, (Operand.DGRAD_WEIGHT, w_q), w_prepared).to(ctx.x_dtype)
        if wgrad:
            # ----- wgrad: dW [out, in] = dY^T [out, T] @ X [T, in], both along tokens
            # dY^T RHT'd with its current amax if configured; X: the packed copy the forward pass saved
            x_q = ctx.wgrad_x.with_tensors(tuple(saved)).unpack(kernel=pack_kernel(call.policy.backend))
            wgrad_dy = (Operand.WGRAD_UPSTREAM_GRADIENT, dy_q[Operand.WGRAD_UPSTREAM_GRADIENT])
            grad_w = _gemm(call, wgrad_dy, (Operand.WGRAD_ACTIVATION, x_q)).to(weight.dtype)
        return grad_x, grad_w, None
