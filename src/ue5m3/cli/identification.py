"""The identification verbs of the ``ue5m3`` command line (gemm spec sections 3-4), each a thin library call:

* ``make-probes``: a probe corpus (witnesses mined from a run's checkpoint when given);
* ``record-oracle``: an oracle's outputs on a corpus, saved for offline fits (run it on the GPU node);
* ``fit-emulator``: the candidate grid matched against an oracle, with the paper's tables;
* ``parity``: two GEMM backends trained side by side, compared bit for bit;
* ``grid-control``: the tiny grid-regression control.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from ue5m3.cli import argtypes

__all__ = ["add_verbs"]


def _make_probes(args: argparse.Namespace) -> int:
    from ue5m3.identify.probes import CorpusConfig
    from ue5m3.identify.run import write_corpus

    path = write_corpus(
        argtypes.load_stage_config(CorpusConfig, args.config),
        args.out,
        witness_run=args.witness_run,
        witness_module=args.witness_module,
        witness_step=args.witness_step,
        witness_sequences=args.witness_sequences,
    )
    print(f"corpus: {path}")
    return 0


def _record_oracle(args: argparse.Namespace) -> int:
    from ue5m3.identify import Corpus, make_oracle, record

    corpus = Corpus.load(args.corpus)
    print(f"recorded: {record(make_oracle(args.oracle, corpus_path=args.corpus), corpus, args.corpus, args.out)}")
    return 0


def _fit_emulator(args: argparse.Namespace) -> int:
    from ue5m3.identify.run import fit_emulator

    candidates = {
        "slice_widths": args.slice_widths,
        "partial_bits": args.partial_bits,
        "roundings": args.roundings,
        "promotions": args.promotions,
        "final_grids": args.final_grids,
        "extra": args.extra,
    }
    paths = fit_emulator(args.corpus, args.oracle, args.out, candidates=candidates)
    summary = json.loads(paths["summary.json"].read_text())
    print(f"identified: {summary['identified'] or 'none'}; best: {summary['best']}")
    return argtypes.print_paths(paths)


def _parity(args: argparse.Namespace) -> int:
    from ue5m3.identify import parity
    from ue5m3.training.config import TrainConfig

    cfg = TrainConfig.from_yaml(args.config)
    report = parity.run(cfg, args.backend_a, args.backend_b, steps=args.steps, batch_size=args.batch_size)
    parity.write_report(report, args.out)
    print(f"bitwise equal: {report.bitwise_equal}; report: {args.out}")
    return 0


def _grid_control(args: argparse.Namespace) -> int:
    from ue5m3.identify import grid_control

    cfg = argtypes.load_stage_config(grid_control.GridControlConfig, args.config)
    paths = grid_control.write(grid_control.run(cfg), args.out_dir)
    return argtypes.print_paths(paths)


def add_verbs(sub: argparse._SubParsersAction, verbs: dict[str, Callable[[argparse.Namespace], int]]) -> None:
    """Register the identification verbs on the main parser's subcommands."""
    p = sub.add_parser(
        "make-probes",
        help="probe corpus for emulator identification (order, threshold, broad, witness probes)",
        description="Generate the probe families under one seed (CorpusConfig fields as JSON) and save them as one "
        "safetensors file with provenance; --witness-run mines witnesses from a linear of a trained run.",
    )
    argtypes.add_config_option(p, "ue5m3.identify.probes.CorpusConfig")
    p.add_argument("--witness-run", default=None, help="training run directory whose checkpoint gives the witnesses")
    p.add_argument("--witness-module", default=None, help="name of the linear whose forward GEMM is mined")
    p.add_argument("--witness-step", type=int, default=None, help="checkpoint step (default: the newest)")
    p.add_argument("--witness-sequences", type=int, default=8, help="validation windows fed through the model")
    p.add_argument("--out", required=True, help="the corpus file to write (.safetensors)")
    verbs["make-probes"] = _make_probes

    p = sub.add_parser(
        "record-oracle",
        help="save an oracle's outputs on a probe corpus (on the oracle's hardware)",
        description="Run an oracle (emulator:<candidate>, hopper_fp8[:fast], native_te_nvfp4) on every probe and save "
        "its FP32 outputs with the corpus SHA-256, for 'ue5m3 fit-emulator --oracle recorded:<file>' anywhere.",
    )
    p.add_argument("--corpus", required=True, help="a corpus from 'ue5m3 make-probes'")
    p.add_argument("--oracle", required=True, help="oracle spec")
    p.add_argument("--out", required=True, help="the recording to write (.safetensors)")
    verbs["record-oracle"] = _record_oracle

    p = sub.add_parser(
        "fit-emulator",
        help="match candidate GEMM output models against an oracle; write the paper's tables",
        description="Evaluate every candidate (slice width x partial-sum precision x rounding x promotion x final "
        "grid, plus extras) on every probe cell and write matches.csv, tables.csv and summary.json. Oracles: "
        "emulator:<candidate> (synthetic, hidden parameters), recorded:<file>, hopper_fp8[:fast] (H100/H200), "
        "native_te_nvfp4 (Blackwell + Transformer Engine).",
    )
    p.add_argument("--corpus", required=True, help="a corpus from 'ue5m3 make-probes'")
    p.add_argument("--oracle", required=True, help="oracle spec")
    p.add_argument("--slice-widths", type=argtypes.none_or_int, nargs="+", default=[16, 32, 64, 128, 256])
    p.add_argument(
        "--partial-bits", type=argtypes.none_or_int, nargs="+", default=[None], help="'exact' or fused truncation bits"
    )
    p.add_argument("--roundings", nargs="+", default=["rne", "rtz"], choices=["rne", "rtz"])
    p.add_argument("--promotions", type=argtypes.none_or_int, nargs="+", default=[None], help="'none' or K intervals")
    p.add_argument("--final-grids", type=argtypes.none_or_int, nargs="+", default=[None, 256, 512, 1024, 2048, 4096])
    p.add_argument("--extra", nargs="*", default=["w64-fused35-rtz"], help="further candidates by name")
    p.add_argument("--out", required=True, help="output directory")
    verbs["fit-emulator"] = _fit_emulator

    p = sub.add_parser(
        "parity",
        help="train one model under two GEMM backends and compare everything bit for bit",
        description="One forward/backward and --steps AdamW steps of the run's model under backends A and B "
        "(emulated[:<gemm model>[:torch]] or native_te); writes a JSON report: elements compared, bitwise-equal "
        "counts, relative L2, max abs and ULP differences of logits, loss, gradients, parameters and optimizer states.",
    )
    p.add_argument("--config", required=True, help="a training config YAML (model, recipe, seed, data)")
    p.add_argument("--backend-a", required=True, help="e.g. emulated:probe_matched")
    p.add_argument("--backend-b", required=True, help="e.g. emulated:probe_matched:torch or native_te")
    p.add_argument("--steps", type=int, default=3, help="AdamW steps after the first forward/backward")
    p.add_argument("--batch-size", type=int, default=None, help="sequences per step (default: the config's)")
    p.add_argument("--out", required=True, help="the JSON report")
    verbs["parity"] = _parity

    p = sub.add_parser(
        "grid-control",
        help="tiny teacher-student regression under six final grids and two roundings (paper appendix C)",
        description="Train the 256-256-64 SiLU MLP per seed in BF16 and UE5M3 B16 with probe-matched GEMMs under "
        "each final grid; write runs.csv, curves.csv and summary.json (bit-identity across grids, mean eval MSE).",
    )
    argtypes.add_config_option(p, "ue5m3.identify.grid_control.GridControlConfig")
    p.add_argument("--out-dir", required=True, help="output directory")
    verbs["grid-control"] = _grid_control
