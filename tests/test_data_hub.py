"""Tests of ue5m3.data.hub: the pinned hub tokenizer (fetched, hashed, verified, fail closed) and pinned hf:// URIs."""

from __future__ import annotations

import hashlib
import json

import pytest

from ue5m3 import cli
from ue5m3.config import ConfigError
from ue5m3.data.hub import TokenizerSource, fetch_tokenizer, hub_uris, stage_files, staged_path, unpinned_hub_uris

COMMIT = "0123456789abcdef0123456789abcdef01234567"
CONTENT = b'{"model": {"type": "BPE"}}'
DIGEST = hashlib.sha256(CONTENT).hexdigest()


def _source(**changes) -> TokenizerSource:
    fields = {"repo": "nvidia/Nemotron-H-8B-Base-8K", "revision": COMMIT, "file": "tokenizer.json", "sha256": None}
    return TokenizerSource.from_dict({**fields, **changes})


@pytest.fixture
def hub(tmp_path):
    """A stand-in for huggingface_hub.hf_hub_download serving CONTENT, recording each call."""
    calls = []

    def download(*, repo_id, filename, revision):
        calls.append((repo_id, filename, revision))
        path = tmp_path / "hub-cache" / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(CONTENT)
        return str(path)

    download.calls = calls
    return download


def test_fetch_writes_the_file_and_records_its_sha256(tmp_path, hub):
    out = tmp_path / "tokenizers" / "tokenizer.json"
    record = fetch_tokenizer(_source(), out, download=hub)
    assert out.read_bytes() == CONTENT
    assert hub.calls == [("nvidia/Nemotron-H-8B-Base-8K", "tokenizer.json", COMMIT)]
    assert record == {
        "repo": "nvidia/Nemotron-H-8B-Base-8K",
        "revision": COMMIT,
        "file": "tokenizer.json",
        "sha256": DIGEST,
        "bytes": len(CONTENT),
        "path": str(out),
        "verified": False,
    }


def test_fetch_verifies_a_pinned_sha256(tmp_path, hub):
    out = tmp_path / "tokenizer.json"
    assert fetch_tokenizer(_source(sha256=DIGEST), out, download=hub)["verified"] is True
    out.write_bytes(b"old")
    with pytest.raises(ValueError, match="nothing was written"):
        fetch_tokenizer(_source(sha256="0" * 64), out, download=hub)
    assert out.read_bytes() == b"old"


def test_fetch_refuses_an_unpinned_revision_before_downloading(tmp_path, hub):
    with pytest.raises(ValueError, match="revision is not set.*commit.*Nothing was downloaded"):
        fetch_tokenizer(_source(revision=None), tmp_path / "tokenizer.json", download=hub)
    assert hub.calls == []
    assert not (tmp_path / "tokenizer.json").exists()


@pytest.mark.parametrize(
    ("key", "value"),
    [("revision", "main"), ("revision", COMMIT[:12]), ("sha256", "abc"), ("repo", "no-owner"), ("file", "../x")],
)
def test_source_refuses_malformed_pins(key, value):
    with pytest.raises((ConfigError, ValueError), match=key):
        _source(**{key: value})


def test_source_refuses_unknown_and_missing_keys():
    with pytest.raises(ConfigError, match="unknown keys \\['branch'\\]"):
        _source(branch="main")
    with pytest.raises(ConfigError, match="missing keys \\['revision'\\]"):
        TokenizerSource.from_dict({"repo": "a/b"})


def test_fetch_tokenizer_verb(tmp_path, hub, monkeypatch, capsys):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hub)
    config = json.dumps({"repo": "a/b", "revision": COMMIT, "file": "tokenizer.json", "sha256": DIGEST})
    out, record = tmp_path / "tok.json", tmp_path / "record.json"
    assert cli.main(["fetch-tokenizer", "--config", config, "--out", str(out), "--record", str(record)]) == 0
    written = json.loads(record.read_text())
    assert (written["sha256"], written["revision"], written["verified"]) == (DIGEST, COMMIT, True)
    assert written["command"] == "fetch-tokenizer"
    assert DIGEST in capsys.readouterr().out
    unpinned = json.dumps({"repo": "a/b", "revision": None, "file": "tokenizer.json", "sha256": None})
    assert cli.main(["fetch-tokenizer", "--config", unpinned, "--out", str(out), "--record", str(record)]) == 2
    assert "revision is not set" in capsys.readouterr().err


