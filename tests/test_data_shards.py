"""Tests of ue5m3.data.shards: BOS/EOS-wrapped documents in token shards, their dtype, index and atomic writes
(byte tokenizer test double, so every expected token is known)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers.data import ByteTokenizer, synthetic_docs
from ue5m3.data import BOS_ID, EOS_ID, token_dtype, tokenize_to_shards


def test_every_document_is_wrapped_in_bos_and_eos(tmp_path, byte_streams):
    a, _ = byte_streams
    docs = synthetic_docs("A", 37)
    assert len(a) == 37 and a.ids == [d.id for d in docs]
    tokenizer = ByteTokenizer(tmp_path / "t.txt")
    for i, doc in enumerate(docs):
        tokens = a.tokens(i).tolist()
        assert tokens == [BOS_ID] + tokenizer.encode(doc.text) + [EOS_ID]
        assert a.length(i) == len(tokens)


def test_shards_split_between_documents_and_record_sha256(byte_streams):
    a, _ = byte_streams
    shards = a.index["shards"]
    assert len(shards) > 1 and all(s["tokens"] <= 200 for s in shards)
    assert sum(s["documents"] for s in shards) == len(a)
    a.verify()
    for s in shards:
        data = np.fromfile(a.root / f"{s['name']}.bin", dtype=np.uint16)
        assert data[0] == BOS_ID and data[-1] == EOS_ID and len(data) == s["tokens"]


def test_token_dtype_follows_the_vocabulary(tmp_path):
    assert token_dtype(8192) is np.uint16 and token_dtype(65536) is np.uint16
    assert token_dtype(65537) is np.uint32 and token_dtype(131072) is np.uint32
    tokenizer = ByteTokenizer(tmp_path / "t.txt")
    tokenizer.vocab_size = 131072
    index = tokenize_to_shards(synthetic_docs("A", 3), tokenizer, tmp_path / "s")
    assert json.loads(index.read_text())["dtype"] == "uint32"
    with pytest.raises(ValueError, match="cannot hold 131072 token ids"):
        tokenize_to_shards(synthetic_docs("A", 3), tokenizer, tmp_path / "s", dtype=np.uint16)


def test_tokenize_to_shards_leaves_no_partial_file_on_error(tmp_path):
    tokenizer = ByteTokenizer(tmp_path / "t.txt")
    tokenize_to_shards(synthetic_docs("A", 5), tokenizer, tmp_path / "out", shard_tokens=30)
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}

    def failing():
        yield from synthetic_docs("B", 40)
        raise OSError("source died")

    with pytest.raises(OSError, match="source died"):
        tokenize_to_shards(failing(), tokenizer, tmp_path / "out", shard_tokens=30)
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "t.txt"]  # no staging directory left
