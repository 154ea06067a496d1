"""Who computes the emulated numerics: an explicit choice, passed to every quantization and GEMM.

Every backend computes the same FP32 operations in the same order, so a backend changes speed and never
results (tests/test_cpu_kernel.py and tests/test_triton_quantize.py check them bit for bit). ``auto`` is the only
backend that decides by itself, and it decides the same way everywhere: the fastest backend that covers the case
(the C kernel for CPU tensors, the Triton kernel for CUDA ones, else torch).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from enum import StrEnum

import torch

__all__ = ["Backend", "triton_device_reason", "exact_fp32"]


class Backend(StrEnum):
    """The backends of :func:`ue5m3.numerics.quantize.quantize` and :func:`ue5m3.numerics.gemm.matmul`."""

    AUTO = "auto"  # the fused kernel of the tensor's device where it covers the case, else torch
    TORCH = "torch"  # the reference: plain torch ops, any device
    CPU_KERNEL = "cpu_kernel"  # the fused C kernel (CPU tensors, E2M1 payloads); refuses what it cannot take
    TRITON = "triton"  # the Triton kernels (CUDA tensors, or CPU ones under TRITON_INTERPRET=1); refuses the rest


def triton_device_reason(device: torch.device) -> str | None:
    """Why the Triton kernels cannot run on ``device`` (None if they can): CUDA, or the CPU under
    ``TRITON_INTERPRET=1`` (Triton's interpreter, how the kernels are tested without a GPU)."""
    if device.type == "cuda":
        return None
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        return None
    return f"tensor on {device.type} (the Triton kernels run on CUDA, or on the CPU under TRITON_INTERPRET=1)"


@contextlib.contextmanager
def exact_fp32(device: torch.device) -> Iterator[None]:
    """IEEE FP32 matmuls on ``device`` inside the block: autocast off (on CUDA it would silently run the decoded and
    encoded GEMMs, the exact-path slices and the FP32 head in BF16) and, on CUDA, TF32 off; restored on exit."""
    with contextlib.ExitStack() as stack:
        if torch.amp.is_autocast_available(device.type):
            stack.enter_context(torch.autocast(device.type, enabled=False))
        if device.type == "cuda":
            matmul = torch.backends.cuda.matmul
            previous = matmul.fp32_precision
            matmul.fp32_precision = "ieee"
            stack.callback(setattr, matmul, "fp32_precision", previous)
        yield
