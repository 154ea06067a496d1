"""Tests of ue5m3.numerics.exact against exact rational arithmetic and math.fsum."""

import math
import random
from fractions import Fraction

import pytest
import torch

from helpers.rational import fp32 as _fp32
from ue5m3.numerics import exact


def _random_terms(rng: random.Random, n: int) -> list[float]:
    """FP64 terms with exponents from subnormal to huge, zeros, and exact cancellations."""
    terms = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.1:
            terms.append(0.0)
        elif kind < 0.2:
            terms.append(rng.choice([-1, 1]) * rng.randint(1, 2**20) * 2.0**-1074)  # subnormal
        else:
            terms.append(
                math.ldexp(rng.uniform(-1, 1), rng.randint(-1000, 1000) if kind < 0.4 else rng.randint(-60, 60))
            )
    terms += [-t for t in terms[: rng.randint(0, n)]]
    rng.shuffle(terms)
    return terms


def test_exact_sum_equals_math_fsum_and_the_fp32_rounding_of_the_rational_sum():
    rng = random.Random(7)
    for _ in range(300):
        terms = _random_terms(rng, rng.randint(1, 24))
        exact_value = sum(map(Fraction, terms), Fraction(0))
        t = torch.tensor(terms, dtype=torch.float64)
        assert float(exact.exact_sum(t)) == math.fsum(terms)
        if abs(exact_value) < 2**127:
            assert Fraction(float(exact.exact_sum(t, dtype=torch.float32))) == _fp32(exact_value)


def test_exact_sum_survives_cancellation_that_fp64_summation_gets_wrong():
    terms = torch.tensor([[2.0**60, 1.0, -(2.0**60), 2.0**-60], [1e300, 1e-300, -1e300, 0.0]], dtype=torch.float64)
    assert exact.exact_sum(terms).tolist() == [1.0 + 2.0**-60, 1e-300]
    assert terms.sum(-1).tolist() != [1.0 + 2.0**-60, 1e-300]


def test_exact_sum_rejects_non_fp64_and_non_finite_terms():
    with pytest.raises(TypeError, match="FP64"):
        exact.exact_sum(torch.ones(4))
    with pytest.raises(ValueError, match="finite"):
        exact.exact_sum(torch.tensor([1.0, math.inf], dtype=torch.float64))


def test_slice_partials_round_each_exact_slice_sum_once_and_total_the_exact_sum():
    rng = random.Random(3)
    rows = [[math.ldexp(rng.uniform(-1, 1), rng.randint(-40, 40)) for _ in range(12)] for _ in range(5)]
    p, totals = exact.slice_partials(torch.tensor(rows, dtype=torch.float64), width=4)
    for row, p_row, total in zip(rows, p.tolist(), totals.tolist(), strict=True):
        slices = [sum(map(Fraction, row[j : j + 4]), Fraction(0)) for j in range(0, 12, 4)]
        assert [Fraction(v) for v in p_row] == [_fp32(s) for s in slices]
        assert total == math.fsum(row)


def test_rtz_accumulation_across_large_exponent_gaps_is_exact():
    a = torch.tensor([1.0, 2.0**-30, -(2.0**-30), 3.0, -(2.0**60), 2.0**60], dtype=torch.float32)
    b = torch.tensor([2.0**-40, -1.0, 1.0, 2.0**-26, 1.0, -(2.0**-80)], dtype=torch.float32)
    got = exact.add_rtz(a, b)
    for x, y, r in zip(a.tolist(), b.tolist(), got.tolist(), strict=True):
        assert Fraction(r) == _fp32(Fraction(x) + Fraction(y), "rtz")
