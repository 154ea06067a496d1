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
place, so an interrupted save leaves no partial checkpoint; a full disk, a read-only mount or a missing permission
fails the save with a :class:`~ue5m3.artifacts.StorageError` naming the path and the fix, leaving the older
checkpoints as they were. Only directories named exactly ``step-`` and eight digits count, ordered by their step.

A checkpoint is what its manifest says (:func:`verify`): the manifest records the step, the run's fingerprint
(``meta``) and the file set with each file's SHA-256 and size. A folder whose name is another step's, a file that
is missing, truncated, corrupted or not listed, a manifest that is not one (``{}``, torn, without its files) or
whose fingerprint is not its identity's, and (``complete=True``, what resume and evaluation ask) a checkpoint
without the trainer's files or whose ``trainer.pt`` records another step: each fails verification with a
:class:`CheckpointError` naming the folder and the reason.
:func:`load_model_state` reads the model weights of either format as one full state dict and
:func:`weights_sha256` is the hash that provenance records for them.

:func:`newest_valid` is what a resume and an evaluation read: the newest checkpoint that verifies completely, older
ones tried in turn (a resume renames an invalid one ``*.invalid`` so that a later save never overwrites the evidence;
an evaluation only warns). A resume on many ranks verifies it once, together (``together=True``): each rank hashes
only its share of the files (:func:`~ue5m3.training.manifest.verification_share`: its own shards and its turn of
the metadata) and the ranks agree on the outcome; the load that follows is given the verified manifest and reads
without hashing again. :func:`at_step` is one step's checkpoint, verified completely. :func:`remove_temporaries`
deletes what a killed save left, and :class:`RunLock` keeps a second trainer out of a run directory.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ue5m3.artifacts import reporting_storage_errors, storage_error
from ue5m3.training.manifest import (
    FULL,
    MANIFEST,
    SHARDED,
    SHARDED_PARTS,
    STEP_NAME,
    CheckpointError,
    CheckpointUnreadable,
    checkpoint_format,
    file_sha256,
    trainer_files,
    verify,
)

__all__ = [
    "CheckpointError",
    "CheckpointUnreadable",
    "RunLockedError",
    "RunLock",
    "save",
    "load",
    "verify",
    "latest",
    "checkpoints",
    "newest_valid",
    "at_step",
    "trainer_files",
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

_PREFIX = "step-"


_AFTER_A_FAILED_SAVE = "nothing was deleted: the run resumes from its newest complete checkpoint when rerun"


def save(root: str | os.PathLike[str], step: int, parts: Mapping[str, Any], *, meta: Mapping[str, Any]) -> Path:
    """Write ``parts`` (name -> object for torch.save) as checkpoint ``step`` under ``root``, atomically.

    Returns:
        The checkpoint directory.
    """
    root = Path(root)
    final = root / f"{_PREFIX}{step:08d}"
    with reporting_storage_errors(final, "saving checkpoint", _AFTER_A_FAILED_SAVE):
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
        try:
            files = {}
            for name, obj in parts.items():
                path = tmp / f"{name}.pt"
                _torch_save(obj, path)
                files[path.name] = _entry(path)
            _commit(tmp, final, {"step": step, "format": FULL, "files": files, "meta": dict(meta)})
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def _torch_save(obj: Any, path: Path) -> None:
    """``torch.save`` through a file this function holds, flushed to disk. Given a path, torch reports a failed write
    (a full disk) as "unexpected pos" with neither the cause nor the file; through a file object the OSError is the
    RuntimeError's context, and is raised as itself."""
    try:
        with open(path, "wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
    except RuntimeError as err:
        cause = _os_error_in(err)
        if cause is None:
            raise
        raise OSError(cause.errno, cause.strerror, cause.filename or str(path)) from err


def _os_error_in(err: BaseException) -> OSError | None:
    """The OSError behind ``err``: itself, its cause or context, or a rank's failure inside a
    ``torch.distributed.checkpoint`` CheckpointException."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [err]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError):
            return current
        failures = getattr(current, "failures", None)  # CheckpointException: rank -> (exception, traceback)
        if isinstance(failures, Mapping):
            pending.extend(f[0] if isinstance(f, tuple) else f for f in failures.values())
        pending.extend([current.__cause__, current.__context__])
    return None


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
            try:
                dcp.save({name: state[name]}, storage_writer=writer)  # collective; raises on all ranks on failure
            except Exception as err:
                cause = _os_error_in(err)
                wrapped = (
                    None if cause is None else storage_error(cause, final, "saving checkpoint", _AFTER_A_FAILED_SAVE)
                )
                if wrapped is None:
                    raise
                raise wrapped from err
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
                with reporting_storage_errors(final, "saving checkpoint", _AFTER_A_FAILED_SAVE):
                    for name, obj in parts.items():
                        path = tmp / f"{name}.pt"
                        _torch_save(obj, path)
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


def load(
    directory: str | os.PathLike[str], manifest: Mapping[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Verify (unless its verified ``manifest`` is passed) then load a checkpoint's ``torch.save`` files: returns
    (parts, manifest). A ``full`` checkpoint's parts include ``model`` and ``optimizer``; a ``sharded`` one's state is
    read with ``torch.distributed.checkpoint.load`` (into the caller's sharded state dicts) or
    :func:`load_model_state`."""
    manifest = verify(directory) if manifest is None else dict(manifest)
    parts = {
        Path(name).stem: torch.load(Path(directory) / name, map_location="cpu", weights_only=True)
        for name in manifest["files"]
        if "/" not in name and name.endswith(".pt")
    }
    return parts, manifest


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
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := STEP_NAME.fullmatch(p.name))]
    return sorted(found)


