"""A roofline estimate of one training step per recipe and GPU type, from the operations the code runs: an estimate.

No GPU has run the emulated path yet (docs/performance.md), so every number here comes from the datasheets'
dense peaks (:mod:`ue5m3.plan.gpus`) and stated efficiencies (:class:`Efficiency`), unless a GPU check measured the
step (:func:`measured_seconds`). What it models, per FP4 linear and microbatch, from the operations the code runs:

* ``probe_matched`` (the UE5M3 recipes): per GEMM the preparation pass (read the FP32 payload, write FP16: 6 bytes
  per operand element), the FP16 tensor-core dot of the fast path, and 3 FP32 operations per output and 64-slice
  (two power-of-two shifts, one ``add.rz``) of which half are taken to overlap the MMA; the exact path, charged
  by its measured shares (``Efficiency.exact_share`` e, the tile-slices on it; ``Efficiency.flagged_share`` f, the
  tile-slices in tiles the exact kernel takes): each exact tile-slice at ``EXACT_SLICE_COST`` fast ones, each other
  tile-slice of a flagged tile at 2 (the exact kernel's sub-tiles), so that work grows by f + (r - 2) e;
* ``encoded_fp32`` (torch control) and ``decoded`` (MXFP4): FP32 GEMMs with TF32 off, at the FP32 CUDA-core rate;
* quantization and glue, all memory-bound: the FP32 casts of X and dY, one amax pass each, the two-axis kernel
  (read 4 bytes, write two FP32 payloads), packing X's wgrad copy and unpacking it, the FP32 GEMM outputs and their
  casts; the RHT copies of the TE-settings recipe; the weight's quantizations once per step (cached);
* native NVFP4 (a recipe with a native path, on a GPU with FP4 tensor cores): FP4 tensor-core GEMMs and Transformer
  Engine's fused casts (read BF16, write FP4 and scales in both orientations), the RHT where the recipe has it.

The rest of the step (the SSD scan, attention, norms, embedding, the FP32 head, the optimizer) is the same under
every recipe; it is taken from a BF16 step at ``mfu`` model-FLOPs utilisation (6 N D) minus the BF16 linears.
Communication (:mod:`ue5m3.plan.collectives`) overlaps the compute except for its first all-gather and last
reduce-scatter: the step takes max(compute, communication) plus one unit's share of the communication.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

from ue5m3 import models
from ue5m3.layers.linear import layer_index
from ue5m3.layers.recipes import GemmModel, Operand, Recipe
from ue5m3.plan.gpus import GpuType
from ue5m3.training.config import TrainConfig

__all__ = [
    "Efficiency",
    "linears",
    "linear_seconds",
    "bf16_linear_seconds",
    "microbatch_seconds",
    "communication_seconds",
    "measured_seconds",
]


@dataclasses.dataclass(frozen=True)
class Efficiency:
    """Fractions of peak each kind of work reaches, and the exact path's share (assumptions, stated with results)."""

    cublas: float = 0.70  # BF16 and FP32 GEMMs through cuBLAS at the 8B shapes
    triton_mma: float = 0.55  # the Triton fast path's FP16 dots
    alu: float = 0.70  # the fast path's per-slice FP32 operations
    memory: float = 0.75  # memory-bound kernels
    native_fp4: float = 0.60  # TE's NVFP4 GEMMs
    mfu: float = 0.40  # a whole BF16 step (for the part no recipe changes)
    network: float = 0.80  # collectives' share of the link bandwidth
    exact_share: float = 0.0  # share of probe_matched tile-slices on the exact path (Gaussian operands: 0)
    flagged_share: float = 0.0  # share in tiles the exact kernel takes (at least exact_share: a tile with one)


EXACT_SLICE_COST = 20.0
"""r: an exact tile-slice's time in fast ones. Per output and exact slice the exact kernel runs 4 per-block FP16 dots
and about 45 FP64 instructions against the fast path's 128 MMA FLOPs: about 16 on H100 and 34 on B200 at 70% of the
FP64 rate (docs/performance.md); the GPU check's fast-path-off ratio measures it."""


@cache
def _model_linears(model: str, overrides: tuple) -> tuple[tuple[str, int, int], ...]:
    shell = models.build(model, device="meta", **dict(overrides))
    return tuple(
        (name, shell.get_submodule(name).in_features, shell.get_submodule(name).out_features)
        for name in models.eligible_linears(shell)
    )


@cache
def _parameters(model: str, overrides: tuple) -> int:
    return models.count_parameters(models.build(model, device="meta", **dict(overrides)))


def _key(cfg: TrainConfig) -> tuple[str, tuple]:
    return cfg.model, tuple(sorted((k, repr(v) if isinstance(v, list) else v) for k, v in cfg.model_overrides.items()))


def linears(cfg: TrainConfig) -> list[tuple[int, int, bool]]:
    """(in, out, runs in FP4) of every eligible linear of the run's model under its recipe (a meta build)."""
    recipe = cfg.resolved_recipe()
    model, overrides = _key(cfg)
    out = []
    for name, features_in, features_out in _model_linears(model, overrides):
        fp4 = recipe.gemm.model is not GemmModel.BF16 and not recipe.is_bf16_layer(layer_index(name))
        out.append((features_in, features_out, fp4))
    return out


