"""Per-rank memory of one job's step, from the project's own build, conversion and parallelism on the meta device.

A training step's memory is split the way it is held:

* **parameters**: the FP32 master weights each rank holds (its FSDP2 shard, or the whole model under DDP or in
  one process), plus the parameters FSDP2 gathers for the passes, in the run's ``param_dtype``: the root's (the
  embedding, the final norm and the head stay gathered from the forward pass into the backward pass) and the
  blocks in flight (the current one and the prefetched ones; every block when they never reshard);
* **gradients**: the sharded FP32 gradients AdamW reads, plus, when gradients are reduced once per step over
  several microbatches (``gradient_sync: last_microbatch``), the unsharded FP32 accumulation FSDP2 keeps between
  them (``reduce_dtype`` float32), and one block's FP32 reduce-scatter input; DDP's buckets are a second copy;
* **optimizer**: AdamW's two FP32 moments of every master weight the rank holds;
* **FP4 caches**: the packed weight quantizations the FP4 linears keep for the step (:mod:`ue5m3.layers.weight_cache`);
* **activations**: what the forward pass leaves alive for the backward pass (saved tensors, checkpointed blocks'
  inputs, the hidden states the chunked loss keeps);
* **transient**: the largest excess over that during the backward pass (a checkpointed block's recomputation,
  its gradients, a loss chunk's logits, the GEMMs' scratch).

The first three are counted from the parameters' shapes as FSDP2 shards them (dim 0 in ``world_size`` chunks of
``ceil(rows / world_size)``, :func:`shard_numel`); the last three by running the step on the meta device under
:class:`~ue5m3.plan.tracking.LiveBytes`: the first microbatch of a step, forward and backward, of the model as
:func:`ue5m3.training.build.build_shell` builds it, in the compute dtype of the passes, with each parameter's
gradient dropped as soon as autograd produces it (FSDP2 reduce-scatters and frees it; the gradients term holds
what stays). Every FP4 GEMM and quantization runs its device kernels' allocations (``backend.planning``), not
the torch path's scratch. CUDA's BF16 autocast is not entered on the meta device: a ``bfloat16`` run computes in
BF16 anyway; an FP32-parameter run is counted in FP32 (an upper bound on its autocast activations). A Mamba-2 model
runs its own ``ssd_backend``: the torch scan as it is, the ``mamba_ssm`` scan as the allocations of its source
(:mod:`ue5m3.plan.ssd`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from ue5m3 import models
from ue5m3.layers.linear import QuantLinear, find_scale_state, find_sr_state
from ue5m3.numerics.backend import planning
from ue5m3.plan import ssd
from ue5m3.plan.tracking import LiveBytes
from ue5m3.training import parallelize
from ue5m3.training.build import build_shell
from ue5m3.training.config import TrainConfig
from ue5m3.training.loss import lm_loss

__all__ = ["MemoryTerms", "shard_numel", "static_terms", "measure_step", "training_memory", "MEASURED_MICROBATCHES"]

MEASURED_MICROBATCHES = 1
"""Microbatches the meta step runs. The first microbatch of every step is the most demanding: it quantizes and
caches the weights (the caches are step-keyed), the others reuse them; what it leaves alive is the same."""

FP32 = 4


@dataclass(frozen=True)
class MemoryTerms:
    """Bytes per rank of one job's step, by what holds them (module docstring)."""

    parameters: int
    gradients: int
    optimizer: int
    fp4_caches: int
    activations: int
    transient: int

    @property
    def peak(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.fp4_caches + self.activations + self.transient


def shard_numel(shape: torch.Size | tuple[int, ...], world_size: int) -> int:
    """Elements of one rank's FSDP2 shard of a parameter: dim 0 cut into ``world_size`` chunks of ceil(rows / world
    size), padded (FSDP2's ``chunk`` layout, which pads every rank's shard to the largest)."""
    if not shape:
        return 1
    rest = math.prod(shape[1:])
    return math.ceil(shape[0] / world_size) * rest


def _units(model: nn.Module) -> tuple[list[list[nn.Parameter]], list[nn.Parameter]]:
    """The parameters of each block (one FSDP2 unit each) and the root's (all others)."""
    blocks = [list(block.parameters()) for block in models.blocks(model)]
    inside = {id(p) for block in blocks for p in block}
    return blocks, [p for p in model.parameters() if id(p) not in inside]


def _gathered_bytes(params: list[nn.Parameter], world_size: int, dtype_bytes: int) -> int:
    """An FSDP2 all-gather's output: every rank's padded shard of every parameter, in the compute dtype."""
    return sum(shard_numel(p.shape, world_size) * world_size * dtype_bytes for p in params)


def static_terms(model: nn.Module, cfg: TrainConfig, world_size: int, *, optimizer: bool = True) -> dict[str, int]:
    """Parameters, gradients and optimizer state per rank (bytes) of ``model`` (the unsharded shell) under the run's
    parallelism at ``world_size``."""
    params = [p for p in model.parameters() if p.requires_grad]
    full = sum(p.numel() for p in params) * FP32
    if not parallelize.uses_fsdp(cfg, world_size):
        ddp = world_size > 1
        return {
            "parameters": sum(p.numel() for p in model.parameters()) * FP32,  # frozen ones too (a snapshot's)
            "gradients": full * (2 if ddp else 1),  # DDP's buckets hold a second copy of the gradients
            "optimizer": 2 * full if optimizer else 0,
        }
    sharded = sum(shard_numel(p.shape, world_size) for p in params) * FP32
    compute_bytes = 2 if cfg.mixed_precision else FP32
    blocks, root = _units(model)
    block_bytes = [_gathered_bytes(b, world_size, compute_bytes) for b in blocks]
    if cfg.fsdp_reshard_after_forward == "never":
        in_flight = sum(block_bytes)
    else:
        in_flight = sum(sorted(block_bytes, reverse=True)[: 1 + max(1, cfg.fsdp_prefetch)])
    gathered = _gathered_bytes(root, world_size, compute_bytes) + in_flight
    unsharded_fp32 = sum(shard_numel(p.shape, world_size) * world_size for p in params) * FP32
    accumulated = (
        unsharded_fp32 if cfg.accumulation_for(world_size) > 1 and cfg.gradient_sync == "last_microbatch" else 0
    )
    largest_block_fp32 = max(block_bytes, default=0) // compute_bytes * FP32
    return {
        "parameters": sharded + gathered,
        "gradients": sharded + accumulated + largest_block_fp32,
        "optimizer": 2 * sharded if optimizer else 0,
    }


def _compute_dtype(model: nn.Module, cfg: TrainConfig) -> None:
    """The parameters as the passes see them: BF16 under FSDP2's mixed precision (an FP4 linear's weight stays FP32
    with ``fp4_weight_dtype: float32``), else as built."""
    if not cfg.mixed_precision:
        return
    keep = set()
    if cfg.fp4_weight_dtype == "float32":
        keep = {id(m.weight) for m in model.modules() if isinstance(m, QuantLinear)}
    for p in model.parameters():
        if id(p) not in keep:
            p.data = p.data.to(torch.bfloat16)


@contextlib.contextmanager
def _dropping_gradients(model: nn.Module) -> Iterator[None]:
    """Each parameter's gradient freed as soon as it is accumulated (FSDP2 reduce-scatters and frees it)."""

    def drop(p: torch.Tensor) -> None:
        p.grad = None

    handles = [p.register_post_accumulate_grad_hook(drop) for p in model.parameters() if p.requires_grad]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


class _FusedAttention(TorchFunctionMode):
    """On the meta device, ``scaled_dot_product_attention`` as a device runs it: a fused kernel that keeps its output
    and log-sum-exp, not the math fallback's [B, H, T, T] scores, which is all the meta device would otherwise
    choose. The fused kernel is the CPU's (its meta implementation; grouped key/value heads taken as they are, as
    the CPU's and CUDA's flash kernels take them), so the counts equal a CPU step's exactly (tests/test_plan.py)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention or args[0].device.type != "meta":
            return func(*args, **kwargs)
        q, k, v = args[:3]
        if kwargs.get("attn_mask") is not None or kwargs.get("dropout_p", 0.0):
            return func(*args, **kwargs)
        out, _ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, bool(kwargs.get("is_causal", False)), scale=kwargs.get("scale")
        )
        return out


def _caches(model: nn.Module) -> int:
    return sum(m.weight_cache.nbytes for m in model.modules() if isinstance(m, QuantLinear))


@dataclass(frozen=True)
class StepCounts:
    """What the meta step left alive and at most, over the measured microbatches (bytes)."""

    fp4_caches: int
    activations: int
    transient: int


def measure_step(
    model: nn.Module,
    step: callable,
    microbatches: int = MEASURED_MICROBATCHES,
    exclude: tuple[torch.Tensor, ...] = (),
) -> StepCounts:
    """Run ``step(microbatch) -> (end_of_forward, backward)`` (two callables per microbatch) under
    :class:`LiveBytes` and count the caches, what each forward pass leaves alive and the largest excess over it."""
    tracker = LiveBytes(exclude=(*model.parameters(), *model.buffers(), *exclude))
    activations = transient = caches = 0
    with _dropping_gradients(model), _FusedAttention(), tracker:
        for microbatch in range(microbatches):
            forward, backward = step(microbatch)
            tracker.reset_peak()
            out = forward()
            held = tracker.live
            caches = _caches(model)
            activations = max(activations, held - caches)
            tracker.reset_peak()
            backward(out)
            del out
            transient = max(transient, tracker.peak - held)
    return StepCounts(fp4_caches=caches, activations=activations, transient=transient)


def _begin(model: nn.Module, step: int, microbatch: int) -> None:
    state, sr = find_scale_state(model), find_sr_state(model)
    if microbatch == 0 and state is not None:
        state.begin_step(step)
    if sr is not None:
        if microbatch == 0:
            sr.begin_step(step)
        sr.begin_microbatch(microbatch)


def training_memory(
    cfg: TrainConfig,
    world_size: int,
    sequence_length: int,
    *,
    optimizer: bool = True,
    trainable: Callable[[nn.Module], list[nn.Parameter]] | None = None,
    sms: int = ssd.DEFAULT_SM_COUNT,
) -> MemoryTerms:
    """The memory terms of one rank of a training run at ``world_size``: its model as the trainer builds it (meta),
    one step of ``cfg.micro_batch`` x ``sequence_length`` tokens per microbatch (``optimizer``: with AdamW's
    state; False for a forward and backward pass without an update). ``trainable``: the parameters that require
    gradients in the pass (default all; the scale snapshot computes only those its hooked modules need). ``sms``: the
    SM count a ``mamba_ssm`` scan is planned on (:func:`ue5m3.plan.ssd.sm_count`)."""
    # a checkpointed block recomputes under the same fused attention (autograd runs no torch-function mode)
    contexts = lambda: (_FusedAttention(), _FusedAttention())  # noqa: E731
    model, _ = build_shell(cfg, cfg.resolved_recipe(), rank=0, world_size=world_size, contexts=contexts)
    if trainable is not None:
        keep = {id(p) for p in trainable(model)}
        for p in model.parameters():
            p.requires_grad_(id(p) in keep)
    static = static_terms(model, cfg, world_size, optimizer=optimizer)
    _compute_dtype(model, cfg)
    accumulation = cfg.accumulation_for(world_size)
    tokens = torch.zeros(cfg.micro_batch, sequence_length + 1, dtype=torch.long, device="meta")
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step(microbatch: int):
        _begin(model, 1, microbatch)

        def forward() -> torch.Tensor:
            return lm_loss(model, inputs, targets, chunk=cfg.loss_chunk) / accumulation

        return forward, lambda loss: loss.backward()

    # the FP4 kernels' allocations, as on a GPU (auto and triton; torch runs its own path), and mamba_ssm's scan's
    with planning(), ssd.emulating_mamba_ssm(sms):
        counts = measure_step(model, step, MEASURED_MICROBATCHES, exclude=(tokens,))
    return MemoryTerms(
        parameters=static["parameters"],
        gradients=static["gradients"],
        optimizer=static["optimizer"],
        fp4_caches=counts.fp4_caches,
        activations=counts.activations,
        transient=counts.transient,
    )
