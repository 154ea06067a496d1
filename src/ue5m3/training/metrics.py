"""The run's metrics file, ``metrics.jsonl``: one JSON record per logged step, safe against kills and resumes.

Each logged step appends one line (step, loss, pre-clip gradient norm, learning rate, tokens/s and the block-scale
diagnostics) in a single ``O_APPEND`` write, flushed to disk, so a kill leaves at most a torn last line. A resume
starts from a checkpoint that may be older than the newest records: :func:`truncate_metrics` drops those records
(and a torn last line), so the resumed run rewrites them and the file reads as the uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ue5m3.artifacts import atomic_path

__all__ = ["append_jsonl", "truncate_metrics"]


def append_jsonl(path: Path, record: Mapping[str, Any]) -> None:
    """One whole line per record in one O_APPEND write, flushed to disk: a kill leaves at most a torn last line."""
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def truncate_metrics(path: Path, step: int) -> None:
    """Drop records after ``step`` (written after the checkpoint a resume starts from). A torn last line (a kill
    mid-write) is dropped with a warning naming the file; a malformed line elsewhere is an error naming its line.

    Raises:
        ValueError: a line other than the last is not a metrics record.
    """
    if not path.exists():
        return
    lines = path.read_bytes().decode("utf-8", errors="replace").split("\n")
    kept = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            record_step = record["step"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            if all(not rest.strip() for rest in lines[number:]):
                warnings.warn(f"{path}: line {number} is torn (an interrupted write); dropped it", stacklevel=2)
                break
            raise ValueError(f"{path}: line {number} is not a metrics record ({err}): {line[:80]!r}") from None
        if record_step <= step:
            kept.append(line)
    with atomic_path(path) as tmp:
        tmp.write_text("".join(line + "\n" for line in kept))
