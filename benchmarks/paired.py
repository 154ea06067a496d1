"""The summary of a paired benchmark: alternating processes of a baseline checkout and this one (train.py and
evaluate.py ``--baseline-src``), each pair a (baseline, this) measurement, read as the median of the per-pair ratios
with their range, since this machine's speed drifts by 20-40% within minutes."""

from __future__ import annotations

import os
import statistics


def baseline_env(baseline_src: str) -> dict:
    """The environment of a baseline process: ``baseline_src`` first on ``PYTHONPATH``."""
    path = os.pathsep.join(filter(None, [baseline_src, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def print_header(title: str, key: str, unit: str) -> None:
    """The title line and the Markdown table header that :func:`summarize`'s rows continue."""
    print(title)
    print(f"| {key} | baseline {unit} (median) | this {unit} (median) | this / baseline (median of pairs) | range |")
    print("|---|---:|---:|---:|---|")


def summarize(name: str, key: str, pairs: list[tuple[float, float]], *, digits: int = 2) -> dict:
    """The row of ``pairs`` under ``name`` (its ``key`` column), printed as a Markdown table row."""
    ratios = [new / base for base, new in pairs]
    row = {
        key: name,
        "baseline": statistics.median(b for b, _ in pairs),
        "this": statistics.median(n for _, n in pairs),
        "ratio": statistics.median(ratios),
        "ratio_range": [min(ratios), max(ratios)],
        "pairs": pairs,
    }
    print(
        f"| {name} | {row['baseline']:.{digits}f} | {row['this']:.{digits}f} | {row['ratio']:.3f} | "
        f"{min(ratios):.3f}-{max(ratios):.3f} |"
    )
    return row
