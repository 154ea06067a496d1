"""Step overhead of the scale telemetry: the same training run with and without it, interleaved, per recipe.

Usage: python benchmarks/telemetry.py [--recipes ue5m3_b16 nvfp4_te] [--model nemotron_h_debug]
                                      [--pattern "*-M-M-M-M-M-"] [--log-every 5] [--blocks 12]
                                      [--micro-batch 8] [--sequence 128] [--threads 1] [--json out.json]

Per recipe, two copies of one run (same seed: same initial weights, data and SR bits) train side by side in one
process, one thread by default as the pipeline runs them: ``with`` samples the scale telemetry on each logged step,
as the trainer does (``QuantStats.sample``), ``without`` never samples. Both read the block counts and write a
metrics record on each logged step, so the difference is what the telemetry adds: its device-side sampling, its
read and its share of the record. The copies alternate in blocks of ``--log-every`` steps (one logged step each),
so a load change on a shared machine falls on both; a warm-up block of each comes first. Times are the process's CPU
time (``time.process_time``: on a machine whose cores other jobs share, wall time mostly measures them; with one
thread the process's CPU time is its step time on an idle core), wall times are reported beside them. The overhead
is the ratio of the total times minus one, with a 95% t interval over the paired blocks (their time ratios), and
the cost of one sampled step over an unsampled one. Loss and gradient norm agree bit for bit between the copies
(checked): the telemetry reads the operands, it never changes them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

PIPELINE_PATTERN = "*-M-M-M-M-M-"  # config/config.yaml's training model: the 8B model's final 12 blocks


def _run(args: argparse.Namespace, recipe: str, run_dir: str):
    """One copy of the run: (model, optimizer, stream, config, resolved recipe, its QuantStats)."""
    import torch

    from ue5m3 import models
    from ue5m3.data import RandomTokenStream
    from ue5m3.layers.linear import find_quant_stats
    from ue5m3.training.build import build_model, build_optimizer
    from ue5m3.training.config import TrainConfig

    overrides = {"hybrid_override_pattern": args.pattern} if args.pattern else {}
    vocab = models.config(args.model, **overrides).vocab_size
    cfg = TrainConfig(
        run_dir=run_dir,
        model=args.model,
        model_overrides=overrides,
        recipe=recipe,
        seed=0,
        steps=10**6,  # the schedule's constant part throughout
        micro_batch=args.micro_batch,
        accumulation=1,
        data=None,
        log_every=args.log_every,
    )
    torch.manual_seed(cfg.seed)
    resolved = cfg.resolved_recipe()
    model, _ = build_model(cfg, resolved, torch.device("cpu"))
    return (
        model,
        build_optimizer(model, cfg.optim),
        RandomTokenStream(vocab, args.sequence),
        cfg,
        resolved,
        (find_quant_stats(model)),
    )


def _block(copy, first: int, sample: bool, metrics: Path) -> tuple[tuple[float, float], list[tuple[float, float]]]:
    """``log_every`` steps from ``first`` of one copy, the last one logged; ((CPU s, wall s), [(loss, grad_norm)])."""
    from ue5m3.training import loop
    from ue5m3.training.metrics import append_jsonl

    model, optimizer, stream, cfg, recipe, stats = copy
    seen = []
    began, began_cpu = time.perf_counter(), time.process_time()
    for step in range(first, first + cfg.log_every):
        logged = step % cfg.log_every == 0
        stats.sample(sample and logged)
        record = loop.train_step(step, model, optimizer, stream, cfg, recipe)
        if logged:
            record.update(stats.pop())
            append_jsonl(metrics, record)
        seen.append((record["loss"], record["grad_norm"]))
    return (time.process_time() - began_cpu, time.perf_counter() - began), seen


def _t_interval(ratios: list[float]) -> tuple[float, float]:
    from ue5m3.evaluation.nll import t_quantile

    n = len(ratios)
    half = t_quantile(0.975, n - 1) * statistics.stdev(ratios) / math.sqrt(n)
    mean = statistics.fmean(ratios)
    return mean - half, mean + half


def measure(args: argparse.Namespace, recipe: str) -> dict:
    """Interleaved blocks of the two copies of ``recipe``'s run; the overhead of ``with`` over ``without``."""
    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        copies = {mode: _run(args, recipe, os.path.join(tmp, mode)) for mode in ("with", "without")}
        times: dict[str, list[float]] = {"with": [], "without": []}
        walls: dict[str, list[float]] = {"with": [], "without": []}
        for index in range(args.blocks + 1):  # block 0 warms both up and is not counted
            first = index * args.log_every + 1
            order = ("with", "without") if index % 2 else ("without", "with")
            seen = {}
            for mode in order:
                (cpu, wall), seen[mode] = _block(copies[mode], first, mode == "with", Path(tmp, f"{mode}.jsonl"))
                if index:
                    times[mode].append(cpu)
                    walls[mode].append(wall)
            if seen["with"] != seen["without"]:
                raise AssertionError(f"{recipe}: the telemetry changed the run at steps {first}..: {seen}")
    ratios = [a / b for a, b in zip(times["with"], times["without"], strict=True)]
    low, high = _t_interval(ratios)
    total_with, total_without = sum(times["with"]), sum(times["without"])
    per_step = total_without / (args.blocks * args.log_every)
    return {
        "recipe": recipe,
        "blocks": args.blocks,
        "log_every": args.log_every,
        "cpu_s_with": total_with,
        "cpu_s_without": total_without,
        "wall_s_with": sum(walls["with"]),
        "wall_s_without": sum(walls["without"]),
        "overhead": total_with / total_without - 1,
        "overhead_low": low - 1,
        "overhead_high": high - 1,
        # one sampled step's extra cost over an unsampled one (what --log-every 1 would pay per step)
        "sampled_step_overhead": (total_with - total_without) / args.blocks / per_step,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipes", nargs="+", default=["ue5m3_b16", "nvfp4_te"])
    parser.add_argument("--model", default="nemotron_h_debug")
    parser.add_argument("--pattern", default=PIPELINE_PATTERN)
    parser.add_argument("--log-every", type=int, default=5, help="the pipeline's logging interval (config.yaml)")
    parser.add_argument("--blocks", type=int, default=12, help="timed blocks of --log-every steps per copy")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--sequence", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="also write the rows as JSON here")
    args = parser.parse_args()
    if args.blocks < 2:
        parser.error("--blocks: at least 2 (an interval needs two paired blocks)")
    rows = [measure(args, recipe) for recipe in args.recipes]
    print(
        f"{args.model} ({args.pattern or 'own pattern'}), micro-batch {args.micro_batch} x {args.sequence} tokens, "
        f"{args.threads} thread(s), logged every {args.log_every} steps, {args.blocks} interleaved blocks per copy"
    )
    print(
        "| recipe | CPU s with | CPU s without | overhead | 95% t interval | one sampled step | wall s with | "
        "wall s without |\n|---|---:|---:|---:|---|---:|---:|---:|"
    )
    for r in rows:
        print(
            f"| {r['recipe']} | {r['cpu_s_with']:.2f} | {r['cpu_s_without']:.2f} | {r['overhead']:+.1%} | "
            f"[{r['overhead_low']:+.1%}, {r['overhead_high']:+.1%}] | {r['sampled_step_overhead']:+.1%} | "
            f"{r['wall_s_with']:.2f} | {r['wall_s_without']:.2f} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
