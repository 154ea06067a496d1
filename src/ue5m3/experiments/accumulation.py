"""Statistical consequences of the probe-matched FP32 accumulation (paper appendix C; gemm spec section 4).

A native NVFP4 GEMM forms each output from K-slices of 64 products: every slice sum is exact and rounded once
to FP32 (p_j), the slices are combined in K order with FP32 additions rounded toward zero (RTZ), and the
encoded accumulator is snapped to a 1/1024 lattice (gemm spec section 2.3). This module measures what that
does to numbers, against the exact sum of the same products:

* RTZ bias: RTZ contracts magnitudes by about 1 ppm; RNE is unbiased (``rtz_bias``).
* Regression gradients: the contraction is a ~1 ppm gain error, invisible next to FP4 input quantization
  (``regression_probe``).
* Near cancellation and the grid: exactly cancelling partials leave an RTZ residue of ~5e-6 that the grid maps
  to exactly 0, and the 1/d grid maps every accumulator in [-1/(2d), 1/(2d)] to 0 (``cancellation``,
  ``grid_sweep``).

The four accumulation variants are RNE, RNE+grid, RTZ and RTZ+grid. The grid acts on the accumulator in the
units the GEMM accumulates: BF16 values, or for NVFP4 operands the encoded values (payload * block-scale code,
as the hardware sees them; the paper's lattice) or, for comparison, the dequantized values (operand kinds
``nvfp4`` and ``nvfp4_dequantized``). Encoded NVFP4 products carry at most 12 significant bits, so FP32
accumulation of them is often exact and RTZ then has nothing to truncate.

Exactness. Products of two FP32 values (BF16 and dequantized NVFP4 values included) are exact in FP64. Their
sums are formed exactly in a fixed-point superaccumulator (the vectorised counterpart of ``math.fsum``): each
FP64 term is split into three signed 26-bit integer digits aligned to global 26-bit bins and the digits are
added in int64 (exact for up to 2^37 terms), then carries are propagated and the leading 104 bits plus a
sticky bit are rounded once to FP64 or FP32. The results are correctly rounded for every finite input, with
no assumption on the exponent spread (tests compare them with ``math.fsum`` and ``fractions``).

Definitions (documented because the spec gives none): magnitude bias = (sum |acc| - sum |exact|) / sum |exact|
over the dot products (a per-dot mean of ratios is dominated by the few dots whose exact sum is near zero);
gain = least-squares slope through the origin, sum(acc * exact) / sum(exact^2); both in ppm, times 1e6.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import ClassVar

import torch

from ue5m3 import logs
from ue5m3.artifacts import provenance, write_csv, write_json
from ue5m3.config import Range
from ue5m3.numerics.exact import add_rounded, check_grid, exact_sum, is_grid, slice_partials, snap
from ue5m3.numerics.formats import Rounding
from ue5m3.numerics.gemm import alpha
from ue5m3.numerics.quantize import quantize

__all__ = [
    "DISTRIBUTIONS",
    "OPERANDS",
    "Variant",
    "AccumulationConfig",
    "accumulate",
    "dot",
    "sample",
    "magnitude_bias_ppm",
    "gain",
    "rtz_bias",
    "regression_probe",
    "cancellation_partials",
    "cancellation",
    "grid_sweep",
    "run",
]

logger = logging.getLogger(__name__)

DISTRIBUTIONS = ("gaussian", "gaussian_sigma32", "laplace", "student_t3", "contaminated_gaussian_1pct")
OPERANDS = ("bf16", "nvfp4", "nvfp4_dequantized")
CHUNK_ELEMENTS = 1 << 21  # products per chunk: bounds memory (~250 MB) and the number of parallel regions


class Variant(StrEnum):
    """The accumulation variants: cross-slice rounding, with or without the final grid snap."""

    RNE = "rne"
    RNE_GRID = "rne_grid"
    RTZ = "rtz"
    RTZ_GRID = "rtz_grid"

    @property
    def rounding(self) -> Rounding:
        return Rounding.RTZ if self.value.startswith("rtz") else Rounding.RNE

    @property
    def gridded(self) -> bool:
        return self.value.endswith("_grid")


def _fp32_parts(x: torch.Tensor) -> torch.Tensor:
    """[..., P] FP64 parts of FP32 values summing exactly to x: P = 1, or 3 for FP64 (53 = 24 + 24 + 5 bits)."""
    if x.dtype != torch.float64:
        return x.to(torch.float64)[..., None]
    parts, rest = [], x
    for _ in range(3):
        parts.append(rest.to(torch.float32).to(torch.float64))
        rest = rest - parts[-1]  # exact: the rounding error of a narrowing conversion
    if bool((rest != 0).any()):
        raise ValueError("FP64 operands must lie in FP32's normal range to split into exact FP32 parts")
    return torch.stack(parts, dim=-1)


def accumulate(partials: torch.Tensor, *, rounding: Rounding | str, grid: int | None = None) -> torch.Tensor:
    """Combine FP32 slice results over the last dim in order: c_0 = 0, c_{j+1} = fl(c_j + p_j), then snap.

    Args:
        partials: FP32 [..., S].
        rounding: ``rne`` or ``rtz`` FP32 additions.
        grid: lattice denominator (a power of two) or None for no snap.

    Returns:
        FP32 [...].
    """
    rounding = Rounding(rounding)
    if rounding not in (Rounding.RNE, Rounding.RTZ):
        raise ValueError(f"rounding must be 'rne' or 'rtz', got {rounding.value!r}")
    if partials.dtype != torch.float32:
        raise TypeError(f"partials must be FP32, got {partials.dtype}")
    check_grid(grid, "grid")
    acc = torch.zeros(partials.shape[:-1], dtype=torch.float32)
    for j in range(partials.shape[-1]):
        acc = add_rounded(acc, partials[..., j], rounding)
    return snap(acc, grid)


def dot(
    a: torch.Tensor, b: torch.Tensor, variants: tuple[Variant, ...] = (), *, width: int = 64, grid: int = 1024
) -> tuple[torch.Tensor, dict[Variant, torch.Tensor]]:
    """Row-wise dot products of a [n, K] with b [n, K] or [K]: the exact sums and each variant, in row chunks.

    Products of FP32 values (BF16 included) are exact in FP64; FP64 operands are first split into exact FP32
    parts, whose products stay in their K-slice.

    Returns:
        (exact [n] FP64, correctly rounded; {variant: [n] FP32}).
    """
    if a.dim() != 2 or b.shape not in (a.shape, a.shape[1:]):
        raise ValueError(f"dot needs a [n, K] and b [n, K] or [K], got {tuple(a.shape)} and {tuple(b.shape)}")
    parts_a, parts_b = _fp32_parts(a), _fp32_parts(b).expand(*a.shape, -1)
    n, k = a.shape
    rows = max(1, CHUNK_ELEMENTS // max(k * parts_a.shape[-1] * parts_b.shape[-1], 1))
    exact, out = [], {Variant(v): [] for v in variants}
    for r0 in range(0, n, rows):
        pa, pb = parts_a[r0 : r0 + rows], parts_b[r0 : r0 + rows]
        products = (pa[..., :, None] * pb[..., None, :]).flatten(-3)  # [rows, K, Pa, Pb] -> [rows, K * Pa * Pb]
        p, total = slice_partials(products, width=width * pa.shape[-1] * pb.shape[-1])
        exact.append(total)
        for v, chunks in out.items():
            chunks.append(accumulate(p, rounding=v.rounding, grid=grid if v.gridded else None))
    return torch.cat(exact), {v: torch.cat(chunks) for v, chunks in out.items()}


# ----- metrics and samples ---------------------------------------------------------------------------------


def magnitude_bias_ppm(acc: torch.Tensor, exact: torch.Tensor) -> float:
    """(sum |acc| - sum |exact|) / sum |exact| in ppm (aggregate relative change of magnitudes)."""
    acc, exact = acc.to(torch.float64), exact.to(torch.float64)
    return float((acc.abs() - exact.abs()).sum() / exact.abs().sum()) * 1e6


def gain(out: torch.Tensor, reference: torch.Tensor) -> float:
    """Least-squares slope through the origin of ``out`` on ``reference``."""
    out, reference = out.to(torch.float64), reference.to(torch.float64)
    return float((out * reference).sum() / (reference * reference).sum())


def sample(distribution: str, shape: tuple[int, ...], *, generator: torch.Generator) -> torch.Tensor:
    """FP32 samples of one of :data:`DISTRIBUTIONS` (unit variance except ``gaussian_sigma32``)."""

    def normal(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=generator)

    if distribution == "gaussian":
        return normal(*shape)
    if distribution == "gaussian_sigma32":
        return 32 * normal(*shape)
    if distribution == "laplace":  # difference of two unit exponentials: variance 2
        e = torch.empty(2, *shape).exponential_(generator=generator)
        return (e[0] - e[1]) / math.sqrt(2)
    if distribution == "student_t3":  # t3 / sqrt(3) = z / sqrt(chi2_3)
        z, chi = normal(*shape), normal(3, *shape).square().sum(0)
        return z / chi.sqrt()
    if distribution == "contaminated_gaussian_1pct":
        z, outlier = normal(*shape), torch.rand(*shape, generator=generator) < 0.01
        return torch.where(outlier, 25 * z, z) / math.sqrt(0.99 + 0.01 * 625)
    raise ValueError(f"unknown distribution {distribution!r}; known: {list(DISTRIBUTIONS)}")


def _encode(a: torch.Tensor, b: torch.Tensor, operands: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GEMM operands in the units the accumulator sees, and the FP32 factor alpha back to real units.

    ``bf16``: the values as given. ``nvfp4`` and ``nvfp4_dequantized``: both quantized NVFP4-like along their
    last axis (K). ``nvfp4`` feeds the encoded values (payload * E4M3 scale, exact in BF16) as a native GEMM
    does, so the grid acts on the encoded accumulator and alpha = g_A g_B / ((448 * 6) * (448 * 6)) (gemm spec
    section 2); ``nvfp4_dequantized`` feeds the dequantized FP32 values with alpha = 1.
    """
    one = torch.ones((), dtype=torch.float32)
    if operands == "bf16":
        return a, b, one
    qa, qb = quantize(a, "nvfp4", axis=-1), quantize(b, "nvfp4", axis=-1)
    if operands == "nvfp4_dequantized":
        return qa.dequantize(), qb.dequantize(), one
    return qa.encoded(), qb.encoded(), alpha(qa, qb)


