"""The analysis verbs: range analysis, accumulation statistics, training summaries and format facts."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ue5m3.cli import argtypes

__all__ = ["add_verbs"]


def _range_analysis(args: argparse.Namespace) -> int:
    from ue5m3.experiments import range_analysis

    cfg = argtypes.load_stage_config(range_analysis.RangeAnalysisConfig, args.config)
    return argtypes.print_paths(range_analysis.run(cfg, args.out_dir))


def _accumulation_stats(args: argparse.Namespace) -> int:
    from ue5m3.experiments import accumulation

    cfg = argtypes.load_stage_config(accumulation.AccumulationConfig, args.config)
    return argtypes.print_paths(accumulation.run(cfg, args.out_dir))


def _summarize_training(args: argparse.Namespace) -> int:
    from ue5m3.experiments import training_summary as summary

    return argtypes.print_paths(
        summary.run(args.runs, args.out_dir, window_points=args.final_window, smoothing=args.smoothing)
    )


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
    argtypes.add_config_option(p, "ue5m3.experiments.range_analysis.RangeAnalysisConfig")
    p.add_argument("--out-dir", required=True, help="directory for the tables")
    verbs["range-analysis"] = _range_analysis

    p = sub.add_parser(
        "accumulation-stats",
        help="RTZ bias, regression gradients, near cancellation and the final grid of FP32 accumulation",
        description="Write rtz_bias.csv, regression.csv, cancellation.csv, grid_sweep.csv and provenance.json "
        "(paper appendix C). Defaults: the paper's settings at CPU scale (1,024 dot products).",
    )
    argtypes.add_config_option(p, "ue5m3.experiments.accumulation.AccumulationConfig")
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
