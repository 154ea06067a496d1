"""Native NVFP4 through NVIDIA Transformer Engine (Blackwell only) for the two NVIDIA recipes.

``nvfp4_te`` and ``nvfp4_no_rht_all_linears`` run natively as ``te.Linear`` under ``te.autocast`` with an
``NVFP4BlockScaling`` recipe whose RHT, stochastic-rounding and 2D flags follow the project recipe, and with
TE's split ("2x") accumulation turned off for dgrad and wgrad as in the paper. Everywhere else the same recipes
run emulated through :mod:`ue5m3.layers.linear`. Transformer Engine is imported lazily; without it, without CUDA or
on a GPU below compute capability 10.0 every entry point raises :class:`NativeUnavailable` -- never a silent
fallback to the emulator. Results record which path produced them (:func:`execution_path`).
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Callable, Iterator
from enum import StrEnum
from typing import Any

import torch
from torch import nn

from ue5m3.layers.linear import ConversionRecord, layer_index
from ue5m3.layers.recipes import Recipe
from ue5m3.numerics.formats import Rounding
from ue5m3.numerics.scaling import OperandRole

__all__ = [
    "Execution",
    "NativeUnavailable",
    "require_native",
    "te_recipe",
    "autocast",
    "autocast_with",
    "convert_native",
    "recompute_contexts",
    "execution_path",
]

INSTALL_HINT = (
    "install Transformer Engine in a CUDA environment (pip install --no-build-isolation "
    "'transformer-engine[pytorch]' or use an NVIDIA PyTorch container; see workflow/envs/cuda.yaml), or run the recipe "
    "emulated with ue5m3.layers.linear.convert"
)


class Execution(StrEnum):
    """How a recipe's FP4 GEMMs run: emulated in software (any device), or natively by Transformer Engine."""

    EMULATED = "emulated"  # ue5m3.layers.linear under the recipe's GEMM output model
    NATIVE_TE = "native_te"  # Transformer Engine NVFP4 on Blackwell; fails closed elsewhere


class NativeUnavailable(RuntimeError):
    """Native NVFP4 cannot run here (no Transformer Engine, no CUDA, or not a Blackwell GPU)."""


def require_native() -> Any:
    """Import ``transformer_engine.pytorch`` and check for a Blackwell GPU; returns the module."""
    try:
        import transformer_engine.pytorch as te  # noqa: PLC0415 - optional, GPU-only dependency
    except Exception as err:  # ImportError, or OSError for missing CUDA libraries
        raise NativeUnavailable(f"Transformer Engine is not importable ({err}); {INSTALL_HINT}") from err
    if not torch.cuda.is_available():
        raise NativeUnavailable(f"native NVFP4 needs a CUDA GPU; none is available. {INSTALL_HINT}")
    major, minor = torch.cuda.get_device_capability()
    if major < 10:
        raise NativeUnavailable(
            f"native NVFP4 needs compute capability >= 10.0 (Blackwell); this GPU has {major}.{minor}. "
            f"Run the recipe emulated with ue5m3.layers.linear.convert instead."
        )
    return te


def _check_recipe(recipe: Recipe) -> None:
    if not recipe.native_te:
        raise ValueError(f"recipe {recipe.name!r} has no native Transformer Engine path (native_te is false)")


def te_recipe(recipe: Recipe) -> Any:
    """The ``NVFP4BlockScaling`` recipe matching a project recipe (RHT, SR and 2D flags; split accumulation off)."""
    _check_recipe(recipe)
    require_native()
    from transformer_engine.common import recipe as te_recipes  # noqa: PLC0415

    roles = recipe.roles
    te = te_recipes.NVFP4BlockScaling(
        disable_rht=not (roles[OperandRole.ACTIVATION].rht or roles[OperandRole.UPSTREAM_GRADIENT].rht),
        disable_stochastic_rounding=roles[OperandRole.UPSTREAM_GRADIENT].rounding is Rounding.RNE,
        disable_2d_quantization=not roles[OperandRole.WEIGHT].two_d,
    )
    for gemm in ("fp8_gemm_dgrad", "fp8_gemm_wgrad"):
        if hasattr(te, gemm):  # the paper forced TE's 2x accumulation off for the backward GEMMs
            setattr(te, gemm, te_recipes.MMParams(use_split_accumulator=False))
    return te


