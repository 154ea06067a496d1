"""What a block quantization returns: :class:`QuantizedTensor`, and :class:`PackedQuantized`, its storage form.

A quantized tensor holds the payload (element values, E2M1 for FP4), the block scales as the scale format holds them,
the decoded FP32 block scales S = scale * (1/G), the tensor reference g it used with G and 1/G, the block maxima and
two diagnostics (blocks whose scale rounded to zero, blocks whose ideal scale saturated the scale format). Its tensors
are kept in the block view of its :class:`~ue5m3.numerics.layout.BlockLayout`; the public properties give them in
the input's layout.

Dequantization follows each scheme's reference implementation bit for bit
(:class:`~ue5m3.numerics.schemes.DequantizeOrder`): ``(payload * scale) * (1/G)`` as the paper's UE5M3 kernel
(numerics spec 3.1 step 7), ``payload * ((scale * g) * fp32(1/(T*F)))`` as Transformer Engine's NVFP4 dequantize
kernel (spec 3.2; finite for every finite input, see :func:`_te_final_scale`), one exact product for MXFP4.

The packed form keeps FP4 element codes two per byte (element 2i in the low nibble, as torchao and TE pack them) and
8-bit scale codes one per byte; unpacking decodes by table lookup on the device, so a training step can keep its
operands packed between forward and backward without a host round trip. :func:`pack_fp4` and :func:`unpack_fp4`
are the same nibble packing for plain code tensors.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch

from ue5m3.numerics import formats
from ue5m3.numerics.formats import FloatFormat, Rounding
from ue5m3.numerics.kernels.launch import triton_by_default
from ue5m3.numerics.layout import BlockLayout
from ue5m3.numerics.scale_rules import FP32_MAX
from ue5m3.numerics.schemes import BlockScheme, DequantizeOrder

__all__ = ["QuantizedTensor", "PackedQuantized", "pack_fp4", "unpack_fp4"]


@dataclass(frozen=True, eq=False)
class QuantizedTensor:
    """Result of :func:`~ue5m3.numerics.quantize.quantize`: payload, block scales, tensor reference and diagnostics.

    Internal tensors are kept in block view (``..., n_blocks, block``); the public properties return them in
    the layout of the input.
    """

    scheme: BlockScheme
    rounding: Rounding
    layout: BlockLayout
    tensor_amax: torch.Tensor  # g, 0-dim FP32 (the reference used, stale or current)
    global_scale: torch.Tensor  # G = (T*F)/g, 0-dim FP32 (1 for schemes without a tensor scale)
    global_decode_scale: torch.Tensor  # 1/G, FP32 reciprocal
    block_amax: torch.Tensor  # (..., n_blocks, 1) FP32
    scale_values: torch.Tensor  # (..., n_blocks, 1) values held by the scale format, after repair
    decode_scales_blocks: torch.Tensor  # (..., n_blocks, 1) S = scale * (1/G), FP32
    payload_blocks: torch.Tensor  # (..., n_blocks, block) element values, FP32
    zero_rounded_blocks: torch.Tensor  # 0-dim int64: scales that rounded to zero (before repair)
    saturated_blocks: torch.Tensor  # 0-dim int64: ideal scales above the scale format's max
    # 0-dim int64 :attr:`underflowed_blocks` where the quantizer counted them as it wrote the payload (the C kernel);
    # None: counted from the payload when asked
    lost_blocks: torch.Tensor | None = None

    @property
    def shape(self) -> torch.Size:
        return self.layout.shape

    @property
    def underflowed_blocks(self) -> torch.Tensor:
        """0-dim int64: blocks with a nonzero input and a nonzero scale whose every element quantized to zero (their
        values are lost: a block amax below what the scale and the FP32 reciprocal reach, about 1e-38 for NVFP4).
        Disjoint from :attr:`zero_rounded_blocks` (a zero scale loses its block too); the two sum to the lost
        blocks."""
        if self.lost_blocks is not None:
            return self.lost_blocks
        scale = self.scale_values.squeeze(-1)
        all_zero = torch.count_nonzero(self.payload_blocks, dim=-1) == 0  # one pass, no boolean copy of the payload
        lost = (self.block_amax.squeeze(-1) > 0) & (scale > 0) & all_zero
        return lost.sum()

    # payload and scales are views of the block tensors, formed once per object (a GEMM reads each several times,
    # and a cached weight's in every call); the views share the blocks' storage
    @functools.cached_property
    def payload(self) -> torch.Tensor:
        """Element values in the element format (e.g. E2M1 values), shaped like the input."""
        return self.layout.from_blocks(self.payload_blocks)

    @property
    def payload_codes(self) -> torch.Tensor:
        """Element codes (uint8), shaped like the input."""
        return formats.codes_of_values(self.payload, self.scheme.element).to(torch.uint8)

    @functools.cached_property
    def scales(self) -> torch.Tensor:
        """Block-scale values as the scale format holds them, before any tensor scale."""
        return self.layout.scales_from_blocks(self.scale_values)

    @property
    def scale_codes(self) -> torch.Tensor:
        """Integer codes of the block scales (int64), shaped like :attr:`scales`."""
        return formats.codes_of_values(self.scales, self.scheme.scale)

    @property
    def decode_scales(self) -> torch.Tensor:
        """Decoded FP32 block scales S (tensor scale applied), shaped like :attr:`scales`."""
        return self.layout.scales_from_blocks(self.decode_scales_blocks)

    def dequantize(self) -> torch.Tensor:
        """FP32 values in the scheme's reference order (see :class:`DequantizeOrder`), shaped like the input;
        finite for every finite input."""
        scheme, payload, scale = self.scheme, self.payload_blocks, self.scale_values
        if not scheme.uses_tensor_amax:
            return self.layout.from_blocks(payload * scale)  # no tensor scale: one exact product
        order = scheme.dequantize_order
        if order is DequantizeOrder.ENCODED:
            values = (payload * scale) * self.global_decode_scale
        elif order is DequantizeOrder.DECODE_SCALE:
            values = payload * self.decode_scales_blocks
        else:
            target_f = torch.tensor(float(scheme.target), dtype=torch.float32) * scheme.element.max_finite
            if order is DequantizeOrder.TE_TESTS:
                values = (payload * scale) * (self.tensor_amax / target_f)
            else:
                values = payload * _te_final_scale(scale, self.tensor_amax, torch.reciprocal(target_f))
        # A value whose quantized form exceeds the FP32 range (inputs near FP32 max whose block scale rounded up)
        # saturates at +-FP32 max instead of becoming inf; every finite result is left as the reference computes it.
        return self.layout.from_blocks(torch.clamp(values, -FP32_MAX, FP32_MAX))

    def encoded(self) -> torch.Tensor:
        """payload * scale value, shaped like the input: exact in BF16 (at most 6 significant bits)."""
        return self.layout.from_blocks(self.payload_blocks * self.scale_values)

    def packed(self) -> torch.Tensor:
        """Payload codes packed two per byte along the last axis (element 2i in the low nibble)."""
        return pack_fp4(self.payload_codes)

    def pack(self, *, kernel: bool | None = None) -> PackedQuantized:
        """The storage form (element codes two per byte, scale codes one per byte): what a training step keeps
        between the forward and the backward pass; :meth:`PackedQuantized.unpack` gives these bits back.
        ``kernel``: pack E2M1 payloads with the Triton kernel (one pass; default: where the Triton backend is the
        device's default, CUDA or a plan on ``meta``; the C kernel on the CPU where it builds), or with torch ops
        (False); the same bits."""
        element, scale = self.scheme.element, self.scheme.scale
        if _packs_on_triton(element, self.payload_blocks.device, kernel):
            from ue5m3.numerics.kernels import triton_pack

            payload = triton_pack.pack_e2m1(self.payload_blocks)
        elif _packs_on_cpu_kernel(element, self.payload_blocks.device, kernel):
            from ue5m3.numerics.kernels import cpu as cpu_kernel

            payload = cpu_kernel.pack_e2m1(self.payload_blocks)
        else:
            payload = (
                formats.e2m1_codes(self.payload_blocks)
                if element == formats.E2M1
                else formats.codes_of_values(self.payload_blocks, element).to(torch.uint8)
            )
            if element.bits <= 4:
                payload = payload[..., 0::2] | (payload[..., 1::2] << 4)  # blocks have an even size
        scales = self.scale_values
        if scale.bits <= 8 and _scale_codes_on_cpu_kernel(scale, scales, kernel):
            from ue5m3.numerics.kernels import cpu as cpu_kernel

            scales = cpu_kernel.scale_codes(scales, scale)
        elif scale.bits <= 8:
            scales = formats.codes_of_values(scales, scale).to(torch.uint8)
        shared = {**_shared_fields(self), "lost_blocks": self.underflowed_blocks}  # counted once, kept with the codes
        return PackedQuantized(scale_codes=scales, payload_codes=payload, **shared)

    def diagnostics(self) -> dict[str, float | int]:
        return {
            "tensor_amax": float(self.tensor_amax),
            "zero_rounded_blocks": int(self.zero_rounded_blocks),
            "saturated_blocks": int(self.saturated_blocks),
            "underflowed_blocks": int(self.underflowed_blocks),
            "blocks": int(self.scale_values.numel()),
        }


@dataclass(frozen=True)
class PackedQuantized:
    """A :class:`QuantizedTensor` as it is stored: FP4 element codes two per byte, 8-bit scale codes one per byte,
    the FP32 block maxima and the 0-dim references (1.3 bytes per element for 16-element blocks, against 4 for the
    FP32 payload). :meth:`unpack` rebuilds the quantized tensor bit for bit without reading anything back to the
    host; :meth:`tensors` and :meth:`with_tensors` let autograd's ``save_for_backward`` hold the tensors."""

    scheme: BlockScheme
    rounding: Rounding
    layout: BlockLayout
    tensor_amax: torch.Tensor
    global_scale: torch.Tensor
    global_decode_scale: torch.Tensor
    block_amax: torch.Tensor
    scale_codes: torch.Tensor  # (..., n_blocks, 1) uint8 codes (FP32 values for scale formats wider than 8 bits)
    payload_codes: torch.Tensor  # (..., n_blocks, block / 2) uint8, element 2i in the low nibble (FP4 elements)
    zero_rounded_blocks: torch.Tensor
    saturated_blocks: torch.Tensor
    lost_blocks: torch.Tensor  # 0-dim int64: the quantized tensor's underflowed_blocks

    _TENSORS = (
        "tensor_amax",
        "global_scale",
        "global_decode_scale",
        "block_amax",
        "scale_codes",
        "payload_codes",
        "zero_rounded_blocks",
        "saturated_blocks",
        "lost_blocks",
    )

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return tuple(getattr(self, field) for field in self._TENSORS)

    def with_tensors(self, tensors: tuple[torch.Tensor, ...]) -> PackedQuantized:
        return dataclasses.replace(self, **dict(zip(self._TENSORS, tensors, strict=True)))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def unpack(self, *, kernel: bool | None = None) -> QuantizedTensor:
        """The quantized tensor these codes hold, bit for bit; ``kernel`` as :meth:`QuantizedTensor.pack`."""
        element, scale = self.scheme.element, self.scheme.scale
        codes = self.payload_codes
        if _packs_on_triton(element, codes.device, kernel):
            from ue5m3.numerics.kernels import triton_pack

            payload = triton_pack.unpack_e2m1(codes)
        elif _packs_on_cpu_kernel(element, codes.device, kernel):
            from ue5m3.numerics.kernels import cpu as cpu_kernel

            payload = cpu_kernel.unpack_e2m1(codes)
        else:
            if element.bits <= 4:  # (..., block/2) -> (..., block/2, 2) -> (..., block)
                codes = torch.stack([codes & 0x0F, codes >> 4], dim=-1).reshape(*codes.shape[:-1], 2 * codes.shape[-1])
            payload = _code_table(element, codes.device)[codes.long()]
        scale_values = self.scale_codes
        if scale.bits <= 8:
            scale_values = _code_table(scale, scale_values.device)[scale_values.long()]
        return QuantizedTensor(
            scale_values=scale_values,
            decode_scales_blocks=scale_values * self.global_decode_scale,  # as quantize() computes it
            payload_blocks=payload,
            **_shared_fields(self),
        )


def _packs_on_triton(element: FloatFormat, device: torch.device, kernel: bool | None) -> bool:
    """Whether the Triton pack/unpack kernels handle this payload: E2M1 only; by default where Triton is the device's
    default backend (an explicit ``kernel=True`` elsewhere runs them where they can, e.g. in the interpreter)."""
    if element.name != "e2m1" or kernel is False:
        return False
    return kernel is True or triton_by_default(device)


def _packs_on_cpu_kernel(element: FloatFormat, device: torch.device, kernel: bool | None) -> bool:
    """Whether the C kernel packs and unpacks this payload: E2M1 on the CPU by default (``kernel=None``) where the
    kernel builds; ``kernel=False`` keeps the torch ops (the same bits)."""
    if element.name != "e2m1" or kernel is not None or device.type != "cpu":
        return False
    from ue5m3.numerics.kernels import cpu as cpu_kernel

    return cpu_kernel.available()


def _scale_codes_on_cpu_kernel(scale: FloatFormat, values: torch.Tensor, kernel: bool | None) -> bool:
    """Whether the C kernel encodes these scale values (FP32 on the CPU, a format it takes, ``kernel=None``, where
    the kernel builds); the torch ops otherwise, the same bits."""
    if kernel is not None or values.device.type != "cpu" or values.dtype != torch.float32:
        return False
    from ue5m3.numerics.kernels import cpu as cpu_kernel

    return cpu_kernel.takes_scale_codes(scale) and cpu_kernel.available()


_SHARED_FIELDS = (
    "scheme",
    "rounding",
    "layout",
    "tensor_amax",
    "global_scale",
    "global_decode_scale",
    "block_amax",
    "zero_rounded_blocks",
    "saturated_blocks",
    "lost_blocks",
)


def _shared_fields(q: QuantizedTensor | PackedQuantized) -> dict:
    """The fields a quantized tensor and its packed form hold alike."""
    return {field: getattr(q, field) for field in _SHARED_FIELDS}


_CODE_TABLES: dict[tuple[str, str], torch.Tensor] = {}


def _code_table(fmt: FloatFormat, device: torch.device) -> torch.Tensor:
    """FP32 value of every code of an (at most) 8-bit format, NaN where a code is not finite, on ``device``; built
    once per format and device, so decoding by lookup never reads back to the host."""
    key = (fmt.name, str(device))
    if key not in _CODE_TABLES:
        codes = torch.arange(1 << fmt.bits, dtype=torch.int64)
        magnitude = codes & (fmt._sign_bit - 1) if fmt.signed else codes
        finite = magnitude <= fmt.max_magnitude_code
        table = torch.full((1 << fmt.bits,), float("nan"), dtype=torch.float32)
        table[finite] = formats.decode(codes[finite], fmt)
        _CODE_TABLES[key] = table.to(device)
    return _CODE_TABLES[key]


def _te_final_scale(scale: torch.Tensor, amax: torch.Tensor, factor_inv: torch.Tensor) -> torch.Tensor:
    """(scale * amax) * factor_inv in FP32, as Transformer Engine's NVFP4 dequantize kernel; where scale * amax
    overflows FP32 (tensor amax above FP32max/448) the same two roundings are evaluated 2^64 lower and scaled
    back, which is exact, so the result is TE's wherever TE's is finite and finite everywhere."""
    final = (scale * amax) * factor_inv
    # per block, so computing the wide form everywhere costs little and reads nothing back to the host
    low = amax * 2.0**-64  # exact scalings by powers of two
    wide = ((scale * low) * factor_inv) * 2.0**64
    return torch.where(torch.isinf(final), wide, final)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Pack 4-bit codes two per byte along the last axis: element 2i in the low nibble, 2i+1 in the high."""
    if codes.dtype.is_floating_point:
        raise TypeError(f"codes must be integers, got {codes.dtype}")
    if codes.shape[-1] % 2:
        raise ValueError(f"packing needs an even last dimension, got shape {tuple(codes.shape)}")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) > 15):
        raise ValueError("FP4 codes must lie in [0, 15]")
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_fp4` (uint8 codes, last axis doubled)."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"packed FP4 data must be uint8, got {packed.dtype}")
    low, high = packed & 0x0F, packed >> 4
    # (..., n/2) x2 -> (..., n/2, 2) -> (..., n)
    return torch.stack([low, high], dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
