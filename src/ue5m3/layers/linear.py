"""The FP4 linear layer: Y = X W^T (+ b) with its three GEMMs quantized by operand role (gemm spec section 1).

| GEMM  | A operand                                | B operand                          |
|-------|------------------------------------------|------------------------------------|
| fprop | X [T, in], 1D blocks along in, RNE       | W^T [in, out], 2D tiles, RNE       |
| dgrad | dY [T, out], 1D along out, SR            | W [out, in], the same 2D tiles     |
| wgrad | dY^T [out, T], 1D along tokens, SR       | X [T, in], 1D along tokens, RNE    |

Both backward GEMMs share one dY reference; X and W reuse their forward references in the backward pass, and
the wgrad operands are quantized afresh from the high-precision tensors along the token dimension (never
transposes of the forward copies). With RHT (TE settings), the wgrad operands are RHT(dY^T) and RHT(X^T) along
tokens with their current amax. Every quantizer call goes through :func:`quantize_operand` and every GEMM
through :func:`run_gemm`, so tests can record them.

Memory: the forward pass quantizes the wgrad copy of X along tokens right away and saves only its packed form
(:class:`~ue5m3.numerics.quantize.PackedQuantized`, about 0.8 bytes per element for 16-element blocks) instead of an
FP32 copy of X (4 bytes); the weight's two quantizations are computed once per optimizer step and reused by every
microbatch (:class:`WeightCaching`). Both only move or reuse a computation, so the bits are the same.

:class:`QuantLinear` only flattens the input, calls :class:`FP4Matmul`, reshapes and adds the bias in FP32.
:func:`convert` swaps selected exact ``nn.Linear`` modules for it, sharing the same Parameter objects.
"""

from __future__ import annotations

import enum
import fnmatch
import re
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ue5m3.layers.recipes import GemmConfig, GemmModel, Operand, OperandSpec, Recipe
from ue5m3.numerics import gemm, hadamard
from ue5m3.numerics.backend import Backend
from ue5m3.numerics.checks import DeferredChecks
from ue5m3.numerics.formats import Rounding
from ue5m3.numerics.philox import ElementIndex, RandomStream, SRState
from ue5m3.numerics.quantize import (
    AxisQuantization,
    BlockScheme,
    PackedQuantized,
    QuantizedTensor,
    get_scheme,
    quantize,
    quantize_both_axes,
)
from ue5m3.numerics.scaling import OperandRole, ScaleState

__all__ = [
    "LinearPolicy",
    "FP4Matmul",
    "QuantLinear",
    "ConversionRecord",
    "convert",
    "find_scale_state",
    "find_quant_stats",
    "find_sr_state",
    "QuantStats",
    "WeightCaching",
    "WeightCache",
    "set_weight_caching",
    "layer_index",
    "quantize_operand",
    "quantize_operand_pair",
    "OperandCall",
    "run_gemm",
]


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


@dataclass(frozen=True)
class OperandCall:
    """One operand quantization of a linear: its spec, tensor reference and name, whether stochastic rounding is on
    (off in inference), and the Philox stream and global element index of its bits."""

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


def quantize_operand(
    tensor: torch.Tensor,
    spec: OperandSpec,
    scheme: BlockScheme,
    *,
    axis: int,
    reference: torch.Tensor | None,
    name: str,
    stochastic: bool = True,
    backend: Backend = Backend.AUTO,
    stream: RandomStream | None = None,
    index: ElementIndex | None = None,
    checks: DeferredChecks | None = None,
) -> QuantizedTensor:
    """Quantize one GEMM operand as its spec says (the single place every single operand passes through; pairs
    go through :func:`quantize_operand_pair`); stochastic rounding draws the Philox bits of ``stream`` at the
    global indices ``index`` places the operand at."""
    settings = OperandCall(spec, reference, name, stochastic, stream, index).settings()
    return quantize(
        tensor,
        scheme,
        tensor_amax=settings.tensor_amax,
        target=settings.target,
        rounding=settings.rounding,
        two_d=spec.two_d,
        axis=axis,
        name=name,
        backend=backend,
        stream=settings.stream,
        index=settings.index,
        checks=checks,
    )


