"""The roofline estimate of one Nemotron-H 8B microbatch per paper recipe and GPU type: an estimate, not a measurement.

    python benchmarks/cost_model.py [--mfu 0.4] [--triton-mma 0.55] [--exact-share 0.0] [--flagged-share 0.0]
        [--shares benchmarks/records/exact_share.json --source init]

The model is :mod:`ue5m3.plan.cost` (its docstring says what it charges per FP4 linear); the plan stage uses the same
code for every job of a config (``snakemake --cores 2 plan --configfile config/paper.yaml``, docs/performance.md).
This script prints its per-recipe table for one 8,192-token microbatch of the 8B model on each GPU type of
``ue5m3/plan/gpus.csv``, with GPU-seconds per step of the paper's 768 x 8,192 tokens and GPU-hours per 30,000-step run
(compute only; the plan adds the collectives). Changing an efficiency shows the estimate's range; ``--shares`` takes
the exact path's two shares from one source of a ``benchmarks/exact_share.py`` record.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from ue5m3.plan import cost
from ue5m3.plan.gpus import gpu_types
from ue5m3.training.config import TrainConfig

TOKENS = 8192  # one microbatch: 1 sequence of 8,192 tokens
MICROBATCHES_PER_STEP = 768  # the paper's global batch of 768 sequences
STEPS = 30_000
RECIPES = (
    "bf16",
    "ue5m3_b16",
    "ue5m3_b32",
    "ue5m3_torch_control",
    "ue5m3_te_settings",
    "nvfp4_te",
    "nvfp4_no_rht_all_linears",
)


def estimate(eff: cost.Efficiency | None = None) -> list[dict]:
    """One row per (GPU type, recipe): seconds per microbatch, x a BF16 microbatch, GPU-seconds per step, GPU-hours
    per run; a recipe with a native path runs natively where the GPU has FP4 tensor cores."""
    eff = eff or cost.Efficiency()
    base = TrainConfig(run_dir="unused", model="nemotron_h_8b", recipe="bf16", seed=0, steps=1, micro_batch=1,
                       accumulation=1, data=None)  # fmt: skip
    rows = []
    for gpu in gpu_types().values():
        bf16 = cost.microbatch_seconds(base, gpu, TOKENS, eff, native=False)
        for recipe in RECIPES:
            cfg = dataclasses.replace(base, recipe=recipe)
            native = cfg.resolved_recipe().native_te and gpu.nvfp4 is not None
            seconds = cost.microbatch_seconds(cfg, gpu, TOKENS, eff, native=native)
            step = seconds * MICROBATCHES_PER_STEP
            rows.append(
                {
                    "gpu": gpu.name,
                    "recipe": recipe + (" (native)" if native else ""),
                    "microbatch_seconds": seconds,
                    "x_bf16": seconds / bf16,
                    "gpu_seconds_per_step": step,
                    "gpu_hours_per_run": step * STEPS / 3600,
                }
            )
    return rows


def render_markdown(rows: list[dict], eff: cost.Efficiency | None = None) -> str:
    eff = eff or cost.Efficiency()
    lines = [
        f"Assumptions: {', '.join(f'{k} {v:.0%}' for k, v in dataclasses.asdict(eff).items())}; microbatch "
        f"{TOKENS} tokens, step {MICROBATCHES_PER_STEP} microbatches, {STEPS:,} steps; compute only.",
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


def measured_shares(record: Path, source: str) -> tuple[float, float]:
    """(exact share, flagged share) of ``source`` in an exact-share record, naming the file and its sources if it has
    no such source."""
    sources = json.loads(record.read_text())["sources"]
    if source not in sources:
        raise SystemExit(f"{record}: no source {source!r}; it has {sorted(sources)}")
    return sources[source]["share"], sources[source]["flagged_share"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = cost.Efficiency()
    parser.add_argument("--mfu", type=float, default=defaults.mfu, help="BF16 step utilisation")
    parser.add_argument("--triton-mma", type=float, default=defaults.triton_mma, help="the fast path's MMA share")
    parser.add_argument("--exact-share", type=float, default=defaults.exact_share, help="tile-slices on the exact path")
    parser.add_argument("--flagged-share", type=float, default=defaults.flagged_share, help="in exact-kernel tiles")
    parser.add_argument("--shares", type=Path, help="a benchmarks/exact_share.py record: both shares from --source")
    parser.add_argument("--source", default="init", help="the record's source (init or a checkpoint path)")
    args = parser.parse_args(argv)
    exact, flagged = args.exact_share, args.flagged_share
    if args.shares is not None:
        exact, flagged = measured_shares(args.shares, args.source)
    eff = dataclasses.replace(
        defaults, mfu=args.mfu, triton_mma=args.triton_mma, exact_share=exact, flagged_share=flagged
    )
    print(render_markdown(estimate(eff), eff))
    return 0


if __name__ == "__main__":
    sys.exit(main())
