"""Recipes: named numerics configurations of the FP4 linear layers.

A recipe fixes everything a converted linear layer needs to know about its numerics (experiments spec section 1,
gemm spec section 1): the block scheme (UE5M3 B16/B32, NVFP4, MXFP4, or none for BF16), the refresh interval D of
the tensor references, the rounding / target T / 2D tiling / RHT of each operand role, the GEMM output model, the
layers kept in BF16, and per-module target overrides.

A linear layer runs three GEMMs with six quantized operand slots (:class:`Operand`):

* fprop ``Y = X W^T``: ``fprop_activation`` (X), ``fprop_weight`` (W, 2D tiles);
* dgrad ``dX = dY W``: ``dgrad_upstream_gradient`` (dY), ``dgrad_weight`` (W, the same 2D tiles);
* wgrad ``dW = dY^T X``: ``wgrad_upstream_gradient`` (dY^T), ``wgrad_activation`` (X^T).

:meth:`Recipe.operand_specs` resolves the six slots for one module. Role settings apply to every slot of the role,
except that RHT only ever applies to the two wgrad slots, and a :class:`TargetOverride` changes exactly one slot:
the paper's 8B recipe sets T = 2048 only for the wgrad dY^T operand of the late MLP down projections, while dY in
dgrad, activations and weights of those modules keep T = 448.

``bf16_layers`` and each override's ``layers`` name layers by absolute index or relative to the model's depth
(:mod:`ue5m3.layers.layer_selection`): the packaged recipes say ``{first: 0, last: 8, kind: null}``, "the final 8
layers", which is layers 44-51 of the 8B model and the final 8 of any other. :meth:`Recipe.for_model` resolves a
recipe against one model (absolute indices, checked against its depth); every consumer of a run's recipe (training,
evaluation, parity, the native TE path, the run identity) works on that resolved recipe.

The named recipes ship as YAML files in ``ue5m3/layers/recipe_files`` (:func:`get`, :func:`names`), the arms of
the block-scale format study in its ``study`` folder (:func:`study_names`); users copy and edit them and read them
back with :func:`load`. Loading is strict (style rule 6, :func:`ue5m3.config.load`):
unknown and missing keys, wrong types and unknown enum values are refused with the key path and the source file in
the message (style rule 14).
"""

from __future__ import annotations

import logging
import math
import os
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from fnmatch import fnmatchcase
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

import yaml

from ue5m3 import config
from ue5m3.artifacts import atomic_path
from ue5m3.layers import layer_selection
from ue5m3.layers.layer_selection import LayerKind, LayerSelector, ModelLayers
from ue5m3.numerics.exact import is_grid
from ue5m3.numerics.formats import Rounding
from ue5m3.numerics.scaling import OperandRole
from ue5m3.numerics.schemes import SCHEMES, get_scheme

__all__ = [
    "GemmModel",
    "Operand",
    "RoleConfig",
    "GemmConfig",
    "TargetOverride",
    "LayerKind",
    "LayerSelector",
    "ModelLayers",
    "OperandSpec",
    "Recipe",
    "get",
    "names",
    "study_names",
    "load",
    "dump",
    "resolve",
]

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


logger = logging.getLogger(__name__)
_NOTED: set[tuple[str, str, str]] = set()
"""The overrides left out with a note so far (recipe, model, pattern): each is noted once per process."""


class GemmModel(StrEnum):
    """How an FP4 GEMM's FP32 result is formed (gemm spec section 2); ``bf16`` means no quantization at all."""

    BF16 = "bf16"
    DECODED = "decoded"
    ENCODED_FP32 = "encoded_fp32"
    PROBE_MATCHED = "probe_matched"
    MMA_SIM = "mma_sim"


class Operand(StrEnum):
    """The six quantized operand slots of a linear layer's three GEMMs (gemm spec section 1)."""

    FPROP_ACTIVATION = "fprop_activation"
    FPROP_WEIGHT = "fprop_weight"
    DGRAD_UPSTREAM_GRADIENT = "dgrad_upstream_gradient"
    DGRAD_WEIGHT = "dgrad_weight"
    WGRAD_UPSTREAM_GRADIENT = "wgrad_upstream_gradient"
    WGRAD_ACTIVATION = "wgrad_activation"

    @property
    def gemm(self) -> str:
        """The GEMM this slot feeds: ``"fprop"``, ``"dgrad"`` or ``"wgrad"``."""
        return self.value.split("_", 1)[0]

    @property
    def role(self) -> OperandRole:
        """The operand role whose settings (and tensor reference) this slot uses."""
        return OperandRole(self.value.split("_", 1)[1])


