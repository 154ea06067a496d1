"""Tests of ue5m3.data.tokenizer: a real byte-level BPE trained on the fixture records in tests/fixtures/data/."""

from __future__ import annotations

import pytest

from helpers.data import A_FILES, B_FILES
from ue5m3.data import BOS_ID, EOS_ID, PAD_ID, load_tokenizer, read_records, train_tokenizer


def fixture_texts() -> list[str]:
    return [d.text for d in read_records(A_FILES + B_FILES)]


def test_tokenizer_round_trips_text_with_nemotron_special_ids(tmp_path):
    tokenizer = train_tokenizer(fixture_texts(), 300, tmp_path / "tokenizer.json")
    assert (tokenizer.tokenizer.token_to_id("<pad>"), tokenizer.bos_id, tokenizer.eos_id) == (PAD_ID, 1, 2)
    assert tokenizer.vocab_size == 300
    for text in fixture_texts() + ["Über naïve café 東京 🙂", "  two  spaces\n\ttab", "literal <s> and </s> stay text"]:
        ids = tokenizer.encode(text)
        assert BOS_ID not in ids and EOS_ID not in ids
        assert tokenizer.decode(ids) == text


def test_tokenizer_training_is_deterministic(tmp_path):
    train_tokenizer(fixture_texts(), 300, tmp_path / "one.json")
    train_tokenizer(fixture_texts(), 300, tmp_path / "two.json")
    assert (tmp_path / "one.json").read_bytes() == (tmp_path / "two.json").read_bytes()


def test_load_tokenizer_checks_special_tokens_and_vocabulary(tmp_path):
    train_tokenizer(fixture_texts(), 300, tmp_path / "tokenizer.json")
    with pytest.raises(ValueError, match="bos_token '<bos>' is not in the vocabulary"):
        load_tokenizer(tmp_path / "tokenizer.json", bos_token="<bos>")
    with pytest.raises(ValueError, match="has 300 tokens but data.vocab_size is 131072"):
        load_tokenizer(tmp_path / "tokenizer.json", vocab_size=131072)
    with pytest.raises(FileNotFoundError, match="nemotron.json"):
        load_tokenizer(tmp_path / "nemotron.json")
