"""The paper's reported numbers, shipped as data (``reference_data/``, provenance in its README).

Figures plot this project's results beside these numbers, never instead of them. The files are pinned by
``SHA256SUMS``; :func:`load` verifies the checksum before returning a table.
"""

from __future__ import annotations

import hashlib
from importlib import resources

import pandas as pd

__all__ = ["names", "load", "verify"]

_DIR = resources.files("ue5m3").joinpath("reference_data")


def _checksums() -> dict[str, str]:
    lines = _DIR.joinpath("SHA256SUMS").read_text().splitlines()
    return {name.strip(): digest for digest, name in (line.split(maxsplit=1) for line in lines if line.strip())}


def names() -> list[str]:
    """Names of the reference tables (file stems)."""
    return sorted(name.removesuffix(".csv") for name in _checksums())


def verify(name: str) -> None:
    """Raise ValueError if the table's bytes differ from the pinned checksum."""
    sums = _checksums()
    filename = f"{name}.csv"
    if filename not in sums:
        raise ValueError(f"unknown reference table {name!r}; known: {names()}")
    digest = hashlib.sha256(_DIR.joinpath(filename).read_bytes()).hexdigest()
    if digest != sums[filename]:
        raise ValueError(f"reference table {filename} was modified (sha256 {digest} != pinned {sums[filename]})")


def load(name: str) -> pd.DataFrame:
    """Load one reference table after checking its checksum."""
    verify(name)
    with _DIR.joinpath(f"{name}.csv").open() as handle:
        return pd.read_csv(handle)