def quantize_operand_pair(
    tensor: torch.Tensor,
    scheme: BlockScheme,
    last: OperandCall,
    first: OperandCall,
    *,
    transposed: bool,
    backend: Backend = Backend.AUTO,
    checks: DeferredChecks | None = None,
) -> tuple[QuantizedTensor, QuantizedTensor]:
    """The two 1D quantizations of one 2-D tensor that a linear needs along both of its axes (X: fprop along
    ``in`` and wgrad along tokens; dY: dgrad along ``out`` and wgrad along tokens, ``transposed``), from one read
    of the tensor on the Triton backend (:func:`~ue5m3.numerics.quantize.quantize_both_axes`); the same bits as
    two :func:`quantize_operand` calls."""
    return quantize_both_axes(
        tensor, scheme, last.settings(), first.settings(), transposed=transposed, backend=backend, checks=checks
    )


def run_gemm(
    a_q: QuantizedTensor, b_q: QuantizedTensor, config: GemmConfig, *, backend: Backend = Backend.AUTO
) -> torch.Tensor:
    """A @ B under the configured output model (FP32 result)."""
    return gemm.matmul(
        a_q,
        b_q,
        config.model.value,
        slice_width=config.slice_width,
        cross_slice_rounding=config.cross_slice_rounding,
        final_grid=config.final_grid,
        backend=backend,
    )


def _wgrad_operand(t_by_tokens: torch.Tensor, spec: OperandSpec) -> tuple[torch.Tensor, bool]:
    """[features, T] wgrad operand, RHT-transformed along tokens when the spec asks (then current amax)."""
    if not spec.rht:
        return t_by_tokens, False
    return hadamard.rht(t_by_tokens, out_dtype=torch.bfloat16).to(torch.float32), True


class QuantStats:
    """Running totals of block-scale diagnostics over every operand a model quantized (reset by the reader), and the
    training hot path's deferred finiteness checks.

    Counts blocks whose scale rounded to zero before repair, blocks whose ideal scale saturated the scale format
    and nonzero blocks that quantized to all zeros (underflowed); kept as tensors on the operands' device, so
    reading them (:meth:`pop`) is the only synchronisation.
    """

    def __init__(self) -> None:
        self.checks = DeferredChecks()
        self.reset()

    def reset(self) -> None:
        self.zero_rounded = torch.zeros((), dtype=torch.int64)
        self.saturated = torch.zeros((), dtype=torch.int64)
        self.underflowed = torch.zeros((), dtype=torch.int64)
        self.blocks = 0

    def add(self, q: QuantizedTensor) -> QuantizedTensor:
        # a 0-dim CPU start meets device counts as a scalar: the totals move to the device, nothing syncs
        self.zero_rounded = self.zero_rounded + q.zero_rounded_blocks
        self.saturated = self.saturated + q.saturated_blocks
        self.underflowed = self.underflowed + q.underflowed_blocks
        self.blocks += q.scale_values.numel()
        return q

    def pop(self) -> dict[str, int]:
        """The totals since the last pop, as ints; resets the counters (raises first if a deferred check failed)."""
        self.checks.raise_if_any()
        out = {
            "zero_rounded_blocks": int(self.zero_rounded),
            "saturated_blocks": int(self.saturated),
            "underflowed_blocks": int(self.underflowed),
            "quantized_blocks": self.blocks,
        }
        self.reset()
        return out


class WeightCaching(enum.StrEnum):
    """When a layer's weight quantizations may be reused instead of recomputed.

    * ``version`` (default): while the weight is the same tensor, unmodified (autograd's version counter and
      storage pointer) and the scale step is the same: safe for any use, and every microbatch of an optimizer step
      hits in one process.
    * ``step``: for the whole scale step, whatever happens to the tensor object: for FSDP2, whose all-gathers
      rewrite the unsharded weight for every microbatch although its values change only at the optimizer step.
      The trainer's contract; a packed copy of every weight then stays resident for the step.
    * ``off``: quantize the weight at every use (nothing held between passes).
    """

    VERSION = "version"
    STEP = "step"
    OFF = "off"


