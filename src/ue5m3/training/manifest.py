"""What a checkpoint's manifest says, and the check that the checkpoint is what it says (:func:`verify`).

Every checkpoint folder (``step-XXXXXXXX/``, :mod:`~ue5m3.training.checkpoint`) holds a ``manifest.json``: the step,
the format (``full`` or ``sharded``), the file set with each file's SHA-256 and size, and ``meta`` (the writer's
world size and the run identity with its fingerprint, :mod:`~ue5m3.training.identity`). A checkpoint verifies when

- the manifest is one: a mapping with an int step, a known format and a non-empty file set, each entry a
  64-digit SHA-256 and a size (``{}``, a torn file or one without its files is a :class:`CheckpointError` like any
  other fault, never a ``KeyError``);
- the folder is named for the manifest's step (a folder renamed to a later step is not that step);
- the fingerprint is the SHA-256 of the identity the manifest records;
- the folder holds exactly the listed files, each of its size and SHA-256;
- with ``complete=True`` (a resume, an evaluation, the final record): the trainer's files are listed
  (:func:`trainer_files`) and ``trainer.pt`` records the manifest's step.

Each failure names the folder or file and what is wrong; a file this process may not read is a
:class:`CheckpointUnreadable` (the checkpoint may be fine: fix the permission), which a resume does not pass over.

Many ranks verify one checkpoint together (:func:`verification_share`): each checks the manifest, the name, the
fingerprint, the file set and every size, and hashes only its share of the files (the shards it wrote, and its turn
of the others), so that each file is read for its SHA-256 by one rank once.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "MANIFEST",
    "fingerprint",
    "FULL",
    "SHARDED",
    "SHARDED_PARTS",
    "STEP_NAME",
    "CheckpointError",
    "CheckpointUnreadable",
    "file_sha256",
    "checkpoint_format",
    "trainer_files",
    "verification_share",
    "verify",
]

MANIFEST = "manifest.json"
FULL = "full"
SHARDED = "sharded"
SHARDED_PARTS = ("model", "optimizer")
STEP_NAME = re.compile(r"step-(\d{8})")
"""The name of a checkpoint folder: ``step-`` and the step in eight digits (nothing else counts)."""
_SHA256 = re.compile(r"[0-9a-f]{64}")


class CheckpointError(ValueError):
    """A checkpoint is missing, truncated, corrupted or does not match the run."""


class CheckpointUnreadable(CheckpointError):
    """A checkpoint file this process may not read (its permissions): not evidence of a bad checkpoint, so a resume
    stops instead of falling back to an older one."""


def file_sha256(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def checkpoint_format(manifest: Mapping[str, Any]) -> str:
    return manifest.get("format", FULL)  # manifests before the sharded format were all full


def trainer_files(manifest: Mapping[str, Any]) -> tuple[str, ...]:
    """The files a trainer's checkpoint of the manifest's format holds (what a resume reads)."""
    if checkpoint_format(manifest) == FULL:
        return ("model.pt", "optimizer.pt", "trainer.pt")
    return ("trainer.pt", *(f"{part}/.metadata" for part in SHARDED_PARTS))


_SHARD = re.compile(r"[^/]+/__(\d+)_\d+\.distcp")
"""A shard file of a sharded checkpoint and the rank that wrote it (torch.distributed.checkpoint's name)."""


def verification_share(manifest: Mapping[str, Any], rank: int, world: int) -> tuple[str, ...]:
    """The files of a checkpoint that rank ``rank`` of ``world`` hashes when the ranks verify it together, each file
    by exactly one rank: the shards writer rank w wrote (``<part>/__w_<n>.distcp``) by rank w mod ``world`` (on the
    writer's world size, the shards each rank reads back), every other file (``trainer.pt``, the parts'
    ``.metadata``, a full checkpoint's files) by the ranks in turn, in sorted order. One rank: every file."""
    shards, others = [], []
    for name in sorted(manifest["files"]):
        match = _SHARD.fullmatch(name)
        (shards if match else others).append((int(match.group(1)) if match else None, name))
    mine = [name for writer, name in shards if writer % world == rank]
    mine += [name for i, (_, name) in enumerate(others) if i % world == rank]
    return tuple(sorted(mine))


def verify(
    directory: str | os.PathLike[str], *, complete: bool = False, share: tuple[int, int] = (0, 1)
) -> dict[str, Any]:
    """Check that a checkpoint is what its manifest says; returns the manifest.

    The manifest must be one (a mapping with the step, the format and a non-empty file set, each file with its
    SHA-256 and size), the folder's name must be its step's, its fingerprint its identity's, and the folder must
    hold exactly the listed files, each of its size and SHA-256.

    Args:
        complete: also require the trainer's files (:func:`trainer_files`) and a ``trainer.pt`` that records the
            manifest's step: what a resume or an evaluation of a training run reads.
        share: (rank, world size) of ranks verifying the checkpoint together: everything is checked except the
            SHA-256 of the files of other ranks' shares (:func:`verification_share`); the ranks then agree on the
            outcome (:func:`ue5m3.training.checkpoint.newest_valid` with ``together``). Default: one process, every
            file hashed.

    Raises:
        CheckpointError: naming the folder or the file and what is wrong with it.
        CheckpointUnreadable: a file this process has no permission to read (naming it).
    """
    directory = Path(directory)
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"checkpoint {directory} has no {MANIFEST} (incomplete or not a checkpoint)")
    try:
        manifest = json.loads(manifest_path.read_bytes().decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"checkpoint manifest {manifest_path} is corrupted (torn or edited): {err}") from None
    except PermissionError as err:
        raise _unreadable(manifest_path, err) from None
    _check_manifest(manifest, manifest_path)
    _check_name(directory, manifest["step"])
    _check_fingerprint(manifest, manifest_path)
    if complete:
        absent = [name for name in trainer_files(manifest) if name not in manifest["files"]]
        if absent:
            raise CheckpointError(
                f"checkpoint {directory} is not a complete training checkpoint: its manifest lists no {absent}"
            )
    _check_file_set(directory, manifest["files"])
    hashed = set(verification_share(manifest, *share))
    for name, entry in manifest["files"].items():
        path = directory / name
        if path.stat().st_size != entry["bytes"]:
            raise CheckpointError(
                f"checkpoint file {path} is truncated ({path.stat().st_size} of {entry['bytes']} bytes)"
            )
        if name not in hashed:
            continue  # another rank's share
        try:
            digest = file_sha256(path)
        except PermissionError as err:
            raise _unreadable(path, err) from None
        if digest != entry["sha256"]:
            raise CheckpointError(f"checkpoint file {path} is corrupted (SHA-256 mismatch)")
    if complete:
        _check_trainer_step(directory, manifest["step"])
    return manifest


