"""Files of the paper's data path that come from the Hugging Face hub, pinned: the tokenizer and the dataset revision.

The cluster config (``config/paper.yaml``) names the Nemotron-H tokenizer as a :class:`TokenizerSource`: a hub
repository, a commit, a file and optionally its SHA-256. The rule ``fetch_tokenizer`` calls :func:`fetch_tokenizer`,
which downloads that file at that commit with ``huggingface_hub`` into ``data.tokenizer_path`` and writes a record of
what it fetched (repository, commit, file, SHA-256, size). It fails closed: an unpinned revision is refused before
anything is downloaded, and a file whose SHA-256 differs from the pinned one is never written. The CPU config sets no
source (it trains its own BPE offline), so nothing is downloaded there.

:func:`unpinned_hub_uris` lists the ``hf://`` data URIs that name no commit (``hf://datasets/<org>/<name>@<commit>/...``);
the pipeline check refuses them, so the OLMo-mix files read are those of one revision.
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

__all__ = ["TokenizerSource", "fetch_tokenizer", "unpinned_hub_uris", "COMMIT"]

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
