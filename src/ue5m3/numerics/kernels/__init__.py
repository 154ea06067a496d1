"""Compiled backends of the numerics: the fused C kernel (:mod:`ue5m3.numerics.kernels.cpu`), the Triton quantize
and GEMM kernels, each bit-identical to the torch reference it accelerates, and the adapters between them and the
quantizer's results (:mod:`ue5m3.numerics.kernels.adapters`). Where the Triton kernels run, and how their
allocations are kept apart from their launches (the meta implementation a memory plan counts), is
:mod:`ue5m3.numerics.kernels.launch`."""

from __future__ import annotations

from ue5m3.numerics.kernels.launch import planning, planning_active, triton_by_default, triton_device_reason

__all__ = ["triton_device_reason", "triton_by_default", "planning", "planning_active"]
