"""Tokenized shards: flat memory-mapped token arrays with BOS and EOS around every document (OLMo-style).

:func:`tokenize_to_shards` encodes documents in order and writes, per shard of at most ``shard_tokens`` tokens
(a document never straddles two shards)::

    shard_00000.bin           the token ids, raw little-endian uint16 (vocabulary <= 65,536) or uint32
    shard_00000.offsets.npy   int64 document starts within the shard, plus the end (length documents + 1)
    shard_00000.ids.txt       the document ids, one a line
    index.json                dtype, vocabulary, BOS/EOS ids, tokenizer SHA-256, and per shard the counts
                              and the SHA-256 of its three files

Document ``i`` of a shard is ``[BOS] + encode(text) + [EOS]`` = ``bin[offsets[i]:offsets[i + 1]]``. Every file
is first written to a temporary directory beside ``out_dir`` and moved in only when all are complete, the index
last, so an error leaves no partial file behind. :class:`TokenShards` reads a directory back through
``np.memmap`` (documents addressed by a global index across shards) and can re-check every SHA-256.

The prepared data (:mod:`ue5m3.data.parts`) use the same files and index, built from :func:`pack_shards` per input
unit: unit ``u``'s documents of a split fill shards ``unit_UUUUU_00000``, ... of their own, so a shard's bounds
depend on its unit alone and not on how the units were spread over parallel jobs; the index lists them in unit
order.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from ue5m3.artifacts import TornFileError, write_json
from ue5m3.data.corpus import sha256_file
from ue5m3.data.sources import Document
from ue5m3.data.tokenizer import TextTokenizer

__all__ = [
    "INDEX",
    "SHARD_SUFFIXES",
    "token_dtype",
    "check_dtype",
    "encode_documents",
    "pack_shards",
    "read_shard_documents",
    "index_record",
    "tokenize_to_shards",
    "TokenShards",
]

INDEX = "index.json"
_DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
SHARD_SUFFIXES = (".bin", ".offsets.npy", ".ids.txt")
"""The three files of a shard."""


def token_dtype(vocab_size: int) -> type[np.unsignedinteger[Any]]:
    """The narrowest storage type for ids below ``vocab_size``: uint16 up to 65,536 tokens, else uint32."""
    if vocab_size <= 1 << 16:
        return np.uint16
    if vocab_size <= 1 << 32:
        return np.uint32
    raise ValueError(f"vocab_size {vocab_size!r} does not fit uint32 token ids")


class _ShardWriter:
    """Writes one shard's three files into a staging directory, hashing as it goes."""

    def __init__(self, staging: Path, name: str, dtype: type[np.unsignedinteger[Any]]) -> None:
        self.name = name
        self.staging = staging
        self.dtype = dtype
        self.bin = open(staging / f"{self.name}.bin", "wb")
        self.digest = hashlib.sha256()
        self.offsets = [0]
        self.ids: list[str] = []

    @property
    def tokens(self) -> int:
        return self.offsets[-1]

    def add(self, doc_id: str, tokens: np.ndarray) -> None:
        if "\n" in doc_id:
            raise ValueError(f"document id {doc_id!r} contains a newline")
        data = tokens.astype(self.dtype, copy=False).tobytes()  # native order: little-endian on every target
        self.bin.write(data)
        self.digest.update(data)
        self.offsets.append(self.offsets[-1] + len(tokens))
        self.ids.append(doc_id)

    def close(self) -> dict[str, Any]:
        self.bin.close()
        np.save(self.staging / f"{self.name}.offsets.npy", np.asarray(self.offsets, dtype=np.int64))
        (self.staging / f"{self.name}.ids.txt").write_text("".join(f"{i}\n" for i in self.ids), encoding="utf-8")
        entry: dict[str, Any] = {"name": self.name, "documents": len(self.ids), "tokens": self.tokens}
        entry["bin_sha256"] = self.digest.hexdigest()
        for kind, suffix in (("offsets", ".offsets.npy"), ("ids", ".ids.txt")):
            entry[f"{kind}_sha256"] = sha256_file(self.staging / f"{self.name}{suffix}")
        return entry


