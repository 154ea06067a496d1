"""The FP4 linear layer: Y = X W^T (+ b) with its three GEMMs quantized by operand role (gemm spec section 1).

| GEMM  | A operand                                | B operand                          |
|-------|------------------------------------------|------------------------------------|
| fprop | X [T, in], 1D blocks along in, RNE       | W^T [in, out], 2D tiles, RNE       |
| dgrad | dY [T, out], 1D along out, SR            | W [out, in], the same 2D tiles     |
| wgrad | dY^T [out, T], 1D along tokens, SR       | X [T, in], 1D along tokens, RNE    |

Both backward GEMMs share one dY reference; X and W reuse their forward references in the backward pass, and
the wgrad operands are quantized afresh from the high-precision tensors along the token dimension (never
transposes of the forward copies). With RHT (TE settings), the wgrad operands are RHT(dY^T) and RHT(X^T) along
tokens with their current amax. The GEMMs run in :class:`~ue5m3.layers.matmul.FP4Matmul`, where every quantizer
call goes through :func:`~ue5m3.layers.matmul.quantize_operands` and every GEMM through
:func:`~ue5m3.layers.matmul.run_gemm`, so tests can record them.

Memory: the forward pass quantizes the wgrad copy of X along tokens right away and saves only its packed form
(:class:`~ue5m3.numerics.quantize.PackedQuantized`, about 0.8 bytes per element for 16-element blocks) instead of an
FP32 copy of X (4 bytes); the weight's two quantizations are computed once per optimizer step and reused by every
microbatch (:class:`~ue5m3.layers.weight_cache.WeightCaching`). Both only move or reuse a computation, so the bits
are the same.

:class:`QuantLinear` resolves the call (:meth:`QuantLinear.resolve_call`: references, SR streams, caches and
diagnostics as one frozen :class:`~ue5m3.layers.matmul.LinearCall`), calls the Function, reshapes and adds the
bias in FP32. Its diagnostics stay on the device (:mod:`ue5m3.layers.telemetry`); :func:`find_quant_stats` reads
a model's. :func:`convert` swaps selected exact ``nn.Linear`` modules for it, sharing the same Parameter objects.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ue5m3.layers.matmul import FP4Matmul, LinearCall, LinearPolicy
from ue5m3.layers.recipes import GemmModel, Operand, Recipe
from ue5m3.layers.telemetry import LinearTelemetry, OperandChecks, QuantStats, TelemetrySample, is_recomputing
from ue5m3.layers.weight_cache import WeightCache, WeightCaching
from ue5m3.numerics.backend import Backend
from ue5m3.numerics.philox import SRState
from ue5m3.numerics.quantize import get_scheme
from ue5m3.numerics.scaling import OperandRole, ScaleState

__all__ = [
    "LinearPolicy",
    "LinearCall",
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
]

# the stochastic dY slots and their token axis: dgrad dY [T, out], wgrad dY^T [out, T]
_DY_TOKEN_AXES = {Operand.DGRAD_UPSTREAM_GRADIENT: 0, Operand.WGRAD_UPSTREAM_GRADIENT: 1}


class QuantLinear(nn.Module):
    """An ``nn.Linear`` whose GEMMs run in FP4 under a :class:`LinearPolicy`.

    Shares its Parameters with the module it replaces. ``inference=True`` (see :meth:`set_inference`) runs the
    forward GEMM only, without stochastic rounding. ``telemetry`` holds its diagnostics on the device.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        policy: LinearPolicy,
        scale_state: ScaleState | None,
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
        self.sr_state = sr_state
        self.inference = False
        self.weight_cache = WeightCache()
        self.telemetry = LinearTelemetry()

    @classmethod
    def from_float(
        cls, linear: nn.Linear, policy: LinearPolicy, scale_state: ScaleState | None, sr_state: SRState | None = None
    ) -> QuantLinear:
        """Build a shell on the meta device and attach the original Parameter objects."""
        module = cls(linear.in_features, linear.out_features, policy, scale_state, sr_state=sr_state, device="meta")
        module.weight = linear.weight
        module.bias = linear.bias
        return module

    def set_inference(self, inference: bool = True) -> QuantLinear:
        self.inference = inference
        return self

    def resolve_call(self, x: torch.Tensor) -> LinearCall:
        """What :class:`FP4Matmul` needs for one call on ``x`` [T, in] (FP32): X's and then W's reference taken
        now (none for schemes whose scales read only their block), the handle that takes dY's in the backward pass,
        the SR streams and token places of dY's two copies (training only), the weight cache under the scale
        state's weight epoch, and the layer's diagnostics on ``x``'s device.

        A forward pass recomputed under activation checkpointing (:func:`~ue5m3.layers.telemetry.recomputing`)
        resolves the same call: the scale state is inside the same step, so X's and W's references are the held
        ones (nothing refreshes, no collective runs); the SR streams are keyed by the same step and microbatch (and
        the backward pass uses the first forward pass's call anyway); the weight cache holds the same epoch. Only
        its diagnostics go to a scratch accumulator and a throw-away check list, so the step counts each fprop
        operand and each deferred check once (and it samples no scale telemetry)."""
        policy, state = self.policy, self.scale_state
        recompute = is_recomputing()
        checks = OperandChecks() if recompute else self.telemetry.checks
        counts = self.telemetry.scratch_on(x.device) if recompute else self.telemetry.counts_on(x.device)
        epoch = state.weight_epoch if state is not None else None
        if not policy.scheme.uses_tensor_amax:  # MX scales read only their block: no references to take or hold
            state = None
        name = policy.module
        sample = None
        if self.telemetry.sampling and not recompute:  # a step the run logs: its scale telemetry is recorded
            held = functools.partial(_is_held, state, name)
            seen = self.telemetry.weights_seen(epoch)
            sample = TelemetrySample(stats=self.telemetry.stats_on(x.device), held=held, weights_seen=seen)
        # finiteness checks are deferred to one read per optimizer step (training) or work unit (evaluation)
        ref_x = state.reference(OperandRole.ACTIVATION, name, x, checks) if state is not None else None
        ref_w = state.reference(OperandRole.WEIGHT, name, self.weight, checks) if state is not None else None
        sr, bits = self.sr_state, {}
        if sr is not None and not self.inference:
            tokens = x.shape[0]
            for slot, axis in _DY_TOKEN_AXES.items():
                shape = (tokens, self.out_features) if axis == 0 else (self.out_features, tokens)
                bits[slot] = (sr.stream(name, slot.value), sr.token_index(shape, axis))
        return LinearCall(
            policy=policy,
            stochastic=not self.inference,
            activation_reference=ref_x,
            weight_reference=ref_w,
            upstream_reference=(
                functools.partial(state.reference, OperandRole.UPSTREAM_GRADIENT, name) if state is not None else None
            ),
            dy_bits=bits,
            weights=self.weight_cache,
            weight_epoch=epoch,
            counts=counts,
            checks=checks,
            sample=sample,
            backward=torch.is_grad_enabled(),  # evaluation under no_grad makes no wgrad copy of X
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (..., in) -> (T, in), in FP32
        x2d = x.reshape(-1, self.in_features).to(torch.float32)
        y = FP4Matmul.apply(x2d, self.weight, self.resolve_call(x2d))
        if self.bias is not None:
            y = y + self.bias.to(torch.float32)
        # (T, out) -> (..., out), in the input's dtype (BF16 activations on the GPU path)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"scheme={self.policy.scheme.name}, gemm={self.policy.gemm.model.value}"
        )


