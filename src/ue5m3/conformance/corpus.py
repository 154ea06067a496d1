"""The shared corpus of the conformance matrix: named FP32 tensors every peer and this project receive alike.

Gaussian, heavy-tailed (Student-t with 3 degrees of freedom) and outlier-channel tensors; exact midpoints of every
E2M1 code and their FP32 neighbours at a decode scale of 1 (tensor amax 6 * 448, so NVFP4's G is 1); block maxima at
the midpoints of every E4M3 and UE5M3 code; blocks near FP32 overflow and in FP32's subnormals; an all-zero tensor;
signed zeros; a ragged shape; and NaN/inf for the element casts that accept them. Every tensor is made from the seed,
so two runs see the same corpus (its SHA-256 goes into the matrix's provenance).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from ue5m3.numerics.formats import E2M1, E4M3, UE5M3

__all__ = ["Case", "make_corpus", "corpus_sha256"]


@dataclass(frozen=True)
class Case:
    """One tensor of the corpus: its name, values (2-D FP32) and whether it holds NaN or inf."""

    name: str
    x: torch.Tensor
    nonfinite: bool = False

    @property
    def ragged(self) -> bool:
        return self.x.shape[1] % 32 != 0


def _midpoints(fmt) -> torch.Tensor:
    """The midpoints between consecutive positive finite codes of ``fmt``."""
    values = fmt.finite_values()
    values = torch.unique(values[values >= 0])  # sorted
    return ((values[1:].double() + values[:-1].double()) / 2).to(torch.float32)


def _with_neighbours(v: torch.Tensor) -> torch.Tensor:
    return torch.cat([v, torch.nextafter(v, torch.full_like(v, -1.0)), torch.nextafter(v, torch.full_like(v, 1e30))])


def _blocks(values: torch.Tensor, anchor: float, width: int = 32) -> torch.Tensor:
    """Rows of ``width``: each holds ``width - 1`` of the values and ``anchor`` (the block amax)."""
    per = width - 1
    pad = (-values.numel()) % per
    v = torch.cat([values, torch.zeros(pad)]).reshape(-1, per)
    return torch.cat([v, torch.full((v.shape[0], 1), anchor)], dim=1)


def make_corpus(seed: int, rows: int, cols: int) -> list[Case]:
    """The corpus: ``rows`` x ``cols`` random tensors (``cols`` a multiple of 32) and the structured cases."""
    g = torch.Generator().manual_seed(seed)
    gaussian = torch.randn(rows, cols, generator=g)
    chi2 = (torch.randn(3, rows, cols, generator=g) ** 2).sum(0) / 3
    student = torch.randn(rows, cols, generator=g) / chi2.sqrt() * 2  # Student-t, 3 degrees of freedom
    outliers = torch.randn(rows, cols, generator=g)
    outliers[:, torch.randperm(cols, generator=g)[:4]] *= 100.0
    spread = torch.randn(rows, cols, generator=g) * torch.exp2(
        torch.randn(rows, cols // 16, generator=g) * 6
    ).repeat_interleave(16, 1)

    e2m1 = _with_neighbours(_midpoints(E2M1))
    e2m1 = torch.cat([e2m1, -e2m1])
    e2m1_case = _blocks(e2m1, 6.0)
    e2m1_case[0, 0] = 6.0 * 448.0  # tensor amax 2688: NVFP4's G = 1, the other blocks keep scale 1
    scale_amax = 6.0 * _with_neighbours(torch.cat([_midpoints(E4M3), _midpoints(UE5M3)[::2]]))
    scale_rows = (torch.rand(scale_amax.numel(), 32, generator=g) * 2 - 1) * scale_amax[:, None]
    scale_rows[:, 0] = scale_amax

    huge = torch.randn(8, 32, generator=g) * 1e37
    huge[0, 0] = 3.0e38
    tiny = torch.randn(8, 32, generator=g) * 1e-39
    tiny[1] = torch.randn(32, generator=g) * 1e-44
    extremes = torch.cat([huge, tiny, torch.randn(8, 32, generator=g)])

    signed = torch.randn(16, 32, generator=g)
    signed[::2, ::3] = 0.0
    signed[1::2, ::3] = -0.0
    signed[4] = -0.0

    nonfinite = torch.randn(4, 32, generator=g)
    nonfinite[0, :3] = torch.tensor([float("nan"), float("inf"), float("-inf")])
    return [
        Case("gaussian", gaussian),
        Case("heavy_tailed", student),
        Case("outlier_channels", outliers),
        Case("wide_block_spread", spread),
        Case("e2m1_midpoints", e2m1_case),
        Case("scale_midpoints", scale_rows),
        Case("fp32_extremes", extremes),
        Case("zeros", torch.zeros(16, 32)),
        Case("signed_zeros", signed),
        Case("ragged", torch.randn(5, 40, generator=g)),
        Case("nonfinite", nonfinite, nonfinite=True),
    ]


def corpus_sha256(cases: list[Case]) -> str:
    """SHA-256 over the cases' names, shapes and FP32 bytes (what the matrix's provenance records)."""
    h = hashlib.sha256()
    for case in cases:
        h.update(case.name.encode())
        h.update(str(tuple(case.x.shape)).encode())
        h.update(case.x.contiguous().numpy().tobytes())
    return h.hexdigest()