def _batches(docs: Iterable[Document], size: int) -> Iterator[list[Document]]:
    it = iter(docs)
    while batch := list(islice(it, size)):
        yield batch


def encode_documents(
    docs: Iterable[Document], tokenizer: TextTokenizer, *, batch_documents: int = 64
) -> Iterator[tuple[str, np.ndarray]]:
    """Each document's id and ``[BOS] + encode(text) + [EOS]`` (int64), in order."""
    for batch in _batches(docs, batch_documents):
        for doc, ids in zip(batch, tokenizer.encode_batch([d.text for d in batch]), strict=True):
            tokens = np.empty(len(ids) + 2, dtype=np.int64)
            tokens[0], tokens[1:-1], tokens[-1] = tokenizer.bos_id, ids, tokenizer.eos_id
            yield doc.id, tokens


def check_dtype(dtype: type[np.unsignedinteger[Any]] | None, vocab_size: int) -> type[np.unsignedinteger[Any]]:
    """``dtype``, or :func:`token_dtype` of the vocabulary when None.

    Raises:
        ValueError: a dtype too narrow for the vocabulary.
    """
    dtype = token_dtype(vocab_size) if dtype is None else dtype
    if dtype not in (np.uint16, np.uint32) or vocab_size > np.iinfo(dtype).max + 1:
        raise ValueError(f"dtype {dtype!r} cannot hold {vocab_size} token ids; use np.uint16 (<= 65,536) or np.uint32")
    return dtype


def pack_shards(
    documents: Iterable[tuple[str, np.ndarray]],
    out_dir: str | os.PathLike[str],
    *,
    prefix: str,
    dtype: type[np.unsignedinteger[Any]],
    shard_tokens: int,
    empty_shard: bool = False,
) -> list[dict[str, Any]]:
    """Write documents (id, tokens) into shards ``<prefix>_00000``, ... of at most ``shard_tokens`` tokens.

    A shard is closed when the next document would pass ``shard_tokens`` (a longer document gets a shard of its
    own), so the layout is a function of the document sequence alone. ``out_dir`` should be a staging directory:
    files appear there as they are written.

    Returns:
        Per shard: name, documents, tokens and the SHA-256 of its three files (no shard for no documents, unless
        ``empty_shard``).

    Raises:
        ValueError: a document id with a newline.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    entries: list[dict[str, Any]] = []
    writer = None
    for doc_id, tokens in documents:
        if writer is None or (writer.tokens and writer.tokens + len(tokens) > shard_tokens):
            if writer is not None:
                entries.append(writer.close())
            writer = _ShardWriter(out, f"{prefix}_{len(entries):05d}", dtype)
        writer.add(doc_id, tokens)
    if writer is None and empty_shard:
        writer = _ShardWriter(out, f"{prefix}_00000", dtype)
    if writer is not None:
        entries.append(writer.close())
    return entries


def read_shard_documents(
    shard_dir: str | os.PathLike[str], entries: Iterable[dict[str, Any]], dtype: type[np.unsignedinteger[Any]]
) -> Iterator[tuple[str, np.ndarray]]:
    """The (id, tokens) of every document of the listed shards, in order (to re-pack a subset of them)."""
    root = Path(shard_dir)
    for entry in entries:
        offsets = np.load(root / f"{entry['name']}.offsets.npy")
        tokens = np.fromfile(root / f"{entry['name']}.bin", dtype=dtype)
        ids = (root / f"{entry['name']}.ids.txt").read_text(encoding="utf-8").splitlines()
        for i, doc_id in enumerate(ids):
            yield doc_id, tokens[offsets[i] : offsets[i + 1]]


def index_record(
    entries: list[dict[str, Any]],
    *,
    dtype: type[np.unsignedinteger[Any]],
    vocab_size: int,
    bos_id: int,
    eos_id: int,
    tokenizer_sha256: str,
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``index.json`` of a shard directory holding ``entries`` in order."""
    return {
        "format": "ue5m3-tokens-v1",
        "dtype": np.dtype(dtype).name,
        "vocab_size": vocab_size,
        "bos_id": bos_id,
        "eos_id": eos_id,
        "tokenizer_sha256": tokenizer_sha256,
        "documents": sum(e["documents"] for e in entries),
        "tokens": sum(e["tokens"] for e in entries),
        "metadata": metadata or {},
        "shards": entries,
    }


