"""Layer selection: which numbered layers a recipe's BF16 exemption and target overrides name.

The paper's recipes name the final layers of the 8B Nemotron-H model (experiments spec section 1): the TE-style
recipes keep "the final 8 hybrid blocks (layers 44-51)" in BF16, and the proposed recipe sets T = 2048 on the wgrad
dY^T operand of the down projections in those blocks (layers 45, 47, 49, 51). The same recipe runs on the 1.2B
parity model (20 layers), the 350M control (16 layers) and the CPU-scale models, so a recipe names layers in one
of two ways:

* absolutely, by index: ``[44, 45, 46, 47, 48, 49, 50, 51]``. These are the same layers in every model, so the
  list means "the final 8" only at the depth it was written for;
* relative to the model's depth, by a :class:`LayerSelector`: ``{first: 0, last: 8, kind: null}`` is "the final 8
  layers" in any model. ``{first: 0, last: 4, kind: mlp}`` is "the final 4 layers holding an MLP": layers 45, 47,
  49 and 51 of the 8B model, and layers 12-15 of the 16-layer dense control, whose layers each hold an MLP.

A layer's kinds (:class:`LayerKind`) are the sublayers its residual block holds. A Nemotron-H block holds one
(``mamba``, ``attention`` or ``mlp``, from the hybrid pattern); a dense Transformer layer holds ``attention`` and
``mlp``.

:func:`resolve` turns either form into absolute indices of one model, described by a :class:`ModelLayers`. It
refuses a selector that asks for more layers (of its kind) than the model has, and an index the model does not
have, naming the key, the model and its depth. :meth:`ue5m3.layers.recipes.Recipe.for_model` resolves every
selector of a recipe, so conversion, the native TE path and run identities only ever see absolute indices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from fnmatch import fnmatchcase
from typing import Any, NoReturn

__all__ = ["LayerKind", "LayerSelector", "Layers", "ModelLayers", "check", "contains", "resolve"]


class LayerKind(StrEnum):
    """A sublayer kind of a residual block (the Nemotron-H pattern characters ``M``, ``*`` and ``-``)."""

    MAMBA = "mamba"
    ATTENTION = "attention"
    MLP = "mlp"


def _fail(exc: type[Exception], key: str, detail: str) -> NoReturn:
    raise exc(f"{key}: {detail}")


def _check_count(value: Any, key: str) -> None:
    # bool is an int subclass: True is not a layer count
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(TypeError, key, f"expected an int layer count, got {type(value).__name__} {value!r}")
    if value < 0:
        _fail(ValueError, key, f"a layer count must be >= 0, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class ModelLayers:
    """The facts about one model that layer selections resolve against (built from the model by the caller)."""

    model: str
    """The model's name, used in error messages."""
    kinds: tuple[frozenset[LayerKind], ...]
    """Per numbered layer, in index order, the sublayer kinds its block holds."""
    linears: tuple[str, ...]
    """Names of the model's FP4-eligible linears; an override whose module pattern matches none is inapplicable."""
    shipped_linears: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """The eligible linears of each other model the project ships (by name): an override that matches none of this
    model's linears but some of these is written for another model and left out here; one matching none at all
    (a typo) is refused. Read only on that path, so a lazy mapping (one that builds a model's list when first asked)
    is kept as given; a plain dict is copied with tuple values."""

    def __post_init__(self) -> None:
        if not isinstance(self.model, str):
            raise TypeError(f"model: expected a str, got {type(self.model).__name__} {self.model!r}")
        accepted = [k.value for k in LayerKind]
        kinds = []
        for i, layer in enumerate(self.kinds):
            if isinstance(layer, str) or not layer or any(k not in accepted for k in layer):
                _fail(ValueError, f"kinds[{i}]", f"expected a non-empty set of {accepted}, got {layer!r}")
            kinds.append(frozenset(LayerKind(k) for k in layer))
        object.__setattr__(self, "kinds", tuple(kinds))
        object.__setattr__(self, "linears", tuple(self.linears))
        if not isinstance(self.shipped_linears, Mapping):
            _fail(TypeError, "shipped_linears", f"expected a mapping, got {type(self.shipped_linears).__name__}")
        if type(self.shipped_linears) is dict:
            object.__setattr__(self, "shipped_linears", {k: tuple(v) for k, v in self.shipped_linears.items()})

    @property
    def depth(self) -> int:
        """Number of numbered layers."""
        return len(self.kinds)

    def of_kind(self, kind: LayerKind | None) -> list[int]:
        """Indices of the layers holding ``kind`` (every layer for None), in order."""
        return [i for i, held in enumerate(self.kinds) if kind is None or kind in held]

    def shipped_models_matching(self, pattern: str) -> list[str]:
        """The other shipped models with a linear that the module pattern ``pattern`` matches."""
        return [name for name, linears in self.shipped_linears.items() if any(fnmatchcase(n, pattern) for n in linears)]

    def summary(self) -> str:
        """The depth and how many layers hold each kind, e.g. ``"52 layers: 24 mamba, 4 attention, 24 mlp"``."""
        counts = ", ".join(f"{n} {kind.value}" for kind in LayerKind if (n := len(self.of_kind(kind))))
        return f"{self.depth} layers: {counts}"


