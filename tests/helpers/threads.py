"""Torch's intra-op thread count, set for a block (bit-exact comparisons of CPU runs, as the pipeline runs jobs)."""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def torch_threads(count: int):
    """Run the block with ``count`` torch threads, then restore the previous count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