def latest(root: str | os.PathLike[str]) -> Path | None:
    """The newest checkpoint directory under ``root`` (None if there is none); not verified here."""
    found = checkpoints(root)
    return found[-1][1] if found else None


def newest_valid(
    root: str | os.PathLike[str], *, set_aside: bool = True, together: bool = False
) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that verifies completely (:func:`verify` with ``complete=True``) and its manifest, None
    when there is no checkpoint at all.

    A newer checkpoint that fails verification (a kill during a copy, a zero-length file, an empty directory, a
    folder renamed to another step, a malformed manifest) is passed over with a warning naming it and the reason,
    and the next older one is tried.

    Args:
        set_aside: rename each passed-over checkpoint ``<name>.invalid`` (never deleted, and never overwritten by a
            later save of its step): what a resume does, holding the run's lock. An evaluation, which may run beside
            the trainer, only warns.
        together: collective, under ``torch.distributed`` with many ranks (every rank calls it, with the same
            ``root``): the ranks verify each candidate together, each hashing only its share of the files, and all
            get the same answer (or the same error); rank 0, which holds the run's lock, sets aside and warns. With
            one process it is the plain call.

    Raises:
        CheckpointError: checkpoints exist but none verifies (nothing is renamed then), or one cannot be set aside.
        CheckpointUnreadable: a checkpoint file may not be read (a resume stops rather than go back to an older one).
    """
    group = _many_ranks() if together else None
    found = checkpoints(root) if group is None else _from_rank_0([(step, str(p)) for step, p in checkpoints(root)])
    failures = []
    for _, path in reversed(found):
        path = Path(path)
        try:
            manifest = verify(path, complete=True) if group is None else _verify_together(path, *group)
        except CheckpointUnreadable:
            raise
        except CheckpointError as err:
            failures.append((path, err))
            continue
        if group is None:
            _pass_over(failures, path, set_aside)
        else:  # rank 0 holds the lock: it renames, and every rank learns whether it could
            outcome = None
            if group[0] == 0:
                try:
                    _pass_over(failures, path, set_aside)
                except CheckpointError as err:
                    outcome = str(err)
            outcome = _from_rank_0(outcome)
            if outcome is not None:
                raise CheckpointError(outcome)
        return path, manifest
    if failures:
        listed = "; ".join(str(err) for _, err in failures)
        raise CheckpointError(f"no checkpoint under {root} verifies: {listed}")
    return None


def _pass_over(failures: list[tuple[Path, CheckpointError]], path: Path, set_aside: bool) -> None:
    """Warn about (and with ``set_aside`` rename) each newer checkpoint that did not verify, now that ``path`` has."""
    for bad, err in failures:
        if not set_aside:
            warnings.warn(f"{err}; passed over, reading {path}", stacklevel=3)
            continue
        aside = _aside(bad)
        try:
            os.replace(bad, aside)
        except OSError as move:
            raise CheckpointError(
                f"{err}; it cannot be set aside as {aside} ({move.strerror}): move it out of {bad.parent} "
                f"yourself, then rerun to resume from {path}"
            ) from None
        warnings.warn(f"{err}; kept aside as {aside}, resuming from {path}", stacklevel=3)


def _many_ranks() -> tuple[int, int] | None:
    """(rank, world size) under ``torch.distributed`` with more than one rank, else None."""
    import torch.distributed as dist  # noqa: PLC0415

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.get_rank(), dist.get_world_size()
    return None


def _from_rank_0(value: Any) -> Any:
    import torch.distributed as dist  # noqa: PLC0415

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _verify_together(path: Path, rank: int, world: int) -> dict[str, Any]:
    """Collective: this rank checks the checkpoint and hashes its share of the files; every rank returns its
    manifest, or raises the first rank's error (an unreadable file first: a resume does not pass over it)."""
    import torch.distributed as dist  # noqa: PLC0415

    manifest, outcome = None, None
    try:
        manifest = verify(path, complete=True, share=(rank, world))
    except CheckpointError as err:
        outcome = (isinstance(err, CheckpointUnreadable), str(err))
    outcomes: list[Any] = [None] * world
    dist.all_gather_object(outcomes, outcome)
    failed = [o for o in outcomes if o is not None]
    unreadable = [message for is_unreadable, message in failed if is_unreadable]
    if unreadable:
        raise CheckpointUnreadable(unreadable[0])
    if failed:
        raise CheckpointError(failed[0][1])
    assert manifest is not None
    return manifest


def _aside(path: Path) -> Path:
    """``<name>.invalid`` (``.invalid-2``, ... when an earlier one of that name is kept already: nothing is deleted)."""
    aside, n = path.with_name(path.name + ".invalid"), 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.invalid-{n}")
    return aside


def at_step(root: str | os.PathLike[str], step: int) -> tuple[Path, dict[str, Any]]:
    """Checkpoint ``step`` under ``root`` and its manifest, verified completely (its manifest says that step).

    Raises:
        CheckpointError: there is no such checkpoint, or it does not verify (naming the folder and why).
    """
    path = Path(root) / f"{_PREFIX}{step:08d}"
    if not path.is_dir():
        kept = [s for s, _ in checkpoints(root)]
        raise CheckpointError(f"checkpoint {path} does not exist (step {step!r}); the checkpoints there: {kept}")
    return path, verify(path, complete=True)


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
