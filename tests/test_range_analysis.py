"""The paper's range-analysis numbers come out of the code exactly (sections 4 and 5.2)."""

import csv
import json
import math
from fractions import Fraction

import pytest
import torch

from ue5m3.experiments import range_analysis
from ue5m3.numerics.formats import E4M3, UE5M3
from ue5m3.numerics.quantize import quantize
from ue5m3.numerics.schemes import BlockScheme


def test_ue5m3_max_is_137x_e4m3_max_and_its_min_subnormal_256x_smaller():
    facts = range_analysis.summary(range_analysis.RangeAnalysisConfig())
    assert facts["max_ratio_ue5m3_over_e4m3"] == 61440 / 448
    assert round(facts["max_ratio_ue5m3_over_e4m3"], 2) == 137.14
    assert facts["min_subnormal_ratio_e4m3_over_ue5m3"] == 256
    assert (facts["positive_finite_codes_ue5m3"], facts["positive_finite_codes_e4m3"]) == (247, 126)
    assert facts["headroom_ue5m3_t2048"] == 30
    assert round(facts["placement_gain_t2048_over_t448"], 2) == 4.57


@pytest.mark.parametrize(
    ("target", "code", "smallest", "largest"), [(448, 448, 1.7e-6, 13714), (2048, 2048, 3.7e-7, 3000)]
)
def test_worked_example_with_g_100_places_scales_as_the_paper_says(target, code, smallest, largest):
    row = range_analysis.worked_example(100.0, float(target))
    assert row["code_at_reference"] == code
    assert f"{row['smallest_block_amax']:.2g}" == f"{smallest:.2g}"
    assert round(row["largest_block_amax"]) == largest
    # Exact: smallest = 2^-17 * g / T, largest = 61440 * g / T
    assert Fraction(row["largest_block_amax"]).limit_denominator(10**6) == Fraction(61440 * 100, target)


@pytest.mark.parametrize("target", [448.0, 2048.0])
def test_worked_example_bounds_are_where_the_quantizer_places_the_extreme_codes(target):
    row = range_analysis.worked_example(100.0, target)
    scheme = BlockScheme(name="t", scale=UE5M3, block_size=16, target=target, zero_scale_repair=True)

    def scale_of(amax):
        block = torch.zeros(16)
        block[0] = amax
        return quantize(block, scheme, tensor_amax=100.0, backend="torch")

    assert float(scale_of(row["smallest_block_amax"] * 1.001).scales[0]) == UE5M3.min_subnormal
    assert int(scale_of(row["smallest_block_amax"] * 0.45).zero_rounded_blocks) == 1
    inside, outside = scale_of(row["largest_block_amax"] * (1 - 2**-16)), scale_of(row["largest_block_amax"] * 1.01)
    assert float(inside.scales[0]) == 61440 and int(inside.saturated_blocks) == 0
    assert float(outside.scales[0]) == 61440 and int(outside.saturated_blocks) == 1


def test_headroom_is_scale_max_over_target_for_both_formats():
    assert range_analysis.headroom(UE5M3, 448) == 61440 / 448
    assert range_analysis.headroom(E4M3, 448) == 1
    assert math.isclose(range_analysis.headroom(UE5M3, 2048), 30)


def test_run_writes_every_table_with_computed_values(tmp_path):
    paths = range_analysis.run(range_analysis.RangeAnalysisConfig(), tmp_path)
    assert {p.name for p in paths.values()} == {
        "formats.csv",
        "codebooks.csv",
        "headroom.csv",
        "worked_example.csv",
        "summary.json",
        "provenance.json",
    }
    rows = list(csv.DictReader(open(paths["codebooks"])))
    assert sum(1 for r in rows if r["format"] == "ue5m3" and float(r["value"]) > 0) == 247
    assert sum(1 for r in rows if r["format"] == "e4m3" and float(r["value"]) > 0) == 126
    headroom = {
        (r["scale_format"], float(r["target"])): float(r["headroom"]) for r in csv.DictReader(open(paths["headroom"]))
    }
    assert headroom[("ue5m3", 448.0)] == 61440 / 448
    prov = json.loads(paths["provenance"].read_text())
    assert prov["command"] == "range-analysis" and "torch" in prov["versions"]
    # byte-stable re-run
    before = {k: p.read_bytes() for k, p in paths.items()}
    range_analysis.run(range_analysis.RangeAnalysisConfig(), tmp_path)
    assert before == {k: p.read_bytes() for k, p in paths.items()}


def test_config_rejects_non_positive_targets_naming_the_key():
    with pytest.raises(ValueError, match="range_analysis.targets"):
        range_analysis.RangeAnalysisConfig(targets=(448.0, -1.0))
