"""Live bytes of every tensor an op creates, on any device: the allocation tracing the plan's memory counts rest on.

:class:`LiveBytes` is a ``TorchDispatchMode``: every op that runs under it (forward, autograd's backward, a
checkpoint's recomputation) hands it its outputs, and it counts each output's storage once, from the op that created
it until the storage is freed (a weak reference's finalizer). Views and in-place results share a storage already
counted; storages that existed before (parameters, inputs) are named in ``exclude`` and never counted. On the
``meta`` device storages have sizes but no memory, so the same count gives what a device would allocate; on the CPU
it gives what the step really allocated (tests/test_plan.py compares the two).

0-dim tensors are not counted: the flags and scalars of the bookkeeping (finiteness checks, amax references),
whose number differs between backends (the CPU kernel keeps a few more check flags than the Triton path) and whose
bytes are a few hundred per layer. What it does not see: allocator rounding and caching (the CUDA caching
allocator rounds to 512-byte blocks and keeps freed blocks; the plan adds a stated reserve for that), and memory a
kernel allocates outside torch.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["LiveBytes", "storage_bytes"]


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors``."""
    seen = WeakIdKeyDictionary()
    total = 0
    for t in tensors:
        storage = t.untyped_storage()
        if storage not in seen:
            seen[storage] = True
            total += storage.nbytes()
    return total


class LiveBytes(TorchDispatchMode):
    """Counts the bytes alive in storages created by ops under the mode: :attr:`live` now and :attr:`peak` since
    the last :meth:`reset_peak`.

    Args:
        exclude: tensors whose storages are never counted (the parameters, the inputs).
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        super().__init__()
        self._known = WeakIdKeyDictionary()
        for t in exclude:
            self._known[t.untyped_storage()] = 0
        self.live = 0
        self.peak = 0

    def reset_peak(self) -> None:
        self.peak = self.live

    def _count(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        if storage in self._known:
            return
        size = storage.nbytes()
        self._known[storage] = size
        self.live += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._release, size)

    def _release(self, size: int) -> None:
        self.live -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
                self._count(leaf)
        return out