def _fail(exc: type[Exception], key: str, detail: str) -> NoReturn:
    """Raise ``exc`` with a message that starts with the key path (callers prefix outer paths)."""
    raise exc(f"{key}: {detail}")


def _check_instance(value: Any, kind: type | tuple[type, ...], key: str, what: str) -> None:
    # bool is an int subclass: never accept it where a number belongs.
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        _fail(TypeError, key, f"expected {what}, got {type(value).__name__} {value!r}")


def _check_target(value: Any, key: str, *, optional: bool) -> float | None:
    if value is None and optional:
        return None
    _check_instance(value, (int, float), key, "a positive finite number" + (" or null" if optional else ""))
    if not (math.isfinite(value) and value > 0):
        _fail(ValueError, key, f"target must be positive and finite, got {value!r}")
    return float(value)


@dataclass(frozen=True, kw_only=True)
class RoleConfig:
    """Quantization settings of one operand role (activation, weight or upstream_gradient)."""

    rounding: Rounding
    """Payload rounding of every slot of this role (scales are always RNE)."""
    target: float | None
    """Tensor-scale target T; None only for schemes without a tensor scale (mxfp4)."""
    two_d: bool = False
    """Quantize in BxB tiles so W and W^T share values; allowed only for the weight role."""
    rht: bool = False
    """Apply the random Hadamard transform to this role's wgrad slot; not allowed for the weight role."""

    def __post_init__(self) -> None:
        _check_instance(self.rounding, Rounding, "rounding", "a Rounding")
        object.__setattr__(self, "target", _check_target(self.target, "target", optional=True))
        _check_instance(self.two_d, bool, "two_d", "a bool")
        _check_instance(self.rht, bool, "rht", "a bool")


@dataclass(frozen=True, kw_only=True)
class GemmConfig:
    """The GEMM output model and its parameters (gemm spec section 2)."""

    model: GemmModel
    """Output model shared by the fprop, dgrad and wgrad GEMMs."""
    slice_width: int = 64
    """K slice width of probe_matched (a positive multiple of 16 and of the block size); mma_sim needs 64."""
    cross_slice_rounding: Rounding = Rounding.RTZ
    """FP32 rounding of the cross-slice additions: ``rtz`` (the paper's probe) or ``rne``."""
    final_grid: int | None = None
    """Denominator of the accumulator lattice snap (1024 = a 1/1024 grid), or None; probe_matched only."""

    def __post_init__(self) -> None:
        _check_instance(self.model, GemmModel, "model", "a GemmModel")
        _check_instance(self.slice_width, int, "slice_width", "an int")
        if self.slice_width <= 0 or self.slice_width % 16:
            _fail(ValueError, "slice_width", f"must be a positive multiple of 16, got {self.slice_width!r}")
        if self.model is GemmModel.MMA_SIM and self.slice_width != 64:
            _fail(
                ValueError, "slice_width", f"mma_sim models 64-wide MMA instructions; use 64, got {self.slice_width!r}"
            )
        _check_instance(self.cross_slice_rounding, Rounding, "cross_slice_rounding", "a Rounding")
        if self.cross_slice_rounding not in (Rounding.RTZ, Rounding.RNE):
            _fail(
                ValueError, "cross_slice_rounding", f"must be 'rtz' or 'rne', got {self.cross_slice_rounding.value!r}"
            )
        if self.final_grid is not None:
            _check_instance(self.final_grid, int, "final_grid", "an int or null")
            if not is_grid(self.final_grid):
                _fail(ValueError, "final_grid", f"must be a power of two >= 2, got {self.final_grid!r}")
            if self.model is not GemmModel.PROBE_MATCHED:
                _fail(ValueError, "final_grid", f"the lattice snap belongs to probe_matched, not {self.model.value!r}")


