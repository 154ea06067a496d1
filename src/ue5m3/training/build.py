"""The build order of a training run, fixed in one place (style rule 8), and the optimizer it ends with.

A run is built from its config in this order, always (:func:`build_model` takes steps 1-5, the trainer then calls
:func:`build_optimizer`):

1. build the model on the meta device (no memory, no initialisation);
2. convert the selected linears (``fp4_select``, default every eligible linear) to the recipe's FP4 layers, with
   the run's stochastic-rounding streams and weight caching;
3. activation checkpointing of the chosen blocks and the scan's passes (:mod:`~ue5m3.training.parallelize`; both
   leave names and parameters as they are);
4. with FSDP2 (many processes, or a ``bfloat16`` run on any number), ``fully_shard`` each block, then the root,
   under the run's mixed-precision policy (:func:`~ue5m3.training.parallelize.apply_fsdp`);
5. materialise the parameters on the device and load the deterministic initial weights (:func:`initial_state`: one
   CPU initialisation from the seed, so every world size starts from the same bits); with many processes and DDP,
   replicate;
6. create the optimizer (:func:`build_optimizer`): AdamW over :func:`param_groups`, which keeps weight decay off
   biases, norms and Mamba's scalars.

A ``native_te`` run (Transformer Engine's NVFP4 linears on Blackwell) materialises and loads the weights first and
converts after (:func:`ue5m3.layers.native_te.convert_native` copies the loaded weights into ``te.Linear``), then
checkpoints (with TE's recompute contexts) and shards the converted model the same way, keeping the parameters'
TE attributes across ``fully_shard`` as Transformer Engine 2.16's FSDP2 tests do.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ue5m3 import models
from ue5m3.layers import native_te, recipes
from ue5m3.layers.linear import WeightCaching, convert, set_weight_caching
from ue5m3.layers.native_te import Execution
from ue5m3.numerics.philox import SRState
from ue5m3.training import parallelize
from ue5m3.training.config import OptimConfig, TrainConfig
from ue5m3.training.ranks import world

__all__ = ["initial_state", "build_shell", "build_model", "param_groups", "build_optimizer"]


def initial_state(cfg: TrainConfig) -> dict[str, torch.Tensor]:
    """The deterministic initial weights of a run: a full model initialised on the CPU from the seed."""
    generator = torch.Generator().manual_seed(cfg.seed)
    return models.build(cfg.model, device="cpu", generator=generator, **cfg.model_overrides).state_dict()


def build_shell(
    cfg: TrainConfig,
    recipe: recipes.Recipe,
    *,
    rank: int = 0,
    world_size: int = 1,
    contexts: parallelize.ContextFn | None = None,
) -> tuple[nn.Module, tuple]:
    """Steps 1-3 of the emulated build, on the meta device: the model, its FP4 conversion (SR streams and weight
    caching as rank ``rank`` of ``world_size`` uses them) and its activation checkpointing (``contexts``: around a
    checkpointed block's forward pass and its recomputation); nothing sharded or materialised. The trainer
    continues it (:func:`build_model`); the plan measures it (:mod:`ue5m3.plan`).

    ``recipe`` names its layers by absolute index (:meth:`TrainConfig.resolved_recipe`)."""
    model = models.build(cfg.model, device="meta", **cfg.model_overrides)
    select = cfg.fp4_select if cfg.fp4_select is not None else tuple(models.eligible_linears(model))
    shard = parallelize.uses_fsdp(cfg, world_size)
    # SR bits are Philox streams of (seed, module, role, step, microbatch, global index): the same on any device,
    # thread count or world size (each rank's tokens sit at their place in the global microbatch)
    records = convert(
        model, recipe, select=select, sr_state=SRState(cfg.seed, rank=rank, world=world_size), backend=cfg.backend
    )
    # the weight is quantized once per optimizer step and reused by its microbatches; under FSDP2 the all-gathers
    # rewrite the unsharded weights every microbatch, so the key is the step alone (the trainer's contract)
    one_microbatch = cfg.accumulation_for(world_size) == 1
    set_weight_caching(
        model, WeightCaching.OFF if one_microbatch else WeightCaching.STEP if shard else WeightCaching.VERSION
    )
    _checkpoint(model, cfg, contexts)
    return model, records


def build_model(cfg: TrainConfig, recipe: recipes.Recipe, device: torch.device) -> tuple[nn.Module, tuple]:
    """Meta build -> FP4 conversion -> activation checkpointing (:func:`build_shell`) -> fully_shard per block and
    root -> materialise and load init weights.

    ``recipe`` names its layers by absolute index (:meth:`TrainConfig.resolved_recipe`)."""
    rank, world_size = world()
    if cfg.execution is Execution.NATIVE_TE:
        model = models.build(cfg.model, device="meta", **cfg.model_overrides)
        select = cfg.fp4_select if cfg.fp4_select is not None else tuple(models.eligible_linears(model))
        return _build_native(cfg, recipe, device, model, list(select))
    shard = parallelize.uses_fsdp(cfg, world_size)
    model, records = build_shell(cfg, recipe, rank=rank, world_size=world_size)
    if shard:
        parallelize.apply_fsdp(model, cfg, _converted(records))
    models.materialize(model, device)
    full = initial_state(cfg)
    if shard:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True))
        return model, records
    model.load_state_dict(full)
    return (_replicate(model, device) if world_size > 1 else model), records


def _converted(records: tuple) -> list[str]:
    return [r.name for r in records if r.status == "converted"]


def _checkpoint(model: nn.Module, cfg: TrainConfig, contexts: parallelize.ContextFn | None = None) -> None:
    """Step 3: the blocks that recompute their forward pass, and the Mamba-2 scan's passes."""
    parallelize.apply_activation_checkpointing(model, cfg, contexts)
    models.set_ssd_groups_per_pass(model, cfg.ssd_groups_per_pass or None)


def _build_native(
    cfg: TrainConfig, recipe: recipes.Recipe, device: torch.device, model: nn.Module, select: list[str]
) -> tuple[nn.Module, tuple]:
    """The ``native_te`` order: materialise and load, convert to ``te.Linear``, checkpoint under TE's recompute
    contexts, then FSDP2 (the TE parameters' attributes kept across ``fully_shard``) or DDP."""
    native_te.require_native()  # fails closed off Blackwell before anything is built
    world_size = world()[1]
    model.to_empty(device=device)
    model.load_state_dict(initial_state(cfg))
    records = native_te.convert_native(model, recipe, select=select)
    contexts = native_te.recompute_contexts(recipe) if cfg.activation_checkpointing != "none" else None
    _checkpoint(model, cfg, contexts)
    if parallelize.uses_fsdp(cfg, world_size):
        with parallelize.preserve_param_attributes(model):
            parallelize.apply_fsdp(model, cfg, _converted(records))
        return model, records
    return (_replicate(model, device) if world_size > 1 else model), records


def _replicate(model: nn.Module, device: torch.device) -> nn.Module:
    """DDP: every rank holds the whole model; gradients are averaged across ranks in the backward (the same
    average FSDP2's reduce-scatter takes). The initial weights are identical on every rank already."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


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


def build_optimizer(model: nn.Module, optim: OptimConfig) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups` with the run's optimizer settings: the build's last step."""
    return torch.optim.AdamW(
        param_groups(model, optim.weight_decay),
        lr=optim.lr,
        betas=optim.betas,
        eps=optim.eps,
        foreach=False,
    )