def tokenize_to_shards(
    docs: Iterable[Document],
    tokenizer: TextTokenizer,
    out_dir: str | os.PathLike[str],
    *,
    dtype: type[np.unsignedinteger[Any]] | None = None,
    shard_tokens: int = 1 << 28,
    metadata: dict[str, Any] | None = None,
    batch_documents: int = 64,
) -> Path:
    """Tokenize documents with BOS and EOS around each and write memory-mapped shards plus ``index.json``.

    Args:
        docs: documents in the order they are stored.
        tokenizer: the tokenizer (its BOS/EOS ids are written around every document).
        out_dir: destination directory; files of an earlier run are replaced only after this one completes.
        dtype: np.uint16 or np.uint32; default :func:`token_dtype` of the vocabulary.
        shard_tokens: most tokens per shard (a longer document gets a shard of its own).
        metadata: extra identity fields for the index (stream, split, corpus manifest hash, ...).
        batch_documents: documents encoded per library call.

    Returns:
        The path of the index.

    Raises:
        ValueError: a dtype too narrow for the vocabulary, or a document id with a newline.
    """
    vocab = tokenizer.vocab_size
    dtype = check_dtype(dtype, vocab)
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        entries = pack_shards(
            encode_documents(docs, tokenizer, batch_documents=batch_documents),
            staging,
            prefix="shard",
            dtype=dtype,
            shard_tokens=shard_tokens,
            empty_shard=True,
        )
        index = index_record(
            entries,
            dtype=dtype,
            vocab_size=vocab,
            bos_id=tokenizer.bos_id,
            eos_id=tokenizer.eos_id,
            tokenizer_sha256=sha256_file(tokenizer.path),
            metadata=metadata,
        )
        out.mkdir(parents=True, exist_ok=True)
        keep = {INDEX}
        for entry in entries:
            for suffix in SHARD_SUFFIXES:
                os.replace(staging / f"{entry['name']}{suffix}", out / f"{entry['name']}{suffix}")
                keep.add(f"{entry['name']}{suffix}")
        write_json(out / INDEX, index)
        for stale in out.glob("shard_*"):  # shards of an earlier, longer run
            if stale.name not in keep:
                stale.unlink()
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out / INDEX


_REBUILD = "prepare the data again (`ue5m3 prepare-data`, then `ue5m3 merge-data`; docs/data.md)"
_INDEX_KEYS = ("dtype", "vocab_size", "bos_id", "eos_id", "tokenizer_sha256", "tokens", "shards")
_SHARD_KEYS = ("name", "documents", "bin_sha256", "offsets_sha256", "ids_sha256")


def _parse_index(path: Path, raw: bytes) -> dict[str, Any]:
    """A shard directory's index: a complete JSON record with every key the reader needs, else an error naming the
    file and the fix."""
    try:
        index = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise TornFileError(
            f"{path} is not a complete JSON record ({err}; a write interrupted by a kill or a full disk, or an edit); "
            f"{_REBUILD}"
        ) from None
    missing = [k for k in _INDEX_KEYS if not isinstance(index, dict) or k not in index]
    if not missing and (not isinstance(index["shards"], list) or index["dtype"] not in _DTYPES):
        missing = ["shards", "dtype"]
    for i, shard in enumerate(index["shards"] if not missing else []):
        missing += [f"shards[{i}].{k}" for k in _SHARD_KEYS if not isinstance(shard, dict) or k not in shard]
    if missing:
        raise ValueError(f"{path} is not a token-shard index (missing or malformed: {missing}); {_REBUILD}")
    return index


