"""Tests of ue5m3.identify.corpus: saving and loading a probe corpus, span bits, witness-fed order tests and
their provenance."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers.identify import SMALL
from ue5m3.identify import make_corpus
from ue5m3.identify.corpus import Corpus


def test_corpus_round_trip_and_truncation(corpus: Corpus, tmp_path: Path) -> None:
    path = corpus.save(tmp_path / "corpus.safetensors")
    loaded = Corpus.load(path)
    assert loaded.config == corpus.config and set(loaded.probes) == set(corpus.probes)
    for name, probe in corpus.probes.items():
        assert torch.equal(loaded.probes[name].a, probe.a) and torch.equal(loaded.probes[name].rows, probe.rows)
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(ValueError, match="broken.safetensors is not a readable ue5m3 probe corpus"):
        Corpus.load(broken)
    with pytest.raises(FileNotFoundError, match="make-probes"):
        Corpus.load(tmp_path / "missing.safetensors")


def test_span_bits_counts_bit_positions() -> None:
    from ue5m3.identify.corpus import _span_bits

    products = torch.tensor([[1.0, 2.0**-30, 0.0], [3.0, -3.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    assert _span_bits(products).tolist() == [31, 2, 0]


def test_witnesses_feed_the_corpus_and_its_provenance() -> None:
    gen = torch.Generator().manual_seed(11)
    # block magnitudes spread over 2^18: some witness products span more than FP32's 24 bits
    spread = torch.exp2(torch.randint(-14, 4, (128, 16), generator=gen).float()).repeat_interleave(16, 1)
    x, w = torch.randn(128, 256, generator=gen) * spread, torch.randn(64, 256, generator=gen) * 0.05
    corpus = make_corpus(SMALL, witness_gemm=(x, w), families=("witness", "order"))
    assert set(corpus.probes) == {"witness", "order"}
    base = corpus.provenance["order_base"]
    assert base["source"] == "witness" and base["span_bits"] > 24
    row, col = base["cell"]
    order, witness = corpus.probes["order"], corpus.probes["witness"]
    assert torch.equal(order.a[0], witness.a[row]) and torch.equal(order.b[:, 0], witness.b[:, col])
    # the carrier row keeps the witness tensor's amax, hence every block scale of the base row
    a_q = order.quantized()[0]
    assert torch.equal(a_q.scales[0], witness.quantized()[0].scales[row])
    # without wide witnesses the base is the wide synthetic pair
    narrow = make_corpus(SMALL, witness_gemm=(torch.randn(128, 256, generator=gen), w), families=("witness", "order"))
    assert narrow.provenance["order_base"]["source"] == "synthetic_wide"
