"""The analysis verbs: range analysis, accumulation statistics, throughput, training summaries, format facts, the
plan and the scale ladder."""

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


def _render_report_item(args: argparse.Namespace) -> int:
    from ue5m3 import report

    if len(args.items) % 2:
        raise SystemExit(f"render-report-item: expected SOURCE OUT pairs, got an odd count {len(args.items)}")
    pairs = list(zip(args.items[::2], args.items[1::2], strict=True))
    return argtypes.print_paths({source: report.render(source, out) for source, out in pairs})


def _throughput(args: argparse.Namespace) -> int:
    from ue5m3.experiments import throughput

    cfg = argtypes.load_stage_config(throughput.ThroughputConfig, args.config)
    return argtypes.print_paths(throughput.run(cfg, args.out_dir))


def _summarize_training(args: argparse.Namespace) -> int:
    from ue5m3.experiments import training_summary as summary

    cfg = argtypes.load_stage_config(summary.SummaryConfig, args.config)
    return argtypes.print_paths(summary.run(args.runs, args.out_dir, cfg))


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


def _conformance(args: argparse.Namespace) -> int:
    from ue5m3.conformance import run as conformance

    cfg = argtypes.load_stage_config(conformance.ConformanceConfig, args.config)
    return argtypes.print_paths(conformance.run(cfg, args.out_dir))


def _plan(args: argparse.Namespace) -> int:
    from ue5m3.plan import run as plan

    cfg = argtypes.load_stage_config(plan.PlanConfig, args.config)
    return argtypes.print_paths(plan.run(cfg, args.out_dir))


def _ladder(args: argparse.Namespace) -> int:
    from ue5m3.cli import rungs

    window = {k: v for k, v in (("points", args.points), ("tokens_per_point", args.tokens_per_point)) if v is not None}
    text = rungs.write(args.write, args.curves, **window)
    if args.write:
        return argtypes.print_paths({"ladder": args.write})
    print(text, end="")
    return 0


def _format_study(args: argparse.Namespace) -> int:
    from ue5m3.experiments import format_study

    cfg = argtypes.load_stage_config(format_study.FormatStudyConfig, args.config)
    return argtypes.print_paths(format_study.run(cfg, args.out_dir, args.runs, args.final_window))


