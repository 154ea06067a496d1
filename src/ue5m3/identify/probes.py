"""Probe GEMMs for emulator identification: what an oracle is asked to compute, family by family.

A :class:`Probe` is one GEMM C = A @ B (A [M, K], B [K, N]) and the output cells (rows[i], cols[i]) whose values
are compared. Its operands are stored as the FP32 values a native GEMM is fed, and are *fixed points of the
scheme's quantizer*: quantizing them (RNE, 1D blocks along K) reproduces them exactly, so Transformer Engine's
NVFP4 quantizer (which :func:`ue5m3.numerics.quantize.quantize` reproduces bit for bit) hands the hardware exactly the
payloads and scales every candidate model sees. FP8 probes hold E4M3 values with unit scales. Where operand rows
are cut out of a larger tensor, one extra "carrier" row (column) holding the original tensor amax keeps the
tensor scale, and with it every block scale, unchanged; carriers are never cells.

Families (gemm spec section 3; one probe each, CPU or paper sizes from :class:`CorpusConfig`):

* ``order``: permutations of the 16-wide K-blocks of one dot product (same products and exact sum, different
  physical order), as the diagonal cells of a P x P GEMM; the base is the first witness, as in the paper, or
  a Gaussian pair when there is no witness.
* ``threshold``: same-sign dot products of one to three large terms and a few small ones 4-40 bits below them
  at random K positions: whether a small term survives, and where, exposes the slice width, the partial-sum
  precision, the rounding direction and the final grid.
* ``broad_packed``: uniform E2M1 codes with power-of-two block scales 2^e, e uniform in -5..6, alpha = 1 (a
  block without a +-6 gets one at a random position so that it is a quantizer fixed point); sampled cells.
* ``broad_quantized``: wide Gaussian operands with log-normal row and column scales, quantized; sampled cells.
* ``witness``: cells of a real model GEMM whose decoded-operand result lies within ``tolerance`` BF16 ulps of a
  BF16 midpoint, so the accumulation order decides the BF16 output (compared in BF16).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ue5m3.config import Range
from ue5m3.numerics import formats
from ue5m3.numerics.gemm import alpha
from ue5m3.numerics.quantize import get_scheme, quantize

__all__ = [
    "FP8",
    "FAMILIES",
    "Probe",
    "CorpusConfig",
    "threshold_probe",
    "broad_probe",
    "witness_probe",
    "order_probe",
]

FP8 = "fp8_e4m3"
FAMILIES = ("order", "threshold", "broad_packed", "broad_quantized", "witness")
COMPARE = ("fp32", "bf16")
CARRIER = 16.0


def _fixed_point(values: torch.Tensor, scheme: str, axis: int, name: str) -> torch.Tensor:
    """Values that the scheme's quantizer (RNE, 1D along ``axis``) reproduces exactly: quantize-dequantize
    until stable (one pass nearly always suffices; FP32 rounding of the scale can need a second)."""
    if scheme == FP8:
        out = formats.round_to_format(values, formats.E4M3, "rne")
        return out
    current = values.to(torch.float32)
    for _ in range(4):
        nxt = quantize(current, scheme, axis=axis, name=name).dequantize()
        if torch.equal(nxt, current):
            return current
        current = nxt
    raise ValueError(f"probe operand {name}: no quantizer fixed point under {scheme!r} after 4 passes")


@dataclass(frozen=True)
class Probe:
    """One probe GEMM and the cells compared (see the module docstring).

    Attributes:
        family: one of :data:`FAMILIES` (also the probe's key in a corpus).
        scheme: a block scheme name (``nvfp4``, ``ue5m3_b16``, ...) or ``fp8_e4m3``.
        a: A [M, K] FP32 values fed to the GEMM (quantizer fixed points).
        b: B [K, N] FP32 values.
        rows: int64 [C] output rows of the compared cells.
        cols: int64 [C] output columns.
        compare: ``fp32`` (bitwise FP32 outputs) or ``bf16`` (outputs cast to BF16, as a linear returns them).
    """

    family: str
    scheme: str
    a: torch.Tensor
    b: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    compare: str = "fp32"

    def __post_init__(self) -> None:
        where = f"probe {self.family!r}"
        if self.family not in FAMILIES:
            raise ValueError(f"{where}: family must be one of {FAMILIES}")
        if self.compare not in COMPARE:
            raise ValueError(f"{where}: compare must be one of {COMPARE}, got {self.compare!r}")
        if self.a.dim() != 2 or self.b.dim() != 2 or self.a.shape[1] != self.b.shape[0]:
            raise ValueError(
                f"{where}: needs A [M, K] and B [K, N], got {tuple(self.a.shape)} and {tuple(self.b.shape)}"
            )
        if self.a.dtype != torch.float32 or self.b.dtype != torch.float32:
            raise TypeError(f"{where}: operands must be FP32 values")
        if self.rows.shape != self.cols.shape or self.rows.dim() != 1 or self.rows.numel() == 0:
            raise ValueError(f"{where}: rows and cols must be equal-length non-empty 1-D index tensors")
        if (
            int(self.rows.max()) >= self.a.shape[0]
            or int(self.cols.max()) >= self.b.shape[1]
            or int(torch.minimum(self.rows.min(), self.cols.min())) < 0
        ):
            raise ValueError(f"{where}: a cell index lies outside the {self.a.shape[0]} x {self.b.shape[1]} output")
        if self.a.shape[1] % self.block:
            raise ValueError(f"{where}: K={self.a.shape[1]} is not a multiple of the block size {self.block}")
        # Quantize once here: the check that the operands are fixed points, and the encoding every candidate uses.
        if self.scheme == FP8:
            encoded = (self.a, self.b, torch.ones((), dtype=torch.float32))
            requantized = tuple(formats.round_to_format(v, formats.E4M3, "rne") for v in (self.a, self.b))
        else:
            quantized = tuple(
                quantize(v, self.scheme, axis=axis, name=f"{self.family}.{name}")
                for name, v, axis in (("A", self.a, 1), ("B", self.b, 0))
            )
            encoded = (quantized[0].encoded(), quantized[1].encoded(), alpha(*quantized))
            requantized = tuple(q.dequantize() for q in quantized)
            object.__setattr__(self, "_quantized", quantized)
        for operand, values, again in zip("AB", (self.a, self.b), requantized, strict=True):
            if not torch.equal(again, values):
                raise ValueError(f"{where}: operand {operand} is not a fixed point of the {self.scheme} quantizer")
        object.__setattr__(self, "_encoded", encoded)

    @property
    def block(self) -> int:
        return 1 if self.scheme == FP8 else get_scheme(self.scheme).block_size

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.a.shape[0], self.a.shape[1], self.b.shape[1]

    def quantized(self) -> tuple[Any, Any]:
        """The operands as QuantizedTensors (block schemes only)."""
        if self.scheme == FP8:
            raise ValueError(f"probe {self.family!r}: FP8 probes have no block quantization")
        return self._quantized

    def encoded(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(A encoded [M, K], B encoded [K, N], alpha): what the tensor core multiplies, and the FP32 factor
        that maps the accumulator back (gemm spec section 2); FP8 probes are their own encoding, alpha = 1."""
        return self._encoded

    def products(self) -> torch.Tensor:
        """Exact FP64 products [C, K] of the encoded operands of every cell."""
        enc_a, enc_b, _ = self.encoded()
        return enc_a[self.rows].to(torch.float64) * enc_b[:, self.cols].T.to(torch.float64)

    def cast(self, outputs: torch.Tensor) -> torch.Tensor:
        """Outputs in the dtype this probe compares."""
        return outputs.to(torch.bfloat16) if self.compare == "bf16" else outputs.to(torch.float32)


@dataclass(frozen=True, kw_only=True)
class CorpusConfig:
    """Sizes and seed of a probe corpus (defaults: CPU scale; ``config/paper.yaml`` has the paper's)."""

    scheme: str = "nvfp4"
    """Block scheme of the operands (``nvfp4`` for Blackwell, ``fp8_e4m3`` for Hopper FP8, any for emulators)."""
    seed: int = 20260721
    """Seed of every random draw."""
    order_k: int = 1024
    """K of the order tests' base dot product when there is no witness (else the witness GEMM's K)."""
    order_permutations: int = 64
    """Permutations of the base's K-blocks, the identity included (258 in the paper)."""
    threshold_k: int = 512
    """K of the threshold probes."""
    threshold_cells: int = 512
    """Threshold dot products."""
    broad_m: int = 64
    """Rows of the broad probe GEMMs (128 in the paper)."""
    broad_n: int = 64
    """Columns of the broad probe GEMMs (256 in the paper)."""
    broad_k: int = 1024
    """K of the broad probe GEMMs (6144 in the paper)."""
    broad_cells: int = 256
    """Cells sampled from each broad GEMM (512 in the paper)."""
    witness_tolerance: float = 0.125
    """Largest distance of a witness's decoded result from a BF16 midpoint, in BF16 ulps."""
    witness_cells: int = 64
    """Most witnesses kept, nearest the midpoint first."""

    RANGES: ClassVar[dict[str, Range]] = {
        "seed": Range(0, 2**63 - 1, note="a seed"),
        "order_k": Range(1, 2**20, note="K of the order tests"),
        "order_permutations": Range(1, 10**5, note="permutations; the paper: 258"),
        "threshold_k": Range(1, 2**20, note="K of the threshold probes"),
        "threshold_cells": Range(1, 10**7, note="threshold dot products"),
        "broad_m": Range(1, 2**16, note="rows; the paper: 128"),
        "broad_n": Range(1, 2**16, note="columns; the paper: 256"),
        "broad_k": Range(1, 2**20, note="K; the paper: 6,144"),
        "broad_cells": Range(1, 10**7, note="cells per GEMM; the paper: 512"),
        "witness_tolerance": Range(0, 0.5, low_open=True, note="BF16 ulps from a midpoint"),
        "witness_cells": Range(1, 10**7, note="witnesses kept"),
    }

    def __post_init__(self) -> None:
        if self.scheme != FP8:
            get_scheme(self.scheme)  # raises for an unknown scheme, naming it
        for key in ("order_k", "threshold_k", "broad_k"):
            if getattr(self, key) <= 0 or getattr(self, key) % 256:
                raise ValueError(f"{key}: must be a positive multiple of 256, got {getattr(self, key)!r}")
        for key in ("order_permutations", "threshold_cells", "broad_m", "broad_n", "broad_cells", "witness_cells"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}: must be positive, got {getattr(self, key)!r}")
        if self.broad_cells > self.broad_m * self.broad_n:
            raise ValueError("broad_cells: exceeds broad_m * broad_n")
        if not 0 < self.witness_tolerance <= 0.5:
            raise ValueError(f"witness_tolerance: must be in (0, 0.5] ulps, got {self.witness_tolerance!r}")


# ----- element and scale values ---------------------------------------------------------------------------


def _element_format(scheme: str) -> formats.FloatFormat:
    return formats.E4M3 if scheme == FP8 else get_scheme(scheme).element


def _carrier_amax(scheme: str) -> float:
    """Tensor amax that makes the tensor scale 1 (alpha = 1): T * F."""
    s = get_scheme(scheme)
    return float(s.target) * s.element.max_finite


def _round_scale(log2_value: torch.Tensor, scheme: str) -> torch.Tensor:
    """Scale (or FP8 element) values nearest 2^log2_value, clamped into the positive range of the format."""
    fmt = formats.E4M3 if scheme == FP8 else get_scheme(scheme).scale
    value = torch.exp2(log2_value.to(torch.float32)).clamp(fmt.min_positive, fmt.max_finite)
    return formats.round_to_format(value, fmt, "rne").clamp(min=fmt.min_positive)


def _design_dot(
    magnitudes: torch.Tensor, positions: torch.Tensor, sign: float, k: int, scheme: str, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """A row a [K] and column b [K] whose dot product has one term of about each magnitude (log2) at each
    position (a block index for block schemes, an element index for FP8), all of sign ``sign``."""
    a, b = torch.zeros(k), torch.zeros(k)
    split = torch.rand(magnitudes.shape, generator=gen) * 6 - 3  # how the magnitude divides between A and B
    if scheme == FP8:
        a[positions] = sign * _round_scale(magnitudes / 2 + split, scheme)
        b[positions] = _round_scale(magnitudes / 2 - split, scheme)
        return a, b
    block = get_scheme(scheme).block_size
    element = get_scheme(scheme).element
    payloads = element.finite_values().to(torch.float32)
    payloads = payloads[payloads > 0]
    top = element.max_finite
    for t in range(magnitudes.numel()):
        slot = torch.randperm(block, generator=gen)[:3].tolist()  # term, A's 6-carrier, B's 6-carrier
        pa, pb = payloads[torch.randint(len(payloads), (2,), generator=gen)].tolist()
        log2_scales = float(magnitudes[t]) - math.log2(pa * pb)
        sa = _round_scale(torch.tensor(log2_scales / 2 + float(split[t])), scheme)
        sb = _round_scale(torch.tensor(log2_scales / 2 - float(split[t])), scheme)
        base = int(positions[t]) * block
        a[base + slot[0]], b[base + slot[0]] = sign * pa * sa, pb * sb
        a[base + slot[1]], b[base + slot[2]] = top * sa, top * sb  # each meets a zero of the other operand
    return a, b


def _with_carrier(values: torch.Tensor, amax: float, axis: int) -> torch.Tensor:
    """Append one row (axis 0) or column (axis 1) whose single nonzero holds ``amax``: sets the tensor amax."""
    shape = list(values.shape)
    shape[axis] = 1
    line = torch.zeros(shape)
    line.view(-1)[0] = amax
    return torch.cat([values, line], dim=axis)


# ----- families -------------------------------------------------------------------------------------------


def threshold_probe(cfg: CorpusConfig, gen: torch.Generator) -> Probe:
    k, cells, scheme = cfg.threshold_k, cfg.threshold_cells, cfg.scheme
    positions_available = k // (1 if scheme == FP8 else get_scheme(scheme).block_size)
    a_rows, b_cols = [], []
    for _ in range(cells):
        anchors = int(torch.randint(1, 4, (), generator=gen))
        smalls = int(torch.randint(1, 13, (), generator=gen))
        n = min(anchors + smalls, positions_available)
        top = float(torch.randint(-14, 21, (), generator=gen))
        shifts = torch.cat([torch.rand(anchors, generator=gen) * 3, 4 + torch.rand(smalls, generator=gen) * 36])[:n]
        positions = torch.randperm(positions_available, generator=gen)[:n]
        sign = 1.0 if bool(torch.rand((), generator=gen) < 0.75) else -1.0
        a, b = _design_dot(top - shifts, positions, sign, k, scheme, gen)
        a_rows.append(a)
        b_cols.append(b)
    a, b = torch.stack(a_rows), torch.stack(b_cols, dim=1)
    if scheme != FP8:
        amax = _carrier_amax(scheme)
        a, b = _with_carrier(a, amax, 0), _with_carrier(b, amax, 1)
    index = torch.arange(cells)
    return Probe(
        family="threshold",
        scheme=scheme,
        a=_fixed_point(a, scheme, 1, "threshold.A"),
        b=_fixed_point(b, scheme, 0, "threshold.B"),
        rows=index,
        cols=index,
    )


def _packed_random(rows: int, k: int, scheme: str, gen: torch.Generator) -> torch.Tensor:
    """[rows, K] uniform element codes times power-of-two block scales 2^e, e uniform in -5..6."""
    fmt = _element_format(scheme)
    codes = fmt.finite_codes()  # both zeros: uniform over codes, not over values
    values = formats.decode(codes[torch.randint(codes.numel(), (rows, k), generator=gen)], fmt)
    if scheme == FP8:
        return values
    block = get_scheme(scheme).block_size
    top = fmt.max_finite
    blocks = values.reshape(rows, k // block, block)
    missing = blocks.abs().amax(-1) < top  # give such blocks one +-top so that the scale is exactly 2^e
    slot = torch.randint(block, missing.shape, generator=gen)
    sign = torch.where(torch.rand(missing.shape, generator=gen) < 0.5, -top, top)
    blocks.scatter_(
        -1, slot[..., None], torch.where(missing, sign, blocks.gather(-1, slot[..., None])[..., 0])[..., None]
    )
    scales = torch.exp2(torch.randint(-5, 7, (rows, k // block, 1), generator=gen).to(torch.float32))
    return (blocks * scales).reshape(rows, k)


def _sample_cells(m: int, n: int, count: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    flat = torch.randperm(m * n, generator=gen)[:count].sort().values
    return flat // n, flat % n


def broad_probe(cfg: CorpusConfig, gen: torch.Generator, *, packed: bool) -> Probe:
    m, n, k, scheme = cfg.broad_m, cfg.broad_n, cfg.broad_k, cfg.scheme
    if packed:
        a = _packed_random(m, k, scheme, gen)
        b = _packed_random(n, k, scheme, gen).T.contiguous()
        if scheme != FP8:
            amax = _carrier_amax(scheme)
            a, b = _with_carrier(a, amax, 0), _with_carrier(b, amax, 1)
    else:
        row_scale = torch.exp(torch.randn(m, 1, generator=gen))
        col_scale = torch.exp(torch.randn(1, n, generator=gen)) * 0.05
        a = torch.randn(m, k, generator=gen) * row_scale
        b = torch.randn(k, n, generator=gen) * col_scale
        if scheme == FP8:  # per-tensor unit scales: keep values inside E4M3's range
            a, b = a * (64 / a.abs().max()), b * (64 / b.abs().max())
    family = "broad_packed" if packed else "broad_quantized"
    rows, cols = _sample_cells(m, n, cfg.broad_cells, gen)
    return Probe(
        family=family,
        scheme=scheme,
        a=_fixed_point(a, scheme, 1, f"{family}.A"),
        b=_fixed_point(b, scheme, 0, f"{family}.B"),
        rows=rows,
        cols=cols,
    )


def _bf16_midpoint_distance(values: torch.Tensor) -> torch.Tensor:
    """|v - nearest BF16 midpoint| in BF16 ulps (0 = exactly a tie between two BF16 neighbours)."""
    nearest = values.to(torch.bfloat16)
    toward = torch.where(
        nearest.float() <= values, torch.full_like(values, math.inf), torch.full_like(values, -math.inf)
    )
    other = torch.nextafter(nearest, toward.to(torch.bfloat16)).float()
    nearest = nearest.float()
    midpoint = (nearest + other) / 2  # exact: both carry 8 significant bits
    return ((values - midpoint).abs() / (other - nearest).abs()).nan_to_num(nan=1.0, posinf=1.0)


def witness_probe(x: torch.Tensor, w: torch.Tensor, cfg: CorpusConfig) -> Probe:
    """Witness cells of the forward GEMM y = x @ w.T of a real linear (x [T, K] inputs, w [N, K] weights).

    The operands are quantized as the forward GEMM quantizes them (1D along K); the decoded-operand torch
    result of every cell is measured against the BF16 midpoints, and the nearest (within the tolerance) kept.
    """
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"witness GEMM needs x [T, K] and w [N, K], got {tuple(x.shape)} and {tuple(w.shape)}")
    a = _fixed_point(x.float(), cfg.scheme, 1, "witness.A")
    b = _fixed_point(w.float().T.contiguous(), cfg.scheme, 0, "witness.B")
    decoded = torch.matmul(a, b)
    distance = _bf16_midpoint_distance(decoded).flatten()
    near = torch.nonzero(distance <= cfg.witness_tolerance).flatten()
    if near.numel() == 0:
        raise ValueError(
            f"no output of the {tuple(a.shape)} x {tuple(b.shape)} GEMM lies within {cfg.witness_tolerance} BF16 ulps "
            "of a BF16 midpoint; use a larger GEMM or a larger witness_tolerance"
        )
    keep = near[torch.argsort(distance[near], stable=True)][: cfg.witness_cells].sort().values
    return Probe(
        family="witness", scheme=cfg.scheme, a=a, b=b, rows=keep // b.shape[1], cols=keep % b.shape[1], compare="bf16"
    )


def order_probe(
    base_a: torch.Tensor,
    base_b: torch.Tensor,
    cfg: CorpusConfig,
    gen: torch.Generator,
    *,
    amax: tuple[float, float] | None = None,
) -> Probe:
    """Permutations of the K-blocks of one dot product a . b (a, b [K] quantizer fixed points of a tensor whose
    amaxes are ``amax``) as the diagonal cells of a P x P GEMM; permutation 0 is the identity."""
    k = base_a.numel()
    block = 1 if cfg.scheme == FP8 else get_scheme(cfg.scheme).block_size
    group = 16 if k % 16 == 0 and 16 % block == 0 else block
    orders = [torch.arange(k // group)] + [
        torch.randperm(k // group, generator=gen) for _ in range(cfg.order_permutations - 1)
    ]
    index = torch.stack([(o[:, None] * group + torch.arange(group)).flatten() for o in orders])  # [P, K]
    a, b = base_a[index], base_b[index].T.contiguous()
    if amax is not None and cfg.scheme != FP8:
        a, b = _with_carrier(a, amax[0], 0), _with_carrier(b, amax[1], 1)
    cells = torch.arange(len(orders))
    return Probe(
        family="order",
        scheme=cfg.scheme,
        a=_fixed_point(a, cfg.scheme, 1, "order.A"),
        b=_fixed_point(b, cfg.scheme, 0, "order.B"),
        rows=cells,
        cols=cells,
    )
