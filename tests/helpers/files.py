"""What "nothing was deleted or changed" compares: the SHA-256 of every file under a folder."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_digests(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (its path relative to it, POSIX-style) and its SHA-256."""
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }
