"""Parallel data preparation: one part of the input units at a time, then a merge into the prepared data.

The input is a list of units (:func:`~ue5m3.data.sources.list_units`: one record file of the OLMo mix, or 64
items of the offline corpus), numbered in source order across both streams. Part ``i`` of ``n =
data.prepare_parts`` takes the units with ``index % n == i`` (round robin, so each part gets some of both streams)
and writes, into its own directory ``<data_dir>/parts/part_IIIII_of_NNNNN/``::

    corpus/<stream>/<split>/unit_UUUUU.jsonl          the unit's kept documents of that split
    tokens/<stream>/<split>/unit_UUUUU_SSSSS.*        their token shards (a shard never spans two units)
    records/unit_UUUUU.jsonl                          every document read: [text SHA-256, id, written]
    tokenizer.json                                    the trained BPE (one part only: data.tokenizer_path unset)
    part.json                                         the part manifest (also written to the caller's path)

A part drops what it can decide alone: evaluation-quoted ids, blank texts and texts repeated within one unit.
:func:`merge_parts` checks that the given part manifests are parts ``0 .. n-1`` of this very config, each once,
with one tokenizer and one unit list, then replays the corpus's drop rules (:class:`DocumentFilter`) over every
unit's records in unit order, exactly as a single job applies them: duplicate ids are refused, repeats of a text
from an earlier unit are dropped and ``max_documents`` cuts each stream. Units untouched by that are hard-linked
into place (no copy); a unit that lost documents is rewritten from its part's files (its corpus lines filtered,
its token shards re-packed, never re-tokenized). The token indexes and the corpus manifest are written last.

Every file name and shard boundary is a function of the unit alone, so the prepared data (corpus files, token
shards, indexes, the corpus manifest and its SHA-256) are the same bytes for every part count: one job
(:func:`ue5m3.data.build.build_data`, which runs every part in turn) and 64 cluster jobs give the same run
identity. A part writes into a temporary directory and moves it into place complete; the merge validates every
part before it writes anything and swaps the finished ``corpus/`` and ``tokens/`` trees in, so a failure leaves
the previous complete output. Commands: docs/data.md.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ue5m3.artifacts import write_json
from ue5m3.data.config import DataConfig
from ue5m3.data.corpus import (
    MANIFEST,
    SPLITS,
    CorpusFileWriter,
    DocumentFilter,
    corpus_file,
    corpus_manifest,
    prepare_units,
    read_corpus_file,
    replace_dir,
    sha256_file,
    split_of,
    unit_name,
)
from ue5m3.data.shards import (
    INDEX,
    SHARD_SUFFIXES,
    check_dtype,
    encode_documents,
    index_record,
    pack_shards,
    read_shard_documents,
)
from ue5m3.data.sources import Document, Unit, list_units
from ue5m3.data.tokenizer import TextTokenizer, load_tokenizer, train_tokenizer
from ue5m3.logs import Progress

__all__ = ["PART_FORMAT", "part_dir", "part_manifest_path", "units_of_part", "prepare_part", "merge_parts"]

logger = logging.getLogger(__name__)

PART_FORMAT = "ue5m3-data-part-v1"
_PART_JSON = "part.json"

Log = Callable[[str], None]


def _quiet(message: str) -> None:
    del message


def part_dir(config: DataConfig, part: int) -> Path:
    """The directory of one part's files: ``<data_dir>/parts/part_IIIII_of_NNNNN``."""
    return Path(config.data_dir) / "parts" / f"part_{part:05d}_of_{config.prepare_parts:05d}"


def part_manifest_path(config: DataConfig, part: int) -> Path:
    """Where :func:`ue5m3.data.build.build_data` keeps a part's manifest (a cluster job names its own)."""
    return part_dir(config, part).with_suffix(".json")


