"""Pretraining under any recipe, resumable bit for bit, on one process or many (FSDP2).

Launch (the Snakemake rules call the first form; SLURM jobs the last):

    ue5m3 train --config results/train/<run>/config.yaml
    torchrun --nproc-per-node 2 -m ue5m3 train --config ...                     # FSDP2, gloo on CPU
    srun torchrun --nnodes=$SLURM_NNODES --nproc-per-node=4 --rdzv-backend c10d -m ue5m3 train --config ...

The build order is fixed (:mod:`~ue5m3.training.build`): build on the meta device, convert the selected linears to FP4,
checkpoint the chosen blocks, ``fully_shard`` each block then the root (BF16 parameters and FP32 reductions with
``param_dtype: bfloat16``, as the paper ran), materialise and load the deterministic initial weights, create the
optimizer. One optimizer step opens one scale step (so all microbatches of a step share the first microbatch's
references), runs the microbatches (gradients reduced in the last one only, FSDP2 and DDP alike; the loss's FP32
head in chunks with ``loss_chunk``, :mod:`~ue5m3.training.loss`), clips the global gradient norm and steps AdamW
with the paper's schedule (constant, then linear decay over the final 15% to 1% of peak).

A checkpoint holds the model, optimizer, step, data cursor, every RNG state and the scale caches, so stopping at
any step and resuming reproduces the uninterrupted run exactly; ``cold_scale_resume`` instead drops the caches
like the paper's own runs did. Metrics go to ``metrics.jsonl`` (loss, pre-clip gradient norm, learning rate,
tokens/s, block-scale diagnostics) and the run ends with ``final.json`` (provenance and checkpoint hash).

The trainer's parts, each in its own module: the run config (:mod:`~ue5m3.training.config`), the build order
(:mod:`~ue5m3.training.build`), the run identity that refuses another run's checkpoint
(:mod:`~ue5m3.training.identity`), what a checkpoint holds of the run and how it resumes
(:mod:`~ue5m3.training.state`, over the file format of :mod:`~ue5m3.training.checkpoint`), the metrics file
(:mod:`~ue5m3.training.metrics`), stop requests by signal (:mod:`~ue5m3.training.stops`), and rank and rank-0
logging (:mod:`~ue5m3.training.ranks`). This module runs the steps: :func:`train_step` is one optimizer step,
:func:`train` the whole run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import signal
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ue5m3.artifacts import provenance, write_json
from ue5m3.layers import native_te, recipes
from ue5m3.layers.linear import (
    find_quant_stats,
    find_scale_state,
    find_sr_state,
)
from ue5m3.layers.native_te import Execution
from ue5m3.logs import Progress
from ue5m3.numerics.philox import SRState
from ue5m3.training import checkpoint, parallelize
from ue5m3.training.build import build_model, build_optimizer
from ue5m3.training.config import RESOLVED_CONFIG, OptimConfig, TrainConfig
from ue5m3.training.identity import RunIdentityError, check_run_dir, run_identity
from ue5m3.training.loss import lm_loss
from ue5m3.training.metrics import append_jsonl, truncate_metrics
from ue5m3.training.ranks import log0, logger, one_process_group, world
from ue5m3.training.state import BatchStream, resume, save_checkpoint
from ue5m3.training.stops import Interrupted, Stopped, StopRequests, WallClockCheckpoints

__all__ = [
    "lr_at",
    "loss_fn",
    "train_step",
    "train",
    "main",
    "NonFiniteError",
]


# ----- schedule -----------------------------------------------------------------------------------------


def lr_at(step: int, steps: int, optim: OptimConfig) -> float:
    """Learning rate of optimizer step ``step`` (1-based): warmup, constant, linear decay to the final fraction."""
    if step <= optim.warmup_steps:
        return optim.lr * step / optim.warmup_steps
    decay_steps = round(optim.decay_fraction * steps)
    decay_start = steps - decay_steps
    if decay_steps == 0 or step <= decay_start:
        return optim.lr
    progress = (step - decay_start) / decay_steps
    return optim.lr * (1 - (1 - optim.final_lr_fraction) * progress)


# ----- steps --------------------------------------------------------------------------------------------


class NonFiniteError(FloatingPointError, ValueError):
    """A step's loss, gradient norm or a quantized operand is not finite (raised before the optimizer step)."""


