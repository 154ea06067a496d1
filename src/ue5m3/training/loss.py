"""The training loss: mean next-token cross entropy in FP32, whole or in chunks of positions.

At the 8B model's vocabulary (131,072) one microbatch of 8,192 positions has 4.3 GB of FP32 logits, and autograd
keeps them (and their softmax) for the backward pass. :func:`lm_loss` with ``chunk`` > 0 instead runs the FP32 head
and the cross entropy over ``chunk`` positions at a time, each chunk recomputed in the backward pass
(non-reentrant :func:`torch.utils.checkpoint.checkpoint`): the forward keeps only the final hidden states (which
the body's backward needs anyway) and the chunks' summed losses, the backward holds one chunk's logits and their
gradient at a time (256 positions: 128 MB each at V = 131,072), for one more head GEMM per microbatch (about 2% of
the 8B step). The evaluation protocol computes its NLL the same way (:mod:`ue5m3.evaluation.nll`, 256 positions).

Exactness: every position's logits, loss and logit gradient are row-local, so they are those of the whole-batch
computation; the loss is the FP32 sum of the chunks' FP32 sums over the number of positions (the whole-batch loss
takes the cross entropy's own mean), and the head's weight gradient is the sum of the chunks' GEMMs (autograd adds
them; the whole-batch gradient is one GEMM over all positions). Both agree to FP32 summation order, which is why
a run's ``loss_chunk`` is part of its identity.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["lm_loss", "chunked_cross_entropy", "HEAD_CHUNK"]

HEAD_CHUNK = 256
"""The chunk the evaluation protocol uses (positions per FP32 head chunk); a good ``loss_chunk`` for training."""


def _head(model: nn.Module) -> nn.Module:
    """The model's output head (through a DDP wrapper)."""
    return getattr(model, "module", model).lm_head


def _chunk_loss_sum(head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The summed FP32 cross entropy of ``hidden`` [n, H] against ``targets`` [n] through the FP32 head."""
    return F.cross_entropy(head(hidden).float(), targets, reduction="sum")


def chunked_cross_entropy(head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, chunk: int) -> torch.Tensor:
    """Mean cross entropy of ``head(hidden)`` against ``targets``, ``chunk`` positions at a time, each chunk
    recomputed in the backward pass so that no more than one chunk's logits are ever alive.

    Args:
        head: the output head (FP32 logits from the hidden states).
        hidden: the final hidden states [..., H].
        targets: token ids shaped like ``hidden`` without its last axis.
        chunk: positions per chunk (>= 1).
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk!r}")
    flat, labels = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)  # [..., H] -> [n, H]; [...] -> [n]
    track = torch.is_grad_enabled() and flat.requires_grad
    total = None
    for start in range(0, labels.numel(), chunk):
        part = (flat[start : start + chunk], labels[start : start + chunk])
        if track:
            loss = checkpoint(_chunk_loss_sum, head, *part, use_reentrant=False)
        else:
            loss = _chunk_loss_sum(head, *part)
        total = loss if total is None else total + loss
    return total / labels.numel()


def lm_loss(
    model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, *, chunk: int = 0, autocast: bool = True
) -> torch.Tensor:
    """Mean next-token cross entropy in FP32 (BF16 autocast around the body on GPUs; FP32 on the CPU).

    Args:
        model: a language model of :mod:`ue5m3.models` (or a DDP or FSDP2 wrapping of one).
        inputs: token ids [B, T].
        targets: next-token ids [B, T].
        chunk: positions per chunk of the head and loss (:func:`chunked_cross_entropy`); 0: all at once.
        autocast: the body under BF16 autocast on a GPU (the trainer's); False: in the parameters' dtype anywhere.
    """
    device = next(model.parameters()).device
    inputs, targets = inputs.to(device), targets.to(device)
    # only CUDA's autocast is entered: the meta device (the plan's counts) has none to construct
    body = torch.autocast("cuda", dtype=torch.bfloat16) if autocast and device.type == "cuda" else nullcontext()
    with body:
        if chunk:
            hidden = model(inputs, return_hidden=True)  # [B, T, H]
        else:
            logits = model(inputs)  # [B, T, V]
    if chunk:  # the head computes in FP32 whatever the autocast state (OutputHead)
        return chunked_cross_entropy(_head(model), hidden, targets, chunk)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
