"""The block layout: how a tensor is cut into the blocks that share one scale, and put back together.

Blocks run along any one axis (1D: the GEMM reduction dimension, numerics spec 3.1 step 2) or are BxB tiles of a
2-D tensor (2D, weights: a tensor and its transpose quantize to exactly the same values). Every quantizer works on
the block view ``(..., n_blocks, B)`` (``(R/B, C/B, B*B)`` for tiles), so the block maximum, the scale and the
encoding are one reduction and two elementwise passes over its last axis, whatever the blocked axis was.

Ragged shapes are zero-padded to whole blocks and tiles as Transformer Engine does: the padding takes part in block
maxima (so amax, scales and the valid cells are unchanged), the block grid keeps the padded size and tensors shaped
like the input are cropped back. :meth:`BlockLayout.block_indices` gives the global element index of every cell of
the block view, which keys the Philox bits of stochastic rounding (:mod:`ue5m3.numerics.philox`), so the kernels
draw the same bits as the torch reference whatever order they visit the blocks in.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ue5m3.numerics import philox

__all__ = ["BlockLayout"]


@dataclass(frozen=True)
class BlockLayout:
    """Maps a tensor to a block view (..., n_blocks, block) and back, zero-padding ragged shapes to whole blocks
    (the block view and the scales keep the padded grid; tensors shaped like the input are cropped back)."""

    shape: torch.Size
    axis: int
    block_size: int
    two_d: bool
    padded: tuple[int, ...]

    @classmethod
    def of(cls, x: torch.Tensor, block_size: int, axis: int, two_d: bool, name: str) -> BlockLayout:
        if x.ndim == 0:
            raise ValueError(f"tensor {name!r} is a scalar; block quantization needs at least one axis")
        b = block_size
        if two_d:
            if x.ndim != 2:
                raise ValueError(f"2D tiles need a 2-D tensor; {name!r} has shape {tuple(x.shape)}")
            rows, cols = x.shape
            return cls(x.shape, -1, b, True, (-(-rows // b) * b, -(-cols // b) * b))
        if not -x.ndim <= axis < x.ndim:
            raise ValueError(f"axis {axis!r} out of range for {name!r} of shape {tuple(x.shape)}")
        axis = axis % x.ndim
        padded = list(x.shape)
        padded[axis] = -(-padded[axis] // b) * b
        return cls(x.shape, axis, b, False, tuple(padded))

    @property
    def ragged(self) -> bool:
        return tuple(self.shape) != self.padded

    def _pad(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` shaped like the input -> the padded shape, zeros in the new cells."""
        if not self.ragged:
            return t
        # F.pad takes (last-dim left, last-dim right, second-to-last left, ...)
        widths: list[int] = []
        for size, target in zip(reversed(self.shape), reversed(self.padded), strict=True):
            widths += [0, target - size]
        return torch.nn.functional.pad(t, widths)

    def _crop(self, t: torch.Tensor) -> torch.Tensor:
        if not self.ragged:
            return t
        return t[tuple(slice(0, n) for n in self.shape)]

    def to_blocks(self, t: torch.Tensor) -> torch.Tensor:
        b = self.block_size
        t = self._pad(t)
        if self.two_d:
            rows, cols = self.padded
            # (R, C) -> (R/B, B, C/B, B) -> (R/B, C/B, B, B) -> (R/B, C/B, B*B)
            return t.reshape(rows // b, b, cols // b, b).permute(0, 2, 1, 3).reshape(rows // b, cols // b, b * b)
        moved = t.movedim(self.axis, -1)
        # (..., n) -> (..., n/B, B)
        return moved.reshape(*moved.shape[:-1], moved.shape[-1] // b, b)

    def from_blocks(self, t: torch.Tensor) -> torch.Tensor:
        b = self.block_size
        if self.two_d:
            rows, cols = self.padded
            # (R/B, C/B, B*B) -> (R/B, C/B, B, B) -> (R/B, B, C/B, B) -> (R, C)
            return self._crop(t.reshape(rows // b, cols // b, b, b).permute(0, 2, 1, 3).reshape(rows, cols))
        # (..., n/B, B) -> (..., n) -> original axis order
        # explicit sizes: -1 is ambiguous for an empty tensor
        return self._crop(t.reshape(*t.shape[:-2], t.shape[-2] * t.shape[-1]).movedim(-1, self.axis))

    def scales_from_blocks(self, t: torch.Tensor) -> torch.Tensor:
        """(..., n/B, 1) block values -> x's shape with the blocked axis (axes) divided by B, rounded up."""
        if self.two_d:
            return t.squeeze(-1)
        return t.squeeze(-1).movedim(-1, self.axis)

    def block_indices(
        self,
        index: philox.ElementIndex | None,
        name: str,
        device: torch.device | str | None = None,
        *,
        reuse: bool = False,
    ) -> tuple[torch.Tensor, int, int, int]:
        """Global element indices of the block view, as (first index of each block [n_blocks] int64, inner
        length, inner stride, outer stride): element p of a block sits at
        base + (p // inner length) * outer stride + (p % inner length) * inner stride.

        With ``reuse``, a CPU tensor of first indices is made once per layout and index and shared (every
        stochastically rounded operand of a training step asks for the same ones, step after step): the caller only
        reads it. An accelerator's are made per call, holding no device memory."""
        base, strides = (index or philox.ElementIndex()).strides(tuple(self.shape), name)
        device = torch.device(device) if device is not None else None
        make = _cpu_block_bases if reuse and device is not None and device.type == "cpu" else _block_bases
        return make(self, base, tuple(strides), device), *self._inner(strides)

    def _inner(self, strides: tuple[int, ...]) -> tuple[int, int, int]:
        """(inner length, inner stride, outer stride) of :meth:`block_indices`."""
        if self.two_d:
            return self.block_size, strides[1], strides[0]
        return self.block_size, strides[self.axis], 0


def _block_bases(layout: BlockLayout, base: int, strides: tuple[int, ...], device: torch.device | None) -> torch.Tensor:
    """The first global index of each block of ``layout`` (int64 [n_blocks]); the kernels only read it."""
    b = layout.block_size
    if layout.two_d:
        rows, cols = layout.padded
        r = torch.arange(rows // b, dtype=torch.int64, device=device)[:, None] * (b * strides[0])
        c = torch.arange(cols // b, dtype=torch.int64, device=device)[None, :] * (b * strides[1])
        return (base + r + c).reshape(-1)
    dims = [d for d in range(len(layout.shape)) if d != layout.axis]
    first = torch.full(
        [layout.padded[d] for d in dims] + [layout.padded[layout.axis] // b], base, dtype=torch.int64, device=device
    )
    for position, d in enumerate([*dims, layout.axis]):
        step = strides[d] * (b if d == layout.axis else 1)
        view = [1] * first.ndim
        view[position] = first.shape[position]
        first = first + torch.arange(first.shape[position], dtype=torch.int64, device=device).reshape(view) * step
    return first.reshape(-1)


_cpu_block_bases = functools.lru_cache(maxsize=256)(_block_bases)
