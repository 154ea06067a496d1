"""Small floating-point formats as data, and exact rounding onto them.

A format is a frozen :class:`FloatFormat` holding only spec-level fields (bit widths, bias, signedness,
subnormal support and how many of the highest codes are reserved for Inf/NaN). Everything else -- max finite,
min normal, min subnormal, the list of finite values -- is derived. Block formats compose an element format,
a block size and a scale format (see :mod:`ue5m3.numerics.schemes`).

Rounding follows numerics spec section 2: work in FP32 (FP64 for FP64 inputs), take e = floor(log2 |x|)
clamped at the minimum normal exponent, scale |x| onto the integer grid s = |x| / 2^(e - mantissa_bits) (exact,
a power-of-two scaling), decide between floor(s) and floor(s) + 1, saturate at the max finite value. Five modes:

* ``rne``  round to nearest, ties to even;
* ``rtz``  round toward zero;
* ``sf``   "StochasticFast", the paper's 8-bit-midpoint stochastic rounding: r uniform in {0..255}, round away
  iff delta + (2r + 1)/512 >= 1 with the sum formed by one addition in the working precision, as the paper's
  kernel does (MrHuff/ue5m3-fp4 ``backends/triton/_rounding.py``): P(up) is delta rounded to the nearest 1/256,
  except that near the threshold the rounded sum can reach 1 where exact arithmetic would not;
* ``sr_te`` Transformer Engine's software SR with 8 random bits (``stochastic_round_fp4_e2m1`` in TE's
  ``common/util/ptx.cuh``): t = fma(r/256, step(|x|), |x|) as one fused multiply-add, then t floored onto the
  grid in units of step(t); P(up) = floor(256 delta)/256 up to the fma's rounding;
* ``sr``   full-precision Bernoulli SR: 53 random bits, P(up) = delta (exactly whenever delta is a multiple of
  2^-53, which holds for every input whose quantum is at least 2^-53 of its grid spacing).

Random bits are either passed explicitly (``random_bits``, one integer per element, for bit-exact tests) or drawn
from Philox4x32-10 (:mod:`ue5m3.numerics.philox`) keyed by a :class:`~ue5m3.numerics.philox.RandomStream` and the
elements' global indices; without a stream, a fresh one is seeded from a ``torch.Generator``. Nothing here holds
hidden state.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction

import torch

from ue5m3.numerics import philox

__all__ = [
    "FloatFormat",
    "Rounding",
    "E2M1",
    "E2M3",
    "E3M2",
    "E4M3",
    "E5M2",
    "UE5M3",
    "UE5M3_ALL_FINITE",
    "UE5M3_ALTO",
    "UE8M0",
    "FORMATS",
    "get",
    "round",
    "round_to_format",
    "encode",
    "decode",
    "codes_of_values",
    "e2m1_codes",
    "random_bits_for",
    "check_random_bits",
    "anonymous_stream",
    "fma_fp32",
    "round_magnitude",
]


class Rounding(StrEnum):
    """Rounding modes, one spelling each."""

    RNE = "rne"
    RTZ = "rtz"
    SF = "sf"
    SR_TE = "sr_te"
    SR = "sr"

    @property
    def random_bit_count(self) -> int:
        """Random bits consumed per element (0 for deterministic modes)."""
        return {"rne": 0, "rtz": 0, "sf": 8, "sr_te": 8, "sr": 53}[self.value]


@dataclass(frozen=True, kw_only=True)
class FloatFormat:
    """A small binary floating-point format described by its spec-level fields.

    Attributes:
        name: canonical name, e.g. ``"e2m1"``.
        exponent_bits: width of the exponent field.
        mantissa_bits: width of the fraction field.
        bias: exponent bias.
        signed: whether the top bit is a sign bit.
        subnormals: whether exponent field 0 encodes zero and subnormals. Without subnormals (UE8M0) field 0 is
            an ordinary binade and the format has no zero.
        reserved_top_codes: how many of the highest magnitude codes are not finite (Inf/NaN). E4M3FN: 1
            (S.1111.111), E5M2: 4 (IEEE exponent all ones), paper UE5M3: 8 (exponent field 31), UE8M0: 1.
        has_infinity: whether one reserved code is an infinity (documentation only: rounding saturates).
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    signed: bool
    subnormals: bool = True
    reserved_top_codes: int = 0
    has_infinity: bool = False

    def __post_init__(self) -> None:
        if self.exponent_bits < 1 or self.mantissa_bits < 0:
            raise ValueError(f"format {self.name!r}: exponent_bits must be >= 1 and mantissa_bits >= 0")
        if self.bits > 16:
            raise ValueError(f"format {self.name!r}: at most 16 bits are supported, got {self.bits}")
        if not 0 <= self.reserved_top_codes < self.magnitude_code_count:
            raise ValueError(
                f"format {self.name!r}: reserved_top_codes={self.reserved_top_codes!r} must leave finite codes"
            )
        if self.has_infinity and self.reserved_top_codes == 0:
            raise ValueError(f"format {self.name!r}: an infinity needs a reserved code")

    # ----- derived facts -------------------------------------------------------------------------------
    @property
    def bits(self) -> int:
        return int(self.signed) + self.exponent_bits + self.mantissa_bits

    @property
    def magnitude_code_count(self) -> int:
        return 1 << (self.exponent_bits + self.mantissa_bits)

    @property
    def max_magnitude_code(self) -> int:
        """Largest magnitude code that is finite."""
        return self.magnitude_code_count - 1 - self.reserved_top_codes

    @property
    def min_exponent(self) -> int:
        """Exponent of the smallest normal binade (also the exponent subnormals share)."""
        return 1 - self.bias if self.subnormals else -self.bias

    @functools.cached_property
    def max_finite(self) -> float:
        # cached: the quantizers and the GEMM read it per call, and its exact decode builds Fractions
        return _decode_magnitude(self, self.max_magnitude_code)

    @property
    def max_exponent(self) -> int:
        return math.frexp(self.max_finite)[1] - 1

    @property
    def min_normal(self) -> float:
        return math.ldexp(1.0, self.min_exponent)

    @property
    def min_subnormal(self) -> float | None:
        """Smallest positive subnormal, or None for formats without subnormals (UE8M0)."""
        if not self.subnormals or self.mantissa_bits == 0:
            return None
        return math.ldexp(1.0, self.min_exponent - self.mantissa_bits)

    @property
    def min_positive(self) -> float:
        return self.min_subnormal if self.min_subnormal is not None else self.min_normal

    @property
    def has_zero(self) -> bool:
        return self.subnormals

    @property
    def positive_finite_count(self) -> int:
        """Number of codes holding a finite value > 0."""
        return self.max_magnitude_code + 1 - int(self.has_zero)

    def finite_codes(self) -> torch.Tensor:
        """Every code (int64) whose value is finite, in code order (both signs for signed formats)."""
        magnitudes = torch.arange(self.max_magnitude_code + 1, dtype=torch.int64)
        if not self.signed:
            return magnitudes
        return torch.cat([magnitudes, magnitudes | self._sign_bit])

    def finite_values(self) -> torch.Tensor:
        """Distinct finite values, ascending, as float64 (zero once)."""
        return torch.unique(decode(self.finite_codes(), self, dtype=torch.float64))

    def exact_value(self, code: int) -> Fraction:
        """Exact rational value of one code, independent of the tensor path (test oracle)."""
        magnitude = code & (self._sign_bit - 1) if self.signed else code
        if not 0 <= code < (1 << self.bits) or magnitude > self.max_magnitude_code:
            raise ValueError(f"code {code!r} of {self.name} is not finite")
        exponent_field, fraction = divmod(magnitude, 1 << self.mantissa_bits)
        if self.subnormals and exponent_field == 0:
            value = Fraction(fraction, 1 << self.mantissa_bits) * Fraction(2) ** self.min_exponent
        else:
            significand = 1 + Fraction(fraction, 1 << self.mantissa_bits)
            value = significand * Fraction(2) ** (exponent_field - self.bias)
        return -value if self.signed and code & self._sign_bit else value

    @property
    def _sign_bit(self) -> int:
        return 1 << (self.bits - 1)


