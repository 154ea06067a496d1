"""Shared helpers of the data pipeline tests (``tests/test_data_*.py``): the OLMo-mix fixture records in
tests/fixtures/data/, a :class:`DataConfig` over them, and a byte tokenizer test double.

Loader and shard tests use the byte tokenizer (one token per UTF-8 byte) so every expected token is known; the
tokenizer and end-to-end tests train a real byte-level BPE on the fixture records. The ``byte_streams`` fixture
built from these helpers lives in tests/conftest.py.
"""

from __future__ import annotations

from pathlib import Path

from ue5m3.data import BOS_ID, EOS_ID, Corpus, DataConfig, Document

FIXTURES = Path(__file__).parents[1] / "fixtures" / "data" / "olmo_mix"
A_FILES = (str(FIXTURES / "dclm" / "*.jsonl"),)
B_FILES = (str(FIXTURES / "olmo_no_dclm" / "*.jsonl"),)


def fixture_config(tmp_path: Path, **overrides) -> DataConfig:
    settings = dict(
        corpus=Corpus.OLMO_MIX,
        stream_a_files=A_FILES,
        stream_b_files=B_FILES,
        vocab_size=300,
        sequence_length=16,
        validation_fraction=0.25,
        calibration_fraction=0.25,
        validation_windows=2,
        calibration_windows=1,
        data_dir=str(tmp_path / "data"),
    )
    settings.update(overrides)
    return DataConfig(**settings)


class ByteTokenizer:
    """Test double of TextTokenizer: token id = UTF-8 byte + 3, BOS 1, EOS 2."""

    bos_id, eos_id, vocab_size = BOS_ID, EOS_ID, 259

    def __init__(self, path: Path) -> None:
        path.write_text("byte tokenizer test double\n")
        self.path = path

    def encode(self, text: str) -> list[int]:
        return [b + 3 for b in text.encode("utf-8")]

    def encode_batch(self, texts):
        return [self.encode(t) for t in texts]


def synthetic_docs(prefix: str, count: int) -> list[Document]:
    # Lengths 4..43 bytes so documents end inside windows, span windows and share windows.
    return [Document(f"{prefix}{i:03d}", f"{prefix}{i:03d}:" + "xyz"[i % 3] * (i * 7 % 37)) for i in range(count)]
