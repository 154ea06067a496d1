"""The conformance stage (ue5m3.conformance): every cell judged, peers that are missing shown as such, counterexamples
loadable, the matrix versioned with the peers' versions, and the cells this project knows by heart held to their
verdicts (MMA-Sim, gfloat and the casts bit-exact; fouroversix, torchao and Transformer Engine's transcription
different only by named causes)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from ue5m3.conformance import judge, operations
from ue5m3.conformance.corpus import Case
from ue5m3.conformance.known import KNOWN
from ue5m3.conformance.run import ConformanceConfig, run


@pytest.fixture(scope="module")
def matrix(tmp_path_factory) -> tuple[list[dict], dict, Path]:
    out = tmp_path_factory.mktemp("conformance")
    paths = run(ConformanceConfig(rows=32, cols=128), out)
    with open(paths["matrix"]) as handle:
        cells = list(csv.DictReader(handle))
    return cells, json.loads(paths["provenance"].read_text()), out


def _cell(cells, operation, peer):
    (row,) = [c for c in cells if c["operation"] == operation and c["peer"] == peer]
    return row


def test_every_operation_has_one_judged_cell_and_the_peers_versions_are_recorded(matrix):
    cells, record, _ = matrix
    assert len(cells) == len(operations.OPERATIONS)
    assert {c["verdict"] for c in cells} <= {v.value for v in judge.Verdict}
    assert set(record["peers"]) == {op.peer for op in operations.OPERATIONS}
    assert record["known_differences"] == KNOWN and len(record["corpus_sha256"]) == 64
    for cell in cells:
        if cell["verdict"] not in ("not_installed", "not_run"):
            assert int(cell["elements"]) > 0, cell
        for cause in filter(None, cell["known_difference"].split(";")[0].split(", ")):
            assert cause in KNOWN, cause


def test_a_differing_cell_names_its_cause_and_saves_a_loadable_counterexample(matrix):
    cells, _, out = matrix
    for cell in cells:
        if cell["verdict"] == "different":
            assert cell["known_difference"] and cell["counterexample"], cell
            record = torch.load(out / "counterexamples" / cell["counterexample"])
            i = record["first_differing_index"]
            assert record["ours"][i].view(torch.int32) != record["theirs"][i].view(torch.int32)
            assert record["input"].dtype == torch.float32 and record["peer"] == cell["peer"]


@pytest.mark.parametrize(
    ("operation", "peer"),
    [
        ("block-scaled GEMM (NVFP4)", "mmasim"),
        ("block-scaled GEMM (MXFP4)", "mmasim"),
        ("block-scaled GEMM (UE5M3 B16, as FP16 scales)", "mmasim"),
        ("UE5M3 cast (RNE)", "gfloat"),
        ("E2M1 cast (RNE)", "ml_dtypes"),
    ],
)
def test_the_cells_that_must_agree_are_bit_exact(matrix, operation, peer):
    pytest.importorskip(peer)
    assert _cell(matrix[0], operation, peer)["verdict"] == "bit_exact"


@pytest.mark.parametrize(
    ("operation", "peer", "module", "cause"),
    [
        ("4/6 selection (MSE)", "fouroversix", "fouroversix", "fouroversix_negative_zero"),
        ("NVFP4 quantize (torchao order)", "torchao", "torchao", "torchao_scale_floor"),
        ("MXFP4 quantize (floor)", "torchao", "torchao", "torchao_e8m0_min_scale"),
        ("MXFP4 quantize (rceil)", "torchao", "torchao", "torchao_e8m0_min_scale, torchao_rceil_fp32_log2"),
        ("NVFP4 quantize (TE order)", "transformer-engine", "", "te_negative_zero"),
        ("NVFP4 quantize (TE order)", "nvidia-modelopt", "modelopt", "modelopt_negative_zero, zero_scale_payload"),
    ],
)
def test_known_differences_explain_every_differing_element(matrix, operation, peer, module, cause):
    if module:
        pytest.importorskip(module)
    cell = _cell(matrix[0], operation, peer)
    assert cell["verdict"] == "different" and cell["known_difference"] == cause


def test_no_cell_leaves_a_differing_element_unexplained(matrix):
    assert [c for c in matrix[0] if "unexplained" in c["known_difference"]] == []


def _operation(name: str, peer: str) -> operations.Operation:
    (op,) = [op for op in operations.OPERATIONS if op.name == name and op.peer == peer]
    return op


def _judged(op: operations.Operation, x: torch.Tensor) -> tuple[operations.Outcome, torch.Tensor]:
    """The outcome on one hand-made case and its differing elements that no known difference explains."""
    outcome = op.function(Case("minimal", x))
    differing = judge.compare(outcome.ours, outcome.theirs, outcome.excluded).differing
    unexplained = differing.clone()
    for mask in outcome.explained.values():
        unexplained &= ~mask.reshape(-1)
    return outcome, unexplained


def test_torchao_rceil_rounds_a_descale_just_above_a_power_of_two_down_through_its_fp32_log2():
    pytest.importorskip("torchao")
    # block 0: a_B = 0x3BC00002, a_B / 6 = 2^-10 (1 + 2^-23) (0x3A800001): the exact round-up is 2^-9 (code 118);
    # torchao's FP32 log2 of it is -10.0, so its ceil gives 2^-10 (code 117) and the payload doubles (3 -> 6).
    # block 1: a_B / 6 = 1.5 * 2^-10, far from a power of two: both give 2^-9.
    a = torch.tensor(0x3BC00002, dtype=torch.int32).view(torch.float32)
    x = torch.stack([a * torch.tensor([1.0, -1.0, 0.5, -0.5] * 8), torch.full((32,), 6 * 1.5 * 2.0**-10)])
    outcome, unexplained = _judged(_operation("MXFP4 quantize (rceil)", "torchao"), x)
    assert outcome.ours[:2].tolist() == [118.0, 118.0] and outcome.theirs[:2].tolist() == [117.0, 118.0]
    assert outcome.ours[2:6].tolist() == [3.0, -3.0, 1.5, -1.5] and outcome.theirs[2:6].tolist() == [6, -6, 3, -3]
    assert torch.equal(outcome.ours[34:], outcome.theirs[34:])  # block 1's payload agrees
    explained = outcome.explained["torchao_rceil_fp32_log2"]
    assert explained[[0, 2]].all() and not explained[[1, 34]].any()
    assert not unexplained.any()


def test_modelopt_writes_negative_zero_as_positive_zero():
    pytest.importorskip("modelopt")
    x = torch.tensor([[2688.0, -0.0, 1.0, -0.0, 0.0, -3.0, -0.0, 6.0, -1.0, 0.5, -0.0, 2.0, -0.0, 4.0, -6.0, 0.0]])
    outcome, unexplained = _judged(_operation("NVFP4 quantize (TE order)", "nvidia-modelopt"), x)
    differing = judge.compare(outcome.ours, outcome.theirs).differing
    negative_zero = [1 + i for i, v in enumerate(x[0].tolist()) if v == 0 and str(v) == "-0.0"]  # after 1 scale
    assert torch.nonzero(differing).flatten().tolist() == negative_zero
    assert torch.signbit(outcome.ours[negative_zero]).all() and not torch.signbit(outcome.theirs[negative_zero]).any()
    assert outcome.explained["modelopt_negative_zero"][negative_zero].all() and not unexplained.any()


def test_the_stochastic_cell_states_its_test_and_p_value(matrix):
    pytest.importorskip("gfloat")
    cell = _cell(matrix[0], "E2M1 stochastic rounding", "gfloat")
    assert cell["verdict"] == "equal_in_distribution" and "chi-square" in cell["detail"] and "p = " in cell["detail"]


def test_a_peer_that_is_not_installed_is_a_cell_not_a_skip(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mmasim" else real(name, *a))
    paths = run(ConformanceConfig(rows=8, cols=64), tmp_path)
    with open(paths["matrix"]) as handle:
        cells = [c for c in csv.DictReader(handle) if c["peer"] == "mmasim"]
    assert cells and all(c["verdict"] == "not_installed" for c in cells)
    assert all("pip install 'ue5m3[conformance]'" in c["detail"] for c in cells)


def test_ulp_distance_counts_fp32_steps_and_the_sign_of_zero():
    a = torch.tensor([1.0, 0.0, -0.0, float("nan"), 1.0])
    b = torch.tensor([torch.nextafter(torch.tensor(1.0), torch.tensor(2.0)).item(), -0.0, -0.0, float("nan"), 2.0])
    assert judge.ulp_distance(a, b).tolist() == [1.0, 1.0, 0.0, 0.0, float(1 << 23)]


def test_the_config_refuses_bad_values():
    with pytest.raises(ValueError, match="multiple of 64"):
        ConformanceConfig(cols=100)
    with pytest.raises(ValueError, match="p_value_threshold"):
        ConformanceConfig(p_value_threshold=1.5)
