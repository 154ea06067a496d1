"""Agreement of measured numbers with the paper's: the last four columns of the measurement tables among
``figures/*_vs_paper.csv`` (accumulation statistics, the scale snapshot, emulator identification, the grid control,
throughput).

Where both sides ran the same experiment (appendix C's accumulation statistics, the tiny grid-regression control, the
snapshot's counts, a native throughput run) the comparison is judged by a tolerance stated in words: the rule
(:class:`Criterion`: a quantitative bound, or the same all-cells verdict) and why it means something for that
quantity (a sampling spread, e.g. three standard deviations of a binomial share). The recipe comparisons, whose
runs differ in scale from the paper's, are judged instead by paired statistics over seeds
(:mod:`ue5m3.experiments.comparisons.recipes`).

:func:`with_agreement` appends ``difference`` (ours - paper), ``relative_difference`` (that over ``|paper|``),
``tolerance`` and ``verdict``: ``reproduced`` within the tolerance, ``contradicted`` outside it, ``not run`` where the
paper has a number and we do not (the experiment did not run here, e.g. one that needs native hardware); nullable
dtypes, so a cell without a value is written empty.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import pandas as pd

from ue5m3.experiments.paired import Verdict

__all__ = ["Criterion", "Tolerance", "AGREEMENT_COLUMNS", "with_agreement"]


class Criterion(StrEnum):
    """How a row's verdict is decided (the tolerance column states which, and why)."""

    CLOSE = "close"
    """Quantitative: ``|ours - paper| <= absolute + relative * |paper|`` (numpy.isclose's rule; 0 and 0: equal)."""
    COMPLETE = "complete"
    """Qualitative, for a share of cells: both sides reproduce every cell (share 1), or neither does."""


@dataclass(frozen=True, kw_only=True)
class Tolerance:
    """When our number agrees with the paper's, stated in words in every comparison table (its tolerance column).

    Attributes:
        criterion: how the verdict is decided (:class:`Criterion`).
        reason: why this tolerance means something here (sampling spread, scale difference); written into the
            tolerance column after the rule itself.
        absolute: the absolute part of a ``close`` bound, in the compared quantity's unit.
        relative: the relative part of a ``close`` bound, a fraction of ``|paper|``.
    """

    criterion: Criterion
    reason: str
    absolute: float = 0.0
    relative: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "criterion", Criterion(self.criterion))
        if not self.reason:
            raise ValueError("a tolerance states its reason; got an empty reason")
        if self.absolute < 0 or self.relative < 0:
            raise ValueError(f"tolerance bounds are >= 0, got absolute={self.absolute!r}, relative={self.relative!r}")
        if self.criterion is not Criterion.CLOSE and (self.absolute or self.relative):
            raise ValueError(f"criterion {self.criterion.value!r} takes no bounds; use criterion 'close' for them")

    def describe(self) -> str:
        """The rule and its reason in words, e.g. ``"|ours - paper| <= 10% of |paper| (Monte-Carlo ...)"``."""
        if self.criterion is Criterion.COMPLETE:
            rule = "qualitative: both reproduce every cell, or neither does"
        elif not (self.absolute or self.relative):
            rule = "exact: ours == paper"
        else:
            bound = [f"{self.absolute:g}"] if self.absolute else []
            bound += [f"{100 * self.relative:g}% of |paper|"] if self.relative else []
            rule = "|ours - paper| <= " + " + ".join(bound)
        return f"{rule} ({self.reason})"

    def agrees(self, ours: float, paper: float) -> bool:
        """The verdict for one pair of numbers (both present)."""
        if self.criterion is Criterion.COMPLETE:
            return (ours == 1) == (paper == 1)
        return bool(abs(ours - paper) <= self.absolute + self.relative * abs(paper))


AGREEMENT_COLUMNS = ["difference", "relative_difference", "tolerance", "verdict"]
"""Columns :func:`with_agreement` appends: ours - paper, that over |paper|, the tolerance in words, the verdict."""