# ----- configuration ---------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class AccumulationConfig:
    """Configuration of ``ue5m3 accumulation-stats`` (the ``accumulation`` section of config/*.yaml).

    Attributes:
        seed: seed of every random draw (each experiment re-seeds its own generator with it).
        slice_width: K-slice width whose exact sums are rounded once to FP32.
        grid: lattice denominator d of the gridded variants (snap to 1/d).
        dots: dot products per (distribution, correlation, operands) cell of the RTZ-bias experiment.
        k: length K of those dot products.
        distributions: operand distributions of the RTZ-bias experiment (from :data:`DISTRIBUTIONS`).
        operands: operand formats from :data:`OPERANDS` (BF16, NVFP4-like encoded or dequantized values).
        gain_rho: operand correlation of the gain-error measurement (the magnitude bias uses rho = 0).
        regression_examples: batch size B of the regression-gradient probe.
        regression_features: features F of the regression-gradient probe.
        cancellation_trials: trials of the near-cancellation experiment.
        cancellation_partials: slice results per trial (half random, half their negatives).
        cancellation_scales: scales of the random partials.
        sigmas: standard deviations of the residual added to the last partial.
        sweep_sigma: residual standard deviation of the grid sweep.
        sweep_scale: partial scale of the grid sweep.
        sweep_grids: grid denominators of the sweep (the unsnapped RTZ output is always included).
    """

    seed: int = 20_260_721
    slice_width: int = 64
    grid: int = 1024
    dots: int = 1024
    k: int = 4096
    distributions: tuple[str, ...] = DISTRIBUTIONS
    operands: tuple[str, ...] = OPERANDS
    gain_rho: float = 0.25
    regression_examples: int = 2048
    regression_features: int = 2048
    cancellation_trials: int = 4096
    cancellation_partials: int = 64
    cancellation_scales: tuple[float, ...] = (1.0, 32.0)
    sigmas: tuple[float, ...] = (0.0, 2.0**-13, 2.0**-12, 2.0**-11, 2.0**-10, 2.0**-9)
    sweep_sigma: float = 2.0**-12
    sweep_scale: float = 1.0
    sweep_grids: tuple[int, ...] = (256, 512, 1024, 2048, 4096)

    RANGES: ClassVar[dict[str, Range]] = {
        "seed": Range(0, 2**63 - 1, note="a seed"),
        "slice_width": Range(1, 2**16, note="products per K slice; hardware: 16 to 128"),
        "grid": Range(2, 2**24, note="a power-of-two lattice denominator; the paper: 1024"),
        "dots": Range(2, 2**24, note="dot products per cell"),
        "k": Range(1, 2**20, note="the length K of the dot products; the paper: 4096"),
        "gain_rho": Range(-1, 1, note="a correlation"),
        "regression_examples": Range(1, 2**20, note="the batch size B of the probe"),
        "regression_features": Range(1, 2**20, note="the features F of the probe"),
        "cancellation_trials": Range(2, 2**24, note="trials"),
        "cancellation_partials": Range(2, 2**16, note="slice results per trial, even"),
        "cancellation_scales": Range(0, 2**64, low_open=True, note="scales of the partials"),
        "sigmas": Range(0, 2**64, note="residual standard deviations, 0 included"),
        "sweep_sigma": Range(0, 2**64, low_open=True, note="a residual standard deviation"),
        "sweep_scale": Range(0, 2**64, low_open=True, note="a partial scale"),
        "sweep_grids": Range(2, 2**24, note="power-of-two lattice denominators"),
    }

    def __post_init__(self) -> None:
        def require(ok: bool, key: str, what: str) -> None:
            if not ok:
                raise ValueError(f"accumulation.{key} must be {what}, got {getattr(self, key)!r}")

        ints = {
            "seed": 0,
            "slice_width": 1,
            "grid": 2,
            "dots": 2,
            "k": 1,
            "regression_examples": 1,
            "regression_features": 1,
            "cancellation_trials": 2,
            "cancellation_partials": 2,
        }
        for key, minimum in ints.items():
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"accumulation.{key} must be an integer, got {value!r}")
            require(value >= minimum, key, f">= {minimum}")
        for key in ("k", "regression_examples", "regression_features"):  # whole NVFP4 blocks of 16, whole slices
            require(getattr(self, key) % 16 == 0, key, "a multiple of 16 (whole NVFP4 blocks)")
            if getattr(self, key) % self.slice_width:
                raise ValueError(
                    f"accumulation.slice_width must divide {key} ({getattr(self, key)}) into whole slices, got "
                    f"{self.slice_width!r} (the paper's hardware: 16, 32, 64 or 128)"
                )
        require(self.cancellation_partials % 2 == 0, "cancellation_partials", "even (partials and negatives)")
        for key, choices in (("distributions", DISTRIBUTIONS), ("operands", OPERANDS)):
            values = getattr(self, key)
            ok = bool(values) and len(set(values)) == len(values) and set(values) <= set(choices)
            require(ok, key, f"a non-empty list of distinct names from {list(choices)}")
        for key in ("grid", "sweep_grids"):
            value = getattr(self, key)
            values = value if isinstance(value, tuple) else (value,)
            ok = bool(values) and len(set(values)) == len(values)
            ok = ok and all(g is not None and is_grid(g) for g in values)
            require(ok, key, "distinct powers of two >= 2 (exact snapping)")
        for key, zero_ok in (
            ("cancellation_scales", False),
            ("sigmas", True),
            ("sweep_sigma", False),
            ("sweep_scale", False),
        ):
            value = getattr(self, key)
            values = value if isinstance(value, tuple) else (value,)
            ok = bool(values) and all(
                isinstance(v, int | float)
                and not isinstance(v, bool)
                and math.isfinite(v)
                and (v > 0 or zero_ok and v == 0)
                for v in values
            )
            require(ok, key, "finite numbers >= 0" if zero_ok else "positive finite numbers")
        rho = self.gain_rho
        require(isinstance(rho, int | float) and not isinstance(rho, bool) and -1 < rho < 1, "gain_rho", "in (-1, 1)")


