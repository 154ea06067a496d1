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
* ``mx_round_log2`` -- the authors' MXFP4 baseline: a tensor scale as above, then the power of two nearest to
  u in the log domain.

Blocks run along any one axis (1D) or are BxB tiles of a 2-D tensor (2D, weights: a tensor and its transpose
quantize to exactly the same values). :func:`quantize` returns a :class:`QuantizedTensor` holding payload,
scale codes, decoded scales, the tensor reference and diagnostics (blocks whose scale rounded to zero,
blocks that saturated the scale format).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum

import torch

from ue5m3.numerics import formats
from ue5m3.numerics.backend import Backend
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
    "quantize",
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
    MX_ROUND_LOG2 = "mx_round_log2"


class DequantizeOrder(StrEnum):
    """FP32 order of dequantization (they differ in the last bit for about a sixth of elements)."""

    DECODE_SCALE = "decode_scale"  # payload * S with S = scale * (1/G): the paper's UE5M3 quantizer
    TE_AMAX = "te_amax"  # ((payload * scale) * g) / (T * F): how Transformer Engine's NVFP4 tests dequantize


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
    dequantize_order: DequantizeOrder = DequantizeOrder.DECODE_SCALE

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


SCHEMES: dict[str, BlockScheme] = {
    "ue5m3_b16": BlockScheme(name="ue5m3_b16", scale=UE5M3, block_size=16, target=448.0, zero_scale_repair=True),
    "ue5m3_b32": BlockScheme(name="ue5m3_b32", scale=UE5M3, block_size=32, target=448.0, zero_scale_repair=True),
    "nvfp4": BlockScheme(
        name="nvfp4", scale=E4M3, block_size=16, target=448.0, dequantize_order=DequantizeOrder.TE_AMAX
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
    """Maps a tensor to a block view (..., n_blocks, block) and back."""

    shape: torch.Size
    axis: int
    block_size: int
    two_d: bool

    @classmethod
    def of(cls, x: torch.Tensor, block_size: int, axis: int, two_d: bool, name: str) -> _BlockLayout:
        if x.ndim == 0:
            raise ValueError(f"tensor {name!r} is a scalar; block quantization needs at least one axis")
        if two_d:
            if x.ndim != 2:
                raise ValueError(f"2D tiles need a 2-D tensor; {name!r} has shape {tuple(x.shape)}")
            if x.shape[0] % block_size or x.shape[1] % block_size:
                raise ValueError(
                    f"tensor {name!r} of shape {tuple(x.shape)} does not tile into {block_size}x{block_size}"
                )
            return cls(x.shape, -1, block_size, True)
        if not -x.ndim <= axis < x.ndim:
            raise ValueError(f"axis {axis!r} out of range for {name!r} of shape {tuple(x.shape)}")
        axis = axis % x.ndim
        if x.shape[axis] % block_size:
            raise ValueError(
                f"tensor {name!r} has {x.shape[axis]} elements along axis {axis}, not a multiple of the "
                f"block size {block_size}; pad it first"
            )
        return cls(x.shape, axis, block_size, False)

    def to_blocks(self, t: torch.Tensor) -> torch.Tensor:
        b = self.block_size
        if self.two_d:
            rows, cols = self.shape
            # (R, C) -> (R/B, B, C/B, B) -> (R/B, C/B, B, B) -> (R/B, C/B, B*B)
            return t.reshape(rows // b, b, cols // b, b).permute(0, 2, 1, 3).reshape(rows // b, cols // b, b * b)
        moved = t.movedim(self.axis, -1)
        # (..., n) -> (..., n/B, B)
        return moved.reshape(*moved.shape[:-1], moved.shape[-1] // b, b)

    def from_blocks(self, t: torch.Tensor) -> torch.Tensor:
        b = self.block_size
        if self.two_d:
            rows, cols = self.shape
            # (R/B, C/B, B*B) -> (R/B, C/B, B, B) -> (R/B, B, C/B, B) -> (R, C)
            return t.reshape(rows // b, cols // b, b, b).permute(0, 2, 1, 3).reshape(rows, cols)
        # (..., n/B, B) -> (..., n) -> original axis order
        return t.reshape(*t.shape[:-2], -1).movedim(-1, self.axis)

    def scales_from_blocks(self, t: torch.Tensor) -> torch.Tensor:
        """(..., n/B, 1) block values -> x's shape with the blocked axis (axes) divided by B."""
        if self.two_d:
            return t.squeeze(-1)
        return t.squeeze(-1).movedim(-1, self.axis)


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
        """FP32 values payload * S (or TE's (payload * s) * amax/(T*F) for NVFP4), shaped like the input."""
        scheme = self.scheme
        if scheme.dequantize_order is DequantizeOrder.TE_AMAX and scheme.scale_rule is ScaleRule.TENSOR_SCALED:
            target_f = torch.tensor(float(scheme.target), dtype=torch.float32) * scheme.element.max_finite
            # left to right in FP32, as TE's tests write it: payload * s * amax / (T * F)
            return self.layout.from_blocks(self.payload_blocks * self.scale_values * self.tensor_amax / target_f)
        return self.layout.from_blocks(self.payload_blocks * self.decode_scales_blocks)

    def encoded(self) -> torch.Tensor:
        """payload * scale value, shaped like the input: exact in BF16 (at most 6 significant bits)."""
        return self.layout.from_blocks(self.payload_blocks * self.scale_values)

    def packed(self) -> torch.Tensor:
        """Payload codes packed two per byte along the last axis (element 2i in the low nibble)."""
        return pack_fp4(self.payload_codes)

    def diagnostics(self) -> dict[str, float | int]:
        return {
            "tensor_amax": float(self.tensor_amax),
            "zero_rounded_blocks": int(self.zero_rounded_blocks),
            "saturated_blocks": int(self.saturated_blocks),
            "blocks": int(self.scale_values.numel()),
        }


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
    return torch.ldexp(torch.ones(exponent.shape, dtype=torch.float32), exponent.to(torch.int32))


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


def _kernel_reason(x: torch.Tensor, scheme: BlockScheme) -> str | None:
    """Why the C kernel cannot take this case (None if it can)."""
    if x.device.type != "cpu":
        return f"tensor on {x.device.type}"
    if scheme.element != E2M1:
        return f"element format {scheme.element.name!r} (kernel is E2M1 only)"
    if scheme.scale_rule is ScaleRule.MX_ROUND_LOG2:
        return "scale rule 'mx_round_log2'"
    s = scheme.scale
    if scheme.scale_rule is ScaleRule.TENSOR_SCALED and not (
        s.has_zero and s.min_exponent - s.mantissa_bits >= -126 and s.max_exponent <= 127
    ):
        return f"scale format {s.name!r} outside the kernel's FP32-normal quanta"
    from ue5m3.numerics.kernels import cpu as cpu_kernel

    if not cpu_kernel.available():
        return "no C compiler to build the kernel"
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
    name: str = "x",
    backend: Backend | str = Backend.AUTO,
) -> QuantizedTensor:
    """Block-quantize ``x`` (computed in FP32) under ``scheme``.

    Args:
        x: finite tensor; the blocked axis length must be a multiple of the block size.
        scheme: a name in :data:`SCHEMES` or a :class:`BlockScheme`.
        tensor_amax: tensor reference g (e.g. a held, possibly stale, amax); defaults to max|x| now.
        target: overrides the scheme's target T.
        rounding: payload rounding (scales are always RNE).
        two_d: BxB tiles of a 2-D tensor instead of 1D blocks along ``axis``.
        axis: the blocked axis (the GEMM reduction dimension) for 1D blocks.
        random_bits: per-element random integers for stochastic rounding, shaped like ``x``.
        generator: draws ``random_bits`` when they are not given.
        name: tensor name for error messages.
        backend: see :class:`Backend`; results do not depend on it.

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
    x = x.to(torch.float32)
    layout = _BlockLayout.of(x, scheme.block_size, axis, two_d, name)
    bits = formats.check_random_bits(x, rounding, random_bits, generator)
    reason = None if backend is Backend.TORCH else _kernel_reason(x, scheme)
    if backend is Backend.CPU_KERNEL and reason is not None:
        raise ValueError(f"backend='cpu_kernel' cannot quantize {name!r}: {reason}; use backend='torch' or 'auto'")
    use_kernel = backend is not Backend.TORCH and reason is None
    if use_kernel or tensor_amax is not None:
        # One pass for finiteness (and the current amax): aminmax propagates NaN and Inf.
        low, high = torch.aminmax(x) if x.numel() else (torch.zeros(()), torch.zeros(()))
        current = torch.maximum(-low, high).abs()  # abs: an all-zero tensor's amax is +0.0, as on the torch path
        if not bool(torch.isfinite(current)):
            formats.check_finite(x, name)
    if tensor_amax is None:
        g = current if use_kernel else None
    else:
        g = torch.as_tensor(tensor_amax, dtype=torch.float32).reshape(())
        if not bool(torch.isfinite(g)) or bool(g < 0):
            raise ValueError(f"tensor_amax for {name!r} must be finite and >= 0, got {float(g)!r}")
    blocks = layout.to_blocks(x)
    if use_kernel:
        return _quantize_kernel(blocks, g, layout, scheme, rounding, bits)
    block_amax = torch.amax(blocks.abs(), dim=-1, keepdim=True)  # NaN propagates into the check below
    if tensor_amax is None:
        if not bool(torch.isfinite(block_amax).all()):
            formats.check_finite(x, name)
        g = block_amax.max() if block_amax.numel() else torch.zeros((), dtype=torch.float32)
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
) -> QuantizedTensor:
    from ue5m3.numerics.kernels import cpu as cpu_kernel

    global_scale = _tensor_global_scale(scheme, g)
    global_decode_scale = torch.reciprocal(global_scale)
    per_tensor = torch.ones((), dtype=torch.float32)
    if scheme.scale_rule is ScaleRule.TENSOR_SCALED and scheme.scale_order is ScaleOrder.TORCHAO:
        per_tensor = g / (torch.tensor(float(scheme.target), dtype=torch.float32) * scheme.element.max_finite)
        per_tensor = torch.where(g == 0, torch.ones_like(per_tensor), per_tensor)
    block_shape = blocks.shape[:-1]
    # (..., n_blocks, L) -> (N, L): a view for 1D blocks along the last axis, a copy otherwise
    flat = blocks.reshape(-1, blocks.shape[-1])
    flat_bits = layout.to_blocks(bits).reshape(flat.shape) if bits is not None else None
    out = cpu_kernel.quantize_blocks(
        flat,
        rule=scheme.scale_rule.value,
        order=scheme.scale_order.value,
        global_scale=float(global_scale),
        global_decode_scale=float(global_decode_scale),
        per_tensor=float(per_tensor),
        scale_max=scheme.scale.max_finite,
        scale_mantissa_bits=scheme.scale.mantissa_bits,
        scale_min_exponent=scheme.scale.min_exponent,
        scale_max_exponent=scheme.scale.max_exponent,
        zero_scale_repair=scheme.zero_scale_repair,
        rounding=rounding.value,
        random_bits=flat_bits,
    )
    flags = out["flags"]
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
        payload_blocks=out["payload"].reshape(blocks.shape),
        zero_rounded_blocks=(flags & 1).sum(dtype=torch.int64),
        saturated_blocks=((flags >> 1) & 1).sum(dtype=torch.int64),
    )


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
