"""Forward + backward of one FP4 linear (4096 tokens, 2048 -> 2048) per GEMM output model, beside nn.Linear.

Usage: python benchmarks/linear.py [--tokens 4096] [--features 2048] [--repeats 3] [--json out.json]

Each case runs in its own process (so its peak resident memory is its own): one warm-up step, then the best
of --repeats timed steps of forward + backward with the proposed UE5M3 B16 recipe, only the GEMM output model
changed. The baseline is an FP32 nn.Linear timed the same way in the same run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import subprocess
import sys
import time

import torch
from torch import nn

CASES = ["nn.Linear", "decoded", "encoded_fp32", "probe_matched", "mma_sim"]
DEFAULT_CASES = CASES[:4]  # mma_sim (beyond the paper, block-partial based) is opt-in: --cases mma_sim


def run_case(case: str, tokens: int, features: int, repeats: int) -> dict:
    from ue5m3.layers import recipes
    from ue5m3.layers.linear import convert, find_scale_state

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(features, features))
    state = None
    if case != "nn.Linear":
        recipe = recipes.get("ue5m3_b16")
        grid = recipe.gemm.final_grid if case == "probe_matched" else None
        gemm = dataclasses.replace(recipe.gemm, model=recipes.GemmModel(case), final_grid=grid)
        convert(model, dataclasses.replace(recipe, gemm=gemm), select=["0"])
        state = find_scale_state(model)
    x = torch.randn(tokens, features)
    grad = torch.randn(tokens, features)

    def step(i: int) -> None:
        if state is not None:
            state.begin_step(i)
        model.zero_grad(set_to_none=True)
        inp = x.clone().requires_grad_()
        model(inp).backward(grad)

    step(1)
    best = float("inf")
    for i in range(repeats):
        start = time.perf_counter()
        step(i + 2)
        best = min(best, time.perf_counter() - start)
    return {"case": case, "seconds": best, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--features", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", nargs="+", default=DEFAULT_CASES, choices=CASES)
    parser.add_argument("--json", help="also write the rows as JSON here")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # internal: run one case in this process
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case, args.tokens, args.features, args.repeats)))
        return
    rows = []
    for case in args.cases:
        cmd = [
            sys.executable,
            __file__,
            "--case",
            case,
            "--tokens",
            str(args.tokens),
            "--features",
            str(args.features),
            "--repeats",
            str(args.repeats),
        ]
        rows.append(json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()[-1]))
    base = next(r["seconds"] for r in rows if r["case"] == "nn.Linear") if "nn.Linear" in args.cases else None
    print(
        f"forward+backward, {args.tokens} tokens, {args.features} -> {args.features}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    print("| GEMM output model | s / step | x nn.Linear | peak RSS (MiB) |\n|---|---:|---:|---:|")
    for row in rows:
        row["x_nn_linear"] = row["seconds"] / base if base else None
        ratio = f"{row['x_nn_linear']:.2f}" if base else "-"
        print(f"| {row['case']} | {row['seconds']:.3f} | {ratio} | {row['peak_rss_mib']:.0f} |")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"tokens": args.tokens, "features": args.features, "rows": rows}, handle, indent=2)


if __name__ == "__main__":
    main()
