"""The trainer's state in a checkpoint: what is saved after a step and restored on resume, bit for bit.

A checkpoint (the file format is :mod:`ue5m3.training.checkpoint`'s) holds four parts of a run's state:

- ``model`` and ``optimizer``: whole state dicts from an unsharded model (``full``: one process), or each rank's
  shards through ``torch.distributed.checkpoint`` from an FSDP2 one or from many processes (``sharded``); either
  loads onto any world size (:func:`resume` reshards);
- ``trainer``: the step, the data cursor (one global cursor, the same on every rank), every RNG state (one per
  rank), the stability counters and the scale caches (delayed amax references; ``cold_scale_resume`` drops them on
  load, as the paper's own runs did);
- the manifest's ``meta``: the writer's world size and the run identity with its fingerprint
  (:mod:`ue5m3.training.identity`), so a resume refuses another run's checkpoint.

Stopping after any step and resuming therefore reproduces the uninterrupted run exactly. The stream a run reads
is any :class:`BatchStream`: the data loader or a synthetic stream with the same interface.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist

from ue5m3.layers.linear import find_scale_state
from ue5m3.training import checkpoint
from ue5m3.training.config import TrainConfig
from ue5m3.training.identity import check_identity, fingerprint
from ue5m3.training.parallelize import is_sharded
from ue5m3.training.ranks import log0, world

__all__ = ["BatchStream", "save_checkpoint", "resume"]

FRESH_COUNTERS = {"loss_above_3": 0, "grad_norm_above_1": 0}
"""The stability counters of a run that starts at step 0."""


class BatchStream(Protocol):
    """What the trainer reads batches from: batches of ``sequence_length`` tokens, and a cursor to checkpoint."""

    sequence_length: int

    def next_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


# ----- RNG states ---------------------------------------------------------------------------------------


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


# ----- save ---------------------------------------------------------------------------------------------


def save_checkpoint(
    run_dir: Path, step: int, model, optimizer, stream: BatchStream, counters: dict, identity: Mapping[str, Any]
) -> Path:
    """One process with an unsharded model writes a ``full`` checkpoint; many (or an FSDP2 model on one) write a
    ``sharded`` one, each rank its own shards through ``torch.distributed.checkpoint`` (nothing gathered to rank
    0). The data cursor is the same on every rank (all ranks advance one global cursor); the RNG states are
    gathered, one per rank."""
    size = world()[1]
    state = find_scale_state(model)
    trainer = {
        "step": step,
        "rng": [_rng_state()],
        "data": [stream.state_dict()],
        "counters": dict(counters),
        "scale": state.state_dict() if state is not None else None,
    }
    meta = {"world_size": size, "identity": dict(identity), "fingerprint": fingerprint(identity)}
    root = run_dir / "checkpoints"
    if size == 1 and not is_sharded(model):
        parts = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "trainer": trainer}
        return checkpoint.save(root, step, parts, meta=meta)
    from torch.distributed.checkpoint.state_dict import get_state_dict

    rngs: list[Any] = [None] * size
    dist.all_gather_object(rngs, _rng_state())
    trainer["rng"] = rngs
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return checkpoint.save_sharded(
        root, step, {"model": model_sd, "optimizer": optim_sd}, {"trainer": trainer}, meta=meta
    )


# ----- resume -------------------------------------------------------------------------------------------


def _load_state(path: Path, manifest: Mapping[str, Any], parts: Mapping[str, Any], model, optimizer) -> None:
    """Model and optimizer state from either checkpoint format onto this run's world size (resharded by
    ``torch.distributed.checkpoint`` when the writer had another)."""
    if checkpoint.checkpoint_format(manifest) == checkpoint.FULL:
        if world()[1] == 1 and not is_sharded(model):
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
    found: tuple[Path, Mapping[str, Any]] | None,
    model,
    optimizer,
    stream: BatchStream,
    cfg: TrainConfig,
    identity: Mapping[str, Any],
) -> tuple[int, dict]:
    """Restore ``found``, the run's newest checkpoint that verifies and its verified manifest
    (:func:`~ue5m3.training.checkpoint.newest_valid`, which the ranks call together: the checkpoint is verified once
    per resume, and read here without hashing it again), on this run's world size whatever the writer's; another
    run's is refused, naming what differs.

    Returns:
        (the checkpoint's step, the stability counters): (0, fresh counters) when there is none.

    Raises:
        RunIdentityError: the checkpoint is another run's.
    """
    if found is None:
        return 0, dict(FRESH_COUNTERS)
    latest, manifest = found
    check_identity(latest, manifest, identity)
    parts, manifest = checkpoint.load(latest, manifest)
    _load_state(latest, manifest, parts, model, optimizer)
    rank, size = world()
    trainer = parts["trainer"]
    state = find_scale_state(model)
    if state is not None and trainer["scale"] is not None:
        state.load_state_dict(trainer["scale"], cold=cfg.cold_scale_resume)
    stream.load_state_dict(trainer["data"][0])  # one global cursor, the same on every rank
    _set_rng_state(_rng_for(trainer["rng"], rank))
    written_by = manifest["meta"]["world_size"]
    moved = "" if written_by == size else f", written by {written_by} ranks, resharded onto {size}"
    log0(f"resumed from {latest} (step {trainer['step']}{moved})")
    return trainer["step"], dict(trainer["counters"])