# ----- experiments -----------------------------------------------------------------------------------------


def rtz_bias(config: AccumulationConfig) -> list[dict[str, object]]:
    """Magnitude bias (rho = 0) and gain error (rho = ``gain_rho``) of every variant, in ppm.

    Per distribution a generator seeded with ``config.seed`` draws x and z [dots, K] (so ``gaussian_sigma32``
    is exactly 32 times ``gaussian``, and its ungridded results equal the unit Gaussian's: RTZ and RNE commute
    with power-of-two scaling); w = rho x + sqrt(1 - rho^2) z; both operands are cast to BF16 (or quantized
    NVFP4-like along K) and the row-wise dot products are compared with the exact sums of the same products.
    """
    rows: list[dict[str, object]] = []
    for distribution in logs.progress_over(config.distributions, "rtz bias", unit="distribution", logger=logger):
        generator = torch.Generator().manual_seed(config.seed)
        x, z = (sample(distribution, (config.dots, config.k), generator=generator) for _ in range(2))
        for rho, operands in itertools.product((0.0, config.gain_rho), config.operands):
            w = rho * x + math.sqrt(1 - rho * rho) * z
            a, b, _ = _encode(x.to(torch.bfloat16).float(), w.to(torch.bfloat16).float(), operands)
            exact, out = dot(a, b, tuple(Variant), width=config.slice_width, grid=config.grid)  # alpha cancels
            for variant, acc in out.items():
                value = magnitude_bias_ppm(acc, exact) if rho == 0 else (gain(acc, exact) - 1) * 1e6
                metric = "magnitude_bias_ppm" if rho == 0 else "gain_error_ppm"
                row = dict(distribution=distribution, operands=operands, rho=rho, metric=metric, variant=variant.value)
                rows.append(row | {"value_ppm": value})
    return rows


