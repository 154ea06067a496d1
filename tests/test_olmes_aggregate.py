"""The paper's downstream aggregates (ue5m3.evaluation.olmes.aggregate)."""

from __future__ import annotations

import pytest

from ue5m3.evaluation import olmes


def test_aggregates_take_best_formulation_then_macro_average():
    manifest, scores = {}, {}
    for i, task in enumerate(olmes.CORE9):
        for form, score in (("mc", 0.1 * i), ("rc", 0.45)):
            manifest[f"{task}_{form}"] = {"suite": "core9", "task": task, "formulation": form}
            scores[f"{task}_{form}"] = score
    for subject, mc, rc in (("anatomy", 0.2, 0.5), ("astronomy", 0.6, 0.3)):
        for form, score in (("mc", mc), ("rc", rc)):
            manifest[f"m_{subject}_{form}"] = {"suite": "mmlu", "task": subject, "formulation": form}
            scores[f"m_{subject}_{form}"] = score
    agg = olmes.aggregate(scores, manifest)
    assert agg["core9"]["_macro"] == pytest.approx(sum(max(0.1 * i, 0.45) for i in range(9)) / 9)
    assert agg["mmlu"] == pytest.approx({"mc": 0.4, "rc": 0.4, "best": 0.4})
    partial = olmes.aggregate({"arc_easy_mc": 0.3}, manifest)
    assert partial["core9"]["_macro"] is None  # Core 9 needs all nine tasks
