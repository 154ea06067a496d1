"""Tests of ue5m3.identify.oracles: hardware oracles fail closed, recorded oracles replay and check their corpus,
and the Hopper FP8 glue around ``torch._scaled_mm``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers.identify import SMALL
from ue5m3.identify import EmulatorOracle, OracleUnavailable, RecordedOracle, make_corpus, make_oracle, record
from ue5m3.identify.corpus import Corpus
from ue5m3.identify.oracles import HopperFP8Oracle, NativeNVFP4Oracle
from ue5m3.identify.probes import FP8, CorpusConfig, Probe


def test_hardware_oracles_fail_closed() -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present: the hardware oracles may run here")
    with pytest.raises(OracleUnavailable, match="needs a CUDA GPU"):
        HopperFP8Oracle()
    with pytest.raises(OracleUnavailable, match="native_te_nvfp4"):
        NativeNVFP4Oracle()
    with pytest.raises(OracleUnavailable):
        make_oracle("hopper_fp8:fast")


def test_make_oracle_rejects_unknown_spec() -> None:
    with pytest.raises(ValueError, match="unknown oracle 'tpu'"):
        make_oracle("tpu")


def test_recorded_oracle_replays_and_checks_the_corpus(corpus: Corpus, tmp_path: Path) -> None:
    path = corpus.save(tmp_path / "corpus.safetensors")
    hidden = EmulatorOracle("w32-exact-rne-g2048")
    recording = record(hidden, corpus, path, tmp_path / "labels.safetensors")
    replay = RecordedOracle(recording, path)
    for name, probe in corpus.probes.items():
        assert torch.equal(replay.outputs(probe), hidden.outputs(probe)), name
    other = make_corpus(CorpusConfig(**{**SMALL.__dict__, "seed": 7}), families=("threshold",))
    other_path = other.save(tmp_path / "other.safetensors")
    with pytest.raises(ValueError, match="recorded on corpus sha256"):
        RecordedOracle(recording, other_path)


def test_hopper_fp8_glue_feeds_scaled_mm_as_cublas_wants(monkeypatch) -> None:
    """The oracle's own code (padding, FP8 casts, column-major B, unit scales, cell gathering) against a stand-in
    for ``torch._scaled_mm`` that checks its inputs; the real GEMM needs an H100/H200 and is not faked here."""
    from ue5m3.identify import oracles

    seen = {}

    def scaled_mm(a, b, *, scale_a, scale_b, out_dtype, use_fast_accum):
        assert a.dtype == b.dtype == torch.float8_e4m3fn and out_dtype == torch.float32
        assert a.shape[0] % 16 == 0 and b.shape[1] % 16 == 0 and b.stride(0) == 1  # column-major B
        assert scale_a.dim() == scale_b.dim() == 0 and float(scale_a) == float(scale_b) == 1.0
        seen["fast"] = use_fast_accum
        return a.to(torch.float64).matmul(b.to(torch.float64)).to(torch.float32)

    monkeypatch.setattr(oracles, "_cuda_device", lambda *_: torch.device("cpu"))
    monkeypatch.setattr(torch, "_scaled_mm", scaled_mm, raising=False)
    corpus = make_corpus(CorpusConfig(**{**SMALL.__dict__, "scheme": FP8}), families=("broad_packed", "threshold"))
    oracle = oracles.HopperFP8Oracle(fast_accum=True)
    for probe in corpus.probes.values():
        expected = (probe.a.double() @ probe.b.double()).float()[probe.rows, probe.cols]
        assert torch.equal(oracle.outputs(probe), expected)
    odd = Probe(  # 5 x 32 @ 32 x 7: padded to 16 x 16 for _scaled_mm, the padding never read back
        family="broad_packed", scheme=FP8, a=torch.full((5, 32), 0.5), b=torch.full((32, 7), 2.0),
        rows=torch.tensor([0, 4]), cols=torch.tensor([6, 0]),
    )  # fmt: skip
    assert oracle.outputs(odd).tolist() == [32.0, 32.0]
    assert seen["fast"] is True
    with pytest.raises(ValueError, match="needs an fp8_e4m3 corpus"):
        oracle.outputs(make_corpus(SMALL, families=("threshold",)).probes["threshold"])