def regression_probe(config: AccumulationConfig) -> list[dict[str, object]]:
    """Gradient X^T (X beta - y) / B of a linear regression, both GEMMs under each variant.

    X [B, F] ~ N(0, 1) in BF16, beta_true ~ N(0, 1/F), beta = beta_true + 0.25 N(0, 1/F) in BF16, targets
    y = X beta_true exactly, rounded to FP32; the residual X beta - y is FP32 (a BF16 cast would swamp the ppm
    effects). NVFP4 operands: X and beta, then X^T and the residual, are quantized along each GEMM's K (see
    :func:`_encode`). The reference is the exact gradient of the same operands (``bf16``: residual exact up
    to one FP64 rounding; NVFP4: the exact residual rounded to FP32, then quantized);
    ``relative_rmse_vs_bf16`` compares with the exact BF16 gradient (for NVFP4 operands: the error input
    quantization contributes) and ``relative_change_vs_rne`` with the RNE variant.
    """
    generator = torch.Generator().manual_seed(config.seed)
    b, f = config.regression_examples, config.regression_features
    x = torch.randn(b, f, generator=generator).to(torch.bfloat16).float()
    beta_true = torch.randn(f, generator=generator) / math.sqrt(f)
    beta = (beta_true + 0.25 * torch.randn(f, generator=generator) / math.sqrt(f)).to(torch.bfloat16).float()
    y = dot(x, beta_true)[0].float()
    x_t = x.T.contiguous()  # [F, B]: the second GEMM reduces over the batch
    kw = {"width": config.slice_width, "grid": config.grid}
    bf16_reference = dot(x_t, dot(x, beta)[0] - y.double(), **kw)[0] / b
    rows: list[dict[str, object]] = []
    for operands in logs.progress_over(config.operands, "regression", unit="operands", logger=logger):
        x1, beta1, alpha1 = _encode(x, beta, operands)
        exact1, predictions = dot(x1, beta1, tuple(Variant), **kw)
        reference = bf16_reference
        if operands != "bf16":  # the exact gradient of the quantized operands
            x2, r2, alpha2 = _encode(x_t, (exact1 * alpha1.double() - y.double()).float(), operands)
            reference = dot(x2, r2)[0] * alpha2.double() / b
        gradients = {}
        for variant, prediction in predictions.items():
            x2, r2, alpha2 = _encode(x_t, prediction * alpha1 - y, operands)  # FP32 residual
            gradients[variant] = dot(x2, r2, (variant,), **kw)[1][variant] * alpha2 / b
        for variant, g in gradients.items():
            g64, norm = g.double(), reference.norm()
            metrics = {
                "cosine": float(g64 @ reference / (g64.norm() * norm)),
                "gain_error_ppm": (gain(g, reference) - 1) * 1e6,
                "relative_rmse": float((g64 - reference).norm() / norm),
                "relative_rmse_vs_bf16": float((g64 - bf16_reference).norm() / bf16_reference.norm()),
                "relative_change_vs_rne": float((g64 - gradients[Variant.RNE].double()).norm() / norm),
            }
            rows += [
                {"operands": operands, "variant": variant.value, "metric": m, "value": v} for m, v in metrics.items()
            ]
    return rows


