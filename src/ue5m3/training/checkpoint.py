"""Training checkpoints: atomic directories with a SHA-256 manifest, verified before every load.

A checkpoint is a directory ``step-XXXXXXXX/`` holding ``model.pt``, ``optimizer.pt`` and ``trainer.pt`` (step,
data cursor, RNG states, scale caches, counters) plus ``manifest.json`` listing the SHA-256 and size of each
file. It is written into a temporary sibling directory and renamed into place, so an interrupted save leaves no
partial checkpoint; a truncated or corrupted file fails verification with an error naming it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

__all__ = ["CheckpointError", "save", "load", "verify", "latest", "file_sha256", "prune"]

MANIFEST = "manifest.json"
_PREFIX = "step-"


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
            files[path.name] = {"sha256": file_sha256(path), "bytes": path.stat().st_size}
        manifest = {"step": step, "files": files, "meta": dict(meta)}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
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


def latest(root: str | os.PathLike[str]) -> Path | None:
    """The newest checkpoint directory under ``root`` (None if there is none); not verified here."""
    root = Path(root)
    if not root.is_dir():
        return None
    found = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(_PREFIX))
    return found[-1] if found else None


def prune(root: str | os.PathLike[str], keep: int, *, protect: tuple[int, ...] = ()) -> None:
    """Delete all but the newest ``keep`` checkpoints, never those whose step is in ``protect``."""
    found = sorted(p for p in Path(root).iterdir() if p.is_dir() and p.name.startswith(_PREFIX))
    for path in found[: max(0, len(found) - keep)]:
        if int(path.name.removeprefix(_PREFIX)) not in protect:
            shutil.rmtree(path)
