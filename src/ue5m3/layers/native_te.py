"""Native NVFP4 through NVIDIA Transformer Engine (Blackwell only) for the two NVIDIA recipes.

``nvfp4_te`` and ``nvfp4_no_rht_all_linears`` run natively as ``te.Linear`` under ``te.autocast`` with an
``NVFP4BlockScaling`` recipe whose RHT, stochastic-rounding and 2D flags follow the project recipe. Everywhere else
the same recipes run emulated through :mod:`ue5m3.layers.linear`. Transformer Engine is imported lazily; without
it, without CUDA or on a GPU below compute capability 10.0 every entry point raises :class:`NativeUnavailable` --
never a silent fallback to the emulator.

Split ("2x") accumulation: the paper's TE (2.16.0.dev0) forced it off for dgrad and wgrad. TE's modules read it from
the recipe's ``fp8_gemm_fprop``/``fp8_gemm_dgrad``/``fp8_gemm_wgrad`` where the recipe has them, else from their
own defaults (``_2X_ACC_FPROP`` False, ``_2X_ACC_DGRAD`` and ``_2X_ACC_WGRAD`` True in
``transformer_engine/pytorch/module/base.py``). TE 2.16's ``NVFP4BlockScaling`` has none of the three, so
:func:`te_recipe` sets them only on a recipe that has them, and for FP4 operands TE 2.16 asks cuBLASLt for no fast
accumulation whatever the flag (``fastAccuMode = use_split_accumulator ? 0 : use_fp8`` in
``transformer_engine/common/gemm/cublaslt_gemm.cu``). Results record which path produced them
(:func:`execution_path`) and, for the native path, what TE's recipe object actually holds (:func:`te_settings`),
never the settings asked for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import fnmatch
import sys
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
    "te_settings",
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
    """The ``NVFP4BlockScaling`` recipe matching a project recipe: its RHT, SR and 2D flags, and split accumulation
    off for dgrad and wgrad where the TE recipe has those settings (TE 2.16's has not; :func:`te_settings` records
    what it holds)."""
    _check_recipe(recipe)
    require_native()
    from transformer_engine.common import recipe as te_recipes  # noqa: PLC0415

    roles = recipe.roles
    te = te_recipes.NVFP4BlockScaling(
        disable_rht=not (roles[OperandRole.ACTIVATION].rht or roles[OperandRole.UPSTREAM_GRADIENT].rht),
        disable_stochastic_rounding=roles[OperandRole.UPSTREAM_GRADIENT].rounding is Rounding.RNE,
        disable_2d_quantization=not roles[OperandRole.WEIGHT].two_d,
    )
    for gemm in ("dgrad", "wgrad"):
        if hasattr(te, f"fp8_gemm_{gemm}"):  # the paper forced TE's 2x accumulation off for the backward GEMMs
            setattr(te, f"fp8_gemm_{gemm}", te_recipes.MMParams(use_split_accumulator=False))
    return te


_RECIPE_FLAGS = (
    "disable_rht",
    "disable_stochastic_rounding",
    "disable_2d_quantization",
    "row_scaled_activation",
    "backward_override",
    "fp8_dpa",
    "fp8_mha",
)
_QUANTIZATION_PARAMS = ("fp4_quant_fwd_inp", "fp4_quant_fwd_weight", "fp4_quant_bwd_grad")


def _plain(value: Any) -> Any:
    """A TE setting as JSON data: enums by name, dataclasses (TE's ``QParams``, ``MMParams``) field by field."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return repr(value)


def _module_default(gemm: str) -> bool | None:
    """TE's own choice for ``gemm`` when the recipe has no setting (``_2X_ACC_<GEMM>`` of its modules); None where
    TE's modules cannot be imported."""
    try:
        from transformer_engine.pytorch.module import base  # noqa: PLC0415 - optional, GPU-only dependency
    except Exception:  # ImportError, or OSError for missing CUDA libraries
        return None
    value = getattr(base, f"_2X_ACC_{gemm.upper()}", None)
    return None if value is None else bool(value)


def te_settings(te_recipe_object: Any) -> dict[str, Any]:
    """What Transformer Engine runs with, read back from the recipe object it is given: TE's version, the recipe
    class, each flag and quantization parameter set the object has, and per GEMM (fprop, dgrad, wgrad) whether
    split accumulation is used and where that comes from (the recipe's ``fp8_gemm_<gemm>``, or TE's module default
    when the recipe has no such setting, as TE 2.16's ``NVFP4BlockScaling``). Nothing is recorded that the object
    does not hold."""
    te = sys.modules.get("transformer_engine")
    settings: dict[str, Any] = {
        "version": getattr(te, "__version__", None),
        "recipe_class": type(te_recipe_object).__name__,
    }
    for name in (*_RECIPE_FLAGS, *_QUANTIZATION_PARAMS):
        if hasattr(te_recipe_object, name):
            settings[name] = _plain(getattr(te_recipe_object, name))
    split = {}
    for gemm in ("fprop", "dgrad", "wgrad"):
        attribute = f"fp8_gemm_{gemm}"
        if hasattr(te_recipe_object, attribute):
            value = getattr(te_recipe_object, attribute).use_split_accumulator
            split[gemm] = {"use_split_accumulator": bool(value), "from": f"recipe.{attribute}"}
        else:
            default = _module_default(gemm)
            source = f"TE's module default _2X_ACC_{gemm.upper()} (the recipe has no {attribute})"
            split[gemm] = {"use_split_accumulator": default, "from": source if default is not None else "unknown"}
    settings["split_accumulator"] = split
    return settings


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


def execution_path(recipe: Recipe, execution: Execution | str, backend: str = "auto") -> dict[str, Any]:
    """How a result was produced, for provenance records: the backend of the emulated path, or for the native path
    what Transformer Engine's recipe object holds (:func:`te_settings`; TE must be importable then, as it is where
    the native path ran)."""
    if Execution(execution) is Execution.NATIVE_TE:
        return {
            "execution": "native_te",
            "gemm_model": "native_te",
            "recipe": recipe.name,
            "backend": "native_te",
            "transformer_engine": te_settings(te_recipe(recipe)),
        }
    return {"execution": "emulated", "gemm_model": recipe.gemm.model.value, "recipe": recipe.name, "backend": backend}
