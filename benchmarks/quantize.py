"""Block-quantization throughput on a 4096x4096 FP32 tensor, against torchao and a plain copy.

Usage: python benchmarks/quantize.py [--size 4096] [--repeats 7] [--json out.json]

Every row is timed in the same process (best of --repeats after one warm-up): UE5M3 block 16 (1D and 2D
tiles), NVFP4 (TE order), MXFP4 (OCP floor) through the default backend (the fused C kernel) and through the
torch reference path, torchao's nvfp4_quantize as an independent implementation, and a plain tensor copy
(clone: the memory floor of writing one output as large as the input). Ratios are against the copy and
torchao, measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import warnings

import torch

from ue5m3.numerics.philox import RandomStream
from ue5m3.numerics.quantize import quantize


def best_time(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", help="also write the rows as JSON here")
    args = parser.parse_args()
    x = torch.randn(args.size, args.size, generator=torch.Generator().manual_seed(0))
    n = x.numel()
    stream = RandomStream(
        seed=0, module="bench", role="dgrad_upstream_gradient", step=1
    )  # Philox bits, drawn in-kernel
    cases = {
        "copy (x.clone())": lambda: x.clone(),
        "ue5m3_b16 1D": lambda: quantize(x, "ue5m3_b16"),
        "ue5m3_b16 2D tiles": lambda: quantize(x, "ue5m3_b16", two_d=True),
        "nvfp4 (TE order)": lambda: quantize(x, "nvfp4"),
        "mxfp4 (OCP floor)": lambda: quantize(x, "mxfp4"),
        "ue5m3_b16 1D, SF rounding": lambda: quantize(x, "ue5m3_b16", rounding="sf", stream=stream),
        "nvfp4, sr_te rounding": lambda: quantize(x, "nvfp4", rounding="sr_te", stream=stream),
        "ue5m3_b16 1D, SR (53 bits)": lambda: quantize(x, "ue5m3_b16", rounding="sr", stream=stream),
        "ue5m3_b16 1D, torch reference": lambda: quantize(x, "ue5m3_b16", backend="torch"),
        "nvfp4, torch reference": lambda: quantize(x, "nvfp4", backend="torch"),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize

            cases["torchao nvfp4_quantize"] = lambda: nvfp4_quantize(
                x, block_size=16, per_tensor_scale=x.abs().max() / 2688
            )
        except ImportError:
            print("torchao not installed: its row is skipped")
    times = {name: best_time(fn, args.repeats) for name, fn in cases.items()}
    copy, ao = times["copy (x.clone())"], times.get("torchao nvfp4_quantize")
    rows = []
    print(
        f"{args.size}x{args.size} FP32, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}"
    )
    print("| case | ms | Melem/s | x copy time | speed-up vs torchao |\n|---|---:|---:|---:|---:|")
    for name, t in times.items():
        row = {
            "case": name,
            "ms": 1e3 * t,
            "melem_per_s": n / t / 1e6,
            "x_copy": t / copy,
            "speedup_vs_torchao": (ao / t) if ao else None,
        }
        rows.append(row)
        vs_ao = f"{row['speedup_vs_torchao']:.2f}" if ao else "-"
        print(f"| {name} | {row['ms']:.1f} | {row['melem_per_s']:.0f} | {row['x_copy']:.2f} | {vs_ao} |")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"size": args.size, "threads": torch.get_num_threads(), "rows": rows}, handle, indent=2)


if __name__ == "__main__":
    main()
