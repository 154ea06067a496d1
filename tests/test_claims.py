"""The claims table (ue5m3.experiments.claims): every claim decided from the results it names, the paper's values
from the shipped reference tables, and "not run" where the experiment did not run here."""

from __future__ import annotations

import pandas as pd
import pytest

from ue5m3 import reference
from ue5m3.experiments import claims
from ue5m3.experiments.paired import Direction


def _windows(values: dict[str, list[float]]) -> pd.DataFrame:
    rows = [(r, s + 1, v) for r, vs in values.items() for s, v in enumerate(vs)]
    return pd.DataFrame(rows, columns=["recipe", "seed", "final_window_mean_loss"])


def _inputs(**over) -> claims.ClaimInputs:
    empty = pd.DataFrame()
    base = {
        "final_window": _windows({"ue5m3_b16": [3.0, 3.5, 4.0], "nvfp4_te": [3.25, 3.75, 4.375]}),
        "control_final_window": _windows({"ue5m3_b16": [3.0, 3.5], "ue5m3_b16_t2048_override": [2.875, 3.25]}),
        "nll": empty,
        "downstream": empty,
        "throughput": empty,
        "fits": {},
        "scale": "cpu",
    }
    return claims.ClaimInputs(**(base | over))


def _row(table: pd.DataFrame, key: str) -> pd.Series:
    return table.set_index("claim").loc[key]


def test_every_claim_has_one_row_and_the_verdict_comes_first():
    table = claims.claims_table(_inputs())
    assert list(table.columns)[0] == "verdict" and list(table.columns) == claims.CLAIMS_COLUMNS
    assert table["claim"].tolist() == [c.key for c in claims.CLAIMS]
    assert set(table["verdict"]) <= {"reproduced", "contradicted", "inconclusive", "not run"}


def test_the_training_claim_is_paired_per_seed_against_the_papers_gap():
    row = _row(claims.claims_table(_inputs()), "training_loss_vs_te")
    paper = reference.load("training_loss_final").set_index("config")["final_window_mean_loss"]
    assert row["paper_effect"] == pytest.approx(paper["ue5m3_b16"] - paper["nvfp4_te"])
    assert row["seeds"] == 3 and row["effect"] == pytest.approx(-0.2916666, abs=1e-6)
    assert row["verdict"] == "reproduced"  # -0.25, -0.25, -0.375: lower, as the paper says
    assert row["treatment"] == "UE5M3 B16 (proposed)" and row["baseline"] == "TE NVFP4"


def test_a_claim_whose_recipes_did_not_train_here_is_not_run():
    table = claims.claims_table(_inputs())
    assert _row(table, "no_rht_with_ue5m3")["verdict"] == "not run"
    assert "nvfp4_no_rht_all_linears" in _row(table, "no_rht_with_ue5m3")["note"]
    assert _row(table, "selective_sr")["verdict"] == "not run"


def test_the_override_control_pairs_its_two_variants():
    row = _row(claims.claims_table(_inputs()), "override_control")
    assert row["seeds"] == 2 and row["effect"] == pytest.approx(-0.1875)  # -0.125 and -0.25
    assert row["paper_effect"] == pytest.approx(-0.0065593719, abs=1e-9)


def test_hardware_claims_are_not_run_without_their_hardware():
    fits = {"synthetic": {"oracle": {"kind": "recorded", "recorded": {"kind": "emulator"}}, "identified": ["x"]}}
    table = claims.claims_table(_inputs(fits=fits))
    assert (
        _row(table, "identification")["verdict"] == "not run" and "synthetic" in _row(table, "identification")["note"]
    )
    assert _row(table, "native_throughput")["verdict"] == "not run"


def test_a_native_fit_decides_the_identification_claim():
    native = {"oracle": {"kind": "recorded", "recorded": {"kind": "native_te_nvfp4"}}}
    found = claims.claims_table(_inputs(fits={"b": native | {"identified": ["w64-exact-rtz-g1024"]}}))
    missed = claims.claims_table(_inputs(fits={"b": native | {"identified": ["w32-exact-rne-g1024"]}}))
    assert _row(found, "identification")["verdict"] == "reproduced"
    assert _row(missed, "identification")["verdict"] == "contradicted"


def test_a_native_throughput_run_decides_the_speed_up_claim():
    throughput = pd.DataFrame(
        {
            "run": ["native"] * 2,
            "execution": ["native_te"] * 2,
            "recipe": ["nvfp4_te", "nvfp4_no_rht_all_linears"],
            "tokens_per_second": [1000.0, 1200.0],
        }
    )
    row = _row(claims.claims_table(_inputs(throughput=throughput)), "native_throughput")
    assert row["effect"] == pytest.approx(0.2) and row["verdict"] == "reproduced"  # within 10% of the paper's 21.2%


def test_the_periodic_reference_claim_is_an_equivalence_within_the_papers_headline_gap():
    rows = [("ue5m3_b16", s, 150, p, 5.0 + s + (2**-12 if p == "cold_d50_replay" else 0.0)) for s in (1, 2, 3)
            for p in ("cold_d50_replay", "current_tensor")]  # fmt: skip
    nll = pd.DataFrame(rows, columns=["recipe", "seed", "step", "policy", "nll"])
    row = _row(claims.claims_table(_inputs(nll=nll)), "periodic_references")
    assert row["verdict"] == "inconclusive"  # a constant difference has no spread: no interval
    nll.loc[nll["seed"] == 3, "nll"] += [0.0, 2**-13]
    row = _row(claims.claims_table(_inputs(nll=nll)), "periodic_references")
    assert row["verdict"] == "reproduced" and "margin 0.00362" in row["note"]


def test_each_claim_states_a_direction_and_an_experiment_the_registry_knows():
    from ue5m3 import figures

    files = {f.file for f in figures.FIGURES}
    for claim in claims.CLAIMS:
        assert claim.experiment in files, claim.key
        assert isinstance(claim.direction, Direction) and claim.paper_section
