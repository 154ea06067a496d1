"""Tests of ue5m3.identify.probes: probe families, fixed-point operands and BF16-midpoint witnesses."""

from __future__ import annotations

import pytest
import torch

from helpers.identify import SMALL
from ue5m3.identify.corpus import Corpus
from ue5m3.identify.probes import Probe, _bf16_midpoint_distance, witness_probe


def test_corpus_families_and_fixed_points(corpus: Corpus) -> None:
    assert set(corpus.probes) == {"order", "threshold", "broad_packed", "broad_quantized"}
    for probe in corpus.probes.values():
        a_q, b_q = probe.quantized()
        assert torch.equal(a_q.dequantize(), probe.a) and torch.equal(b_q.dequantize(), probe.b)
    packed = corpus.probes["broad_packed"]
    enc_a, _, alpha = packed.encoded()
    assert float(alpha) == 1.0
    scales = packed.quantized()[0].scales[:-1]  # the carrier row aside
    assert set(torch.log2(scales[scales > 0]).tolist()) <= set(range(-5, 7))
    order = corpus.probes["order"]
    sums = order.products().sum(1)
    assert torch.all(sums == sums[0])  # permutations keep the products, hence the exact sum


def test_probe_rejects_non_fixed_point() -> None:
    a = torch.randn(4, 32)
    with pytest.raises(ValueError, match="operand A is not a fixed point"):
        Probe(
            family="broad_packed",
            scheme="nvfp4",
            a=a,
            b=torch.zeros(32, 4),
            rows=torch.tensor([0]),
            cols=torch.tensor([0]),
        )


def test_bf16_midpoint_distance() -> None:
    one = torch.tensor([1.0 + 2.0**-8, 1.0 + 2.0**-8 + 2.0**-12, 1.0, -(1.0 + 2.0**-8)])
    assert _bf16_midpoint_distance(one).tolist() == [0.0, 2.0**-12 / 2.0**-7, 0.5, 0.0]


def test_witnesses_lie_near_bf16_midpoints() -> None:
    gen = torch.Generator().manual_seed(5)
    x, w = torch.randn(256, 256, generator=gen), torch.randn(64, 256, generator=gen) * 0.05
    probe = witness_probe(x, w, SMALL)
    decoded = (probe.a @ probe.b)[probe.rows, probe.cols]
    assert probe.compare == "bf16" and 0 < probe.rows.numel() <= SMALL.witness_cells
    assert bool((_bf16_midpoint_distance(decoded) <= SMALL.witness_tolerance).all())
