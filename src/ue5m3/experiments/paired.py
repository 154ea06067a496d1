"""Paired statistics of a recipe against a baseline, and a verdict that can say "inconclusive".

Every run of a seed starts from the same initial weights and sees the same data order under every recipe
(``TrainConfig.seed`` fixes both), so the per-seed difference ``d_s = x(recipe, s) - x(baseline, s)`` removes the
seed-to-seed spread that the recipe does not cause; its spread over seeds is far smaller than either recipe's. From
the differences of n seeds:

* the mean effect and a two-sided Student-t interval ``mean +- t(1 - alpha/2, n - 1) * sd / sqrt(n)`` (no interval
  for one seed, nor for differences that are all the same: a spread of zero observed on a few seeds, as a discrete
  score on a few examples gives, is not a spread of zero);
* the minimum detectable effect at the stated power: ``(t(1 - alpha/2, n - 1) + t(power, n - 1)) * sd / sqrt(n)``,
  the smallest true effect a paired t-test of these seeds would find with that probability (the usual normal-shift
  approximation of the non-central t);
* a three-valued verdict against the paper's claim (:func:`judge`): ``reproduced`` when the interval excludes zero
  on the paper's side, ``contradicted`` when it excludes zero on the other side, ``inconclusive`` otherwise; an
  equivalence claim ("as good as") is reproduced when the whole interval lies inside its margin and contradicted
  when the whole interval lies outside it. Never "agrees" on noise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from ue5m3.evaluation.nll_records import t_quantile

__all__ = [
    "Verdict",
    "Direction",
    "PairedEffect",
    "paired_effect",
    "judge",
    "seeds_for_power",
    "PAIRED_COLUMNS",
    "PAIRED_DTYPES",
    "effect_row",
    "values_by_seed",
]


class Verdict(StrEnum):
    """What a comparison with the paper concludes."""

    REPRODUCED = "reproduced"
    CONTRADICTED = "contradicted"
    INCONCLUSIVE = "inconclusive"
    NOT_RUN = "not run"  # the experiment that tests the claim did not run at this scale (or needs absent hardware)


class Direction(StrEnum):
    """What the paper claims of an effect (treatment minus baseline)."""

    LOWER = "lower"  # the effect is negative (e.g. a lower loss)
    HIGHER = "higher"  # the effect is positive (e.g. a higher accuracy)
    EQUIVALENT = "equivalent"  # the effect is within +- margin of zero ("as good as")


@dataclass(frozen=True)
class PairedEffect:
    """The paired effect of a treatment against a baseline over the seeds both ran.

    Attributes:
        seeds: the seeds both sides have, in order.
        differences: treatment minus baseline, per seed.
        mean: the mean difference.
        sd: the sample standard deviation of the differences (None for one seed).
        low, high: the two-sided interval of the mean at ``level`` (None without one).
        mde: the minimum detectable effect at ``power`` for these seeds (None without a spread).
        level: the interval's confidence level.
        power: the power of the MDE.
    """

    seeds: tuple[int, ...]
    differences: tuple[float, ...]
    mean: float
    sd: float | None
    low: float | None
    high: float | None
    mde: float | None
    level: float
    power: float

    @property
    def n(self) -> int:
        return len(self.seeds)


def paired_effect(
    treatment: Mapping[int, float], baseline: Mapping[int, float], *, level: float = 0.95, power: float = 0.8
) -> PairedEffect:
    """The paired effect over the seeds both ``treatment`` and ``baseline`` ran (seed -> value each).

    Raises:
        ValueError: no seed in common, or a level or power outside (0.5, 1).
    """
    for name, value in (("level", level), ("power", power)):
        if not 0.5 < value < 1:
            raise ValueError(f"{name} must lie in (0.5, 1), got {value!r}")
    seeds = tuple(sorted(set(treatment) & set(baseline)))
    if not seeds:
        raise ValueError(
            f"no seed in common: treatment has {sorted(treatment)}, baseline {sorted(baseline)}; a paired effect "
            "needs the same seeds on both sides"
        )
    differences = tuple(float(treatment[s]) - float(baseline[s]) for s in seeds)
    n = len(seeds)
    mean = math.fsum(differences) / n
    if n < 2:
        return PairedEffect(seeds, differences, mean, None, None, None, None, level, power)
    sd = math.sqrt(math.fsum((d - mean) ** 2 for d in differences) / (n - 1))
    if sd == 0:  # identical differences (e.g. a discrete score on few examples): no spread to build an interval on
        return PairedEffect(seeds, differences, mean, sd, None, None, None, level, power)
    se = sd / math.sqrt(n)
    t_level = t_quantile(1 - (1 - level) / 2, n - 1)
    mde = (t_level + t_quantile(power, n - 1)) * se
    return PairedEffect(seeds, differences, mean, sd, mean - t_level * se, mean + t_level * se, mde, level, power)


def judge(effect: PairedEffect | None, direction: Direction, *, margin: float | None = None) -> Verdict:
    """The verdict of ``effect`` on a claim of ``direction`` (see the module docstring); NOT_RUN without an effect.

    Raises:
        ValueError: an equivalence claim without a positive margin, or a margin for a directional claim.
    """
    direction = Direction(direction)
    if direction is Direction.EQUIVALENT:
        if margin is None or not margin > 0:
            raise ValueError(f"an equivalence claim needs a positive margin, got {margin!r}")
    elif margin is not None:
        raise ValueError(f"a {direction.value!r} claim takes no margin (got {margin!r})")
    if effect is None:
        return Verdict.NOT_RUN
    if effect.low is None or effect.high is None:
        return Verdict.INCONCLUSIVE  # one seed: no interval to decide with
    if direction is Direction.EQUIVALENT:
        if -margin <= effect.low and effect.high <= margin:
            return Verdict.REPRODUCED
        if effect.high < -margin or effect.low > margin:
            return Verdict.CONTRADICTED
        return Verdict.INCONCLUSIVE
    below, above = effect.high < 0, effect.low > 0
    if (direction is Direction.LOWER and below) or (direction is Direction.HIGHER and above):
        return Verdict.REPRODUCED
    if below or above:
        return Verdict.CONTRADICTED
    return Verdict.INCONCLUSIVE


def seeds_for_power(sd: float, effect: float, *, level: float = 0.95, power: float = 0.8, most: int = 10_000) -> int:
    """The fewest seeds whose paired interval would resolve a true ``effect`` with probability ``power``, given the
    per-seed spread ``sd`` of the differences (solves the MDE formula for n; at least 2).

    Raises:
        ValueError: a non-positive spread or effect, or more than ``most`` seeds needed.
    """
    if not sd > 0 or effect == 0:
        raise ValueError(f"seeds_for_power needs sd > 0 and a nonzero effect, got sd={sd!r}, effect={effect!r}")
    for n in range(2, most + 1):
        mde = (t_quantile(1 - (1 - level) / 2, n - 1) + t_quantile(power, n - 1)) * sd / math.sqrt(n)
        if mde <= abs(effect):
            return n
    raise ValueError(f"more than {most} seeds needed for an effect of {effect!r} at sd {sd!r}")


PAIRED_COLUMNS = ["seeds", "effect", "interval_low", "interval_high", "mde", "paper_effect", "verdict"]
"""The columns a paired comparison adds to a ``*_vs_paper`` table, in order."""

PAIRED_DTYPES = {
    "seeds": "Int64",
    "effect": "Float64",
    "interval_low": "Float64",
    "interval_high": "Float64",
    "mde": "Float64",
    "paper_effect": "Float64",
    "verdict": "string",
}
"""Nullable dtypes of :data:`PAIRED_COLUMNS`: a cell without a value is written empty, never ``nan``."""


def effect_row(effect: PairedEffect | None, paper_effect: float | None, verdict: Verdict) -> dict[str, object]:
    """The :data:`PAIRED_COLUMNS` of one row."""
    if effect is None:
        return dict.fromkeys(PAIRED_COLUMNS[:-2]) | {"paper_effect": paper_effect, "verdict": verdict.value}
    return {
        "seeds": effect.n,
        "effect": effect.mean,
        "interval_low": effect.low,
        "interval_high": effect.high,
        "mde": effect.mde,
        "paper_effect": paper_effect,
        "verdict": verdict.value,
    }


def values_by_seed(rows: Sequence[Mapping[str, object]], value: str) -> dict[int, float]:
    """seed -> value of rows that each carry a ``seed`` and the ``value`` column (one row per seed)."""
    out: dict[int, float] = {}
    for row in rows:
        seed = int(row["seed"])  # type: ignore[arg-type]
        if seed in out:
            raise ValueError(f"two rows for seed {seed}: a paired effect needs one value per seed")
        out[seed] = float(row[value])  # type: ignore[arg-type]
    return out
