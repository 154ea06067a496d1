"""Exact paired-t power (ue5m3.experiments.power) against textbook sample sizes, scipy's noncentral t and a
simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ue5m3.evaluation.nll import t_quantile
from ue5m3.experiments import power


@pytest.mark.parametrize(("d", "n", "printed"), [(0.2, 199, 0.8016910), (0.5, 34, 0.8077775), (0.8, 15, 0.8213105),
                                               (1.0, 10, 0.8030969)])  # fmt: skip
def test_seeds_needed_are_the_textbook_paired_t_sample_sizes(d, n, printed):
    """G*Power's paired t-test, two-tailed, alpha 0.05, power 0.80 (standardised effect d = mean / sd): n and the
    actual power it prints."""
    assert power.seeds_needed(d, 1.0) == n
    assert power.seeds_needed(-d * 0.01, 0.01) == n  # only the ratio and not the sign matters
    assert power.paired_power(n, d, 1.0) == pytest.approx(printed, abs=2e-6)
    assert power.paired_power(n - 1, d, 1.0) < 0.8


@pytest.mark.parametrize("n", [2, 3, 5, 12, 60, 400])
def test_power_at_no_effect_is_alpha(n):
    """At a zero effect the test rejects with probability alpha, by the definition of the t quantile."""
    assert power.paired_power(n, 0.0, 1.0) == pytest.approx(0.05, abs=1e-5)
    assert power.paired_power(n, 0.0, 1.0, alpha=0.2) == pytest.approx(0.2, abs=1e-5)


def test_power_matches_scipys_noncentral_t():
    stats = pytest.importorskip("scipy.stats")
    for n in (2, 3, 4, 7, 20, 150, 3000):
        for d in (0.05, 0.3, 1.0, 2.5):
            c = stats.t.ppf(0.975, n - 1)
            nc = d * math.sqrt(n)
            exact = stats.nct.sf(c, n - 1, nc) + stats.nct.cdf(-c, n - 1, nc)
            assert power.paired_power(n, d, 1.0) == pytest.approx(exact, abs=2e-6), (n, d)


def test_equivalence_power_matches_a_simulation():
    """The share of simulated seed sets whose 95% t interval lies inside the margin."""
    rng = np.random.default_rng(7)
    for n, effect, sd, margin in ((4, 0.0, 1.0, 2.0), (10, 0.2, 1.0, 0.8), (6, 0.01, 0.02, 0.03)):
        draws = rng.normal(effect, sd, size=(200_000, n))
        mean, s = draws.mean(axis=1), draws.std(axis=1, ddof=1)
        half = t_quantile(0.975, n - 1) * s / math.sqrt(n)
        share = float(np.mean((mean - half >= -margin) & (mean + half <= margin)))
        assert power.equivalence_power(n, effect, sd, margin) == pytest.approx(share, abs=4e-3)


def test_equivalence_seeds_grow_as_the_margin_shrinks_and_refusals():
    wide, narrow = power.seeds_needed(0.0, 1.0, margin=2.0), power.seeds_needed(0.0, 1.0, margin=0.5)
    assert 2 <= wide < narrow
    assert power.equivalence_power(narrow, 0.0, 1.0, 0.5) >= 0.8 > power.equivalence_power(narrow - 1, 0.0, 1.0, 0.5)
    assert power.seeds_needed(1e-6, 1.0, most=1000) is None
    for bad in (
        lambda: power.paired_power(1, 1, 1),
        lambda: power.paired_power(3, 1, 0),
        lambda: power.seeds_needed(0, 1),
    ):
        with pytest.raises(ValueError):
            bad()


@pytest.mark.parametrize(("n", "sd"), [(2, 1.0), (3, 0.13), (10, 0.05), (80, 0.1276)])
def test_detectable_effect_is_the_inverse_of_seeds_needed(n, sd):
    effect = power.detectable_effect(n, sd)
    assert power.paired_power(n, effect, sd) == pytest.approx(0.8, abs=1e-6)
    assert power.seeds_needed(effect * 1.001, sd) <= n < power.seeds_needed(effect * 0.99, sd)