def _decode_magnitude(fmt: FloatFormat, magnitude: int) -> float:
    return float(fmt.exact_value(magnitude))


E2M1 = FloatFormat(name="e2m1", exponent_bits=2, mantissa_bits=1, bias=1, signed=True)
E2M3 = FloatFormat(name="e2m3", exponent_bits=2, mantissa_bits=3, bias=1, signed=True)
E3M2 = FloatFormat(name="e3m2", exponent_bits=3, mantissa_bits=2, bias=3, signed=True)
E4M3 = FloatFormat(name="e4m3", exponent_bits=4, mantissa_bits=3, bias=7, signed=True, reserved_top_codes=1)
E5M2 = FloatFormat(
    name="e5m2",
    exponent_bits=5,
    mantissa_bits=2,
    bias=15,
    signed=True,
    reserved_top_codes=4,
    has_infinity=True,
)
# The paper's UE5M3: exponent field 31 (codes 0xF8-0xFF) reserved, max 61,440.
UE5M3 = FloatFormat(name="ue5m3", exponent_bits=5, mantissa_bits=3, bias=15, signed=False, reserved_top_codes=8)
# The same bits under the two other published top-code conventions (numerics spec section 1).
UE5M3_ALL_FINITE = FloatFormat(name="ue5m3_all_finite", exponent_bits=5, mantissa_bits=3, bias=15, signed=False)
UE5M3_ALTO = FloatFormat(
    name="ue5m3_alto", exponent_bits=5, mantissa_bits=3, bias=15, signed=False, reserved_top_codes=1
)
UE8M0 = FloatFormat(
    name="ue8m0",
    exponent_bits=8,
    mantissa_bits=0,
    bias=127,
    signed=False,
    subnormals=False,
    reserved_top_codes=1,
)

