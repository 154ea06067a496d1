"""A roofline cost model of one Nemotron-H 8B training step per paper recipe on H100, H200 and B200: an estimate.

    python benchmarks/cost_model.py [--markdown]

No GPU has run the emulated path yet (docs/performance.md), so every number here comes from published dense peaks
and stated efficiencies, not from a measurement; ``benchmarks/gpu_check.py`` measures the kernel ratios this
model assumes. What it models, per FP4 linear and microbatch of 8,192 tokens, from the operations the code runs:

* ``probe_matched`` (the UE5M3 recipes): per GEMM the preparation pass (read the FP32 payload, write FP16: 6 bytes
  per operand element), the FP16 tensor-core dot of the fast path, and 3 FP32 operations per output and 64-slice
  (two power-of-two shifts, one ``add.rz``) of which half are taken to overlap the MMA; the exact path is not
  costed (typical operands never take it: tests/test_triton_gemm.py).
* ``encoded_fp32`` (torch control) and ``decoded`` (MXFP4): FP32 GEMMs with TF32 off, at the FP32 CUDA-core rate.
* Quantization and glue, all memory-bound: the FP32 casts of X and dY, one amax pass each, the two-axis kernel
  (read 4 bytes, write two FP32 payloads), packing X's wgrad copy and unpacking it, the FP32 GEMM outputs and
  their casts; the RHT copies of the TE-settings recipe; the weight's quantizations once per step (cached).
* Native NVFP4 (``nvfp4_te``, ``nvfp4_no_rht_all_linears``, Blackwell only): FP4 tensor-core GEMMs and Transformer
  Engine's fused casts (read BF16, write FP4 and scales in both orientations), the RHT for ``nvfp4_te``.

The rest of the step (the SSD scan, attention, norms, embedding, the FP32 head, the optimizer, communication) is
the same under every recipe; it is taken from a BF16 step at ``--mfu`` model-FLOPs utilisation (6 N D) minus the
BF16 linears. The BF16 and FP4 linear counts of each recipe come from the project's own conversion of the 8B model
on the meta device (96 + 16 for the NVIDIA recipes, 112 + 0 for the others).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys

import torch

TOKENS = 8192  # one microbatch: 1 sequence of 8,192 tokens
STEP_TOKENS = 768 * 8192  # one optimizer step of the paper's runs
STEPS = 30_000
PARAMETERS = 8.08e9


@dataclasses.dataclass(frozen=True)
class Gpu:
    """Dense peaks per GPU (vendor datasheets, SXM parts): FLOP/s and HBM bytes/s."""

    bf16: float
    fp32: float  # CUDA-core FP32 (an FMA counts 2)
    hbm: float
    nvfp4: float | None = None  # FP4 tensor cores (Blackwell)


GPUS = {
    "H100": Gpu(bf16=989e12, fp32=67e12, hbm=3.35e12),
    "H200": Gpu(bf16=989e12, fp32=67e12, hbm=4.8e12),
    "B200": Gpu(bf16=2.25e15, fp32=75e12, hbm=8.0e12, nvfp4=9.0e15),
}


@dataclasses.dataclass(frozen=True)
class Efficiency:
    """Fractions of peak each kind of work reaches (assumptions, stated with the results)."""

    cublas: float = 0.70  # BF16 and FP32 GEMMs through cuBLAS at the 8B shapes
    triton_mma: float = 0.55  # the Triton fast path's FP16 dots
    alu: float = 0.70  # the fast path's per-slice FP32 operations
    memory: float = 0.75  # memory-bound kernels
    native_fp4: float = 0.60  # TE's NVFP4 GEMMs
    mfu: float = 0.40  # a whole BF16 step (for the part no recipe changes)


def _recipe(recipe_name: str):
    """The packaged recipe resolved for the 8B model (its depth-relative layer selectors made absolute)."""
    from ue5m3.layers import recipes
    from ue5m3.training.config import model_layers

    return recipes.get(recipe_name).for_model(model_layers("nemotron_h_8b"))


@functools.cache
def _linears(recipe_name: str) -> list[tuple[int, int, bool]]:
    """(in, out, runs in FP4) of every eligible linear of the 8B model under the recipe, from a meta build."""
    from ue5m3 import models
    from ue5m3.layers.linear import layer_index
    from ue5m3.layers.recipes import GemmModel

    model = models.build("nemotron_h_8b", device="meta")
    recipe = _recipe(recipe_name)
    out = []
    for name in models.eligible_linears(model):
        module = model.get_submodule(name)
        fp4 = recipe.gemm.model is not GemmModel.BF16 and not recipe.is_bf16_layer(layer_index(name))
        out.append((module.in_features, module.out_features, fp4))
    return out


def _gemms(features_in: int, features_out: int) -> list[tuple[int, int, int]]:
    """(M, N, K) of fprop, dgrad and wgrad."""
    t = TOKENS
    return [(t, features_out, features_in), (t, features_in, features_out), (features_out, features_in, t)]


def _seconds_bytes(count: float, gpu: Gpu, eff: Efficiency) -> float:
    return count / (gpu.hbm * eff.memory)


def linear_seconds(recipe_name: str, features_in: int, features_out: int, gpu: Gpu, eff: Efficiency) -> float:
    """Estimated seconds of one FP4 linear's forward + backward on one microbatch: native on Blackwell for the
    recipes that have a native path, emulated otherwise."""
    from ue5m3.layers.recipes import GemmModel, Operand

    recipe = _recipe(recipe_name)
    x_elems, dy_elems, w_elems = TOKENS * features_in, TOKENS * features_out, features_in * features_out
    flops = sum(2 * m * n * k for m, n, k in _gemms(features_in, features_out))
    outputs = sum(m * n for m, n, _ in _gemms(features_in, features_out))
    if recipe.native_te and gpu.nvfp4 is not None:  # as the paper ran them on Blackwell; emulated elsewhere
        rht = recipe.operand_specs("model.layers.0.mlp.up_proj", 0)[Operand.WGRAD_ACTIVATION].rht
        # TE's fused casts: read BF16, write FP4 + scales both ways; the RHT copies read and write BF16 once more
        cast = 3.5 * (x_elems + dy_elems) + 3.5 * w_elems + (8 if rht else 0) * (x_elems + dy_elems)
        return flops / (gpu.nvfp4 * eff.native_fp4) + _seconds_bytes(cast + 2 * outputs, gpu, eff)
    specs = recipe.operand_specs("model.layers.0.mlp.up_proj", 0)
    rht = specs[Operand.WGRAD_ACTIVATION].rht
    # casts of X and dY to FP32 (read 2, write 4), one amax pass (4), quantization: the two-axis kernel (read 4,
    # write 2 x 4) or, with RHT copies, two single ones (read 4, write 4 each) plus the RHT (read 4, write 2, cast
    # back 2 + 4); packing X's wgrad copy (about 6 passes of 4 bytes) and unpacking it (3 passes)
    per_element = 6 + 4 + (12 if not rht else 16 + 12)
    glue = per_element * (x_elems + dy_elems) + 36 * x_elems
    glue += 10 * outputs  # FP32 GEMM outputs written, read and cast to BF16
    glue += 12 * w_elems / 24  # the weight's two quantizations, once per step of 24 microbatches
    model = recipe.gemm.model
    if model is GemmModel.PROBE_MATCHED:
        prepare = sum(6 * (m * k + k * n) for m, n, k in _gemms(features_in, features_out))
        mma = flops / (gpu.bf16 * eff.triton_mma)
        alu = sum(3 * m * n * k / 64 for m, n, k in _gemms(features_in, features_out)) / (gpu.fp32 / 2 * eff.alu)
        return mma + 0.5 * alu + _seconds_bytes(glue + prepare, gpu, eff)
    # encoded_fp32 / decoded: FP32 GEMMs on the CUDA cores, operands materialised in FP32 first
    operands = sum(8 * (m * k + k * n) for m, n, k in _gemms(features_in, features_out))
    return flops / (gpu.fp32 * eff.cublas) + _seconds_bytes(glue + operands, gpu, eff)


def bf16_linear_seconds(features_in: int, features_out: int, gpu: Gpu, eff: Efficiency) -> float:
    flops = sum(2 * m * n * k for m, n, k in _gemms(features_in, features_out))
    return flops / (gpu.bf16 * eff.cublas)


RECIPES = (
    "bf16",
    "ue5m3_b16",
    "ue5m3_b32",
    "ue5m3_torch_control",
    "ue5m3_te_settings",
    "nvfp4_te",
    "nvfp4_no_rht_all_linears",
)


def estimate(eff: Efficiency = Efficiency()) -> list[dict]:
    """One row per (GPU, recipe): seconds per microbatch, x a BF16 step, GPU-seconds per step, GPU-hours per run."""
    rows = []
    for gpu_name, gpu in GPUS.items():
        bf16_microbatch = 6 * PARAMETERS * TOKENS / (gpu.bf16 * eff.mfu)
        bf16_linears = sum(bf16_linear_seconds(i, o, gpu, eff) for i, o, _ in _linears("bf16"))
        common = bf16_microbatch - bf16_linears  # what no recipe changes
        for recipe_name in RECIPES:
            total = common
            for features_in, features_out, fp4 in _linears(recipe_name):
                if fp4:
                    total += linear_seconds(recipe_name, features_in, features_out, gpu, eff)
                else:
                    total += bf16_linear_seconds(features_in, features_out, gpu, eff)
            native = _recipe(recipe_name).native_te and gpu.nvfp4 is not None
            step = total * STEP_TOKENS / TOKENS
            rows.append(
                {
                    "gpu": gpu_name,
                    "recipe": recipe_name + (" (native)" if native else ""),
                    "microbatch_seconds": total,
                    "x_bf16": total / bf16_microbatch,
                    "gpu_seconds_per_step": step,
                    "gpu_hours_per_run": step * STEPS / 3600,
                }
            )
    return rows


def render_markdown(rows: list[dict], eff: Efficiency = Efficiency()) -> str:
    lines = [
        f"Assumptions: {', '.join(f'{k} {v:.0%}' for k, v in dataclasses.asdict(eff).items())} of peak; "
        f"microbatch {TOKENS} tokens, step {STEP_TOKENS:,} tokens, {STEPS:,} steps.",
        "",
        "| GPU | recipe | s / microbatch | x BF16 step | GPU-s / step | GPU-hours / run |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['gpu']} | {row['recipe']} | {row['microbatch_seconds']:.3f} | {row['x_bf16']:.2f} | "
            f"{row['gpu_seconds_per_step']:.0f} | {row['gpu_hours_per_run']:,.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mfu", type=float, default=Efficiency.mfu, help="BF16 step utilisation (default 0.40)")
    args = parser.parse_args(argv)
    eff = dataclasses.replace(Efficiency(), mfu=args.mfu)
    with torch.device("meta"):
        print(render_markdown(estimate(eff), eff))
    return 0


if __name__ == "__main__":
    sys.exit(main())
