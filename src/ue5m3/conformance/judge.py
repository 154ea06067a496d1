"""How one (operation, peer) cell of the conformance matrix is judged, and how a counterexample is kept.

A cell compares this project's result with a peer's on every case of the corpus the operation accepts:

* ``bit_exact``: every element equal bit for bit (NaN equal to NaN, the sign of zero compared);
* ``within_ulp``: not bit-exact, but every element within N ulp of FP32 (N stated);
* ``equal_in_distribution``: for stochastic operations, the two samples' statistics agree (the test and its
  p-value stated; p >= 0.01);
* ``different``: otherwise, with the number of differing elements and the smallest counterexample saved as a file
  (``torch.load``: the inputs, both results, the case and the element); every differing element explained by a
  known difference (:mod:`.known`) names it, else the difference is ``unexplained``;
* ``not_installed``: the peer is not importable here (the install command stated); ``not_run``: the peer cannot run
  on this machine and has no transcription.

Elements outside what the peer's arithmetic defines (a mask the operation supplies, e.g. fouroversix's unsaturated
8) are excluded from the comparison and counted, with the reason.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path

import torch

__all__ = ["Verdict", "Cell", "Comparison", "compare", "ulp_distance", "save_counterexample", "INSTALL_HINT"]

INSTALL_HINT = "pip install 'ue5m3[conformance]'"


class Verdict(StrEnum):
    BIT_EXACT = "bit_exact"
    WITHIN_ULP = "within_ulp"
    EQUAL_IN_DISTRIBUTION = "equal_in_distribution"
    DIFFERENT = "different"
    NOT_INSTALLED = "not_installed"
    NOT_RUN = "not_run"


@dataclass
class Cell:
    """One cell of the matrix (a row of conformance.csv)."""

    operation: str
    peer: str
    verdict: Verdict
    detail: str = ""  # "max 2 ulp", "KS p = 0.43", "not installed (pip install ...)"
    elements: int = 0  # compared
    differing: int = 0
    excluded: int = 0  # outside what the peer's arithmetic defines
    known_difference: str = ""  # the named cause(s) of the differences, or "unexplained"
    counterexample: str = ""  # file name under the stage's counterexamples/
    peer_version: str = ""
    source: str = "package"  # "package" (the peer's own code) or "transcription@<commit>"
    seconds: float = 0.0

    def row(self) -> dict:
        out = asdict(self)
        out["verdict"] = self.verdict.value
        return out


@dataclass
class Comparison:
    """What :func:`compare` found over one case: elements compared, differing mask (flat), worst ulp distance."""

    elements: int = 0
    differing: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.bool))
    worst_ulp: float = 0.0


def _ordered(x: torch.Tensor) -> torch.Tensor:
    """FP32 bit patterns mapped to integers in the order of the reals (-0.0 just below +0.0)."""
    bits = x.to(torch.float32).contiguous().view(torch.int32).to(torch.int64)
    return torch.where(bits < 0, -(bits & 0x7FFFFFFF) - 1, bits)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|steps| between FP32 values along the FP32 number line (0 for identical bits; NaNs are 0 apart if both are
    NaN, infinitely far otherwise)."""
    d = (_ordered(a) - _ordered(b)).abs().to(torch.float64)
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    d = torch.where(nan_a & nan_b, torch.zeros_like(d), d)
    return torch.where(nan_a ^ nan_b, torch.full_like(d, math.inf), d)


def compare(ours: torch.Tensor, theirs: torch.Tensor, excluded: torch.Tensor | None = None) -> Comparison:
    """Element-wise bit comparison of two FP32 results of one case (``excluded``: elements not compared)."""
    ours, theirs = ours.reshape(-1).to(torch.float32), theirs.reshape(-1).to(torch.float32)
    keep = torch.ones_like(ours, dtype=torch.bool) if excluded is None else ~excluded.reshape(-1)
    distance = ulp_distance(ours, theirs)
    differing = (distance > 0) & keep
    worst = float(distance[keep].max()) if bool(keep.any()) else 0.0
    return Comparison(elements=int(keep.sum()), differing=differing, worst_ulp=worst)


def save_counterexample(directory: Path, name: str, record: dict) -> str:
    """Save a counterexample (a dict of tensors, numbers and strings) as ``<name>.pt``; returns the file name."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.pt"
    torch.save(record, path)
    return path.name
