"""The data and training verbs: prepare the corpus and shards, validate a run config, train."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable

from ue5m3.cli import argtypes

__all__ = ["add_verbs"]

logger = logging.getLogger(__name__)  # each record flushed: a part job's log shows what it reads as it reads it


def _prepared_record(command: str, config, seconds: dict[str, float], *, verify: bool, **extra) -> dict:
    from ue5m3 import data
    from ue5m3.artifacts import provenance

    opened = data.open_data(config, verify=verify)
    return provenance(
        command,
        config.to_dict(),
        seconds=seconds,
        validation_sha256=opened.validation.sha256(),
        calibration_sha256=opened.calibration.sha256(),
        **extra,
    )


def _prepare_data(args: argparse.Namespace) -> int:
    from ue5m3 import data
    from ue5m3.artifacts import write_json

    config = argtypes.load_stage_config(data.DataConfig, args.config)
    if args.part is not None:
        seconds = data.prepare_part(config, args.part, args.out, log=logger.info)
        print(f"part {args.part} of {config.prepare_parts} prepared in {sum(seconds.values()):.1f} s: {args.out}")
        return 0
    seconds = data.build_data(config, log=logger.info)
    write_json(args.out, _prepared_record("prepare-data", config, seconds, verify=True))
    print(f"data prepared under {config.data_dir} in {sum(seconds.values()):.1f} s; record: {args.out}")
    return 0


def _merge_data(args: argparse.Namespace) -> int:
    import time

    from ue5m3 import data
    from ue5m3.artifacts import write_json

    config = argtypes.load_stage_config(data.DataConfig, args.config)
    start = time.perf_counter()
    manifest = data.merge_parts(config, args.parts, log=logger.info)
    seconds = {"merge": time.perf_counter() - start}
    # Not re-hashed here (terabytes at paper scale): each part hashed its files as it wrote them and the merge
    # checked their sizes; training and evaluation verify every SHA-256 when they open the data.
    record = _prepared_record("merge-data", config, seconds, verify=False, parts=[str(p) for p in args.parts])
    write_json(args.out, record)
    print(f"{len(args.parts)} parts merged under {config.data_dir} ({manifest}); record: {args.out}")
    return 0


def _stage_data(args: argparse.Namespace) -> int:
    from ue5m3.artifacts import provenance, write_json
    from ue5m3.data import DataConfig
    from ue5m3.data.hub import hub_uris, stage_files

    data = argtypes.load_stage_config(DataConfig, args.config)
    uris = hub_uris(data)
    staged = stage_files(uris, args.staging_dir)
    write_json(args.record, provenance("stage-data", {"uris": uris, "staging_dir": args.staging_dir}, files=staged))
    count = sum(len(entry["files"]) for entry in staged.values())
    print(f"{count} files of {len(uris)} hub URIs staged under {args.staging_dir}; record: {args.record}")
    return 0


def _fetch_tokenizer(args: argparse.Namespace) -> int:
    from ue5m3.artifacts import provenance, write_json
    from ue5m3.data.hub import TokenizerSource, fetch_tokenizer

    source = argtypes.load_stage_config(TokenizerSource, args.config)
    fetched = fetch_tokenizer(source, args.out)
    write_json(args.record, provenance("fetch-tokenizer", {"tokenizer_source": vars(source)}, **fetched))
    check = "matches the pinned SHA-256" if fetched["verified"] else "unverified: pin it as tokenizer_source.sha256"
    print(f"{source.repo}@{source.revision}/{source.file} -> {args.out}: SHA-256 {fetched['sha256']} ({check})")
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
        help="corpus, tokenizer and token shards of the data section (or one part of them)",
        description="Prepare the corpus splits, train the BPE (unless data.tokenizer_path is set), tokenize every "
        "split into memory-mapped shards and write a provenance record. With --part I, prepare only part I of the "
        "data.prepare_parts parts of the input (a parallel job) and write its part manifest; 'ue5m3 merge-data' "
        "then joins the parts into the same bytes as one job.",
    )
    argtypes.add_config_option(p, "ue5m3.data.DataConfig", required=True)
    p.add_argument(
        "--part",
        type=argtypes.non_negative_int,
        default=None,
        help="prepare only this part, 0 .. data.prepare_parts - 1 (default: every part in turn, then the merge)",
    )
    p.add_argument("--out", required=True, help="the provenance record (JSON), or with --part the part manifest")
    verbs["prepare-data"] = _prepare_data

    p = sub.add_parser(
        "merge-data",
        help="join the parts of a split data preparation",
        description="Check that the part manifests are parts 0 .. data.prepare_parts - 1 of this data config, each "
        "once, with one tokenizer and input list; drop what a single job would drop across parts; move the corpus "
        "files and token shards into place (hard links) and write the indexes, the corpus manifest and a "
        "provenance record. A missing, repeated or foreign part is refused and nothing is written.",
    )
    argtypes.add_config_option(p, "ue5m3.data.DataConfig", required=True)
    p.add_argument("--out", required=True, help="the provenance record to write (JSON)")
    p.add_argument("parts", nargs="+", help="the part manifests written by 'ue5m3 prepare-data --part I'")
    verbs["merge-data"] = _merge_data

    p = sub.add_parser(
        "fetch-tokenizer",
        help="download a pinned tokenizer file from the Hugging Face hub and record its SHA-256",
        description="Download tokenizer_source.file of tokenizer_source.repo at commit tokenizer_source.revision "
        "(huggingface_hub), check it against tokenizer_source.sha256 when given, write it atomically to --out (the "
        "config's data.tokenizer_path) and write a record of what was fetched. An unpinned revision, or a file "
        "whose SHA-256 differs from the pinned one, is refused and nothing is written.",
    )
    argtypes.add_config_option(p, "ue5m3.data.hub.TokenizerSource", required=True)
    p.add_argument("--out", required=True, help="where the tokenizer file goes (data.tokenizer_path)")
    p.add_argument("--record", required=True, help="the record to write (JSON: repository, commit, SHA-256, size)")
    verbs["fetch-tokenizer"] = _fetch_tokenizer

    p = sub.add_parser(
        "stage-data",
        help="download the files of the data config's pinned hf:// URIs into a local folder, with their SHA-256",
        description="Download every file that the data config's hf://datasets/<owner>/<name>@<commit>/<glob> URIs "
        "name (huggingface_hub, on a machine with internet: the login node) into --staging-dir, one folder per "
        "repository and commit, and write a record of each file's size and SHA-256. The preparation jobs then read "
        "the local copies. An unpinned URI, or one that matches no file, is refused before anything is recorded.",
    )
    argtypes.add_config_option(p, "ue5m3.data.DataConfig", required=True)
    p.add_argument("--staging-dir", required=True, help="the local folder (<data_dir>/hub)")
    p.add_argument("--record", required=True, help="the record to write (JSON)")
    verbs["stage-data"] = _stage_data

    p = sub.add_parser(
        "train-config",
        help="validate a training run's settings and write its config YAML",
        description="Validate a JSON object against the training config (unknown or missing keys fail) and write "
        "it as the YAML that 'ue5m3 train --config' reads.",
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
    p.add_argument("--config", required=True, help="the run's config YAML (see 'ue5m3 train-config')")
    p.add_argument(
        "--threads", type=argtypes.thread_count, default=None, help="torch CPU threads, 1 to 1024 (default: torch's)"
    )
    p.add_argument(
        "--restart-on-change",
        action="store_true",
        help="if the run directory holds another run's checkpoints (its settings changed), move it aside to "
        "<run_dir>.superseded-<fingerprint> and start afresh (the pipeline's choice); without it such a run is "
        "refused, naming what differs",
    )
    verbs["train"] = _train
