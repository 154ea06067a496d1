"""Exact rational references shared by the numerics tests: FP32 rounding and lattice snapping of a Fraction."""

from fractions import Fraction

import numpy as np

__all__ = ["fp32", "snap"]


def fp32(value: Fraction, mode: str = "rne") -> Fraction:
    """Round an exact rational to FP32 (nearest-even or toward zero), from the FP32 neighbours of a guess."""
    if value == 0:
        return Fraction(0)
    guess = np.float32(float(value))
    candidates = sorted(
        {Fraction(float(c)) for c in (np.nextafter(guess, np.float32(-np.inf)), guess, np.nextafter(guess, np.inf))}
    )
    below = max(c for c in candidates if c <= value)
    above = min(c for c in candidates if c >= value)
    if below == above:
        return below
    if mode == "rtz":
        return below if value > 0 else above
    if value - below != above - value:
        return below if value - below < above - value else above
    return below if int(np.float32(float(below)).view(np.int32)) % 2 == 0 else above


def snap(value: Fraction, grid: int | None) -> Fraction:
    return value if grid is None else Fraction(round(value * grid), grid)
