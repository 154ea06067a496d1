"""FP4 payloads packed and unpacked by one Triton kernel each: the storage form of a quantized tensor.

:meth:`QuantizedTensor.pack() <ue5m3.numerics.quantized.QuantizedTensor.pack>` keeps E2M1 element codes two per
byte (element 2i in the low nibble, as torchao and Transformer Engine pack them) and
:meth:`PackedQuantized.unpack() <ue5m3.numerics.quantized.PackedQuantized.unpack>` decodes them back. In torch each
is several passes over memory with int64 intermediates (eight bytes per element); here each is one pass: pack
reads the FP32 payload (4 bytes per element) and writes the codes (half a byte), unpack the reverse. The codes are
the torch path's bit for bit (``tests/test_triton_pack.py``): the sign bit (so -0.0 is code 8), then the
magnitude's index on the E2M1 grid {0, 0.5, 1, 1.5, 2, 3, 4, 6} from its exponent and top mantissa bit. The block
scales (one byte per block) stay with torch.

Runs on CUDA tensors, on CPU tensors under ``TRITON_INTERPRET=1``, and on ``meta`` tensors inside planning
(allocations only), like the other Triton kernels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ue5m3.numerics.kernels.launch import Launch, check_triton_version, run
from ue5m3.numerics.kernels.launch import triton_device_reason as usable

check_triton_version(triton.__version__)  # refused at import: a Triton the kernels are not tested with

__all__ = ["pack_e2m1", "unpack_e2m1", "pack_launch", "unpack_launch", "usable"]

BYTES_PER_PROGRAM = 2048  # packed bytes per program (4,096 elements)
INT32_LIMIT = 2**31 - 1


@triton.jit
def _pack_kernel(values_ptr, codes_ptr, n_bytes, BYTES: tl.constexpr, INDEX64: tl.constexpr):
    """Bytes [pid * BYTES, ...) of the packed codes from elements [2 * pid * BYTES, ...) of the FP32 payload."""
    start = tl.program_id(0) * BYTES
    if INDEX64:
        start = start.to(tl.int64)
    at = start + tl.arange(0, BYTES)
    ok = at < n_bytes
    pair = tl.load(values_ptr + (2 * at)[:, None] + tl.arange(0, 2)[None, :], mask=ok[:, None], other=0.0)
    bits = pair.to(tl.int32, bitcast=True)
    exponent = ((bits >> 23) & 0xFF) - 127  # -127 for zero; -1 for 0.5; 0, 1, 2 for [1, 8)
    magnitude = tl.where(exponent >= 0, 2 * (exponent + 1) + ((bits >> 22) & 1), tl.where(exponent == -1, 1, 0))
    code = magnitude | ((bits >> 28) & 8)  # the sign bit as bit 3: -0.0 is code 8
    low, high = tl.split(code)
    tl.store(codes_ptr + at, (low | (high << 4)).to(tl.uint8), mask=ok)


@triton.jit
def _unpack_kernel(codes_ptr, values_ptr, n_bytes, BYTES: tl.constexpr, INDEX64: tl.constexpr):
    """Elements [2 * pid * BYTES, ...) of the FP32 payload from bytes [pid * BYTES, ...) of the packed codes."""
    start = tl.program_id(0) * BYTES
    if INDEX64:
        start = start.to(tl.int64)
    at = start + tl.arange(0, BYTES)
    ok = at < n_bytes
    byte = tl.load(codes_ptr + at, mask=ok, other=0).to(tl.int32)
    code = tl.join(byte & 0x0F, byte >> 4)  # [BYTES, 2]: element 2i from the low nibble
    magnitude = code & 7
    # 0, 0.5 for codes 0, 1; (1 + m / 2) * 2^(e - 1) for codes 2 + 2e + m (e in 0..2, m in 0..1): exact
    small = magnitude.to(tl.float32) * 0.5
    exponent_bits = ((magnitude >> 1) - 1 + 127) << 23
    normal = (exponent_bits | ((magnitude & 1) << 22)).to(tl.float32, bitcast=True)
    value = tl.where(magnitude < 2, small, normal)
    signed = (value.to(tl.int32, bitcast=True) | ((code & 8) << 28)).to(tl.float32, bitcast=True)
    tl.store(values_ptr + (2 * at)[:, None] + tl.arange(0, 2)[None, :], signed, mask=ok[:, None])


def _check(t: torch.Tensor, what: str) -> None:
    reason = usable(t.device)
    if reason is not None:
        raise ValueError(f"the Triton {what} kernel cannot run here: {reason}")


def _launch(kernel, source: torch.Tensor, target: torch.Tensor, n_bytes: int) -> Launch:
    """One program per BYTES_PER_PROGRAM packed bytes; 64-bit offsets only where an element index passes 2^31 - 1."""
    programs = triton.cdiv(n_bytes, BYTES_PER_PROGRAM)
    index64 = 2 * programs * BYTES_PER_PROGRAM > INT32_LIMIT
    return Launch(
        kernel,
        (programs,),
        (source, target, n_bytes),
        dict(BYTES=BYTES_PER_PROGRAM, INDEX64=index64, enable_fp_fusion=False),
    )


def pack_launch(values: torch.Tensor) -> tuple[torch.Tensor, Launch]:
    """The packed codes of an FP32 E2M1 payload (..., 2n), allocated (uint8, (..., n)), and the launch that fills
    them."""
    _check(values, "pack")
    if values.dtype != torch.float32 or values.shape[-1] % 2:
        raise ValueError(f"pack_e2m1 takes an FP32 payload with an even last axis, got {values.dtype} {values.shape}")
    values = values.contiguous()
    codes = torch.empty(*values.shape[:-1], values.shape[-1] // 2, dtype=torch.uint8, device=values.device)
    return codes, _launch(_pack_kernel, values, codes, codes.numel())


def unpack_launch(codes: torch.Tensor) -> tuple[torch.Tensor, Launch]:
    """The FP32 E2M1 payload (..., 2n) of packed codes (uint8, (..., n)), allocated, and the launch that fills it."""
    _check(codes, "unpack")
    if codes.dtype != torch.uint8:
        raise ValueError(f"unpack_e2m1 takes uint8 codes, got {codes.dtype}")
    codes = codes.contiguous()
    values = torch.empty(*codes.shape[:-1], 2 * codes.shape[-1], dtype=torch.float32, device=codes.device)
    return values, _launch(_unpack_kernel, codes, values, codes.numel())


def pack_e2m1(values: torch.Tensor) -> torch.Tensor:
    """E2M1 values (FP32, last axis even) packed two per byte along the last axis, element 2i in the low nibble."""
    codes, launch = pack_launch(values)
    run([launch], codes.device)
    return codes


def unpack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """The FP32 E2M1 values of packed codes (inverse of :func:`pack_e2m1`)."""
    values, launch = unpack_launch(codes)
    run([launch], values.device)
    return values
