"""Tests of ue5m3.identify.fit: the fitter's self-test (it must recover the hidden parameters of a synthetic oracle
exactly) and the paper tables."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from helpers.identify import SMALL
from ue5m3.identify import EmulatorOracle, candidate_grid, fit, make_corpus, parse
from ue5m3.identify.corpus import Corpus
from ue5m3.identify.probes import FP8, CorpusConfig

REFERENCE = Path(__file__).resolve().parents[1] / "src" / "ue5m3" / "reference_data" / "emulator_identification.csv"


@pytest.mark.parametrize("hidden", ["w64-exact-rtz-g1024", "w32-exact-rne-g2048", "w64-fused35-rtz", "w128-exact-rtz"])
def test_self_test_recovers_hidden_parameters(corpus: Corpus, hidden: str) -> None:
    grid = candidate_grid(partial_bits=(None, 35))
    table = fit(corpus, EmulatorOracle(hidden), grid)
    assert table.identified() == [hidden]
    assert table.best() == hidden


def test_self_test_fp8_structure() -> None:
    corpus = make_corpus(CorpusConfig(**{**SMALL.__dict__, "scheme": FP8}))
    grid = candidate_grid(
        slice_widths=(16, 32, 64), partial_bits=(None, 13, 14), promotions=(None, 128), final_grids=(None,),
        extra=(), exact_sum=False,
    )  # fmt: skip
    table = fit(corpus, EmulatorOracle("w32-fused13-rtz-p128"), grid)
    # a 13-bit fused sum of 33 terms always fits FP32: the rne twin is the same model
    assert sorted(table.identified()) == ["w32-fused13-rne-p128", "w32-fused13-rtz-p128"]
    assert parse("w32-fused13-rne-p128").twin_of(parse("w32-fused13-rtz-p128"), block=1)
    assert not parse("w32-fused24-rne").twin_of(parse("w32-fused24-rtz"), block=1)  # 24 + 1 + 6 bits > 24
    assert not parse("w64-fused35-rne").twin_of(parse("w64-fused35-rtz"), block=16)


def test_paper_tables_cover_the_reference_rows(corpus: Corpus) -> None:
    table = fit(corpus, EmulatorOracle("w64-exact-rtz-g1024"), candidate_grid())
    rows = table.paper_tables()
    ours = {(r["experiment"], r["variant"]) for r in rows}
    with REFERENCE.open() as handle:
        reference = {(r["experiment"], r["variant"]) for r in csv.DictReader(handle)}
    missing = {r for r in reference - ours if r[0] != "bf16_witnesses"}  # no witness family in this corpus
    assert not missing
    by_variant = {(r["experiment"], r["variant"]): r for r in rows}
    assert (
        by_variant[("order_tests_group_width", "rtz_64")]["passed"]
        == by_variant[("order_tests_group_width", "rtz_64")]["total"]
    )


def test_paper_tables_skip_variants_the_best_candidate_cannot_take() -> None:
    from ue5m3.identify.fit import MatchTable

    names = ("w32-fused13-rtz-p128", "w64-fused13-rtz-p128", "w128-exact-rtz")  # w128 + p128 cannot exist
    table = MatchTable(
        candidates=names, passed={n: {"order": 4} for n in names}, total={"order": 4}, oracle={"kind": "test"}
    )
    rows = table.paper_tables("w32-fused13-rtz-p128")
    widths = [r["variant"] for r in rows if r["experiment"] == "order_tests_group_width"]
    assert widths == ["rtz_32", "rtz_64"]


class _MmaSimOracle:
    """MMA-Sim's Hopper FP8 wgmma model as a stand-in for an H100's torch._scaled_mm (the mmasim package itself)."""

    name = "mmasim:hopper_wgmma"

    def outputs(self, probe):
        from ue5m3.conformance.adapters.mmasim import fp8_gemm

        return fp8_gemm(probe.a, probe.b, "hopper_wgmma")[probe.rows, probe.cols]

    def describe(self):
        return {"kind": "mmasim", "model": "hopper_wgmma"}


def test_the_hopper_fp8_identification_names_the_mma_sim_model_that_matches() -> None:
    """MMA-Sim's Hopper and Blackwell FP8 models are matched beside the fitted candidates: against the mmasim
    package's Hopper wgmma model, the fit names mma_sim_hopper_fp8 and no other hardware model."""
    pytest.importorskip("mmasim", reason="mmasim is not installed (pip install 'ue5m3[conformance]')")
    corpus = make_corpus(CorpusConfig(**{**SMALL.__dict__, "scheme": FP8}))
    grid = candidate_grid(
        slice_widths=(32,), partial_bits=(13,), promotions=(None, 128), final_grids=(None,), extra=(), exact_sum=False
    )
    table = fit(corpus, _MmaSimOracle(), grid)
    assert table.identified_models() == ["mma_sim_hopper_fp8"]
    assert "mma_sim_blackwell_fp8" in table.candidates and "mma_sim_blackwell_fp4" not in table.candidates
    assert table.best() in {c.name for c in grid}  # the best fitted candidate is still a grid candidate


def test_block_scaled_fits_match_mma_sims_fp4_model_beside_the_candidates(corpus: Corpus) -> None:
    table = fit(corpus, EmulatorOracle("w64-exact-rtz-g1024"), candidate_grid())
    assert "mma_sim_blackwell_fp4" in table.candidates and "mma_sim_hopper_fp8" not in table.candidates