@dataclass(frozen=True, kw_only=True)
class TargetOverride:
    """A per-module target T for one operand slot (the paper's T = 2048 wgrad dY^T override)."""

    operand: Operand
    """The one slot whose target changes; the other slots keep their role targets."""
    module: str
    """fnmatch pattern (case-sensitive) matched against the module name, e.g. ``"*.mixer.down_proj"``."""
    layers: tuple[int, ...] | LayerSelector
    """Layers the override applies to: indices (non-empty, distinct, >= 0) or a depth-relative selector."""
    target: float
    """The target T used for the slot in matching modules."""

    def __post_init__(self) -> None:
        _check_instance(self.operand, Operand, "operand", "an Operand")
        _check_instance(self.module, str, "module", "a str")
        if not self.module:
            _fail(ValueError, "module", "the module pattern must be non-empty")
        layer_selection.check(self.layers, "layers", allow_empty=False)
        object.__setattr__(self, "target", _check_target(self.target, "target", optional=False))

    def matches(self, operand: Operand, module_name: str, layer: int | None) -> bool:
        """Whether this override applies to ``operand`` of module ``module_name`` in ``layer``.

        Raises:
            ValueError: the override names its layers relative to the depth and would have to decide for this
                module (resolve the recipe with :meth:`Recipe.for_model` first).
        """
        return (
            operand is self.operand
            and layer is not None
            and fnmatchcase(module_name, self.module)
            and layer_selection.contains(self.layers, layer, "layers")
        )