def add_verbs(sub: argparse._SubParsersAction, verbs: dict[str, Callable[[argparse.Namespace], int]]) -> None:
    p = sub.add_parser(
        "plan",
        help="every GPU job of the pipeline against the GPUs its partition may hold: memory, collectives, budget",
        description="Write plan.csv (per job and GPU type: the per-rank memory terms counted on the meta device, "
        "whether they fit, the collectives per step, the step time, the jobs and retries the run needs) and "
        "plan.json (its provenance). Nothing runs on a GPU; an 8B recipe plans in about a minute.",
    )
    argtypes.add_config_option(p, "ue5m3.plan.run.PlanConfig")
    p.add_argument("--out-dir", required=True, help="directory for the plan")
    verbs["plan"] = _plan

    p = sub.add_parser(
        "ladder",
        help="the scale ladder: per claim the paired seeds its paper-sized effect needs, per rung the claims decided",
        description="Size each claim of the claims table by the paired spread of final-window losses over seeds "
        "(exact paired-t power, alpha 0.05, 80% power), load each rung's config (config/study_cpu.yaml, "
        "config/study_gpu_day.yaml, config/study_node_day.yaml, config/paper.yaml) merged over config/config.yaml "
        "and checked whole, cost its training runs with the plan's estimate, and print the ladder's tables or write "
        "them into a Markdown file's ladder section (docs/experiments.md). The configs are read from the checkout the "
        "package runs from.",
    )
    p.add_argument(
        "--curves",
        help="a training summary's curves.csv to take the spread from (default: the shipped CPU runs' final windows)",
    )
    p.add_argument(
        "--points",
        type=int,
        help="logged points of the final window the spread is measured over (default: the CPU windows' 10)",
    )
    p.add_argument(
        "--tokens-per-point", type=int, help="tokens behind one logged loss (default: the CPU runs' 8 x 128)"
    )
    p.add_argument("--write", help="a Markdown file whose ladder section (between its markers) is replaced")
    verbs["ladder"] = _ladder

    p = sub.add_parser(
        "conformance",
        help="the FP4 conformance matrix: every installed peer implementation against this one on one corpus",
        description="Write conformance.csv (one judged cell per operation and peer), conformance.json (the peers' "
        "versions, the corpus's SHA-256, the known differences) and counterexamples/*.pt (beyond the paper; "
        "peers: pip install 'ue5m3[conformance]').",
    )
    argtypes.add_config_option(p, "ue5m3.conformance.run.ConformanceConfig")
    p.add_argument("--out-dir", required=True, help="directory for the matrix")
    verbs["conformance"] = _conformance

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
        "throughput",
        help="model-body tokens/s of the FP4 recipes against BF16 (native TE on Blackwell, or emulated)",
        description="Time synchronised forward + backward steps of the model body (blocks and final norm; no "
        "data, embedding, head, optimizer or communication) for the BF16 baseline and each recipe; write "
        "throughput.csv and provenance.json (paper table 10). Defaults: the paper's protocol, native on one "
        "Blackwell GPU; a native run fails closed (exit 3, nothing written) without Transformer Engine, CUDA or "
        "compute capability 10.0.",
    )
    argtypes.add_config_option(p, "ue5m3.experiments.throughput.ThroughputConfig")
    p.add_argument("--out-dir", required=True, help="directory for the table")
    verbs["throughput"] = _throughput

    p = sub.add_parser(
        "format-study",
        help="the block-scale format study: each trained recipe paired with the reference arm and BF16, telemetry",
        description="Write study.csv (per recipe: its numerics, how it differs from the reference arm, its paired "
        "final-window loss effect against the reference and against BF16 with 95%% t intervals, the MDE and a "
        "verdict, its scale telemetry totals), telemetry.csv (per recipe, logged step and operand role), "
        "run_telemetry.csv, warnings.csv (the early warning per run) and provenance.json (beyond the paper).",
    )
    argtypes.add_config_option(p, "ue5m3.experiments.format_study.FormatStudyConfig")
    p.add_argument("--runs", nargs="+", required=True, help="run directories (each with final.json)")
    p.add_argument("--final-window", required=True, help="the training summary's final_window.csv of those runs")
    p.add_argument("--out-dir", required=True, help="directory for the tables")
    verbs["format-study"] = _format_study

    p = sub.add_parser(
        "summarize-training",
        help="final-window means, stability counters and seed spread",
        description="Read the metrics of finished runs and write curves and summary tables.",
    )
    argtypes.add_config_option(p, "ue5m3.experiments.training_summary.SummaryConfig")
    p.add_argument("--runs", nargs="+", required=True, help="run directories (each with final.json)")
    p.add_argument("--out-dir", required=True, help="directory for the tables")
    verbs["summarize-training"] = _summarize_training

    p = sub.add_parser(
        "render-report-item",
        help="a figure PDF as PNG, or a CSV table as HTML, for the Snakemake report",
        description=(
            "Render a figure PDF (its first page, as PNG) or a CSV table (as an HTML table) so that the report "
            "page shows it inline; the figure notebooks write these views themselves (ue5m3.plotting)."
        ),
    )
    p.add_argument(
        "items",
        nargs="+",
        metavar="SOURCE OUT",
        help="pairs: a figure (.pdf) and the PNG to write, or a table (.csv) and the HTML file to write",
    )
    verbs["render-report-item"] = _render_report_item

    p = sub.add_parser(
        "formats",
        help="print the facts of the known number formats",
        description="Print max finite, min normal, min subnormal and positive finite codes.",
    )
    p.add_argument("names", nargs="*", help="format names (default: all)")
    verbs["formats"] = _formats