def _is_held(state: ScaleState | None, module: str, role: OperandRole) -> bool:
    """Whether ``module``'s ``role`` reference in the open step is held (False without references)."""
    return state is not None and state.is_held(role, module)


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
            _set_submodule(model, name, QuantLinear.from_float(module, policy, state, sr_state))
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
    """The reader of the diagnostics of the model's QuantLinear modules (None if none are converted):
    ``pop()`` gives the block counts summed over them since the last pop and the scale telemetry per linear and
    role, ``sample(on)`` turns that telemetry on for the coming calls, ``checks.raise_if_any()`` reads their
    deferred finiteness checks."""
    found = [(m.policy.module, m.telemetry) for m in model.modules() if isinstance(m, QuantLinear)]
    return QuantStats(found) if found else None


def find_sr_state(model: nn.Module) -> SRState | None:
    """The SRState shared by the model's QuantLinear modules (None if none is attached)."""
    found = {id(m.sr_state): m.sr_state for m in model.modules() if isinstance(m, QuantLinear) and m.sr_state}
    if len(found) > 1:
        raise ValueError("the model's FP4 linears use different SR states; convert with one shared state")
    return next(iter(found.values()), None)


def set_weight_caching(model: nn.Module, mode: WeightCaching | str, *, keep_prepared: bool = False) -> None:
    """Set how every FP4 linear of ``model`` reuses its weight quantizations (held copies are dropped);
    ``keep_prepared`` holds their prepared GEMM operands for the step too (opt-in: about 4.1 bytes per weight
    element, :mod:`ue5m3.layers.weight_cache`)."""
    for module in model.modules():
        if isinstance(module, QuantLinear):
            module.weight_cache = WeightCache(mode, keep_prepared=keep_prepared)
