"""Training scale lifecycle: reference amax values for FP4 block quantization.

Block-scaled FP4 formats (UE5M3, NVFP4, MXFP4) quantize each block relative to a per-tensor
*reference* amax (the largest magnitude of the operand). Computing that amax fresh for every
operand of every step ("current scaling") costs a full reduction and, in data-parallel training,
a collective per operand. This module implements the periodic sample-and-hold lifecycle of the
numerics spec section 4 / paper section 5:

* A scale state is keyed by ``(operand role, module name)``; the roles are :class:`OperandRole`.
* Training opens one logical step per optimizer step with :meth:`ScaleState.begin_step`.
* :meth:`ScaleState.reference` *refreshes* a key iff it has no entry yet or
  ``step - last_refresh >= interval``. A refresh takes the float32 amax of the very tensor being
  quantized, so a refresh step quantizes with its own current amax. Between refreshes the held
  value is returned unchanged: this is sample-and-hold, not a rolling maximum.
* Within one step the value fixed at the first call for a key is reused by every later call for
  that key (gradient-accumulation microbatches, a backward pass reusing the forward's key).
* ``interval == 1`` is current scaling.
* On refresh the amax is all-reduced with MAX over the data-parallel group
  (:func:`all_reduce_max`), so every rank quantizes with one reference.
* :meth:`ScaleState.state_dict` / :meth:`ScaleState.load_state_dict` make resumption exact.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import torch
import torch.distributed as dist

from ue5m3.numerics.checks import DeferredChecks

__all__ = ["OperandRole", "ScaleState", "all_reduce_max"]

_STATE_VERSION = 1


class OperandRole(StrEnum):
    """Role of a quantized operand in a linear layer's forward or backward pass."""

    ACTIVATION = "activation"
    WEIGHT = "weight"
    UPSTREAM_GRADIENT = "upstream_gradient"


def all_reduce_max(t: torch.Tensor, group: Any = None) -> torch.Tensor:
    """All-reduce ``t`` in place with MAX across a process group.

    A no-op when ``torch.distributed`` is unavailable or not initialized, so single-process code
    needs no special casing.

    Args:
        t: Tensor to reduce in place. Its device must suit the group's backend (CPU for gloo,
            CUDA for NCCL).
        group: Process group (the data-parallel group); ``None`` means the default group.

    Returns:
        ``t``, holding the element-wise maximum over all ranks of the group.
    """
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t


@dataclass(slots=True)
class _Entry:
    amax: torch.Tensor  # 0-dim float32, finite, >= 0
    last_refresh: int


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _coerce_role(role: object) -> OperandRole:
    if isinstance(role, OperandRole):
        return role
    if isinstance(role, str):
        try:
            return OperandRole(role)
        except ValueError:
            pass
    expected = ", ".join(repr(r.value) for r in OperandRole)
    raise ValueError(f"unknown operand role {role!r}; expected one of {expected}")


def _split_key(key: object) -> tuple[OperandRole, str]:
    if not isinstance(key, str) or "/" not in key:
        raise ValueError(f"malformed scale-state key {key!r}; expected 'role/module'")
    role, module = key.split("/", 1)
    return _coerce_role(role), module


