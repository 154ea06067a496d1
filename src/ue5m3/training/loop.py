"""Pretraining under any recipe, resumable bit for bit, on one process or many (FSDP2).

Launch (the Snakemake rules call the first form; SLURM jobs the last):

    ue5m3 train --config results/train/<run>/config.yaml
    torchrun --nproc-per-node 2 -m ue5m3 train --config ...                     # FSDP2, gloo on CPU
    srun torchrun --nnodes=$SLURM_NNODES --nproc-per-node=4 --rdzv-backend c10d -m ue5m3 train --config ...

The build order is fixed (:func:`build_model`): build on the meta device, convert the selected linears to FP4,
``fully_shard`` each block then the root, materialise and load the deterministic initial weights, create the
optimizer. One optimizer step opens one scale step (so all microbatches of a step share the first microbatch's
references), runs the microbatches, clips the global gradient norm and steps AdamW with the paper's schedule
(constant, then linear decay over the final 15% to 1% of peak).

A checkpoint holds the model, optimizer, step, data cursor, every RNG state and the scale caches, so stopping at
any step and resuming reproduces the uninterrupted run exactly; ``cold_scale_resume`` instead drops the caches
like the paper's own runs did. Metrics go to ``metrics.jsonl`` (loss, pre-clip gradient norm, learning rate,
tokens/s, block-scale diagnostics) and the run ends with ``final.json`` (provenance and checkpoint hash).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import random
import signal
import time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ue5m3 import config as config_loader
from ue5m3 import models
from ue5m3.artifacts import atomic_path, provenance, write_json
from ue5m3.layers import native_te, recipes
from ue5m3.layers.linear import (
    WeightCaching,
    convert,
    find_quant_stats,
    find_scale_state,
    find_sr_state,
    set_weight_caching,
)
from ue5m3.layers.native_te import Execution
from ue5m3.logs import Progress
from ue5m3.numerics.philox import SRState
from ue5m3.training import checkpoint
from ue5m3.training.config import RESOLVED_CONFIG, OptimConfig, TrainConfig

__all__ = [
    "lr_at",
    "param_groups",
    "build_model",
    "train",
    "main",
    "run_identity",
    "identity_differences",
    "RunIdentityError",
    "NonFiniteError",
    "Stopped",
]


# ----- schedule and optimizer ---------------------------------------------------------------------------


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


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: decay matrices; never the parameters :func:`ue5m3.models.no_weight_decay` names (biases,
    norms, Mamba's A_log, D, dt_bias: every parameter of fewer than two dimensions)."""
    excluded = set(models.no_weight_decay(model))
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if name in excluded else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


# ----- build --------------------------------------------------------------------------------------------


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


logger = logging.getLogger(__name__)


def log0(message: str) -> None:
    """Log ``message`` (INFO) on rank 0 only: the one log helper of the trainer."""
    if _world()[0] == 0:
        logger.info(message)


def initial_state(cfg: TrainConfig) -> dict[str, torch.Tensor]:
    """The deterministic initial weights of a run: a full model initialised on the CPU from the seed."""
    generator = torch.Generator().manual_seed(cfg.seed)
    return models.build(cfg.model, device="cpu", generator=generator, **cfg.model_overrides).state_dict()


def build_model(cfg: TrainConfig, recipe: recipes.Recipe, device: torch.device) -> tuple[nn.Module, tuple]:
    """Meta build -> FP4 conversion -> fully_shard per block and root -> materialise and load init weights.

    ``recipe`` names its layers by absolute index (:meth:`TrainConfig.resolved_recipe`)."""
    model = models.build(cfg.model, device="meta", **cfg.model_overrides)
    select = cfg.fp4_select if cfg.fp4_select is not None else tuple(models.eligible_linears(model))
    rank, world = _world()
    if cfg.execution is Execution.NATIVE_TE:
        native_te.require_native()  # fails closed off Blackwell before anything is built
        model.to_empty(device=device)
        model.load_state_dict(initial_state(cfg))
        records = native_te.convert_native(model, recipe, select=list(select))
        return (_replicate(model, device) if world > 1 else model), records
    # SR bits are Philox streams of (seed, module, role, step, microbatch, global index): the same on any device,
    # thread count or world size (each rank's tokens sit at their place in the global microbatch)
    records = convert(
        model, recipe, select=select, sr_state=SRState(cfg.seed, rank=rank, world=world), backend=cfg.backend
    )
    # the weight is quantized once per optimizer step and reused by its microbatches; under FSDP2 the all-gathers
    # rewrite the unsharded weights every microbatch, so the key is the step alone (the trainer's contract)
    set_weight_caching(
        model,
        WeightCaching.OFF if cfg.accumulation == 1 else WeightCaching.STEP if world > 1 else WeightCaching.VERSION,
    )
    sharded = world > 1 and cfg.parallelism == "fsdp2"
    if sharded:
        from torch.distributed.fsdp import fully_shard

        for block in models.blocks(model):
            fully_shard(block)
        fully_shard(model)
    model.to_empty(device=device)
    full = initial_state(cfg)
    if sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True))
        return model, records
    model.load_state_dict(full)
    return (_replicate(model, device) if world > 1 else model), records


