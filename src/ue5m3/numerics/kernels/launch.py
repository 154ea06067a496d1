"""Where the Triton kernels run, and what a launch is: allocation apart from execution.

Every Triton adapter (:mod:`~ue5m3.numerics.kernels.triton_quantize`, :mod:`~ue5m3.numerics.kernels.triton_gemm`)
works in two steps: it allocates every tensor a call needs (outputs, FP32 copies, prepared operands, bounds,
``taken`` flags) and describes each kernel launch as a :class:`Launch` (kernel, grid, arguments, compile-time
constants); then :func:`run` executes the launches. On CUDA, and on the CPU under ``TRITON_INTERPRET=1``, ``run``
launches them. On torch's ``meta`` device, inside :func:`planning`, it launches nothing: the allocations are the
kernels' meta implementation. Because the allocation code is the launch path's own, a memory plan made on ``meta``
counts exactly the tensors the GPU path allocates (``tests/test_triton_planning.py`` compares them, shape, dtype
and bytes, with the interpreter's), in seconds where the torch path's exact loops would take minutes.

Planning is opt-in and thread-local: outside :func:`planning`, ``meta`` tensors take the torch path (which
``tests/test_device_placement.py`` runs to prove that the training step never reads back to the host).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

__all__ = [
    "check_triton_version",
    "TESTED_TRITON",
    "Launch",
    "run",
    "planning",
    "planning_active",
    "triton_device_reason",
    "triton_by_default",
    "hardware_rtz",
]

_STATE = threading.local()

# The Triton releases the kernels are tested with: 3.9.0 (the CPU lock, constraints.txt) and 3.7.1 (what PyPI's CUDA
# torch 2.13.0 pins; tests/test_triton_versions.py); the minor versions between them are accepted, others refused.
TESTED_TRITON = ("3.7.1", "3.9.0")
SUPPORTED_TRITON = ((3, 7), (3, 9))  # the first and last minor version accepted


def check_triton_version(version: str) -> None:
    """Refuse a Triton the kernels do not support, naming the versions they are tested with.

    Raises:
        ImportError: ``version`` is outside :data:`SUPPORTED_TRITON`.
    """
    try:
        minor = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        minor = (0, 0)
    low, high = SUPPORTED_TRITON
    if not low <= minor <= high:
        raise ImportError(
            f"triton {version} is not supported by the ue5m3 kernels: they are tested with triton "
            f"{' and '.join(TESTED_TRITON)} and accept {low[0]}.{low[1]} to {high[0]}.{high[1]}; install one of those "
            "(pip install triton==3.9.0, or the torch 2.13.0 CUDA wheel's 3.7.1), or use backend='torch'"
        )


@contextlib.contextmanager
def planning() -> Iterator[None]:
    """Inside the block, on this thread, Triton kernel calls on ``meta`` tensors allocate what the GPU path allocates
    and launch nothing, and ``backend='auto'`` picks the Triton path for ``meta`` tensors (as it does for CUDA ones).

    Raises:
        ImportError: triton is not installed (the plan would otherwise count the torch path's tensors).
    """
    try:
        import triton  # noqa: F401
    except ImportError as error:  # pragma: no cover - triton is a dev dependency
        raise ImportError("planning() counts the Triton kernels' allocations: pip install 'ue5m3[gpu]'") from error
    depth = getattr(_STATE, "depth", 0)
    _STATE.depth = depth + 1
    try:
        yield
    finally:
        _STATE.depth = depth


def planning_active() -> bool:
    """Whether this thread is inside :func:`planning`."""
    return getattr(_STATE, "depth", 0) > 0


def triton_device_reason(device: torch.device) -> str | None:
    """Why the Triton kernels cannot run on ``device`` (None if they can): CUDA, the CPU under ``TRITON_INTERPRET=1``
    (Triton's interpreter, how the kernels are tested without a GPU), or ``meta`` inside :func:`planning` (the
    allocations only)."""
    if device.type == "cuda":
        if torch.version.hip is not None:
            return (
                "a ROCm (HIP) device: the Triton kernels are built and tested for NVIDIA GPUs only (the PTX "
                "add.rz.f32, the tensor cores' exact accumulation); use backend='torch'"
            )
        return None
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        return None
    if device.type == "meta" and planning_active():
        return None
    return (
        f"tensor on {device.type} (the Triton kernels run on CUDA, on the CPU under TRITON_INTERPRET=1, and on meta "
        "inside ue5m3.numerics.backend.planning())"
    )


def hardware_rtz(device: torch.device) -> bool:
    """Whether the kernels use the hardware's round-toward-zero addition (the inline PTX ``add.rz.f32``): on NVIDIA
    CUDA devices and in a plan of them (``meta``); the interpreter emulates it (the same IEEE result)."""
    return device.type == "meta" or (device.type == "cuda" and torch.version.hip is None)


def triton_by_default(device: torch.device) -> bool:
    """Whether ``backend='auto'`` picks the Triton kernels for tensors on ``device``: CUDA, or ``meta`` inside
    :func:`planning`."""
    return device.type == "cuda" or (device.type == "meta" and planning_active())


@dataclass(frozen=True)
class Launch:
    """One kernel launch, described: ``kernel[grid](*args, **constants)``. The tensors among ``args`` are allocated
    by the adapter before any launch runs."""

    kernel: object
    grid: tuple[int, ...]
    args: tuple
    constants: dict = field(default_factory=dict)

    def execute(self) -> None:
        if all(self.grid):
            self.kernel[self.grid](*self.args, **self.constants)


def run(launches: Sequence[Launch], device: torch.device) -> None:
    """Execute ``launches`` in order on ``device``'s stream; on ``meta`` (planning) nothing runs."""
    if device.type == "meta":
        return
    for launch in launches:
        launch.execute()
