"""Bytes each rank moves through collectives per optimizer step, from the run's FSDP2 units or DDP gradients.

FSDP2 (:func:`ue5m3.training.parallelize.apply_fsdp`: one unit per block, then the root; with ``param_dtype:
bfloat16`` and ``fp4_weight_dtype: float32`` each FP4 linear its own FP32 unit):

* all-gathers, in the compute dtype, of every unit's padded parameters: each microbatch's forward pass gathers
  every unit, and its backward pass gathers again every block that resharded after its forward pass (all but the
  last under the ``default`` policy, every block under ``always``, none under ``never``); the root stays gathered;
* reduce-scatters of every unit's gradients in FP32 (``reduce_dtype``): once per step with ``gradient_sync:
  last_microbatch``, once per microbatch with ``every_microbatch``;
* DDP instead all-reduces every FP32 gradient once per step.

The counts and dtypes are what the trainer issues on gloo (tests/test_plan.py logs a two-process run's collectives
and compares them call by call). Bytes are those of each collective's full (unsharded) buffer; a ring moves
(W - 1) / W of it through each rank's link, which :func:`link_bytes` applies.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ue5m3 import models
from ue5m3.layers.linear import QuantLinear
from ue5m3.plan.memory import FP32, shard_numel
from ue5m3.training import parallelize
from ue5m3.training.config import TrainConfig

__all__ = ["StepCollectives", "step_collectives", "link_bytes"]


@dataclass(frozen=True)
class StepCollectives:
    """One rank's collectives of one optimizer step: calls and full-buffer bytes of each kind."""

    all_gathers: int
    all_gather_bytes: int
    reduce_scatters: int
    reduce_scatter_bytes: int
    all_reduces: int
    all_reduce_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.all_gather_bytes + self.reduce_scatter_bytes + self.all_reduce_bytes


def _padded(params: list[nn.Parameter], world_size: int) -> int:
    return sum(shard_numel(p.shape, world_size) * world_size for p in params)


def step_collectives(model: nn.Module, cfg: TrainConfig, world_size: int) -> StepCollectives:
    """The collectives rank 0 issues in one optimizer step of ``cfg`` at ``world_size`` (``model``: the run's meta
    shell, :func:`ue5m3.training.build.build_shell`). The scale references' and the loss's few-element
    all-reduces are left out."""
    accumulation = cfg.accumulation_for(world_size)
    params = [p for p in model.parameters() if p.requires_grad]
    if world_size == 1 and not parallelize.uses_fsdp(cfg, world_size):
        return StepCollectives(0, 0, 0, 0, 0, 0)
    if not parallelize.uses_fsdp(cfg, world_size):  # DDP: one all-reduce of the FP32 gradients per step
        return StepCollectives(0, 0, 0, 0, 1, sum(p.numel() for p in params) * FP32)
    compute = 2 if cfg.mixed_precision else FP32
    blocks = models.blocks(model)
    fp32_units = cfg.mixed_precision and cfg.fp4_weight_dtype == "float32"
    gathers = gather_bytes = scatters = scatter_bytes = 0
    inside = set()
    for index, block in enumerate(blocks):
        reshards = parallelize.reshard_after_forward(cfg.fsdp_reshard_after_forward, index, len(blocks))
        passes = 2 if reshards else 1  # gathered for the forward pass, and again for the backward pass
        linears = [m for m in block.modules() if isinstance(m, QuantLinear)] if fp32_units else []
        own = {id(p) for m in linears for p in m.parameters()}
        units = [(list(m.parameters()), FP32) for m in linears]
        units.append(([p for p in block.parameters() if id(p) not in own], compute))
        for unit, size in units:
            elements = _padded(unit, world_size)
            gathers += passes * accumulation
            gather_bytes += passes * accumulation * elements * size
            scatters += 1
            scatter_bytes += elements * FP32
        inside |= {id(p) for p in block.parameters()}
    root = _padded([p for p in model.parameters() if id(p) not in inside], world_size)
    gathers += accumulation  # the root: gathered in each forward pass, kept through its backward pass
    gather_bytes += accumulation * root * compute
    scatters += 1
    scatter_bytes += root * FP32
    if cfg.gradient_sync == "every_microbatch":
        scatters *= accumulation
        scatter_bytes *= accumulation
    return StepCollectives(gathers, gather_bytes, scatters, scatter_bytes, 0, 0)


def link_bytes(collectives: StepCollectives, world_size: int) -> float:
    """Bytes through each rank's link per step under ring algorithms: (W - 1) / W of every full buffer (an
    all-reduce is a reduce-scatter and an all-gather: twice that)."""
    if world_size <= 1:
        return 0.0
    ring = (world_size - 1) / world_size
    return ring * (collectives.all_gather_bytes + collectives.reduce_scatter_bytes + 2 * collectives.all_reduce_bytes)