def with_agreement(
    table: pd.DataFrame,
    *,
    ours: str,
    paper: str,
    tolerance: Tolerance | Mapping[Any, Tolerance],
    by: str | None = None,
    compare: pd.Series | None = None,
) -> pd.DataFrame:
    """``table`` with :data:`AGREEMENT_COLUMNS` appended, comparing column ``ours`` with column ``paper`` row by row.

    A row is compared when it has a tolerance (``tolerance`` itself, or ``tolerance[row[by]]`` for a mapping: rows
    whose key it lacks are not compared) and ``compare`` (default: every row) holds for it. A compared row states
    its tolerance; its difference needs both sides, its relative difference also a nonzero paper value; its verdict
    is ``reproduced`` or ``contradicted`` with both sides and ``not run`` with the paper's side alone. Cells without a
    value are empty (nullable dtypes), never ``nan``.

    Args:
        table: the comparison table (left unchanged).
        ours: the column of our values.
        paper: the column of the paper's values, in the same unit.
        tolerance: one tolerance for every row, or one per value of column ``by``.
        by: the column whose value picks a row's tolerance (needed with a mapping, refused without).
        compare: a boolean per row of ``table`` (its index): False leaves the row uncompared, e.g. the BF16
            baseline whose gap to BF16 is 0 by construction.

    Returns:
        A copy of ``table`` with difference and relative_difference (``Float64``), tolerance and verdict
        (``string``) appended; its float columns become ``Float64`` and its text columns ``string``, so
        that every empty cell is written empty.

    Raises:
        ValueError: a mapping without ``by``, or ``by`` with a single tolerance.
    """
    if isinstance(tolerance, Tolerance):
        if by is not None:
            raise ValueError(f"by={by!r} picks a tolerance per row from a mapping; one Tolerance needs no by")
        tolerances = pd.Series([tolerance] * len(table), index=table.index, dtype=object)
    else:
        if by is None:
            raise ValueError("a tolerance per row needs by=<column> to pick it; got a mapping without by")
        tolerances = table[by].map(lambda key: tolerance.get(key))
    if compare is not None:
        tolerances = tolerances.where(compare.reindex(table.index).fillna(False).astype(bool), None)
    ours_values = pd.to_numeric(table[ours]).astype("Float64")
    paper_values = pd.to_numeric(table[paper]).astype("Float64")
    compared = tolerances.notna()
    difference = (ours_values - paper_values).where(compared)
    relative = (difference / paper_values.abs()).where((paper_values != 0).fillna(False))
    verdicts = [_verdict(rule, o, p) for rule, o, p in zip(tolerances, ours_values, paper_values, strict=True)]
    out = _nullable(table)
    out["difference"] = difference
    out["relative_difference"] = relative.where(compared)
    described = [rule.describe() if isinstance(rule, Tolerance) else None for rule in tolerances]
    out["tolerance"] = pd.array(described, dtype="string")
    out["verdict"] = pd.array(verdicts, dtype="string")
    return out


def _verdict(rule: Tolerance | None, ours: Any, paper: Any) -> str | None:
    if not isinstance(rule, Tolerance) or pd.isna(paper):
        return None
    if pd.isna(ours):
        return Verdict.NOT_RUN.value
    return (Verdict.REPRODUCED if rule.agrees(float(ours), float(paper)) else Verdict.CONTRADICTED).value


def _nullable(table: pd.DataFrame) -> pd.DataFrame:
    """A copy whose float columns are ``Float64`` and whose text columns are ``string`` (missing cells: NA).

    :func:`ue5m3.artifacts.write_csv` writes NA as an empty cell but a float NaN as ``nan``.
    """
    out = table.copy()
    for column in out.columns:
        values = out[column]
        if pd.api.types.is_float_dtype(values.dtype) and not isinstance(values.dtype, pd.api.extensions.ExtensionDtype):
            out[column] = values.astype("Float64")
        elif isinstance(values.dtype, pd.StringDtype) or (
            values.dtype == object and all(isinstance(v, str) for v in values.dropna())
        ):
            out[column] = values.astype("string")  # pandas' default str dtype holds NaN, "string" holds NA
    return out
