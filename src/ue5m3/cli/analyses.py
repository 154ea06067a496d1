"""The analysis verbs: range analysis, accumulation statistics, training summaries and format facts."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ue5m3.cli import argtypes

__all__ = ["add_verbs"]


def _range_analysis(args: argparse.Namespace) -> int:
    from ue5m3.experiments import range_analysis

    config = range_analysis.RangeAnalysisConfig(
        targets=tuple(args.targets),
        example_reference=args.example_reference,
        example_targets=tuple(args.example_targets),
    )
    paths = range_analysis.run(config, args.out_dir)
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


def _accumulation_stats(args: argparse.Namespace) -> int:
    from ue5m3.experiments import accumulation

    config = accumulation.AccumulationConfig(
        seed=args.seed,
        slice_width=args.slice_width,
        grid=args.grid,
        dots=args.dots,
        k=args.k,
        distributions=tuple(args.distributions),
        operands=tuple(args.operands),
        gain_rho=args.gain_rho,
        regression_examples=args.regression_examples,
        regression_features=args.regression_features,
        cancellation_trials=args.cancellation_trials,
        cancellation_partials=args.cancellation_partials,
        cancellation_scales=tuple(args.cancellation_scales),
        sigmas=tuple(args.sigmas),
        sweep_sigma=args.sweep_sigma,
        sweep_scale=args.sweep_scale,
        sweep_grids=tuple(args.sweep_grids),
    )
    paths = accumulation.run(config, args.out_dir)
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


def _summarize_training(args: argparse.Namespace) -> int:
    from ue5m3.experiments import training_summary as summary

    paths = summary.run(args.runs, args.out_dir, window_points=args.final_window, smoothing=args.smoothing)
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


def _formats(args: argparse.Namespace) -> int:
    from ue5m3.numerics import formats

    names = args.names or sorted(formats.FORMATS)
    print(f"{'format':<18}{'bits':>5}{'max finite':>16}{'min normal':>14}{'min subnormal':>15}{'pos. codes':>11}")
    for name in names:
        f = formats.get(name)
        sub = "-" if f.min_subnormal is None else f"{f.min_subnormal:.4g}"
        print(
            f"{f.name:<18}{f.bits:>5}{f.max_finite:>16.6g}{f.min_normal:>14.4g}{sub:>15}{f.positive_finite_count:>11}"
        )
    return 0


def add_verbs(sub: argparse._SubParsersAction, verbs: dict[str, Callable[[argparse.Namespace], int]]) -> None:
    p = sub.add_parser(
        "range-analysis",
        help="format facts, codebooks, stale-growth headroom and the worked scale-placement example",
        description="Write formats.csv, codebooks.csv, headroom.csv, worked_example.csv, summary.json and "
        "provenance.json (paper sections 4 and 5.2).",
    )
    p.add_argument(
        "--targets",
        type=argtypes.positive_float,
        nargs="+",
        default=[256, 448, 1024, 2048, 4096],
        help="tensor-scale targets T for the headroom table",
    )
    p.add_argument(
        "--example-reference",
        type=argtypes.positive_float,
        default=100.0,
        help="tensor reference amax g of the worked example",
    )
    p.add_argument(
        "--example-targets",
        type=argtypes.positive_float,
        nargs="+",
        default=[448, 2048],
        help="targets T of the worked example",
    )
    p.add_argument("--out-dir", required=True, help="directory for the tables")
    verbs["range-analysis"] = _range_analysis

    p = sub.add_parser(
        "accumulation-stats",
        help="RTZ bias, regression gradients, near cancellation and the final grid of FP32 accumulation",
        description="Write rtz_bias.csv, regression.csv, cancellation.csv, grid_sweep.csv and provenance.json "
        "(paper appendix C; gemm spec section 4). Defaults: the paper's settings at CPU scale (1,024 dot products).",
    )
    p.add_argument("--seed", type=int, default=20260721, help="seed of every random draw")
    p.add_argument("--slice-width", type=int, default=64, help="K-slice width rounded once to FP32")
    p.add_argument("--grid", type=int, default=1024, help="lattice denominator d of the gridded variants (1/d)")
    p.add_argument("--dots", type=int, default=1024, help="dot products per RTZ-bias cell")
    p.add_argument("--k", type=int, default=4096, help="length K of the RTZ-bias dot products")
    p.add_argument(
        "--distributions",
        nargs="+",
        default=["gaussian", "gaussian_sigma32", "laplace", "student_t3", "contaminated_gaussian_1pct"],
        help="operand distributions of the RTZ-bias experiment",
    )
    p.add_argument(
        "--operands",
        nargs="+",
        default=["bf16", "nvfp4", "nvfp4_dequantized"],
        help="operand formats: bf16, nvfp4 (encoded values, as the GEMM sees them), nvfp4_dequantized",
    )
    p.add_argument("--gain-rho", type=float, default=0.25, help="operand correlation of the gain-error measurement")
    p.add_argument("--regression-examples", type=int, default=2048, help="batch size of the regression probe")
    p.add_argument("--regression-features", type=int, default=2048, help="features of the regression probe")
    p.add_argument("--cancellation-trials", type=int, default=4096, help="trials of the near-cancellation runs")
    p.add_argument("--cancellation-partials", type=int, default=64, help="partials per trial (even)")
    p.add_argument(
        "--cancellation-scales",
        type=argtypes.positive_float,
        nargs="+",
        default=[1.0, 32.0],
        help="scales of the partials",
    )
    p.add_argument(
        "--sigmas",
        type=float,
        nargs="+",
        default=[0.0, 2**-13, 2**-12, 2**-11, 2**-10, 2**-9],
        help="standard deviations of the residual added to the last partial",
    )
    p.add_argument(
        "--sweep-sigma", type=argtypes.positive_float, default=2**-12, help="residual sigma of the grid sweep"
    )
    p.add_argument("--sweep-scale", type=argtypes.positive_float, default=1.0, help="partial scale of the grid sweep")
    p.add_argument(
        "--sweep-grids",
        type=int,
        nargs="+",
        default=[256, 512, 1024, 2048, 4096],
        help="grid denominators of the sweep (the unsnapped output is always included)",
    )
    p.add_argument("--out-dir", required=True, help="directory for the tables")
    verbs["accumulation-stats"] = _accumulation_stats

    p = sub.add_parser(
        "summarize-training",
        help="final-window means, stability counters and seed spread",
        description="Read the metrics of finished runs and write curves and summary tables.",
    )
    p.add_argument("--runs", nargs="+", required=True, help="run directories (each with final.json)")
    p.add_argument("--out-dir", required=True, help="directory for the tables")
    p.add_argument("--final-window", type=int, default=10, help="logged points in the final window (paper: 10)")
    p.add_argument("--smoothing", type=int, default=250, help="moving-mean window in optimizer steps (paper: 250)")
    verbs["summarize-training"] = _summarize_training

    p = sub.add_parser(
        "formats",
        help="print the facts of the known number formats",
        description="Print max finite, min normal, min subnormal and positive finite codes.",
    )
    p.add_argument("names", nargs="*", help="format names (default: all)")
    verbs["formats"] = _formats
