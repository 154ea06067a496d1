"""Caches of the FP4 linear: the weight's packed quantizations, reused by every microbatch of an optimizer step.

A layer quantizes its weight twice per pass (W^T along ``in`` for fprop, W along ``out`` for dgrad, both in 2D
tiles) although the weight changes only at the optimizer step. :class:`WeightCache` holds the packed form of each
(:class:`~ue5m3.numerics.quantize.PackedQuantized`) while its key holds, and :class:`WeightCaching` says what the
key is. A cached quantization is the one recomputing would give (the weight and its held reference do not change
under the key), so the bits are the same with or without caching; only deterministic roundings are cached.
"""

from __future__ import annotations

import enum
import weakref
from collections.abc import Callable

import torch

from ue5m3.layers.recipes import Operand
from ue5m3.numerics.quantize import PackedQuantized, QuantizedTensor

__all__ = ["WeightCaching", "WeightCache"]


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
    """The packed weight quantizations of one FP4 linear (fprop W^T and dgrad W), kept while their key holds.

    The key is the layer's weight epoch (the scale step), plus the tensor's identity, version and storage in
    ``version`` mode. :attr:`hits` and :attr:`misses` count the lookups.
    """

    def __init__(self, mode: WeightCaching | str = WeightCaching.VERSION) -> None:
        self.mode = WeightCaching(mode)
        self._entries: dict[Operand, tuple[weakref.ref, tuple, PackedQuantized]] = {}
        self.hits = 0
        self.misses = 0

    def get(
        self, operand: Operand, weight: torch.Tensor, step: int | None, make: Callable[[], QuantizedTensor]
    ) -> QuantizedTensor:
        """The quantization of ``weight`` for ``operand`` under weight epoch ``step``: the held one while its key
        holds, else ``make()`` (then held in packed form, unless caching is off)."""
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
