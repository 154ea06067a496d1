"""The paper's downstream aggregates from per-task primary scores.

Core 9 = macro average over the nine tasks of max(MC, RC); MMLU = max(macro average of the MC subject scores, macro
average of the RC subject scores); MMLU-Pro (``mmlu_pro_mc``) = lm-eval's ``leaderboard_mmlu_pro`` accuracy, as
it comes. Scores are keyed by lm-eval task name and described by manifest entries (``suite``, ``task``,
``formulation``): :data:`ue5m3.evaluation.olmes.tasks.MANIFEST`'s for the offline tasks,
:data:`ue5m3.evaluation.olmes.hub.HUB_MANIFEST`'s for the hub task.

Not built: standard errors of the aggregates.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ue5m3.evaluation.olmes.tasks import CORE9

__all__ = ["aggregate"]


def aggregate(scores: Mapping[str, float], manifest: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The paper's aggregates from per-task primary scores (fractions in [0, 1]).

    Returns:
        ``{"core9": {task: {"mc", "rc", "best"}, "_macro": float|None}, "mmlu": {"mc": .., "rc": .., "best": ..},
        "mmlu_pro_mc": float|None}``; a macro is ``None`` unless all its parts were scored (Core 9 needs all nine
        tasks); ``mmlu_pro_mc`` is lm-eval's ``leaderboard_mmlu_pro`` accuracy (suite ``mmlu_pro``), ``None`` when
        not scored.
    """
    core: dict[str, dict[str, float]] = {}
    mmlu: dict[str, dict[str, float]] = {"mc": {}, "rc": {}}
    mmlu_pro = None
    for name, score in scores.items():
        m = manifest[name]
        if m["suite"] == "core9":
            core.setdefault(m["task"], {})[m["formulation"]] = float(score)
        elif m["suite"] == "mmlu_pro":
            mmlu_pro = float(score)
        else:
            mmlu[m["formulation"]][m["task"]] = float(score)
    core_out: dict[str, Any] = {t: {**v, "best": max(v.values())} for t, v in core.items()}
    core_out["_macro"] = sum(core_out[t]["best"] for t in CORE9) / len(CORE9) if all(t in core for t in CORE9) else None
    macros = {f: (sum(v.values()) / len(v) if v else None) for f, v in mmlu.items()}
    present = [v for v in macros.values() if v is not None]
    return {"core9": core_out, "mmlu": {**macros, "best": max(present) if present else None}, "mmlu_pro_mc": mmlu_pro}
