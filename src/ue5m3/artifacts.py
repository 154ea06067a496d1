"""Writing results: atomic files (no partial outputs on interruption) and provenance records.

Every artefact the CLI writes goes through :func:`atomic_path` (a temporary file in the destination directory,
renamed into place on success) and carries a provenance record: the command's configuration, git commit,
package versions and torch's numerics settings (where the process loaded torch). Records hold no timestamps, so
re-running a step reproduces its outputs byte for byte.

A write the file system refuses (a full disk, a read-only mount, no permission) is raised as a
:class:`StorageError` naming the path and what to do (:func:`reporting_storage_errors`), and a JSON record that
does not parse (a torn write) as a :class:`TornFileError` naming the file and how to make it again
(:func:`read_json`).
"""

from __future__ import annotations

import ast
import contextlib
import csv
import errno
import functools
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = [
    "StorageError",
    "TornFileError",
    "reporting_storage_errors",
    "storage_error",
    "read_json",
    "atomic_path",
    "write_csv",
    "write_json",
    "provenance",
    "git_commit",
    "source_hash",
    "source_files",
]

_PACKAGES = ("ue5m3", "torch", "numpy", "ml_dtypes", "gfloat", "torchao", "snakemake", "lm_eval", "matplotlib")


# ----- what the file system refused ---------------------------------------------------------------------

_ADVICE = {
    errno.ENOSPC: "the file system holding it is full: free space there, or write to another disk",
    errno.EDQUOT: "the disk quota there is used up: free space within it, or write to another disk",
    errno.EROFS: "the file system is mounted read-only: remount it read-write, or write to another directory",
    errno.EACCES: "permission denied: make the directory writable for this user (chmod/chown), or write elsewhere",
    errno.EPERM: "operation not permitted: make the directory writable for this user (chmod/chown), or write elsewhere",
}
"""The faults of the file system, not of the program, that a message can tell the user how to fix."""


class StorageError(OSError):
    """A write the file system refused (full, read-only, no permission); the message names the path, the cause
    and what to do. An ``OSError`` with the original ``errno`` and ``filename``."""

    def __init__(self, code: int, message: str, filename: str) -> None:
        super().__init__(code, message, filename)
        self.message = message

    def __str__(self) -> str:
        return self.message


class TornFileError(ValueError):
    """A record that does not parse (an interrupted write, a full disk, an edit); the message names the file and
    how to make it again."""


def storage_error(err: OSError, path: str | os.PathLike[str], doing: str, then: str = "") -> StorageError | None:
    """``err`` as a :class:`StorageError` when it is a fault of the file system (full, quota, read-only,
    permission), else None.

    Args:
        err: what the write raised.
        path: the file or directory being written (``err.filename`` is named instead when it has one).
        doing: what was being done, e.g. ``"saving checkpoint"``.
        then: what happens next, e.g. ``"nothing was deleted; rerun to resume from the newest checkpoint"``.
    """
    if isinstance(err, StorageError) or err.errno not in _ADVICE:
        return None
    where = err.filename if err.filename else os.fspath(path)
    name = errno.errorcode.get(err.errno, str(err.errno))
    tail = f"; {then}" if then else ""
    at = "" if where == os.fspath(path) else f" at {where}"
    message = f"{doing} {os.fspath(path)} failed{at}: {os.strerror(err.errno)} ({name}); {_ADVICE[err.errno]}"
    return StorageError(err.errno, message + tail, str(where))


@contextlib.contextmanager
def reporting_storage_errors(path: str | os.PathLike[str], doing: str, then: str = "") -> Iterator[None]:
    """Re-raise a file-system fault inside the block as a :class:`StorageError` (:func:`storage_error`)."""
    try:
        yield
    except OSError as err:
        wrapped = storage_error(err, path, doing, then)
        if wrapped is None:
            raise
        raise wrapped from err


def read_json(path: str | os.PathLike[str], *, remedy: str) -> Any:
    """The JSON record at ``path``.

    Args:
        remedy: how to make the file again (named with a torn file), e.g. ``"rerun `ue5m3 prepare-data`"``.

    Raises:
        FileNotFoundError: no such file.
        TornFileError: it does not parse (or is not UTF-8), naming the file, the position and ``remedy``.
    """
    path = Path(path)
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise TornFileError(
            f"{path} is not a complete JSON record ({err}; a write interrupted by a kill or a full disk, or an "
            f"edit); {remedy}"
        ) from None


# ----- atomic results -----------------------------------------------------------------------------------


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; move it into place only if the block succeeds. A full disk, a
    read-only mount or a missing permission is a :class:`StorageError` naming ``path`` (the old file, if any, is
    left as it was)."""
    path = Path(path)
    with reporting_storage_errors(path, "writing", "the previous file (if any) is unchanged"):
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
        "source_sha256": source_hash(),
        "versions": _versions(),
        "torch_numerics": _torch_numerics(),
        **extra,
    }


def _torch_numerics() -> dict[str, Any] | None:
    """Torch's numerics settings where this process has loaded torch (its work may then have used them); None
    where it has not: a verb that only reads tables and draws never pays torch's import (seconds) for a record."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    return {
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
    }


# ----- source identity ----------------------------------------------------------------------------------

_PACKAGE_ROOT = Path(__file__).resolve().parent


@functools.cache
def _module_file(module: str) -> Path | None:
    """The file of ``ue5m3.x.y`` (a module or a package's __init__), None if it is not in the package."""
    parts = module.split(".")[1:]
    base = _PACKAGE_ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def _imported_modules(path: Path) -> frozenset[str]:
    """Every ``ue5m3`` module a file imports anywhere (lazy imports inside functions included); parsed once per
    process (like :func:`source_files`' closures), as every rule's closure shares most files."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "ue5m3")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "ue5m3":
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)  # submodules; attributes are dropped below
    return frozenset(found)


@functools.cache
def _data_files(directory: Path) -> tuple[Path, ...]:
    """Non-Python files a package directory ships (recipe files, C sources, reference data), in sub-folders that are
    not packages of their own (listed once per process, as every module of the directory asks)."""
    files = [p for p in directory.iterdir() if p.is_file() and p.suffix not in (".py", ".pyc")]
    for sub in directory.iterdir():
        if sub.is_dir() and not (sub / "__init__.py").exists() and sub.name != "__pycache__":
            files += [p for p in sub.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return tuple(files)


@functools.cache
def source_files(*modules: str) -> tuple[Path, ...]:
    """The package files the given modules depend on: their static ``ue5m3`` import closure (with the parent
    packages' ``__init__`` files and each package's data files). No modules: the whole package."""
    if not modules:
        return tuple(sorted(p for p in _PACKAGE_ROOT.rglob("*") if p.is_file() and "__pycache__" not in p.parts))
    seen: set[Path] = set()
    pending = list(modules)
    while pending:
        name = pending.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # importing ue5m3.a.b runs ue5m3/__init__ and ue5m3/a/__init__
            path = _module_file(".".join(parts[:i]))
            if path is None or path in seen:
                continue
            seen.add(path)
            seen.update(_data_files(path.parent))
            pending.extend(_imported_modules(path))
    return tuple(sorted(seen))


def source_hash(*modules: str) -> str:
    """SHA-256 over the relative paths and bytes of :func:`source_files` (the whole package by default): recorded
    in provenance beside the commit, and a rule parameter so that Snakemake reruns what a source edit affects."""
    digest = hashlib.sha256()
    for path in source_files(*modules):
        digest.update(path.relative_to(_PACKAGE_ROOT).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()
