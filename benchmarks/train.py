"""Training throughput and peak memory per recipe against BF16, at CPU scale.

Usage: python benchmarks/train.py [--model nemotron_h_debug] [--pattern "*-M-M-M-M-M-"] [--steps 12]
                                  [--micro-batch 8] [--sequence 128] [--threads 1] [--log-every 1] [--json out.json]
                                  [--baseline-src OTHER_CHECKOUT/src --pairs 6]

Each recipe trains in its own process (its peak resident memory is its own) on random tokens with the real
trainer (scale steps, microbatches, clipping, AdamW; checkpointing only at the end), one thread by default as
the pipeline runs it. Tokens per second are measured over the steps after the first (warm-up) step.

``--baseline-src`` times another checkout's package (its ``src``, put first on ``PYTHONPATH``) against this one:
per recipe, ``--pairs`` alternating processes of the two, each the CPU seconds of its training after a 2-step
warm-up (CPU time, as the machine may be shared), and the median of the per-pair ratios with its range: a paired
comparison, since this machine's speed drifts by 20% within minutes.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time

PIPELINE_PATTERN = "*-M-M-M-M-M-"  # config/config.yaml's training model: the 8B model's final 12 blocks
RECIPES = [
    "bf16",
    "ue5m3_b16",
    "ue5m3_b32",
    "ue5m3_torch_control",
    "ue5m3_te_settings",
    "nvfp4_te",
    "nvfp4_no_rht_all_linears",
    "mxfp4",
]


def run_case(args: argparse.Namespace) -> dict:
    import torch

    from ue5m3.data import RandomTokenStream
    from ue5m3.training import loop as train

    torch.set_num_threads(args.threads)
    if args.cpu_time:
        return _cpu_seconds(args)
    with tempfile.TemporaryDirectory() as tmp:
        cfg, vocab = _config(args, tmp, args.steps)
        start = time.perf_counter()
        train.train(cfg, RandomTokenStream(vocab, args.sequence))
        total = time.perf_counter() - start
        metrics = [json.loads(line) for line in open(f"{tmp}/metrics.jsonl")]
    tokens_per_s = sorted(m["tokens_per_s"] for m in metrics[1:])[len(metrics[1:]) // 2]  # median step
    return {
        "recipe": args.case,
        "tokens_per_s": tokens_per_s,
        "wall_s": total,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _config(args: argparse.Namespace, run_dir: str, steps: int):
    from ue5m3 import models
    from ue5m3.training.config import TrainConfig

    overrides = {"hybrid_override_pattern": args.pattern} if args.pattern else {}
    cfg = TrainConfig(
        run_dir=run_dir,
        model=args.model,
        model_overrides=overrides,
        recipe=args.case,
        seed=0,
        steps=steps,
        micro_batch=args.micro_batch,
        accumulation=1,
        data=None,
        checkpoint_every=steps,
        log_every=args.log_every,
    )
    return cfg, models.config(args.model, **overrides).vocab_size


def _cpu_seconds(args: argparse.Namespace) -> dict:
    """CPU seconds of ``args.steps`` training steps of ``args.case`` after a 2-step warm-up run."""
    from ue5m3.data import RandomTokenStream
    from ue5m3.training import loop as train

    def train_for(steps: int) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            cfg, vocab = _config(args, tmp, steps)
            train.train(cfg, RandomTokenStream(vocab, args.sequence))

    train_for(2)
    start = time.process_time()
    train_for(args.steps)
    return {"recipe": args.case, "cpu_s": time.process_time() - start}


def _paired(args: argparse.Namespace) -> None:
    """This checkout against ``args.baseline_src``, alternating processes (see the module docstring)."""
    import paired  # benchmarks/paired.py, beside this script

    common = ["--model", args.model, "--pattern", args.pattern, "--steps", str(args.steps), "--micro-batch"]
    common += [str(args.micro_batch), "--sequence", str(args.sequence), "--threads", str(args.threads)]
    common += ["--log-every", str(args.log_every), "--cpu-time"]
    base_env = paired.baseline_env(args.baseline_src)
    title = f"this checkout against {args.baseline_src}: {args.pairs} alternating pairs, CPU s of {args.steps} steps"
    paired.print_header(title, "recipe", "CPU s")
    rows = []
    for recipe in args.recipes:
        pairs = []
        for _ in range(args.pairs):
            cmd = [sys.executable, __file__, "--case", recipe, *common]
            seconds = []
            for env in (base_env, None):
                out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout.splitlines()[-1]
                seconds.append(json.loads(out)["cpu_s"])
            pairs.append(tuple(seconds))
        rows.append(paired.summarize(recipe, "recipe", pairs))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "rows": rows}, handle, indent=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="nemotron_h_debug")
    parser.add_argument(
        "--pattern",
        default=PIPELINE_PATTERN,
        help="Nemotron-H block pattern (default: the CPU pipeline's training model, deep enough for the recipes' "
        "final 8 layers); '' keeps the model's own",
    )
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--sequence", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--recipes", nargs="+", default=RECIPES)
    parser.add_argument("--log-every", type=int, default=1, help="logged (and telemetry-sampled) every N steps")
    parser.add_argument("--baseline-src", help="another checkout's src to time against this one, paired")
    parser.add_argument("--pairs", type=int, default=6, help="alternating process pairs per recipe (--baseline-src)")
    parser.add_argument("--json", help="also write the rows as JSON here")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--cpu-time", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args)))
        return
    if args.baseline_src:
        _paired(args)
        return
    rows = []
    for recipe in args.recipes:
        cmd = [
            sys.executable,
            __file__,
            "--case",
            recipe,
            "--model",
            args.model,
            "--pattern",
            args.pattern,
            "--steps",
            str(args.steps),
            "--micro-batch",
            str(args.micro_batch),
            "--sequence",
            str(args.sequence),
            "--threads",
            str(args.threads),
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()[-1]
        rows.append(json.loads(out))
    base = next((r for r in rows if r["recipe"] == "bf16"), None)
    print(
        f"{args.model}, micro-batch {args.micro_batch} x {args.sequence} tokens, {args.threads} thread(s), "
        f"median step over {args.steps - 1} steps"
    )
    print("| recipe | tokens/s | x bf16 time | peak RSS (MiB) |\n|---|---:|---:|---:|")
    for row in rows:
        row["x_bf16_time"] = base["tokens_per_s"] / row["tokens_per_s"] if base else None
        ratio = f"{row['x_bf16_time']:.2f}" if base else "-"
        print(f"| {row['recipe']} | {row['tokens_per_s']:.0f} | {ratio} | {row['peak_rss_mib']:.0f} |")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "rows": rows}, handle, indent=2)


if __name__ == "__main__":
    main()
