"""The probe_matched CPU GEMM on quantized operands against FP32 torch.mm, with its share of whole-slice tiles.

Usage: python benchmarks/payload_gemm.py [--shape 4096 2048 2048] [--scheme ue5m3_b16] [--outliers 0] [--repeats 6]

A [M, K] and B [K, N] are Gaussian (B times 0.02, a weight's scale), quantized along K; --outliers multiplies one
16-block in every 7th row of A by 2^12, which takes those tiles off the whole-slice path. Both GEMMs are timed in
the same process (best of --repeats, alternating); the ratio is against torch.mm in the same run.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

from ue5m3.numerics.kernels import cpu
from ue5m3.numerics.quantize import quantize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=int, nargs=3, default=(4096, 2048, 2048), metavar=("M", "K", "N"))
    parser.add_argument("--scheme", default="ue5m3_b16")
    parser.add_argument("--outliers", type=int, choices=(0, 1), default=0)
    parser.add_argument("--repeats", type=int, default=6)
    args = parser.parse_args()
    if not cpu.has_payload_gemm():
        raise SystemExit("payload_gemm.py: this CPU has no AVX2 + FMA, so the payload GEMM is not built here")
    m, k, n = args.shape
    generator = torch.Generator().manual_seed(0)
    x, w = torch.randn(m, k, generator=generator), torch.randn(k, n, generator=generator) * 0.02
    if args.outliers:
        x[::7, 16:32] *= 2.0**12
    a_q, b_q = quantize(x, args.scheme), quantize(w, args.scheme, axis=0)
    operands = (a_q.payload, a_q.scales, b_q.payload, b_q.scales)
    settings = {"block": a_q.scheme.block_size, "column_block": 1, "width": 64, "rtz": True, "grid": 1024}
    _, whole, total = cpu.probe_gemm_payload(*operands, alpha=1.0, count_whole=True, **settings)
    best = {"torch.mm": float("inf"), "probe_matched": float("inf")}
    for _ in range(args.repeats):
        start = time.perf_counter()
        torch.mm(x, w)
        best["torch.mm"] = min(best["torch.mm"], time.perf_counter() - start)
        start = time.perf_counter()
        cpu.probe_gemm_payload(*operands, alpha=1.0, **settings)
        best["probe_matched"] = min(best["probe_matched"], time.perf_counter() - start)
    print(
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
        f"{cpu.gemm_vector_bits()}-bit micro-kernels; {m} x {k} x {n}, {args.scheme}, outliers {args.outliers}"
    )
    print(f"whole-slice tiles: {whole} of {total} ({whole / total:.1%})")
    for name, seconds in best.items():
        print(f"{name:14s} {seconds:.3f} s  {seconds / best['torch.mm']:.2f}x torch.mm")


if __name__ == "__main__":
    main()