class WeightCache:
    """The packed weight quantizations of one :class:`QuantLinear` (fprop W^T and dgrad W), kept while their key
    holds. Only deterministic roundings are cached (stochastic ones draw per microbatch)."""

    def __init__(self, mode: WeightCaching | str = WeightCaching.VERSION) -> None:
        self.mode = WeightCaching(mode)
        self._entries: dict[Operand, tuple[weakref.ref, tuple, PackedQuantized]] = {}
        self.hits = 0
        self.misses = 0

    def get(
        self, operand: Operand, weight: torch.Tensor, step: int | None, make: Callable[[], QuantizedTensor]
    ) -> QuantizedTensor:
        if self.mode is WeightCaching.OFF:
            return make()
        # host metadata only: the version counter and storage pointer catch in-place updates and `.data` swaps
        key = (step,) if self.mode is WeightCaching.STEP else (step, weight._version, weight.data_ptr())
        entry = self._entries.get(operand)
        if entry is not None and entry[1] == key and (self.mode is WeightCaching.STEP or entry[0]() is weight):
            self.hits += 1
            return entry[2].unpack()
        self.misses += 1
        q = make()
        self._entries[operand] = (weakref.ref(weight), key, q.pack())
        return q

    @property
    def nbytes(self) -> int:
        """Bytes the held packed quantizations take."""
        return sum(entry[2].nbytes for entry in self._entries.values())

    def clear(self) -> None:
        self._entries.clear()