def _gemms(tokens: int, features_in: int, features_out: int) -> list[tuple[int, int, int]]:
    """(M, N, K) of fprop, dgrad and wgrad."""
    return [
        (tokens, features_out, features_in),
        (tokens, features_in, features_out),
        (features_out, features_in, tokens),
    ]


def _memory_seconds(count: float, gpu: GpuType, eff: Efficiency) -> float:
    return count / (gpu.hbm * eff.memory)


def linear_seconds(
    recipe: Recipe, tokens: int, features_in: int, features_out: int, gpu: GpuType, eff: Efficiency, *, native: bool
) -> float:
    """Estimated seconds of one FP4 linear's forward + backward on one microbatch of ``tokens`` tokens: native on a
    GPU with FP4 tensor cores when ``native``, emulated otherwise."""
    gemms = _gemms(tokens, features_in, features_out)
    x_elems, dy_elems, w_elems = tokens * features_in, tokens * features_out, features_in * features_out
    flops = sum(2 * m * n * k for m, n, k in gemms)
    outputs = sum(m * n for m, n, _ in gemms)
    specs = recipe.operand_specs("model.layers.0.mlp.up_proj", 0)
    rht = specs[Operand.WGRAD_ACTIVATION].rht
    if native:
        # TE's fused casts: read BF16, write FP4 + scales both ways; the RHT copies read and write BF16 once more
        cast = 3.5 * (x_elems + dy_elems) + 3.5 * w_elems + (8 if rht else 0) * (x_elems + dy_elems)
        return flops / (gpu.nvfp4 * eff.native_fp4) + _memory_seconds(cast + 2 * outputs, gpu, eff)
    # casts of X and dY to FP32 (read 2, write 4), one amax pass (4), quantization: the two-axis kernel (read 4,
    # write 2 x 4) or, with RHT copies, two single ones (read 4, write 4 each) plus the RHT (read 4, write 2, cast
    # back 2 + 4); packing X's wgrad copy (about 6 passes of 4 bytes) and unpacking it (3 passes)
    per_element = 6 + 4 + (12 if not rht else 16 + 12)
    glue = per_element * (x_elems + dy_elems) + 36 * x_elems
    glue += 10 * outputs  # FP32 GEMM outputs written, read and cast to BF16
    glue += 12 * w_elems / 24  # the weight's two quantizations, once per step (of the paper's 24 microbatches)
    if recipe.gemm.model is GemmModel.PROBE_MATCHED:
        prepare = sum(6 * (m * k + k * n) for m, n, k in gemms)
        mma = flops / (gpu.bf16 * eff.triton_mma)
        alu = sum(3 * m * n * k / 64 for m, n, k in gemms) / (gpu.fp32 / 2 * eff.alu)
        flagged = max(eff.flagged_share, eff.exact_share)
        exact_path = 1 + flagged + (EXACT_SLICE_COST - 2) * eff.exact_share
        return (mma + 0.5 * alu) * exact_path + _memory_seconds(glue + prepare, gpu, eff)
    # encoded_fp32 / decoded: FP32 GEMMs on the CUDA cores, operands materialised in FP32 first
    operands = sum(8 * (m * k + k * n) for m, n, k in gemms)
    return flops / (gpu.fp32 * eff.cublas) + _memory_seconds(glue + operands, gpu, eff)


def bf16_linear_seconds(tokens: int, features_in: int, features_out: int, gpu: GpuType, eff: Efficiency) -> float:
    flops = sum(2 * m * n * k for m, n, k in _gemms(tokens, features_in, features_out))
    return flops / (gpu.bf16 * eff.cublas)


def microbatch_seconds(cfg: TrainConfig, gpu: GpuType, tokens: int, eff: Efficiency, *, native: bool) -> float:
    """Estimated compute seconds of one microbatch of ``tokens`` tokens on one GPU of the run's model and recipe."""
    model, overrides = _key(cfg)
    bf16_step = 6 * _parameters(model, overrides) * tokens / (gpu.bf16 * eff.mfu)
    layers = linears(cfg)
    common = bf16_step - sum(bf16_linear_seconds(tokens, i, o, gpu, eff) for i, o, _ in layers)
    recipe = cfg.resolved_recipe()
    total = common
    for features_in, features_out, fp4 in layers:
        if fp4:
            total += linear_seconds(recipe, tokens, features_in, features_out, gpu, eff, native=native)
        else:
            total += bf16_linear_seconds(tokens, features_in, features_out, gpu, eff)
    return total


def communication_seconds(link_bytes: float, units: int, compute: float, bandwidth: float, eff: Efficiency) -> float:
    """The step's wall time from its compute and its collectives: overlapped but for one unit's share."""
    if link_bytes <= 0:
        return compute
    comm = link_bytes / (bandwidth * eff.network)
    return max(compute, comm) + comm / max(units, 1)


def measured_seconds(records: Iterable[str | Path], gpu: str, model: str, recipe: str, tokens: int) -> float | None:
    """A measured microbatch time from GPU-check records (``benchmarks/gpu_check.py --json``): the first record of
    ``gpu`` with a ``step_times`` entry for (model, recipe, tokens); None if none."""
    for path in records:
        record: Mapping[str, Any] = json.loads(Path(path).read_text())
        if record.get("gpu") != gpu:
            continue
        for entry in record.get("step_times", ()):
            if (entry.get("model"), entry.get("recipe"), entry.get("tokens")) == (model, recipe, tokens):
                return float(entry["microbatch_seconds"])
    return None
