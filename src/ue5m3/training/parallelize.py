"""Activation checkpointing and FSDP2, composed onto the plain model from outside in torchtitan's order.

The models know nothing of either (style rule 7); :func:`ue5m3.training.build.build_model` applies them after the
FP4 conversion and before the weights are materialised (pipeline spec, "Distributed training": activation
checkpointing, then ``fully_shard`` per block and the root).

Activation checkpointing (:func:`apply_activation_checkpointing`) wraps each chosen residual block with
``torch.distributed._composable.checkpoint``: non-reentrant ``torch.utils.checkpoint`` through module hooks, so
module names, parameter names and state dicts stay as they are (a ``checkpoint_wrapper`` would insert
``_checkpoint_wrapped_module`` into every name). The block's forward pass runs without keeping its
activations and runs again in the backward pass, inside :func:`ue5m3.layers.telemetry.recomputing`: the FP4
linears then resolve the same call (held scale references, the same SR streams, the same cached weight
quantizations) and count their diagnostics and deferred checks into scratch, so each is counted once. The
recomputed forward pass gives the same bits, so a run with checkpointing equals the run without it.

FSDP2 (:func:`apply_fsdp`): ``fully_shard`` per block then the root, with ``MixedPrecisionPolicy(param_dtype,
reduce_dtype=float32)`` where ``param_dtype`` is the run's (``bfloat16`` as the paper ran: BF16 parameters in the
passes, FP32 master weights, gradients reduced in FP32; with ``fp4_weight_dtype: float32`` each FP4 linear is its
own FP32 unit). The blocks reshard after their forward pass by torchtitan's default policy (all but the last
block, whose parameters the backward pass needs at once); the root keeps its parameters gathered (FSDP2's rule for
the root: the chunked loss reads the head after the body's forward pass). Prefetching is FSDP2's implicit one, or
explicit over ``fsdp_prefetch`` blocks. Gradient sync per step is the trainer's (:func:`gradient_sync`).

:func:`fsdp_settings` is what a run records of these choices (its resolved config holds the settings).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from ue5m3 import models
from ue5m3.layers.telemetry import recomputing
from ue5m3.training.config import TrainConfig

__all__ = [
    "ContextFn",
    "checkpointed_blocks",
    "checkpoint_blocks",
    "apply_activation_checkpointing",
    "mixed_precision_policy",
    "reshard_after_forward",
    "apply_fsdp",
    "is_sharded",
    "uses_fsdp",
    "gradient_sync",
    "fsdp_settings",
    "preserve_param_attributes",
]


# ----- activation checkpointing -------------------------------------------------------------------------

ContextFn = Callable[[], tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]]
"""``torch.utils.checkpoint``'s ``context_fn``: () -> (context of the first forward pass, of its recomputation)."""


def checkpointed_blocks(model: nn.Module, cfg: TrainConfig) -> list[int]:
    """The indices of the blocks ``cfg.activation_checkpointing`` recomputes (``selective``: those with a kind in
    ``cfg.checkpoint_kinds``)."""
    mode = cfg.activation_checkpointing
    if mode == "none":
        return []
    kinds = models.layer_kinds(model.config)
    if mode == "every_block":
        return list(range(len(kinds)))
    return [i for i, block_kinds in enumerate(kinds) if block_kinds & set(cfg.checkpoint_kinds)]


@contextlib.contextmanager
def _recomputation(inner: contextlib.AbstractContextManager | None) -> Iterator[None]:
    """Around a recomputed forward pass: ``inner`` (a caller's recompute context), the pass marked for the FP4
    linears (:func:`~ue5m3.layers.telemetry.recomputing`)."""
    with inner if inner is not None else contextlib.nullcontext(), recomputing():
        yield


def _marked(contexts: ContextFn | None) -> ContextFn:
    """``contexts`` (e.g. Transformer Engine's recompute contexts) with the recomputation marked."""

    def context_fn() -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
        forward, recompute = contexts() if contexts is not None else (contextlib.nullcontext(), None)
        return forward, _recomputation(recompute)

    return context_fn


def checkpoint_blocks(model: nn.Module, indices: Sequence[int], contexts: ContextFn | None = None) -> None:
    """Checkpoint blocks ``indices`` of ``model`` (:func:`ue5m3.models.blocks`): non-reentrant, RNG state preserved,
    torch's default determinism check (the recomputed saved tensors' shapes and dtypes are compared with the first
    pass's). ``contexts`` adds a caller's forward and recompute contexts (the native path's Transformer Engine
    ones); the whole forward pass is then recomputed (no early stop), as TE's own non-reentrant checkpoint does."""
    from torch.distributed._composable import checkpoint  # noqa: PLC0415 - hooks-based, names unchanged

    blocks = models.blocks(model)
    for i in indices:
        checkpoint(blocks[i], context_fn=_marked(contexts), early_stop=contexts is None)


def apply_activation_checkpointing(model: nn.Module, cfg: TrainConfig, contexts: ContextFn | None = None) -> list[int]:
    """Checkpoint the blocks :func:`checkpointed_blocks` names (:func:`checkpoint_blocks`), before ``fully_shard``
    (torchtitan's order); returns their indices."""
    chosen = checkpointed_blocks(model, cfg)
    checkpoint_blocks(model, chosen, contexts)
    return chosen


# ----- FSDP2 ----------------------------------------------------------------------------------------------


def mixed_precision_policy(dtype: torch.dtype) -> Any:
    """FSDP2's policy for parameters gathered in ``dtype``, gradients reduced in FP32. Inputs are not cast
    (as torchtitan): the blocks pass their activations on in the dtype they compute in."""
    from torch.distributed.fsdp import MixedPrecisionPolicy  # noqa: PLC0415

    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32, cast_forward_inputs=False)


