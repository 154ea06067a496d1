"""Diagnostics of the FP4 linears, accumulated on the device per layer and per operand slot, read once per step.

Each FP4 linear owns one :class:`LinearTelemetry`:

* ``counts``, an int64 tensor [6, 4] on the layer's device: one row per :class:`~ue5m3.layers.recipes.Operand`
  slot (in the enum's order), one column per entry of :data:`COUNTS`. Every GEMM adds the counts of its two
  operands into their rows (:func:`count`): blocks whose scale rounded to zero before repair, blocks whose ideal
  scale saturated the scale format, nonzero blocks that quantized to all zeros, and blocks quantized.
* ``checks``, the deferred finiteness checks of its quantizations and references (:class:`OperandChecks`):
  device-side flags, each stamped with when it was first recorded.

* ``stats``, a float64 tensor [6, 12] on the layer's device, the scale telemetry of the sampled steps (those a run
  logs: :meth:`QuantStats.sample`), one column per entry of :data:`STATS`, added at each quantization
  (:func:`observe`): nonzero blocks, those whose scale sits at the scale format's top value (its max finite) and
  bottom value (its smallest positive), the lowest and highest block scale (log2), the headroom margin
  T * rho / U of Proposition 1 (rho = the tensor's amax over its held reference, U the scale format's max; held
  references only: a refreshed one has rho = 1 by construction), nonzero input elements and those in E2M1's dead
  zone (round to nearest would flush them to zero: |x / S| <= 1/4), and for stochastically rounded operands the
  dead-zone elements stochastic rounding kept nonzero (the SR share).

Nothing is read back to the host until a reader asks. :class:`QuantStats` is the model-level reader (what
:func:`~ue5m3.layers.linear.find_quant_stats` returns): :meth:`QuantStats.pop` sums every layer's counts, and gives
the scale telemetry per linear and operand role, from one transfer and resets them; ``QuantStats.checks.raise_if_any()``
reads every layer's flags in one transfer and raises the first failure in the order the checks were made across the
model, as one shared :class:`~ue5m3.numerics.checks.DeferredChecks` would. :meth:`QuantStats.sample` turns the
sampled telemetry on for the steps a run logs (the training loop: the others pay nothing for it).

The rows keep what a per-layer, per-operand report needs. The fprop rows are written by the forward pass only,
the other four by the backward pass only (the wgrad copy of X, quantized in the forward pass, is counted when the
wgrad GEMM consumes it), so a forward pass recomputed under activation checkpointing touches only the fprop rows
and is left uncounted by resolving its call with a scratch accumulator: whoever recomputes a forward pass does it
inside :func:`recomputing`, and :func:`is_recomputing` tells the layer (:meth:`LinearTelemetry.scratch_on`; its
checks go to a throw-away :class:`OperandChecks`, since the first forward pass made them already, and it samples no
telemetry). The sampled telemetry is recorded where each operand is quantized (X's wgrad copy in the forward pass, a
cached weight once per step), the counts where each GEMM consumes it.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ue5m3.layers.recipes import Operand
from ue5m3.numerics.checks import DeferredChecks
from ue5m3.numerics.quantize import QuantizedTensor
from ue5m3.numerics.scale_rules import FP32_MAX
from ue5m3.numerics.scaling import OperandRole

__all__ = [
    "COUNTS",
    "OperandChecks",
    "raise_pending",
    "LinearTelemetry",
    "ModelChecks",
    "QuantStats",
    "count",
    "STATS",
    "TelemetrySample",
    "observe",
    "ROLE_FIELDS",
    "recomputing",
    "is_recomputing",
]

COUNTS = ("zero_rounded_blocks", "saturated_blocks", "underflowed_blocks", "quantized_blocks")
"""The columns of a layer's counts (and the keys of :meth:`QuantStats.pop`)."""

