"""Training checkpoints: atomic directories with a SHA-256 manifest, verified before every load.

A checkpoint is a directory ``step-XXXXXXXX/`` holding ``model.pt``, ``optimizer.pt`` and ``trainer.pt`` (step,
data cursor, RNG states, scale caches, counters) plus ``manifest.json`` listing the SHA-256 and size of each
file. It is written into a temporary sibling directory, every file and the directory fsynced, and renamed into
place, so an interrupted save leaves no partial checkpoint; a truncated or corrupted file fails verification with
an error naming it. Only directories named exactly ``step-`` and eight digits count, ordered by their step.

:func:`newest_valid` is what a resume reads: the newest checkpoint that verifies, older ones tried in turn (an
invalid one is renamed ``*.invalid`` so that a later save never overwrites the evidence). :func:`remove_temporaries`
deletes what a killed save left, and :class:`RunLock` keeps a second trainer out of a run directory.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "CheckpointError",
    "RunLockedError",
    "RunLock",
    "save",
    "load",
    "verify",
    "latest",
    "checkpoints",
    "newest_valid",
    "remove_temporaries",
    "file_sha256",
    "prune",
]

MANIFEST = "manifest.json"
_PREFIX = "step-"
_NAME = re.compile(r"step-(\d{8})")


class CheckpointError(ValueError):
    """A checkpoint is missing, truncated, corrupted or does not match the run."""


def file_sha256(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def save(root: str | os.PathLike[str], step: int, parts: Mapping[str, Any], *, meta: Mapping[str, Any]) -> Path:
    """Write ``parts`` (name -> object for torch.save) as checkpoint ``step`` under ``root``, atomically.

    Returns:
        The checkpoint directory.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{_PREFIX}{step:08d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        files = {}
        for name, obj in parts.items():
            path = tmp / f"{name}.pt"
            torch.save(obj, path)
            _fsync(path)
            files[path.name] = {"sha256": file_sha256(path), "bytes": path.stat().st_size}
        manifest = {"step": step, "files": files, "meta": dict(meta)}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        _fsync(tmp / MANIFEST)
        _fsync(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync(root)  # the rename itself
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def verify(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Check every file of a checkpoint against its manifest; returns the manifest.

    Raises:
        CheckpointError: naming the missing, truncated or corrupted file.
    """
    directory = Path(directory)
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"checkpoint {directory} has no {MANIFEST} (incomplete or not a checkpoint)")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"checkpoint manifest {manifest_path} is corrupted: {err}") from err
    for name, entry in manifest["files"].items():
        path = directory / name
        if not path.is_file():
            raise CheckpointError(f"checkpoint file {path} is missing")
        if path.stat().st_size != entry["bytes"]:
            raise CheckpointError(
                f"checkpoint file {path} is truncated ({path.stat().st_size} of {entry['bytes']} bytes)"
            )
        if file_sha256(path) != entry["sha256"]:
            raise CheckpointError(f"checkpoint file {path} is corrupted (SHA-256 mismatch)")
    return manifest


def load(directory: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Verify then load a checkpoint: returns (parts, manifest)."""
    manifest = verify(directory)
    parts = {
        Path(name).stem: torch.load(Path(directory) / name, map_location="cpu", weights_only=True)
        for name in manifest["files"]
    }
    return parts, manifest


def checkpoints(root: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """(step, directory) of every checkpoint under ``root``, oldest first (only ``step-`` + eight digits)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _NAME.fullmatch(p.name))]
    return sorted(found)


def latest(root: str | os.PathLike[str]) -> Path | None:
    """The newest checkpoint directory under ``root`` (None if there is none); not verified here."""
    found = checkpoints(root)
    return found[-1][1] if found else None


def newest_valid(root: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that verifies and its manifest, None when there is no checkpoint at all.

    A newer checkpoint that fails verification (a kill during a copy, a zero-length file, an empty directory) is
    renamed ``<name>.invalid`` with a warning naming it and the reason, and the next older one is tried.

    Raises:
        CheckpointError: checkpoints exist but none verifies (nothing is renamed then).
    """
    found = checkpoints(root)
    failures = []
    for _, path in reversed(found):
        try:
            manifest = verify(path)
        except CheckpointError as err:
            failures.append((path, err))
            continue
        for bad, err in failures:
            aside = bad.with_name(bad.name + ".invalid")
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(bad, aside)
            warnings.warn(f"{err}; kept aside as {aside}, resuming from {path}", stacklevel=2)
        return path, manifest
    if failures:
        listed = "; ".join(str(err) for _, err in failures)
        raise CheckpointError(f"no checkpoint under {root} verifies: {listed}")
    return None


def remove_temporaries(root: str | os.PathLike[str]) -> list[Path]:
    """Delete the temporary directories of saves that were killed (``.step-*``); returns what was removed. Call
    it only while holding the run's :class:`RunLock` (a live save of another process would lose its files)."""
    root = Path(root)
    if not root.is_dir():
        return []
    removed = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(f".{_PREFIX}")]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def prune(root: str | os.PathLike[str], keep: int, *, protect: tuple[int, ...] = ()) -> None:
    """Delete all but the newest ``keep`` (at least one) checkpoints, never those whose step is in ``protect``."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1 (a run keeps its newest checkpoint), got {keep!r}")
    found = checkpoints(root)
    for step, path in found[: max(0, len(found) - keep)]:
        if step not in protect:
            shutil.rmtree(path)


def _fsync(path: Path) -> None:
    """Flush a file's or a directory's contents to disk (a directory: its entries, so a rename survives)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class RunLockedError(RuntimeError):
    """Another process holds the run directory."""


class RunLock:
    """An exclusive lock on a run directory (``<run_dir>/.lock``, flock): a second trainer on the same run is
    refused instead of interleaving its metrics and checkpoints. The kernel drops the lock when the holder dies,
    so a killed run never leaves a stale one."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.path = Path(run_dir) / ".lock"
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if err.errno in (errno.EAGAIN, errno.EACCES):
                raise RunLockedError(
                    f"run directory {self.path.parent} is in use by another trainer (pid {holder}); "
                    "wait for it to finish or stop it"
                ) from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
