"""Tests of ue5m3.data.parts: the data preparation split into parts of the input units and merged.

The claim: for any part count (1, 2, 3, more parts than input files) the merged corpus files, token shards,
indexes and corpus manifest are the same bytes as one job's; the merge refuses a missing, repeated or foreign part
and a failure writes nothing. Inputs are the OLMo-mix fixture records and small record files written here, with
drops across files (repeated texts, a repeated id, blank texts) and ``max_documents`` cuts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import pytest

from helpers.data import fixture_config
from ue5m3.data import (
    DataConfig,
    build_data,
    data_paths,
    list_units,
    merge_parts,
    open_data,
    prepare_corpus,
    prepare_part,
)
from ue5m3.data import corpus as corpus_module
from ue5m3.data import parts as parts_module
from ue5m3.data.parts import part_dir, part_manifest_path, units_of_part


def _tree(root: str | Path) -> dict[str, str]:
    """SHA-256 of every prepared file under a data directory (the parts' own files left out)."""
    root = Path(root)
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.relative_to(root).parts[0] != "parts"
    }


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> DataConfig:
    """One job with the BPE trained on the fixture records: its tokenizer.json is the fixed tokenizer below."""
    config = fixture_config(tmp_path_factory.mktemp("trained"))
    build_data(config)
    return config


def _fixed(config: DataConfig, tmp_path: Path, name: str, **overrides) -> DataConfig:
    tokenizer = str(data_paths(config).tokenizer)
    return dataclasses.replace(config, tokenizer_path=tokenizer, data_dir=str(tmp_path / name), **overrides)


@pytest.fixture(scope="module")
def single(trained, tmp_path_factory) -> DataConfig:
    """The reference: one job (prepare_parts 1) with the fixed tokenizer."""
    config = _fixed(trained, tmp_path_factory.mktemp("single"), "data")
    build_data(config)
    return config


# ----- the same bytes for every part count -------------------------------------------------------------------


@pytest.mark.parametrize("parts", [1, 2, 3, 7])  # 7 > the 4 fixture files: three parts are empty
def test_merged_data_are_the_bytes_of_one_job_for_every_part_count(single, tmp_path, parts):
    config = dataclasses.replace(single, data_dir=str(tmp_path / "data"), prepare_parts=parts)
    build_data(config)
    assert _tree(config.data_dir) == _tree(single.data_dir)
    manifest = data_paths(config).corpus / "manifest.json"
    assert manifest.read_bytes() == (data_paths(single).corpus / "manifest.json").read_bytes()
    opened, reference = open_data(config), open_data(single)
    assert opened.validation.sha256() == reference.validation.sha256()
    assert (opened.train.next_batch(4)[0] == reference.train.next_batch(4)[0]).all()


def test_a_trained_tokenizer_gives_the_shards_of_that_tokenizer_given_as_a_file(trained, single):
    tree = _tree(trained.data_dir)
    assert tree.pop("tokenizer.json") == hashlib.sha256(data_paths(trained).tokenizer.read_bytes()).hexdigest()
    assert tree == _tree(single.data_dir)


def test_parts_take_the_units_round_robin_and_more_parts_than_units_leave_some_empty(single):
    units = list_units(single)
    assert [u.index for u in units] == [0, 1, 2, 3]
    assert [[u.index for u in units_of_part(units, part, 3)] for part in range(3)] == [[0, 3], [1], [2]]
    assert [len(units_of_part(units, part, 7)) for part in range(7)] == [1, 1, 1, 1, 0, 0, 0]


def _records(path: Path, records: list[tuple[str, str]]) -> str:
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in records))
    return str(path)


