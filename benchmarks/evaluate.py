"""Evaluation throughput (forward-only tokens/s) per inference policy, at CPU scale.

Usage: python benchmarks/evaluate.py [--model nemotron_h_debug] [--pattern "*-M-M-M-M-M-"] [--recipe ue5m3_b16]
                                     [--sequence 128] [--units 30] [--threads 1] [--json out.json]

Trains a one-step run on random tokens in a temporary directory (evaluation cost does not depend on training),
then, for each policy, loads it with `ue5m3.evaluation.inference.load_for_inference` and times `forward_unit` on batch-1
sequences (the validation protocol's work unit), the head included; all policies are timed in one process, one
thread by default as the pipeline runs evaluation jobs. calibrated_frozen evaluates like a frozen replay unit
and needs a prepared data calibration split, so it is not timed here.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch

PIPELINE_PATTERN = "*-M-M-M-M-M-"  # config/config.yaml's training model: the 8B model's final 12 blocks


def main() -> None:
    from ue5m3 import models
    from ue5m3.data import RandomTokenStream
    from ue5m3.evaluation.inference import load_for_inference
    from ue5m3.training import loop as train
    from ue5m3.training.config import TrainConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="nemotron_h_debug")
    parser.add_argument(
        "--pattern",
        default=PIPELINE_PATTERN,
        help="Nemotron-H block pattern (default: the CPU pipeline's training model, deep enough for the recipes' "
        "final 8 layers); '' keeps the model's own",
    )
    parser.add_argument("--recipe", default="ue5m3_b16")
    parser.add_argument("--sequence", type=int, default=128)
    parser.add_argument("--units", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="also write the rows as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    overrides = {"hybrid_override_pattern": args.pattern} if args.pattern else {}
    vocab = models.config(args.model, **overrides).vocab_size
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig(
            run_dir=tmp,
            model=args.model,
            model_overrides=overrides,
            recipe=args.recipe,
            seed=0,
            steps=1,
            micro_batch=1,
            accumulation=1,
            data=None,
            checkpoint_every=1,
        )
        train.train(cfg, RandomTokenStream(vocab, args.sequence))
        ids = torch.randint(0, vocab, (args.units, 1, args.sequence), generator=torch.Generator().manual_seed(1))
        for policy in ("bf16", "current_tensor", "cold_d50_replay"):
            loaded = load_for_inference(tmp, policy=policy, force_bf16=policy == "bf16", device="cpu")
            with torch.no_grad():
                loaded.forward_unit(ids[0])  # warm-up
                start = time.perf_counter()
                for unit in ids[1:]:
                    loaded.forward_unit(unit)
                seconds = time.perf_counter() - start
            rows.append({"policy": policy, "tokens_per_s": (args.units - 1) * args.sequence / seconds})
    base = rows[0]["tokens_per_s"]
    print(f"{args.model} under {args.recipe}, batch-1 units of {args.sequence} tokens, {args.threads} thread(s)")
    print("| policy | tokens/s | x bf16 time |\n|---|---:|---:|")
    for row in rows:
        row["x_bf16_time"] = base / row["tokens_per_s"]
        print(f"| {row['policy']} | {row['tokens_per_s']:.0f} | {row['x_bf16_time']:.2f} |")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "rows": rows}, handle, indent=2)


if __name__ == "__main__":
    main()
