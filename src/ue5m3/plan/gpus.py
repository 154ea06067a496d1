"""The GPU types a plan checks jobs against, as data: ``gpus.csv`` beside this module (vendors' datasheets, dense
peaks, one row per type). A partition of the cluster names the types it may hold (the pipeline config's
``plan.partitions``); every job is planned on each of them.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from pathlib import Path

__all__ = ["GpuType", "gpu_types", "gpu_type"]

GPUS_CSV = Path(__file__).with_name("gpus.csv")


@dataclass(frozen=True)
class GpuType:
    """One GPU type: memory in bytes, dense peaks in FLOP/s and bytes/s, and its datasheet."""

    name: str
    memory: int
    bf16: float
    fp32: float  # CUDA-core FP32 (an FMA counts 2)
    fp64: float
    nvfp4: float | None  # FP4 tensor cores (Blackwell); None: none
    hbm: float
    nvlink: float  # per GPU and direction
    source: str


@cache
def gpu_types() -> dict[str, GpuType]:
    """Every GPU type of ``gpus.csv``, by name."""
    types = {}
    with GPUS_CSV.open(newline="") as handle:
        for row in csv.DictReader(handle):
            types[row["name"]] = GpuType(
                name=row["name"],
                memory=int(float(row["memory_gb"]) * 1e9),
                bf16=float(row["bf16_tflops"]) * 1e12,
                fp32=float(row["fp32_tflops"]) * 1e12,
                fp64=float(row["fp64_tflops"]) * 1e12,
                nvfp4=float(row["nvfp4_tflops"]) * 1e12 if row["nvfp4_tflops"] else None,
                hbm=float(row["hbm_tbps"]) * 1e12,
                nvlink=float(row["nvlink_gbps"]) * 1e9,
                source=row["source"],
            )
    return types


def gpu_type(name: str) -> GpuType:
    """The GPU type ``name`` (ValueError naming the known ones otherwise)."""
    types = gpu_types()
    if name not in types:
        raise ValueError(f"unknown GPU type {name!r}; {GPUS_CSV.name} has {sorted(types)}")
    return types[name]