def autocast_with(te_recipe_object: Any) -> Any:
    """TE's autocast context for a TE recipe object: ``te.autocast(recipe=...)``, or ``te.fp8_autocast(fp8_recipe=...)``
    on TE versions that predate ``te.autocast``."""
    te = require_native()
    if hasattr(te, "autocast"):
        return te.autocast(enabled=True, recipe=te_recipe_object)
    return te.fp8_autocast(enabled=True, fp8_recipe=te_recipe_object)


def autocast(recipe: Recipe) -> Any:
    """TE's autocast context for the project recipe (see :func:`autocast_with`)."""
    return autocast_with(te_recipe(recipe))


@contextlib.contextmanager
def _both(first: Any, second: Any) -> Iterator[None]:
    with first, second:
        yield


def recompute_contexts(recipe: Recipe) -> Callable[[], tuple[Any, Any]]:
    """The ``context_fn`` of a checkpointed block holding ``te.Linear`` modules, as Transformer Engine 2.16's
    ``te.distributed.checkpoint(..., use_reentrant=False)`` sets its contexts: the first forward pass inside TE's
    activation-recompute forward context, the recomputation inside its recompute-phase context and the run's
    ``te.autocast`` (the backward pass, where the recomputation runs, is outside the forward pass's autocast).
    Torch's checkpoint restores torch's own autocast state itself."""
    _check_recipe(recipe)
    require_native()
    from transformer_engine.pytorch.distributed import get_activation_recompute_contexts  # noqa: PLC0415

    te_recipe_object = te_recipe(recipe)

    def contexts() -> tuple[Any, Any]:
        forward, recompute = get_activation_recompute_contexts()
        return forward, _both(recompute, autocast_with(te_recipe_object))

    return contexts


def convert_native(model: nn.Module, recipe: Recipe, *, select: list[str]) -> tuple[ConversionRecord, ...]:
    """Replace selected exact ``nn.Linear`` modules by ``te.Linear`` (weights copied), honouring BF16 layers.

    ``recipe`` names its BF16 layers by absolute index (resolved for the model with :meth:`Recipe.for_model`).
    """
    _check_recipe(recipe)
    te = require_native()
    selected = [name for name, _ in model.named_modules() if name and any(fnmatch.fnmatchcase(name, p) for p in select)]
    if recipe.is_relative and any(layer_index(name) is not None for name in selected):
        raise ValueError(
            f"recipe {recipe.name!r} names its BF16 layers relative to the model's depth; resolve it for this model "
            "first (Recipe.for_model, or TrainConfig.resolved_recipe for a run)"
        )
    records = []
    for name, module in list(model.named_modules()):
        if not name or not any(fnmatch.fnmatchcase(name, p) for p in select):
            continue
        if type(module) is not nn.Linear:
            raise TypeError(f"selected module {name!r} is a {type(module).__name__}, not an exact nn.Linear")
        layer = layer_index(name)
        if recipe.is_bf16_layer(layer):
            records.append(
                ConversionRecord(name, layer, module.in_features, module.out_features, "bf16_exempt", None, None)
            )
            continue
        native = te.Linear(
            module.in_features,
            module.out_features,
            bias=module.bias is not None,
            params_dtype=module.weight.dtype,
            device=module.weight.device,
        )
        with torch.no_grad():
            native.weight.copy_(module.weight)
            if module.bias is not None:
                native.bias.copy_(module.bias)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, native)
        records.append(
            ConversionRecord(name, layer, module.in_features, module.out_features, "converted", "nvfp4", "native_te")
        )
    return tuple(records)


def execution_path(recipe: Recipe, execution: Execution | str, backend: str = "auto") -> dict[str, str]:
    """How a result was produced, for provenance records (the backend of the emulated path included)."""
    if Execution(execution) is Execution.NATIVE_TE:
        return {"execution": "native_te", "gemm_model": "native_te", "recipe": recipe.name, "backend": "native_te"}
    return {"execution": "emulated", "gemm_model": recipe.gemm.model.value, "recipe": recipe.name, "backend": backend}
