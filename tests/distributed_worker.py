"""Worker for tests/test_train_distributed.py: ``torchrun --nproc-per-node N tests/distributed_worker.py CFG``."""

import os
import sys

import torch
import torch.distributed as dist

from ue5m3.data import RandomTokenStream
from ue5m3.training import loop as train
from ue5m3.training.config import TrainConfig


def main() -> None:
    torch.set_num_threads(1)
    cfg = TrainConfig.from_yaml(sys.argv[1])
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    try:
        train.train(cfg, RandomTokenStream(4096, 64, seed=1, rank=rank, world_size=world))
    finally:
        if world > 1:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
