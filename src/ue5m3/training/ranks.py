"""Which process of the run this is, and the trainer's one log helper.

A run is one process or many under ``torchrun`` (FSDP2 or DDP). Every part of the trainer asks :func:`world` for
this process's rank and the number of processes (0 and 1 when ``torch.distributed`` is not initialised), and logs
through :func:`log0`, which only rank 0 writes (style rule 8: logging through one rank-0 helper), so a
many-process ``train.log`` holds each message once.
"""

from __future__ import annotations

import logging

import torch.distributed as dist

__all__ = ["world", "log0", "logger"]

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
