"""The fitter: match every candidate output model against an oracle on a probe corpus, and the paper's tables.

A candidate *matches* a cell when its output equals the oracle's bit for bit in the probe's comparison dtype
(FP32, or BF16 for witnesses). :func:`fit` returns a :class:`MatchTable` (passed / total per candidate and probe
family); the *identified* candidates are those that match every cell of every probe. Candidates that differ only
in the final grid share one accumulator, so a grid sweep costs one pass. Two torch FP32 baselines run on the
whole GEMM: ``decoded`` (dequantized operands, torch matmul) and ``encoded_fp32`` (encoded operands, times alpha).

:meth:`MatchTable.paper_tables` writes the paper's tables (appendix B; reference/emulator_identification.csv)
around the best candidate, varying one parameter at a time: order tests per slice width and rounding, the
final-grid sweep, the BF16 witness ladder, and the broad probes against an RNE baseline.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from ue5m3 import logs
from ue5m3.identify.candidates import BASELINES, Candidate, accumulate_cells, parse
from ue5m3.identify.corpus import Corpus
from ue5m3.identify.mma_models import MODELS, applies, model_outputs
from ue5m3.identify.probes import Probe
from ue5m3.numerics.exact import snap
from ue5m3.numerics.formats import Rounding

__all__ = ["MatchTable", "fit", "baseline_outputs", "matches"]

logger = logging.getLogger(__name__)


def baseline_outputs(probe: Probe, name: str) -> torch.Tensor:
    """FP32 [C] outputs of a torch baseline on the whole GEMM (CPU FP32 matmul; TF32 plays no part)."""
    if name not in BASELINES:
        raise ValueError(f"unknown baseline {name!r}; known: {list(BASELINES)}")
    if name == "decoded":  # probe operands are quantizer fixed points: they are their own dequantized values
        full = torch.matmul(probe.a, probe.b)
    else:
        enc_a, enc_b, alpha = probe.encoded()
        full = torch.matmul(enc_a, enc_b) * alpha
    return full[probe.rows, probe.cols]


def matches(probe: Probe, outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Bool [C]: outputs equal the labels bit for bit in the probe's comparison dtype."""
    a, b = probe.cast(outputs), probe.cast(labels)
    view = torch.int16 if a.dtype == torch.bfloat16 else torch.int32
    return a.contiguous().view(view) == b.contiguous().view(view)


@dataclass(frozen=True)
class MatchTable:
    """passed[candidate][family] of total[family] cells; candidates in fitting order."""

    candidates: tuple[str, ...]
    passed: Mapping[str, Mapping[str, int]]
    total: Mapping[str, int]
    oracle: Mapping[str, Any]

    def rows(self) -> list[dict[str, Any]]:
        """Long-form rows: candidate, family, passed, total."""
        return [
            {"candidate": c, "family": f, "passed": self.passed[c][f], "total": t}
            for c in self.candidates
            for f, t in self.total.items()
        ]

    def score(self, candidate: str) -> int:
        return sum(self.passed[candidate].values())

    @property
    def cells(self) -> int:
        return sum(self.total.values())

    def identified(self) -> list[str]:
        """Fitted candidates (not baselines, not MMA-Sim's models) that match every cell of every probe."""
        return [c for c in self.candidates if c not in (*BASELINES, *MODELS) and self.score(c) == self.cells]

    def identified_models(self) -> list[str]:
        """The MMA-Sim hardware models (:mod:`.mma_models`) that match every cell of every probe."""
        return [c for c in self.candidates if c in MODELS and self.score(c) == self.cells]

    def best(self) -> str:
        """The best-scoring candidate; ties go to the coarsest final grid that keeps the score (as the paper
        chose 1/1024), then to the plainer model (exact partials, no promotion), then by name."""

        def key(name: str) -> tuple:
            c = parse(name)
            return (
                -self.score(name),
                c.final_grid is None,
                c.final_grid or 0,
                c.promotion is not None,
                c.partial_bits is not None,
                name,
            )

        return min((c for c in self.candidates if c not in BASELINES and c not in MODELS), key=key)

    def paper_tables(self, best: str | None = None) -> list[dict[str, Any]]:
        """Rows (experiment, variant, candidate, passed, total) shaped like the paper's appendix-B tables."""
        best_c = parse(best or self.best())
        rows: list[dict[str, Any]] = []

        def add(experiment: str, variant: str, family: str, candidate: Candidate | str) -> None:
            name = candidate if isinstance(candidate, str) else candidate.name
            if family in self.total and name in self.passed:
                rows.append(
                    {
                        "experiment": experiment,
                        "variant": variant,
                        "candidate": name,
                        "passed": self.passed[name][family],
                        "total": self.total[family],
                    }
                )

        widths = sorted(
            {parse(c).slice_width for c in self.candidates if c not in BASELINES and c not in MODELS} - {None}
        )
        for rounding in (Rounding.RNE, Rounding.RTZ):
            for width in widths:
                try:
                    variant = replace(best_c, slice_width=width, rounding=rounding)
                except ValueError:  # e.g. a slice as wide as the best candidate's promotion interval
                    continue
                add("order_tests_group_width", f"{rounding.value}_{width}", "order", variant)
        grids = sorted(
            {parse(c).final_grid for c in self.candidates if c not in BASELINES and c not in MODELS} - {None}
        )
        add("order_tests_final_grid", "none", "order", replace(best_c, final_grid=None))
        for grid in grids:
            add("order_tests_final_grid", f"1/{grid}", "order", replace(best_c, final_grid=grid))
        add("bf16_witnesses", "decoded_operand_torch", "witness", "decoded")
        exact = Candidate(slice_width=None, rounding=Rounding.RNE, final_grid=best_c.final_grid)
        add("bf16_witnesses", f"exact_sum_snap_{best_c.final_grid or 'none'}", "witness", exact)
        for rounding in (Rounding.RNE, Rounding.RTZ):
            add(
                "bf16_witnesses",
                f"group{best_c.slice_width}_{rounding.value}",
                "witness",
                replace(best_c, rounding=rounding),
            )
        for experiment, family in (
            ("packed_random_cells_fp32_exact", "broad_packed"),
            ("te_quantized_wide_cells_exact", "broad_quantized"),
        ):
            add(experiment, "rne_baseline", family, "decoded")
            add(experiment, "probe_matched", family, best_c)
        return rows


