"""Stopping a run cleanly on request, and rolling checkpoints by wall time.

A cluster stops a job with a signal: SIGTERM on preemption or ``scancel``, or ahead of the time limit when the job
asked for one (SLURM's ``--signal``: cluster/config.yaml sends TERM 900 s before it; SIGUSR1 is honoured the same
way); a person at a terminal presses Ctrl-C (SIGINT). :class:`StopRequests` turns any of them into a flag that the
loop reads between steps; a signal handler never runs a collective, and with many processes the ranks agree on the
flag (one all-reduce per step), so all of them checkpoint and stop at the same step. The loop then raises
:class:`Stopped`, whose exit status (128 + the signal number) tells the scheduler the job was stopped; the same
command resumes it.

A second Ctrl-C stops at once (:class:`Interrupted`, exit status 130): the step in progress and a save in progress
are given up (a save leaves no partial checkpoint), and the newest checkpoint is where the rerun resumes. A SIGINT
less than :data:`SAME_INTERRUPT_S` after the first counts as the same Ctrl-C: a launcher that forwards the
terminal's SIGINT (torchrun does) delivers it to a worker twice, once from the terminal and once from itself.

Under ``srun ... torchrun``, SLURM signals every process of the job step: each torchrun agent and its workers.
The workers checkpoint; torchrun forwards the signal and kills its workers after its ``--shutdown-timeout``
(30 s by default in torch 2.13), so the launcher of ``config/paper.yaml`` sets it to the profile's signal margin
(``{signal_margin_s}``, :func:`ue5m3.pipeline.jobs.launcher`) and lets torchrun handle SIGUSR1 too (by default
torchrun dies of it at once, and srun then kills its workers).

:class:`WallClockCheckpoints` asks for a checkpoint once ``checkpoint_every_minutes`` have passed since the run
started or last saved, which bounds the work lost when a node dies without warning (no signal at all). The ranks
agree on it in the same all-reduce as the stop flag. Saving changes nothing of the run's state, so a run resumed
from such a checkpoint equals the uninterrupted one, and how often a run checkpoints is not part of its identity.
"""

from __future__ import annotations

import dataclasses
import math
import signal
from time import monotonic
from typing import Any

import torch
import torch.distributed as dist

from ue5m3.training.ranks import world

__all__ = ["Stopped", "Interrupted", "StopRequests", "Poll", "WallClockCheckpoints", "SAME_INTERRUPT_S"]

SAME_INTERRUPT_S = 1.0
"""A SIGINT this soon after the first is the same Ctrl-C forwarded by a launcher, not a second one."""


class Stopped(SystemExit):
    """The run was asked to stop (SIGTERM: a preemption or ``scancel``; SIGUSR1: SLURM's ``--signal`` before the time
    limit; SIGINT: Ctrl-C) and wrote a checkpoint first; the same command resumes it. Exit status 128 + the signal
    number."""


class Interrupted(KeyboardInterrupt):
    """A second Ctrl-C: the run stopped at once, without a checkpoint of the step in progress (the newest
    checkpoint is where the same command resumes)."""


@dataclasses.dataclass(frozen=True)
class Poll:
    """What the ranks agreed on after a step: the signal any of them received (None: none), and whether any asked
    for a wall-time checkpoint."""

    signum: int | None
    checkpoint_due: bool


class StopRequests:
    """SIGTERM, SIGUSR1 and SIGINT set a flag that the loop reads between steps (a handler never runs a collective);
    a second SIGINT raises :class:`Interrupted` at once."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._interrupted_at: float | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequests:
        for signum in self.SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT:
            now = monotonic()
            if self._interrupted_at is None:
                self._interrupted_at = now
            elif now - self._interrupted_at >= SAME_INTERRUPT_S:
                raise Interrupted("a second Ctrl-C: stopped at once, without a checkpoint of the step in progress")
        if self.signum is None:  # the first request names the stop
            self.signum = signum

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def poll(self, device: torch.device, *, checkpoint_due: bool = False) -> Poll:
        """The signal any rank received and whether any rank's wall-time checkpoint is due: one MAX all-reduce, so
        that all ranks checkpoint and stop at the same step."""
        if world()[1] == 1:
            return Poll(self.signum, checkpoint_due)
        flags = torch.tensor([self.signum or 0, int(checkpoint_due)], dtype=torch.int64, device=device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        signum, due = (int(v) for v in flags.tolist())
        return Poll(signum or None, bool(due))


class WallClockCheckpoints:
    """Rolling checkpoints by wall time: due once ``minutes`` have passed since the run started or last saved
    (``checkpoint_every_minutes``; 0: never). The clock is ``time.monotonic`` (immune to clock changes)."""

    def __init__(self, minutes: float) -> None:
        if not 0 <= minutes < math.inf:
            raise ValueError(f"checkpoint_every_minutes: must be >= 0 and finite (0: off), got {minutes!r}")
        self.seconds = 60.0 * minutes
        self._last = monotonic()

    def due(self) -> bool:
        """Whether this rank's interval has passed (the ranks then agree through :meth:`StopRequests.poll`)."""
        return self.seconds > 0 and monotonic() - self._last >= self.seconds

    def saved(self) -> None:
        """A checkpoint was written (on any schedule): the next one is due ``minutes`` from now."""
        self._last = monotonic()
