"""A probe corpus: every probe family under one seed, saved as one safetensors file with provenance.

:func:`make_corpus` draws the families of :mod:`.probes` in a fixed order from one generator; witnesses come from
a real GEMM when one is given, and the order tests' base is chosen from the operands alone (see
:func:`_order_tests`). :class:`Corpus` saves and loads atomically; its file's SHA-256 ties oracle recordings to it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from ue5m3.artifacts import atomic_path
from ue5m3.identify.probes import (
    CARRIER,
    FAMILIES,
    FP8,
    CorpusConfig,
    Probe,
    _fixed_point,
    _with_carrier,
    broad_probe,
    order_probe,
    threshold_probe,
    witness_probe,
)
from ue5m3.numerics.quantize import get_scheme

__all__ = ["Corpus", "make_corpus"]


def _span_bits(products: torch.Tensor) -> torch.Tensor:
    """Per cell: bits from the lowest set bit of the smallest nonzero product to the top of the largest (an
    operand-only measure of how much rounding the sum can need; 0 for all-zero cells)."""
    mantissa, exponent = torch.frexp(products)
    _, low = torch.frexp(
        mantissa
        * 2.0**53
        / (mantissa * 2.0**53)
        .to(torch.int64)
        .bitwise_and(-(mantissa * 2.0**53).to(torch.int64))
        .to(torch.float64)
        .clamp(min=1)
    )
    nonzero = products != 0
    top = torch.where(nonzero, exponent, -(1 << 20)).amax(1)
    bottom = torch.where(nonzero, exponent - low, 1 << 20).amin(1)
    return torch.where(nonzero.any(1), top - bottom, 0)


def _order_tests(witness: Probe | None, cfg: CorpusConfig, gen: torch.Generator) -> tuple[Probe, dict[str, Any]]:
    """The order tests' base, chosen from the operands alone (never from a model): the witness whose products
    span the most bits, as the paper used a witness; if no witness spans more than FP32's 24 bits (every order
    of FP32 additions could then be exact and the tests would say nothing), a wide synthetic pair with
    log-uniform block magnitudes over 2^-12 .. 2^12."""
    if witness is not None:
        spans = _span_bits(witness.products())
        best = int(torch.argmax(spans))
        if int(spans[best]) > 24:
            row, col = int(witness.rows[best]), int(witness.cols[best])
            amax = (float(witness.a.abs().max()), float(witness.b.abs().max()))
            base = {"source": "witness", "cell": [row, col], "span_bits": int(spans[best])}
            return order_probe(witness.a[row], witness.b[:, col], cfg, gen, amax=amax), base
    block = 1 if cfg.scheme == FP8 else get_scheme(cfg.scheme).block_size
    magnitude = torch.exp2(torch.rand(2, cfg.order_k // block, generator=gen) * 14 - 14).repeat_interleave(block, 1)
    pair = torch.randn(2, cfg.order_k, generator=gen) * magnitude
    base = {"source": "synthetic_wide", "witness_max_span_bits": None if witness is None else int(spans.max())}
    if cfg.scheme == FP8:
        a, b = (_fixed_point(v, FP8, 0, "order.base") for v in pair)
        return order_probe(a, b, cfg, gen), base
    # Carriers 2^10 above the pair's own amax: the pair then sits low in the tensor, with small encoded values
    # and a small accumulator, as a row of a real activation tensor with outliers elsewhere does.
    amax = (float(pair[0].abs().max()) * CARRIER, float(pair[1].abs().max()) * CARRIER)
    a = _fixed_point(_with_carrier(pair[:1], amax[0], 0), cfg.scheme, 1, "order.base.A")
    b = _fixed_point(_with_carrier(pair[1:].T.contiguous(), amax[1], 1), cfg.scheme, 0, "order.base.B")
    amax = (float(a.abs().max()), float(b.abs().max()))
    return order_probe(a[0], b[:, 0], cfg, gen, amax=amax), base


@dataclass(frozen=True)
class Corpus:
    """Probes keyed by family, the config that made them, and provenance."""

    config: CorpusConfig
    probes: dict[str, Probe]
    provenance: Mapping[str, Any] = field(default_factory=dict)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write one safetensors file atomically (tensors + JSON metadata); returns the path."""
        tensors, meta = {}, {}
        for name, probe in self.probes.items():
            for key in ("a", "b", "rows", "cols"):
                tensors[f"{name}.{key}"] = getattr(probe, key).contiguous().clone()  # rows may alias cols
            meta[name] = {"scheme": probe.scheme, "compare": probe.compare}
        header = {"config": asdict(self.config), "probes": meta, "provenance": dict(self.provenance)}
        path = Path(path)
        with atomic_path(path) as tmp:
            save_file(tensors, str(tmp), metadata={"ue5m3_corpus": json.dumps(header, sort_keys=True)})
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Corpus:
        from safetensors import safe_open  # noqa: PLC0415

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"probe corpus {path} does not exist; make it with 'ue5m3 make-probes'")
        try:
            with safe_open(str(path), framework="pt") as handle:
                header = json.loads((handle.metadata() or {})["ue5m3_corpus"])
            tensors = load_file(str(path))
        except Exception as err:  # truncated or foreign file
            raise ValueError(f"{path} is not a readable ue5m3 probe corpus ({err})") from err
        probes = {
            name: Probe(
                family=name,
                a=tensors[f"{name}.a"],
                b=tensors[f"{name}.b"],
                rows=tensors[f"{name}.rows"],
                cols=tensors[f"{name}.cols"],
                **meta,
            )
            for name, meta in header["probes"].items()
        }
        return cls(config=CorpusConfig(**header["config"]), probes=probes, provenance=header["provenance"])


def make_corpus(
    cfg: CorpusConfig,
    *,
    witness_gemm: tuple[torch.Tensor, torch.Tensor] | None = None,
    families: Sequence[str] = FAMILIES,
    provenance: Mapping[str, Any] | None = None,
) -> Corpus:
    """Every requested family under one seed; ``witness_gemm`` (x, w) of a real linear gives the witnesses and
    the order tests' base (without it the witness family is skipped and the base is Gaussian)."""
    unknown = set(families) - set(FAMILIES)
    if unknown:
        raise ValueError(f"unknown probe families {sorted(unknown)}; known: {list(FAMILIES)}")
    gen = torch.Generator().manual_seed(cfg.seed)
    probes: dict[str, Probe] = {}
    meta: dict[str, Any] = {}
    if "witness" in families and witness_gemm is not None:
        probes["witness"] = witness_probe(*witness_gemm, cfg)
    if "order" in families:
        probes["order"], base = _order_tests(probes.get("witness"), cfg, gen)
        meta["order_base"] = base
    if "threshold" in families:
        probes["threshold"] = threshold_probe(cfg, gen)
    if "broad_packed" in families:
        probes["broad_packed"] = broad_probe(cfg, gen, packed=True)
    if "broad_quantized" in families:
        probes["broad_quantized"] = broad_probe(cfg, gen, packed=False)
    return Corpus(config=cfg, probes=probes, provenance={**(provenance or {}), **meta})