def _replicate(model: nn.Module, device: torch.device) -> nn.Module:
    """DDP: every rank holds the whole model; gradients are averaged across ranks in the backward (the same
    average FSDP2's reduce-scatter takes). The initial weights are identical on every rank already."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


# ----- steps --------------------------------------------------------------------------------------------


class BatchStream(Protocol):
    sequence_length: int

    def next_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


def loss_fn(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy in FP32 (BF16 autocast around the body on GPUs; FP32 on the CPU)."""
    device = next(model.parameters()).device
    inputs, targets = inputs.to(device), targets.to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        logits = model(inputs)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _grad_norm(model: nn.Module, clip: float) -> float:
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=False)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)


def train_step(
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    stream: BatchStream,
    cfg: TrainConfig,
    recipe: recipes.Recipe | None = None,
) -> dict[str, float]:
    """One optimizer step: open the scale step, accumulate microbatches, clip, AdamW."""
    state, sr = find_scale_state(model), find_sr_state(model)
    if state is not None:
        state.begin_step(step)  # once per optimizer step: every microbatch uses the first one's references
    if sr is not None:
        sr.begin_step(step)
    lr = lr_at(step, cfg.steps, cfg.optim)
    for group in optimizer.param_groups:
        group["lr"] = lr
    total = None  # the mean loss, summed on the device in FP64 (as Python floats would) and read once per step
    for microbatch in range(cfg.accumulation):
        if sr is not None:
            sr.begin_microbatch(microbatch)
        inputs, targets = stream.next_batch(cfg.micro_batch)
        # DDP all-reduces the gradients once per step, in the last microbatch's backward
        last = microbatch == cfg.accumulation - 1
        with contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync():
            if cfg.execution is Execution.NATIVE_TE:
                with native_te.autocast(recipe):
                    loss = loss_fn(model, inputs, targets)
            else:
                loss = loss_fn(model, inputs, targets)
            (loss / cfg.accumulation).backward()
        part = loss.detach().to(torch.float64) / cfg.accumulation
        total = part if total is None else total + part
    if _world()[1] > 1:  # on the loss's device: NCCL reduces only device tensors
        dist.all_reduce(total)
        total = total / _world()[1]
    total = float(total)
    stats = find_quant_stats(model)
    if stats is not None:  # the step's one read of the quantizers' deferred finiteness checks, before AdamW
        try:
            stats.checks.raise_if_any()
        except ValueError as err:
            raise NonFiniteError(f"step {step}: {err}; stopped before the optimizer step") from None
    grad_norm = _grad_norm(model, cfg.optim.grad_clip)
    if not (np.isfinite(total) and np.isfinite(grad_norm)):  # any recipe, BF16 included: nothing bad is stepped
        raise NonFiniteError(
            f"step {step}: the loss ({total!r}) or the gradient norm ({grad_norm!r}) is not finite; stopped before "
            "the optimizer step, so no checkpoint holds it (the newest checkpoint is the last good state)"
        )
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"step": step, "loss": total, "grad_norm": grad_norm, "lr": lr}


# ----- run identity -------------------------------------------------------------------------------------


class RunIdentityError(ValueError):
    """A checkpoint belongs to another run (recipe, model, seed, data, settings that shape the trajectory)."""


class NonFiniteError(FloatingPointError, ValueError):
    """A step's loss, gradient norm or a quantized operand is not finite (raised before the optimizer step)."""


def _file_sha256(path: Path) -> str | None:
    return checkpoint.file_sha256(path) if path.is_file() else None