@dataclass(frozen=True, kw_only=True)
class LayerSelector:
    """Layers counted from the ends of the model: its first ``first`` and last ``last`` layers of ``kind``.

    In a recipe file: ``{first: 0, last: 8, kind: null}`` (the final 8 layers) or ``{first: 0, last: 4, kind: mlp}``
    (the final 4 layers holding an MLP). Every key is required there, as everywhere in a recipe file.
    """

    first: int = 0
    """How many of the lowest-numbered layers of ``kind`` to select."""
    last: int = 0
    """How many of the highest-numbered layers of ``kind`` to select."""
    kind: LayerKind | None = None
    """Count only layers holding this sublayer kind; None counts every layer."""

    def __post_init__(self) -> None:
        _check_count(self.first, "first")
        _check_count(self.last, "last")
        if self.first + self.last == 0:
            _fail(ValueError, "last", "the selector selects no layer (first and last are 0); use [] for none")
        if self.kind is not None and not isinstance(self.kind, LayerKind):
            _fail(TypeError, "kind", f"expected a LayerKind or None, got {type(self.kind).__name__} {self.kind!r}")

    def describe(self) -> str:
        """Words for what the selector selects, e.g. ``"the last 4 'mlp' layers"``."""
        ends = [f"{end} {count}" for end, count in (("first", self.first), ("last", self.last)) if count]
        kind = f" {self.kind.value!r}" if self.kind is not None else ""
        return f"the {' and '.join(ends)}{kind} layers"

    def select(self, layers: ModelLayers, key: str = "layers") -> tuple[int, ...]:
        """The selected absolute indices of ``layers``' model, ascending.

        Raises:
            ValueError: the model has fewer layers (of ``kind``) than the selector asks for; the message names
                ``key``, the model and its depth.
        """
        candidates = layers.of_kind(self.kind)
        if self.first + self.last > len(candidates):
            _fail(
                ValueError,
                key,
                f"selects {self.describe()}, but model {layers.model!r} has {layers.summary()}; "
                "select fewer layers for this model (recipe_overrides) or use a deeper model",
            )
        chosen = set(candidates[: self.first]) | set(candidates[len(candidates) - self.last :])
        return tuple(sorted(chosen))


Layers = tuple[int, ...] | LayerSelector
"""What a recipe key naming layers holds: absolute indices or a depth-relative selector."""


def check(value: Any, key: str, *, allow_empty: bool = True) -> None:
    """Validate a :data:`Layers` value: distinct indices >= 0, or a :class:`LayerSelector`.

    Raises:
        TypeError: neither a tuple nor a selector, or a non-int index.
        ValueError: a negative or repeated index, or an empty tuple where ``allow_empty`` is false.
    """
    if isinstance(value, LayerSelector):
        return
    if not isinstance(value, tuple):
        _fail(TypeError, key, f"expected a tuple of layer indices or a LayerSelector, got {type(value).__name__}")
    for i, layer in enumerate(value):
        if isinstance(layer, bool) or not isinstance(layer, int):
            _fail(TypeError, f"{key}[{i}]", f"expected an int layer index, got {type(layer).__name__} {layer!r}")
        if layer < 0:
            _fail(ValueError, f"{key}[{i}]", f"layer index must be >= 0, got {layer!r}")
    if len(set(value)) != len(value):
        _fail(ValueError, key, f"duplicate layer indices in {value!r}")
    if not value and not allow_empty:
        _fail(ValueError, key, "needs at least one layer (or a selector)")


def contains(value: Layers, layer: int, key: str) -> bool:
    """Whether absolute ``value`` names ``layer``.

    Raises:
        ValueError: ``value`` is a selector (what it names depends on the model; resolve the recipe first).
    """
    if isinstance(value, LayerSelector):
        _fail(
            ValueError,
            key,
            f"{value.describe()} depend on the model's depth; resolve the recipe for the model first "
            "(Recipe.for_model, or TrainConfig.resolved_recipe for a run)",
        )
    return layer in value


def resolve(value: Layers, layers: ModelLayers, key: str) -> tuple[int, ...]:
    """Absolute indices of ``value`` in ``layers``' model (a selector selected, indices checked against the depth).

    Raises:
        ValueError: a selector asking for more layers than the model has, or an index beyond its last layer.
    """
    if isinstance(value, LayerSelector):
        return value.select(layers, key)
    for i, layer in enumerate(value):
        if layer >= layers.depth:
            _fail(
                ValueError,
                f"{key}[{i}]",
                f"layer {layer!r} does not exist in model {layers.model!r} ({layers.summary()}, indices "
                f"0-{layers.depth - 1}); name layers relative to the depth, e.g. {{first: 0, last: 8, kind: null}}",
            )
    return tuple(value)
