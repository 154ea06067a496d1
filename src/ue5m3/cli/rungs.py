"""The scale ladder's rungs loaded, costed and rendered: the library side of ``ue5m3 ladder`` (issue 26, item 3;
docs/experiments.md).

:mod:`ue5m3.experiments.ladder` holds the statistics (power, the paired spread, its scaling, each claim's sizing) and
the tables; this module loads each rung's config as the workflow does (:func:`ue5m3.pipeline.load`), costs its
training runs with the plan's estimate (:func:`ue5m3.plan.cost.microbatch_seconds`) and renders the section. It needs
the pipeline, which imports the stages' configs from ``ue5m3.experiments``, so it lives on the CLI's floor, above
both (tests/test_layering.py), and the verb (:mod:`ue5m3.cli.analyses`) is one call into :func:`write`:

    ue5m3 ladder --write docs/experiments.md
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from ue5m3 import config, models, pipeline
from ue5m3.experiments import ladder, ladder_docs
from ue5m3.pipeline import jobs
from ue5m3.plan import cost
from ue5m3.plan.gpus import gpu_type
from ue5m3.training.config import TrainConfig

__all__ = ["rung_config", "run_gpu_hours", "summarize_rung", "render", "write"]


def rung_config(rung: ladder.Rung, root: Path = ladder.ROOT) -> pipeline.PipelineConfig:
    """The rung's pipeline config: its files merged over config/config.yaml, loaded and checked whole."""
    return pipeline.load(ladder.rung_data(rung, root), source=" + ".join(("config/config.yaml", *rung.configs)))


def _train_config(cfg: pipeline.PipelineConfig, group: str, variant: str, seed: int) -> TrainConfig:
    return config.load(TrainConfig, jobs.run_settings(cfg, group, variant, seed), source=f"{group}/{variant}")


def run_gpu_hours(cfg: pipeline.PipelineConfig, group: str, variant: str, seed: int) -> tuple[str, float] | None:
    """(GPU type, GPU-hours) of one training run on the slowest GPU type its partition may hold, from the plan's
    cost estimate (compute only); None for a CPU run."""
    section = cfg.training if group == "main" else cfg.control
    if not section.gpus_per_node:
        return None
    native = jobs.run_execution(cfg, group, variant) == "native_te"
    partition = cfg.training.native_partition if native else section.partition
    world = section.world_size
    train = _train_config(cfg, group, variant, seed)
    tokens = train.micro_batch * cfg.data.sequence_length
    hours = {}
    for name in cfg.plan.partitions[partition]:
        gpu = gpu_type(name)
        eff = cost.Efficiency()
        seconds = cost.microbatch_seconds(train, gpu, tokens, eff, native=native and gpu.nvfp4 is not None)
        hours[name] = seconds * train.accumulation_for(world) * section.steps * world / 3600
    slowest = max(hours, key=hours.get)
    return slowest, hours[slowest]


def summarize_rung(rung: ladder.Rung, cfg: pipeline.PipelineConfig) -> ladder.RungSummary:
    """What the rung's config trains and what its training runs cost."""
    training = cfg.training
    world = training.world_size
    first = _train_config(cfg, "main", training.recipes[0], training.seeds[0])
    tokens_per_step = first.micro_batch * cfg.data.sequence_length * first.accumulation_for(world) * world
    shell = models.build(training.model, device="meta", **dict(training.model_overrides))
    runs = [("main", r, s) for r in training.recipes for s in training.seeds]
    runs += [("control", v, s) for v in jobs.CONTROL_VARIANTS for s in cfg.control.seeds]
    gpus, hours = set(), 0.0
    for group, variant, seed in runs:
        costed = run_gpu_hours(cfg, group, variant, seed)
        if costed is not None:
            gpus.add(costed[0])
            hours += costed[1]
    return ladder.RungSummary(
        rung=rung,
        model=training.model,
        parameters_m=models.count_parameters(shell) / 1e6,
        recipes=tuple(training.recipes),
        seeds=tuple(training.seeds),
        steps=training.steps,
        tokens_per_step=tokens_per_step,
        tokens_per_run=tokens_per_step * training.steps,
        window_tokens=training.summary.final_window * tokens_per_step,
        control_seeds=tuple(cfg.control.seeds),
        runs=len(runs),
        gpu="/".join(sorted(gpus)),
        gpu_hours=hours,
        validation_tokens=cfg.data.validation_windows * cfg.data.sequence_length,
    )


def render(
    curves: pd.DataFrame | None = None,
    *,
    points: int = 10,
    tokens_per_point: int = ladder.CPU_TOKENS_PER_POINT,
    rungs: Sequence[ladder.Rung] = ladder.RUNGS,
    root: Path = ladder.ROOT,
) -> str:
    """docs/experiments.md's ladder section: the claims sized from ``curves`` (default :data:`ladder.CPU_WINDOWS`,
    windows of ``points`` logged losses of ``tokens_per_point`` tokens each) and every rung loaded and costed."""
    curves = pd.read_csv(ladder.CPU_WINDOWS) if curves is None else curves
    sizings = ladder.claim_sizings(curves, points=points, tokens_per_point=tokens_per_point)
    loaded: list[tuple[ladder.RungSummary, Any]] = []
    for rung in rungs:
        cfg = rung_config(rung, root)
        loaded.append((summarize_rung(rung, cfg), cfg))
    return ladder_docs.tables(sizings, loaded)


def write(path: str | Path | None, curves: str | Path | None = None, **window: int) -> str:
    """The ladder's section rendered from the curves file ``curves`` (default: the shipped CPU windows; ``window``:
    :func:`render`'s ``points`` and ``tokens_per_point``) and written between the ladder markers of the Markdown
    file ``path`` (None: only returned)."""
    frame = pd.read_csv(curves) if curves else None
    text = render(frame, **window)
    if path is not None:
        ladder_docs.write_section(path, text)
    return text
