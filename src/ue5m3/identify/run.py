"""Pipeline steps of the identification: write a probe corpus, record an oracle, fit and write the tables.

Each step reads and writes files atomically with provenance; ``ue5m3 make-probes``, ``ue5m3 record-oracle`` and
``ue5m3 fit-emulator`` are thin wrappers around these functions.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ue5m3.artifacts import provenance, write_csv, write_json
from ue5m3.identify.candidates import candidate_grid, parse
from ue5m3.identify.corpus import Corpus, make_corpus
from ue5m3.identify.fit import fit
from ue5m3.identify.oracles import make_oracle
from ue5m3.identify.probes import CorpusConfig
from ue5m3.training.checkpoint import file_sha256

__all__ = ["CANDIDATE_KEYS", "write_corpus", "fit_emulator"]

CANDIDATE_KEYS = ("slice_widths", "partial_bits", "roundings", "promotions", "final_grids", "extra")


def write_corpus(
    cfg: CorpusConfig,
    out: str | os.PathLike[str],
    *,
    witness_run: str | os.PathLike[str] | None = None,
    witness_module: str | None = None,
    witness_step: int | None = None,
    witness_sequences: int = 8,
) -> Path:
    """Make every probe family (witnesses from ``witness_module`` of a run's checkpoint when given) and save."""
    witness, info = None, None
    if witness_run is not None:
        if not witness_module:
            raise ValueError("a witness run needs the name of the linear whose GEMM to mine (witness_module)")
        from ue5m3.identify.capture import capture_linear  # noqa: PLC0415

        *witness, info = capture_linear(witness_run, witness_module, step=witness_step, sequences=witness_sequences)
    record = provenance("make-probes", asdict(cfg), witness_source=info)
    corpus = make_corpus(cfg, witness_gemm=tuple(witness) if witness else None, provenance=record)
    return corpus.save(out)


def _recovered(hidden: str, identified: Sequence[str], corpus: Corpus) -> bool:
    """The fit found the hidden model: it is identified, and so is nothing but its provable twins."""
    blocks = {probe.block for probe in corpus.probes.values()}
    twin = parse(hidden)
    return hidden in identified and all(
        all(parse(name).twin_of(twin, block) for block in blocks) for name in identified
    )


def fit_emulator(
    corpus_path: str | os.PathLike[str],
    oracle_spec: str,
    out_dir: str | os.PathLike[str],
    *,
    candidates: Mapping[str, Sequence[Any]] | None = None,
    progress: bool = True,
) -> dict[str, Path]:
    """Fit the candidate grid against an oracle on a saved corpus; write matches.csv, tables.csv, summary.json.

    Args:
        corpus_path: a corpus written by :func:`write_corpus`.
        oracle_spec: see :func:`.oracles.make_oracle` (``emulator:<candidate>``, ``recorded:<file>``, ...).
        out_dir: directory for the three files.
        candidates: keyword arguments of :func:`.candidates.candidate_grid` (keys :data:`CANDIDATE_KEYS`).
    """
    unknown = set(candidates or {}) - set(CANDIDATE_KEYS)
    if unknown:
        raise ValueError(f"unknown candidate-grid keys {sorted(unknown)}; known: {list(CANDIDATE_KEYS)}")
    corpus = Corpus.load(corpus_path)
    oracle = make_oracle(oracle_spec, corpus_path=corpus_path)
    grid = candidate_grid(**dict(candidates or {}))
    table = fit(corpus, oracle, grid, progress=progress)
    out_dir = Path(out_dir)
    paths = {name: out_dir / name for name in ("matches.csv", "tables.csv", "summary.json")}
    write_csv(paths["matches.csv"], table.rows(), ["candidate", "family", "passed", "total"])
    write_csv(paths["tables.csv"], table.paper_tables(), ["experiment", "variant", "candidate", "passed", "total"])
    identified, best = table.identified(), table.best()
    described = table.oracle.get("recorded", table.oracle)  # a recording says what it recorded
    hidden = described.get("hidden_candidate")
    ranking = sorted(table.candidates, key=lambda name: -table.score(name))[:12]
    summary = {
        "oracle": table.oracle,
        "corpus": {
            "path": str(corpus_path),
            "sha256": file_sha256(corpus_path),
            "config": asdict(corpus.config),
            "order_base": corpus.provenance.get("order_base"),
        },
        "cells": dict(table.total),
        "candidates": len(grid),
        "identified": identified,
        "best": best,
        "top": [{"candidate": name, "passed": table.score(name), "total": table.cells} for name in ranking],
        "hidden": hidden,
        "recovered": None if hidden is None else _recovered(hidden, identified, corpus),
        "provenance": provenance("fit-emulator", {"oracle": oracle_spec, "candidates": dict(candidates or {})}),
    }
    write_json(paths["summary.json"], summary)
    return paths
