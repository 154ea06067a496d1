"""Paired statistics and the three-valued verdict (ue5m3.experiments.paired), against scipy's Student t and by hand."""

from __future__ import annotations

import math

import pytest

from ue5m3.experiments.paired import Direction, Verdict, effect_row, judge, paired_effect, seeds_for_power

stats = pytest.importorskip("scipy.stats")


def test_the_interval_and_mde_are_the_paired_t_ones():
    treatment, baseline = {1: 6.0, 2: 6.5, 3: 5.5, 4: 6.1}, {1: 6.2, 2: 6.6, 3: 5.8, 4: 6.2}
    effect = paired_effect(treatment, baseline)
    d = [treatment[s] - baseline[s] for s in (1, 2, 3, 4)]
    mean, se = sum(d) / 4, stats.tstd(d) / 2
    t = stats.t.ppf(0.975, 3)
    assert effect.seeds == (1, 2, 3, 4) and effect.mean == pytest.approx(mean, abs=1e-15)
    assert effect.low == pytest.approx(mean - t * se, rel=1e-6) and effect.high == pytest.approx(
        mean + t * se, rel=1e-6
    )
    assert effect.mde == pytest.approx((t + stats.t.ppf(0.8, 3)) * se, rel=1e-6)


def test_only_the_seeds_both_sides_ran_are_paired():
    effect = paired_effect({1: 1.0, 2: 2.0, 3: 5.0}, {2: 1.0, 3: 3.0, 9: 0.0})
    assert effect.seeds == (2, 3) and effect.differences == (1.0, 2.0)
    with pytest.raises(ValueError, match="no seed in common"):
        paired_effect({1: 1.0}, {2: 1.0})


def test_one_seed_has_no_interval_and_is_inconclusive():
    effect = paired_effect({1: 1.0}, {1: 2.0})
    assert effect.mean == -1.0 and effect.low is effect.high is effect.mde is None
    assert judge(effect, Direction.LOWER) is Verdict.INCONCLUSIVE


@pytest.mark.parametrize(
    ("differences", "direction", "expected"),
    [
        ([-1.0, -1.1, -0.9], Direction.LOWER, Verdict.REPRODUCED),
        ([-1.0, -1.1, -0.9], Direction.HIGHER, Verdict.CONTRADICTED),
        ([1.0, 1.1, 0.9], Direction.LOWER, Verdict.CONTRADICTED),
        ([-1.0, 1.0, 0.1], Direction.LOWER, Verdict.INCONCLUSIVE),
    ],
)
def test_the_verdict_needs_the_interval_to_exclude_zero(differences, direction, expected):
    effect = paired_effect(dict(enumerate(differences)), dict.fromkeys(range(len(differences)), 0.0))
    assert judge(effect, direction) is expected


def test_an_equivalence_claim_needs_the_interval_inside_its_margin():
    close = paired_effect({1: 1e-5, 2: -1e-5, 3: 2e-5}, {1: 0.0, 2: 0.0, 3: 0.0})
    far = paired_effect({1: 1.0, 2: 1.1, 3: 0.9}, {1: 0.0, 2: 0.0, 3: 0.0})
    wide = paired_effect({1: 1.0, 2: -1.0, 3: 0.0}, {1: 0.0, 2: 0.0, 3: 0.0})
    assert judge(close, Direction.EQUIVALENT, margin=1e-3) is Verdict.REPRODUCED
    assert judge(far, Direction.EQUIVALENT, margin=1e-3) is Verdict.CONTRADICTED
    assert judge(wide, Direction.EQUIVALENT, margin=1e-3) is Verdict.INCONCLUSIVE
    with pytest.raises(ValueError, match="positive margin"):
        judge(close, Direction.EQUIVALENT)
    with pytest.raises(ValueError, match="takes no margin"):
        judge(close, Direction.LOWER, margin=0.1)


def test_a_claim_without_its_experiment_is_not_run():
    assert judge(None, Direction.LOWER) is Verdict.NOT_RUN
    assert effect_row(None, -0.0384, Verdict.NOT_RUN) == {
        "seeds": None,
        "effect": None,
        "interval_low": None,
        "interval_high": None,
        "mde": None,
        "paper_effect": -0.0384,
        "verdict": "not run",
    }


def test_seeds_for_power_is_the_smallest_n_whose_mde_reaches_the_effect():
    n = seeds_for_power(0.1, 0.05)
    mde = lambda k: (stats.t.ppf(0.975, k - 1) + stats.t.ppf(0.8, k - 1)) * 0.1 / math.sqrt(k)  # noqa: E731
    assert mde(n) <= 0.05 < mde(n - 1)
    with pytest.raises(ValueError, match="more than 5 seeds"):
        seeds_for_power(1.0, 0.01, most=5)


def test_identical_differences_give_no_interval_rather_than_certainty():
    effect = paired_effect({1: 45.0, 2: 47.0}, {1: 42.5, 2: 44.5})
    assert effect.mean == 2.5 and effect.sd == 0 and effect.low is effect.high is effect.mde is None
    assert judge(effect, Direction.HIGHER) is Verdict.INCONCLUSIVE
