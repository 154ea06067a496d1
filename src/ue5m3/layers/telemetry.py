"""Diagnostics of the FP4 linears, accumulated on the device per layer and per operand slot, read once per step.

Each FP4 linear owns one :class:`LinearTelemetry`:

* ``counts``, an int64 tensor [6, 4] on the layer's device: one row per :class:`~ue5m3.layers.recipes.Operand`
  slot (in the enum's order), one column per entry of :data:`COUNTS`. Every GEMM adds the counts of its two
  operands into their rows (:func:`count`): blocks whose scale rounded to zero before repair, blocks whose ideal
  scale saturated the scale format, nonzero blocks that quantized to all zeros, and blocks quantized.
* ``checks``, the deferred finiteness checks of its quantizations and references (:class:`OperandChecks`):
  device-side flags, each stamped with when it was first recorded.

Nothing is read back to the host until a reader asks. :class:`QuantStats` is the model-level reader (what
:func:`~ue5m3.layers.linear.find_quant_stats` returns): :meth:`QuantStats.pop` sums every layer's counts in one
transfer and resets them, and ``QuantStats.checks.raise_if_any()`` reads every layer's flags in one transfer and
raises the first failure in the order the checks were made across the model, as one shared
:class:`~ue5m3.numerics.checks.DeferredChecks` would.

The rows keep what a per-layer, per-operand report needs. The fprop rows are written by the forward pass only,
the other four by the backward pass only (the wgrad copy of X, quantized in the forward pass, is counted when the
wgrad GEMM consumes it), so a forward pass recomputed under activation checkpointing touches only the fprop rows
and is left uncounted by resolving its call with a scratch accumulator: whoever recomputes a forward pass does it
inside :func:`recomputing`, and :func:`is_recomputing` tells the layer (:meth:`LinearTelemetry.scratch_on`; its
checks go to a throw-away :class:`OperandChecks`, since the first forward pass made them already).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator, Sequence

import torch

from ue5m3.layers.recipes import Operand
from ue5m3.numerics.checks import DeferredChecks
from ue5m3.numerics.quantize import QuantizedTensor

__all__ = [
    "COUNTS",
    "OperandChecks",
    "raise_pending",
    "LinearTelemetry",
    "ModelChecks",
    "QuantStats",
    "count",
    "recomputing",
    "is_recomputing",
]

COUNTS = ("zero_rounded_blocks", "saturated_blocks", "underflowed_blocks", "quantized_blocks")
"""The columns of a layer's counts (and the keys of :meth:`QuantStats.pop`)."""

_ROWS = {operand: row for row, operand in enumerate(Operand)}

_ORDER = itertools.count()  # when a check was first recorded, across every layer of the process

# how many recomputations enclose the running code, per thread: the autograd engine runs a CUDA backward pass (and
# with it the recomputation it triggers) on its own thread
_RECOMPUTE = threading.local()


@contextlib.contextmanager
def recomputing() -> Iterator[None]:
    """Mark the forward passes run inside as recomputations of forward passes already made (activation
    checkpointing): the FP4 linears count nothing and defer no check in them (:func:`is_recomputing`)."""
    depth = getattr(_RECOMPUTE, "depth", 0)
    _RECOMPUTE.depth = depth + 1
    try:
        yield
    finally:
        _RECOMPUTE.depth = depth


def is_recomputing() -> bool:
    """Whether the running code is inside :func:`recomputing` (on this thread)."""
    return getattr(_RECOMPUTE, "depth", 0) > 0


def count(counts: torch.Tensor, operand: Operand, q: QuantizedTensor) -> None:
    """Add the block counts of ``q``, quantized for ``operand``, into its row of ``counts`` (on the device)."""
    row = counts[_ROWS[operand]]
    row[0] += q.zero_rounded_blocks
    row[1] += q.saturated_blocks
    row[2] += q.underflowed_blocks
    row[3] += q.scale_values.numel()