class FP4Matmul(torch.autograd.Function):
    """Y = X W^T with FP4 operands; backward computes dgrad and wgrad with their own quantizations."""

    @staticmethod
    def forward(
        ctx,
        x: torch.Tensor,
        weight: torch.Tensor,
        policy: LinearPolicy,
        state: ScaleState | None,
        stats: QuantStats,
        stochastic: bool,
        sr: SRState | None,
        weights: WeightCache | None = None,
    ) -> torch.Tensor:
        ops, name, scheme = policy.operands, policy.module, policy.scheme
        weights = weights if weights is not None else WeightCache(WeightCaching.OFF)
        step = state.weight_epoch if state is not None else None
        if not scheme.uses_tensor_amax:  # MX scales read only their block: no references to take or hold
            state = None
        # finiteness checks are deferred to one read per optimizer step (training) or work unit (evaluation)
        checks = stats.checks
        ref_x = state.reference(OperandRole.ACTIVATION, name, x, checks) if state is not None else None
        ref_w = state.reference(OperandRole.WEIGHT, name, weight, checks) if state is not None else None
        fprop_x = OperandCall(ops[Operand.FPROP_ACTIVATION], ref_x, f"{name}.fprop.x")
        wgrad_spec = ops[Operand.WGRAD_ACTIVATION]
        wgrad_xq = None
        if ctx.needs_input_grad[1] and _pairable(fprop_x.spec, wgrad_spec):
            # X along in (fprop) and along tokens (wgrad, same reference) from one read of X
            x_q, wgrad_xq = quantize_operand_pair(
                x,
                scheme,
                fprop_x,
                OperandCall(wgrad_spec, ref_x, f"{name}.wgrad.x"),
                transposed=False,
                backend=policy.backend,
                checks=checks,
            )
        else:
            # fprop: A = X [T, in] along in
            x_q = quantize_operand(
                x,
                fprop_x.spec,
                scheme,
                axis=-1,
                reference=ref_x,
                name=fprop_x.name,
                backend=policy.backend,
                checks=checks,
            )
        # fprop: B = W^T [in, out] along in (2D tiles: W^T's tiles are W's, transposed)
        wt_q = _weight_operand(
            weights, Operand.FPROP_WEIGHT, weight, step, policy, ref_w, checks, transpose=True, name=f"{name}.fprop.w"
        )
        stats.add(x_q), stats.add(wt_q)
        y = run_gemm(x_q, wt_q, policy.gemm, backend=policy.backend)  # [T, out] FP32
        saved: tuple[torch.Tensor, ...] = ()
        ctx.wgrad_x = None
        if ctx.needs_input_grad[1]:
            # wgrad: B = X [T, in] along tokens, from the high-precision X (RHT'd along tokens if configured),
            # quantized now so that the backward holds its packed form instead of X
            if wgrad_xq is None:
                xt, xt_current = _wgrad_operand(x.t(), wgrad_spec)
                wgrad_xq = quantize_operand(
                    xt.t(),
                    wgrad_spec,
                    scheme,
                    axis=0,
                    reference=None if xt_current else ref_x,
                    name=f"{name}.wgrad.x",
                    checks=checks,
                    backend=policy.backend,
                )
            wgrad_x = wgrad_xq.pack()
            ctx.wgrad_x, saved = wgrad_x, wgrad_x.tensors()
        ctx.save_for_backward(weight, *saved)
        ctx.x_dtype = x.dtype
        ctx.policy, ctx.state, ctx.stats, ctx.ref_w, ctx.stochastic = policy, state, stats, ref_w, stochastic
        ctx.sr, ctx.weights, ctx.step = sr, weights, step
        return y

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):
        weight, *saved = ctx.saved_tensors
        policy, state, ref_w = ctx.policy, ctx.state, ctx.ref_w
        ops, name, scheme, sr = policy.operands, policy.module, policy.scheme, ctx.sr
        checks = ctx.stats.checks
        dy = grad_y.to(torch.float32)

        def bits(operand: Operand, shape: tuple[int, ...], token_axis: int) -> dict:
            """This call site's Philox stream and the operand's place in the global microbatch (none without an
            SRState: the quantizer then seeds a fresh stream from torch's generator)."""
            if sr is None:
                return {}
            return {"stream": sr.stream(name, operand.value), "index": sr.token_index(shape, token_axis)}

        # One dY reference shared by both backward GEMMs.
        ref_dy = state.reference(OperandRole.UPSTREAM_GRADIENT, name, dy, checks) if state is not None else None
        grad_x = grad_w = None
        dgrad_dy = OperandCall(
            ops[Operand.DGRAD_UPSTREAM_GRADIENT],
            ref_dy,
            f"{name}.dgrad.dy",
            ctx.stochastic,
            **bits(Operand.DGRAD_UPSTREAM_GRADIENT, tuple(dy.shape), 0),
        )
        wgrad_spec = ops[Operand.WGRAD_UPSTREAM_GRADIENT]
        dy_q = dyt_q = None
        if ctx.needs_input_grad[0] and ctx.needs_input_grad[1] and _pairable(dgrad_dy.spec, wgrad_spec):
            # dY along out (dgrad) and along tokens (wgrad, written as dY^T) from one read of dY
            wgrad_dy = OperandCall(
                wgrad_spec,
                ref_dy,
                f"{name}.wgrad.dyt",
                ctx.stochastic,
                **bits(Operand.WGRAD_UPSTREAM_GRADIENT, (dy.shape[1], dy.shape[0]), 1),
            )
            dy_q, dyt_q = quantize_operand_pair(
                dy, scheme, dgrad_dy, wgrad_dy, transposed=True, backend=policy.backend, checks=checks
            )
        if ctx.needs_input_grad[0]:
            # dgrad: A = dY [T, out] along out; B = W [out, in] along out (the same 2D tiles as the forward pass)
            if dy_q is None:
                dy_q = quantize_operand(
                    dy,
                    dgrad_dy.spec,
                    scheme,
                    axis=-1,
                    reference=ref_dy,
                    name=dgrad_dy.name,
                    checks=checks,
                    stochastic=ctx.stochastic,
                    backend=policy.backend,
                    **bits(Operand.DGRAD_UPSTREAM_GRADIENT, tuple(dy.shape), 0),
                )
            w_q = _weight_operand(
                ctx.weights,
                Operand.DGRAD_WEIGHT,
                weight,
                ctx.step,
                policy,
                ref_w,
                checks,
                transpose=False,
                name=f"{name}.dgrad.w",
            )
            ctx.stats.add(dy_q), ctx.stats.add(w_q)
            grad_x = run_gemm(dy_q, w_q, policy.gemm, backend=policy.backend).to(ctx.x_dtype)  # [T, out] @ [out, in]
        if ctx.needs_input_grad[1]:
            # wgrad: A = dY^T [out, T] along tokens (RHT'd with current amax if configured); B = the saved X copy
            if dyt_q is None:
                dyt, dyt_current = _wgrad_operand(dy.t(), wgrad_spec)
                dyt_q = quantize_operand(
                    dyt,
                    wgrad_spec,
                    scheme,
                    axis=-1,
                    reference=None if dyt_current else ref_dy,
                    name=f"{name}.wgrad.dyt",
                    checks=checks,
                    stochastic=ctx.stochastic,
                    backend=policy.backend,
                    **bits(Operand.WGRAD_UPSTREAM_GRADIENT, tuple(dyt.shape), 1),
                )
            x_q = ctx.wgrad_x.with_tensors(tuple(saved)).unpack()
            ctx.stats.add(dyt_q), ctx.stats.add(x_q)
            grad_w = run_gemm(dyt_q, x_q, policy.gemm, backend=policy.backend).to(weight.dtype)  # [out, T] @ [T, in]
        return grad_x, grad_w, None, None, None, None, None, None


def _pairable(along_features: OperandSpec, along_tokens: OperandSpec) -> bool:
    """Whether one tensor's two quantizations can come from one read: both 1D, and the token-axis copy not
    Hadamard-transformed (an RHT copy has its own input and current amax)."""
    return not (along_features.two_d or along_tokens.two_d or along_tokens.rht)


