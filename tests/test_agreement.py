"""Tests for ue5m3.experiments.agreement: the tolerance rules and the agreement columns of the measurement tables.

Values are exact in binary, so every bound is tested on its edge and just past it.
"""

from __future__ import annotations

import pandas as pd
import pytest

from ue5m3.artifacts import write_csv
from ue5m3.experiments.agreement import AGREEMENT_COLUMNS, Criterion, Tolerance, with_agreement

CLOSE = Tolerance(criterion=Criterion.CLOSE, absolute=0.25, relative=0.5, reason="r")
LOOSE = Tolerance(criterion=Criterion.CLOSE, relative=2.0, reason="loose")
COMPLETE = Tolerance(criterion=Criterion.COMPLETE, reason="shares")


def _cells(series: pd.Series) -> list:
    return [None if pd.isna(v) else v for v in series]


@pytest.mark.parametrize(
    ("ours", "paper", "agrees"),
    [
        (3.25, 2.0, True),
        (3.5, 2.0, False),
        (0.75, 2.0, True),
        (0.5, 2.0, False),
        (-2.25, -2.0, True),
        (0.25, 0.0, True),
    ],
    ids=["upper edge", "past the upper edge", "lower edge", "past the lower edge", "negative paper", "zero paper"],
)
def test_close_accepts_up_to_absolute_plus_relative_times_the_papers_magnitude(ours, paper, agrees):
    assert CLOSE.agrees(ours, paper) is agrees  # bound 0.25 + 0.5 |paper|


def test_close_without_bounds_is_exact():
    exact = Tolerance(criterion=Criterion.CLOSE, reason="a count")
    assert exact.agrees(0.0, 0.0) and not exact.agrees(2.0**-30, 0.0)
    assert exact.describe() == "exact: ours == paper (a count)"


def test_a_sign_rule_is_gone_recipe_comparisons_are_paired():
    assert [c.value for c in Criterion] == ["close", "complete"]


@pytest.mark.parametrize(
    ("ours", "paper", "agrees"), [(1.0, 1.0, True), (0.5, 0.25, True), (1.0, 0.96875, False), (0.0, 1.0, False)]
)
def test_complete_agrees_when_both_or_neither_share_is_every_cell(ours, paper, agrees):
    assert COMPLETE.agrees(ours, paper) is agrees


def test_each_description_states_the_rule_and_its_reason():
    assert CLOSE.describe() == "|ours - paper| <= 0.25 + 50% of |paper| (r)"
    assert (
        Tolerance(criterion="close", relative=0.025, reason="r").describe() == "|ours - paper| <= 2.5% of |paper| (r)"
    )
    assert Tolerance(criterion="close", absolute=3.0, reason="r").describe() == "|ours - paper| <= 3 (r)"
    assert COMPLETE.describe() == "qualitative: both reproduce every cell, or neither does (shares)"


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"criterion": "close", "absolute": -1.0, "reason": "r"}, "absolute=-1.0"),
        ({"criterion": "close", "relative": -0.5, "reason": "r"}, "relative=-0.5"),
        ({"criterion": "complete", "absolute": 1.0, "reason": "r"}, "'complete' takes no bounds"),
        ({"criterion": "close", "reason": ""}, "reason"),
        ({"criterion": "nearly", "reason": "r"}, "nearly"),
    ],
    ids=["negative absolute", "negative relative", "bounds on an all-cells rule", "no reason", "unknown criterion"],
)
def test_a_tolerance_that_means_nothing_is_refused(fields, match):
    with pytest.raises(ValueError, match=match):
        Tolerance(**fields)


def _table() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "metric": ["a", "a", "b", "c", "a", "b"],
            "ours": [3.0, 1.0, -1.0, 5.0, None, 2.0],
            "paper": [2.0, 4.0, 1.0, 5.0, 1.0, 0.0],
        }
    )


def test_with_agreement_appends_difference_relative_difference_tolerance_and_verdict():
    table = _table()
    out = with_agreement(table, ours="ours", paper="paper", tolerance={"a": CLOSE, "b": LOOSE}, by="metric")
    assert list(out.columns) == [*table.columns, *AGREEMENT_COLUMNS]
    assert _cells(out["difference"]) == [1.0, -3.0, -2.0, None, None, 2.0]  # metric c has no tolerance
    assert _cells(out["relative_difference"]) == [0.5, -0.75, -2.0, None, None, None]  # none against a paper 0
    assert _cells(out["tolerance"]) == [CLOSE.describe()] * 2 + [LOOSE.describe(), None, CLOSE.describe()] + [
        LOOSE.describe()
    ]
    # our missing value is a paper number we did not test ("not run"); a paper 0 with a relative bound: exact
    expected = ["reproduced", "contradicted", "reproduced", None, "not run", "contradicted"]
    assert _cells(out["verdict"]) == expected
    assert table.equals(_table())  # the input is left alone


def test_with_agreement_leaves_rows_outside_compare_uncompared():
    table = _table()
    out = with_agreement(table, ours="ours", paper="paper", tolerance=CLOSE, compare=table["metric"] != "a")
    assert _cells(out["verdict"]) == [None, None, "contradicted", "reproduced", None, "contradicted"]
    assert _cells(out["tolerance"])[:2] == [None, None]


def test_with_agreement_writes_missing_cells_empty_never_nan(tmp_path):
    table = _table().assign(label=["x", "y", None, "z", "w", "v"])
    out = with_agreement(table, ours="ours", paper="paper", tolerance={"a": CLOSE}, by="metric")
    path = tmp_path / "t.csv"
    write_csv(path, out.to_dict("records"), list(out.columns))
    rows = path.read_text().splitlines()
    assert "nan" not in path.read_text()
    assert rows[3] == "b,-1.0,1.0,,,,,"  # no tolerance for b: nothing compared, nothing written
    assert rows[5] == f"a,,1.0,w,,,{CLOSE.describe()},not run"  # the paper's number, untested here


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"tolerance": {"a": CLOSE}}, "without by"), ({"tolerance": CLOSE, "by": "metric"}, "by='metric'")],
    ids=["mapping without by", "by with one tolerance"],
)
def test_with_agreement_needs_by_exactly_for_a_mapping(kwargs, match):
    with pytest.raises(ValueError, match=match):
        with_agreement(_table(), ours="ours", paper="paper", **kwargs)
