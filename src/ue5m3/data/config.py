"""The data section of a run's configuration (style rule 6): one frozen, keyword-only dataclass, validated once.

:class:`DataConfig` covers the corpus and its two streams, the tokenizer, the 41-of-50 mixing schedule, packing
into ``sequence_length + 1`` windows, the frozen validation and calibration splits, the loader seed, the
directory every data artefact is written to and the number of parallel jobs that prepare them.
:meth:`DataConfig.from_dict` is the strict loader: unknown and missing keys are refused (both listed), lists become
tuples and enum strings become members; every invariant is checked in ``__post_init__`` with the offending key
named in the message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, NoReturn

from ue5m3 import config
from ue5m3.config import Range

__all__ = ["Corpus", "MixUnit", "DataConfig", "STREAM_NAMES"]


class Corpus(StrEnum):
    """Where the documents come from."""

    SOTU_CPYTHON = "sotu_cpython"
    """Offline CPU-scale corpus: U.S. State of the Union addresses (stream A) and CPython's documentation (B)."""
    OLMO_MIX = "olmo_mix"
    """The paper's allenai/olmo-mix-1124 (stream A "dclm", B "olmo_no_dclm") from JSONL/parquet paths or hf:// URIs."""


class MixUnit(StrEnum):
    """What one step of the 41-of-50 schedule assigns to a stream."""

    DOCUMENT = "document"
    """The paper's loader: document n of the mixed sequence comes from stream A or B; one shared packing buffer."""
    WINDOW = "window"
    """Window n comes from stream A or B; each stream packs its own documents into its own buffer."""


STREAM_NAMES: dict[Corpus, tuple[str, str]] = {
    Corpus.SOTU_CPYTHON: ("sotu", "cpython_docs"),
    Corpus.OLMO_MIX: ("dclm", "olmo_no_dclm"),
}
"""Names of stream A (the majority stream) and stream B for each corpus; also the sub-directory names."""


def _fail(exc: type[Exception], key: str, detail: str) -> NoReturn:
    raise exc(f"data.{key}: {detail}")