FORMATS: dict[str, FloatFormat] = {
    f.name: f for f in (E2M1, E2M3, E3M2, E4M3, E5M2, UE5M3, UE5M3_ALL_FINITE, UE5M3_ALTO, UE8M0)
}


def get(name: str | FloatFormat) -> FloatFormat:
    """Look up a format by name (case-insensitive), or pass a descriptor through.

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    if isinstance(name, FloatFormat):
        return name
    if not isinstance(name, str):
        raise TypeError(f"format must be a name or FloatFormat, got {type(name).__name__}")
    try:
        return FORMATS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown format {name!r}; known formats: {sorted(FORMATS)}") from None


# ----- rounding -----------------------------------------------------------------------------------------


def _work_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def check_finite(x: torch.Tensor, name: str) -> None:
    """Raise a ValueError naming the tensor if it holds Inf or NaN."""
    if not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).sum())
        raise ValueError(f"tensor {name!r} holds {bad} non-finite value(s) (Inf/NaN); quantizers need finite input")


def random_bits_for(
    shape: torch.Size | tuple[int, ...],
    mode: Rounding | str,
    generator: torch.Generator | None = None,
    *,
    stream: philox.RandomStream | None = None,
    index: philox.ElementIndex | None = None,
) -> torch.Tensor | None:
    """The random integers a stochastic mode consumes (None for deterministic modes): Philox bits of ``stream``
    (a fresh stream seeded from ``generator`` when None) at the elements' global indices."""
    count = Rounding(mode).random_bit_count
    if count == 0:
        return None
    if stream is None:
        stream = anonymous_stream(generator)
    return philox.random_bits(stream, tuple(shape), count, index=index)


def anonymous_stream(generator: torch.Generator | None = None) -> philox.RandomStream:
    """A fresh random stream for one rounding outside a run: its seed is 63 bits drawn from ``generator``."""
    seed = int(torch.randint(0, 1 << 62, (), generator=generator, dtype=torch.int64))
    return philox.RandomStream(seed=seed, role="anonymous")