def fit(
    corpus: Corpus,
    oracle: Any,
    candidates: Iterable[Candidate],
    *,
    labels: Mapping[str, torch.Tensor] | None = None,
    baselines: Sequence[str] = BASELINES,
    models: Sequence[str] = MODELS,
    progress: bool = False,
) -> MatchTable:
    """Match every candidate (and the torch baselines) against the oracle on every probe of the corpus.

    Args:
        corpus: the probes.
        oracle: anything with ``outputs(probe)`` and ``describe()`` (see :mod:`.oracles`); not called for probes
            whose outputs ``labels`` already holds.
        candidates: the candidate models (see :func:`.candidates.candidate_grid`).
        labels: precomputed oracle outputs per probe family.
        baselines: torch baselines to include.
        models: MMA-Sim's hardware models (:mod:`.mma_models`) to match beside the candidates; those that do not
            compute every probe of the corpus (FP8 models on block-scaled probes, say) are left out.
        progress: show progress over accumulator passes (a bar on a terminal, log lines elsewhere).

    Returns:
        The match table.
    """
    candidates = list(candidates)
    if not candidates:
        raise ValueError("fit needs at least one candidate")
    by_accumulator: dict[Candidate, list[Candidate]] = defaultdict(list)
    for candidate in candidates:
        by_accumulator[candidate.accumulator].append(candidate)
    models = [m for m in models if all(applies(m, probe) for probe in corpus.probes.values())]
    names = [*baselines, *models, *(c.name for c in candidates)]
    passed: dict[str, dict[str, int]] = {name: {} for name in names}
    total: dict[str, int] = {}
    bar = logs.Progress(
        "fit", total=len(corpus.probes) * len(by_accumulator), unit="pass", logger=logger, enabled=progress
    )
    for family, probe in corpus.probes.items():
        truth = labels[family] if labels is not None and family in labels else oracle.outputs(probe)
        total[family] = probe.rows.numel()
        for name in baselines:
            passed[name][family] = int(matches(probe, baseline_outputs(probe, name), truth).sum())
        for name in models:
            passed[name][family] = int(matches(probe, model_outputs(probe, name), truth).sum())
        products, alpha = probe.products(), probe.encoded()[2]
        for accumulator, members in by_accumulator.items():
            acc = accumulate_cells(products, accumulator, block=probe.block)
            for candidate in members:
                passed[candidate.name][family] = int(
                    matches(probe, snap(acc, candidate.final_grid) * alpha, truth).sum()
                )
            bar.update()
    bar.close()
    return MatchTable(candidates=tuple(names), passed=passed, total=total, oracle=oracle.describe())
