"""The ``ue5m3`` command line: one verb per pipeline step, each a thin call into the library.

Every verb parses its arguments into a config, makes one library call and writes its declared outputs
atomically together with a provenance record. Run ``ue5m3 <verb> --help`` for each verb's options.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

__all__ = ["main", "build_parser"]


def _range_analysis(args: argparse.Namespace) -> int:
    from . import range_analysis

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
    from . import accumulation

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


def _json_arg(text: str) -> dict:
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON ({err}): {text[:80]!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {type(value).__name__}")
    return value


def _prepare_data(args: argparse.Namespace) -> int:
    from . import data
    from .artifacts import provenance, write_json

    config = data.DataConfig.from_dict(args.config_json)
    seconds = data.build_data(config)
    opened = data.open_data(config)
    record = provenance(
        "prepare-data",
        args.config_json,
        seconds=seconds,
        validation_sha256=opened.validation.sha256(),
        calibration_sha256=opened.calibration.sha256(),
    )
    write_json(args.out, record)
    print(f"data prepared under {config.data_dir} in {sum(seconds.values()):.1f} s; record: {args.out}")
    return 0


def _train_config(args: argparse.Namespace) -> int:
    import yaml

    from .artifacts import atomic_path
    from .train import TrainConfig

    cfg = TrainConfig(**args.json)  # validates every key before anything is written
    with atomic_path(args.out) as tmp:
        tmp.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=True))
    print(f"train config: {args.out}")
    return 0


def _train(args: argparse.Namespace) -> int:
    from . import train

    return train.main(args.config, threads=args.threads)


def _summarize_training(args: argparse.Namespace) -> int:
    from . import summary

    paths = summary.run(args.runs, args.out_dir, window_points=args.final_window, smoothing=args.smoothing)
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


def _formats(args: argparse.Namespace) -> int:
    from . import formats

    names = args.names or sorted(formats.FORMATS)
    print(f"{'format':<18}{'bits':>5}{'max finite':>16}{'min normal':>14}{'min subnormal':>15}{'pos. codes':>11}")
    for name in names:
        f = formats.get(name)
        sub = "-" if f.min_subnormal is None else f"{f.min_subnormal:.4g}"
        print(
            f"{f.name:<18}{f.bits:>5}{f.max_finite:>16.6g}{f.min_normal:>14.4g}{sub:>15}{f.positive_finite_count:>11}"
        )
    return 0


def _evaluate_nll(args: argparse.Namespace) -> int:
    from . import evaluate

    record = evaluate.run_nll(
        args.run_dir,
        args.out,
        policy=args.policy,
        step=args.step,
        orders=args.orders,
        seed=args.seed,
        bootstrap_samples=args.bootstrap_samples,
        force_bf16=args.force_bf16,
    )
    print(f"NLL {record['nll']:.6f} over {record['tokens']} tokens ({record['policy']}): {args.out}")
    return 0


def _scale_snapshot(args: argparse.Namespace) -> int:
    from . import snapshot

    paths = snapshot.run_snapshot(args.run_dir, args.out_dir, step=args.step, modules=args.modules)
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


def _lm_eval(args: argparse.Namespace) -> int:
    from lm_eval.__main__ import cli_evaluate

    from . import lm_eval_adapter  # noqa: F401  # registers --model ue5m3

    saved = sys.argv
    sys.argv = ["lm-eval", *args.lm_eval_args]
    try:
        cli_evaluate()
    finally:
        sys.argv = saved
    return 0


def _evaluate_downstream(args: argparse.Namespace) -> int:
    from . import olmes

    record = olmes.evaluate_run(
        args.run_dir,
        args.out,
        policy=args.policy,
        task_dir=args.tasks_dir,
        tasks=args.tasks,
        step=args.step,
        n=args.examples,
        limit=args.limit,
        batch_size=args.batch_size,
        max_length=args.max_length,
    )
    mmlu = record["aggregates"]["mmlu"]["best"]
    core = record["aggregates"]["core9_evaluated"]["macro"]
    pro = record["aggregates"].get("mmlu_pro_mc")
    extra = "" if pro is None else f", MMLU-Pro MC {pro}"
    print(f"Core 9 (evaluated tasks) {core}, MMLU {mmlu}{extra} in {record['work_units']} work units: {args.out}")
    return 0


def _optional_count(text: str) -> int | None:
    if text.lower() in ("none", "null", "all"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'all', got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'all', got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ue5m3", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    verbs: dict[str, Callable[[argparse.Namespace], int]] = {}

    p = sub.add_parser(
        "range-analysis",
        help="format facts, codebooks, stale-growth headroom and the worked scale-placement example",
        description="Write formats.csv, codebooks.csv, headroom.csv, worked_example.csv, summary.json and "
        "provenance.json (paper sections 4 and 5.2).",
    )
    p.add_argument(
        "--targets",
        type=_positive_float,
        nargs="+",
        default=[256, 448, 1024, 2048, 4096],
        help="tensor-scale targets T for the headroom table",
    )
    p.add_argument(
        "--example-reference", type=_positive_float, default=100.0, help="tensor reference amax g of the worked example"
    )
    p.add_argument(
        "--example-targets",
        type=_positive_float,
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
        "--cancellation-scales", type=_positive_float, nargs="+", default=[1.0, 32.0], help="scales of the partials"
    )
    p.add_argument(
        "--sigmas",
        type=float,
        nargs="+",
        default=[0.0, 2**-13, 2**-12, 2**-11, 2**-10, 2**-9],
        help="standard deviations of the residual added to the last partial",
    )
    p.add_argument("--sweep-sigma", type=_positive_float, default=2**-12, help="residual sigma of the grid sweep")
    p.add_argument("--sweep-scale", type=_positive_float, default=1.0, help="partial scale of the grid sweep")
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
        "prepare-data",
        help="corpus, tokenizer and token shards of the data section",
        description="Prepare the corpus splits, train the BPE (unless data.tokenizer_path is set), tokenize every "
        "split into memory-mapped shards and write a provenance record.",
    )
    p.add_argument("--config-json", type=_json_arg, required=True, help="the data section as a JSON object")
    p.add_argument("--out", required=True, help="the provenance record to write (JSON)")
    verbs["prepare-data"] = _prepare_data

    p = sub.add_parser(
        "train-config",
        help="validate a training run's settings and write its config YAML",
        description="Validate a JSON object against the training config (unknown or missing keys fail) and write "
        "it as the YAML that `ue5m3 train --config` reads.",
    )
    p.add_argument("--json", type=_json_arg, required=True, help="the run's settings as a JSON object")
    p.add_argument("--out", required=True, help="the config YAML to write")
    verbs["train-config"] = _train_config

    p = sub.add_parser(
        "train",
        help="train (or resume) one run",
        description="Train one run from its config YAML, resuming from its newest checkpoint; under torchrun with "
        "several processes the model is sharded with FSDP2.",
    )
    p.add_argument("--config", required=True, help="the run's config YAML (see `ue5m3 train-config`)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    verbs["train"] = _train

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

    p = sub.add_parser(
        "evaluate-nll",
        help="validation NLL of a checkpoint under one inference policy",
        description="Reload a run's checkpoint, evaluate the validation NLL with the paper's protocol (batch 1, FP32 "
        "head in chunks, FP64 sums) and write a JSON result plus per-sequence sums, with bootstrap or "
        "evaluation-order intervals.",
    )
    p.add_argument("--run-dir", required=True, help="the training run directory")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest)")
    p.add_argument(
        "--policy",
        required=True,
        choices=["bf16", "current_tensor", "cold_d50_replay", "calibrated_frozen"],
        help="activation-reference policy (numerics spec section 4)",
    )
    p.add_argument("--orders", type=int, default=1, help="evaluation orders (cold_d50_replay only)")
    p.add_argument("--seed", type=int, default=0, help="seed of the extra orders and the bootstrap")
    p.add_argument("--bootstrap-samples", type=int, default=2000, help="sequence-bootstrap resamples")
    p.add_argument("--force-bf16", action="store_true", help="allow policy bf16 on a quantized run")
    p.add_argument("--out", required=True, help="the JSON result (per-sequence sums go next to it)")
    verbs["evaluate-nll"] = _evaluate_nll

    p = sub.add_parser(
        "scale-snapshot",
        help="wgrad dY^T block-scale placement at one checkpoint",
        description="One training-mode forward and backward of the first held-out sequence (no update); write "
        "counts.csv, histograms.csv and provenance.json (experiments spec section 7).",
    )
    p.add_argument("--run-dir", required=True, help="the training run directory")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest)")
    p.add_argument(
        "--modules", nargs="+", default=None, help="fnmatch patterns of linears (default: last 4 down projections)"
    )
    p.add_argument("--out-dir", required=True, help="directory for the tables")
    verbs["scale-snapshot"] = _scale_snapshot

    p = sub.add_parser(
        "evaluate-downstream",
        help="OLMES-style Core 9 / MMLU accuracy of a checkpoint under one inference policy (offline)",
        description="Build the offline lm-eval tasks if missing (ue5m3.olmes), score the checkpoint through "
        "--model ue5m3 in lm-eval's fixed request order (one batch = one work unit) and write a JSON result with "
        "per-task MC/RC scores, the paper's aggregates and provenance.",
    )
    p.add_argument("--run-dir", required=True, help="the training run directory")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest)")
    p.add_argument(
        "--policy",
        required=True,
        choices=["bf16", "current_tensor", "cold_d50_replay", "calibrated_frozen"],
        help="activation-reference policy (numerics spec section 4)",
    )
    p.add_argument("--tasks-dir", required=True, help="task dir shared by all runs (built here when missing)")
    p.add_argument(
        "--tasks",
        nargs="+",
        required=True,
        help="Core 9 tasks (arc_easy, ...), mmlu (all subjects), mmlu_SUBJECT, or mmlu_pro_mc (HF hub)",
    )
    p.add_argument(
        "--examples", type=_optional_count, default=None, help="examples per task subsampled into the task dir (or all)"
    )
    p.add_argument("--limit", type=int, default=None, help="lm-eval's per-task limit on top (tests)")
    p.add_argument("--batch-size", type=int, default=8, help="requests per forward (the policy's work unit)")
    p.add_argument("--max-length", type=int, default=None, help="tokens per row (default: the run's sequence length)")
    p.add_argument("--out", required=True, help="the JSON result")
    verbs["evaluate-downstream"] = _evaluate_downstream

    p = sub.add_parser(
        "lm-eval",
        help="lm-eval's own command line with --model ue5m3 registered",
        description="Run lm-eval's CLI (lm_eval.__main__.cli_evaluate) with every further argument, after "
        "registering --model ue5m3 (model_args run_dir=..,policy=..,tokenizer=..[,step=..]). Example: ue5m3 lm-eval "
        "--model ue5m3 --model_args run_dir=RUN,policy=bf16,tokenizer=TOK --include_path DIR --tasks NAME. "
        "lm-eval's own options: `ue5m3 lm-eval -- run --help`.",
    )
    p.set_defaults(lm_eval_args=[])
    verbs["lm-eval"] = _lm_eval

    from .cli_identify import add_verbs

    add_verbs(sub, verbs)  # make-probes, record-oracle, fit-emulator, parity, grid-control
    parser.set_defaults(_verbs=verbs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.verb == "lm-eval":
        args.lm_eval_args = rest[1:] if rest[:1] == ["--"] else rest  # `ue5m3 lm-eval -- --help`: lm-eval's help
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return args._verbs[args.verb](args)
    except (ValueError, TypeError, FileNotFoundError) as err:
        print(f"ue5m3 {args.verb}: error: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:  # hardware that is not here: fail closed with the reason, no traceback
        if type(err).__name__ not in ("OracleUnavailable", "NativeUnavailable"):
            raise
        print(f"ue5m3 {args.verb}: unavailable here: {err}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
