"""Evaluation throughput (forward-only tokens/s) per inference policy, at CPU scale.

Usage: python benchmarks/evaluate.py [--model nemotron_h_debug] [--pattern "*-M-M-M-M-M-"] [--recipe ue5m3_b16]
                                     [--sequence 128] [--units 30] [--threads 1] [--json out.json]
                                     [--baseline-src OTHER_CHECKOUT/src --pairs 6 --policies cold_d50_replay ...]

Trains a one-step run on random tokens in a temporary directory (evaluation cost does not depend on training),
then, for each policy, loads it with `ue5m3.evaluation.inference.load_for_inference` and times `forward_unit` on batch-1
sequences (the validation protocol's work unit), the head included; all policies are timed in one process, one
thread by default as the pipeline runs evaluation jobs. calibrated_frozen evaluates like a frozen replay unit
and needs a prepared data calibration split, so it is not timed here.

``--baseline-src`` times another checkout's package (its ``src``, put first on ``PYTHONPATH``) against this one: per
policy, ``--pairs`` alternating processes of the two, each the CPU seconds per work unit over ``--units`` units of
one checkpoint trained by this checkout (so both evaluate the same weights), and the median of the per-pair ratios
with its range; each pair's two checksums of the logits must agree (the same numbers).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

import paired  # benchmarks/paired.py, beside this script
import torch

PIPELINE_PATTERN = "*-M-M-M-M-M-"  # config/config.yaml's training model: the 8B model's final 12 blocks
POLICIES = ("bf16", "current_tensor", "cold_d50_replay")


def _train_one_step(args: argparse.Namespace, run_dir: str) -> int:
    """A one-step run of ``args.recipe`` in ``run_dir``; returns the model's vocabulary size."""
    from ue5m3 import models
    from ue5m3.data import RandomTokenStream
    from ue5m3.training import loop as train
    from ue5m3.training.config import TrainConfig

    overrides = {"hybrid_override_pattern": args.pattern} if args.pattern else {}
    vocab = models.config(args.model, **overrides).vocab_size
    cfg = TrainConfig(
        run_dir=run_dir,
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
    return vocab


def _units(args: argparse.Namespace, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (args.units, 1, args.sequence), generator=torch.Generator().manual_seed(1))


def _time_policy(run_dir: str, policy: str, ids: torch.Tensor, clock) -> tuple[float, float]:
    """(seconds per unit after one warm-up unit by ``clock``, the checksum of the units' logits)."""
    from ue5m3.evaluation.inference import load_for_inference

    loaded = load_for_inference(run_dir, policy=policy, force_bf16=policy == "bf16", device="cpu")
    with torch.no_grad():
        loaded.forward_unit(ids[0])  # warm-up
        start, checksum = clock(), 0.0
        for unit in ids[1:]:
            checksum += float(loaded.forward_unit(unit).double().sum())  # the logits: the head included
        seconds = clock() - start
    return seconds / (len(ids) - 1), checksum


def _case(args: argparse.Namespace) -> None:
    """One policy timed in CPU seconds on the run in ``args.run_dir`` (a process of the paired comparison)."""
    torch.set_num_threads(args.threads)
    vocab = json.loads(args.case_vocab)
    seconds, checksum = _time_policy(args.run_dir, args.case, _units(args, vocab), time.process_time)
    print(json.dumps({"policy": args.case, "cpu_s_per_unit": seconds, "checksum": checksum}))


def _paired(args: argparse.Namespace) -> None:
    """This checkout against ``args.baseline_src``, alternating processes (see the module docstring)."""
    torch.set_num_threads(args.threads)
    base_env = paired.baseline_env(args.baseline_src)
    title = f"this checkout against {args.baseline_src}: {args.pairs} alternating pairs, CPU ms per work unit"
    paired.print_header(title, "policy", "ms")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        vocab = _train_one_step(args, tmp)
        common = ["--run-dir", tmp, "--case-vocab", str(vocab), "--units", str(args.units)]
        common += ["--sequence", str(args.sequence), "--threads", str(args.threads)]
        for policy in args.policies:
            pairs = []
            for _ in range(args.pairs):
                results = []
                for env in (base_env, None):
                    cmd = [sys.executable, __file__, "--case", policy, *common]
                    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
                    results.append(json.loads(out.stdout.splitlines()[-1]))
                if results[0]["checksum"] != results[1]["checksum"]:
                    raise SystemExit(f"{policy}: the two checkouts' logits differ ({results})")
                pairs.append(tuple(1e3 * r["cpu_s_per_unit"] for r in results))
            rows.append(paired.summarize(policy, "policy", pairs, digits=1))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "rows": rows}, handle, indent=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="nemotron_h_debug")
    parser.add_argument(
        "--pattern",
        default=PIPELINE_PATTERN,
        help="Nemotron-H block pattern (default: the CPU pipeline's training model); '' keeps the model's own",
    )
    parser.add_argument("--recipe", default="ue5m3_b16")
    parser.add_argument("--sequence", type=int, default=128)
    parser.add_argument("--units", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--baseline-src", help="another checkout's src to time against this one, paired")
    parser.add_argument("--pairs", type=int, default=6, help="alternating process pairs per policy (--baseline-src)")
    parser.add_argument("--json", help="also write the rows as JSON here")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # internal: one policy of a paired comparison
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    parser.add_argument("--case-vocab", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        _case(args)
        return
    if args.baseline_src:
        _paired(args)
        return
    torch.set_num_threads(args.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ids = _units(args, _train_one_step(args, tmp))
        for policy in args.policies:
            seconds, _ = _time_policy(tmp, policy, ids, time.perf_counter)
            rows.append({"policy": policy, "tokens_per_s": args.sequence / seconds})
    base = rows[0]["tokens_per_s"]
    print(f"{args.model} under {args.recipe}, batch-1 units of {args.sequence} tokens, {args.threads} thread(s)")
    print(f"| policy | tokens/s | x {rows[0]['policy']} time |\n|---|---:|---:|")
    for row in rows:
        row["x_first_time"] = base / row["tokens_per_s"]
        print(f"| {row['policy']} | {row['tokens_per_s']:.0f} | {row['x_first_time']:.2f} |")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "rows": rows}, handle, indent=2)


if __name__ == "__main__":
    main()