def _check_int(value: Any, key: str, *, minimum: int) -> None:
    # bool is an int subclass: never accept it where a count belongs.
    if not isinstance(value, int) or isinstance(value, bool):
        _fail(TypeError, key, f"expected an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        _fail(ValueError, key, f"must be >= {minimum}, got {value!r}")


def _check_fraction(value: Any, key: str) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        _fail(TypeError, key, f"expected a number in [0, 1), got {type(value).__name__} {value!r}")
    if not (math.isfinite(value) and 0 <= value < 1):
        _fail(ValueError, key, f"must be in [0, 1), got {value!r}")


def _check_str(value: Any, key: str, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not value:
        _fail(TypeError, key, f"expected a non-empty str{' or null' if optional else ''}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Corpus, tokenizer, mixing, packing and split settings (experiments spec section 3)."""

    corpus: Corpus
    """Document source: ``sotu_cpython`` (offline, CPU scale) or ``olmo_mix`` (the paper's, cluster)."""
    stream_a_files: tuple[str, ...] = ()
    """olmo_mix only: JSONL/parquet paths, globs or hf:// URIs of stream A (dclm); empty for sotu_cpython."""
    stream_b_files: tuple[str, ...] = ()
    """olmo_mix only: the files of stream B (arxiv, starcoder, wiki, pes2o, open-web-math, algebraic-stack)."""
    text_field: str = "text"
    """Record field holding a document's text (olmo_mix)."""
    id_field: str = "id"
    """Record field holding a document's id (olmo_mix); records without it get ``<file>:<line>``."""
    max_documents: int | None = None
    """Keep only the first N documents of each stream in source order (smoke runs and tests); None keeps all."""
    tokenizer_path: str | None = None
    """An existing tokenizer.json (the Nemotron tokenizer on the cluster); None trains a byte-level BPE."""
    vocab_size: int = 8192
    """Vocabulary size of the trained BPE; with ``tokenizer_path`` the file's size must match it."""
    bos_token: str = "<s>"
    """Beginning-of-document token written before every document (id 1 in the trained BPE and in Nemotron's)."""
    eos_token: str = "</s>"
    """End-of-document token written after every document (id 2 in the trained BPE and in Nemotron's)."""
    sequence_length: int = 512
    """Input tokens per training sequence; the loader emits windows of ``sequence_length + 1`` tokens."""
    mix: tuple[int, int] = (41, 50)
    """(a, period): exactly ``a`` of every ``period`` consecutive mix units come from stream A (the paper: 41, 50)."""
    mix_unit: MixUnit = MixUnit.DOCUMENT
    """Whether the schedule assigns documents (the paper's loader) or whole windows to the streams."""
    validation_fraction: float = 0.05
    """Share of document ids hashed into the frozen validation split (per stream)."""
    calibration_fraction: float = 0.02
    """Share of document ids hashed into the calibration split, disjoint from validation and train."""
    validation_windows: int = 64
    """Held-out windows evaluated at batch size 1 (the paper: 768 windows of 8,193 tokens)."""
    calibration_windows: int = 8
    """Windows of the calibration set."""
    seed: int = 42
    """Seed of the per-epoch document shuffles of the training streams."""
    shuffle: bool = True
    """Shuffle each stream's documents per epoch; False reads them in source order (the paper's streaming)."""
    shard_tokens: int = 1 << 28
    """Most tokens per memory-mapped shard file (documents are never split across shards)."""
    data_dir: str = "data"
    """Directory of the prepared corpus, tokenizer and token shards (relative to the working directory)."""
    prepare_parts: int = 1
    """Parallel jobs the preparation is split into (``ue5m3 prepare-data --part i``, then ``merge-data``); the
    prepared data are the same bytes for every count. More than one needs ``tokenizer_path`` (docs/data.md)."""

    RANGES: ClassVar[dict[str, Range]] = {
        "max_documents": Range(1, 2**40, note="documents kept per stream, null: all"),
        "vocab_size": Range(
            260, 2**32, note="tokens of the BPE, 256 bytes + PAD, BOS, EOS + merges; the paper: 131,072"
        ),
        "sequence_length": Range(1, 2**20, note="tokens per training sequence; the paper: 8,192"),
        "mix": Range(1, 2**20, note="(a, period) of the stream mix; the paper: 41, 50"),
        "validation_fraction": Range(0, 1, high_open=True, note="a share of the document ids"),
        "calibration_fraction": Range(0, 1, high_open=True, note="a share of the document ids"),
        "validation_windows": Range(0, 2**24, note="held-out windows; the paper: 768"),
        "calibration_windows": Range(0, 2**24, note="calibration windows"),
        "seed": Range(0, 2**63 - 1, note="a seed"),
        "shard_tokens": Range(1, 2**40, note="tokens per shard file; the default: 2^28"),
        "prepare_parts": Range(1, 2**14, note="parallel preparation jobs"),
    }

    def __post_init__(self) -> None:
        if not isinstance(self.corpus, Corpus):
            _fail(TypeError, "corpus", f"expected a Corpus, got {self.corpus!r}; accepted: {[c.value for c in Corpus]}")
        for key in ("stream_a_files", "stream_b_files"):
            files = getattr(self, key)
            if not isinstance(files, tuple) or not all(isinstance(f, str) and f for f in files):
                _fail(TypeError, key, f"expected a tuple of non-empty path strings, got {files!r}")
            if self.corpus is Corpus.OLMO_MIX and not files:
                _fail(ValueError, key, "olmo_mix needs the files of both streams (local paths, globs or hf:// URIs)")
            if self.corpus is Corpus.SOTU_CPYTHON and files:
                _fail(ValueError, key, f"sotu_cpython reads installed packages; leave it empty, got {files!r}")
        _check_str(self.text_field, "text_field")
        _check_str(self.id_field, "id_field")
        if self.max_documents is not None:
            _check_int(self.max_documents, "max_documents", minimum=1)
        _check_str(self.tokenizer_path, "tokenizer_path", optional=True)
        _check_int(self.vocab_size, "vocab_size", minimum=260)  # 256 byte symbols + PAD, BOS, EOS + one merge
        if self.vocab_size > 1 << 32:
            _fail(ValueError, "vocab_size", f"token ids are stored as uint32; got {self.vocab_size!r}")
        _check_str(self.bos_token, "bos_token")
        _check_str(self.eos_token, "eos_token")
        if self.bos_token == self.eos_token:
            _fail(ValueError, "eos_token", f"must differ from bos_token, both are {self.eos_token!r}")
        _check_int(self.sequence_length, "sequence_length", minimum=1)
        if not (isinstance(self.mix, tuple) and len(self.mix) == 2):
            _fail(TypeError, "mix", f"expected [a, period], got {self.mix!r}")
        _check_int(self.mix[0], "mix[0]", minimum=1)
        _check_int(self.mix[1], "mix[1]", minimum=2)
        if self.mix[0] >= self.mix[1]:
            _fail(ValueError, "mix", f"need 0 < a < period so both streams are drawn, got {list(self.mix)!r}")
        if not isinstance(self.mix_unit, MixUnit):
            _fail(TypeError, "mix_unit", f"expected one of {[m.value for m in MixUnit]}, got {self.mix_unit!r}")
        _check_fraction(self.validation_fraction, "validation_fraction")
        _check_fraction(self.calibration_fraction, "calibration_fraction")
        if self.validation_fraction + self.calibration_fraction >= 1:
            _fail(
                ValueError,
                "calibration_fraction",
                f"validation_fraction + calibration_fraction must leave a training split, got "
                f"{self.validation_fraction!r} + {self.calibration_fraction!r}",
            )
        _check_int(self.validation_windows, "validation_windows", minimum=0)
        _check_int(self.calibration_windows, "calibration_windows", minimum=0)
        if self.validation_windows and not self.validation_fraction:
            _fail(ValueError, "validation_fraction", "validation_windows > 0 needs a non-empty validation split")
        if self.calibration_windows and not self.calibration_fraction:
            _fail(ValueError, "calibration_fraction", "calibration_windows > 0 needs a non-empty calibration split")
        _check_int(self.seed, "seed", minimum=0)
        if not isinstance(self.shuffle, bool):
            _fail(TypeError, "shuffle", f"expected a bool, got {self.shuffle!r}")
        _check_int(self.shard_tokens, "shard_tokens", minimum=1)
        _check_str(self.data_dir, "data_dir")
        _check_int(self.prepare_parts, "prepare_parts", minimum=1)
        if self.prepare_parts > 1 and self.tokenizer_path is None:
            _fail(
                ValueError,
                "prepare_parts",
                f"{self.prepare_parts!r} parts need a fixed tokenizer: the BPE is trained on the whole training "
                "split, which no single part reads; set data.tokenizer_path (e.g. to the tokenizer.json of a "
                "preparation with prepare_parts: 1) or set prepare_parts: 1",
            )

    @property
    def stream_names(self) -> tuple[str, str]:
        """Names of stream A and stream B of this corpus."""
        return STREAM_NAMES[self.corpus]

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "<data config>") -> DataConfig:
        """The strict loader (:func:`ue5m3.config.load`): unknown keys, wrong types and unknown enum values are
        refused, naming ``source`` and the key path; omitted keys take the defaults above."""
        return config.load(cls, data, source=source, path="data")

    def to_dict(self) -> dict[str, Any]:
        """Plain data (str, int, float, bool, None, list) accepted by :meth:`from_dict`."""
        return config.dump(self)