class OperandChecks(DeferredChecks):
    """One layer's deferred finiteness checks: a device-side failure flag per name (folded per name, so bounded by
    the call sites), each stamped with when it was first recorded since the last read. A
    :class:`~ue5m3.numerics.checks.DeferredChecks`, so quantizers and scale states record into it as into any."""

    def __init__(self) -> None:
        super().__init__()  # its own tables stay empty: every check is held here with its stamp
        self._pending: dict[str, tuple[int, torch.Tensor, str]] = {}

    def defer(self, name: str, failed: torch.Tensor, message: str) -> None:
        """Record a 0-dim boolean ``failed`` for ``name``; ``message`` is raised if it turns out true."""
        failed = failed.reshape(()).to(torch.bool)
        held = self._pending.get(name)
        self._pending[name] = (next(_ORDER), failed, message) if held is None else (held[0], held[1] | failed, held[2])

    def __len__(self) -> int:
        return len(self._pending)

    def raise_if_any(self) -> None:
        """Read this layer's pending flags in one transfer and clear them (see :func:`raise_pending`)."""
        raise_pending([self])

    def drain(self) -> list[tuple[int, str, torch.Tensor, str]]:
        """The pending checks as (stamp, name, flag, message), cleared from here."""
        out = [(order, name, flag, message) for name, (order, flag, message) in self._pending.items()]
        self._pending.clear()
        return out


def raise_pending(checks: Sequence[OperandChecks]) -> None:
    """Read every pending flag of ``checks`` in one transfer and clear them.

    Raises:
        ValueError: the message of the first recorded check that failed, across all of them (and how many more
            did), as one shared :class:`~ue5m3.numerics.checks.DeferredChecks` would have raised.
    """
    pending = sorted((entry for c in checks for entry in c.drain()), key=lambda entry: entry[0])
    merged = DeferredChecks()
    for _, name, flag, message in pending:
        merged.defer(name, flag, message)
    merged.raise_if_any()


class LinearTelemetry:
    """The diagnostics one FP4 linear accumulates: ``counts`` (None until its first call) and ``checks``."""

    def __init__(self) -> None:
        self.counts: torch.Tensor | None = None
        self.checks = OperandChecks()
        self._scratch: torch.Tensor | None = None

    def counts_on(self, device: torch.device) -> torch.Tensor:
        """The counts on ``device`` (allocated at the first call, moved with the layer)."""
        if self.counts is None:
            self.counts = torch.zeros((len(_ROWS), len(COUNTS)), dtype=torch.int64, device=device)
        elif self.counts.device != device:
            self.counts = self.counts.to(device)
        return self.counts

    def scratch_on(self, device: torch.device) -> torch.Tensor:
        """An accumulator shaped like the counts that nothing reads: where a recomputed forward pass counts."""
        if self._scratch is None or self._scratch.device != device:
            self._scratch = torch.zeros((len(_ROWS), len(COUNTS)), dtype=torch.int64, device=device)
        return self._scratch


class ModelChecks:
    """The deferred checks of a model's FP4 linears, read together."""

    def __init__(self, checks: Sequence[OperandChecks]) -> None:
        self._checks = tuple(checks)

    def __len__(self) -> int:
        return sum(len(c) for c in self._checks)

    def raise_if_any(self) -> None:
        """Read every pending flag in one transfer and clear them (see :func:`raise_pending`)."""
        raise_pending(self._checks)


class QuantStats:
    """Running totals of the block-scale diagnostics of a model's FP4 linears, and their deferred checks."""

    def __init__(self, linears: Sequence[LinearTelemetry]) -> None:
        self._linears = tuple(linears)
        self.checks = ModelChecks([t.checks for t in self._linears])

    def counts(self) -> list[torch.Tensor]:
        """Each layer's counts tensor (on its device; layers not yet called have none)."""
        return [t.counts for t in self._linears if t.counts is not None]

    def pop(self) -> dict[str, int]:
        """The totals since the last pop, as ints (keys :data:`COUNTS`); resets the counts (raises first if a
        deferred check failed, then nothing is reset)."""
        self.checks.raise_if_any()
        held = self.counts()
        totals = [0] * len(COUNTS)
        if held:
            device = held[0].device
            totals = torch.stack([c.to(device) for c in held]).sum(dim=(0, 1)).tolist()
            for c in held:
                c.zero_()
        return {key: int(value) for key, value in zip(COUNTS, totals, strict=True)}