def loss_fn(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, *, chunk: int = 0) -> torch.Tensor:
    """Mean next-token cross entropy in FP32 (BF16 autocast around the body on GPUs; FP32 on the CPU); the head
    and loss ``chunk`` positions at a time when ``chunk`` > 0 (:func:`ue5m3.training.loss.lm_loss`)."""
    return lm_loss(model, inputs, targets, chunk=chunk)


def _grad_norm(model: nn.Module, clip: float) -> float:
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=False)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)


def _begin_step(model: nn.Module, step: int) -> SRState | None:
    """Open optimizer step ``step`` for the scale state and the SR streams; returns the SR state (None: no SR)."""
    state, sr = find_scale_state(model), find_sr_state(model)
    if state is not None:
        state.begin_step(step)  # once per optimizer step: every microbatch uses the first one's references
    if sr is not None:
        sr.begin_step(step)
    return sr


def _accumulate(
    model: nn.Module,
    stream: BatchStream,
    cfg: TrainConfig,
    recipe: recipes.Recipe | None,
    sr: SRState | None,
    accumulation: int,
) -> float:
    """Forward and backward of the step's ``accumulation`` microbatches (gradients summed); returns their mean loss
    over all ranks."""
    total = None  # the mean loss, summed on the device in FP64 (as Python floats would) and read once per step
    for microbatch in range(accumulation):
        if sr is not None:
            sr.begin_microbatch(microbatch)
        inputs, targets = stream.next_batch(cfg.micro_batch)
        # gradients are reduced once per step, in the last microbatch's backward (FSDP2 and DDP alike)
        with parallelize.gradient_sync(model, cfg, last=microbatch == accumulation - 1):
            if cfg.execution is Execution.NATIVE_TE:
                with native_te.autocast(recipe):
                    loss = loss_fn(model, inputs, targets, chunk=cfg.loss_chunk)
            else:
                loss = loss_fn(model, inputs, targets, chunk=cfg.loss_chunk)
            (loss / accumulation).backward()
        part = loss.detach().to(torch.float64) / accumulation
        total = part if total is None else total + part
    world_size = world()[1]
    if world_size > 1:  # on the loss's device: NCCL reduces only device tensors
        dist.all_reduce(total)
        total = total / world_size
    return float(total)


def _raise_if_operands_not_finite(model: nn.Module, step: int) -> None:
    stats = find_quant_stats(model)
    if stats is not None:  # the step's one read of the quantizers' deferred finiteness checks, before AdamW
        try:
            stats.checks.raise_if_any()
        except ValueError as err:
            raise NonFiniteError(f"step {step}: {err}; stopped before the optimizer step") from None


def train_step(
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    stream: BatchStream,
    cfg: TrainConfig,
    recipe: recipes.Recipe | None = None,
) -> dict[str, float]:
    """One optimizer step: open the scale step, accumulate microbatches (``accumulation``, or as many as
    ``global_batch`` asks of this world size), clip, AdamW.

    Raises:
        NonFiniteError: the loss, the gradient norm or a quantized operand is not finite (before AdamW steps).
    """
    accumulation = cfg.accumulation_for(world()[1])
    sr = _begin_step(model, step)
    lr = lr_at(step, cfg.steps, cfg.optim)
    for group in optimizer.param_groups:
        group["lr"] = lr
    total = _accumulate(model, stream, cfg, recipe, sr, accumulation)
    _raise_if_operands_not_finite(model, step)
    grad_norm = _grad_norm(model, cfg.optim.grad_clip)
    if not (np.isfinite(total) and np.isfinite(grad_norm)):  # any recipe, BF16 included: nothing bad is stepped
        raise NonFiniteError(
            f"step {step}: the loss ({total!r}) or the gradient norm ({grad_norm!r}) is not finite; stopped before "
            "the optimizer step, so no checkpoint holds it (the newest checkpoint is the last good state)"
        )
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"step": step, "loss": total, "grad_norm": grad_norm, "lr": lr}


# ----- the run ------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Run:
    """What the steps of one run share: its settings, its live model, optimizer and stream, and its counters."""

    cfg: TrainConfig
    recipe: recipes.Recipe
    identity: Mapping[str, Any]
    device: torch.device
    model: nn.Module
    optimizer: torch.optim.Optimizer
    stream: BatchStream
    start: int  # the step the run resumed from (0: a fresh run)
    counters: dict[str, int]  # the stability counters (loss above 3, gradient norm above 1), checkpointed
    tokens_per_step: int  # over all ranks

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.run_dir)

    @property
    def metrics(self) -> Path:
        return self.run_dir / "metrics.jsonl"


