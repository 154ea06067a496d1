"""Logging and progress: one log format for every verb, and progress that reads well in a terminal and in a file.

The command line calls :func:`configure` once. Records of the package's loggers (each module logs through
``logging.getLogger(__name__)``) and Python warnings then go to stderr in one format, :data:`LOG_FORMAT`
(``2026-12-01 12:00:00 INFO ue5m3.training.loop: ...``), at the level of ``ue5m3 --log-level`` (or of the
``UE5M3_LOG_LEVEL`` environment variable; default ``info``). Other libraries log their warnings and errors only,
less the few lines in :data:`NOISE` that say nothing about the command's work (third-party messages printed whenever
transformers or lm-eval load; each entry says why it is noise). Under torchrun only rank 0 logs below WARNING, so a
multi-process log holds each message once.

:class:`Progress` reports a long loop. On a terminal it is a tqdm bar with the loop's figures (loss, tokens/s) as
its postfix. Anywhere else (a Snakemake job's log file, a pipe) it writes plain log lines instead of a bar's
carriage-return redraws: one line per item the caller marks (the trainer's logged steps), one at most every
``interval_s`` otherwise, and a last line with the count and the elapsed time.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

__all__ = [
    "LOG_FORMAT",
    "DATE_FORMAT",
    "LEVELS",
    "LEVEL_ENV",
    "NOISE",
    "configure",
    "interactive",
    "Progress",
    "progress_over",
]

T = TypeVar("T")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""The one format of every log line: time, level, logger name, message."""

DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
LEVELS = ("debug", "info", "warning", "error")
LEVEL_ENV = "UE5M3_LOG_LEVEL"
"""The environment variable holding the default log level (``ue5m3 --log-level`` wins over it)."""


NOISE: tuple[tuple[str, str], ...] = (
    # transformers imports torchao whenever it is installed (its quantizer registry; ue5m3 never uses torchao's
    # kernels). torchao then tries its optional compiled extensions and warns for each one that does not load here:
    # builds for another Python (_C_mxfp8.cpython-310) or for a CUDA GPU (_C_cutlass_90a); its Python paths work.
    ("torchao", r"^Failed to load \S*torchao/_C\w*\.\S*so: "),
    # torchao registers its Enums with torch's pytree, which torch 2.13 deprecates: a note to torchao's developers.
    ("torch.utils._pytree", r"is an Enum subclass and is now natively supported by torch\.compile"),
    # lm-eval says this for every task with a custom_dataset: ue5m3's task folders use one only to find their docs
    # relative to the folder (ue5m3.evaluation.olmes.task_data), and take no custom keyword arguments.
    ("lm_eval.api.task", r"^ue5m3_\S+: Custom kwargs can be passed to `--metadata`"),
)
"""(logger, regular expression) pairs: third-party records :func:`configure` drops (matched against the message)."""


class _DropNoise(logging.Filter):
    """Drops the records of one logger whose message matches a pattern of :data:`NOISE`."""

    def __init__(self, pattern: str) -> None:
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            return self.pattern.search(record.getMessage()) is None
        except Exception:  # a record whose arguments do not format: not ours to judge
            return True


def interactive() -> bool:
    """Whether stderr is a terminal (then progress is a bar; otherwise log lines)."""
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


class _StderrHandler(logging.Handler):
    """Writes each record to the current ``sys.stderr`` (looked up per record, so a redirected stderr is used); on a
    terminal through ``tqdm.write``, which redraws an open bar below the line instead of breaking it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = self.format(record)
            stream = sys.stderr
            if interactive():
                from tqdm import tqdm  # imported on first use: plain verbs and --help start faster

                tqdm.write(message, file=stream)
            else:
                stream.write(message + "\n")
            stream.flush()
        except Exception:  # logging must never raise into the caller
            self.handleError(record)


class _RankZero(logging.Filter):
    """Drops records below WARNING on every torchrun rank but 0 (torchrun sets ``RANK``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or os.environ.get("RANK", "0") == "0"


def _level(name: str | int) -> int:
    if isinstance(name, int) and not isinstance(name, bool):
        return name
    text = str(name).strip().lower()
    if text not in LEVELS:
        raise ValueError(f"log level {name!r} is not one of {', '.join(LEVELS)}")
    return getattr(logging, text.upper())


def configure(level: str | int | None = None) -> None:
    """Send the package's log records and Python warnings to stderr in :data:`LOG_FORMAT`, less :data:`NOISE`
    (idempotent).

    Args:
        level: ``debug``, ``info``, ``warning`` or ``error`` (or a ``logging`` level number); None reads
            ``UE5M3_LOG_LEVEL``, default ``info``.

    Raises:
        ValueError: an unknown level name, naming the accepted ones.
    """
    numeric = _level(os.environ.get(LEVEL_ENV, "info") if level is None else level)
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(handler)
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter(LOG_FORMAT, DATE_FORMAT))
    handler.addFilter(_RankZero())
    root.addHandler(handler)
    root.setLevel(max(numeric, logging.WARNING))  # other libraries: warnings and errors
    for name, pattern in NOISE:  # a filter on the logger itself holds whichever handler prints its records
        logger = logging.getLogger(name)
        for stale in [f for f in logger.filters if isinstance(f, _DropNoise)]:
            logger.removeFilter(stale)
        logger.addFilter(_DropNoise(pattern))
    logging.getLogger("ue5m3").setLevel(numeric)
    logging.captureWarnings(True)  # warnings.warn(...) as WARNING records of the logger "py.warnings"


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


