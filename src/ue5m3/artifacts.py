"""Writing results: atomic files (no partial outputs on interruption) and provenance records.

Every artefact the CLI writes goes through :func:`atomic_path` (a temporary file in the destination directory,
renamed into place on success) and carries a provenance record: the command's configuration, git commit,
package versions and torch's numerics settings. Records hold no timestamps, so re-running a step reproduces
its outputs byte for byte.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import platform
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

__all__ = ["atomic_path", "write_csv", "write_json", "provenance", "git_commit"]

_PACKAGES = ("ue5m3", "torch", "numpy", "ml_dtypes", "gfloat", "torchao", "snakemake", "lm_eval", "matplotlib")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; move it into place only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    umask = os.umask(0)  # mkstemp creates 0600; give the result the permissions a plain open() would
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_csv(path: str | os.PathLike[str], rows: Sequence[Mapping[str, Any]], fieldnames: Sequence[str]) -> None:
    """Write dict rows as CSV atomically; floats use repr so values round-trip exactly."""
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(fieldnames), lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row.get(k) is None else row[k]) for k in fieldnames})


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write JSON atomically with sorted keys (byte-stable)."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def git_commit(root: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The current git commit and whether the tree has uncommitted changes (None outside a checkout)."""
    cwd = Path(root) if root else Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": bool(dirty)}


def _versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def provenance(command: str, config: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    """A provenance record for one artefact.

    Args:
        command: the CLI verb that produced it.
        config: the resolved configuration of that command.
        **extra: further identity fields (recipe, seed, checkpoint hash, ...).
    """
    return {
        "command": command,
        "config": dict(config),
        "git": git_commit(),
        "versions": _versions(),
        "torch_numerics": {
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        },
        **extra,
    }