def _weight_operand(
    weights: WeightCache,
    operand: Operand,
    weight: torch.Tensor,
    step: int | None,
    policy: LinearPolicy,
    reference: torch.Tensor | None,
    checks: DeferredChecks,
    *,
    transpose: bool,
    name: str,
) -> QuantizedTensor:
    """The weight quantized for ``operand``: W^T along in (fprop) or W along out (dgrad), from the cache when its
    rounding is deterministic (the same bits: the weight and its held reference do not change within a step)."""
    spec = policy.operands[operand]

    def make() -> QuantizedTensor:
        return quantize_operand(
            weight.t() if transpose else weight,
            spec,
            policy.scheme,
            axis=0,
            reference=reference,
            name=name,
            backend=policy.backend,
            checks=checks,
        )

    if Rounding(spec.rounding).random_bit_count:
        return make()
    return weights.get(operand, weight, step, make)


class QuantLinear(nn.Module):
    """An ``nn.Linear`` whose GEMMs run in FP4 under a :class:`LinearPolicy`.

    Shares its Parameters with the module it replaces. ``inference=True`` (see :meth:`set_inference`) runs the
    forward GEMM only, without stochastic rounding.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        policy: LinearPolicy,
        scale_state: ScaleState | None,
        stats: QuantStats | None = None,
        *,
        sr_state: SRState | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device))
        self.bias: nn.Parameter | None = None
        self.policy = policy
        self.scale_state = scale_state
        self.stats = stats if stats is not None else QuantStats()
        self.sr_state = sr_state
        self.inference = False
        self.weight_cache = WeightCache()

    @classmethod
    def from_float(
        cls,
        linear: nn.Linear,
        policy: LinearPolicy,
        scale_state: ScaleState | None,
        stats: QuantStats | None = None,
        sr_state: SRState | None = None,
    ) -> QuantLinear:
        """Build a shell on the meta device and attach the original Parameter objects."""
        module = cls(
            linear.in_features, linear.out_features, policy, scale_state, stats, sr_state=sr_state, device="meta"
        )
        module.weight = linear.weight
        module.bias = linear.bias
        return module

    def set_inference(self, inference: bool = True) -> QuantLinear:
        self.inference = inference
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (..., in) -> (T, in)
        x2d = x.reshape(-1, self.in_features)
        y = FP4Matmul.apply(
            x2d.to(torch.float32),
            self.weight,
            self.policy,
            self.scale_state,
            self.stats,
            not self.inference,
            self.sr_state,
            self.weight_cache,
        )
        if self.bias is not None:
            y = y + self.bias.to(torch.float32)
        # (T, out) -> (..., out), in the input's dtype (BF16 activations on the GPU path)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"scheme={self.policy.scheme.name}, gemm={self.policy.gemm.model.value}"
        )


# ----- conversion ---------------------------------------------------------------------------------------

_LAYER_PATTERN = re.compile(r"(?:^|\.)(?:layers|blocks|h)\.(\d+)(?:\.|$)")


def layer_index(name: str) -> int | None:
    """The block index in a module name like ``backbone.layers.12.mixer.down_proj`` (None outside blocks)."""
    match = _LAYER_PATTERN.search(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class ConversionRecord:
    """What :func:`convert` decided for one selected module (goes into a run's metadata)."""

    name: str
    layer: int | None
    in_features: int
    out_features: int
    status: str  # "converted" | "bf16_exempt" | "already_converted"
    scheme: str | None
    gemm: str | None


Selector = Callable[[str, nn.Module], bool] | Sequence[str]


def _selected(select: Selector, name: str, module: nn.Module) -> bool:
    if callable(select):
        return bool(select(name, module))
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in select)


