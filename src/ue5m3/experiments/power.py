"""Power of a paired comparison over seeds: the chance a two-sided paired t-test finds an effect, the seeds it needs,
the smallest effect it detects, and the power of an equivalence ("as good as") decision.

Exact, from the noncentral t distribution, integrated here over the sample SD's chi distribution (no approximation
beyond the quadrature; tests check it against scipy's ``nct``, G*Power's sample sizes and a simulation). An
equivalence claim is decided when the 95% interval lies inside its margin; its power is computed the same way
(:func:`equivalence_power`). The scale ladder (:mod:`ue5m3.experiments.ladder`) sizes each claim with these.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np

from ue5m3.evaluation.nll_records import t_quantile

__all__ = ["ALPHA", "POWER", "LEVEL", "paired_power", "equivalence_power", "seeds_needed", "detectable_effect"]

ALPHA = 0.05
POWER = 0.8
LEVEL = 1 - ALPHA


@cache
def _chi_nodes(df: int, intervals: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """Nodes s and Simpson weights times the density of S = sqrt(V / df), V ~ chi-square(df)."""
    width = math.sqrt(1 / (2 * df))  # S's standard deviation, roughly
    low, high = max(0.0, 1 - 16 * width), 1 + 16 * width * (3 if df < 4 else 1)
    s = np.linspace(low, high, intervals + 1)
    with np.errstate(divide="ignore"):
        log_density = (
            math.log(2)
            + df / 2 * math.log(df)
            + (df - 1) * (np.log(s) if df > 1 else 0.0)  # S = |Z| for one degree of freedom: no power of s
            - df * s * s / 2
            - df / 2 * math.log(2)
            - math.lgamma(df / 2)
        )
    density = np.exp(log_density)
    simpson = np.ones(intervals + 1)
    simpson[1:-1:2], simpson[2:-1:2] = 4, 2
    return s, simpson * density * (high - low) / intervals / 3


def _phi(x: np.ndarray) -> np.ndarray:
    """The standard normal CDF, elementwise, in double precision."""
    import torch

    return torch.special.ndtr(torch.from_numpy(np.asarray(x, dtype=np.float64))).numpy()


@cache
def _t(p: float, df: int) -> float:
    return t_quantile(p, df)


def paired_power(n: int, effect: float, sd: float, *, alpha: float = ALPHA) -> float:
    """The probability that a two-sided paired t-test of ``n`` seeds at level ``alpha`` rejects zero when the true
    mean difference is ``effect`` and the per-seed differences have standard deviation ``sd`` (exact: the
    noncentral t with n - 1 degrees of freedom and noncentrality effect / sd * sqrt(n)).

    Raises:
        ValueError: fewer than 2 seeds, a non-positive sd, or alpha outside (0, 0.5).
    """
    _check(n, sd, alpha)
    df = n - 1
    c = _t(1 - alpha / 2, df)
    shift = abs(effect) / sd * math.sqrt(n)
    s, weights = _chi_nodes(df)
    return float(np.sum(weights * (_phi(shift - c * s) + _phi(-shift - c * s))))


def equivalence_power(n: int, effect: float, sd: float, margin: float, *, alpha: float = ALPHA) -> float:
    """The probability that the two-sided ``1 - alpha`` t interval of ``n`` paired seeds lies inside
    ``[-margin, margin]`` (an equivalence claim reproduced, :func:`ue5m3.experiments.paired.judge`) when the true mean
    difference is ``effect``; exact, over the joint law of the mean and the sample SD.

    Raises:
        ValueError: as :func:`paired_power`, or a non-positive margin.
    """
    _check(n, sd, alpha)
    if not margin > 0:
        raise ValueError(f"an equivalence claim needs a positive margin, got {margin!r}")
    df = n - 1
    c = _t(1 - alpha / 2, df)
    se = sd / math.sqrt(n)
    s, weights = _chi_nodes(df)
    upper = (margin - effect) / se - c * s
    lower = (-margin - effect) / se + c * s
    inside = np.where(upper > lower, _phi(upper) - _phi(lower), 0.0)
    return float(np.sum(weights * inside))


def _check(n: int, sd: float, alpha: float) -> None:
    if n < 2:
        raise ValueError(f"a paired t-test needs at least 2 seeds, got {n!r}")
    if not sd > 0:
        raise ValueError(f"the differences' standard deviation must be positive, got {sd!r}")
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must lie in (0, 0.5), got {alpha!r}")


def seeds_needed(
    effect: float,
    sd: float,
    *,
    alpha: float = ALPHA,
    power: float = POWER,
    margin: float | None = None,
    most: int = 1_000_000,
) -> int | None:
    """The fewest paired seeds (at least 2) at which a claim of true ``effect`` is decided with probability
    ``power``: a difference claim (``margin`` None) by the paired t-test, an equivalence claim by its interval
    inside ``+- margin``; None when more than ``most`` seeds would be needed.

    Raises:
        ValueError: a zero effect for a difference claim, or as :func:`paired_power`.
    """
    if margin is None and effect == 0:
        raise ValueError("a difference claim of zero effect is never decided; give the effect to find")
    if not 0.5 < power < 1:
        raise ValueError(f"power must lie in (0.5, 1), got {power!r}")

    def enough(n: int) -> bool:
        if margin is None:
            return paired_power(n, effect, sd, alpha=alpha) >= power
        return equivalence_power(n, effect, sd, margin, alpha=alpha) >= power

    if enough(2):
        return 2
    low, high = 2, 4
    while not enough(high):  # power grows with n: double, then bisect
        if high >= most:
            return None
        low, high = high, min(2 * high, most)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return high


def detectable_effect(n: int, sd: float, *, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest true mean difference a two-sided paired t-test of ``n`` seeds at level ``alpha`` finds with
    probability ``power`` when the differences have standard deviation ``sd`` (the inverse of
    :func:`seeds_needed` in the effect; bisection to 1e-9 of ``sd``).

    Raises:
        ValueError: as :func:`paired_power`, or power outside (0.5, 1).
    """
    _check(n, sd, alpha)
    if not 0.5 < power < 1:
        raise ValueError(f"power must lie in (0.5, 1), got {power!r}")
    low, high = 0.0, sd
    while paired_power(n, high, sd, alpha=alpha) < power:
        low, high = high, 2 * high
    while high - low > 1e-9 * sd:
        mid = (low + high) / 2
        low, high = (low, mid) if paired_power(n, mid, sd, alpha=alpha) >= power else (mid, high)
    return high
