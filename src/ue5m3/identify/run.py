"""Pipeline steps of the identification: write a probe corpus, record an oracle, fit and write the tables.

Each step reads and writes files atomically with provenance; ``ue5m3 make-probes``, ``ue5m3 record-oracle`` and
``ue5m3 fit-emulator`` are thin wrappers around these functions.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

from ue5m3 import config
from ue5m3.artifacts import provenance, write_csv, write_json
from ue5m3.config import Range
from ue5m3.identify.candidates import CandidateGrid, parse
from ue5m3.identify.corpus import Corpus, make_corpus
from ue5m3.identify.fit import fit
from ue5m3.identify.oracles import make_oracle
from ue5m3.identify.probes import CorpusConfig
from ue5m3.training.checkpoint import file_sha256

__all__ = ["WitnessConfig", "ProbesConfig", "write_corpus", "fit_emulator"]


@dataclass(frozen=True, kw_only=True)
class WitnessConfig:
    """Which GEMM of a trained run the witness probes are mined from (the run itself is ``--witness-run``).

    Attributes:
        module: the linear whose forward GEMM is mined (e.g. the last MLP down projection).
        sequences: validation windows fed through the model to capture its operands.
        step: checkpoint step; null: the newest.
    """

    module: str
    sequences: int = 8
    step: int | None = None

    RANGES: ClassVar[dict[str, Range]] = {
        "sequences": Range(1, 2**20, note="validation windows fed through the model"),
        "step": Range(1, 10**7, note="a checkpoint step, null: the newest"),
    }

    def __post_init__(self) -> None:
        if not self.module:
            raise ValueError("module: the name of a linear of the witness run's model, got ''")
        if self.sequences < 1:
            raise ValueError(f"sequences: a positive int, got {self.sequences!r}")


@dataclass(frozen=True, kw_only=True)
class ProbesConfig:
    """Settings of ``ue5m3 make-probes``: the corpus and, when a witness run is given, its witness GEMM.

    Attributes:
        corpus: sizes and seed of the probe families (the pipeline's ``identification.corpora.<name>``).
        witness: the witness GEMM (the pipeline's ``identification.witness``); null: no witness probes.
    """

    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    witness: WitnessConfig | None = None


def write_corpus(
    cfg: ProbesConfig, out: str | os.PathLike[str], *, witness_run: str | os.PathLike[str] | None = None
) -> Path:
    """Make every probe family (witnesses from ``cfg.witness`` of a run's checkpoint when ``witness_run`` is given)
    and save the corpus to ``out``."""
    witness, info = None, None
    if (witness_run is None) != (cfg.witness is None):
        raise ValueError(
            "a witness run and the witness settings come together: give both --witness-run and the config's "
            f"'witness' (got witness_run={witness_run!r}, witness={cfg.witness!r})"
        )
    if witness_run is not None:
        from ue5m3.identify.capture import capture_linear  # noqa: PLC0415

        w = cfg.witness
        *witness, info = capture_linear(witness_run, w.module, step=w.step, sequences=w.sequences)
    record = provenance("make-probes", asdict(cfg.corpus), witness_source=info)
    corpus = make_corpus(cfg.corpus, witness_gemm=tuple(witness) if witness else None, provenance=record)
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
    candidates: CandidateGrid | None = None,
    progress: bool = True,
) -> dict[str, Path]:
    """Fit the candidate grid against an oracle on a saved corpus; write matches.csv, tables.csv, summary.json.

    Args:
        corpus_path: a corpus written by :func:`write_corpus`.
        oracle_spec: see :func:`.oracles.make_oracle` (``emulator:<candidate>``, ``recorded:<file>``, ...).
        out_dir: directory for the three files.
        candidates: the candidate grid (its defaults when None).
    """
    candidates = candidates if candidates is not None else CandidateGrid()
    corpus = Corpus.load(corpus_path)
    oracle = make_oracle(oracle_spec, corpus_path=corpus_path)
    grid = candidates.candidates()
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
        "identified_hardware_models": table.identified_models(),
        "best": best,
        "top": [{"candidate": name, "passed": table.score(name), "total": table.cells} for name in ranking],
        "hidden": hidden,
        "recovered": None if hidden is None else _recovered(hidden, identified, corpus),
        "provenance": provenance("fit-emulator", {"oracle": oracle_spec, "candidates": config.dump(candidates)}),
    }
    write_json(paths["summary.json"], summary)
    return paths