@pytest.fixture
def tricky(trained, tmp_path) -> DataConfig:
    """Record files whose drops cross files and streams: a text repeated in a later file of stream A and in
    stream B, a text repeated within one file, blank texts."""
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    text = [f"{w} document about {w}s and {words[(i + 3) % len(words)]}s." for i, w in enumerate(words)]
    a = [
        _records(tmp_path / "a0.jsonl", [("a0", text[0]), ("a1", text[1]), ("a2", text[2]), ("a3", " ")]),
        _records(tmp_path / "a1.jsonl", [("a4", text[3]), ("a5", text[0]), ("a6", text[4]), ("a7", text[4])]),
        _records(tmp_path / "a2.jsonl", [("a8", text[5]), ("a9", text[1]), ("a10", text[6])]),
    ]
    b = [
        _records(tmp_path / "b0.jsonl", [("b0", text[2]), ("b1", text[7]), ("b2", "\n")]),
        _records(tmp_path / "b1.jsonl", [("b3", text[8]), ("b4", text[3]), ("b5", text[9]), ("b6", text[10])]),
    ]
    return _fixed(trained, tmp_path, "ref", stream_a_files=tuple(a), stream_b_files=tuple(b))


@pytest.mark.parametrize("max_documents", [None, 6, 2])
def test_drops_across_files_and_max_documents_give_one_jobs_bytes_for_every_part_count(tricky, tmp_path, max_documents):
    reference = dataclasses.replace(tricky, max_documents=max_documents)
    build_data(reference)
    expected = _tree(reference.data_dir)
    manifest = json.loads((data_paths(reference).corpus / "manifest.json").read_text())
    # What one job drops, in source order: the merge has to reproduce it from the parts' records.
    corpus = json.loads(prepare_corpus(reference, tmp_path / "corpus_only").read_text())
    assert manifest["dropped"] == corpus["dropped"] and manifest["files"] == corpus["files"]
    if max_documents is None:
        assert manifest["dropped"] == {
            "duplicate_text": [["a5", "a0"], ["a7", "a6"], ["a9", "a1"], ["b0", "a2"], ["b4", "a4"]],
            "empty": ["a3", "b2"],
            "eval_overlap": [],
        }
    for parts in (2, 3, 4, 9):
        config = dataclasses.replace(reference, data_dir=str(tmp_path / f"p{parts}"), prepare_parts=parts)
        messages: list[str] = []
        build_data(config, log=messages.append)
        assert _tree(config.data_dir) == expected, parts
        if parts == 2:  # units 1 (a5 repeats a0) and 3 (b0 repeats a2) are rewritten by the merge
            assert "; 0 units lose documents" not in " ".join(messages)


# ----- the merge refuses what is not one complete preparation ---------------------------------------------------


@pytest.fixture
def two_parts(single, tmp_path) -> tuple[DataConfig, list[Path]]:
    config = dataclasses.replace(single, data_dir=str(tmp_path / "data"), prepare_parts=2)
    manifests = [tmp_path / f"part{part}.json" for part in range(2)]
    for part, path in enumerate(manifests):
        prepare_part(config, part, path)
    return config, manifests


def _nothing_prepared(config: DataConfig) -> bool:
    root = Path(config.data_dir)
    return sorted(p.name for p in root.iterdir()) == ["parts"]


def test_the_merge_refuses_a_missing_part_naming_it(two_parts):
    config, manifests = two_parts
    with pytest.raises(ValueError, match=r"part\(s\) \[1\] of 2 are missing .*part0\.json"):
        merge_parts(config, manifests[:1])
    with pytest.raises(FileNotFoundError, match=r"part manifest '.*part9\.json' does not exist"):
        merge_parts(config, [manifests[0], manifests[1].with_name("part9.json")])
    assert _nothing_prepared(config)


def test_the_merge_refuses_a_part_given_twice(two_parts, tmp_path):
    config, manifests = two_parts
    copy = tmp_path / "copy_of_part0.json"
    shutil.copyfile(manifests[0], copy)
    with pytest.raises(ValueError, match=r"part 0 of 2 is given twice: '.*part0\.json' and '.*copy_of_part0\.json'"):
        merge_parts(config, [manifests[0], copy, manifests[1]])
    assert _nothing_prepared(config)


