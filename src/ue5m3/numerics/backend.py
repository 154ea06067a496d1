"""Who computes the emulated numerics: an explicit choice, passed to every quantization and GEMM.

Every backend computes the same FP32 operations in the same order, so a backend changes speed and never
results (tests/test_cpu_kernel.py and tests/test_triton_quantize.py check them bit for bit). ``auto`` is the only
backend that decides by itself, and it decides the same way everywhere: the fastest backend that covers the case
(the C kernel for CPU tensors, the Triton kernel for CUDA ones, else torch). An explicit kernel backend that cannot
take a case raises, naming the tensor and the reason (:func:`fused_kernel`); nothing falls back silently.

The fused kernels cover E2M1 payloads under every scale rule but ``mx_round_log2`` (an FP64 log2), with scale
formats whose quanta are FP32 normals; the kernels themselves are imported only when a case asks for them.

Memory planning: inside :func:`planning` (thread-local, opt-in), ``auto`` and ``triton`` take the Triton path for
tensors on torch's ``meta`` device too, where the kernels allocate exactly what they allocate on a GPU and launch
nothing (:mod:`ue5m3.numerics.kernels.launch`): a whole training step of the 8B model is counted in seconds.
Outside it, ``meta`` tensors run the torch path (a placement check: no host reads).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from enum import StrEnum

import torch

from ue5m3.numerics.formats import E2M1
from ue5m3.numerics.kernels import planning, planning_active, triton_by_default, triton_device_reason
from ue5m3.numerics.schemes import BlockScheme, ScaleRule

__all__ = [
    "Backend",
    "triton_device_reason",
    "triton_by_default",
    "planning",
    "planning_active",
    "exact_fp32",
    "fused_kernel",
    "triton_reason",
    "triton_import_reason",
]


class Backend(StrEnum):
    """The backends of :func:`ue5m3.numerics.quantize.quantize` and :func:`ue5m3.numerics.gemm.matmul`."""

    AUTO = "auto"  # the fused kernel of the tensor's device where it covers the case, else torch (meta: planning())
    TORCH = "torch"  # the reference: plain torch ops, any device
    CPU_KERNEL = "cpu_kernel"  # the fused C kernel (CPU tensors, E2M1 payloads); refuses what it cannot take
    TRITON = "triton"  # the Triton kernels (CUDA; CPU under TRITON_INTERPRET=1; meta in planning()); refuses the rest


@contextlib.contextmanager
def exact_fp32(device: torch.device) -> Iterator[None]:
    """IEEE FP32 matmuls on ``device`` inside the block: autocast off (on CUDA it would silently run the decoded and
    encoded GEMMs, the exact-path slices and the FP32 head in BF16) and, on CUDA, TF32 off; restored on exit. On the
    CPU with autocast off, as it nearly always is, there is nothing to change (the block costs no context objects)."""
    if device.type == "cpu" and not torch.is_autocast_enabled("cpu"):
        yield
        return
    with contextlib.ExitStack() as stack:
        if torch.amp.is_autocast_available(device.type):
            stack.enter_context(torch.autocast(device.type, enabled=False))
        if device.type == "cuda":
            matmul = torch.backends.cuda.matmul
            previous = matmul.fp32_precision
            matmul.fp32_precision = "ieee"
            stack.callback(setattr, matmul, "fp32_precision", previous)
        yield


def _scheme_reason(scheme: BlockScheme) -> str | None:
    """Why no fused kernel covers this scheme (None if they do)."""
    if scheme.element != E2M1:
        return f"element format {scheme.element.name!r} (kernels are E2M1 only)"
    if scheme.scale_rule is ScaleRule.MX_ROUND_LOG2:
        return "scale rule 'mx_round_log2'"
    s = scheme.scale
    if scheme.scale_rule is ScaleRule.TENSOR_SCALED and not (
        s.has_zero and s.min_exponent - s.mantissa_bits >= -126 and s.max_exponent <= 127
    ):
        return f"scale format {s.name!r} outside the kernels' FP32-normal quanta"
    return None


def _kernel_reason(x: torch.Tensor, scheme: BlockScheme) -> str | None:
    """Why the C kernel cannot take this case (None if it can)."""
    if x.device.type != "cpu":
        return f"tensor on {x.device.type}"
    reason = _scheme_reason(scheme)
    if reason is not None:
        return reason
    from ue5m3.numerics.kernels import cpu as cpu_kernel

    if not cpu_kernel.available():
        return cpu_kernel.unavailable_reason()
    return None


def triton_import_reason(module: str) -> str | None:
    """Why the Triton kernel module ``ue5m3.numerics.kernels.<module>`` cannot be imported (None if it can): triton
    is not installed, or its version is one the kernels refuse (the message names the tested versions)."""
    try:
        importlib.import_module(f"ue5m3.numerics.kernels.{module}")
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] != "triton":
            raise
        return "triton is not installed (pip install 'ue5m3[gpu]')"
    except ImportError as error:
        return str(error)
    return None


def triton_reason(x: torch.Tensor, scheme: BlockScheme) -> str | None:
    """Why the Triton kernel cannot take this case (None if it can)."""
    reason = _scheme_reason(scheme) or triton_import_reason("triton_quantize")
    if reason is not None:
        return reason
    return triton_device_reason(x.device)


def fused_kernel(x: torch.Tensor, scheme: BlockScheme, backend: Backend, name: str) -> str | None:
    """Which fused kernel quantizes ``x`` ('cpu_kernel', 'triton' or None for the torch path); an explicit
    kernel backend that cannot take the case raises, naming the tensor and the reason."""
    if backend is Backend.TORCH:
        return None
    if backend is Backend.CPU_KERNEL or (backend is Backend.AUTO and x.device.type == "cpu"):
        kernel, reason = Backend.CPU_KERNEL, _kernel_reason(x, scheme)
    else:
        kernel, reason = Backend.TRITON, triton_reason(x, scheme)
    if reason is None:
        return kernel.value
    if backend is kernel:
        raise ValueError(f"backend={kernel.value!r} cannot quantize {name!r}: {reason}; use backend='torch' or 'auto'")
    return None