@dataclass(frozen=True, kw_only=True)
class OperandSpec:
    """Resolved settings of one operand slot of one module: what the linear layer's quantizer call consumes."""

    operand: Operand
    """The slot."""
    role: OperandRole
    """The slot's role (also the key of its tensor reference)."""
    rounding: Rounding
    """Payload rounding."""
    target: float | None
    """Tensor-scale target T (None for schemes without a tensor scale)."""
    two_d: bool
    """Whether the operand is quantized in BxB tiles."""
    rht: bool
    """Whether the random Hadamard transform is applied before quantizing."""


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """One training/inference numerics configuration of the FP4 linear layers (experiments spec section 1)."""

    name: str
    """Registry and file name, e.g. ``"ue5m3_b16"``."""
    description: str
    """One-line human description recorded with results."""
    scheme: str | None
    """Block scheme name in ``quantize.SCHEMES`` (gives the block size and scale format); None for BF16."""
    interval: int
    """Refresh interval D of the tensor references (1 = current scaling)."""
    roles: Mapping[OperandRole, RoleConfig]
    """Settings per role; all three for quantized recipes, empty for BF16."""
    gemm: GemmConfig
    """GEMM output model."""
    bf16_layers: tuple[int, ...] | LayerSelector = ()
    """Layers whose linears stay in BF16: indices, or a depth-relative selector (resolved by :meth:`for_model`)."""
    target_overrides: tuple[TargetOverride, ...] = ()
    """Per-module target overrides; the first matching one wins."""
    native_te: bool = False
    """Whether a native Transformer Engine NVFP4 path exists on Blackwell (nvfp4 only)."""

    def __post_init__(self) -> None:
        _check_instance(self.name, str, "name", "a str")
        if not _NAME_RE.fullmatch(self.name):
            _fail(ValueError, "name", f"must match {_NAME_RE.pattern!r} (it is also a file name), got {self.name!r}")
        _check_instance(self.description, str, "description", "a str")
        if self.scheme is not None:
            _check_instance(self.scheme, str, "scheme", "a scheme name or null")
            if self.scheme not in SCHEMES:
                _fail(ValueError, "scheme", f"unknown scheme {self.scheme!r}; accepted: {sorted(SCHEMES)} or null")
        _check_instance(self.interval, int, "interval", "an int")
        if self.interval < 1:
            _fail(ValueError, "interval", f"must be >= 1, got {self.interval!r}")
        _check_instance(self.roles, Mapping, "roles", "a mapping of OperandRole to RoleConfig")
        for role, cfg in self.roles.items():
            _check_instance(role, OperandRole, "roles", f"OperandRole keys, one of {[r.value for r in OperandRole]}")
            _check_instance(cfg, RoleConfig, f"roles.{role}", "a RoleConfig")
        # Canonical order, read-only view: equality and to_dict do not depend on insertion order.
        roles = {role: self.roles[role] for role in OperandRole if role in self.roles}
        object.__setattr__(self, "roles", types.MappingProxyType(roles))
        _check_instance(self.gemm, GemmConfig, "gemm", "a GemmConfig")
        layer_selection.check(self.bf16_layers, "bf16_layers")
        _check_instance(self.target_overrides, tuple, "target_overrides", "a tuple of TargetOverride")
        for i, override in enumerate(self.target_overrides):
            _check_instance(override, TargetOverride, f"target_overrides[{i}]", "a TargetOverride")
        _check_instance(self.native_te, bool, "native_te", "a bool")
        if self.scheme is None:
            self._check_bf16()
        else:
            self._check_quantized()

    def _check_bf16(self) -> None:
        if self.gemm.model is not GemmModel.BF16:
            _fail(ValueError, "gemm.model", f"a recipe without scheme computes in BF16, got {self.gemm.model.value!r}")
        for key in ("roles", "bf16_layers", "target_overrides"):
            if getattr(self, key) not in ({}, ()):
                _fail(ValueError, key, "must be empty for a BF16 recipe (scheme null)")
        if self.interval != 1:
            _fail(ValueError, "interval", f"a BF16 recipe has no tensor references; use 1, got {self.interval!r}")
        if self.native_te:
            _fail(ValueError, "native_te", "a BF16 recipe has no native TE NVFP4 path")

    def _check_quantized(self) -> None:
        scheme = get_scheme(self.scheme)
        has_tensor_scale = scheme.target is not None
        if self.gemm.model is GemmModel.BF16:
            _fail(ValueError, "gemm.model", f"scheme {self.scheme!r} needs a quantized GEMM model, not 'bf16'")
        missing = [role.value for role in OperandRole if role not in self.roles]
        if missing:
            _fail(ValueError, "roles", f"missing roles {missing}; a quantized recipe sets all three")
        for role, cfg in self.roles.items():
            if cfg.two_d and role is not OperandRole.WEIGHT:
                _fail(ValueError, f"roles.{role}.two_d", "2D tiles are only for the weight role")
            if cfg.rht and role is OperandRole.WEIGHT:
                _fail(ValueError, f"roles.{role}.rht", "RHT applies only to the wgrad dY^T and X^T operands")
            if (cfg.target is None) == has_tensor_scale:
                need = "a target T" if has_tensor_scale else "target null (it has no tensor scale)"
                _fail(ValueError, f"roles.{role}.target", f"scheme {self.scheme!r} needs {need}, got {cfg.target!r}")
            if cfg.two_d and not has_tensor_scale:
                _fail(ValueError, f"roles.{role}.two_d", f"scheme {self.scheme!r} uses 1D blocks only")
        if (
            self.gemm.model in (GemmModel.PROBE_MATCHED, GemmModel.MMA_SIM)
            and self.gemm.slice_width % scheme.block_size
        ):
            detail = (
                f"{self.gemm.slice_width} is not a multiple of the block size {scheme.block_size} of {self.scheme!r}"
            )
            _fail(ValueError, "gemm.slice_width", detail)
        if not has_tensor_scale and self.interval != 1:
            _fail(ValueError, "interval", f"scheme {self.scheme!r} has no tensor reference to hold; use 1")
        for i, override in enumerate(self.target_overrides):
            if not has_tensor_scale:
                _fail(ValueError, f"target_overrides[{i}]", f"scheme {self.scheme!r} has no tensor-scale target")
            # with a selector on either side the overlap depends on the model: for_model checks it when resolved
            absolute = isinstance(override.layers, tuple) and isinstance(self.bf16_layers, tuple)
            dead = sorted(set(override.layers) & set(self.bf16_layers)) if absolute else []
            if dead:
                _fail(ValueError, f"target_overrides[{i}].layers", f"layers {dead} are in bf16_layers (never applied)")
        if self.native_te:
            if self.scheme != "nvfp4":
                _fail(ValueError, "native_te", f"only scheme 'nvfp4' has a native TE path, not {self.scheme!r}")
            if self.interval != 1 or self.target_overrides:
                _fail(ValueError, "native_te", "native TE uses current scaling (interval 1) and no target overrides")
            for role, cfg in self.roles.items():
                if cfg.target != 448.0:
                    _fail(ValueError, f"roles.{role}.target", f"native TE fixes T = 448, got {cfg.target!r}")

    @property
    def is_quantized(self) -> bool:
        """False for the BF16 recipe."""
        return self.scheme is not None

    @property
    def block_size(self) -> int | None:
        """Block size (and 2D tile side) of the scheme; None for BF16."""
        return None if self.scheme is None else get_scheme(self.scheme).block_size

    @property
    def is_relative(self) -> bool:
        """Whether any key names layers relative to the model's depth (then resolve with :meth:`for_model`)."""
        named = (self.bf16_layers, *(o.layers for o in self.target_overrides))
        return any(isinstance(layers, LayerSelector) for layers in named)

    def for_model(self, layers: ModelLayers) -> Recipe:
        """This recipe resolved against one model: every layer key as absolute indices of that model.

        A selector becomes the indices it selects; indices are checked against the model's depth. An override whose
        module pattern matches none of the model's linears but a linear of another model the project ships (the
        Nemotron-H ``*.mixer.down_proj`` in a dense model) could change no operand there and is left out, with a
        logged note (once per recipe, model and pattern); one that matches no shipped model's linear (a typo such
        as ``*.mlp.down_projj``) is refused. The resolved recipe is what conversion, the native TE path and the run
        identity use; resolving it again changes nothing.

        Args:
            layers: the model's layer kinds and linear names (``ue5m3.training.config.model_layers`` builds it).

        Raises:
            ValueError: a selector asks for more layers (of its kind) than the model has, an index is beyond the
                model's last layer, or a resolved override lands on a BF16 layer; the message starts with the key
                path and names the recipe, the model and its depth.
        """
        _check_instance(layers, ModelLayers, "layers", "a ModelLayers")
        try:
            bf16 = layer_selection.resolve(self.bf16_layers, layers, "bf16_layers")
            overrides = []
            for i, override in enumerate(self.target_overrides):
                if not any(fnmatchcase(name, override.module) for name in layers.linears):
                    self._leave_out(i, override.module, layers)
                    continue
                at = layer_selection.resolve(override.layers, layers, f"target_overrides[{i}].layers")
                overrides.append(replace(override, layers=at))
            return replace(self, bf16_layers=bf16, target_overrides=tuple(overrides))
        except ValueError as exc:
            raise ValueError(f"{exc} (recipe {self.name!r} for model {layers.model!r})") from None

    def _leave_out(self, i: int, pattern: str, layers: ModelLayers) -> None:
        """Note an override written for another shipped model (left out), or refuse one written for none."""
        elsewhere = layers.shipped_models_matching(pattern)
        if not elsewhere:
            known = ", ".join(sorted(layers.shipped_linears)) or "none given"
            raise ValueError(
                f"target_overrides[{i}].module: pattern {pattern!r} matches no linear of model {layers.model!r} nor "
                f"of any other model the project ships ({known}); e.g. {list(layers.linears[:3])}"
            )
        key = (self.name, layers.model, pattern)
        if key not in _NOTED:
            _NOTED.add(key)
            logger.info(
                f"recipe {self.name!r}: target_overrides[{i}] ({pattern!r}) matches no linear of model "
                f"{layers.model!r}, only of {elsewhere}; left out for {layers.model!r}"
            )

    def is_bf16_layer(self, layer: int | None) -> bool:
        """Whether the linears of ``layer`` stay in BF16 (None: a module outside the numbered layers).

        Raises:
            ValueError: ``bf16_layers`` is a depth-relative selector (resolve with :meth:`for_model` first).
        """
        if layer is None:
            return False
        _check_instance(layer, int, "layer", "an int or None")
        try:
            return layer_selection.contains(self.bf16_layers, layer, "bf16_layers")
        except ValueError as exc:
            raise ValueError(f"{exc} (recipe {self.name!r})") from None

    def operand_specs(self, module_name: str, layer: int | None) -> dict[Operand, OperandSpec]:
        """Resolve the six operand slots of one linear module.

        Args:
            module_name: fully qualified module name, e.g. ``"backbone.layers.45.mixer.down_proj"``.
            layer: the module's layer index, or None outside the numbered layers (no override then matches).

        Returns:
            One :class:`OperandSpec` per :class:`Operand`, in enum order.

        Raises:
            ValueError: for the BF16 recipe or a layer in ``bf16_layers`` (nothing to quantize there).
            TypeError: for a non-str module name or non-int layer.
        """
        _check_instance(module_name, str, "module_name", "a str")
        if not self.is_quantized:
            raise ValueError(f"recipe {self.name!r} is BF16 and has no quantized operands")
        if self.is_bf16_layer(layer):
            raise ValueError(f"layer {layer!r} stays in BF16 under recipe {self.name!r}; check is_bf16_layer first")
        specs = {}
        for operand in Operand:
            cfg = self.roles[operand.role]
            target = cfg.target
            for i, override in enumerate(self.target_overrides):
                try:
                    hit = override.matches(operand, module_name, layer)
                except ValueError as exc:
                    raise ValueError(f"target_overrides[{i}].{exc} (recipe {self.name!r})") from None
                if hit:
                    target = override.target
                    break
            specs[operand] = OperandSpec(
                operand=operand,
                role=operand.role,
                rounding=cfg.rounding,
                target=target,
                two_d=cfg.two_d,
                rht=cfg.rht and operand.gemm == "wgrad",
            )
        return specs

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (str, int, float, bool, None, list, dict) accepted by :meth:`from_dict`."""
        return config.dump(self)

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "<dict>") -> Recipe:
        """Build a recipe from plain data, strictly.

        Args:
            data: a mapping with exactly the keys :meth:`to_dict` writes.
            source: where the data came from (a file path), named in every error message.

        Raises:
            ValueError: unknown or missing keys, unknown enum values, values that break an invariant.
            TypeError: a value of the wrong type (a bool where a number belongs, a list where a mapping belongs).
        """
        return config.load(cls, data, source=source, complete=True)


# ----- files and registry -----------------------------------------------------------------------------------


def load(path: str | os.PathLike[str]) -> Recipe:
    """Read a recipe YAML file strictly (see :meth:`Recipe.from_dict`); errors name ``path``."""
    source = os.fspath(path)
    return Recipe.from_dict(config.read_yaml(source), source=source)


def dump(recipe: Recipe, path: str | os.PathLike[str]) -> Path:
    """Write ``recipe`` as YAML atomically (temp file in the same folder, then ``os.replace``).

    Returns:
        The written path, so ``load(dump(recipe, path)) == recipe``.
    """
    if not isinstance(recipe, Recipe):
        raise TypeError(f"dump expects a Recipe, got {type(recipe).__name__}")
    path = Path(path)
    header = (
        f"# ue5m3 recipe {recipe.name!r}, written by ue5m3.layers.recipes.dump; load with ue5m3.layers.recipes.load.\n"
    )
    data = recipe.to_dict()
    # allow_unicode=False: PyYAML writes some characters (e.g. U+0085) raw that its own reader treats as line
    # breaks; escaping all non-ASCII keeps every string lossless.
    text = header + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, allow_unicode=False)
    assert yaml.safe_load(text) == data, f"YAML round trip of recipe {recipe.name!r} is lossy"
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


_STUDY = "study"
"""The folder of ``recipe_files`` holding the study recipes (the block-scale format study's arms)."""


def _recipe_dir() -> Any:
    return resources.files("ue5m3.layers").joinpath("recipe_files")


def _names_in(folder: Any) -> list[str]:
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def names() -> list[str]:
    """Names of the packaged recipes (the paper's configurations and the extra baselines), sorted."""
    return _names_in(_recipe_dir())


def study_names() -> list[str]:
    """Names of the study recipes (``recipe_files/study``: the arms of the block-scale format study, each one
    factor away from the study's reference arm), sorted; :func:`get` reads them as it reads the packaged ones."""
    return _names_in(_recipe_dir().joinpath(_STUDY))


@cache
def _get(name: str, folder: str) -> Recipe:
    resource = _recipe_dir().joinpath(folder, f"{name}.yaml") if folder else _recipe_dir().joinpath(f"{name}.yaml")
    source = "/".join(("ue5m3/layers/recipe_files", *([folder] if folder else []), f"{name}.yaml"))
    recipe = Recipe.from_dict(config.read_yaml(resource), source=source)
    if recipe.name != name:
        raise ValueError(f"{source}: name: the file's recipe is named {recipe.name!r}, expected {name!r}")
    return recipe


def get(name: str) -> Recipe:
    """Return the packaged or study recipe ``name``.

    Raises:
        TypeError: ``name`` is not a str.
        ValueError: unknown name (the message lists the known ones).
    """
    if not isinstance(name, str):
        raise TypeError(f"recipe name must be a str, got {type(name).__name__} {name!r}")
    if name in names():
        return _get(name, "")
    if name in study_names():
        return _get(name, _STUDY)
    raise ValueError(f"unknown recipe {name!r}; known recipes: {names()}; study recipes: {study_names()}")


def resolve(spec: str, overrides: Mapping[str, Any] | None = None) -> Recipe:
    """A packaged recipe name or a recipe file path, with ``overrides`` applied through the strict loader.

    Raises:
        ValueError: an unknown name, a bad file, or overrides the recipe loader refuses (naming ``spec``).
    """
    recipe = load(spec) if spec.endswith((".yaml", ".yml")) else get(spec)
    if overrides:
        recipe = Recipe.from_dict({**recipe.to_dict(), **overrides}, source=f"recipe_overrides of {spec}")
    return recipe