def run_identity(cfg: TrainConfig, recipe: recipes.Recipe, world: int) -> dict[str, Any]:
    """What determines a run's trajectory, world-size independent: the resolved model and recipe, seed, schedule,
    global batch, optimizer, selection, data settings and the prepared data's identity. Not in it: where and how
    often the run logs or checkpoints, the backend (the same bits on every backend) and the world size itself.

    ``recipe`` is the run's recipe resolved against its model (:meth:`TrainConfig.resolved_recipe`), so the identity
    holds the absolute layer indices the run converted with."""
    assert not recipe.is_relative, f"run_identity needs the recipe resolved for the model, got {recipe.name!r}"
    data: dict[str, Any] = {}
    if cfg.data:
        from ue5m3 import data as data_pkg

        data_cfg = data_pkg.DataConfig.from_dict(dict(cfg.data))
        paths = data_pkg.data_paths(data_cfg)
        data = {
            "config": config_loader.dump(data_cfg),
            "corpus_manifest_sha256": _file_sha256(paths.corpus / "manifest.json"),
            "tokenizer_sha256": _file_sha256(paths.tokenizer),
        }
        data["config"].pop("data_dir", None)  # where it lies is not what it is
        data["config"].pop("prepare_parts", None)  # how many jobs prepared it neither: the bytes are the same
    return config_loader.dump(
        {
            "model": cfg.model,
            "model_config": dataclasses.asdict(models.config(cfg.model, **cfg.model_overrides)),
            "recipe": recipe.to_dict(),
            "seed": cfg.seed,
            "steps": cfg.steps,
            "global_micro_batch": cfg.micro_batch * world,
            "accumulation": cfg.accumulation,
            "optim": cfg.optim,
            "fp4_select": cfg.fp4_select,
            "cold_scale_resume": cfg.cold_scale_resume,
            "execution": cfg.execution,
            "data": data,
        }
    )


