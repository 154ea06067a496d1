"""Stopping a run cleanly on request: a checkpoint at the end of the current step, then exit for a later resume.

A cluster stops a job with a signal: SIGTERM on preemption or ``scancel``, or ahead of the time limit when the job
asked for one (SLURM's ``--signal``: cluster/config.yaml sends TERM 900 s before it; SIGUSR1 is honoured the same
way). :class:`StopRequests` turns either into a flag that the loop reads between steps; a signal handler never runs
a collective, and with many processes the ranks agree on the flag (an all-reduce), so all of them checkpoint and
stop at the same step. The loop then raises :class:`Stopped`, whose exit status (128 + the signal number) tells the
scheduler the job was stopped; the same command resumes it.
"""

from __future__ import annotations

import signal
from typing import Any

import torch
import torch.distributed as dist

from ue5m3.training.ranks import world

__all__ = ["Stopped", "StopRequests"]


class Stopped(SystemExit):
    """The run was asked to stop (SIGTERM: a preemption or ``scancel``; SIGUSR1: SLURM's ``--signal`` before the time
    limit) and wrote a checkpoint first; the same command resumes it. Exit status 128 + the signal number."""


class StopRequests:
    """SIGTERM and SIGUSR1 set a flag that the loop reads between steps (a handler never runs a collective)."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequests:
        for signum in self.SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.signum = signum

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def requested(self, device: torch.device) -> int | None:
        """The signal any rank received (all ranks agree, so they checkpoint and stop at the same step)."""
        if world()[1] == 1:
            return self.signum
        flag = torch.tensor([self.signum or 0], dtype=torch.int64, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag) or None
