"""Emulator identification cost: candidate evaluation per cell against a plain FP64 dot product, and a whole fit.

Usage: python benchmarks/identify.py [--cells 512] [--k 6144] [--threads 1] [--json out.json]

Times, on one thread and in one process: the FP64 sum of the same exact products (the baseline), the exact
superaccumulator sum, one accumulator pass of each candidate family (exact slices with RTZ, fused 35-bit, fused
13-bit with promotion), and ``gemm.matmul`` probe_matched on the GEMM whose cells these are; then the whole fit
of the CPU pipeline's candidate grid (126 candidates) on the default CPU corpus against a synthetic oracle.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def _best(fn, repeats: int = 3) -> float:
    fn()  # warm-up (and the C kernel's first compile)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    from ue5m3.experiments.accumulation import exact_sum
    from ue5m3.identify import CorpusConfig, EmulatorOracle, accumulate_cells, candidate_grid, fit, make_corpus, parse
    from ue5m3.numerics import gemm
    from ue5m3.numerics.quantize import quantize

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=512, help="output cells (a square-ish GEMM is formed)")
    parser.add_argument("--k", type=int, default=6144)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="also write the rows as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    side = int(args.cells**0.5)
    gen = torch.Generator().manual_seed(0)
    a_q = quantize(torch.randn(side, args.k, generator=gen), "nvfp4", axis=1)
    b_q = quantize(torch.randn(args.k, side, generator=gen), "nvfp4", axis=0)
    products = (a_q.encoded().double()[:, None, :] * b_q.encoded().double().T[None]).reshape(-1, args.k)
    cases = {
        "FP64 sum of products (baseline)": lambda: products.sum(1),
        "exact superaccumulator sum": lambda: exact_sum(products),
        "w64-exact-rtz-g1024": lambda: accumulate_cells(products, parse("w64-exact-rtz-g1024"), block=16),
        "w64-fused35-rtz (MMA-Sim)": lambda: accumulate_cells(products, parse("w64-fused35-rtz"), block=16),
        "w32-fused13-rtz-p128": lambda: accumulate_cells(products, parse("w32-fused13-rtz-p128"), block=16),
        "gemm.matmul probe_matched (whole GEMM)": lambda: gemm.matmul(a_q, b_q, "probe_matched"),
    }
    rows = []
    baseline = None
    for name, fn in cases.items():
        seconds = _best(fn)
        baseline = baseline or seconds
        rows.append({"case": name, "ms": round(seconds * 1e3, 2), "x_baseline": round(seconds / baseline, 2),
                     "cells_per_s": round(products.shape[0] / seconds)})  # fmt: skip
    corpus = make_corpus(CorpusConfig())
    grid = candidate_grid(partial_bits=(None, 35))
    start = time.perf_counter()
    table = fit(corpus, EmulatorOracle("w64-exact-rtz-g1024"), grid)
    seconds = time.perf_counter() - start
    rows.append({"case": f"fit: {len(grid)} candidates x {table.cells} cells (CPU corpus)", "ms": round(seconds * 1e3),
                 "x_baseline": None, "cells_per_s": round(table.cells * len(grid) / seconds)})  # fmt: skip
    print(f"{'case':58s} {'ms':>10s} {'x base':>8s} {'cells/s':>12s}")
    for row in rows:
        ratio = "" if row["x_baseline"] is None else f"{row['x_baseline']:.2f}"
        print(f"{row['case']:58s} {row['ms']:>10} {ratio:>8s} {row['cells_per_s']:>12}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(
                {"cells": products.shape[0], "k": args.k, "threads": args.threads, "rows": rows}, handle, indent=2
            )


if __name__ == "__main__":
    main()