def cancellation_partials(
    trials: int, partials: int, *, scale: float, sigma: float, generator: torch.Generator
) -> torch.Tensor:
    """FP32 [trials, partials]: N(0, scale^2) values and their negatives in random order, with N(0, sigma^2)
    added (one FP32 rounding) to the last one; their exact sum is the residual to recover."""
    half = torch.randn(trials, partials // 2, generator=generator) * scale
    order = torch.rand(trials, partials, generator=generator).argsort(dim=1)
    values = torch.cat([half, -half], dim=1).gather(1, order)
    values[:, -1] += torch.randn(trials, generator=generator) * sigma
    return values


def _output_metrics(out: torch.Tensor, true: torch.Tensor) -> dict[str, float]:
    """Share of outputs that are exactly 0 (percent), signal gain (when there is a signal) and RMS error."""
    metrics = {"mapped_to_zero_pct": float((out == 0).double().mean()) * 100}
    if bool((true != 0).any()):
        metrics["signal_gain"] = gain(out, true)
    return metrics | {"rmse": float((out.double() - true).square().mean().sqrt())}


def cancellation(config: AccumulationConfig) -> list[dict[str, object]]:
    """Per partial scale, residual sigma and variant: the outputs' RMS residue against the exact sum
    (``rmse``), the share mapped to exactly 0 and the signal gain (the same draws for every sigma and scale)."""
    rows: list[dict[str, object]] = []
    for scale, sigma in itertools.product(config.cancellation_scales, config.sigmas):
        generator = torch.Generator().manual_seed(config.seed)
        p = cancellation_partials(
            config.cancellation_trials, config.cancellation_partials, scale=scale, sigma=sigma, generator=generator
        )
        true = exact_sum(p.double())
        for variant in Variant:
            out = accumulate(p, rounding=variant.rounding, grid=config.grid if variant.gridded else None)
            rows += [
                {"scale": scale, "sigma": sigma, "variant": variant.value, "metric": m, "value": v}
                for m, v in _output_metrics(out, true).items()
            ]
    return rows


def grid_sweep(config: AccumulationConfig) -> list[dict[str, object]]:
    """RTZ accumulation at sigma = ``sweep_sigma``, scale = ``sweep_scale``, then snapped to each grid (``none``:
    not snapped): share mapped to 0 (percent), signal gain and RMSE against the exact residual."""
    generator = torch.Generator().manual_seed(config.seed)
    p = cancellation_partials(
        config.cancellation_trials,
        config.cancellation_partials,
        scale=config.sweep_scale,
        sigma=config.sweep_sigma,
        generator=generator,
    )
    true, acc = exact_sum(p.double()), accumulate(p, rounding=Rounding.RTZ)
    rows: list[dict[str, object]] = []
    for grid in (None, *config.sweep_grids):
        label = "none" if grid is None else f"1/{grid}"
        rows += [
            {"sigma": config.sweep_sigma, "scale": config.sweep_scale, "grid": label, "denominator": grid}
            | {"metric": m, "value": v}
            for m, v in _output_metrics(snap(acc, grid), true).items()
        ]
    return rows


TABLES: dict[str, tuple[Callable[[AccumulationConfig], list[dict[str, object]]], tuple[str, ...]]] = {
    "rtz_bias": (rtz_bias, ("distribution", "operands", "rho", "metric", "variant", "value_ppm")),
    "regression": (regression_probe, ("operands", "variant", "metric", "value")),
    "cancellation": (cancellation, ("scale", "sigma", "variant", "metric", "value")),
    "grid_sweep": (grid_sweep, ("sigma", "scale", "grid", "denominator", "metric", "value")),
}
"""Each table of ``run``: the experiment that computes its rows and its columns."""


def run(config: AccumulationConfig, out_dir: str | Path) -> dict[str, Path]:
    """Write rtz_bias.csv, regression.csv, cancellation.csv, grid_sweep.csv and provenance.json."""
    out = Path(out_dir)
    paths = {name: out / f"{name}.csv" for name in TABLES}
    for name, (experiment, columns) in TABLES.items():
        write_csv(paths[name], experiment(config), columns)
    paths["provenance"] = out / "provenance.json"
    cfg = {key: list(v) if isinstance(v, tuple) else v for key, v in asdict(config).items()}
    write_json(paths["provenance"], provenance("accumulation-stats", cfg))
    return paths
