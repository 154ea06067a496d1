"""Random-token batches with the training loader's interface, for tests, benchmarks and smoke runs.

:class:`RandomTokenStream` stands in for :class:`ue5m3.data.PackedStream` wherever the text does not matter
(numerics, resume exactness, throughput): ``next_batch``, ``state_dict`` and ``load_state_dict`` behave the same,
global batch ``i`` depends only on ``(seed, i)``, and rank ``r`` of ``world_size`` takes its own rows of every
global batch, so single-process and sharded runs see the same data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["RandomTokenStream"]


class RandomTokenStream:
    """Deterministic, resumable batches of uniformly random token ids.

    Args:
        vocab_size: ids are drawn from [0, vocab_size).
        sequence_length: input tokens per sequence (windows hold one more).
        seed: selects the stream.
        rank, world_size: this process's rows of every global batch.
    """

    def __init__(self, vocab_size: int, sequence_length: int, *, seed: int = 0, rank: int = 0, world_size: int = 1):
        if vocab_size < 1 or sequence_length < 1:
            raise ValueError(f"vocab_size and sequence_length must be >= 1, got {vocab_size!r}, {sequence_length!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank {rank!r}, world_size {world_size!r}")
        self.vocab_size, self.sequence_length = vocab_size, sequence_length
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.cursor = 0

    def next_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), both int64 [batch_size, sequence_length], targets shifted by one token."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.cursor)
        self.cursor += 1
        # [batch * world, T + 1] global windows -> this rank's rows
        windows = torch.randint(
            0, self.vocab_size, (batch_size * self.world_size, self.sequence_length + 1), generator=generator
        )
        mine = windows[self.rank * batch_size : (self.rank + 1) * batch_size]
        return mine[:, :-1], mine[:, 1:]

    def state_dict(self) -> dict[str, Any]:
        return {"cursor": self.cursor}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.cursor = int(state["cursor"])
