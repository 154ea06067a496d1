"""Finiteness checks that do not synchronise: recorded on the tensors' device, read once per optimizer step.

A quantizer must refuse non-finite input and name the tensor. Checking with ``bool(...)`` on an accelerator stalls
the stream at every quantization, so the training hot path records each check as a device-side flag keyed by the
tensor's name instead (:meth:`DeferredChecks.defer`). The trainer reads all of them with one host transfer before
the optimizer step (:meth:`DeferredChecks.raise_if_any`), so a bad operand still stops the run, by name, before it
reaches the parameters.
"""

from __future__ import annotations

import torch

__all__ = ["DeferredChecks", "nonfinite_message"]


class DeferredChecks:
    """Named device-side failure flags, folded per name (bounded by the number of call sites)."""

    def __init__(self) -> None:
        self._flags: dict[str, torch.Tensor] = {}
        self._messages: dict[str, str] = {}

    def defer(self, name: str, failed: torch.Tensor, message: str) -> None:
        """Record a 0-dim boolean ``failed`` for ``name``; ``message`` is raised if it turns out true."""
        failed = failed.reshape(()).to(torch.bool)
        previous = self._flags.get(name)
        self._flags[name] = failed if previous is None else previous | failed
        self._messages.setdefault(name, message)

    def __len__(self) -> int:
        return len(self._flags)

    def raise_if_any(self) -> None:
        """Read every pending flag in one transfer and clear them.

        Raises:
            ValueError: the message of the first recorded check that failed.
        """
        if not self._flags:
            return
        names = list(self._flags)
        failed = torch.stack([self._flags[n].to(self._flags[names[0]].device) for n in names]).cpu().tolist()
        messages = [self._messages[n] for n, bad in zip(names, failed, strict=True) if bad]
        self._flags.clear()
        self._messages.clear()
        if messages:
            raise ValueError(messages[0] + (f" (and {len(messages) - 1} more)" if len(messages) > 1 else ""))


def nonfinite_message(name: str) -> str:
    """What a deferred finiteness check of tensor ``name`` raises (the count of bad values is not read back)."""
    return f"tensor {name!r} holds non-finite value(s) (Inf/NaN); quantizers need finite input"