def fingerprint(identity: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def identity_differences(recorded: Mapping[str, Any] | None, current: Mapping[str, Any]) -> list[str]:
    """'key: checkpoint X, config Y' for every setting that differs (the whole identity when none was recorded)."""
    if recorded is None:
        return ["<identity>: the checkpoint records none (written before run identities, or not by this trainer)"]
    old, new = _flatten(recorded), _flatten(current)
    return [
        f"{key}: checkpoint {old.get(key, '<absent>')!r}, config {new.get(key, '<absent>')!r}"
        for key in sorted(set(old) | set(new))
        if old.get(key, "<absent>") != new.get(key, "<absent>")
    ]


def _check_identity(path: Path, manifest: Mapping[str, Any], identity: Mapping[str, Any]) -> None:
    recorded = manifest.get("meta", {}).get("identity")
    if recorded is not None and manifest["meta"].get("fingerprint") == fingerprint(identity):
        return
    differences = identity_differences(recorded, identity)
    if differences:
        listed = "\n  ".join(differences)
        raise RunIdentityError(
            f"checkpoint {path} belongs to another run; what differs:\n  {listed}\n"
            "use a new run directory, or `ue5m3 train --restart-on-change` to set this one aside and start afresh"
        )


def _prepare_run_dir(run_dir: Path, identity: Mapping[str, Any], restart_on_change: bool) -> bool:
    """Rank 0, holding the run lock: remove killed saves' temporaries; if the newest valid checkpoint is another
    run's, refuse (naming what differs) or, with ``restart_on_change``, move the whole directory aside (returns
    True then: the caller locks the new, empty directory)."""
    root = run_dir / "checkpoints"
    for path in checkpoint.remove_temporaries(root):
        log0(f"removed {path} (a checkpoint save that was interrupted)")
    found = checkpoint.newest_valid(root)
    if found is None:
        return False
    try:
        _check_identity(*found, identity)
        return False
    except RunIdentityError as err:
        if not restart_on_change:
            raise
        old = found[1].get("meta", {}).get("fingerprint") or "unidentified"
        aside = run_dir.with_name(f"{run_dir.name}.superseded-{old[:12]}")
        n = 1
        while aside.exists():
            n += 1
            aside = run_dir.with_name(f"{run_dir.name}.superseded-{old[:12]}-{n}")
        os.replace(run_dir, aside)  # the lock file moves with it; this process still holds the lock on it
        run_dir.mkdir(parents=True)
        warnings.warn(f"{err}\nthe settings changed: moved the old run to {aside}; starting afresh", stacklevel=2)
        return True


# ----- checkpoints --------------------------------------------------------------------------------------


def _rng_state() -> dict[str, Any]:
    """Every RNG state, as tensors and plain Python values (loadable with ``weights_only=True``)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    numpy_state = {
        "kind": kind,
        "keys": torch.from_numpy(keys.astype(np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "gauss": float(gauss),
    }
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": numpy_state}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(tuple(tuple(x) if isinstance(x, list) else x for x in state["python"]))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _rng_for(saved: list, rank: int) -> Mapping[str, Any]:
    """This rank's generator states; on another world size rank r takes saved rank (r mod old world)'s. The
    trajectory does not depend on them: after initialisation the trainer draws nothing from the torch, numpy or
    Python generators (stochastic-rounding bits and RHT signs are counter-based, keyed by the seed and global
    token positions; the data order has its own seeded generator)."""
    return saved[rank % len(saved)]


def save_checkpoint(
    run_dir: Path, step: int, model, optimizer, stream: BatchStream, counters: dict, identity: Mapping[str, Any]
) -> Path:
    """One process writes a ``full`` checkpoint; many write a ``sharded`` one, each rank its own shards through
    ``torch.distributed.checkpoint`` (nothing gathered to rank 0). The data cursor is the same on every rank
    (all ranks advance one global cursor); the RNG states are gathered, one per rank."""
    rank, world = _world()
    state = find_scale_state(model)
    trainer = {
        "step": step,
        "rng": [_rng_state()],
        "data": [stream.state_dict()],
        "counters": dict(counters),
        "scale": state.state_dict() if state is not None else None,
    }
    meta = {"world_size": world, "identity": dict(identity), "fingerprint": fingerprint(identity)}
    root = run_dir / "checkpoints"
    if world == 1:
        parts = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "trainer": trainer}
        return checkpoint.save(root, step, parts, meta=meta)
    from torch.distributed.checkpoint.state_dict import get_state_dict

    rngs: list[Any] = [None] * world
    dist.all_gather_object(rngs, _rng_state())
    trainer["rng"] = rngs
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return checkpoint.save_sharded(
        root, step, {"model": model_sd, "optimizer": optim_sd}, {"trainer": trainer}, meta=meta
    )


def _load_state(path: Path, manifest: Mapping[str, Any], parts: Mapping[str, Any], model, optimizer) -> None:
    """Model and optimizer state from either checkpoint format onto this run's world size (resharded by
    ``torch.distributed.checkpoint`` when the writer had another)."""
    world = _world()[1]
    if checkpoint.checkpoint_format(manifest) == checkpoint.FULL:
        if world == 1:
            model.load_state_dict(parts["model"])
            optimizer.load_state_dict(parts["optimizer"])
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        # a one-process checkpoint continued on many: every rank reads the full state and keeps its shards
        set_state_dict(
            model,
            optimizer,
            model_state_dict=parts["model"],
            optim_state_dict=_fqn_optimizer_state(model, optimizer, parts["optimizer"]),
            options=StateDictOptions(full_state_dict=True),
        )
        return
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)  # the shapes (and shards) this run expects
    for name, target in (("model", model_sd), ("optimizer", optim_sd)):
        dcp.load({name: target}, checkpoint_id=path / name)  # in place; no process group needed for one rank
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)


def _fqn_optimizer_state(model, optimizer, saved: Mapping[str, Any]) -> dict:
    """A plain ``optimizer.state_dict()`` (parameters by index) keyed by parameter names, as ``set_state_dict``
    expects; the index order is the order of ``model.named_parameters()`` the optimizer was built from."""
    by_id = {id(param): name for name, param in model.named_parameters()}
    grouped = [[by_id[id(param)] for param in group["params"]] for group in optimizer.param_groups]
    names = [name for group in grouped for name in group]
    state = {names[int(i)]: value for i, value in saved["state"].items()}
    groups = [
        {**{k: v for k, v in group.items() if k != "params"}, "params": group_names}
        for group, group_names in zip(saved["param_groups"], grouped, strict=True)
    ]
    return {"state": state, "param_groups": groups}


def resume(
    run_dir: Path, model, optimizer, stream: BatchStream, cfg: TrainConfig, identity: Mapping[str, Any]
) -> tuple[int, dict]:
    """Restore the newest checkpoint that verifies and is this run's (older ones are tried when the newest does
    not verify; another run's is refused, naming what differs), on this run's world size whatever the writer's.
    Returns (step, counters)."""
    found = checkpoint.newest_valid(run_dir / "checkpoints")
    if found is None:
        return 0, {"loss_above_3": 0, "grad_norm_above_1": 0}
    latest, manifest = found
    _check_identity(latest, manifest, identity)
    parts, manifest = checkpoint.load(latest)
    _load_state(latest, manifest, parts, model, optimizer)
    rank, world = _world()
    trainer = parts["trainer"]
    state = find_scale_state(model)
    if state is not None and trainer["scale"] is not None:
        state.load_state_dict(trainer["scale"], cold=cfg.cold_scale_resume)
    stream.load_state_dict(trainer["data"][0])  # one global cursor, the same on every rank
    _set_rng_state(_rng_for(trainer["rng"], rank))
    written_by = manifest["meta"]["world_size"]
    moved = "" if written_by == world else f", written by {written_by} ranks, resharded onto {world}"
    log0(f"resumed from {latest} (step {trainer['step']}{moved})")
    return trainer["step"], dict(trainer["counters"])


# ----- the run ------------------------------------------------------------------------------------------


def _append_jsonl(path: Path, record: Mapping[str, Any]) -> None:
    """One whole line per record in one O_APPEND write, flushed to disk: a kill leaves at most a torn last line."""
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop records after ``step`` (written after the checkpoint a resume starts from). A torn last line (a kill
    mid-write) is dropped with a warning naming the file; a malformed line elsewhere is an error naming its line."""
    if not path.exists():
        return
    lines = path.read_bytes().decode("utf-8", errors="replace").split("\n")
    kept = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            record_step = record["step"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            if all(not rest.strip() for rest in lines[number:]):
                warnings.warn(f"{path}: line {number} is torn (an interrupted write); dropped it", stacklevel=2)
                break
            raise ValueError(f"{path}: line {number} is not a metrics record ({err}): {line[:80]!r}") from None
        if record_step <= step:
            kept.append(line)
    with atomic_path(path) as tmp:
        tmp.write_text("".join(line + "\n" for line in kept))


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


class Stopped(SystemExit):
    """The run was asked to stop (SIGTERM: a preemption or ``scancel``; SIGUSR1: SLURM's ``--signal`` before the time
    limit) and wrote a checkpoint first; the same command resumes it. Exit status 128 + the signal number."""


class _StopRequests:
    """SIGTERM and SIGUSR1 set a flag that the loop reads between steps (a handler never runs a collective)."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopRequests:
        for signum in self.SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.signum = signum

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def requested(self, device: torch.device) -> int | None:
        """The signal any rank received (all ranks agree, so they checkpoint and stop at the same step)."""
        if _world()[1] == 1:
            return self.signum
        flag = torch.tensor([self.signum or 0], dtype=torch.int64, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag) or None


def train(
    cfg: TrainConfig,
    stream: BatchStream | None = None,
    *,
    stop_after: int | None = None,
    restart_on_change: bool = False,
) -> Path | None:
    """Run (or resume) training; returns the final record's path, or None when stopped early by ``stop_after``.

    Rank 0 holds the run directory's lock for the whole run. A checkpoint of another run (different identity) is
    refused, or with ``restart_on_change`` the old directory is moved aside. SIGTERM/SIGUSR1 write a checkpoint at
    the end of the current step and raise :class:`Stopped`.
    """
    if cfg.execution is Execution.NATIVE_TE:
        native_te.require_native()  # off Blackwell: fail before the run directory is touched, never run emulated
    rank, world = _world()
    run_dir = Path(cfg.run_dir)
    recipe = cfg.resolved_recipe()  # absolute layer indices of this model, for the build and the identity
    identity = run_identity(cfg, recipe, world)
    with contextlib.ExitStack() as stack:
        if rank == 0:
            stack.enter_context(checkpoint.RunLock(run_dir))
            if _prepare_run_dir(run_dir, identity, restart_on_change):
                stack.enter_context(checkpoint.RunLock(run_dir))  # the old lock moved aside with the old run
        if world > 1:
            dist.barrier()
        stops = stack.enter_context(_StopRequests())
        return _train_locked(cfg, recipe, identity, stream, stop_after, stops)


def _train_locked(
    cfg: TrainConfig,
    recipe: recipes.Recipe,
    identity: Mapping[str, Any],
    stream: BatchStream | None,
    stop_after: int | None,
    stops: _StopRequests,
) -> Path | None:
    rank, world = _world()
    run_dir = Path(cfg.run_dir)
    torch.manual_seed(cfg.seed + rank)  # any torch randomness per rank; SR bits and init weights come from cfg.seed
    random.seed(cfg.seed + rank)
    np.random.seed(cfg.seed + rank)
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    model, records = build_model(cfg, recipe, device)
    optimizer = torch.optim.AdamW(
        param_groups(model, cfg.optim.weight_decay),
        lr=cfg.optim.lr,
        betas=cfg.optim.betas,
        eps=cfg.optim.eps,
        foreach=False,
    )
    if stream is None:
        stream = open_training_stream(cfg, rank, world)
    start, counters = resume(run_dir, model, optimizer, stream, cfg, identity)
    metrics = run_dir / "metrics.jsonl"
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json(run_dir / RESOLVED_CONFIG, cfg.to_dict())
        write_json(run_dir / "conversion.json", [dataclasses.asdict(r) for r in records])
        _truncate_metrics(metrics, start)
    stats = find_quant_stats(model)
    tokens_per_step = cfg.micro_batch * cfg.accumulation * world * int(stream.sequence_length)
    last = start
    log0(
        f"training {run_dir} (recipe {recipe.name}, {world} process(es), {tokens_per_step} tokens per step) "
        f"from step {start} to {cfg.steps}"
    )
    # a bar on a terminal; in a log file (the pipeline's train.log) one line per logged step
    progress = Progress(
        "train",
        total=cfg.steps,
        initial=start,
        unit="step",
        logger=logger,
        interval_s=None,
        rate=False,
        enabled=rank == 0,
    )

    def save(step: int) -> None:
        save_checkpoint(run_dir, step, model, optimizer, stream, counters, identity)
        if rank == 0:
            protect = tuple(range(cfg.keep_every, cfg.steps + 1, cfg.keep_every)) if cfg.keep_every else ()
            checkpoint.prune(run_dir / "checkpoints", cfg.keep_checkpoints, protect=protect)

    for step in _steps(start, cfg.steps, progress):
        began = time.perf_counter()
        record = train_step(step, model, optimizer, stream, cfg, recipe)
        record["tokens_per_s"] = tokens_per_step / (time.perf_counter() - began)
        counters["loss_above_3"] += int(record["loss"] > 3)
        counters["grad_norm_above_1"] += int(record["grad_norm"] > 1)
        if stats is not None:
            record.update(stats.pop())
        logged = step % cfg.log_every == 0 or step == cfg.steps
        if rank == 0 and logged:
            _append_jsonl(metrics, record)
        progress.update(figures=_figures(record), report=logged)
        saved = step % cfg.checkpoint_every == 0 or step == cfg.steps
        if saved:
            save(step)
        last = step
        signum = stops.requested(device)
        if signum is not None and step < cfg.steps:
            if not saved:
                save(step)
            log0(f"stopped by {signal.Signals(signum).name} after step {step} (checkpoint written); rerun to resume")
            raise Stopped(128 + signum)
        if stop_after is not None and step >= stop_after:
            return None
    return _finish(run_dir, cfg, recipe, counters, last) if rank == 0 else None


def open_training_stream(cfg: TrainConfig, rank: int, world: int) -> BatchStream:
    """This rank's training loader over the prepared token shards; the tokenizer must match the model."""
    from ue5m3 import data

    data_cfg = data.DataConfig.from_dict(dict(cfg.data))
    vocab = models.config(cfg.model, **cfg.model_overrides).vocab_size
    if vocab != data_cfg.vocab_size:
        raise ValueError(
            f"model {cfg.model!r} has vocab_size {vocab} but data.vocab_size is {data_cfg.vocab_size}; "
            "set model_overrides.vocab_size to the tokenizer's size"
        )
    return data.open_data(data_cfg, rank=rank, world_size=world).train


def _finish(run_dir: Path, cfg: TrainConfig, recipe: recipes.Recipe, counters: dict, step: int) -> Path:
    final_ckpt, manifest = checkpoint.newest_valid(run_dir / "checkpoints")
    record = provenance(
        "train",
        cfg.to_dict(),
        recipe=recipe.name,
        seed=cfg.seed,
        step=step,
        counters=counters,
        checkpoint=str(final_ckpt),
        checkpoint_sha256=checkpoint.weights_sha256(manifest),
        execution=native_te.execution_path(recipe, cfg.execution, cfg.backend),
    )
    write_json(run_dir / "final.json", record)
    return run_dir / "final.json"


def main(config_path: str, threads: int | None = None, *, restart_on_change: bool = False) -> int:
    """Entry point of ``ue5m3 train``: initialises torch.distributed under torchrun (gloo on CPU)."""
    cfg = TrainConfig.from_yaml(config_path)
    if threads:
        torch.set_num_threads(threads)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    try:
        train(cfg, restart_on_change=restart_on_change)
    finally:
        if distributed:
            dist.destroy_process_group()
    return 0
