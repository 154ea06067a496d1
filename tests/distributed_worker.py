"""Worker for tests/test_train_distributed.py: ``torchrun --nproc-per-node N tests/distributed_worker.py CFG``."""

import os
import sys

import torch
import torch.distributed as dist

from ue5m3 import train


class ShardedTokenStream:
    """Random-token global batches of ``micro_batch * world`` sequences; each rank takes its own rows."""

    sequence_length = 64

    def __init__(self, rank: int, world: int, vocab: int = 4096) -> None:
        self.rank, self.world, self.vocab, self.cursor = rank, world, vocab, 0

    def next_batch(self, batch_size):
        g = torch.Generator().manual_seed(1000 + self.cursor)
        self.cursor += 1
        window = torch.randint(0, self.vocab, (batch_size * self.world, self.sequence_length + 1), generator=g)
        mine = window[self.rank * batch_size : (self.rank + 1) * batch_size]
        return mine[:, :-1], mine[:, 1:]

    def state_dict(self):
        return {"cursor": self.cursor}

    def load_state_dict(self, state):
        self.cursor = state["cursor"]


def main() -> None:
    torch.set_num_threads(1)
    cfg = train.TrainConfig.from_yaml(sys.argv[1])
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    try:
        train.train(cfg, ShardedTokenStream(rank, world))
    finally:
        if world > 1:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