def _round_up_mask(
    delta: torch.Tensor, lower_code_odd: torch.Tensor, mode: Rounding, random_bits: torch.Tensor | None
) -> torch.Tensor:
    """Where to round away from zero, given delta = s - floor(s) in [0, 1) and the parity of the lower code
    (``sr_te`` is not a threshold on delta; see :func:`_round_sr_te`)."""
    if mode is Rounding.RNE:
        return (delta > 0.5) | ((delta == 0.5) & lower_code_odd)
    if mode is Rounding.RTZ:
        return torch.zeros_like(delta, dtype=torch.bool)
    assert random_bits is not None
    if mode is Rounding.SF:
        # One addition in the working precision, as the paper's kernel: (2r+1)/512 is exact, the sum rounds.
        midpoint = (2 * random_bits + 1).to(delta.dtype) * 2.0**-9
        return (delta + midpoint) >= 1.0
    if mode is Rounding.SR:
        # Bernoulli(delta) with 53 random bits: up iff r < delta * 2^53 (both exact in FP64).
        r = random_bits.to(torch.float64)
        return r < torch.ldexp(delta.to(torch.float64), torch.tensor(53, dtype=torch.int32))
    raise AssertionError(mode)


def fma_fp32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Fused multiply-add a * b + c of FP32 tensors with one rounding (RNE), as C's ``fmaf`` and CUDA's fma.

    The product of two FP32 values is exact in FP64; the FP64 sum and its TwoSum error are then rounded to FP32
    with round-to-odd first, so no double rounding occurs (exact away from FP64 underflow and FP32 overflow).
    """
    product = a.to(torch.float64) * b.to(torch.float64)
    c64 = c.to(torch.float64)
    total = product + c64
    virtual = total - product
    error = (product - (total - virtual)) + (c64 - virtual)
    bits = total.view(torch.int64)
    toward = torch.where(error > 0, torch.full_like(total, math.inf), torch.full_like(total, -math.inf))
    sticky = torch.where((error != 0) & ((bits & 1) == 0), torch.nextafter(total, toward), total)
    return sticky.to(torch.float32)


def _quantum_exponent(m: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """Exponent of the grid spacing of ``fmt`` at magnitude m: max(floor(log2 m), min exponent) - fraction bits."""
    _, exponent = torch.frexp(m)  # m = f * 2^exponent with f in [0.5, 1): floor(log2 m) = exponent - 1
    exponent = torch.where(m == 0, fmt.min_exponent + 1, exponent)  # zero: frexp gives 0; it is below every binade
    return torch.clamp(exponent - 1, min=fmt.min_exponent) - fmt.mantissa_bits


def _round_sr_te(m: torch.Tensor, fmt: FloatFormat, random_bits: torch.Tensor) -> torch.Tensor:
    """Transformer Engine's software SR: t = fma(r/256, step(m), m) in the working precision, then floor(t) in
    units of step(t), capped at the max finite value (for E2M1 exactly TE's ``stochastic_round_fp4_e2m1``)."""
    step = torch.ldexp(torch.ones_like(m), _quantum_exponent(m, fmt))
    u = random_bits.to(m.dtype) * (1.0 / 256.0)  # exact: 8-bit integers over a power of two
    if m.dtype == torch.float64:
        t = u * step + m  # the product is exact (8 bits times a power of two): one rounding, as an fma
    else:
        t = fma_fp32(u, step, m)
    quantum_t = _quantum_exponent(t, fmt)
    value = torch.ldexp(torch.floor(torch.ldexp(t, -quantum_t)), quantum_t)
    return torch.clamp(value, max=fmt.max_finite)


def check_random_bits(
    x: torch.Tensor, mode: Rounding, random_bits: torch.Tensor | None, generator: torch.Generator | None
) -> torch.Tensor | None:
    """The random bits of one stochastic rounding of ``x``: ``random_bits`` checked (shape, integer dtype, range)
    or, when None, drawn from ``generator``; None for deterministic modes (which refuse explicit bits)."""
    count = mode.random_bit_count
    if count == 0:
        if random_bits is not None:
            raise ValueError(f"rounding {mode.value!r} is deterministic; random_bits must be None")
        return None
    if random_bits is None:
        return random_bits_for(x.shape, mode, generator)
    if random_bits.shape != x.shape:
        raise ValueError(f"random_bits shape {tuple(random_bits.shape)} must equal input shape {tuple(x.shape)}")
    if random_bits.dtype.is_floating_point or random_bits.dtype == torch.bool:
        raise TypeError(f"random_bits must be an integer tensor, got {random_bits.dtype}")
    if random_bits.numel() and (int(random_bits.min()) < 0 or int(random_bits.max()) >= (1 << count)):
        raise ValueError(f"random_bits for rounding {mode.value!r} must lie in [0, 2**{count})")
    return random_bits


def round_magnitude(
    m: torch.Tensor, fmt: FloatFormat, mode: Rounding, random_bits: torch.Tensor | None
) -> torch.Tensor:
    """Round non-negative finite magnitudes onto ``fmt``, saturated at its max finite value."""
    # Saturation after rounding equals clamping before it: rounding is monotone and max_finite is on the grid.
    m = torch.clamp(m, max=fmt.max_finite)
    if mode is Rounding.SR_TE:
        value = _round_sr_te(m, fmt, random_bits)
    else:
        quantum_exponent = _quantum_exponent(m, fmt)
        s = torch.ldexp(m, -quantum_exponent)  # exact: a power-of-two scaling into [0, 2^(mantissa_bits + 1))
        lower = torch.floor(s)
        delta = s - lower  # exact
        if fmt.mantissa_bits:
            odd = torch.remainder(lower, 2) == 1  # the integer significand's last bit is the code's last bit
        else:
            odd = torch.remainder(quantum_exponent + fmt.bias, 2) == 1  # no fraction bits: the code is the exponent
        up = _round_up_mask(delta, odd, mode, random_bits)
        value = torch.ldexp(lower + up.to(lower.dtype), quantum_exponent)
    if not fmt.has_zero:
        value = torch.clamp(value, min=fmt.min_positive)
    # Rounding up can carry past max_finite only onto a reserved code; saturate.
    return torch.clamp(value, max=fmt.max_finite)


def round_to_format(
    x: torch.Tensor,
    fmt: FloatFormat | str,
    mode: Rounding | str = Rounding.RNE,
    *,
    random_bits: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    name: str = "x",
) -> torch.Tensor:
    """Round every element of ``x`` to the nearest representable value of ``fmt`` under ``mode``.

    Args:
        x: finite tensor; computed in FP32 (FP64 if ``x`` is FP64); the result has the working dtype.
        fmt: format descriptor or name.
        mode: one of :class:`Rounding`.
        random_bits: integers in [0, 2^k) with k = ``Rounding(mode).random_bit_count``, same shape as ``x``
            (stochastic modes only; drawn from ``generator`` when omitted; zero elements consume one too).
        generator: torch.Generator used when ``random_bits`` is None.
        name: tensor name used in error messages.

    Returns:
        Rounded values, saturated at +-max finite; the sign of zero is kept (E2M1 of -0.25 is -0.0).

    Raises:
        ValueError: non-finite input, negative input to an unsigned format, bad ``random_bits``.
    """
    fmt = get(fmt)
    mode = Rounding(mode)
    x = x.to(_work_dtype(x))
    check_finite(x, name)
    if not fmt.signed and bool((x < 0).any()):
        raise ValueError(f"tensor {name!r} has negative values but format {fmt.name!r} is unsigned")
    bits = check_random_bits(x, mode, random_bits, generator)
    value = round_magnitude(x.abs(), fmt, mode, bits)
    return torch.copysign(value, x) if fmt.signed else value


def round(  # noqa: A001 - the spec's public name: ue5m3.numerics.formats.round
    x: torch.Tensor,
    name: FloatFormat | str,
    mode: Rounding | str = "rne",
    random_bits: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Alias of :func:`round_to_format` with the argument names of the public API."""
    return round_to_format(x, name, mode, random_bits=random_bits, generator=generator)


# ----- codes --------------------------------------------------------------------------------------------


def encode(
    x: torch.Tensor,
    fmt: FloatFormat | str,
    mode: Rounding | str = Rounding.RNE,
    *,
    random_bits: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    name: str = "x",
) -> torch.Tensor:
    """Round ``x`` onto ``fmt`` and return the integer codes (int64; sign in the top bit for signed formats)."""
    fmt = get(fmt)
    rounded = round_to_format(x, fmt, mode, random_bits=random_bits, generator=generator, name=name)
    return codes_of_values(rounded, fmt)


# E2M1's magnitude code of each 2|v| (integers 0..12 for its values 0, 0.5, ..., 6; other entries unused)
_E2M1_CODE_OF_TWICE = (0, 1, 2, 3, 4, 0, 5, 0, 6, 0, 0, 0, 7)


def e2m1_codes(values: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8, sign in bit 3) of values that are already E2M1 values: one table lookup on 2|v|, a
    quarter of :func:`codes_of_values`'s time on FP4 payloads (what every packed operand pays)."""
    table = torch.tensor(_E2M1_CODE_OF_TWICE, dtype=torch.uint8, device=values.device)
    twice = (values.abs() * 2).to(torch.int32)
    magnitude = table.index_select(0, twice.reshape(-1)).view(values.shape)
    return magnitude | (torch.signbit(values).view(torch.uint8) << 3)


def codes_of_values(values: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """Codes of values that are already representable in ``fmt`` (int64)."""
    if fmt == E2M1:
        return e2m1_codes(values).to(torch.int64)
    m = values.abs()
    _, exponent = torch.frexp(m)
    e = torch.clamp(exponent - 1, min=fmt.min_exponent)
    s = torch.ldexp(m, fmt.mantissa_bits - e).to(torch.int64)  # integer significand on the grid
    if fmt.subnormals:
        # normal: s in [2^mb, 2^(mb+1)) and field = e - min_exponent + 1; subnormal: s < 2^mb, field 0.
        field = torch.where(s >= (1 << fmt.mantissa_bits), e - fmt.min_exponent + 1, torch.zeros_like(e))
    else:
        field = e + fmt.bias
    magnitude = (field.to(torch.int64) << fmt.mantissa_bits) | (s & ((1 << fmt.mantissa_bits) - 1))
    if fmt.signed:
        magnitude = magnitude | torch.where(torch.signbit(values), fmt._sign_bit, 0)
    return magnitude


def decode(codes: torch.Tensor, fmt: FloatFormat | str, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Values of integer codes. Raises ValueError for codes that are not finite in ``fmt``."""
    fmt = get(fmt)
    if codes.dtype.is_floating_point:
        raise TypeError(f"codes must be an integer tensor, got {codes.dtype}")
    codes = codes.to(torch.int64)
    if fmt.signed:
        magnitude, negative = codes & (fmt._sign_bit - 1), (codes & fmt._sign_bit) != 0
    else:
        magnitude, negative = codes, None
    if codes.numel() and (
        int(codes.min()) < 0 or int(codes.max()) >= (1 << fmt.bits) or int(magnitude.max()) > fmt.max_magnitude_code
    ):
        raise ValueError(
            f"codes outside the finite range of {fmt.name!r} (max magnitude code {fmt.max_magnitude_code})"
        )
    field = magnitude >> fmt.mantissa_bits
    fraction = (magnitude & ((1 << fmt.mantissa_bits) - 1)).to(torch.float64)
    if fmt.subnormals:
        significand = torch.where(field == 0, fraction, fraction + (1 << fmt.mantissa_bits))
        exponent = torch.clamp(field - fmt.bias, min=fmt.min_exponent) - fmt.mantissa_bits
    else:
        significand = fraction + (1 << fmt.mantissa_bits)
        exponent = field - fmt.bias - fmt.mantissa_bits
    value = torch.ldexp(significand, exponent.to(torch.int32))
    if negative is not None:
        value = torch.where(negative, -value, value)
    return value.to(dtype)