class ScaleState:
    """Reference-amax lifecycle for FP4 block quantization during training.

    One instance serves a whole model: entries are keyed by ``(role, module)``. Call
    :meth:`begin_step` once per optimizer step, then :meth:`reference` for every quantized
    operand. In data-parallel runs every rank must make the same refreshing :meth:`reference`
    calls in the same order, since each refresh is a collective.

    Resuming: the default ``load_state_dict(sd)`` (warm) restores the interval check, the last
    opened step and, per key, the held amax bits and last refresh step, so a run resumed at any
    step, also between refreshes, reproduces the uninterrupted run exactly.
    ``load_state_dict(sd, cold=True)`` reproduces the paper authors' cold-cache resume: only the
    step counter is restored and every key refreshes at its first use after the resume. This
    changes the references whenever the resume falls between refreshes, and even resuming cold
    at a multiple of the interval keeps the cadence only approximately: the refresh happens at
    the first use after resume, which shifts the phase of keys first seen at other steps (or not
    used at the step right after the resume). Only the warm default is exact.

    Args:
        interval: Refresh interval D in optimizer steps (int >= 1); 1 is current scaling.
        group: Data-parallel process group for the MAX all-reduce on refresh; ``None`` means the
            default group (ignored when ``torch.distributed`` is not initialized).

    Raises:
        ValueError: If ``interval`` is not an int >= 1.
    """

    def __init__(self, interval: int, *, group: Any = None) -> None:
        if not _is_int(interval) or interval < 1:
            raise ValueError(f"interval must be an int >= 1, got {interval!r}")
        self._interval = interval
        self._group = group
        self._step: int | None = None
        self._entries: dict[tuple[OperandRole, str], _Entry] = {}

    @property
    def interval(self) -> int:
        """Refresh interval D in optimizer steps."""
        return self._interval

    @property
    def step(self) -> int | None:
        """The last step opened with :meth:`begin_step`, or ``None`` before the first."""
        return self._step

    @property
    def weight_epoch(self) -> int | None:
        """Changes whenever a weight reference may have changed (each step): what a held weight quantization is
        keyed on."""
        return self._step

    def begin_step(self, step: int) -> None:
        """Open a logical step; call once per optimizer step before any :meth:`reference`.

        Args:
            step: Positive int, strictly greater than the previously opened step (gaps allowed).

        Raises:
            ValueError: If ``step`` is not an int (bools rejected), is <= 0, or is not strictly
                greater than the previous step.
        """
        if not _is_int(step):
            raise ValueError(f"step must be an int, got {step!r}")
        if step <= 0:
            raise ValueError(f"step must be positive, got {step!r}")
        if self._step is not None and step <= self._step:
            raise ValueError(f"step must be strictly greater than the previous step {self._step!r}, got {step!r}")
        self._step = step

    def reference(
        self, role: OperandRole | str, module: str, tensor: torch.Tensor, checks: DeferredChecks | None = None
    ) -> torch.Tensor:
        """Return the reference amax for quantizing ``tensor`` as ``(role, module)`` this step.

        Refreshes iff the key has no entry or ``step - last_refresh >= interval``: the amax
        (max |x| in float32) of ``tensor`` is taken, all-reduced with MAX over the group and
        held. Otherwise (including later calls for the key within the same step) the held
        value is returned and ``tensor`` is not inspected.

        Args:
            role: Operand role, an :class:`OperandRole` or its exact string value.
            module: Module name, e.g. ``"model.layers.0.mlp.up_proj"``.
            tensor: The tensor about to be quantized.
            checks: record the refreshed amax's finiteness on its device instead of reading it now (the
                training hot path; :meth:`DeferredChecks.raise_if_any` raises later with the same message).

        Returns:
            A fresh 0-dim float32 tensor on ``tensor``'s device.

        Raises:
            RuntimeError: If no step has been opened with :meth:`begin_step`.
            ValueError: If ``role`` is unknown, or the refreshed amax is not finite on any rank
                (the state is then left unchanged).
            TypeError: If ``module`` is not a str or ``tensor`` is not a tensor.
        """
        if self._step is None:
            raise RuntimeError(
                "ScaleState.reference() called before begin_step(); open a step with "
                "begin_step(step) once per optimizer step first"
            )
        role = _coerce_role(role)
        if not isinstance(module, str):
            raise TypeError(f"module must be a str, got {module!r}")
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
        key = (role, module)
        entry = self._entries.get(key)
        if entry is None or self._step - entry.last_refresh >= self._interval:
            entry = _Entry(self._refresh(role, module, tensor, checks), self._step)
            self._entries[key] = entry
        return entry.amax.to(device=tensor.device, copy=True)

    def is_held(self, role: OperandRole | str, module: str) -> bool:
        """Whether ``(role, module)``'s reference in the open step is a held one, taken at an earlier step (False
        for a key refreshed this step, or never seen): what a stale-reference diagnostic asks."""
        entry = self._entries.get((_coerce_role(role), module))
        return entry is not None and self._step is not None and entry.last_refresh < self._step

    def _refresh(
        self, role: OperandRole, module: str, tensor: torch.Tensor, checks: DeferredChecks | None = None
    ) -> torch.Tensor:
        with torch.no_grad():
            x = tensor.detach()
            if x.numel() == 0:
                local = torch.zeros((), dtype=torch.float32, device=x.device)
            else:
                # Rounding to float32 is monotone, so max-then-cast equals cast-then-max.
                local = x.abs().amax().to(torch.float32)
            # NaN has no defined order under a MAX reduction: map it to +inf so that every rank
            # sees a non-finite result and raises together instead of diverging.
            reduced = torch.where(torch.isnan(local), torch.full_like(local, math.inf), local)
            reduced = all_reduce_max(reduced, self._group)
            if checks is not None:
                checks.defer(
                    f"{module}.{role.value}.amax",
                    ~torch.isfinite(reduced),
                    f"non-finite amax for role {role.value!r}, module {module!r} at step {self._step!r}",
                )
            elif not math.isfinite(reduced.item()):
                raise ValueError(
                    f"non-finite amax for role {role.value!r}, module {module!r} at step "
                    f"{self._step!r}: local amax {local.item()!r}, reduced amax {reduced.item()!r}"
                )
        return reduced

    def state_dict(self) -> dict[str, Any]:
        """Return the state as plain Python values and CPU tensors.

        Loadable with ``torch.load(..., weights_only=True)``. Keys of ``"entries"`` are
        ``"role/module"`` strings; each value holds the 0-dim float32 ``"amax"`` (exact bits)
        and the int ``"last_refresh"`` step.

        Returns:
            A dict with ``"version"``, ``"interval"``, ``"step"`` and ``"entries"``.
        """
        entries = {
            f"{role.value}/{module}": {
                "amax": entry.amax.detach().to("cpu", copy=True),
                "last_refresh": entry.last_refresh,
            }
            for (role, module), entry in self._entries.items()
        }
        return {"version": _STATE_VERSION, "interval": self._interval, "step": self._step, "entries": entries}

    def load_state_dict(self, state_dict: Mapping[str, Any], *, cold: bool = False) -> None:
        """Restore a state produced by :meth:`state_dict`.

        The whole dict is validated before anything is replaced.

        Args:
            state_dict: The saved state.
            cold: If true, restore only the step counter and drop every held amax, so each key
                refreshes at its first use after the resume (the paper authors' cold-cache
                resume; not exact, see the class docstring). The default (warm) is exact.

        Raises:
            ValueError: If the interval differs from this instance's, a role is unknown, or the
                dict is otherwise malformed.
        """
        if not isinstance(state_dict, Mapping):
            raise ValueError(f"state_dict must be a mapping, got {type(state_dict).__name__}")
        missing = {"version", "interval", "step", "entries"} - state_dict.keys()
        if missing:
            raise ValueError(f"state_dict is missing keys {sorted(missing)!r}")
        if state_dict["version"] != _STATE_VERSION:
            raise ValueError(f"unsupported state_dict version {state_dict['version']!r}")
        interval = state_dict["interval"]
        if interval != self._interval or not _is_int(interval):
            raise ValueError(f"state_dict interval {interval!r} does not match this state's {self._interval!r}")
        step = state_dict["step"]
        if step is not None and (not _is_int(step) or step <= 0):
            raise ValueError(f"state_dict step must be None or a positive int, got {step!r}")
        raw = state_dict["entries"]
        if not isinstance(raw, Mapping):
            raise ValueError(f"state_dict entries must be a mapping, got {type(raw).__name__}")
        if raw and step is None:
            raise ValueError("state_dict has entries but no opened step")
        entries: dict[tuple[OperandRole, str], _Entry] = {}
        for key, value in raw.items():
            role, module = _split_key(key)
            if not isinstance(value, Mapping) or {"amax", "last_refresh"} - value.keys():
                raise ValueError(f"entry {key!r} must map 'amax' and 'last_refresh', got {value!r}")
            amax, last = value["amax"], value["last_refresh"]
            if not (
                isinstance(amax, torch.Tensor)
                and amax.dtype == torch.float32
                and amax.dim() == 0
                and math.isfinite(amax.item())
                and amax.item() >= 0
            ):
                raise ValueError(
                    f"entry {key!r}: amax must be a finite, non-negative 0-dim float32 tensor, got {amax!r}"
                )
            if not _is_int(last) or not 0 < last <= step:
                raise ValueError(f"entry {key!r}: last_refresh must be an int in [1, {step!r}], got {last!r}")
            entries[(role, module)] = _Entry(amax.detach().to("cpu", copy=True), last)
        self._step = step
        self._entries = {} if cold else entries

    def reset(self) -> None:
        """Drop every held amax and the step counter, as if freshly constructed."""
        self._step = None
        self._entries = {}

    def __repr__(self) -> str:
        return f"ScaleState(interval={self._interval!r}, step={self._step!r}, keys={len(self._entries)})"