def test_unpinned_hub_uris():
    pinned = f"hf://datasets/allenai/olmo-mix-1124@{COMMIT}/data/dclm/*.jsonl.zst"
    assert unpinned_hub_uris([pinned, "data/local/*.jsonl", "/abs/x.jsonl.gz"]) == []
    unpinned = [
        "hf://datasets/allenai/olmo-mix-1124/data/dclm/*.jsonl.zst",
        "hf://datasets/allenai/olmo-mix-1124@main/data/dclm/*.jsonl.zst",
        f"hf://datasets/allenai/olmo-mix-1124@{COMMIT[:8]}/data/x.jsonl.gz",
    ]
    assert unpinned_hub_uris(unpinned) == unpinned


# ----- hub data staged on the login node -------------------------------------------------------------------

REPO_FILES = {"data/dclm/a.jsonl.zst": b"A", "data/dclm/b.jsonl.zst": b"BB", "data/wiki/c.jsonl.gz": b"C"}


def _snapshot_download(calls: list):
    """A stand-in for huggingface_hub.snapshot_download: writes the repository's files its patterns match."""
    import fnmatch
    from pathlib import Path

    def download(*, repo_id, repo_type, revision, allow_patterns, local_dir):
        calls.append((repo_id, repo_type, revision, tuple(allow_patterns)))
        for name, content in REPO_FILES.items():
            if any(fnmatch.fnmatch(name, p) for p in allow_patterns):
                (Path(local_dir) / name).parent.mkdir(parents=True, exist_ok=True)
                (Path(local_dir) / name).write_bytes(content)
        return local_dir

    return download


def test_staging_downloads_each_pinned_uris_files_and_records_their_hashes(tmp_path):
    uris = [f"hf://datasets/allenai/olmo-mix-1124@{COMMIT}/data/dclm/*.jsonl.zst"]
    calls: list = []
    record = stage_files(uris, tmp_path / "hub", download=_snapshot_download(calls))
    assert calls == [("allenai/olmo-mix-1124", "dataset", COMMIT, ("data/dclm/*.jsonl.zst",))]
    local = staged_path(uris[0], tmp_path / "hub")
    assert local == str(tmp_path / "hub" / "allenai/olmo-mix-1124" / COMMIT / "data/dclm/*.jsonl.zst")
    files = record[uris[0]]["files"]
    assert [f["path"].rsplit("/", 1)[-1] for f in files] == ["a.jsonl.zst", "b.jsonl.zst"]
    assert [f["sha256"] for f in files] == [hashlib.sha256(b"A").hexdigest(), hashlib.sha256(b"BB").hexdigest()]
    assert record[uris[0]]["local"] == local


def test_staging_refuses_an_unpinned_or_empty_uri_before_recording_it(tmp_path):
    calls: list = []
    unpinned = "hf://datasets/allenai/olmo-mix-1124@main/data/dclm/*.jsonl.zst"
    with pytest.raises(ValueError, match="stage only pinned dataset URIs"):
        stage_files([f"hf://datasets/x/y@{COMMIT}/a.gz", unpinned], tmp_path, download=_snapshot_download(calls))
    assert calls == []  # every URI checked before anything is downloaded
    with pytest.raises(ValueError, match="matched no file of allenai/olmo-mix-1124"):
        stage_files(
            [f"hf://datasets/allenai/olmo-mix-1124@{COMMIT}/data/none/*"], tmp_path, download=_snapshot_download(calls)
        )


def test_the_preparation_jobs_read_the_staged_copies():
    from snakemake.utils import update_config

    from ue5m3 import config as configs
    from ue5m3 import pipeline
    from ue5m3.pipeline import jobs

    raw = configs.read_yaml("config/config.yaml")
    update_config(raw, configs.read_yaml("config/paper.yaml"))
    cfg = pipeline.load(raw, source="paper")
    data = jobs.prepare_data_settings(cfg)
    assert hub_uris(cfg.data) and not any(
        u.startswith("hf://") for u in data["stream_a_files"] + data["stream_b_files"]
    )
    assert data["stream_a_files"][0].startswith(jobs.staging_dir(cfg) + "/allenai/olmo-mix-1124/")