def units_of_part(units: Sequence[Unit], part: int, parts: int) -> list[Unit]:
    """The units of part ``part`` of ``parts``: those with ``index % parts == part``, in order (maybe none)."""
    return [unit for unit in units if unit.index % parts == part]


def _units_sha256(units: Iterable[Unit]) -> str:
    listing = [{"index": unit.index, **unit.describe()} for unit in units]
    return hashlib.sha256(json.dumps(listing, sort_keys=True).encode("utf-8")).hexdigest()


def _check_part(config: DataConfig, part: Any) -> int:
    parts = config.prepare_parts
    if isinstance(part, bool) or not isinstance(part, int) or not 0 <= part < parts:
        raise ValueError(
            f"part {part!r} is not one of the {parts} parts of data.prepare_parts; accepted: 0 .. {parts - 1}"
        )
    return part


# ----- one part --------------------------------------------------------------------------------------------


def _part_tokenizer(
    config: DataConfig, staging: Path, mine: Sequence[Unit], entries: Mapping[int, Any], log: Log
) -> TextTokenizer:
    if config.tokenizer_path is not None:
        return load_tokenizer(
            config.tokenizer_path, bos_token=config.bos_token, eos_token=config.eos_token, vocab_size=config.vocab_size
        )
    # Only one part exists (DataConfig refuses more without tokenizer_path), so it read every unit with one filter
    # and its training split is the whole corpus's, in stream-then-unit order as the single job always read it.
    texts = (
        doc.text
        for unit in mine
        if "train" in entries[unit.index]["files"]
        for doc in read_corpus_file(staging / "corpus" / corpus_file(unit.stream, "train", unit.index))
    )
    log(f"training the byte-level BPE (vocabulary {config.vocab_size}) on the training split")
    train_tokenizer(texts, config.vocab_size, staging / "tokenizer.json")
    return load_tokenizer(
        staging / "tokenizer.json", bos_token=config.bos_token, eos_token=config.eos_token, vocab_size=config.vocab_size
    )


def _tokenize_units(
    config: DataConfig,
    staging: Path,
    mine: Sequence[Unit],
    entries: dict[int, dict[str, Any]],
    tokenizer: TextTokenizer,
    log: Log,
) -> None:
    dtype = check_dtype(None, tokenizer.vocab_size)
    for unit in mine:
        shards: dict[str, list[dict[str, Any]]] = {}
        began = time.perf_counter()
        # a bar on a terminal; in a log file a line every 30 s of a long unit (the unit's summary follows)
        progress = Progress(f"tokenize unit {unit.index}", unit="document", logger=logger, last_line=False)
        for split in entries[unit.index]["files"]:
            path = staging / "corpus" / corpus_file(unit.stream, split, unit.index)
            docs = _counted(read_corpus_file(path), progress)
            shards[split] = pack_shards(
                encode_documents(docs, tokenizer),
                staging / "tokens" / unit.stream / split,
                prefix=unit_name(unit.index),
                dtype=dtype,
                shard_tokens=config.shard_tokens,
            )
        progress.close()
        entries[unit.index]["shards"] = shards
        tokens = {split: sum(s["tokens"] for s in entry) for split, entry in shards.items()}
        rate = sum(tokens.values()) / max(time.perf_counter() - began, 1e-9)
        log(f"unit {unit.index}: tokens per split {tokens} ({rate:.0f} tokens/s)")


def _counted(documents: Iterable[Any], progress: Progress) -> Iterator[Any]:
    for document in documents:
        progress.update()
        yield document


