"""The block layout: block views and the global element indices that key stochastic rounding's bits."""

import pytest
import torch

from ue5m3.numerics.layout import BlockLayout
from ue5m3.numerics.philox import ElementIndex


@pytest.mark.parametrize(
    ("shape", "axis", "two_d", "index"),
    [
        ((32, 48), -1, False, None),
        ((32, 48), 0, False, None),
        ((3, 32, 16), 1, False, None),
        ((32, 48), -1, True, None),
        ((32, 48), 0, False, ElementIndex(global_shape=(64, 96), offset=(32, 16))),  # a shard
        ((32, 48), -1, True, ElementIndex(global_shape=(64, 96), offset=(16, 48))),
    ],
)
def test_block_indices_read_every_cell_s_global_index(shape, axis, two_d, index):
    layout = BlockLayout.of(torch.empty(shape), 16, axis, two_d, "x")
    first, inner_len, inner_stride, outer_stride = layout.block_indices(index, "x", "cpu")
    # element p of block k sits at first[k] + (p // inner_len) * outer_stride + (p % inner_len) * inner_stride
    p = torch.arange(layout.block_size * (layout.block_size if two_d else 1))
    got = first[:, None] + (p // inner_len) * outer_stride + (p % inner_len) * inner_stride
    expected = (index or ElementIndex()).indices(shape)  # every element's global index, element by element
    assert torch.equal(got.reshape(-1, got.shape[-1]), layout.to_blocks(expected).reshape(-1, got.shape[-1]))


def test_reused_block_indices_are_made_once_per_layout_and_index_on_the_cpu():
    # every stochastically rounded operand of a training step asks for the same ones, step after step
    layout = BlockLayout.of(torch.empty(64, 32), 16, 0, False, "x")
    first = layout.block_indices(None, "x", "cpu", reuse=True)[0]
    assert layout.block_indices(None, "x", torch.device("cpu"), reuse=True)[0] is first
    fresh = layout.block_indices(None, "x", "cpu")[0]  # without reuse (the Triton path's CPU run): made per call
    assert fresh is not first and torch.equal(fresh, first)
    other = layout.block_indices(ElementIndex(global_shape=(128, 32), offset=(64, 0)), "x", "cpu", reuse=True)[0]
    assert other is not first and torch.equal(other, first + 64 * 32)
