"""The data and training verbs: prepare the corpus and shards, validate a run config, train."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ue5m3.cli import argtypes

__all__ = ["add_verbs"]


def _prepare_data(args: argparse.Namespace) -> int:
    from ue5m3 import data
    from ue5m3.artifacts import provenance, write_json

    config = argtypes.load_stage_config(data.DataConfig, args.config)
    seconds = data.build_data(config)
    opened = data.open_data(config)
    record = provenance(
        "prepare-data",
        config.to_dict(),
        seconds=seconds,
        validation_sha256=opened.validation.sha256(),
        calibration_sha256=opened.calibration.sha256(),
    )
    write_json(args.out, record)
    print(f"data prepared under {config.data_dir} in {sum(seconds.values()):.1f} s; record: {args.out}")
    return 0


def _train_config(args: argparse.Namespace) -> int:
    import yaml

    from ue5m3.artifacts import atomic_path
    from ue5m3.training.config import TrainConfig

    cfg = argtypes.load_stage_config(TrainConfig, args.config)  # every key validated before anything is written
    with atomic_path(args.out) as tmp:
        tmp.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=True))
    print(f"train config: {args.out}")
    return 0


def _train(args: argparse.Namespace) -> int:
    from ue5m3.training import loop as train

    return train.main(args.config, threads=args.threads, restart_on_change=args.restart_on_change)


def add_verbs(sub: argparse._SubParsersAction, verbs: dict[str, Callable[[argparse.Namespace], int]]) -> None:
    p = sub.add_parser(
        "prepare-data",
        help="corpus, tokenizer and token shards of the data section",
        description="Prepare the corpus splits, train the BPE (unless data.tokenizer_path is set), tokenize every "
        "split into memory-mapped shards and write a provenance record.",
    )
    argtypes.add_config_option(p, "ue5m3.data.DataConfig", required=True)
    p.add_argument("--out", required=True, help="the provenance record to write (JSON)")
    verbs["prepare-data"] = _prepare_data

    p = sub.add_parser(
        "train-config",
        help="validate a training run's settings and write its config YAML",
        description="Validate a JSON object against the training config (unknown or missing keys fail) and write "
        "it as the YAML that `ue5m3 train --config` reads.",
    )
    argtypes.add_config_option(p, "ue5m3.training.config.TrainConfig", required=True)
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
    p.add_argument(
        "--restart-on-change",
        action="store_true",
        help="if the run directory holds another run's checkpoints (its settings changed), move it aside to "
        "<run_dir>.superseded-<fingerprint> and start afresh (the pipeline's choice); without it such a run is "
        "refused, naming what differs",
    )
    verbs["train"] = _train