def _steps(start: int, stop: int, progress: Progress) -> Iterator[int]:
    """Steps ``start + 1 .. stop``; the progress report closes when the loop ends or leaves early."""
    try:
        yield from range(start + 1, stop + 1)
    finally:
        progress.close()


def _figures(record: Mapping[str, Any]) -> dict[str, str]:
    """What the progress bar (terminal) or each logged step's line (a log file) shows of a step's record."""
    return {
        "loss": f"{record['loss']:.4f}",
        "grad_norm": f"{record['grad_norm']:.4g}",
        "lr": f"{record['lr']:.3e}",
        "tokens/s": f"{record['tokens_per_s']:.0f}",
    }


def train(
    cfg: TrainConfig,
    stream: BatchStream | None = None,
    *,
    stop_after: int | None = None,
    restart_on_change: bool = False,
) -> Path | None:
    """Run (or resume) training; returns the final record's path, or None when stopped early by ``stop_after``.

    Rank 0 holds the run directory's lock for the whole run. A checkpoint of another run (different identity) is
    refused, or with ``restart_on_change`` (or ``cfg.restart_on_change``) the old directory is moved aside.
    SIGTERM, SIGUSR1 and SIGINT write a checkpoint at the end of the current step and raise
    :class:`~ue5m3.training.stops.Stopped`; a second SIGINT raises :class:`~ue5m3.training.stops.Interrupted` at
    once. With ``checkpoint_every_minutes`` the run also checkpoints by wall time.

    Raises:
        ValueError: ``global_batch`` cannot be split over this world size (before the run directory is touched).
        RunIdentityError: the run directory's newest checkpoint is another run's (without ``restart_on_change``).
        NonFiniteError: a step's loss, gradient norm or quantized operand is not finite.
        Stopped: SIGTERM, SIGUSR1 or SIGINT arrived (after the checkpoint of the current step).
        Interrupted: a second SIGINT (Ctrl-C) arrived; nothing of the step in progress was saved.
    """
    if cfg.execution is Execution.NATIVE_TE:
        native_te.require_native()  # off Blackwell: fail before the run directory is touched, never run emulated
    rank, world_size = world()
    run_dir = Path(cfg.run_dir)
    recipe = cfg.resolved_recipe()  # absolute layer indices of this model, for the build and the identity
    if stream is None and cfg.data is not None:  # the prepared data are the config's, before the identity hashes them
        from ue5m3.data import check_prepared

        check_prepared(cfg.data)
    identity = run_identity(cfg, recipe, world_size)
    with contextlib.ExitStack() as stack:
        if cfg.mixed_precision:  # FSDP2's mixed precision on any world size: one process gets a group of one
            stack.enter_context(one_process_group())
        if rank == 0:
            stack.enter_context(checkpoint.RunLock(run_dir))
            for path in checkpoint.remove_temporaries(run_dir / "checkpoints"):
                log0(f"removed {path} (a checkpoint save that was interrupted)")
        if world_size > 1:
            dist.barrier()  # the killed saves are gone before any rank looks at the checkpoints
        # verified once for the whole resume: each rank hashes its share of the files (one process: all of them)
        found = checkpoint.newest_valid(run_dir / "checkpoints", together=True)
        restart = restart_on_change or cfg.restart_on_change  # the run config's choice, or the caller's
        found = _this_runs(run_dir, found, identity, restart, stack)
        stops = stack.enter_context(StopRequests())
        return _train_locked(cfg, recipe, identity, stream, stop_after, stops, found)