STATS = (
    "sampled_quantizations",
    "nonzero_blocks",
    "top_code_blocks",
    "bottom_code_blocks",
    "nonzero_elements",
    "dead_zone_elements",
    "sr_elements",
    "sr_dead_zone_elements",
    "sr_rescued_elements",
    "scale_log2_min",
    "scale_log2_max",
    "headroom_margin",
)
"""The columns of a layer's sampled scale telemetry: the first nine are summed, ``scale_log2_min`` is a running
minimum, the last two running maxima (:func:`observe`)."""

_SUMMED = 9
_EMPTY_STATS = (0.0,) * _SUMMED + (math.inf, -math.inf, -math.inf)  # what the accumulators start from

ROLE_FIELDS = (
    "quantized_blocks",
    "zero_rounded_blocks",
    "saturated_blocks",
    "underflowed_blocks",
    "scale_log2_min",
    "scale_log2_max",
    "top_code_share",
    "bottom_code_share",
    "headroom_margin",
    "dead_zone_share",
    "sr_share",
)
"""What :meth:`QuantStats.pop` reports per linear and operand role (``telemetry``): the block counts since the last
pop (every step), then the sampled step's scale telemetry (None where nothing defines it)."""

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
    if counts.device.type == "cpu":  # read on the host (free there) and added through a NumPy view: no tensor ops
        blocks = (q.zero_rounded_blocks, q.saturated_blocks, q.underflowed_blocks)
        counts.numpy()[_ROWS[operand]] += (*(int(n) for n in blocks), q.scale_values.numel())
        return
    row = counts[_ROWS[operand]]
    row[0] += q.zero_rounded_blocks
    row[1] += q.saturated_blocks
    row[2] += q.underflowed_blocks
    row[3] += q.scale_values.numel()


@dataclass(frozen=True, eq=False)
class TelemetrySample:
    """Where one call of a layer records the scale telemetry of a sampled step: its ``stats`` accumulator,
    ``held(role)``, whether the role's reference in this step is a held one (the layer's scale state decides), and
    ``weights_seen``, the weight slots already recorded in this weight epoch (a weight is recorded once per slot and
    step, however often it is quantized: the cache's misses differ with activation checkpointing, its bits do not)."""

    stats: torch.Tensor
    held: Callable[[OperandRole], bool]
    weights_seen: set[Operand]