def reshard_after_forward(policy: str, index: int, count: int) -> bool:
    """Whether block ``index`` of ``count`` frees its gathered parameters after its forward pass: ``default`` all but
    the last (the backward pass starts there), ``always`` every block, ``never`` none."""
    if policy == "always":
        return True
    if policy == "never":
        return False
    return index < count - 1


def apply_fsdp(model: nn.Module, cfg: TrainConfig, fp4_linears: Sequence[str] = ()) -> nn.Module:
    """``fully_shard`` each block, then the root, under the run's precision, reshard and prefetch settings (the
    parameters may still be on the meta device). With ``param_dtype: bfloat16`` and ``fp4_weight_dtype: float32``
    each FP4 linear (``fp4_linears``: the converted modules' names) is first its own unit, gathered in FP32.
    Returns the model (now an FSDP module)."""
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415

    dtype = torch.bfloat16 if cfg.mixed_precision else torch.float32
    policy = mixed_precision_policy(dtype)
    fp32_units = cfg.mixed_precision and cfg.fp4_weight_dtype == "float32"
    blocks = models.blocks(model)
    inside = {id(block): [] for block in blocks}
    for name in fp4_linears if fp32_units else ():
        linear = model.get_submodule(name)
        for block in blocks:
            if any(m is linear for m in block.modules()):
                inside[id(block)].append(linear)
    for i, block in enumerate(blocks):
        reshard = reshard_after_forward(cfg.fsdp_reshard_after_forward, i, len(blocks))
        for linear in inside[id(block)]:
            fully_shard(linear, mp_policy=mixed_precision_policy(torch.float32), reshard_after_forward=reshard)
        fully_shard(block, mp_policy=policy, reshard_after_forward=reshard)
    fully_shard(model, mp_policy=policy)  # the root: gathered from its forward pass into the backward pass
    _set_prefetch(blocks, cfg.fsdp_prefetch)
    return model


def _set_prefetch(blocks: list[nn.Module], depth: int) -> None:
    """Explicit prefetching: each block's forward pass issues the all-gathers of the next ``depth`` blocks, its
    backward pass those of the ``depth`` blocks before it (0: FSDP2's implicit prefetching)."""
    if depth == 0:
        return
    for i, block in enumerate(blocks):
        after = blocks[i + 1 : i + 1 + depth]
        before = blocks[max(0, i - depth) : i][::-1]
        if after:
            block.set_modules_to_forward_prefetch(after)
        if before:
            block.set_modules_to_backward_prefetch(before)


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model`` is FSDP2-sharded (its state dicts are DTensor shards, whatever the world size)."""
    from torch.distributed.fsdp import FSDPModule  # noqa: PLC0415

    return isinstance(model, FSDPModule)


@contextlib.contextmanager
def gradient_sync(model: nn.Module, cfg: TrainConfig, last: bool) -> Iterator[None]:
    """Around one microbatch's forward and backward: FSDP2 reduce-scatters in the last microbatch only
    (``gradient_sync: last_microbatch``; the others accumulate unsharded gradients in FP32), or in every one; DDP
    all-reduces in the last one only (``no_sync`` for the others)."""
    if is_sharded(model):
        model.set_requires_gradient_sync(last or cfg.gradient_sync == "every_microbatch")
        yield
    elif not last and hasattr(model, "no_sync"):
        with model.no_sync():
            yield
    else:
        yield


@contextlib.contextmanager
def preserve_param_attributes(model: nn.Module) -> Iterator[None]:
    """Keep the custom Python attributes of the parameters across ``fully_shard`` (which replaces every Parameter
    by a DTensor one): what Transformer Engine's own FSDP2 tests do around ``fully_shard`` of ``te.Linear``
    modules, whose parameters carry attributes TE reads."""
    saved = {name: dict(vars(param)) for name, param in model.named_parameters()}
    yield
    for name, param in model.named_parameters():
        for key, value in saved.get(name, {}).items():
            setattr(param, key, value)


def uses_fsdp(cfg: TrainConfig, world_size: int) -> bool:
    """Whether the run's model is FSDP2-sharded: many processes under FSDP2, or a ``bfloat16`` run (FSDP2's mixed
    precision) on any number."""
    return cfg.parallelism == "fsdp2" and (world_size > 1 or cfg.mixed_precision)


def fsdp_settings(cfg: TrainConfig, world_size: int) -> dict[str, Any]:
    """What a run's data parallelism and memory settings resolve to (for its provenance)."""
    sharded = uses_fsdp(cfg, world_size)
    settings: dict[str, Any] = {
        "data_parallel": cfg.parallelism if sharded or world_size > 1 else "none",
        "world_size": world_size,
        "activation_checkpointing": cfg.activation_checkpointing,
        "ssd_groups_per_pass": cfg.ssd_groups_per_pass,
        "loss_chunk": cfg.loss_chunk,
        "param_dtype": cfg.param_dtype,
    }
    if sharded:
        settings.update(
            reduce_dtype="float32",
            fp4_weight_dtype="bfloat16" if cfg.mixed_precision and cfg.fp4_weight_dtype == "param" else "float32",
            gradient_sync=cfg.gradient_sync,
            reshard_after_forward=cfg.fsdp_reshard_after_forward,
            root_reshard_after_forward=False,
            prefetch="implicit" if cfg.fsdp_prefetch == 0 else f"explicit, {cfg.fsdp_prefetch} blocks",
        )
    return settings