def _unreadable(path: Path, err: OSError) -> CheckpointUnreadable:
    return CheckpointUnreadable(
        f"checkpoint file {path} cannot be read ({err.strerror}); make it readable for this user (chmod/chown) and "
        "rerun: the checkpoint itself may be fine, so nothing was set aside"
    )


def _check_manifest(manifest: Any, path: Path) -> None:
    """The manifest's structure: what :func:`save` and :func:`save_sharded` write."""

    def refuse(detail: str) -> None:
        raise CheckpointError(f"checkpoint manifest {path} is malformed: {detail}")

    if not isinstance(manifest, dict):
        refuse(f"expected a mapping, got {type(manifest).__name__}")
    missing = [key for key in ("step", "files") if key not in manifest]
    if missing:
        refuse(f"it has no {missing} (keys: {sorted(manifest)})")
    step = manifest["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        refuse(f"step must be an int >= 0, got {step!r}")
    if manifest.get("format", FULL) not in (FULL, SHARDED):
        refuse(f"format must be {FULL!r} or {SHARDED!r}, got {manifest.get('format')!r}")
    if not isinstance(manifest.get("meta", {}), dict):
        refuse(f"meta must be a mapping, got {manifest.get('meta')!r}")
    files = manifest["files"]
    if not isinstance(files, dict) or not files:
        refuse(f"files must be a non-empty mapping of file names to their SHA-256 and size, got {files!r}")
    for name, entry in files.items():
        parts = Path(name).parts
        if not name or Path(name).is_absolute() or ".." in parts or name == MANIFEST:
            refuse(f"file name {name!r} is not a file inside the checkpoint")
        if not isinstance(entry, dict) or set(entry) != {"sha256", "bytes"}:
            refuse(f"files[{name!r}] must be {{'sha256': ..., 'bytes': ...}}, got {entry!r}")
        size = entry["bytes"]
        if not isinstance(entry["sha256"], str) or not _SHA256.fullmatch(entry["sha256"]):
            refuse(f"files[{name!r}].sha256 must be 64 lower-case hex digits, got {entry['sha256']!r}")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            refuse(f"files[{name!r}].bytes must be an int >= 0, got {size!r}")


def _check_name(directory: Path, step: int) -> None:
    """A checkpoint folder is named for its manifest's step (a folder renamed to another step is not that step)."""
    match = STEP_NAME.fullmatch(directory.name)
    if match is not None and int(match.group(1)) != step:
        raise CheckpointError(
            f"checkpoint folder {directory} is named for step {int(match.group(1))} but its manifest says step "
            f"{step} (renamed or copied from another step?)"
        )


def fingerprint(identity: Mapping[str, Any]) -> str:
    """SHA-256 of a run identity as sorted-key JSON: what a checkpoint manifest records beside the identity."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def _check_fingerprint(manifest: Mapping[str, Any], path: Path) -> None:
    """The fingerprint a manifest records is its identity's (an edited identity or fingerprint is not this run's)."""
    meta = manifest.get("meta", {})
    if "identity" in meta and "fingerprint" in meta:
        if not isinstance(meta["identity"], dict) or meta["fingerprint"] != fingerprint(meta["identity"]):
            raise CheckpointError(
                f"checkpoint manifest {path} is inconsistent: its fingerprint {meta['fingerprint']!r} is not the "
                "SHA-256 of the identity it records (edited?)"
            )


def _check_file_set(directory: Path, files: Mapping[str, Any]) -> None:
    """The folder holds exactly the listed files besides the manifest."""
    present = {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()} - {MANIFEST}
    missing = sorted(set(files) - present)
    if missing:
        raise CheckpointError(f"checkpoint file {directory / missing[0]} is missing (listed in its {MANIFEST})")
    extra = sorted(present - set(files))
    if extra:
        raise CheckpointError(
            f"checkpoint {directory} holds files its {MANIFEST} does not list: {extra} (copied in from elsewhere?)"
        )


def _check_trainer_step(directory: Path, step: int) -> None:
    """The step the trainer's state records is the manifest's."""
    try:
        trainer = torch.load(directory / "trainer.pt", map_location="cpu", weights_only=True)
    except Exception as err:  # an unreadable pickle whose hash matched: written wrong, not torn
        raise CheckpointError(f"checkpoint file {directory / 'trainer.pt'} cannot be loaded: {err}") from None
    recorded = trainer.get("step") if isinstance(trainer, dict) else None
    if recorded != step:
        raise CheckpointError(
            f"checkpoint {directory}: trainer.pt records step {recorded!r} but the manifest says step {step}"
        )
