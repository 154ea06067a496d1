"""The data pipeline end to end: prepare the corpus, train (or load) the tokenizer, tokenize, open the loaders.

Layout under ``config.data_dir``::

    corpus/                          <stream>/<split>/unit_*.jsonl per input unit + manifest.json (SHA-256 of each)
    tokenizer.json                   the trained byte-level BPE (absent when data.tokenizer_path is given)
    tokens/<stream>/<split>/         unit_*_*.bin/.offsets.npy/.ids.txt shards + index.json
    parts/                           what each part of the preparation wrote (ue5m3.data.parts), linked from above

:func:`build_data` writes all of it, running the ``data.prepare_parts`` parts one after another and merging them
(a cluster runs the parts as parallel jobs instead: same bytes); :func:`open_data` reads it back as the training
loader and the two fixed evaluation sets, after checking that no document id sits in two splits of a stream.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ue5m3.data.config import DataConfig
from ue5m3.data.corpus import SPLITS, sha256_file, verify_manifest
from ue5m3.data.loader import EvalSet, PackedStream, build_eval_set, check_disjoint
from ue5m3.data.parts import merge_parts, part_manifest_path, prepare_part
from ue5m3.data.shards import INDEX, TokenShards
from ue5m3.data.tokenizer import TextTokenizer, load_tokenizer

__all__ = ["DataPaths", "OpenedData", "data_paths", "build_data", "check_prepared", "open_data", "open_tokenizer"]


@dataclass(frozen=True)
class DataPaths:
    """Where :func:`build_data` puts each artefact."""

    corpus: Path
    tokenizer: Path
    tokens: Path

    def shards(self, stream: str, split: str) -> Path:
        """The shard directory of one stream's split."""
        return self.tokens / stream / split


def data_paths(config: DataConfig) -> DataPaths:
    """The artefact paths of ``config`` (the tokenizer is ``data.tokenizer_path`` when that is set)."""
    root = Path(config.data_dir)
    tokenizer = Path(config.tokenizer_path) if config.tokenizer_path else root / "tokenizer.json"
    return DataPaths(corpus=root / "corpus", tokenizer=tokenizer, tokens=root / "tokens")


def open_tokenizer(config: DataConfig) -> TextTokenizer:
    """The tokenizer of ``config`` with its BOS/EOS tokens and vocabulary size checked."""
    return load_tokenizer(
        data_paths(config).tokenizer,
        bos_token=config.bos_token,
        eos_token=config.eos_token,
        vocab_size=config.vocab_size,
    )


def build_data(config: DataConfig, *, log: Callable[[str], None] | None = None) -> dict[str, float]:
    """Prepare every part of ``config.prepare_parts`` in turn (corpus, BPE unless a tokenizer file is given,
    token shards) and merge them into the prepared data.

    Args:
        config: the data section.
        log: progress messages (none by default).

    Returns:
        Seconds spent in each step (``prepare``, ``tokenizer``, ``tokenize`` summed over the parts, ``merge``).
    """
    log = log or (lambda message: None)
    seconds: dict[str, float] = {}
    manifests = []
    for part in range(config.prepare_parts):
        manifests.append(part_manifest_path(config, part))
        for step, spent in prepare_part(config, part, manifests[-1], log=log).items():
            seconds[step] = seconds.get(step, 0.0) + spent
    start = time.perf_counter()
    merge_parts(config, manifests, log=log)
    seconds["merge"] = time.perf_counter() - start
    return seconds


@dataclass(frozen=True)
class OpenedData:
    """The training loader of this rank and the fixed validation and calibration sets."""

    train: PackedStream
    validation: EvalSet
    calibration: EvalSet


def check_prepared(config: DataConfig) -> None:
    """The prepared data are this config's: every shard index records ``data.vocab_size`` and the SHA-256 of the
    tokenizer file the config names (``data.tokenizer_path``, else ``<data_dir>/tokenizer.json``). Cheap (the
    indexes and one hash of the tokenizer): a run checks it before anything else reads its data.

    Raises:
        FileNotFoundError: a shard index, or the tokenizer file, is gone (naming it).
        ValueError: an index records another vocabulary, or the tokenizer file is not the one the shards were
            tokenized with (edited or replaced), naming the file, the setting and the fix.
    """
    paths = data_paths(config)
    redo = "or prepare the data again for this config (`ue5m3 prepare-data`, then `ue5m3 merge-data`)"
    recorded: dict[str, Path] = {}
    for stream in config.stream_names:
        for split in SPLITS:
            shards = TokenShards(paths.shards(stream, split))
            index_path = shards.root / INDEX
            if shards.index["vocab_size"] != config.vocab_size:
                raise ValueError(
                    f"{index_path}: the token shards were prepared with vocab_size {shards.index['vocab_size']}, "
                    f"but data.vocab_size is {config.vocab_size}; set data.vocab_size (and the model's vocabulary) "
                    f"to {shards.index['vocab_size']}, {redo}"
                )
            recorded.setdefault(shards.index["tokenizer_sha256"], index_path)
    if not paths.tokenizer.is_file():
        raise FileNotFoundError(
            f"{paths.tokenizer}: the tokenizer the token shards were prepared with is gone; restore it, {redo}"
        )
    current = sha256_file(paths.tokenizer)
    for sha, index_path in recorded.items():
        if sha != current:
            raise ValueError(
                f"{paths.tokenizer} is not the tokenizer the token shards were prepared with (its SHA-256 is "
                f"{current[:16]}..., {index_path} records {sha[:16]}...): it was edited or replaced; restore it, "
                f"{redo}"
            )


def open_data(config: DataConfig, *, rank: int = 0, world_size: int = 1, verify: bool = True) -> OpenedData:
    """Open the token shards written by :func:`build_data`.

    Args:
        config: the data section.
        rank, world_size: this process's slice of every global training batch.
        verify: re-check the corpus manifest and every shard's SHA-256 first (milliseconds at CPU scale; it
            reads every token once, so pass False for terabyte-scale shards that were verified after building).

    Raises:
        ValueError: a document id in two splits of a stream, a modified file, held-out splits too small, or data
            prepared with another vocabulary or tokenizer (:func:`check_prepared`).
    """
    paths = data_paths(config)
    check_prepared(config)
    if verify:
        verify_manifest(paths.corpus)
    shards = {(s, split): TokenShards(paths.shards(s, split)) for s in config.stream_names for split in SPLITS}
    for stream in config.stream_names:
        if verify:
            for split in SPLITS:
                shards[stream, split].verify()
        check_disjoint({split: shards[stream, split].ids for split in SPLITS})
    train = PackedStream(
        [shards[s, "train"] for s in config.stream_names],
        sequence_length=config.sequence_length,
        mix=config.mix,
        mix_unit=config.mix_unit,
        seed=config.seed,
        shuffle=config.shuffle,
        rank=rank,
        world_size=world_size,
    )
    held_out = {
        name: build_eval_set(
            [shards[s, name] for s in config.stream_names],
            name=name,
            sequence_length=config.sequence_length,
            count=getattr(config, f"{name}_windows"),
            mix=config.mix,
            mix_unit=config.mix_unit,
        )
        for name in ("validation", "calibration")
    }
    check_disjoint({name: held_out[name].document_ids for name in held_out})
    return OpenedData(train=train, **held_out)
