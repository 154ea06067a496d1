"""Files of the paper's data path that come from the Hugging Face hub, pinned: the tokenizer and the dataset revision.

The cluster config (``config/paper.yaml``) names the Nemotron-H tokenizer as a :class:`TokenizerSource`: a hub
repository, a commit, a file and optionally its SHA-256. The rule ``fetch_tokenizer`` calls :func:`fetch_tokenizer`,
which downloads that file at that commit with ``huggingface_hub`` into ``data.tokenizer_path`` and writes a record of
what it fetched (repository, commit, file, SHA-256, size). It fails closed: an unpinned revision is refused before
anything is downloaded, and a file whose SHA-256 differs from the pinned one is never written. The CPU config sets no
source (it trains its own BPE offline), so nothing is downloaded there.

:func:`unpinned_hub_uris` lists the ``hf://`` data URIs that name no commit (``hf://datasets/<org>/<name>@<commit>/...``);
the pipeline check refuses them, so the OLMo-mix files read are those of one revision.

:func:`stage_files` (rule ``stage_data``, a local rule: compute nodes may have no internet) downloads the files every
pinned ``hf://`` data URI names into ``<data_dir>/hub`` and records each file's SHA-256; the preparation jobs then read
those local copies (:func:`staged_path` maps each URI to its local glob), never the hub.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ue5m3 import artifacts, config

__all__ = [
    "TokenizerSource",
    "fetch_tokenizer",
    "unpinned_hub_uris",
    "hub_uris",
    "staged_path",
    "stage_files",
    "COMMIT",
]

COMMIT = re.compile(r"[0-9a-f]{40}")
"""A full git commit hash: the only revision accepted (a branch or tag can move)."""
_SHA256 = re.compile(r"[0-9a-f]{64}")
_REPO = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_HUB_URI = re.compile(r"hf://(?:datasets/|spaces/)?[\w.-]+/[\w.-]+(@[^/]*)?(/.*)?")
_INSTALL_HINT = "pip install 'ue5m3[hub]' (or pip install huggingface_hub)"


@dataclass(frozen=True, kw_only=True)
class TokenizerSource:
    """A tokenizer file on the Hugging Face hub, pinned (the ``tokenizer_source`` section of the pipeline config)."""

    repo: str
    """Model repository, e.g. ``nvidia/Nemotron-H-8B-Base-8K``."""
    revision: str | None
    """The commit to fetch (40 hex digits). None is accepted in a config but refused by :func:`fetch_tokenizer`."""
    file: str = "tokenizer.json"
    """Path of the tokenizer file inside the repository."""
    sha256: str | None = None
    """Expected SHA-256 of the file (64 hex digits), checked before it is written; None records it unchecked."""

    def __post_init__(self) -> None:
        if not isinstance(self.repo, str) or not _REPO.fullmatch(self.repo):
            raise ValueError(f"tokenizer_source.repo: expected <owner>/<name>, got {self.repo!r}")
        if self.revision is not None and not (isinstance(self.revision, str) and COMMIT.fullmatch(self.revision)):
            raise ValueError(
                f"tokenizer_source.revision: expected a full commit hash (40 lower-case hex digits; a branch or tag "
                f"can move), got {self.revision!r}"
            )
        if not isinstance(self.file, str) or not self.file or self.file.startswith("/") or ".." in self.file.split("/"):
            raise ValueError(f"tokenizer_source.file: expected a path inside the repository, got {self.file!r}")
        if self.sha256 is not None and not (isinstance(self.sha256, str) and _SHA256.fullmatch(self.sha256)):
            raise ValueError(f"tokenizer_source.sha256: expected 64 lower-case hex digits, got {self.sha256!r}")

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "<tokenizer_source>") -> TokenizerSource:
        """The strict loader: unknown, missing and mistyped keys are refused, naming ``source``."""
        return config.load(cls, data, source=source, path="tokenizer_source")

    @property
    def url(self) -> str:
        return f"https://huggingface.co/{self.repo}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_tokenizer(source: TokenizerSource, out: str | Path, *, download: Any = None) -> dict[str, Any]:
    """Download ``source`` into ``out`` (atomically) and return the record of what was fetched.

    Args:
        source: the pinned file.
        out: where the tokenizer file goes (``data.tokenizer_path``).
        download: ``huggingface_hub.hf_hub_download`` or a stand-in with its signature (tests).

    Returns:
        ``{"repo", "revision", "file", "sha256", "bytes", "path", "verified"}``; ``verified`` says whether the SHA-256
        was checked against ``source.sha256``.

    Raises:
        ValueError: no revision pinned, or the downloaded file's SHA-256 differs from ``source.sha256`` (``out`` is
            then left as it was).
        ImportError: ``huggingface_hub`` is not installed.
    """
    if source.revision is None:
        raise ValueError(
            f"tokenizer_source.revision is not set: pin it to a commit of {source.url} (the full 40-digit hash of "
            f"the commit you want, listed at {source.url}/commits/main), so that every run tokenizes with the same "
            "file; set tokenizer_source.sha256 too once you know it. Nothing was downloaded."
        )
    if download is None:
        try:
            from huggingface_hub import hf_hub_download as download
        except ImportError as exc:
            raise ImportError(f"fetching the tokenizer from the hub needs huggingface_hub; {_INSTALL_HINT}") from exc
    cached = Path(download(repo_id=source.repo, filename=source.file, revision=source.revision))
    digest = _sha256(cached)
    if source.sha256 is not None and digest != source.sha256:
        raise ValueError(
            f"{source.repo}@{source.revision}/{source.file} has SHA-256 {digest}, but tokenizer_source.sha256 pins "
            f"{source.sha256}; nothing was written"
        )
    out = Path(out)
    with artifacts.atomic_path(out) as tmp:
        shutil.copyfile(cached, tmp)
    return {
        "repo": source.repo,
        "revision": source.revision,
        "file": source.file,
        "sha256": digest,
        "bytes": out.stat().st_size,
        "path": str(out),
        "verified": source.sha256 is not None,
    }


def unpinned_hub_uris(uris: Iterable[str]) -> list[str]:
    """The ``hf://`` URIs among ``uris`` that name no commit (``@<40 hex digits>`` after the repository)."""
    unpinned = []
    for uri in uris:
        if not uri.startswith("hf://"):
            continue
        match = _HUB_URI.fullmatch(uri)
        revision = match.group(1) if match else None
        if revision is None or not COMMIT.fullmatch(revision[1:]):
            unpinned.append(uri)
    return unpinned


