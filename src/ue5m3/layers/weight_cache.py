"""Caches of the FP4 linear: the weight's packed quantizations, reused by every microbatch of an optimizer step.

A layer quantizes its weight twice per pass (W^T along ``in`` for fprop, W along ``out`` for dgrad, both in 2D
tiles) although the weight changes only at the optimizer step. :class:`WeightCache` holds the packed form of each
(:class:`~ue5m3.numerics.quantize.PackedQuantized`) while its key holds, and :class:`WeightCaching` says what the
key is. A cached quantization is the one recomputing would give (the weight and its held reference do not change
under the key), so the bits are the same with or without caching; only deterministic roundings are cached.

The cache can also keep, beside each packed quantization, the weight's *prepared* GEMM operand
(:func:`ue5m3.numerics.gemm.prepare_operand`: on the Triton probe_matched path, the FP16 slice values, the shifts and
the tile bounds the kernels read), so that the preparation pass runs once per step instead of once per microbatch
and GEMM. It is opt-in (``keep_prepared=True``, :func:`ue5m3.layers.linear.set_weight_caching`), off by default:
a prepared operand takes about 2.07 bytes per weight element (2 for the FP16 values, 4 bytes per column and
64-wide slice for the shifts, the bounds per tile), four times the packed copy, and both operands (W^T and W) are
held, so about 4.1 bytes per weight element for the step: about 29 GB per rank for the 8B model's 112 eligible
linears (7.0 B weights) in ``step`` mode under FSDP2, where every rank holds every layer's copy. What it saves is
one memory-bound pass per weight, GEMM and microbatch (it reads the FP32 payload and writes the FP16 values: about
6 bytes moved per weight element). Turn it on only where that memory is free, e.g. one process without sharding
and with several microbatches per step.

On the CPU the cache holds each quantization as it is, unpacked (``packed=None``, the default, except on the Triton
path, whose CPU run under the interpreter stands for a device's): the FP4 linears a CPU runs are small, and packing
every miss and unpacking every hit cost more there than the copy's memory, about 4.75 bytes per weight element
instead of 0.8 (an evaluation's work units hit the same frozen weight thousands of times). ``packed=True`` packs on
every device, as an accelerator does (what a plan of device memory counts), ``False`` on none.
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
    ``version`` mode. :attr:`hits` and :attr:`misses` count the lookups. ``keep_prepared``: hold the prepared GEMM
    operands too (off by default: their memory, in the module's docstring). ``packed``: hold the quantizations packed
    (True), as they are (False), or packed except for CPU weights off the Triton path (None, the default).
    """

    def __init__(
        self,
        mode: WeightCaching | str = WeightCaching.VERSION,
        *,
        keep_prepared: bool = False,
        packed: bool | None = None,
    ) -> None:
        self.mode = WeightCaching(mode)
        self.keep_prepared = keep_prepared
        self.packed = packed
        self._entries: dict[Operand, tuple[weakref.ref, tuple, PackedQuantized | QuantizedTensor, object | None]] = {}
        self.hits = 0
        self.misses = 0

    def get(
        self,
        operand: Operand,
        weight: torch.Tensor,
        step: int | None,
        make: Callable[[], QuantizedTensor],
        prepare: Callable[[QuantizedTensor], object | None] | None = None,
        *,
        kernel: bool | None = None,
    ) -> tuple[QuantizedTensor, object | None]:
        """The quantization of ``weight`` for ``operand`` under weight epoch ``step`` and its prepared GEMM operand:
        the held ones while the key holds, else ``make()`` and ``prepare(q)`` (then held, the quantization in
        packed form, unless caching is off; the prepared operand only with ``keep_prepared``). Without caching, or
        without ``prepare``, the prepared operand is None (the GEMM prepares its own). ``kernel``: how to pack and
        unpack (``QuantizedTensor.pack``)."""
        if self.mode is WeightCaching.OFF:
            return make(), None
        # host metadata only: the version counter and storage pointer catch in-place updates and `.data` swaps
        key = (step,) if self.mode is WeightCaching.STEP else (step, weight._version, weight.data_ptr())
        entry = self._entries.get(operand)
        if entry is not None and entry[1] == key and (self.mode is WeightCaching.STEP or entry[0]() is weight):
            self.hits += 1
            held = entry[2]
            return (held.unpack(kernel=kernel) if isinstance(held, PackedQuantized) else held), entry[3]
        self.misses += 1
        self._entries.pop(operand, None)  # the stale entry goes before the new one is made (peak memory)
        q = make()
        prepared = prepare(q) if prepare is not None and self.keep_prepared else None
        # by default, packed except for CPU weights off the Triton path (whose CPU run stands for a device's)
        packed = (weight.device.type != "cpu" or kernel is True) if self.packed is None else self.packed
        self._entries[operand] = (weakref.ref(weight), key, q.pack(kernel=kernel) if packed else q, prepared)
        return q, prepared

    @property
    def nbytes(self) -> int:
        """Bytes the held quantizations (packed or not) and prepared operands take."""
        return sum(_nbytes(entry[2]) + getattr(entry[3], "nbytes", 0) for entry in self._entries.values())

    def clear(self) -> None:
        self._entries.clear()


def _nbytes(held: PackedQuantized | QuantizedTensor) -> int:
    """Bytes of a held quantization's tensors (each distinct storage once: an unpacked copy's views share some)."""
    if isinstance(held, PackedQuantized):
        return held.nbytes
    storages = {}
    for value in vars(held).values():
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())