class Progress:
    """Progress of a loop: a tqdm bar on a terminal, plain log lines elsewhere (see the module docstring).

    Args:
        desc: what the loop does (the bar's label and each line's start), e.g. ``"train"``.
        total: the number of items when known.
        initial: items already done (a resumed run).
        unit: the item's name (``step``, ``window``, ``request``).
        logger: where the lines go (the caller's module logger).
        interval_s: at most one line per this many seconds for updates not marked ``report``; None: only marked
            updates and the last line.
        enabled: False shows nothing (ranks other than 0, or a caller asked for silence).
        rate: add items per second to each line (off where the figures hold a rate already).
        last_line: without a bar, write a line with the count and the elapsed time at the end (unless the last
            line written already had the final count); off where the caller logs its own summary.
        bar: force the bar on (True) or off (False); None: a bar exactly when stderr is a terminal.
    """

    def __init__(
        self,
        desc: str,
        *,
        total: int | None = None,
        initial: int = 0,
        unit: str = "it",
        logger: logging.Logger | None = None,
        interval_s: float | None = 30.0,
        enabled: bool = True,
        rate: bool = True,
        last_line: bool = True,
        bar: bool | None = None,
    ) -> None:
        self.desc, self.total, self.unit, self.count = desc, total, unit, initial
        self.logger = logger or logging.getLogger(__name__)
        self.interval_s, self.enabled, self.rate, self.last_line = interval_s, enabled, rate, last_line
        self.figures: dict[str, Any] = {}
        self._initial = self._written = initial
        self._start = self._last = time.monotonic()
        self._bar = None
        if enabled and (interactive() if bar is None else bar):
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: int = 1, *, figures: Mapping[str, Any] | None = None, report: bool | None = None) -> None:
        """Advance by ``n`` items and set the figures shown with the count.

        Args:
            n: items done since the last update.
            figures: name -> value (floats shown to 4 significant digits; pass a string for another format).
            report: True writes a line now (without a bar), False never, None once ``interval_s`` has passed.
        """
        self.count += n
        if figures:
            self.figures.update(figures)
        if not self.enabled:
            return
        if self._bar is not None:
            if figures:
                self._bar.set_postfix({k: _text(v) for k, v in self.figures.items()}, refresh=False)
            self._bar.update(n)
            return
        now = time.monotonic()
        due = report if report is not None else self.interval_s is not None and now - self._last >= self.interval_s
        if due:
            self._line(now)

    def _line(self, now: float, *, last: bool = False) -> None:
        self._last, self._written = now, self.count
        done = str(self.count) if self.total is None else f"{self.count}/{self.total}"
        parts = [f"{self.unit} {done}"]
        parts += [f"{name} {_text(value)}" for name, value in self.figures.items()]
        elapsed = now - self._start
        if self.rate and elapsed > 0:
            parts.append(f"{(self.count - self._initial) / elapsed:.3g} {self.unit}/s")
        if last:
            parts.append(f"done in {elapsed:.1f} s")
        self.logger.info("%s: %s", self.desc, ", ".join(parts))

    def close(self) -> None:
        """Close the bar, or write the last line (the count, the figures and the elapsed time)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.enabled and self.last_line and self.count != self._written:
            self._line(time.monotonic(), last=True)
        self.enabled = False


def progress_over(
    items: Sequence[T], desc: str, *, unit: str = "it", logger: logging.Logger | None = None
) -> Iterator[T]:
    """Iterate over ``items`` showing :class:`Progress` (a line per item without a terminal)."""
    with Progress(desc, total=len(items), unit=unit, logger=logger, interval_s=0.0) as bar:
        for item in items:
            yield item
            bar.update()