def _as_stat(value: torch.Tensor | float, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(value, dtype=torch.float64, device=device).reshape(())


def observe(
    sample: TelemetrySample,
    operand: Operand,
    q: QuantizedTensor,
    source: torch.Tensor,
    *,
    stochastic: bool,
    held: bool,
) -> None:
    """Add the scale telemetry of ``q``, the quantization of ``source`` for ``operand``, into its row of
    ``sample.stats`` (on the device; nothing is read back).

    Args:
        sample: the call's accumulator.
        operand: the slot quantized.
        q: its quantization.
        source: the tensor as the quantizer received it (transposed, or Hadamard-transformed, as the slot's was),
            so that ``q.layout`` cuts it into ``q``'s blocks.
        stochastic: whether ``q``'s payload was stochastically rounded (its dead zone is measured on the scaled
            input, and the dead-zone elements it kept nonzero are its SR share).
        held: whether ``q``'s tensor reference was a held one (only those give a headroom margin).
    """
    row = sample.stats[_ROWS[operand]]
    device = row.device
    fmt = q.scheme.scale
    scales, nonzero = q.scale_values, q.block_amax > 0
    positive = nonzero & (scales > 0)  # an unrepaired zero scale (NVFP4) is counted as zero-rounded, not here
    log2 = torch.log2(torch.where(positive, scales, torch.ones_like(scales)).to(torch.float64))  # exact for 2^k
    low = torch.where(positive, log2, torch.full_like(log2, math.inf)).amin()
    high = torch.where(positive, log2, torch.full_like(log2, -math.inf)).amax()
    nonzero_elements = torch.count_nonzero(source)
    zero = torch.zeros((), dtype=torch.int64, device=device)
    if stochastic and device.type == "cpu" and q.payload_blocks.device.type == "cpu" and _cpu_kernel_available():
        from ue5m3.numerics.kernels import cpu as cpu_kernel

        # the C kernel's one pass over the same FP32 operations as the torch ops below
        dead, kept = cpu_kernel.dead_zone_counts(
            q.layout.to_blocks(source.to(torch.float32)), q.decode_scales_blocks, q.payload_blocks
        )
        dead_zone, rescued, sr_elements = (torch.tensor(dead), torch.tensor(kept), nonzero_elements)
    elif stochastic:
        # the dead zone of round to nearest, on the scaled input as the encoder forms it (reciprocal, then multiply)
        x = q.layout.to_blocks(source.to(torch.float32))
        scaled = x * torch.clamp(torch.reciprocal(q.decode_scales_blocks), max=FP32_MAX)
        dead = (scaled.abs() <= 0.25) & (x != 0)
        dead_zone, rescued, sr_elements = dead.sum(), (dead & (q.payload_blocks != 0)).sum(), nonzero_elements
    else:  # under round to nearest an element is zero exactly when it is in the dead zone
        dead_zone = nonzero_elements - torch.count_nonzero(q.payload_blocks)
        rescued, sr_elements = zero, zero
    margin = torch.full((), -math.inf, dtype=torch.float64, device=device)
    if held and q.scheme.uses_tensor_amax:  # T * rho / U, rho = current amax / held reference (Proposition 1)
        amax, g = q.block_amax.max().to(torch.float64), q.tensor_amax.to(torch.float64)
        rho = torch.where(g > 0, amax / torch.where(g > 0, g, 1.0), torch.where(amax > 0, FP32_MAX, 0.0))
        margin = rho * (float(q.scheme.target) / fmt.max_finite)
    sums = (
        1.0,
        nonzero.sum(),
        (nonzero & (scales == fmt.max_finite)).sum(),
        (nonzero & (scales == fmt.min_positive)).sum(),
        nonzero_elements,
        dead_zone,
        sr_elements,
        dead_zone if stochastic else zero,
        rescued,
    )
    row[:_SUMMED] += torch.stack([_as_stat(v, device) for v in sums])
    row[_SUMMED] = torch.minimum(row[_SUMMED], low)
    row[_SUMMED + 1 :] = torch.maximum(row[_SUMMED + 1 :], torch.stack([high, margin]))


def _cpu_kernel_available() -> bool:
    from ue5m3.numerics.kernels import cpu as cpu_kernel

    return cpu_kernel.available()


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
    """The diagnostics one FP4 linear accumulates: ``counts`` (None until its first call), ``stats`` (None until its
    first sampled call) and ``checks``; ``sampling`` says whether its calls now record ``stats``."""

    def __init__(self) -> None:
        self.counts: torch.Tensor | None = None
        self.stats: torch.Tensor | None = None
        self.sampling = False
        self.checks = OperandChecks()
        self._scratch: torch.Tensor | None = None
        self._weights_seen: tuple[object, set[Operand]] = (None, set())

    def stats_on(self, device: torch.device) -> torch.Tensor:
        """The sampled scale telemetry on ``device`` (allocated empty at the first sampled call)."""
        if self.stats is None:
            self.stats = torch.tensor([_EMPTY_STATS] * len(_ROWS), dtype=torch.float64, device=device)
        elif self.stats.device != device:
            self.stats = self.stats.to(device)
        return self.stats

    def counts_on(self, device: torch.device) -> torch.Tensor:
        """The counts on ``device`` (allocated at the first call, moved with the layer)."""
        if self.counts is None:
            self.counts = torch.zeros((len(_ROWS), len(COUNTS)), dtype=torch.int64, device=device)
        elif self.counts.device != device:
            self.counts = self.counts.to(device)
        return self.counts

    def weights_seen(self, epoch: object) -> set[Operand]:
        """The weight slots recorded in weight epoch ``epoch`` (a new epoch starts an empty set)."""
        if self._weights_seen[0] != epoch:
            self._weights_seen = (epoch, set())
        return self._weights_seen[1]

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
    """Running totals of the block-scale diagnostics of a model's FP4 linears (named), and their deferred checks."""

    def __init__(self, linears: Sequence[tuple[str, LinearTelemetry]] | Sequence[LinearTelemetry]) -> None:
        named = [item if isinstance(item, tuple) else (str(i), item) for i, item in enumerate(linears)]
        self._names = tuple(name for name, _ in named)
        self._linears = tuple(t for _, t in named)
        self.checks = ModelChecks([t.checks for t in self._linears])

    def counts(self) -> list[torch.Tensor]:
        """Each layer's counts tensor (on its device; layers not yet called have none)."""
        return [t.counts for t in self._linears if t.counts is not None]

    def sample(self, on: bool) -> None:
        """Record the scale telemetry of the calls from now on (``on``: a step the run logs) or not (set once per
        step, before it; nothing is read back)."""
        for t in self._linears:
            t.sampling = bool(on)

    def pop(self) -> dict[str, Any]:
        """The totals since the last pop, as ints (keys :data:`COUNTS`), and under ``telemetry`` each called linear's
        counts and sampled scale telemetry per operand role (:data:`ROLE_FIELDS`); resets both, read in one transfer
        (raises first if a deferred check failed, then nothing is reset)."""
        self.checks.raise_if_any()
        called = [(name, t) for name, t in zip(self._names, self._linears, strict=True) if t.counts is not None]
        totals = [0] * len(COUNTS)
        telemetry: dict[str, dict[str, dict[str, Any]]] = {}
        if called:
            device = called[0][1].counts.device
            empty = torch.tensor([_EMPTY_STATS] * len(_ROWS), dtype=torch.float64)
            # [layers, slots, counts + stats] in FP64 (counts below 2^53 are exact), one read for the whole model
            rows = torch.stack(
                [
                    torch.cat(
                        [t.counts.to(device, torch.float64), (t.stats if t.stats is not None else empty).to(device)], 1
                    )
                    for _, t in called
                ]
            ).cpu()
            for _, t in called:
                t.counts.zero_()
                if t.stats is not None:
                    t.stats.copy_(empty)
            totals = rows[:, :, : len(COUNTS)].sum(dim=(0, 1)).tolist()
            telemetry = {name: _roles(layer) for (name, _), layer in zip(called, rows, strict=True)}
        out: dict[str, Any] = {key: int(value) for key, value in zip(COUNTS, totals, strict=True)}
        out["telemetry"] = telemetry
        return out


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _roles(layer: torch.Tensor) -> dict[str, dict[str, Any]]:
    """One layer's [slots, counts + stats] rows as :data:`ROLE_FIELDS` per operand role (its two slots together)."""
    out = {}
    for role in OperandRole:
        rows = layer[[_ROWS[o] for o in Operand if o.role is role]]
        counts = dict(zip(COUNTS, rows[:, : len(COUNTS)].sum(0).tolist(), strict=True))
        stats = rows[:, len(COUNTS) :]
        summed = dict(zip(STATS[:_SUMMED], stats[:, :_SUMMED].sum(0).tolist(), strict=True))
        low, high, margin = float(stats[:, _SUMMED].min()), *stats[:, _SUMMED + 1 :].amax(0).tolist()
        blocks = summed["nonzero_blocks"]
        fields: Mapping[str, Any] = {
            **{key: int(counts[key]) for key in ROLE_FIELDS[:4]},
            "scale_log2_min": _finite(low),
            "scale_log2_max": _finite(high),
            "top_code_share": _share(summed["top_code_blocks"], blocks),
            "bottom_code_share": _share(summed["bottom_code_blocks"], blocks),
            "headroom_margin": _finite(margin),
            "dead_zone_share": _share(summed["dead_zone_elements"], summed["nonzero_elements"]),
            "sr_share": _share(summed["sr_rescued_elements"], summed["sr_dead_zone_elements"]),
        }
        out[role.value] = dict(fields)
    return out
