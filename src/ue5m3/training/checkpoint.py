"""Training checkpoints: atomic directories with a SHA-256 manifest, verified before every load.

A checkpoint is a directory ``step-XXXXXXXX/`` holding ``trainer.pt`` (step, data cursor, RNG states, scale
caches, counters), the model and optimizer state, and ``manifest.json`` listing the SHA-256 and size of each
file. The state comes in one of two formats, named by the manifest's ``format``:

- ``full`` (one process, :func:`save`): ``model.pt`` and ``optimizer.pt``, whole state dicts;
- ``sharded`` (many processes, :func:`save_sharded`): ``model/`` and ``optimizer/``, two
  ``torch.distributed.checkpoint`` directories that every rank writes its own shards into (nothing is gathered to
  one rank, so an 8B run's checkpoint costs each rank its share) and that load back resharded onto any number of
  ranks, one included. Each rank hashes a share of the files; rank 0 writes the manifest.

Either is written into a temporary sibling directory, every file and the directory fsynced, and renamed into
place, so an interrupted save leaves no partial checkpoint; a truncated or corrupted file fails verification with
an error naming it. Only directories named exactly ``step-`` and eight digits count, ordered by their step.
:func:`load_model_state` reads the model weights of either format as one full state dict and
:func:`weights_sha256` is the hash that provenance records for them.

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
    "save_sharded",
    "load_model_state",
    "checkpoint_format",
    "weights_sha256",
    "FULL",
    "SHARDED",
]

MANIFEST = "manifest.json"
FULL = "full"
SHARDED = "sharded"
SHARDED_PARTS = ("model", "optimizer")
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
            files[path.name] = _entry(path)
        _commit(tmp, final, {"step": step, "format": FULL, "files": files, "meta": dict(meta)})
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _commit(tmp: Path, final: Path, manifest: Mapping[str, Any]) -> None:
    """Write the manifest, flush everything, rename the temporary directory into place."""
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    _fsync(tmp / MANIFEST)
    for sub in tmp.iterdir():
        if sub.is_dir():
            _fsync(sub)
    _fsync(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync(final.parent)  # the rename itself


def save_sharded(
    root: str | os.PathLike[str],
    step: int,
    state: Mapping[str, Mapping[str, Any]],
    parts: Mapping[str, Any],
    *,
    meta: Mapping[str, Any],
) -> Path:
    """Collective: every rank of the default process group calls it with its own shards.

    Args:
        state: ``{"model": ..., "optimizer": ...}`` state dicts as ``get_state_dict`` returns them (DTensor
            shards under FSDP2); each is written by all ranks as a ``torch.distributed.checkpoint`` directory.
        parts: objects that rank 0 writes with ``torch.save`` (the same on every rank, e.g. ``trainer``).

    Returns:
        The checkpoint directory (on every rank).
    """
    import torch.distributed as dist  # noqa: PLC0415
    import torch.distributed.checkpoint as dcp  # noqa: PLC0415

    if set(state) != set(SHARDED_PARTS):
        raise ValueError(f"sharded state must be exactly {SHARDED_PARTS}, got {sorted(state)}")
    rank, world = dist.get_rank(), dist.get_world_size()
    root = Path(root)
    final = root / f"{_PREFIX}{step:08d}"
    made = [None]
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        made = [str(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))]
    dist.broadcast_object_list(made, src=0)
    tmp = Path(made[0])
    try:
        for name in SHARDED_PARTS:
            writer = dcp.FileSystemWriter(tmp / name, single_file_per_rank=True, sync_files=True)
            dcp.save({name: state[name]}, storage_writer=writer)  # collective; raises on all ranks on failure
        dist.barrier()
        # hash in parallel: rank r takes every world-th file (the names are the same on every rank)
        names = sorted(f"{part}/{p.name}" for part in SHARDED_PARTS for p in (tmp / part).iterdir() if p.is_file())
        mine = {name: _entry(tmp / name) for name in names[rank::world]}
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, mine)
        outcome: list[Any] = [None]
        if rank == 0:
            try:
                files = {k: v for share in gathered for k, v in share.items()}
                for name, obj in parts.items():
                    path = tmp / f"{name}.pt"
                    torch.save(obj, path)
                    _fsync(path)
                    files[path.name] = _entry(path)
                _commit(tmp, final, {"step": step, "format": SHARDED, "files": files, "meta": dict(meta)})
            except BaseException as err:  # every rank must learn that the save failed
                outcome = [f"{type(err).__name__}: {err}"]
        dist.broadcast_object_list(outcome, src=0)
        if outcome[0] is not None:
            raise CheckpointError(f"saving checkpoint {final} failed on rank 0: {outcome[0]}")
    except BaseException:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _entry(path: Path) -> dict[str, Any]:
    return {"sha256": file_sha256(path), "bytes": path.stat().st_size}


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
    """Verify then load a checkpoint's ``torch.save`` files: returns (parts, manifest). A ``full`` checkpoint's
    parts include ``model`` and ``optimizer``; a ``sharded`` one's state is read with
    ``torch.distributed.checkpoint.load`` (into the caller's sharded state dicts) or :func:`load_model_state`."""
    manifest = verify(directory)
    parts = {
        Path(name).stem: torch.load(Path(directory) / name, map_location="cpu", weights_only=True)
        for name in manifest["files"]
        if "/" not in name and name.endswith(".pt")
    }
    return parts, manifest


def checkpoint_format(manifest: Mapping[str, Any]) -> str:
    return manifest.get("format", FULL)  # manifests before the sharded format were all full


def load_model_state(directory: str | os.PathLike[str], manifest: Mapping[str, Any] | None = None) -> dict:
    """The model's full state dict on the CPU from a checkpoint of either format, verified first (unless its
    verified ``manifest`` is passed). A sharded one is read without a process group, whatever the world size that
    wrote it. Transformer Engine's ``*._extra_state`` entries (its quantization metadata, not weights) are left
    out, so a native run's weights load into the plain model that evaluation builds."""
    directory = Path(directory)
    manifest = verify(directory) if manifest is None else manifest
    if checkpoint_format(manifest) == FULL:
        if "model.pt" not in manifest["files"]:
            raise CheckpointError(f"checkpoint {directory} lists no model.pt in its manifest")
        return _weights_only(torch.load(directory / "model.pt", map_location="cpu", weights_only=True))
    from torch.distributed.checkpoint import FileSystemReader  # noqa: PLC0415
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner  # noqa: PLC0415
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict  # noqa: PLC0415

    # the loader dcp_to_torch_save uses: it sizes the state dict from the checkpoint's own metadata
    state: dict[str, Any] = {}
    _load_state_dict(
        state, storage_reader=FileSystemReader(directory / "model"), planner=_EmptyStateDictLoadPlanner(), no_dist=True
    )
    return _weights_only({k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in state["model"].items()})


def _weights_only(state: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in state.items() if not k.endswith("._extra_state")}


def weights_sha256(manifest: Mapping[str, Any]) -> str:
    """The hash provenance records for a checkpoint's model weights: ``model.pt``'s SHA-256 (full), or the SHA-256
    of the sorted ``name sha256`` lines of the model's shard files (sharded; the metadata file is left out since it
    records the path it was written to)."""
    files = manifest["files"]
    if checkpoint_format(manifest) == FULL:
        return files["model.pt"]["sha256"]
    shards = sorted((n, e["sha256"]) for n, e in files.items() if n.startswith("model/") and n.endswith(".distcp"))
    lines = "".join(f"{name} {sha}\n" for name, sha in shards)
    return hashlib.sha256(lines.encode()).hexdigest()


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