def _this_runs(
    run_dir: Path,
    found: tuple[Path, dict[str, Any]] | None,
    identity: Mapping[str, Any],
    restart: bool,
    stack: contextlib.ExitStack,
) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint the run resumes from: rank 0, holding the lock, refuses another run's ``found`` or (``restart``)
    moves the directory aside and locks the new one (:func:`check_run_dir`); every rank learns which, so all raise
    the same :class:`RunIdentityError` or all start afresh (None)."""
    rank, world_size = world()
    outcome: tuple[str, str] | None = None
    if rank == 0:
        try:
            if check_run_dir(run_dir, found, identity, restart_on_change=restart):
                stack.enter_context(checkpoint.RunLock(run_dir))  # the old lock moved aside with the old run
                outcome = ("moved", "")
        except RunIdentityError as err:
            if world_size == 1:
                raise
            outcome = ("refused", str(err))
    if world_size > 1:
        box = [outcome]
        dist.broadcast_object_list(box, src=0)
        outcome = box[0]
    if outcome is not None and outcome[0] == "refused":
        raise RunIdentityError(outcome[1])
    return None if outcome is not None else found


def _train_locked(
    cfg: TrainConfig,
    recipe: recipes.Recipe,
    identity: Mapping[str, Any],
    stream: BatchStream | None,
    stop_after: int | None,
    stops: StopRequests,
    found: tuple[Path, dict[str, Any]] | None,
) -> Path | None:
    """The run, its directory locked: start (or resume from ``found``), then step by step to the last step, a stop
    request or ``stop_after``; each step's record logged, checkpointed on schedule (steps and wall time)."""
    rank = world()[0]
    run = _start(cfg, recipe, identity, stream, found)
    stats = find_quant_stats(run.model)
    progress = _progress(run)
    rolling = WallClockCheckpoints(cfg.checkpoint_every_minutes)
    last = run.start
    for step in _steps(run.start, cfg.steps, progress):
        logged = step % cfg.log_every == 0 or step == cfg.steps
        record = _step(run, step, stats, logged)
        if rank == 0 and logged:
            append_jsonl(run.metrics, record)
        progress.update(figures=_figures(record), report=logged)
        saved = step % cfg.checkpoint_every == 0 or step == cfg.steps
        if saved:
            _save(run, step)
        last = step
        _checkpoint_or_stop_on_request(run, stops, rolling, step, saved)
        if stop_after is not None and step >= stop_after:
            return None
    return _finish(run, last) if rank == 0 else None


def _start(
    cfg: TrainConfig,
    recipe: recipes.Recipe,
    identity: Mapping[str, Any],
    stream: BatchStream | None,
    found: tuple[Path, dict[str, Any]] | None,
) -> _Run:
    """Seed, build the model (:func:`build_model`) and the optimizer, open the stream, resume from ``found`` (this
    run's newest checkpoint, verified) and write the run's records (rank 0): the resolved config, the conversion
    records, the metrics file cut back to the resumed step."""
    rank, world_size = world()
    torch.manual_seed(cfg.seed + rank)  # any torch randomness per rank; SR bits and init weights come from cfg.seed
    random.seed(cfg.seed + rank)
    np.random.seed(cfg.seed + rank)
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    model, records = build_model(cfg, recipe, device)
    optimizer = build_optimizer(model, cfg.optim)
    if stream is None:
        stream = open_training_stream(cfg, rank, world_size)
    start, counters = resume(found, model, optimizer, stream, cfg, identity)
    tokens_per_step = cfg.micro_batch * cfg.accumulation_for(world_size) * world_size * int(stream.sequence_length)
    run = _Run(
        cfg=cfg,
        recipe=recipe,
        identity=identity,
        device=device,
        model=model,
        optimizer=optimizer,
        stream=stream,
        start=start,
        counters=counters,
        tokens_per_step=tokens_per_step,
    )
    if rank == 0:
        run.run_dir.mkdir(parents=True, exist_ok=True)
        write_json(run.run_dir / RESOLVED_CONFIG, cfg.to_dict())
        write_json(run.run_dir / "conversion.json", [dataclasses.asdict(r) for r in records])
        truncate_metrics(run.metrics, start)
    return run


def open_training_stream(cfg: TrainConfig, rank: int, world_size: int) -> BatchStream:
    """This rank's training loader over the prepared token shards (the config has checked that the tokenizer's
    vocabulary matches the model's)."""
    from ue5m3 import data

    return data.open_data(cfg.require_data(), rank=rank, world_size=world_size).train


def _progress(run: _Run) -> Progress:
    """Log where the run starts and open its progress report: a bar on a terminal; in a log file (the pipeline's
    train.log) one line per logged step."""
    rank, world_size = world()
    log0(
        f"training {run.run_dir} (recipe {run.recipe.name}, {world_size} process(es), {run.tokens_per_step} tokens "
        f"per step) from step {run.start} to {run.cfg.steps}"
    )
    return Progress(
        "train",
        total=run.cfg.steps,
        initial=run.start,
        unit="step",
        logger=logger,
        interval_s=None,
        rate=False,
        enabled=rank == 0,
    )


