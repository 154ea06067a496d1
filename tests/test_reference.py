"""The paper's reference numbers ship intact and load as tables."""

import pytest

from ue5m3 import reference


def test_every_reference_table_matches_its_pinned_checksum():
    assert len(reference.names()) == 10
    for name in reference.names():
        reference.verify(name)


def test_validation_nll_holds_84_points_of_7_configurations():
    table = reference.load("validation_nll")
    assert len(table) == 84
    assert table["config"].nunique() == 7
    assert sorted(table["step"].unique()) == list(range(2500, 30001, 2500))


def test_unknown_table_is_refused_with_the_known_names():
    with pytest.raises(ValueError, match="validation_nll"):
        reference.load("nope")