_DATA_URI = re.compile(r"hf://datasets/(?P<repo>[\w.-]+/[\w.-]+)@(?P<revision>[0-9a-f]{40})/(?P<pattern>.+)")


def hub_uris(data: Any) -> list[str]:
    """The ``hf://`` URIs among a data config's stream files (a :class:`~ue5m3.data.config.DataConfig`)."""
    return [u for key in ("stream_a_files", "stream_b_files") for u in getattr(data, key) if u.startswith("hf://")]


def _parse(uri: str) -> re.Match[str]:
    found = _DATA_URI.fullmatch(uri)
    if found is None:
        raise ValueError(
            f"{uri!r}: stage only pinned dataset URIs, hf://datasets/<owner>/<name>@<40-digit commit>/<path or glob>"
        )
    return found


def staged_path(uri: str, staging_dir: str | Path) -> str:
    """Where :func:`stage_files` puts the files of ``uri``: the same path or glob under ``staging_dir`` (one folder
    per repository and commit)."""
    found = _parse(uri)
    return str(Path(staging_dir) / found["repo"] / found["revision"] / found["pattern"])


def stage_files(uris: Iterable[str], staging_dir: str | Path, *, download: Any = None) -> dict[str, Any]:
    """Download the files of each pinned dataset URI into ``staging_dir`` (:func:`staged_path`) and return a record
    of them: per URI, each local file with its size and SHA-256.

    Args:
        uris: ``hf://datasets/<owner>/<name>@<commit>/<path or glob>`` URIs.
        staging_dir: the local folder the preparation reads (``<data_dir>/hub``).
        download: ``huggingface_hub.snapshot_download`` or a stand-in with its signature (tests).

    Raises:
        ValueError: a URI that names no commit, or one whose pattern matches no file of the repository at that commit
            (nothing of it is recorded).
        ImportError: ``huggingface_hub`` is not installed.
    """
    uris = list(uris)
    parsed = [_parse(uri) for uri in uris]  # every URI checked before anything is downloaded
    if download is None:
        try:
            from huggingface_hub import snapshot_download as download
        except ImportError as exc:
            raise ImportError(f"staging hub data needs huggingface_hub; {_INSTALL_HINT}") from exc
    record: dict[str, Any] = {}
    for uri, found in zip(uris, parsed, strict=True):
        local = Path(staging_dir) / found["repo"] / found["revision"]
        download(
            repo_id=found["repo"],
            repo_type="dataset",
            revision=found["revision"],
            allow_patterns=[found["pattern"]],
            local_dir=str(local),
        )
        files = sorted(p for p in local.glob(found["pattern"]) if p.is_file())
        if not files:
            raise ValueError(f"{uri!r} matched no file of {found['repo']} at {found['revision']}")
        record[uri] = {
            "local": staged_path(uri, staging_dir),
            "files": [{"path": str(p), "bytes": p.stat().st_size, "sha256": _sha256(p)} for p in files],
        }
    return record