def _step(run: _Run, step: int, stats: Any, logged: bool) -> dict[str, Any]:
    """One optimizer step (:func:`train_step`) and its metrics record: loss, gradient norm, learning rate,
    tokens/s and, on a ``logged`` step, the quantizers' block-scale diagnostics since the last logged step with the
    step's scale telemetry (``stats``, None for a BF16 run: :mod:`ue5m3.layers.telemetry`); advances the counters."""
    if stats is not None:
        stats.sample(logged)  # only the steps the run logs record the scale telemetry (read once, below)
    began = time.perf_counter()
    record = train_step(step, run.model, run.optimizer, run.stream, run.cfg, run.recipe)
    record["tokens_per_s"] = run.tokens_per_step / (time.perf_counter() - began)
    run.counters["loss_above_3"] += int(record["loss"] > 3)
    run.counters["grad_norm_above_1"] += int(record["grad_norm"] > 1)
    if stats is not None and logged:
        record.update(stats.pop())
    return record


def _save(run: _Run, step: int) -> None:
    """Checkpoint the state after ``step``; rank 0 then prunes to the newest ``keep_checkpoints`` (those at multiples
    of ``keep_every`` stay)."""
    save_checkpoint(run.run_dir, step, run.model, run.optimizer, run.stream, run.counters, run.identity)
    if world()[0] == 0:
        cfg = run.cfg
        protect = tuple(range(cfg.keep_every, cfg.steps + 1, cfg.keep_every)) if cfg.keep_every else ()
        checkpoint.prune(run.run_dir / "checkpoints", cfg.keep_checkpoints, protect=protect)


def _checkpoint_or_stop_on_request(
    run: _Run, stops: StopRequests, rolling: WallClockCheckpoints, step: int, saved: bool
) -> None:
    """After ``step`` (checkpointed already when ``saved``): the ranks agree on the stop flag and the wall-time
    schedule; checkpoint ``step`` if either asks for it, then raise :class:`Stopped` if any rank received SIGTERM,
    SIGUSR1 or SIGINT. The last step needs no stop, the run ends there anyway."""
    poll = stops.poll(run.device, checkpoint_due=rolling.due())
    stopping = poll.signum is not None and step < run.cfg.steps
    if (stopping or poll.checkpoint_due) and not saved:
        if not stopping:
            log0(f"checkpoint of step {step}: {run.cfg.checkpoint_every_minutes:g} minutes since the last one")
        _save(run, step)
        saved = True
    if saved:
        rolling.saved()
    if stopping:
        name = signal.Signals(poll.signum).name
        log0(f"stopped by {name} after step {step} (checkpoint written); rerun to resume")
        raise Stopped(128 + poll.signum)


def _finish(run: _Run, step: int) -> Path:
    """Write ``final.json``: the provenance of the run, its counters and the final checkpoint with its hash (the
    checkpoint whose manifest says step ``step``, verified completely)."""
    final_ckpt, manifest = checkpoint.at_step(run.run_dir / "checkpoints", step)
    record = provenance(
        "train",
        run.cfg.to_dict(),
        recipe=run.recipe.name,
        seed=run.cfg.seed,
        step=step,
        counters=run.counters,
        checkpoint=str(final_ckpt),
        checkpoint_sha256=checkpoint.weights_sha256(manifest),
        execution=native_te.execution_path(run.recipe, run.cfg.execution, run.cfg.backend),
        parallelism=parallelize.fsdp_settings(run.cfg, world()[1]),
    )
    write_json(run.run_dir / "final.json", record)
    return run.run_dir / "final.json"


def main(config_path: str, threads: int | None = None, *, restart_on_change: bool = False) -> int:
    """Entry point of ``ue5m3 train``: initialises torch.distributed under torchrun (gloo on CPU)."""
    cfg = TrainConfig.from_yaml(config_path)
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads: must be a positive int (torch CPU threads), got {threads!r}")
        torch.set_num_threads(threads)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    try:
        train(cfg, restart_on_change=restart_on_change)
    except Interrupted as err:  # a second Ctrl-C: no traceback, the exit status of an interrupt
        log0(f"{err}; rerun to resume from the newest checkpoint")
        raise SystemExit(128 + signal.SIGINT) from None
    finally:
        if distributed:
            dist.destroy_process_group()
    return 0
