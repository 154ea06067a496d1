"""Bit-for-bit comparisons: float32 data as bit patterns (so that -0.0 differs from 0.0 and NaNs compare by their
bits), tensors of any dtype as raw bytes, and two quantization results field by field."""

from __future__ import annotations

import numpy as np
import torch


def f32_bits(a) -> np.ndarray:
    """Bit patterns of float32 data (so that -0.0 and 0.0 compare unequal)."""
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32)).view(np.uint32)


def _numpy(a):
    return a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else a


def assert_same_f32_bits(actual, expected, what: str = "", inputs=None) -> None:
    """Assert that ``actual`` and ``expected`` (arrays, lists or tensors, as float32) agree bit for bit; on a mismatch
    the message names ``what``, the first flat indices that differ, the values there and, given ``inputs`` (of the
    same shape), the inputs that gave them."""
    a, e = f32_bits(_numpy(actual)), f32_bits(_numpy(expected))
    if np.array_equal(a, e):
        return
    if a.shape != e.shape:
        raise AssertionError(f"{what}: shape {a.shape}, expected {e.shape}")
    bad = np.flatnonzero(a.ravel() != e.ravel())
    first = bad[:8]
    got, want = a.ravel().view(np.float32)[first].tolist(), e.ravel().view(np.float32)[first].tolist()
    where = "" if inputs is None else f" (inputs {np.asarray(_numpy(inputs)).ravel()[first].tolist()})"
    raise AssertionError(
        f"{what}: {bad.size} mismatches, first at flat {first.tolist()}{where}: got {got}, expected {want}"
    )


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors have the same shape, dtype and bytes (NaN equals itself, -0.0 differs from 0.0)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    raw = [t.detach().contiguous().reshape(-1).view(torch.uint8) for t in (a, b)]
    return torch.equal(*raw)


def assert_same_quantized(a, b) -> None:
    """Assert that two :class:`~ue5m3.numerics.quantized.QuantizedTensor` results (of two backends, say) are the same:
    payload, scales, decode scales and dequantized values bit for bit, block and tensor amax, and the counters."""
    for field in ("payload", "scales", "decode_scales", "dequantize"):
        x, y = getattr(a, field), getattr(b, field)
        x, y = (x(), y()) if callable(x) else (x, y)
        assert same_bits(x, y), field
    assert torch.equal(a.block_amax, b.block_amax), "block_amax"
    assert torch.equal(a.tensor_amax, b.tensor_amax), "tensor_amax"
    assert int(a.zero_rounded_blocks) == int(b.zero_rounded_blocks), "zero_rounded_blocks"
    assert int(a.saturated_blocks) == int(b.saturated_blocks), "saturated_blocks"
    assert int(a.underflowed_blocks) == int(b.underflowed_blocks), "underflowed_blocks"
