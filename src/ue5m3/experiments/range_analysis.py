"""Range analysis of block-scale formats (paper sections 4 and 5.2).

Derives, from the format descriptors alone, the facts the paper argues from: the codebooks of E4M3 and
UE5M3, their dynamic range, the stale-growth headroom U / T before a held tensor reference saturates the
block scales (proposition: with stale reference g and current values up to rho * g every block is unsaturated
iff T * rho <= U), and the worked example of scale placement for a tensor reference g.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from ue5m3.artifacts import provenance, write_csv, write_json
from ue5m3.config import Range
from ue5m3.numerics import formats
from ue5m3.numerics.formats import E2M1, E4M3, UE5M3, FloatFormat
from ue5m3.numerics.quantize import quantize
from ue5m3.numerics.schemes import BlockScheme

__all__ = ["RangeAnalysisConfig", "format_facts", "codebook", "headroom", "worked_example", "summary", "run"]

TABLE_FORMATS = (
    formats.E2M1,
    formats.E4M3,
    formats.E5M2,
    formats.UE5M3,
    formats.UE5M3_ALL_FINITE,
    formats.UE5M3_ALTO,
    formats.UE8M0,
    formats.E3M2,
    formats.E2M3,
)
HEADROOM_FORMATS = (UE5M3, E4M3)


@dataclass(frozen=True, kw_only=True)
class RangeAnalysisConfig:
    """Configuration of ``ue5m3 range-analysis``.

    Attributes:
        targets: tensor-scale targets T for the headroom table.
        example_reference: tensor reference amax g of the worked example.
        example_targets: targets of the worked example.
    """

    targets: tuple[float, ...] = (256.0, 448.0, 1024.0, 2048.0, 4096.0)
    example_reference: float = 100.0
    example_targets: tuple[float, ...] = (448.0, 2048.0)

    RANGES: ClassVar[dict[str, Range]] = {
        "targets": Range(1, 2**16, note="a tensor-scale target T; the paper: 448 to 4096"),
        "example_reference": Range(0, 3.4e38, low_open=True, note="a tensor amax g, a finite FP32 value"),
        "example_targets": Range(1, 2**16, note="a tensor-scale target T; the paper: 448 to 4096"),
    }

    def __post_init__(self) -> None:
        for key in ("targets", "example_targets"):
            values = getattr(self, key)
            if not values or any(not (0 < float(t) < float("inf")) for t in values):
                raise ValueError(f"range_analysis.{key} must be a non-empty list of positive numbers, got {values!r}")
        if not 0 < self.example_reference < float("inf"):
            raise ValueError(f"range_analysis.example_reference must be positive, got {self.example_reference!r}")


def format_facts(fmt: FloatFormat) -> dict[str, object]:
    return {
        "name": fmt.name,
        "bits": fmt.bits,
        "exponent_bits": fmt.exponent_bits,
        "mantissa_bits": fmt.mantissa_bits,
        "bias": fmt.bias,
        "signed": fmt.signed,
        "max_finite": fmt.max_finite,
        "min_normal": fmt.min_normal,
        "min_subnormal": fmt.min_subnormal,
        "positive_finite_codes": fmt.positive_finite_count,
    }


def codebook(fmt: FloatFormat) -> list[dict[str, object]]:
    """Every non-negative finite value of ``fmt`` with its code."""
    codes = torch.arange(fmt.max_magnitude_code + 1)
    values = formats.decode(codes, fmt, dtype=torch.float64)
    return [{"format": fmt.name, "code": int(c), "value": float(v)} for c, v in zip(codes, values, strict=True)]


def headroom(scale: FloatFormat, target: float) -> float:
    """Stale-growth headroom U / T: how far current values may outgrow a held reference before saturation."""
    return scale.max_finite / target


def worked_example(reference: float, target: float, scale: FloatFormat = UE5M3) -> dict[str, float]:
    """Scale placement for tensor reference g = ``reference`` at target T (paper's g = 100 example).

    ``code_at_reference`` is read off the quantizer itself (a block whose amax equals g); the smallest and
    largest block amax are those whose ideal scale equals the format's smallest subnormal and max finite.
    """
    scheme = BlockScheme(
        name=f"{scale.name}_example", scale=scale, block_size=16, target=target, zero_scale_repair=True
    )
    block = torch.zeros(16)
    block[0] = reference
    code_at_reference = float(quantize(block, scheme, tensor_amax=reference, backend="torch").scales[0])
    per_unit = reference / target  # block amax per unit of ideal scale: a_B = u * g / T
    return {
        "target": target,
        "reference_amax": reference,
        "code_at_reference": code_at_reference,
        "smallest_block_amax": scale.min_positive * per_unit,
        "largest_block_amax": scale.max_finite * per_unit,
        "headroom": headroom(scale, target),
    }


def summary(config: RangeAnalysisConfig) -> dict[str, float]:
    """The headline numbers of sections 4 and 5.2, computed."""
    return {
        "max_ratio_ue5m3_over_e4m3": UE5M3.max_finite / E4M3.max_finite,
        "min_subnormal_ratio_e4m3_over_ue5m3": E4M3.min_subnormal / UE5M3.min_subnormal,
        "positive_finite_codes_ue5m3": UE5M3.positive_finite_count,
        "positive_finite_codes_e4m3": E4M3.positive_finite_count,
        "headroom_ue5m3_t448": headroom(UE5M3, 448.0),
        "headroom_ue5m3_t2048": headroom(UE5M3, 2048.0),
        "placement_gain_t2048_over_t448": 2048.0 / 448.0,
        "element_max": E2M1.max_finite,
    }


def run(config: RangeAnalysisConfig, out_dir: str | Path) -> dict[str, Path]:
    """Write formats.csv, codebooks.csv, headroom.csv, worked_example.csv, summary.json, provenance.json."""
    out = Path(out_dir)
    paths = {name: out / f"{name}.csv" for name in ("formats", "codebooks", "headroom", "worked_example")}
    facts = [format_facts(f) for f in TABLE_FORMATS]
    write_csv(paths["formats"], facts, list(facts[0]))
    write_csv(paths["codebooks"], [row for f in TABLE_FORMATS for row in codebook(f)], ["format", "code", "value"])
    rows = [
        {"scale_format": f.name, "target": t, "scale_max": f.max_finite, "headroom": headroom(f, t)}
        for f in HEADROOM_FORMATS
        for t in config.targets
    ]
    write_csv(paths["headroom"], rows, ["scale_format", "target", "scale_max", "headroom"])
    examples = [worked_example(config.example_reference, t) for t in config.example_targets]
    write_csv(paths["worked_example"], examples, list(examples[0]))
    paths["summary"] = out / "summary.json"
    write_json(paths["summary"], summary(config))
    paths["provenance"] = out / "provenance.json"
    cfg = {
        "targets": list(config.targets),
        "example_reference": config.example_reference,
        "example_targets": list(config.example_targets),
    }
    write_json(paths["provenance"], provenance("range-analysis", cfg))
    return paths
