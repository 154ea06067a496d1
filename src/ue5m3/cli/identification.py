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
    from ue5m3.identify.run import ProbesConfig, write_corpus

    cfg = argtypes.load_stage_config(ProbesConfig, args.config)
    print(f"corpus: {write_corpus(cfg, args.out, witness_run=args.witness_run)}")
    return 0


def _record_oracle(args: argparse.Namespace) -> int:
    from ue5m3.identify import Corpus, make_oracle, record
    from ue5m3.identify.oracles import OracleConfig

    cfg = argtypes.load_stage_config(OracleConfig, args.config)
    corpus = Corpus.load(args.corpus)
    print(f"recorded: {record(make_oracle(cfg.oracle, corpus_path=args.corpus), corpus, args.corpus, args.out)}")
    return 0


def _fit_emulator(args: argparse.Namespace) -> int:
    from ue5m3.identify.candidates import CandidateGrid
    from ue5m3.identify.run import fit_emulator

    candidates = argtypes.load_stage_config(CandidateGrid, args.config)
    oracle = args.oracle if args.labels is None else f"recorded:{args.labels}"
    paths = fit_emulator(args.corpus, oracle, args.out, candidates=candidates)
    summary = json.loads(paths["summary.json"].read_text())
    print(f"identified: {summary['identified'] or 'none'}; best: {summary['best']}")
    return argtypes.print_paths(paths)


def _parity(args: argparse.Namespace) -> int:
    from ue5m3.identify import parity
    from ue5m3.training.config import TrainConfig

    settings = argtypes.load_stage_config(parity.ParityConfig, args.config)
    report = parity.run(TrainConfig.from_yaml(args.run_config), settings)
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
    argtypes.add_config_option(p, "ue5m3.identify.run.ProbesConfig: corpus and witness")
    p.add_argument(
        "--witness-run",
        default=None,
        help="training run directory whose checkpoint gives the witnesses (with the config's 'witness')",
    )
    p.add_argument("--out", required=True, help="the corpus file to write (.safetensors)")
    verbs["make-probes"] = _make_probes

    p = sub.add_parser(
        "record-oracle",
        help="save an oracle's outputs on a probe corpus (on the oracle's hardware)",
        description="Run an oracle (emulator:<candidate>, hopper_fp8[:fast], native_te_nvfp4) on every probe and save "
        "its FP32 outputs with the corpus SHA-256, for 'ue5m3 fit-emulator --oracle recorded:<file>' anywhere.",
    )
    argtypes.add_config_option(p, "ue5m3.identify.oracles.OracleConfig: the oracle", required=True)
    p.add_argument("--corpus", required=True, help="a corpus from 'ue5m3 make-probes'")
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
    argtypes.add_config_option(p, "ue5m3.identify.candidates.CandidateGrid: the candidates")
    p.add_argument("--corpus", required=True, help="a corpus from 'ue5m3 make-probes'")
    oracle = p.add_mutually_exclusive_group(required=True)
    oracle.add_argument("--oracle", help="oracle spec (emulator:<candidate>, hopper_fp8[:fast], native_te_nvfp4)")
    oracle.add_argument("--labels", help="an oracle's outputs saved by 'ue5m3 record-oracle' (recorded:<file>)")
    p.add_argument("--out", required=True, help="output directory")
    verbs["fit-emulator"] = _fit_emulator

    p = sub.add_parser(
        "parity",
        help="train one model under two GEMM backends and compare everything bit for bit",
        description="One forward/backward and --steps AdamW steps of the run's model under backends A and B "
        "(emulated[:<gemm model>[:torch]] or native_te); writes a JSON report: elements compared, bitwise-equal "
        "counts, relative L2, max abs and ULP differences of logits, loss, gradients, parameters and optimizer states.",
    )
    argtypes.add_config_option(p, "ue5m3.identify.parity.ParityConfig: backend_a and backend_b at least", required=True)
    p.add_argument("--run-config", required=True, help="a training config YAML (model, recipe, seed, data)")
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