def convert(
    model: nn.Module,
    recipe: Recipe,
    *,
    select: Selector,
    scale_state: ScaleState | None = None,
    sr_state: SRState | None = None,
    backend: Backend | str = Backend.AUTO,
) -> tuple[ConversionRecord, ...]:
    """Swap the selected exact ``nn.Linear`` modules of ``model`` for :class:`QuantLinear` under ``recipe``.

    Args:
        model: any torch model.
        recipe: the numerics recipe (a BF16 recipe converts nothing and records every selection as exempt), with
            absolute layer indices: a recipe naming layers relative to the depth is resolved for the model first
            (:meth:`Recipe.for_model`).
        select: fnmatch patterns on module names, or a callable ``(name, module) -> bool``; required so that
            nobody silently decides whether, say, the output head is quantized.
        scale_state: the shared tensor-reference state; a new ``ScaleState(recipe.interval)`` by default (or the
            one already attached to converted modules).
        sr_state: the run's stochastic-rounding counters (seed, step, microbatch, data-parallel shard), shared by
            every converted layer; None keeps one already attached, else each stochastic quantization seeds a fresh
            Philox stream from torch's generator.
        backend: who computes the converted layers' quantizations and GEMMs (results do not depend on it).

    Returns:
        One record per selected module, in module order.

    Raises:
        TypeError: a selected module is a subclass of ``nn.Linear`` (its forward may differ) or not a linear.
        ValueError: a selected module is reachable under two names (aliased), or a depth-relative recipe meets
            numbered layers; nothing is changed then.
    """
    if select is None or (not callable(select) and isinstance(select, str)):
        raise TypeError("select must be a sequence of name patterns or a callable (name, module) -> bool")
    seen: dict[int, str] = {}
    chosen: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules(remove_duplicate=False):
        if not name or not _selected(select, name, module):
            continue
        if id(module) in seen:
            raise ValueError(f"module {name!r} is the same object as {seen[id(module)]!r}; refusing aliased modules")
        seen[id(module)] = name
        if not isinstance(module, QuantLinear) and type(module) is not nn.Linear:
            raise TypeError(f"selected module {name!r} is a {type(module).__name__}, not an exact nn.Linear")
        chosen.append((name, module))
    if recipe.is_relative and any(layer_index(name) is not None for name, _ in chosen):
        raise ValueError(
            f"recipe {recipe.name!r} names layers relative to the model's depth (bf16_layers or target_overrides); "
            "resolve it for this model first (Recipe.for_model, or TrainConfig.resolved_recipe for a run)"
        )
    # every decision is made before anything changes
    state = scale_state or find_scale_state(model)
    if state is None and recipe.gemm.model is not GemmModel.BF16:
        state = ScaleState(recipe.interval)
    stats = find_quant_stats(model) or QuantStats()
    sr_state = sr_state or find_sr_state(model)
    records = []
    for name, module in chosen:
        layer = layer_index(name)
        status = (
            "already_converted"
            if isinstance(module, QuantLinear)
            else "bf16_exempt"
            if recipe.gemm.model is GemmModel.BF16 or recipe.is_bf16_layer(layer)
            else "converted"
        )
        scheme = (
            None
            if status == "bf16_exempt"
            else (module.policy.scheme.name if isinstance(module, QuantLinear) else recipe.scheme)
        )
        gemm_name = None if status == "bf16_exempt" else recipe.gemm.model.value
        records.append(
            ConversionRecord(name, layer, module.in_features, module.out_features, status, scheme, gemm_name)
        )
        if status == "converted":
            policy = LinearPolicy(
                module=name,
                scheme=get_scheme(recipe.scheme),
                operands=recipe.operand_specs(name, layer),
                gemm=recipe.gemm,
                backend=Backend(backend),
            )
            _set_submodule(model, name, QuantLinear.from_float(module, policy, state, stats, sr_state))
    return tuple(records)


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


def find_scale_state(model: nn.Module) -> ScaleState | None:
    """The ScaleState shared by the model's QuantLinear modules (None if none are converted)."""
    states = {id(m.scale_state): m.scale_state for m in model.modules() if isinstance(m, QuantLinear)}
    if len(states) > 1:
        raise ValueError("the model's FP4 linears use different scale states; convert with one shared state")
    return next(iter(states.values()), None)


def find_quant_stats(model: nn.Module) -> QuantStats | None:
    """The QuantStats shared by the model's QuantLinear modules (None if none are converted)."""
    found = {id(m.stats): m.stats for m in model.modules() if isinstance(m, QuantLinear)}
    return next(iter(found.values()), None)


def find_sr_state(model: nn.Module) -> SRState | None:
    """The SRState shared by the model's QuantLinear modules (None if none is attached)."""
    found = {id(m.sr_state): m.sr_state for m in model.modules() if isinstance(m, QuantLinear) and m.sr_state}
    if len(found) > 1:
        raise ValueError("the model's FP4 linears use different SR states; convert with one shared state")
    return next(iter(found.values()), None)


def set_weight_caching(model: nn.Module, mode: WeightCaching | str) -> None:
    """Set how every FP4 linear of ``model`` reuses its weight quantizations (held copies are dropped)."""
    for module in model.modules():
        if isinstance(module, QuantLinear):
            module.weight_cache = WeightCache(mode)
