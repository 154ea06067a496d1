"""Candidate GEMM output models for emulator identification, evaluated exactly on the products of each cell.

A candidate says how a GEMM's FP32 result is formed from the exact products p_k = A[i, k] * B[k, j] of one
output cell (gemm spec sections 2-3), with five parameters:

* ``slice_width`` w: K is cut into consecutive slices (one MMA instruction or hardware K-group) of w products,
  the last one padded with zeros; None means one slice over the whole of K (the "exact sum" model).
* ``partial_bits`` b: how a slice meets the running accumulator c.
  - None ("exact"): the slice's exact sum is rounded once to FP32 (RNE), p_j, then c <- round(c + p_j).
  - b ("fused"): the slice's terms (the exact block sums: 16-element blocks for block-scaled operands, single
    products for FP8) and c are aligned to the largest of them, every one truncated toward zero b bits below that
    largest leading bit, summed exactly and rounded once to FP32: c <- round(sum trunc_b(t)). MMA-Sim's
    Blackwell model is w = 64, b = 35, RTZ; published Hopper FP8 models are w = 32, b = 13-14, truncation.
* ``rounding`` (RNE or RTZ): the FP32 rounding of every accumulator update.
* ``promotion`` P: every P of K the (inner) accumulator is added with an RNE FP32 addition into an outer FP32
  accumulator and restarts at zero (CUTLASS/cuBLAS-style promotion of Hopper FP8 tensor-core sums); None = never.
* ``final_grid`` d: the encoded accumulator is snapped to the 1/d lattice (ties to even) before alpha; None = no
  snap.

With b + 1 + log2(terms per step) <= 24 every fused sum fits FP32 exactly, so the ``rne`` and ``rtz`` twins of such
a candidate are the same model: the fitter reports both as identified.

The paper's probe-matched model is ``w64-exact-rtz-g1024``; ``w64-fused35-rtz`` is the leading-bit reading of a
64-wide, 35-bit fused Blackwell step (:data:`MMA_SIM` keeps that name for it). Candidates are
named by a canonical string (:attr:`Candidate.name`, :func:`parse`), which is how configs and tables spell them.

Exactness: products of two FP32 operands are exact in FP64; exact slice sums use the superaccumulator of
:mod:`ue5m3.numerics.exact` (correct for any exponent spread); fused steps are
:func:`ue5m3.numerics.gemm.fused_step`, which sums truncated terms of at most b + 1 significant bits exactly in
FP64 and refuses step sizes where that could fail (b + 1 + log2(terms) > 53). tests/test_identify_candidates.py pins
``w64-exact-*`` to :func:`ue5m3.numerics.gemm.matmul` ``probe_matched`` and every candidate to a scalar reference
in ``fractions``.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from ue5m3.config import Range
from ue5m3.numerics.exact import add_rounded, check_grid, exact_sum, slice_partials, snap
from ue5m3.numerics.formats import Rounding
from ue5m3.numerics.gemm import fused_step

__all__ = [
    "Candidate",
    "CandidateGrid",
    "parse",
    "candidate_grid",
    "accumulate_cells",
    "PROBE_MATCHED",
    "MMA_SIM",
    "BASELINES",
]

MAX_PARTIAL_BITS = 47  # b + 1 bits per truncated term: 17 terms still sum exactly in FP64 (fused_step checks)
BASELINES = ("decoded", "encoded_fp32")  # torch FP32 matmuls, evaluated on the whole GEMM (not candidates)
_NAME = re.compile(r"^w(?P<w>\d+|K)-(?:exact|fused(?P<b>\d+))-(?P<r>rne|rtz)(?:-p(?P<p>\d+))?(?:-g(?P<g>\d+))?$")


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One hypothesis of how the hardware forms a GEMM output (see the module docstring)."""

    slice_width: int | None
    """Products per slice (a multiple of the operands' block size); None = the whole of K in one slice."""
    partial_bits: int | None = None
    """None: exact slice sums rounded once to FP32; b: fused slice + accumulator sum truncated b bits below
    the largest term."""
    rounding: Rounding = Rounding.RTZ
    """FP32 rounding of each accumulator update (``rne`` or ``rtz``)."""
    promotion: int | None = None
    """K interval after which the inner accumulator is promoted into an outer FP32 sum (a multiple of the
    slice width), or None."""
    final_grid: int | None = None
    """Denominator d of the 1/d snap of the encoded accumulator, or None."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "rounding", Rounding(self.rounding))
        if self.rounding not in (Rounding.RNE, Rounding.RTZ):
            raise ValueError(f"candidate rounding must be 'rne' or 'rtz', got {self.rounding.value!r}")
        if self.slice_width is not None and self.slice_width < 1:
            raise ValueError(f"slice_width must be positive or None, got {self.slice_width!r}")
        if self.partial_bits is not None and not 0 <= self.partial_bits <= MAX_PARTIAL_BITS:
            raise ValueError(f"partial_bits must be in [0, {MAX_PARTIAL_BITS}] or None, got {self.partial_bits!r}")
        if self.partial_bits is not None and self.slice_width is None:
            raise ValueError("a fused candidate needs a slice_width (one fused step per slice)")
        if self.promotion is not None:
            if self.slice_width is None or self.promotion % self.slice_width or self.promotion <= self.slice_width:
                raise ValueError(
                    f"promotion must be a multiple of slice_width larger than it, got {self.promotion!r} "
                    f"for slice_width {self.slice_width!r}"
                )
        check_grid(self.final_grid, "final_grid")

    @property
    def name(self) -> str:
        """Canonical spelling, e.g. ``w64-exact-rtz-g1024`` or ``w32-fused13-rtz-p128``."""
        width = "K" if self.slice_width is None else str(self.slice_width)
        partial = "exact" if self.partial_bits is None else f"fused{self.partial_bits}"
        promotion = "" if self.promotion is None else f"-p{self.promotion}"
        grid = "" if self.final_grid is None else f"-g{self.final_grid}"
        return f"w{width}-{partial}-{self.rounding.value}{promotion}{grid}"

    @property
    def accumulator(self) -> Candidate:
        """The same candidate without the final snap (snaps are applied to one shared accumulator)."""
        return replace(self, final_grid=None)

    def rounding_immaterial(self, block: int) -> bool:
        """True when every accumulator update is exact in FP32, so ``rne`` and ``rtz`` give the same function:
        a fused step of n = width / block terms plus the accumulator, each truncated to b + 1 bits, sums to at most
        b + 1 + ceil(log2(n + 1)) <= 24 bits."""
        if self.partial_bits is None or self.slice_width is None:
            return False
        terms = self.slice_width // block + 1
        return self.partial_bits + 1 + math.ceil(math.log2(terms)) <= 24

    def twin_of(self, other: Candidate, block: int) -> bool:
        """Provably the same function as ``other`` on operands with this block size (see
        :meth:`rounding_immaterial`): equal but for an immaterial rounding."""
        return self == other or (replace(self, rounding=other.rounding) == other and self.rounding_immaterial(block))

    def check_block(self, block: int) -> None:
        """Raise unless slices hold whole operand blocks of ``block`` elements."""
        if self.slice_width is not None and self.slice_width % block:
            raise ValueError(
                f"candidate {self.name}: slice width {self.slice_width} is not a multiple of the operand "
                f"block size {block}"
            )


def parse(name: str) -> Candidate:
    """The candidate a canonical name spells (inverse of :attr:`Candidate.name`)."""
    match = _NAME.match(name)
    if match is None:
        raise ValueError(
            f"cannot parse candidate {name!r}; expected w<width|K>-<exact|fused<bits>>-<rne|rtz>[-p<promotion>]"
            "[-g<grid>], e.g. 'w64-exact-rtz-g1024' or 'w32-fused13-rtz-p128'"
        )

    def number(key: str) -> int | None:
        return None if match[key] in (None, "K") else int(match[key])

    return Candidate(
        slice_width=number("w"),
        partial_bits=number("b"),
        rounding=Rounding(match["r"]),
        promotion=number("p"),
        final_grid=number("g"),
    )


PROBE_MATCHED = parse("w64-exact-rtz-g1024")
MMA_SIM = parse("w64-fused35-rtz")


@dataclass(frozen=True, kw_only=True)
class CandidateGrid:
    """The candidate GEMM output models a fit searches (``ue5m3 fit-emulator --config``; the pipeline's
    ``identification.candidates``, or a fit's own ``candidates``): the Cartesian product of the parameter lists
    (invalid combinations skipped), plus ``extra`` names and, with ``exact_sum``, the one-slice exact sum under every
    final grid (the paper's "exact sum + snap").

    Attributes:
        slice_widths: products per slice w (null: one slice over the whole of K).
        partial_bits: how a slice meets the accumulator: null (its exact sum rounded once) or the bits b of a fused
            truncated step.
        roundings: FP32 roundings of the accumulator updates, ``rne`` and/or ``rtz``.
        promotions: K intervals of an RNE promotion into an outer accumulator (null: never).
        final_grids: lattice denominators d of the final snap (null: no snap).
        extra: further candidates by name (:func:`parse`).
        exact_sum: add the one-slice exact sum under every final grid.
    """

    slice_widths: tuple[int | None, ...] = (16, 32, 64, 128, 256)
    partial_bits: tuple[int | None, ...] = (None,)
    roundings: tuple[str, ...] = ("rne", "rtz")
    promotions: tuple[int | None, ...] = (None,)
    final_grids: tuple[int | None, ...] = (None, 256, 512, 1024, 2048, 4096)
    extra: tuple[str, ...] = ("w64-fused35-rtz",)
    exact_sum: bool = True

    RANGES: ClassVar[dict[str, Range]] = {
        "slice_widths": Range(1, 2**20, note="products per slice, null: one slice over K; hardware: 16 to 128"),
        "partial_bits": Range(1, MAX_PARTIAL_BITS, note="bits of a fused truncated step, null: rounded once"),
        "promotions": Range(1, 2**20, note="K interval of a promotion, null: never; Hopper: 128"),
        "final_grids": Range(2, 2**24, note="a lattice denominator of the final snap, null: none"),
    }

    def __post_init__(self) -> None:
        for key in ("slice_widths", "partial_bits", "roundings", "promotions", "final_grids"):
            values = getattr(self, key)
            if not values:
                raise ValueError(f"{key}: at least one value (null where the parameter is off), got []")
            if len(set(values)) != len(values):
                raise ValueError(f"{key}: repeated values in {list(values)!r}")
        for key in ("slice_widths", "partial_bits", "promotions", "final_grids"):
            bad = [v for v in getattr(self, key) if v is not None and v < 1]
            if bad:
                raise ValueError(f"{key}: positive ints or null, got {bad!r} in {list(getattr(self, key))!r}")
        unknown = [r for r in self.roundings if r not in ("rne", "rtz")]
        if unknown:
            raise ValueError(f"roundings: unknown {unknown!r}; accepted: ['rne', 'rtz']")
        for name in self.extra:
            parse(name)  # a name that does not parse is refused here, naming it
        self._check_every_value_forms_a_candidate()

    def _product(self) -> tuple[list[Candidate], list[tuple[dict[str, object], str]]]:
        """The valid candidates of the parameter product, and the invalid combinations with why."""
        made, refused = [], []
        product = itertools.product(
            self.slice_widths, self.partial_bits, self.roundings, self.promotions, self.final_grids
        )
        for w, b, r, p, g in product:
            values: dict[str, object] = {
                "slice_width": w,
                "partial_bits": b,
                "rounding": r,
                "promotion": p,
                "final_grid": g,
            }
            try:
                made.append(Candidate(**{**values, "rounding": Rounding(r)}))
            except ValueError as err:  # e.g. a promotion interval not larger than the slice
                refused.append((values, str(err)))
        return made, refused

    def _check_every_value_forms_a_candidate(self) -> None:
        """Each value a list names is in at least one valid candidate: a promotion no larger than every slice width,
        or a final grid that is not a power of two, would otherwise drop out of the fit without a word."""
        made, refused = self._product()
        for key, attr in (
            ("slice_widths", "slice_width"),
            ("partial_bits", "partial_bits"),
            ("promotions", "promotion"),
            ("final_grids", "final_grid"),
        ):
            for value in getattr(self, key):
                if not any(getattr(c, attr) == value for c in made):
                    why = next(reason for values, reason in refused if values[attr] == value)
                    raise ValueError(
                        f"{key}: {value!r} forms no valid candidate with the grid's other values ({why}); change it "
                        "or the values it combines with"
                    )

    def candidates(self) -> list[Candidate]:
        """Every candidate of the grid, each once, in a fixed order."""
        out: dict[str, Candidate] = {}
        for candidate in self._product()[0]:
            out.setdefault(candidate.name, candidate)
        for name in self.extra:
            out.setdefault(parse(name).name, parse(name))
        if self.exact_sum:
            for g in self.final_grids:
                exact = Candidate(slice_width=None, rounding=Rounding.RNE, final_grid=g)
                out.setdefault(exact.name, exact)
        return list(out.values())


def candidate_grid(**fields: Sequence | bool) -> list[Candidate]:
    """The candidates of ``CandidateGrid(**fields)`` (keyword arguments as its fields, defaults there)."""
    return CandidateGrid(**{k: tuple(v) if isinstance(v, list | tuple) else v for k, v in fields.items()}).candidates()


# ----- evaluation ----------------------------------------------------------------------------------------


def accumulate_cells(products: torch.Tensor, candidate: Candidate, *, block: int = 1) -> torch.Tensor:
    """The encoded FP32 accumulator of each cell under ``candidate`` (snap included, alpha not applied).

    Args:
        products: exact FP64 products [C, K] of C cells, in K order.
        candidate: the output model.
        block: the operands' scaling block along K (16 for NVFP4/UE5M3, 1 for unscaled FP8): fused steps take
            the exact block sums as their terms, as block-scaled MMA hardware does.

    Returns:
        FP32 [C].
    """
    if products.dtype != torch.float64 or products.dim() != 2:
        raise TypeError(f"products must be FP64 [C, K], got {products.dtype} {tuple(products.shape)}")
    candidate.check_block(block)
    cells, k = products.shape
    width = candidate.slice_width or k
    span = candidate.promotion or width
    if k % span:  # hardware pads a partial last slice with zeros, which change no sum and no alignment
        products = torch.nn.functional.pad(products, (0, span - k % span))
        k = products.shape[1]
    slices = k // width
    if candidate.partial_bits is None:
        partials, _ = slice_partials(products, width=width)  # [C, S] each exact sum rounded once (RNE)
        partials = partials.reshape(cells, slices)
    else:
        if block > 1:  # exact block sums, the fused step's terms
            terms = exact_sum(products.reshape(cells, k // block, block))
        else:
            terms = products
        terms = terms.reshape(cells, slices, width // block)
    per_promotion = (candidate.promotion or k) // width
    outer = torch.zeros(cells, dtype=torch.float32)
    inner = torch.zeros(cells, dtype=torch.float32)
    for j in range(slices):
        if candidate.partial_bits is None:
            inner = add_rounded(inner, partials[:, j], candidate.rounding)
        else:
            inner = fused_step(terms[:, j].T, inner, bits=candidate.partial_bits, rounding=candidate.rounding)
        if candidate.promotion is not None and (j + 1) % per_promotion == 0:
            outer, inner = outer + inner, torch.zeros_like(inner)  # promotion: an FP32 RNE addition
    acc = inner if candidate.promotion is None else outer + inner
    return snap(acc, candidate.final_grid)
