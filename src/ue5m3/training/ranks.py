"""Which process of the run this is, and the trainer's one log helper.

A run is one process or many under ``torchrun`` (FSDP2 or DDP). Every part of the trainer asks :func:`world` for
this process's rank and the number of processes (0 and 1 when ``torch.distributed`` is not initialised), and logs
through :func:`log0`, which only rank 0 writes (style rule 8: logging through one rank-0 helper), so a
many-process ``train.log`` holds each message once. :func:`one_process_group` gives a one-process run a process
group of its own (FSDP2 needs one, and a ``bfloat16`` run is FSDP2's on any world size).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch
import torch.distributed as dist

__all__ = ["world", "log0", "logger", "one_process_group"]

# the trainer's logger keeps the name its lines have always carried in train.log, wherever its helpers live
logger = logging.getLogger("ue5m3.training.loop")


def world() -> tuple[int, int]:
    """(rank, world size) of this process: (0, 1) outside ``torch.distributed``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def log0(message: str) -> None:
    """Log ``message`` (INFO) on rank 0 only: the one log helper of the trainer."""
    if world()[0] == 0:
        logger.info(message)


@contextlib.contextmanager
def one_process_group() -> Iterator[None]:
    """A process group of this process alone (an in-process store; NCCL on a GPU, gloo on the CPU) for the block
    inside, unless ``torch.distributed`` is initialised already (then that group is kept)."""
    if not dist.is_available():
        raise RuntimeError("torch.distributed is not available in this build of torch; FSDP2 needs it")
    if dist.is_initialized():
        yield
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