def _open_offsets(path: Path, documents: int) -> np.ndarray:
    """A shard's document offsets (memory-mapped), checked to be a whole array of ``documents + 1`` entries."""
    try:
        offsets = np.load(path, mmap_mode="r")
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} is missing (listed in its {INDEX}); {_REBUILD}") from None
    except (ValueError, OSError, EOFError) as err:  # numpy: "mmap length is greater than file size"
        raise ValueError(f"{path} is cut short or is not a .npy array ({err}); {_REBUILD}") from None
    if offsets.shape != (documents + 1,):
        raise ValueError(
            f"{path} holds {offsets.shape} offsets, but its {INDEX} records {documents} documents (so "
            f"{documents + 1} offsets); {_REBUILD}"
        )
    return offsets


class TokenShards:
    """Read-only view of a shard directory: document ``i`` across all shards, as a slice of a memmap."""

    def __init__(self, shard_dir: str | os.PathLike[str]) -> None:
        self.root = Path(shard_dir)
        index_path = self.root / INDEX
        if not index_path.is_file():
            raise FileNotFoundError(f"{str(index_path)!r} does not exist; run tokenize_to_shards first")
        raw = index_path.read_bytes()
        self.index: dict[str, Any] = _parse_index(index_path, raw)
        self.fingerprint = hashlib.sha256(raw).hexdigest()
        """SHA-256 of the index, which holds the SHA-256 of every shard: identifies the token data."""
        self.dtype = _DTYPES[self.index["dtype"]]
        self.bos_id: int = self.index["bos_id"]
        self.eos_id: int = self.index["eos_id"]
        shards = self.index["shards"]
        self._first = np.cumsum([0] + [s["documents"] for s in shards])  # global index of each shard's first doc
        self._offsets = [_open_offsets(self.root / f"{s['name']}.offsets.npy", s["documents"]) for s in shards]
        self._tokens: list[np.ndarray | None] = [None] * len(shards)
        self._ids: list[str] | None = None

    def __len__(self) -> int:
        return int(self._first[-1])

    @property
    def total_tokens(self) -> int:
        """Tokens over all documents, BOS and EOS included."""
        return int(self.index["tokens"])

    def _locate(self, doc: int) -> tuple[int, int]:
        if not 0 <= doc < len(self):
            raise IndexError(f"document {doc} out of range [0, {len(self)})")
        shard = int(np.searchsorted(self._first, doc, side="right")) - 1
        return shard, doc - int(self._first[shard])

    def length(self, doc: int) -> int:
        """Tokens of document ``doc`` (BOS and EOS included)."""
        shard, local = self._locate(doc)
        return int(self._offsets[shard][local + 1] - self._offsets[shard][local])

    def tokens(self, doc: int, start: int = 0, end: int | None = None) -> np.ndarray:
        """Tokens ``[start, end)`` of document ``doc`` as a read-only memmap slice."""
        shard, local = self._locate(doc)
        if self._tokens[shard] is None:
            name = self.index["shards"][shard]["name"]
            self._tokens[shard] = np.memmap(self.root / f"{name}.bin", dtype=self.dtype, mode="r")
        begin = int(self._offsets[shard][local])
        stop = int(self._offsets[shard][local + 1])
        end = stop - begin if end is None else end
        return self._tokens[shard][begin + start : begin + end]  # type: ignore[index]

    @property
    def ids(self) -> list[str]:
        """Document ids in global order."""
        if self._ids is None:
            self._ids = []
            for s in self.index["shards"]:
                self._ids.extend((self.root / f"{s['name']}.ids.txt").read_text(encoding="utf-8").splitlines())
        return self._ids

    def verify(self) -> None:
        """Re-hash every shard file against the index.

        Raises:
            ValueError: a file differs from its recorded SHA-256 (the file is named).
        """
        for s in self.index["shards"]:
            for kind, suffix in (("bin", ".bin"), ("offsets", ".offsets.npy"), ("ids", ".ids.txt")):
                path = self.root / f"{s['name']}{suffix}"
                if sha256_file(path) != s[f"{kind}_sha256"]:
                    raise ValueError(f"{str(path)!r} does not match the SHA-256 in {str(self.root / INDEX)!r}")
