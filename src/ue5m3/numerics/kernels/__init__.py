"""Compiled backends of the numerics: the fused C kernel (:mod:`ue5m3.numerics.kernels.cpu`), the Triton quantize
and GEMM kernels, each bit-identical to the torch reference it accelerates, and the adapters between them and the
quantizer's results (:mod:`ue5m3.numerics.kernels.adapters`)."""

from __future__ import annotations

import os

import torch

__all__ = ["triton_device_reason"]


def triton_device_reason(device: torch.device) -> str | None:
    """Why the Triton kernels cannot run on ``device`` (None if they can): CUDA, or the CPU under
    ``TRITON_INTERPRET=1`` (Triton's interpreter, how the kernels are tested without a GPU)."""
    if device.type == "cuda":
        return None
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        return None
    return f"tensor on {device.type} (the Triton kernels run on CUDA, or on the CPU under TRITON_INTERPRET=1)"