def test_the_merge_refuses_a_part_of_another_config_or_part_count(two_parts, tmp_path):
    config, manifests = two_parts
    other = tmp_path / "other.json"
    prepare_part(dataclasses.replace(config, seed=7), 1, other)
    with pytest.raises(
        ValueError, match=r"'.*other\.json' was prepared with another data config \(differs in data\.seed"
    ):
        merge_parts(config, [manifests[0], other])
    # That run rewrote part 1's directory: the original manifest no longer describes it.
    with pytest.raises(ValueError, match=r"'.*part1\.json' does not describe the files in .*part_00001_of_00002"):
        merge_parts(config, manifests)
    three = dataclasses.replace(config, prepare_parts=3)
    prepare_part(three, 1, tmp_path / "of3.json")
    with pytest.raises(ValueError, match=r"is part 1 of 3 parts, but data.prepare_parts is 2"):
        merge_parts(config, [manifests[0], tmp_path / "of3.json"])
    assert _nothing_prepared(config)


def test_the_merge_refuses_parts_of_another_tokenizer(single, tmp_path):
    tokenizer = tmp_path / "tokenizer.json"
    shutil.copyfile(single.tokenizer_path, tokenizer)
    config = dataclasses.replace(
        single, tokenizer_path=str(tokenizer), data_dir=str(tmp_path / "data"), prepare_parts=2
    )
    manifests = [tmp_path / f"part{part}.json" for part in range(2)]
    for part, path in enumerate(manifests):
        prepare_part(config, part, path)
    tokenizer.write_text(tokenizer.read_text() + "\n")  # the file changed after the parts were tokenized
    with pytest.raises(ValueError, match=r"the parts were tokenized with tokenizer SHA-256 [0-9a-f]{64}, but .*has"):
        merge_parts(config, manifests)
    assert _nothing_prepared(config)


def test_a_document_id_in_two_parts_is_refused_by_the_merge_and_nothing_is_written(trained, tmp_path):
    a = _records(tmp_path / "a.jsonl", [("x", "first text"), ("y", "second text")])
    b = _records(tmp_path / "b.jsonl", [("x", "another text")])
    config = _fixed(trained, tmp_path, "data", stream_a_files=(a,), stream_b_files=(b,), prepare_parts=2)
    with pytest.raises(ValueError, match=r"document id 'x' occurs twice .*again in .*b\.jsonl"):
        build_data(config)
    assert _nothing_prepared(config)


# ----- nothing partial on failure ---------------------------------------------------------------------------


def test_a_failing_part_leaves_its_previous_files_and_no_temporary_ones(two_parts, monkeypatch):
    config, manifests = two_parts
    before = {p: p.read_bytes() for p in part_dir(config, 1).rglob("*") if p.is_file()}

    def failing(config, unit):
        yield from ()
        raise OSError("disk vanished")

    monkeypatch.setattr(corpus_module, "unit_documents", failing)
    manifests[1].unlink()
    with pytest.raises(OSError, match="disk vanished"):
        prepare_part(config, 1, manifests[1])
    assert not manifests[1].exists()
    assert {p: p.read_bytes() for p in part_dir(config, 1).rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in part_dir(config, 1).parent.iterdir()) == [
        "part_00000_of_00002",
        "part_00001_of_00002",
    ]


def test_a_failing_merge_leaves_the_previous_prepared_data(two_parts, monkeypatch):
    config, manifests = two_parts
    merge_parts(config, manifests)
    before = _tree(config.data_dir)

    def failing(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(parts_module, "index_record", failing)
    with pytest.raises(OSError, match="disk full"):
        merge_parts(config, manifests)
    assert _tree(config.data_dir) == before
    assert not [p for p in Path(config.data_dir).iterdir() if p.name.startswith(".")]


def test_the_merge_refuses_a_part_whose_files_are_gone(two_parts):
    config, manifests = two_parts
    shard = next((part_dir(config, 1) / "tokens").rglob("*.bin"))
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=rf"{shard.name}' of part 1 is missing; prepare that part again"):
        merge_parts(config, manifests)
    assert _nothing_prepared(config)


def test_a_merge_can_run_again_and_a_part_outside_the_range_is_refused(two_parts):
    config, manifests = two_parts
    merge_parts(config, manifests)
    first = _tree(config.data_dir)
    merge_parts(config, manifests)  # the parts stay intact: the merged files are links to them
    assert _tree(config.data_dir) == first
    with pytest.raises(ValueError, match=r"part 2 is not one of the 2 parts of data.prepare_parts; accepted: 0 .. 1"):
        prepare_part(config, 2, part_manifest_path(config, 2))
