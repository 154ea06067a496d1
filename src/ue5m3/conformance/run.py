"""The conformance stage: every operation of :data:`~ue5m3.conformance.operations.OPERATIONS` on the shared corpus,
one judged cell per (operation, peer), written with the peers' versions.

:func:`run` writes, under ``out_dir``: ``conformance.csv`` (the matrix, one row per cell: verdict, detail, elements
compared, differing and excluded, the known differences that explain the differing ones, the counterexample's file,
the peer's version and whether its own code or a transcription ran), ``conformance.json`` (provenance: the config,
the corpus's SHA-256, every peer's version or "not installed", the known differences' causes, the wall time) and
``counterexamples/<operation>__<peer>.pt`` (``torch.load``: the smallest differing case, both results, the first
differing element).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

import torch

from ue5m3.artifacts import provenance, write_csv, write_json
from ue5m3.config import Range
from ue5m3.conformance.corpus import Case, corpus_sha256, make_corpus
from ue5m3.conformance.judge import INSTALL_HINT, Cell, Verdict, compare, save_counterexample
from ue5m3.conformance.known import KNOWN
from ue5m3.conformance.operations import OPERATIONS, Operation, Sampled

__all__ = ["ConformanceConfig", "run", "peer_version", "COLUMNS"]

COLUMNS = [f for f in Cell.__dataclass_fields__]


@dataclass(frozen=True, kw_only=True)
class ConformanceConfig:
    """Settings of ``ue5m3 conformance`` (the pipeline's ``conformance`` section).

    Attributes:
        seed: seed of the corpus's random tensors.
        rows: rows of the corpus's random tensors.
        cols: columns of the corpus's random tensors (a multiple of 64, so every block size and GEMM takes them).
        ulp_tolerance: a cell that is not bit-exact but whose every element is within this many FP32 ulp is
            ``within_ulp`` (0: only bit-exact counts as agreement).
        p_value_threshold: a stochastic cell is ``equal_in_distribution`` when its test's p-value is at least this.
    """

    seed: int = 20260721
    rows: int = 64
    cols: int = 256
    ulp_tolerance: int = 0
    p_value_threshold: float = 0.01

    RANGES: ClassVar[dict[str, Range]] = {
        "seed": Range(0, 2**63 - 1, note="a seed"),
        "rows": Range(2, 2**16, note="rows of the random tensors"),
        "cols": Range(64, 2**16, note="columns of the random tensors, a multiple of 64"),
        "ulp_tolerance": Range(0, 2**23, note="FP32 ulps, 0: bit-exact only"),
        "p_value_threshold": Range(0, 1, low_open=True, high_open=True, note="a p-value threshold; the default: 0.01"),
    }

    def __post_init__(self) -> None:
        if self.rows < 2 or self.cols < 64 or self.cols % 64:
            raise ValueError(f"rows >= 2 and cols a positive multiple of 64, got {self.rows!r} x {self.cols!r}")
        if self.ulp_tolerance < 0:
            raise ValueError(f"ulp_tolerance: a non-negative int, got {self.ulp_tolerance!r}")
        if not 0 < self.p_value_threshold < 1:
            raise ValueError(f"p_value_threshold: in (0, 1), got {self.p_value_threshold!r}")


def peer_version(distribution: str) -> str | None:
    """The installed version of a peer's distribution, or None."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").lower()


def _cell(op: Operation, cfg: ConformanceConfig, cases: list[Case], directory: Path) -> Cell:
    version = peer_version(op.peer) or ""
    cell = Cell(operation=op.name, peer=op.peer, verdict=Verdict.BIT_EXACT, peer_version=version, source=op.source)
    if op.module and importlib.util.find_spec(op.module) is None:
        cell.verdict, cell.detail = Verdict.NOT_INSTALLED, f"not installed ({INSTALL_HINT})"
        return cell
    started = time.perf_counter()
    differing_cases, worst, causes, unexplained, excluded_because = [], 0.0, set(), 0, set()
    for case in cases:
        try:
            outcome = op.function(case)
        except Exception as err:  # a peer that fails is a cell that says so, never a stage that stops
            cell.verdict, cell.detail = Verdict.NOT_RUN, f"error on case {case.name!r}: {type(err).__name__}: {err}"
            cell.seconds = round(time.perf_counter() - started, 3)
            return cell
        if outcome is None:
            continue
        if isinstance(outcome, Sampled):
            passed = outcome.p_value >= cfg.p_value_threshold
            cell.verdict = Verdict.EQUAL_IN_DISTRIBUTION if passed else Verdict.DIFFERENT
            cell.detail = f"{outcome.test}: statistic {outcome.statistic:.1f}, p = {outcome.p_value:.3g}"
            cell.elements += 1
            continue
        result = compare(outcome.ours, outcome.theirs, outcome.excluded)
        cell.elements += result.elements
        if outcome.excluded is not None and bool(outcome.excluded.any()):
            cell.excluded += int(outcome.excluded.sum())
            excluded_because.add(outcome.excluded_because)
        count = int(result.differing.sum())
        if count:
            worst = max(worst, result.worst_ulp)
            cell.differing += count
            remaining = result.differing.clone()
            for known, mask in outcome.explained.items():
                hit = result.differing & mask.reshape(-1)
                if bool(hit.any()):
                    causes.add(known)
                    remaining &= ~mask.reshape(-1)
            unexplained += int(remaining.sum())
            differing_cases.append((case, outcome, result))
    cell.seconds = round(time.perf_counter() - started, 3)
    if cell.verdict is not Verdict.BIT_EXACT:  # a stochastic cell is judged by its test
        return cell
    if excluded_because:
        cell.detail = f"excluded where the peer's arithmetic is undefined: {', '.join(sorted(excluded_because))}"
    if not cell.differing:
        return cell
    if worst <= cfg.ulp_tolerance:
        cell.verdict = Verdict.WITHIN_ULP
    else:
        cell.verdict = Verdict.DIFFERENT
    cell.detail = "; ".join(filter(None, [f"max {worst:g} ulp", cell.detail]))
    cell.known_difference = ", ".join(sorted(causes)) + (f"; unexplained: {unexplained}" if unexplained else "")
    case, outcome, result = min(differing_cases, key=lambda item: item[0].x.numel())
    first = int(torch.nonzero(result.differing)[0])
    cell.counterexample = save_counterexample(
        directory,
        f"{_slug(op.name)}__{_slug(op.peer)}",
        {
            "operation": op.name,
            "peer": op.peer,
            "peer_version": version,
            "case": case.name,
            "input": case.x,
            "ours": outcome.ours,
            "theirs": outcome.theirs,
            "first_differing_index": first,
            "note": "ours/theirs are the flat comparison (block scales first where the operation compares them)",
        },
    )
    return cell


def run(cfg: ConformanceConfig, out_dir: str | Path) -> dict[str, Path]:
    """Judge every cell of the matrix on the corpus and write ``conformance.csv``, ``conformance.json`` and the
    counterexamples under ``out_dir`` (see the module docstring); returns the paths written."""
    out_dir = Path(out_dir)
    started = time.perf_counter()
    cases = make_corpus(cfg.seed, cfg.rows, cfg.cols)
    counterexamples = out_dir / "counterexamples"
    counterexamples.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        cells = [_cell(op, cfg, cases, counterexamples) for op in OPERATIONS]
    paths = {"matrix": out_dir / "conformance.csv", "provenance": out_dir / "conformance.json"}
    write_csv(paths["matrix"], [c.row() for c in cells], COLUMNS)
    peers = sorted({op.peer for op in OPERATIONS})
    write_json(
        paths["provenance"],
        {
            "config": asdict(cfg),
            "corpus_sha256": corpus_sha256(cases),
            "corpus": [{"name": c.name, "shape": list(c.x.shape)} for c in cases],
            "peers": {p: peer_version(p) or "not installed" for p in peers},
            "known_differences": KNOWN,
            "verdicts": {v.value: sum(c.verdict is v for c in cells) for v in Verdict},
            "wall_seconds": round(time.perf_counter() - started, 2),
            "provenance": provenance("conformance", asdict(cfg)),
        },
    )
    paths["counterexamples"] = counterexamples
    return paths