def prepare_part(
    config: DataConfig, part: int, manifest_path: str | os.PathLike[str], *, log: Log = _quiet
) -> dict[str, float]:
    """Prepare part ``part`` of ``config.prepare_parts``: its units' corpus files, records and token shards.

    Args:
        config: the data section.
        part: which part, ``0 .. config.prepare_parts - 1``.
        manifest_path: where to write the part manifest (JSON), the input of :func:`merge_parts`.
        log: progress messages (units read, documents kept, tokens written).

    Returns:
        Seconds spent in each step (``prepare``, ``tokenizer``, ``tokenize``).

    Raises:
        ValueError: a part index out of range, a document id twice within the part's reading, a bad record.
        FileNotFoundError: an input path or the tokenizer file is missing.
    """
    part = _check_part(config, part)
    parts = config.prepare_parts
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    units = list_units(config)
    mine = units_of_part(units, part, parts)
    log(f"part {part} of {parts}: {len(mine)} of the {len(units)} input units")
    dest = part_dir(config, part)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    try:
        shared = DocumentFilter(config) if parts == 1 else None  # one part sees every earlier unit
        entries = prepare_units(
            config, mine, staging / "corpus", shared_filter=shared, records_dir=staging / "records", log=log
        )
        seconds["prepare"] = time.perf_counter() - start
        start = time.perf_counter()
        tokenizer = _part_tokenizer(config, staging, mine, entries, log)
        seconds["tokenizer"] = time.perf_counter() - start
        start = time.perf_counter()
        _tokenize_units(config, staging, mine, entries, tokenizer, log)
        seconds["tokenize"] = time.perf_counter() - start
        manifest = {
            "format": PART_FORMAT,
            "part": part,
            "parts": parts,
            "config": config.to_dict(),
            "units": {"count": len(units), "sha256": _units_sha256(units)},
            "tokenizer": {
                "sha256": sha256_file(tokenizer.path),
                "trained": config.tokenizer_path is None,
                "dtype": np.dtype(check_dtype(None, tokenizer.vocab_size)).name,
                "vocab_size": tokenizer.vocab_size,
                "bos_id": tokenizer.bos_id,
                "eos_id": tokenizer.eos_id,
            },
            "entries": [{"index": unit.index, **unit.describe(), **entries[unit.index]} for unit in mine],
        }
        write_json(staging / _PART_JSON, manifest)
        replace_dir(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    write_json(manifest_path, manifest)
    read = sum(e["documents_read"] for e in manifest["entries"])
    log(f"part {part} of {parts}: {read} documents read; files under {dest}; manifest {manifest_path}")
    return seconds


# ----- the merge: checks ------------------------------------------------------------------------------------


def _differing_keys(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    return sorted(key for key in set(a) | set(b) if a.get(key) != b.get(key))


def _read_parts(config: DataConfig, paths: Sequence[str | os.PathLike[str]]) -> dict[int, tuple[str, dict]]:
    """The part manifests by part index, each checked against the config and its part directory."""
    parts = config.prepare_parts
    current = config.to_dict()
    found: dict[int, tuple[str, dict]] = {}
    for raw in paths:
        path = str(raw)
        if not Path(path).is_file():
            raise FileNotFoundError(
                f"part manifest {path!r} does not exist; prepare it with `ue5m3 prepare-data --config ... --part I "
                f"--out {path}`"
            )
        manifest = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(manifest, dict) or manifest.get("format") != PART_FORMAT:
            raise ValueError(f"{path!r} is not a part manifest (format {PART_FORMAT!r}) of `ue5m3 prepare-data --part`")
        if manifest["parts"] != parts:
            raise ValueError(
                f"{path!r} is part {manifest['part']} of {manifest['parts']} parts, but data.prepare_parts is "
                f"{parts}; prepare all {parts} parts with this config"
            )
        if manifest["config"] != current:
            raise ValueError(
                f"{path!r} was prepared with another data config (differs in data."
                f"{', data.'.join(_differing_keys(manifest['config'], current))}); prepare that part again with this "
                "config"
            )
        part = manifest["part"]
        if part in found:
            raise ValueError(f"part {part} of {parts} is given twice: {found[part][0]!r} and {path!r}")
        staged = part_dir(config, part) / _PART_JSON
        if not staged.is_file() or json.loads(staged.read_text(encoding="utf-8")) != manifest:
            raise ValueError(
                f"{path!r} does not describe the files in {str(staged.parent)!r} (missing, or written by another "
                f"run of part {part}); prepare part {part} again"
            )
        found[part] = (path, manifest)
    missing = [part for part in range(parts) if part not in found]
    if missing:
        raise ValueError(
            f"part(s) {missing} of {parts} are missing (given: {[str(p) for p in paths]}); prepare each with "
            "`ue5m3 prepare-data --config ... --part I --out FILE` and pass every part manifest to the merge"
        )
    return found


def _check_agreement(config: DataConfig, found: Mapping[int, tuple[str, dict]]) -> dict[str, Any]:
    """The unit list and tokenizer all parts share (checked against part 0 and the tokenizer file)."""
    first_path, first = found[0]
    for part in sorted(found):
        path, manifest = found[part]
        for key, what in (("units", "input units"), ("tokenizer", "tokenizer")):
            if manifest[key] != first[key]:
                raise ValueError(
                    f"{path!r} has another {what} than part 0 ({first_path!r}): {manifest[key]} vs {first[key]}; the "
                    "inputs changed between the part jobs, prepare every part again"
                )
    tokenizer = first["tokenizer"]
    path = Path(config.tokenizer_path) if config.tokenizer_path else part_dir(config, 0) / "tokenizer.json"
    digest = sha256_file(path) if path.is_file() else None
    if digest != tokenizer["sha256"]:
        raise ValueError(
            f"the parts were tokenized with tokenizer SHA-256 {tokenizer['sha256']}, but {str(path)!r} has {digest}; "
            "prepare every part again"
        )
    return tokenizer


def _collect_entries(found: Mapping[int, tuple[str, dict]]) -> tuple[list[Unit], dict[int, dict], dict[int, int]]:
    count = found[0][1]["units"]["count"]
    entries: dict[int, dict] = {}
    owner: dict[int, int] = {}
    for part, (path, manifest) in found.items():
        for entry in manifest["entries"]:
            index = entry["index"]
            if index in entries or index % len(found) != part:
                raise ValueError(f"{path!r} lists unit {index}, which is not its own; prepare part {part} again")
            entries[index], owner[index] = entry, part
    if sorted(entries) != list(range(count)):
        raise ValueError(f"the parts hold units {sorted(entries)}, expected 0 .. {count - 1}; prepare every part again")
    units = [Unit(i, entries[i]["stream"], entries[i]["source"], tuple(entries[i]["items"])) for i in range(count)]
    return units, entries, owner


def _check_sizes(
    config: DataConfig,
    units: Sequence[Unit],
    entries: Mapping[int, dict],
    owner: Mapping[int, int],
    dtype: type[np.unsignedinteger[Any]],
) -> None:
    """Every staged file is there with its recorded size (the SHA-256 are checked when the data are opened)."""
    itemsize = np.dtype(dtype).itemsize
    for unit in units:
        entry, root = entries[unit.index], part_dir(config, owner[unit.index])
        expected: list[tuple[Path, int | None]] = [
            (root / "records" / f"{unit_name(unit.index)}.jsonl", entry["records"]["bytes"])
        ]
        for split, record in entry["files"].items():
            expected.append((root / "corpus" / corpus_file(unit.stream, split, unit.index), record["bytes"]))
            for shard in entry["shards"][split]:
                stem = root / "tokens" / unit.stream / split / shard["name"]
                expected.append((stem.with_name(f"{shard['name']}.bin"), shard["tokens"] * itemsize))
                expected += [(stem.with_name(f"{shard['name']}{suffix}"), None) for suffix in SHARD_SUFFIXES[1:]]
        for path, size in expected:
            if not path.is_file():
                raise FileNotFoundError(
                    f"{str(path)!r} of part {owner[unit.index]} is missing; prepare that part again"
                )
            if size is not None and path.stat().st_size != size:
                raise ValueError(
                    f"{str(path)!r} has {path.stat().st_size} bytes, its part manifest says {size}; prepare part "
                    f"{owner[unit.index]} again"
                )


# ----- the merge: drop rules over the records, then the files ------------------------------------------------


def _plan(config: DataConfig, units: Sequence[Unit], entries: Mapping[int, dict], owner: Mapping[int, int]):
    """Replay the drop rules over every unit's records: the ids each unit must lose, and the dropped lists."""
    doc_filter = DocumentFilter(config)
    read = dict.fromkeys(config.stream_names, 0)
    removed: dict[int, set[str]] = {}
    for unit in units:
        entry = entries[unit.index]
        limit = None if config.max_documents is None else max(config.max_documents - read[unit.stream], 0)
        path = part_dir(config, owner[unit.index]) / "records" / f"{unit_name(unit.index)}.jsonl"
        lost: set[str] = set()
        taken = 0
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                sha256, doc_id, written = json.loads(line)
                if limit is not None and taken >= limit:
                    if written:
                        lost.add(doc_id)  # past the stream's max_documents: a single job never reads it
                    continue
                taken += 1
                kept = doc_filter.keep(doc_id, sha256, unit.source)
                # A part drops a document only where every reader of it does (same unit, or one reader of all).
                assert written or not kept, f"unit {unit.index}: {doc_id!r} kept by the merge, dropped by its part"
                if written and not kept:
                    lost.add(doc_id)
        # A part stops reading a stream after max_documents of its own; the merge never needs more of a unit.
        assert limit is None or taken == limit or entry["complete"], f"unit {unit.index} was cut short by its part"
        read[unit.stream] += taken
        if lost:
            removed[unit.index] = lost
    return removed, doc_filter.dropped


def _link(source: Path, dest: Path, log: Log, copied: list[bool]) -> None:
    """Hard-link (no copy) a staged file into the new tree; copy where the filesystem has no hard links."""
    try:
        os.link(source, dest)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        if not copied:
            log(f"hard links are not available here ({exc.strerror}); copying the part files instead")
            copied.append(True)
        shutil.copyfile(source, dest)


def _rewrite_corpus(source: Path, dest: Path, lost: set[str]) -> dict[str, Any] | None:
    writer = None
    with open(source, "rb") as handle:
        for line in handle:
            record = json.loads(line)
            if record["id"] in lost:
                continue
            writer = writer or CorpusFileWriter(dest)
            writer.add(Document(record["id"], record["text"]), line)
    return None if writer is None else writer.close()


def _merge_unit(
    config: DataConfig,
    unit: Unit,
    entry: Mapping[str, Any],
    root: Path,
    new: Path,
    lost: set[str] | None,
    dtype: type[np.unsignedinteger[Any]],
    link: Callable[[Path, Path], None],
) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """One unit's corpus files and shards in the new tree: linked as the part wrote them, or rewritten."""
    files: dict[str, Any] = {}
    shards: dict[str, list[dict[str, Any]]] = {}
    for split in SPLITS:
        if split not in entry["files"]:
            continue
        rel = corpus_file(unit.stream, split, unit.index)
        (new / "corpus" / rel).parent.mkdir(parents=True, exist_ok=True)
        staged_shards, out_dir = root / "tokens" / unit.stream / split, new / "tokens" / unit.stream / split
        out_dir.mkdir(parents=True, exist_ok=True)
        fractions = dict(
            validation_fraction=config.validation_fraction, calibration_fraction=config.calibration_fraction
        )
        if not lost or not any(split_of(doc_id, **fractions) == split for doc_id in lost):
            link(root / "corpus" / rel, new / "corpus" / rel)
            files[split] = entry["files"][split]
            shards[split] = entry["shards"][split]
            for shard in shards[split]:
                for suffix in SHARD_SUFFIXES:
                    link(staged_shards / f"{shard['name']}{suffix}", out_dir / f"{shard['name']}{suffix}")
            continue
        record = _rewrite_corpus(root / "corpus" / rel, new / "corpus" / rel, lost)
        if record is None:
            continue
        files[split] = record
        kept = (doc for doc in read_shard_documents(staged_shards, entry["shards"][split], dtype) if doc[0] not in lost)
        shards[split] = pack_shards(
            kept, out_dir, prefix=unit_name(unit.index), dtype=dtype, shard_tokens=config.shard_tokens
        )
    return files, shards


def merge_parts(config: DataConfig, manifest_paths: Sequence[str | os.PathLike[str]], *, log: Log = _quiet) -> Path:
    """Merge parts ``0 .. config.prepare_parts - 1`` into the prepared data under ``config.data_dir``.

    Args:
        config: the data section the parts were prepared with.
        manifest_paths: the part manifests, each part exactly once (any order).
        log: progress messages.

    Returns:
        The path of the corpus manifest.

    Raises:
        FileNotFoundError: a part manifest or one of its files is missing (the path is named).
        ValueError: a part missing or given twice, a part of another config, part count, unit list or tokenizer,
            or a document id that occurs in two units. Nothing is written then.
    """
    found = _read_parts(config, manifest_paths)
    tokenizer = _check_agreement(config, found)
    units, entries, owner = _collect_entries(found)
    dtype = check_dtype(np.dtype(tokenizer["dtype"]).type, tokenizer["vocab_size"])
    _check_sizes(config, units, entries, owner, dtype)
    removed, dropped = _plan(config, units, entries, owner)
    log(
        f"{len(found)} parts and {len(units)} units checked; {len(removed)} units lose documents (repeats across "
        "units, max_documents)"
    )
    root = Path(config.data_dir)
    new = Path(tempfile.mkdtemp(prefix=".merge.", suffix=".tmp", dir=root))
    copied: list[bool] = []
    try:
        files: dict[str, Any] = {}
        shards = {(stream, split): [] for stream in config.stream_names for split in SPLITS}
        for unit in units:
            unit_files, unit_shards = _merge_unit(
                config,
                unit,
                entries[unit.index],
                part_dir(config, owner[unit.index]),
                new,
                removed.get(unit.index),
                dtype,
                lambda source, dest: _link(source, dest, log, copied),
            )
            for split, record in unit_files.items():
                files[corpus_file(unit.stream, split, unit.index)] = {"unit": unit.index, **record}
                shards[unit.stream, split].extend(unit_shards[split])
        write_json(new / "corpus" / MANIFEST, corpus_manifest(config, units, dropped, files))
        metadata = {"corpus_manifest_sha256": sha256_file(new / "corpus" / MANIFEST)}
        info = {key: tokenizer[key] for key in ("vocab_size", "bos_id", "eos_id")}
        for (stream, split), entries_of_split in shards.items():
            index = index_record(
                entries_of_split,
                dtype=dtype,
                tokenizer_sha256=tokenizer["sha256"],
                metadata={"stream": stream, "split": split, **metadata},
                **info,
            )
            write_json(new / "tokens" / stream / split / INDEX, index)
        if tokenizer["trained"]:
            _link(part_dir(config, 0) / "tokenizer.json", new / "tokenizer.json", log, copied)
            os.replace(new / "tokenizer.json", root / "tokenizer.json")
        replace_dir(new / "tokens", root / "tokens")
        replace_dir(new / "corpus", root / "corpus")  # the manifest last
    finally:
        shutil.rmtree(new, ignore_errors=True)
    log(f"merged {len(units)} units into {root}: {len(files)} corpus files, {sum(map(len, shards.values()))} shards")
    others = sorted(
        p.name for p in (root / "parts").glob("part_*_of_*") if not p.name.endswith(f"_of_{len(found):05d}")
    )
    if others:
        log(f"parts of other part counts are still in {root / 'parts'} ({len(others)}, e.g. {others[0]}); delete them")
    return root / "corpus" / MANIFEST
