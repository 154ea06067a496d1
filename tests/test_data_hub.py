"""Tests of ue5m3.data.hub: the pinned hub tokenizer (fetched, hashed, verified, fail closed) and pinned hf:// URIs."""

from __future__ import annotations

import hashlib
import json

import pytest

from ue5m3 import cli
from ue5m3.config import ConfigError
from ue5m3.data.hub import TokenizerSource, fetch_tokenizer, unpinned_hub_uris

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
