"""Block quantization: FP4 payloads with per-block scales, one code path for every scheme.

A :class:`BlockScheme` composes an element format (E2M1), a block size, a scale format and a rule for the
block scale (numerics spec section 3):

* ``tensor_scaled`` -- the paper's UE5M3 quantizer and NVIDIA's NVFP4 as Transformer Engine computes it. With
  target T, element max F and tensor reference g: G = (T * F) / g in FP32 (capped at FP32 max, 1 when g = 0);
  ideal block scale u = a_B * (G * (1/F)) in exactly that FP32 order (``scale_order`` selects TE's older order
  or torchao's for comparisons), u = min(u, scale max), RNE onto the scale format; decoded block scale
  S = scale * (1/G); payload = round_E2M1(x * (1/S)) (reciprocal then multiply, as the kernels do).
  UE5M3 repairs scales that round to zero to 1.0 (``zero_scale_repair``); TE does not.
* ``mx_floor`` -- OCP MXFP4: scale 2^(floor(log2 a_B) - 2) read from exponent bits, no tensor scale.
* ``mx_ceil`` -- the alternative 2^(ceil(log2 a_B) - 2) (torchao's CEIL mode).
* ``mx_rceil`` -- 2^ceil(log2(a_B * (1/6))), the exponent of the FP32 product rounded up from its bits
  (torchao's RCEIL, Transformer Engine's ``float_to_e8m0`` and Blackwell's ``cvt.rp.satfinite.ue8m0x2.f32``).
* ``mx_round_log2`` -- the authors' MXFP4 baseline: a tensor scale as above, then the power of two nearest to
  u in the log domain.

Blocks run along any one axis (1D) or are BxB tiles of a 2-D tensor (2D, weights: a tensor and its transpose
quantize to exactly the same values). Ragged shapes are zero-padded to whole blocks and tiles as Transformer
Engine does: the padding takes part in block maxima (so amax, scales and the valid cells are unchanged), the block
grid keeps the padded size and the payload is cropped back to the input's shape.

Dequantization follows each scheme's reference implementation bit for bit (:class:`DequantizeOrder`): the paper's
kernel for UE5M3, Transformer Engine's dequantize kernel for NVFP4 (finite for every finite input), OCP/torchao
for MXFP4.

Stochastic rounding draws its bits from Philox4x32-10 keyed by a :class:`~ue5m3.numerics.philox.RandomStream`
and each element's global index (:class:`~ue5m3.numerics.philox.ElementIndex`), on every backend the same.
:func:`quantize` returns a :class:`QuantizedTensor` holding payload, scale codes, decoded scales, the tensor
reference and diagnostics (blocks whose scale rounded to zero, blocks that saturated the scale format).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum

import torch

from ue5m3.numerics import formats, philox
from ue5m3.numerics.backend import Backend
from ue5m3.numerics.checks import DeferredChecks
from ue5m3.numerics.formats import E2M1, E4M3, UE5M3, UE8M0, FloatFormat, Rounding

__all__ = [
    "ScaleRule",
    "ScaleOrder",
    "DequantizeOrder",
    "BlockScheme",
    "SCHEMES",
    "get_scheme",
    "Backend",
    "QuantizedTensor",
    "PackedQuantized",
    "quantize",
    "AxisQuantization",
    "quantize_both_axes",
    "fake_quantize",
    "pack_fp4",
    "unpack_fp4",
]

FP32_MAX = torch.finfo(torch.float32).max


class ScaleRule(StrEnum):
    """How a block scale is derived from the block amax."""

    TENSOR_SCALED = "tensor_scaled"
    MX_FLOOR = "mx_floor"
    MX_CEIL = "mx_ceil"
    MX_RCEIL = "mx_rceil"
    MX_ROUND_LOG2 = "mx_round_log2"


class DequantizeOrder(StrEnum):
    """FP32 order of dequantization, one per reference implementation (they differ in the last bit)."""

    ENCODED = "encoded"  # (payload * scale) * (1/G): the paper's UE5M3 kernel (exact product, one rounding)
    DECODE_SCALE = "decode_scale"  # payload * (scale * (1/G)): the paper's portable torch reference
    TE_KERNEL = "te_kernel"  # payload * ((scale * g) * fp32(1/(T*F))): Transformer Engine's NVFP4 dequantize kernel
    TE_TESTS = "te_tests"  # (payload * scale) * (g / (T*F)): how Transformer Engine's NVFP4 PyTorch tests compare


class ScaleOrder(StrEnum):
    """FP32 operation order of the ideal tensor-scaled block scale (they differ at scale-format midpoints)."""

    TE = "te"  # a_B * (G * (1/F)): the paper's UE5M3 and current Transformer Engine
    TE_LEGACY = "te_legacy"  # (a_B / F) * G: older Transformer Engine releases
    TORCHAO = "torchao"  # (a_B / F) / (g / (T * F)): torchao's nvfp4_quantize


@dataclass(frozen=True, kw_only=True)
class BlockScheme:
    """A block-scaled format: element format, block size, scale format and scale rule.

    Attributes:
        name: scheme name recorded with results.
        scale: format of the block scales (UE5M3, E4M3, UE8M0, ...).
        block_size: elements per block (and tile side for 2D blocks).
        target: tensor-scale target T, or None for schemes without a tensor scale (OCP MX).
        element: payload format.
        scale_rule: see :class:`ScaleRule`.
        scale_order: see :class:`ScaleOrder` (tensor-scaled rules only).
        zero_scale_repair: replace block scales that round to zero by 1.0 (the paper's UE5M3 rule).
        dequantize_order: see :class:`DequantizeOrder`.
    """

    name: str
    scale: FloatFormat
    block_size: int
    target: float | None
    element: FloatFormat = E2M1
    scale_rule: ScaleRule = ScaleRule.TENSOR_SCALED
    scale_order: ScaleOrder = ScaleOrder.TE
    zero_scale_repair: bool = False
    dequantize_order: DequantizeOrder = DequantizeOrder.ENCODED

    def __post_init__(self) -> None:
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"scheme {self.name!r}: block_size must be a positive int, got {self.block_size!r}")
        object.__setattr__(self, "scale_rule", ScaleRule(self.scale_rule))
        object.__setattr__(self, "scale_order", ScaleOrder(self.scale_order))
        object.__setattr__(self, "dequantize_order", DequantizeOrder(self.dequantize_order))
        needs_target = self.scale_rule in (ScaleRule.TENSOR_SCALED, ScaleRule.MX_ROUND_LOG2)
        if needs_target:
            if self.target is None or isinstance(self.target, bool):
                raise ValueError(f"scheme {self.name!r}: rule {self.scale_rule.value!r} needs a numeric target")
            target = float(self.target)
            if not (0 < target < float("inf")):
                raise ValueError(f"scheme {self.name!r}: target must be positive and finite, got {self.target!r}")
        elif self.target is not None:
            raise ValueError(f"scheme {self.name!r}: rule {self.scale_rule.value!r} takes no target")
        if self.scale_rule is not ScaleRule.TENSOR_SCALED and self.scale != UE8M0:
            raise ValueError(f"scheme {self.name!r}: MX rules need the ue8m0 scale format")

    def with_target(self, target: float) -> BlockScheme:
        return dataclasses.replace(self, target=target)

    @property
    def uses_tensor_amax(self) -> bool:
        """Whether the block scales depend on a tensor reference (the MX power-of-two rules read only the block)."""
        return self.scale_rule in (ScaleRule.TENSOR_SCALED, ScaleRule.MX_ROUND_LOG2)


SCHEMES: dict[str, BlockScheme] = {
    "ue5m3_b16": BlockScheme(name="ue5m3_b16", scale=UE5M3, block_size=16, target=448.0, zero_scale_repair=True),
    "ue5m3_b32": BlockScheme(name="ue5m3_b32", scale=UE5M3, block_size=32, target=448.0, zero_scale_repair=True),
    "nvfp4": BlockScheme(
        name="nvfp4", scale=E4M3, block_size=16, target=448.0, dequantize_order=DequantizeOrder.TE_KERNEL
    ),
    "mxfp4": BlockScheme(name="mxfp4", scale=UE8M0, block_size=32, target=None, scale_rule=ScaleRule.MX_FLOOR),
}


def get_scheme(scheme: str | BlockScheme) -> BlockScheme:
    """Look up a named scheme, or pass a scheme object through."""
    if isinstance(scheme, BlockScheme):
        return scheme
    if not isinstance(scheme, str):
        raise TypeError(f"scheme must be a name or BlockScheme, got {type(scheme).__name__}")
    try:
        return SCHEMES[scheme]
    except KeyError:
        raise ValueError(f"unknown scheme {scheme!r}; known schemes: {sorted(SCHEMES)}") from None


# ----- block layout -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _BlockLayout:
    """Maps a tensor to a block view (..., n_blocks, block) and back, zero-padding ragged shapes to whole blocks
    (the block view and the scales keep the padded grid; tensors shaped like the input are cropped back)."""

    shape: torch.Size
    axis: int
    block_size: int
    two_d: bool
    padded: tuple[int, ...]

    @classmethod
    def of(cls, x: torch.Tensor, block_size: int, axis: int, two_d: bool, name: str) -> _BlockLayout:
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
        self, index: philox.ElementIndex | None, name: str, device: torch.device | str | None = None
    ) -> tuple[torch.Tensor, int, int, int]:
        """Global element indices of the block view, as (first index of each block [n_blocks] int64, inner
        length, inner stride, outer stride): element p of a block sits at
        base + (p // inner length) * outer stride + (p % inner length) * inner stride."""
        base, strides = (index or philox.ElementIndex()).strides(tuple(self.shape), name)
        b = self.block_size
        if self.two_d:
            rows, cols = self.padded
            r = torch.arange(rows // b, dtype=torch.int64, device=device)[:, None] * (b * strides[0])
            c = torch.arange(cols // b, dtype=torch.int64, device=device)[None, :] * (b * strides[1])
            return (base + r + c).reshape(-1), b, strides[1], strides[0]
        dims = [d for d in range(len(self.shape)) if d != self.axis]
        first = torch.full(
            [self.padded[d] for d in dims] + [self.padded[self.axis] // b], base, dtype=torch.int64, device=device
        )
        for position, d in enumerate([*dims, self.axis]):
            step = strides[d] * (b if d == self.axis else 1)
            view = [1] * first.ndim
            view[position] = first.shape[position]
            first = first + torch.arange(first.shape[position], dtype=torch.int64, device=device).reshape(view) * step
        return first.reshape(-1), b, strides[self.axis], 0


# ----- the quantized tensor -----------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class QuantizedTensor:
    """Result of :func:`quantize`: payload, block scales, tensor reference and diagnostics.

    Internal tensors are kept in block view (``..., n_blocks, block``); the public properties return them in
    the layout of the input.
    """

    scheme: BlockScheme
    rounding: Rounding
    layout: _BlockLayout
    tensor_amax: torch.Tensor  # g, 0-dim FP32 (the reference used, stale or current)
    global_scale: torch.Tensor  # G = (T*F)/g, 0-dim FP32 (1 for schemes without a tensor scale)
    global_decode_scale: torch.Tensor  # 1/G, FP32 reciprocal
    block_amax: torch.Tensor  # (..., n_blocks, 1) FP32
    scale_values: torch.Tensor  # (..., n_blocks, 1) values held by the scale format, after repair
    decode_scales_blocks: torch.Tensor  # (..., n_blocks, 1) S = scale * (1/G), FP32
    payload_blocks: torch.Tensor  # (..., n_blocks, block) element values, FP32
    zero_rounded_blocks: torch.Tensor  # 0-dim int64: scales that rounded to zero (before repair)
    saturated_blocks: torch.Tensor  # 0-dim int64: ideal scales above the scale format's max

    @property
    def shape(self) -> torch.Size:
        return self.layout.shape

    @property
    def underflowed_blocks(self) -> torch.Tensor:
        """0-dim int64: blocks with a nonzero input and a nonzero scale whose every element quantized to zero (their
        values are lost: a block amax below what the scale and the FP32 reciprocal reach, about 1e-38 for NVFP4).
        Disjoint from :attr:`zero_rounded_blocks` (a zero scale loses its block too); the two sum to the lost
        blocks."""
        scale = self.scale_values.squeeze(-1)
        lost = (self.block_amax.squeeze(-1) > 0) & (scale > 0) & (self.payload_blocks == 0).all(-1)
        return lost.sum()

    @property
    def payload(self) -> torch.Tensor:
        """Element values in the element format (e.g. E2M1 values), shaped like the input."""
        return self.layout.from_blocks(self.payload_blocks)

    @property
    def payload_codes(self) -> torch.Tensor:
        """Element codes (uint8), shaped like the input."""
        return formats.codes_of_values(self.payload, self.scheme.element).to(torch.uint8)

    @property
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
        if scheme.scale_rule not in (ScaleRule.TENSOR_SCALED, ScaleRule.MX_ROUND_LOG2):
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

    def pack(self) -> PackedQuantized:
        """The storage form (element codes two per byte, scale codes one per byte): what a training step keeps
        between the forward and the backward pass; :meth:`PackedQuantized.unpack` gives these bits back."""
        element, scale = self.scheme.element, self.scheme.scale
        payload = formats.codes_of_values(self.payload_blocks, element).to(torch.uint8)
        if element.bits <= 4:
            payload = payload[..., 0::2] | (payload[..., 1::2] << 4)  # blocks have an even size
        scales = self.scale_values
        if scale.bits <= 8:
            scales = formats.codes_of_values(scales, scale).to(torch.uint8)
        return PackedQuantized(scale_codes=scales, payload_codes=payload, **_shared_fields(self))

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
    layout: _BlockLayout
    tensor_amax: torch.Tensor
    global_scale: torch.Tensor
    global_decode_scale: torch.Tensor
    block_amax: torch.Tensor
    scale_codes: torch.Tensor  # (..., n_blocks, 1) uint8 codes (FP32 values for scale formats wider than 8 bits)
    payload_codes: torch.Tensor  # (..., n_blocks, block / 2) uint8, element 2i in the low nibble (FP4 elements)
    zero_rounded_blocks: torch.Tensor
    saturated_blocks: torch.Tensor

    _TENSORS = (
        "tensor_amax",
        "global_scale",
        "global_decode_scale",
        "block_amax",
        "scale_codes",
        "payload_codes",
        "zero_rounded_blocks",
        "saturated_blocks",
    )

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return tuple(getattr(self, field) for field in self._TENSORS)

    def with_tensors(self, tensors: tuple[torch.Tensor, ...]) -> PackedQuantized:
        return dataclasses.replace(self, **dict(zip(self._TENSORS, tensors, strict=True)))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def unpack(self) -> QuantizedTensor:
        element, scale = self.scheme.element, self.scheme.scale
        codes = self.payload_codes
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


# ----- scale rules --------------------------------------------------------------------------------------


def _global_scale(target: float, element_max: float, amax: torch.Tensor) -> torch.Tensor:
    """G = (T * F) / g in FP32, capped at FP32 max; 1 when g == 0 or G underflows to 0."""
    numerator = torch.tensor(target, dtype=torch.float32) * torch.tensor(element_max, dtype=torch.float32)
    g = torch.clamp(numerator / amax, max=FP32_MAX)
    return torch.where((amax == 0) | (g == 0), torch.ones_like(g), g)


def _ideal_scale(
    block_amax: torch.Tensor, g: torch.Tensor, global_scale: torch.Tensor, scheme: BlockScheme
) -> torch.Tensor:
    inv_f = torch.tensor(1.0, dtype=torch.float32) / scheme.element.max_finite  # the FP32 constant 1/F
    if scheme.scale_order is ScaleOrder.TE:
        # G * (1/F) first, then times a_B: reassociating moves exact midpoints (spec's 38,912 case).
        return block_amax * (global_scale * inv_f)
    if scheme.scale_order is ScaleOrder.TE_LEGACY:
        return (block_amax / scheme.element.max_finite) * global_scale
    per_tensor = g / (torch.tensor(float(scheme.target), dtype=torch.float32) * scheme.element.max_finite)
    per_tensor = torch.where(g == 0, torch.ones_like(per_tensor), per_tensor)
    return (block_amax / scheme.element.max_finite) / per_tensor


def _power_of_two(exponent: torch.Tensor) -> torch.Tensor:
    return torch.ldexp(torch.ones_like(exponent, dtype=torch.float32), exponent.to(torch.int32))


def _block_scales(
    block_amax: torch.Tensor, g: torch.Tensor, global_scale: torch.Tensor, scheme: BlockScheme
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (scale values after repair, zero-rounded mask, saturated mask)."""
    scale_fmt = scheme.scale
    element_emax = scheme.element.max_exponent
    if scheme.scale_rule in (ScaleRule.MX_FLOOR, ScaleRule.MX_CEIL):
        # Exponent bits of a_B (FP32 bit pattern), never a dtype cast: zero gives field 0 -> minimum scale.
        bits = block_amax.view(torch.int32)
        exponent = ((bits >> 23) & 0xFF) - 127
        if scheme.scale_rule is ScaleRule.MX_CEIL:
            exponent = exponent + ((bits & 0x7FFFFF) != 0).to(exponent.dtype)
        exponent = exponent - element_emax
        saturated = exponent > scale_fmt.max_exponent
        exponent = torch.clamp(exponent, min=scale_fmt.min_exponent, max=scale_fmt.max_exponent)
        return _power_of_two(exponent), torch.zeros_like(saturated), saturated
    if scheme.scale_rule is ScaleRule.MX_RCEIL:
        # descale = a_B * fp32(1/F), its biased exponent rounded up from the bits; FP32 subnormals round up only
        # above 2^-127 (the UE8M0 minimum, mantissa 0x400000); saturating at the scale format's max.
        descale = block_amax * (torch.tensor(1.0, dtype=torch.float32) / scheme.element.max_finite)
        bits = descale.view(torch.int32)
        biased, mantissa = (bits >> 23) & 0xFF, bits & 0x7FFFFF
        up = torch.where(biased == 0, mantissa > 0x400000, mantissa != 0)
        exponent = biased + up.to(biased.dtype) - 127
        saturated = exponent > scale_fmt.max_exponent
        exponent = torch.clamp(exponent, min=scale_fmt.min_exponent, max=scale_fmt.max_exponent)
        return _power_of_two(exponent), torch.zeros_like(saturated), saturated
    ideal = _ideal_scale(block_amax, g, global_scale, scheme)
    saturated = ideal > scale_fmt.max_finite
    if scheme.scale_rule is ScaleRule.MX_ROUND_LOG2:
        exponent = torch.round(torch.log2(ideal.to(torch.float64)))
        exponent = torch.clamp(torch.nan_to_num(exponent, neginf=-1e4), scale_fmt.min_exponent, scale_fmt.max_exponent)
        return _power_of_two(exponent), torch.zeros_like(saturated), saturated
    ideal = torch.clamp(ideal, max=scale_fmt.max_finite)
    values = formats.round_magnitude(ideal, scale_fmt, Rounding.RNE, None)  # scales are always RNE
    zero = values == 0
    if scheme.zero_scale_repair:
        values = torch.where(zero, torch.ones_like(values), values)
    return values, zero, saturated


# ----- the quantizer ------------------------------------------------------------------------------------


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
        return "no C compiler to build the kernel"
    return None


def _triton_reason(x: torch.Tensor, scheme: BlockScheme) -> str | None:
    """Why the Triton kernel cannot take this case (None if it can)."""
    reason = _scheme_reason(scheme)
    if reason is not None:
        return reason
    try:
        from ue5m3.numerics.kernels import triton_quantize
    except ImportError:
        return "triton is not installed (pip install 'ue5m3[gpu]')"
    return triton_quantize.usable(x.device)


def _fused_kernel(x: torch.Tensor, scheme: BlockScheme, backend: Backend, name: str) -> str | None:
    """Which fused kernel quantizes ``x`` ('cpu_kernel', 'triton' or None for the torch path); an explicit
    kernel backend that cannot take the case raises, naming the tensor and the reason."""
    if backend is Backend.TORCH:
        return None
    if backend is Backend.CPU_KERNEL or (backend is Backend.AUTO and x.device.type == "cpu"):
        reason = _kernel_reason(x, scheme)
        if reason is None:
            return "cpu_kernel"
        if backend is Backend.CPU_KERNEL:
            raise ValueError(f"backend='cpu_kernel' cannot quantize {name!r}: {reason}; use backend='torch' or 'auto'")
        return None
    reason = _triton_reason(x, scheme)
    if reason is None:
        return "triton"
    if backend is Backend.TRITON:
        raise ValueError(f"backend='triton' cannot quantize {name!r}: {reason}; use backend='torch' or 'auto'")
    return None


def quantize(
    x: torch.Tensor,
    scheme: str | BlockScheme,
    *,
    tensor_amax: torch.Tensor | float | None = None,
    target: float | None = None,
    rounding: Rounding | str = Rounding.RNE,
    two_d: bool = False,
    axis: int = -1,
    random_bits: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    stream: philox.RandomStream | None = None,
    index: philox.ElementIndex | None = None,
    name: str = "x",
    backend: Backend | str = Backend.AUTO,
    checks: DeferredChecks | None = None,
) -> QuantizedTensor:
    """Block-quantize ``x`` (computed in FP32) under ``scheme``.

    Args:
        x: finite tensor; ragged shapes are zero-padded to whole blocks (scales keep the padded grid).
        scheme: a name in :data:`SCHEMES` or a :class:`BlockScheme`.
        tensor_amax: tensor reference g (e.g. a held, possibly stale, amax); defaults to max|x| now.
        target: overrides the scheme's target T.
        rounding: payload rounding (scales are always RNE).
        two_d: BxB tiles of a 2-D tensor instead of 1D blocks along ``axis``.
        axis: the blocked axis (the GEMM reduction dimension) for 1D blocks.
        random_bits: explicit per-element random integers for stochastic rounding, shaped like ``x`` (tests).
        generator: seeds a fresh random stream when neither ``random_bits`` nor ``stream`` is given.
        stream: the Philox stream of this quantization (run seed, module, role, step, microbatch).
        index: where ``x`` sits in the logical tensor whose global indices key the bits (shards).
        name: tensor name for error messages.
        backend: see :class:`Backend`; results do not depend on it.
        checks: record the finiteness checks of ``x`` and ``tensor_amax`` on their device instead of reading them
            now (no host synchronisation; :meth:`DeferredChecks.raise_if_any` raises later, naming the tensor).

    Returns:
        A :class:`QuantizedTensor`.

    Raises:
        ValueError: non-finite input or reference, bad shapes, unknown scheme or rounding, or
            ``backend="cpu_kernel"`` for a case the kernel does not cover.
    """
    scheme = get_scheme(scheme)
    if target is not None:
        scheme = scheme.with_target(target)
    rounding = Rounding(rounding)
    backend = Backend(backend)
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        raise TypeError(f"tensor {name!r} must be floating point, got {x.dtype}")
    if tensor_amax is not None and not scheme.uses_tensor_amax:
        raise ValueError(
            f"tensor {name!r}: scheme {scheme.name!r} ({scheme.scale_rule.value}) has no tensor scale, so a "
            "tensor_amax would be ignored; pass None"
        )
    x = x.to(torch.float32)
    layout = _BlockLayout.of(x, scheme.block_size, axis, two_d, name)
    kernel = _fused_kernel(x, scheme, backend, name)
    use_kernel = kernel is not None
    if rounding.random_bit_count and random_bits is None and stream is None:
        stream = formats.anonymous_stream(generator)
    if random_bits is not None or not rounding.random_bit_count:
        bits = formats.check_random_bits(x, rounding, random_bits, generator)
    elif use_kernel:
        bits = None  # the kernel draws the stream's Philox bits itself
    else:
        bits = philox.random_bits(
            stream, tuple(x.shape), rounding.random_bit_count, index=index, name=name, device=x.device
        )
    nonfinite = f"tensor {name!r} holds non-finite value(s) (Inf/NaN); quantizers need finite input"
    if use_kernel or tensor_amax is not None:
        current = _checked_amax(x, name, checks)
    if tensor_amax is None:
        g = current if use_kernel else None
    else:
        g = _held_reference(tensor_amax, name, checks)
    if kernel == "triton" and layout.axis == 0 and _two_axis_layout(layout, x) and bits is None:
        # 1D blocks along the first axis of a 2-D tensor: read in place by the two-axis kernel (no transposed copy)
        request = AxisQuantization(rounding=rounding, stream=stream, index=index, name=name)
        return _both_axes_kernel(x, scheme, None, g, request, g, transposed=False)[1]
    blocks = layout.to_blocks(x)
    if use_kernel:
        philox_stream = stream if bits is None and rounding.random_bit_count else None
        return _quantize_kernel(blocks, g, layout, scheme, rounding, bits, philox_stream, index, name, kernel)
    block_amax = torch.amax(blocks.abs(), dim=-1, keepdim=True)  # NaN propagates into the check below
    if tensor_amax is None:
        g = block_amax.max() if block_amax.numel() else torch.zeros((), dtype=torch.float32, device=x.device)
        if checks is not None:
            checks.defer(name, ~torch.isfinite(g), nonfinite)
        elif not bool(torch.isfinite(block_amax).all()):
            formats.check_finite(x, name)
    global_scale = _tensor_global_scale(scheme, g)
    global_decode_scale = torch.reciprocal(global_scale)
    scale_values, zero, saturated = _block_scales(block_amax, g, global_scale, scheme)
    decode_scales = scale_values * global_decode_scale
    # Reciprocal then multiply, as the kernels do (a division can cross an E2M1 midpoint for stale references).
    multiplier = torch.clamp(torch.reciprocal(decode_scales), max=FP32_MAX)
    element_max = scheme.element.max_finite
    scaled = torch.clamp(blocks * multiplier, -element_max, element_max)
    block_bits = layout.to_blocks(bits) if bits is not None else None
    magnitude = formats.round_magnitude(scaled.abs(), scheme.element, rounding, block_bits)
    return QuantizedTensor(
        scheme=scheme,
        rounding=rounding,
        layout=layout,
        tensor_amax=g,
        global_scale=global_scale,
        global_decode_scale=global_decode_scale,
        block_amax=block_amax,
        scale_values=scale_values,
        decode_scales_blocks=decode_scales,
        payload_blocks=torch.copysign(magnitude, scaled),
        zero_rounded_blocks=zero.sum(),
        saturated_blocks=saturated.sum(),
    )


def _tensor_global_scale(scheme: BlockScheme, g: torch.Tensor) -> torch.Tensor:
    if scheme.scale_rule in (ScaleRule.TENSOR_SCALED, ScaleRule.MX_ROUND_LOG2):
        return _global_scale(float(scheme.target), scheme.element.max_finite, g)
    return torch.ones((), dtype=torch.float32)


def _quantize_kernel(
    blocks: torch.Tensor,
    g: torch.Tensor,
    layout: _BlockLayout,
    scheme: BlockScheme,
    rounding: Rounding,
    bits: torch.Tensor | None,
    stream: philox.RandomStream | None,
    index: philox.ElementIndex | None,
    name: str,
    kernel: str,
) -> QuantizedTensor:
    if kernel == "triton":
        from ue5m3.numerics.kernels import triton_quantize as fused
    else:
        from ue5m3.numerics.kernels import cpu as fused

    global_scale, global_decode_scale, per_tensor = _tensor_factors(scheme, g)
    # (..., n_blocks, L) -> (N, L): a view for 1D blocks along the last axis, a copy otherwise
    flat = blocks.reshape(-1, blocks.shape[-1])
    flat_bits = layout.to_blocks(bits).reshape(flat.shape) if bits is not None else None
    out = fused.quantize_blocks(
        flat,
        rule=scheme.scale_rule.value,
        order=scheme.scale_order.value,
        # CPU kernel: host floats (free on the CPU); Triton: the 0-dim device tensors, read in the kernel (no sync)
        global_scale=float(global_scale) if kernel != "triton" else global_scale,
        global_decode_scale=float(global_decode_scale) if kernel != "triton" else global_decode_scale,
        per_tensor=float(per_tensor) if kernel != "triton" else per_tensor,
        scale_max=scheme.scale.max_finite,
        scale_mantissa_bits=scheme.scale.mantissa_bits,
        scale_min_exponent=scheme.scale.min_exponent,
        scale_max_exponent=scheme.scale.max_exponent,
        zero_scale_repair=scheme.zero_scale_repair,
        rounding=rounding.value,
        random_bits=flat_bits,
        philox=None if stream is None else (stream, *layout.block_indices(index, name, flat.device)),
    )
    return _from_kernel(out, scheme, rounding, layout, g, global_scale, global_decode_scale, blocks.shape)


def _from_kernel(
    out: dict[str, torch.Tensor],
    scheme: BlockScheme,
    rounding: Rounding,
    layout: _BlockLayout,
    g: torch.Tensor,
    global_scale: torch.Tensor,
    global_decode_scale: torch.Tensor,
    block_view: tuple[int, ...],
) -> QuantizedTensor:
    """A fused kernel's flat outputs (per block, and the payload [n_blocks, block]) as a quantized tensor whose
    block view is ``block_view``."""
    flags = out["flags"]
    block_shape = block_view[:-1]
    return QuantizedTensor(
        scheme=scheme,
        rounding=rounding,
        layout=layout,
        tensor_amax=g,
        global_scale=global_scale,
        global_decode_scale=global_decode_scale,
        block_amax=out["block_amax"].reshape(*block_shape, 1),
        scale_values=out["scales"].reshape(*block_shape, 1),
        decode_scales_blocks=out["decode"].reshape(*block_shape, 1),
        payload_blocks=out["payload"].reshape(block_view),
        zero_rounded_blocks=(flags & 1).sum(dtype=torch.int64),
        saturated_blocks=((flags >> 1) & 1).sum(dtype=torch.int64),
    )


def _tensor_factors(scheme: BlockScheme, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(G, 1/G, torchao's per-tensor divisor) of one quantization, as 0-dim FP32 tensors on g's device."""
    global_scale = _tensor_global_scale(scheme, g).to(g.device)
    global_decode_scale = torch.reciprocal(global_scale)
    per_tensor = torch.ones((), dtype=torch.float32, device=g.device)
    if scheme.scale_rule is ScaleRule.TENSOR_SCALED and scheme.scale_order is ScaleOrder.TORCHAO:
        per_tensor = g / (torch.tensor(float(scheme.target), dtype=torch.float32) * scheme.element.max_finite)
        per_tensor = torch.where(g == 0, torch.ones_like(per_tensor), per_tensor)
    return global_scale, global_decode_scale, per_tensor


def _checked_amax(x: torch.Tensor, name: str, checks: DeferredChecks | None) -> torch.Tensor:
    """max|x| as a 0-dim FP32 tensor from one pass that also checks finiteness (aminmax propagates NaN and Inf):
    deferred into ``checks`` when given, else raised now naming the tensor."""
    zero = torch.zeros((), device=x.device)
    low, high = torch.aminmax(x) if x.numel() else (zero, zero)
    current = torch.maximum(-low, high).abs()  # abs: an all-zero tensor's amax is +0.0, as on the torch path
    nonfinite = f"tensor {name!r} holds non-finite value(s) (Inf/NaN); quantizers need finite input"
    if checks is not None:
        checks.defer(name, ~torch.isfinite(current), nonfinite)
    elif not bool(torch.isfinite(current)):
        formats.check_finite(x, name)
    return current


def _held_reference(tensor_amax: torch.Tensor | float, name: str, checks: DeferredChecks | None) -> torch.Tensor:
    """A given tensor reference as a 0-dim FP32 tensor, checked finite and >= 0 (deferred for device tensors when
    ``checks`` is given)."""
    if isinstance(tensor_amax, torch.Tensor) and checks is not None:
        g = tensor_amax.to(torch.float32).reshape(())
        checks.defer(
            f"{name}.tensor_amax", ~torch.isfinite(g) | (g < 0), f"tensor_amax for {name!r} must be finite and >= 0"
        )
        return g
    g = torch.as_tensor(tensor_amax, dtype=torch.float32).reshape(())
    if not bool(torch.isfinite(g)) or bool(g < 0):
        raise ValueError(f"tensor_amax for {name!r} must be finite and >= 0, got {float(g)!r}")
    return g


# ----- both axes from one read ------------------------------------------------------------------------------


@dataclass(frozen=True)
class AxisQuantization:
    """The per-call settings of one of the two quantizations :func:`quantize_both_axes` computes (the keyword
    arguments of :func:`quantize` that may differ between them)."""

    rounding: Rounding | str = Rounding.RNE
    target: float | None = None
    tensor_amax: torch.Tensor | float | None = None
    stream: philox.RandomStream | None = None
    index: philox.ElementIndex | None = None
    name: str = "x"


def _two_axis_layout(layout: _BlockLayout, x: torch.Tensor) -> bool:
    """Whether the two-axis kernel reads x in place: a 2-D tensor in 1D blocks, both dimensions whole blocks."""
    b = layout.block_size
    return x.ndim == 2 and not layout.two_d and x.shape[0] % b == 0 and x.shape[1] % b == 0


def quantize_both_axes(
    x: torch.Tensor,
    scheme: str | BlockScheme,
    last: AxisQuantization,
    first: AxisQuantization,
    *,
    transposed: bool = False,
    backend: Backend | str = Backend.AUTO,
    checks: DeferredChecks | None = None,
) -> tuple[QuantizedTensor, QuantizedTensor]:
    """A 2-D ``x`` quantized in 1D blocks along both axes: the two results of
    ``quantize(x, scheme, axis=-1, **last)`` and ``quantize(x, scheme, axis=0, **first)`` (or, with
    ``transposed=True``, ``quantize(x.t(), scheme, axis=-1, **first)``: the same blocks as the A operand of a
    backward GEMM), bit for bit, with stochastic roundings drawn in that order.

    On the Triton backend, where x's dimensions are multiples of the block, one kernel reads x once and writes both
    (the second already transposed); elsewhere this is the two calls. FP4 training quantizes X (forward and wgrad
    copies) and dY (dgrad and wgrad copies) this way.
    """
    scheme = get_scheme(scheme)
    backend = Backend(backend)
    if x.ndim != 2:
        raise ValueError(f"quantize_both_axes takes a 2-D tensor; {last.name!r} has shape {tuple(x.shape)}")
    for request in (last, first):
        if request.tensor_amax is not None and not scheme.uses_tensor_amax:
            raise ValueError(
                f"tensor {request.name!r}: scheme {scheme.name!r} ({scheme.scale_rule.value}) has no tensor scale, "
                "so a tensor_amax would be ignored; pass None"
            )
    fused = backend is Backend.TRITON or (backend is Backend.AUTO and x.device.type == "cuda")
    layout = _BlockLayout.of(x, scheme.block_size, -1, False, last.name)
    if not (fused and _two_axis_layout(layout, x) and _triton_reason(x, scheme) is None):
        return (
            quantize(x, scheme, axis=-1, backend=backend, checks=checks, **_call_arguments(last)),
            quantize(
                x.t() if transposed else x,
                scheme,
                axis=-1 if transposed else 0,
                backend=backend,
                checks=checks,
                **_call_arguments(first),
            ),
        )
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        raise TypeError(f"tensor {last.name!r} must be floating point, got {x.dtype}")
    x = x.to(torch.float32)
    current = _checked_amax(x, last.name, checks)
    references = [
        current if r.tensor_amax is None else _held_reference(r.tensor_amax, r.name, checks) for r in (last, first)
    ]
    return _both_axes_kernel(x, scheme, last, references[0], first, references[1], transposed=transposed)


def _call_arguments(request: AxisQuantization) -> dict:
    return {f.name: getattr(request, f.name) for f in dataclasses.fields(request)}


def _both_axes_kernel(
    x: torch.Tensor,
    scheme: BlockScheme,
    last: AxisQuantization | None,
    g_last: torch.Tensor | None,
    first: AxisQuantization | None,
    g_first: torch.Tensor | None,
    *,
    transposed: bool,
) -> tuple[QuantizedTensor | None, QuantizedTensor | None]:
    """The Triton two-axis kernel on a checked 2-D FP32 x with its references; None for an axis not asked for."""
    from ue5m3.numerics.kernels import triton_quantize

    rows, cols = x.shape
    settled = {}
    for side, request, g in (("last", last, g_last), ("first", first, g_first)):
        if request is None:
            settled[side] = None
            continue
        side_scheme = scheme.with_target(request.target) if request.target is not None else scheme
        rounding = Rounding(request.rounding)
        stream = request.stream
        if rounding.random_bit_count and stream is None:
            stream = formats.anonymous_stream(None)
        if side == "last":
            layout = _BlockLayout.of(x, scheme.block_size, -1, False, request.name)
        elif transposed:
            layout = _BlockLayout.of(x.t(), scheme.block_size, -1, False, request.name)
        else:
            layout = _BlockLayout.of(x, scheme.block_size, 0, False, request.name)
        base, strides = (request.index or philox.ElementIndex()).strides(tuple(layout.shape), request.name)
        # the global index of x's element (r, c): layout coordinates (r, c), or (c, r) for the transposed layout
        stride_row, stride_col = (strides[1], strides[0]) if side == "first" and transposed else strides
        factors = _tensor_factors(side_scheme, g)
        settled[side] = (side_scheme, rounding, layout, g, factors)
        settled[side + "_request"] = triton_quantize.AxisRequest(
            *factors,
            rounding=rounding.value,
            stream=stream if rounding.random_bit_count else None,
            base=base,
            stride_row=stride_row,
            stride_col=stride_col,
        )
    s = scheme.scale
    out_last, out_first = triton_quantize.quantize_both_axes(
        x,
        block=scheme.block_size,
        rule=scheme.scale_rule.value,
        order=scheme.scale_order.value,
        scale_max=s.max_finite,
        scale_mantissa_bits=s.mantissa_bits,
        scale_min_exponent=s.min_exponent,
        scale_max_exponent=s.max_exponent,
        zero_scale_repair=scheme.zero_scale_repair,
        last=settled.get("last_request"),
        first=settled.get("first_request"),
    )
    block = scheme.block_size
    results = []
    views = {"last": (out_last, (rows, cols // block, block)), "first": (out_first, (cols, rows // block, block))}
    for side, (out, view) in views.items():
        if settled[side] is None:
            results.append(None)
            continue
        side_scheme, rounding, layout, g, (global_scale, global_decode_scale, _) = settled[side]
        results.append(_from_kernel(out, side_scheme, rounding, layout, g, global_scale, global_decode_scale, view))
    return results[0], results[1]


def fake_quantize(x: torch.Tensor, scheme: str | BlockScheme, **kwargs) -> torch.Tensor:
    """Quantize then dequantize (FP32, shaped like ``x``); keyword arguments as :func:`quantize`."""
    return quantize(x, scheme, **kwargs).dequantize()


# ----- packed storage -----------------------------------------------------------------------------------


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
