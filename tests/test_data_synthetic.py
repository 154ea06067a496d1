"""Tests of ue5m3.data.synthetic: random-token batches with the loader's interface."""

from __future__ import annotations

import torch


def test_random_token_stream_shards_one_global_batch_and_resumes_exactly():
    from ue5m3.data import RandomTokenStream

    whole = RandomTokenStream(100, 8, seed=3).next_batch(4)[0]
    halves = [RandomTokenStream(100, 8, seed=3, rank=r, world_size=2).next_batch(2)[0] for r in (0, 1)]
    assert torch.equal(torch.cat(halves), whole)
    stream = RandomTokenStream(100, 8, seed=3)
    stream.next_batch(2)
    state = stream.state_dict()
    expected = stream.next_batch(2)
    resumed = RandomTokenStream(100, 8, seed=3)
    resumed.load_state_dict(state)
    got = resumed.next_batch(2)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert torch.equal(got[0][:, 1:], got[1][:, :-1])  # targets are the inputs shifted by one
