"""Block schemes as data: element format, block size, scale format and the name of the scale rule.

A :class:`BlockScheme` composes an element format (E2M1), a block size, a scale format and a rule for the block
scale (numerics spec section 3). The rule is named here and computed in :mod:`ue5m3.numerics.scale_rules`, one plain
function per name; a scheme holds no code, so it can be written in a config, compared and recorded with a result.

* ``tensor_scaled`` -- the paper's UE5M3 quantizer (spec 3.1) and NVIDIA's NVFP4 as Transformer Engine computes it
  (spec 3.2): a tensor scale G = (T * F) / g from target T, element max F and tensor reference g, then each block
  scale rounded onto the scale format. ``scale_order`` selects TE's older FP32 order or torchao's for comparisons.
  UE5M3 repairs scales that round to zero to 1.0 (``zero_scale_repair``); TE does not.
* ``mx_floor`` -- OCP MXFP4 (spec 3.3): scale 2^(floor(log2 a_B) - 2) read from exponent bits, no tensor scale.
* ``mx_ceil`` -- the alternative 2^(ceil(log2 a_B) - 2) (torchao's CEIL mode).
* ``mx_rceil`` -- 2^ceil(log2(a_B * (1/6))), the exponent of the FP32 product rounded up from its bits
  (torchao's RCEIL, Transformer Engine's ``float_to_e8m0`` and Blackwell's ``cvt.rp.satfinite.ue8m0x2.f32``).
* ``mx_round_log2`` -- the authors' MXFP4 baseline: a tensor scale as above, then the power of two nearest to
  u in the log domain.
* ``four_over_six`` -- "Four Over Six" (4/6; mit-han-lab/fouroversix, Transformer Engine's ``nvfp4_4over6``): each
  block's tensor-scaled scale is computed twice, mapping its amax to 6 and to 4 (the first times 1.5), and the
  candidate whose RNE payload has the lower block error (``selection``: MAE, MSE or the maximum absolute error)
  is kept, 6 on ties. The tensor scale's target is 256 in place of 448 so that 1.5 times any E4M3 scale stays
  finite. Nothing in the rule needs E4M3: ``ue5m3_b16_4over6_*`` makes the same choice over UE5M3 scales.

Dequantization follows each scheme's reference implementation bit for bit (:class:`DequantizeOrder`): the paper's
kernel for UE5M3, Transformer Engine's dequantize kernel for NVFP4 (finite for every finite input), OCP/torchao
for MXFP4. :data:`SCHEMES` names the schemes the recipes use; :func:`get_scheme` looks one up.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum

from ue5m3.numerics.formats import E2M1, E4M3, UE5M3, UE5M3_ALL_FINITE, UE5M3_ALTO, UE8M0, FloatFormat

__all__ = ["ScaleRule", "ScaleOrder", "Selection", "DequantizeOrder", "BlockScheme", "SCHEMES", "get_scheme"]


class ScaleRule(StrEnum):
    """How a block scale is derived from the block (see :mod:`ue5m3.numerics.scale_rules` for each function)."""

    TENSOR_SCALED = "tensor_scaled"
    MX_FLOOR = "mx_floor"
    MX_CEIL = "mx_ceil"
    MX_RCEIL = "mx_rceil"
    MX_ROUND_LOG2 = "mx_round_log2"
    FOUR_OVER_SIX = "four_over_six"


# the rules whose block scales depend on a tensor reference g (through G = (T * F) / g); the others read only blocks
_TENSOR_REFERENCED = (ScaleRule.TENSOR_SCALED, ScaleRule.MX_ROUND_LOG2, ScaleRule.FOUR_OVER_SIX)
# the rules that round onto the scheme's scale format (the MX rules make powers of two)
_FORMAT_ROUNDED = (ScaleRule.TENSOR_SCALED, ScaleRule.FOUR_OVER_SIX)


class Selection(StrEnum):
    """The block error by which 4/6 chooses between its two candidate scales (fouroversix's scale rules)."""

    MAE = "mae"  # sum of |dequantized - x| over the block (Transformer Engine's default)
    MSE = "mse"  # sum of (dequantized - x)^2 over the block (fouroversix's default)
    ABS_MAX = "abs_max"  # max |dequantized - x| over the block


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
        selection: the 4/6 rule's block error (``four_over_six`` only; None for every other rule).
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
    selection: Selection | None = None

    def __post_init__(self) -> None:
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"scheme {self.name!r}: block_size must be a positive int, got {self.block_size!r}")
        object.__setattr__(self, "scale_rule", ScaleRule(self.scale_rule))
        object.__setattr__(self, "scale_order", ScaleOrder(self.scale_order))
        object.__setattr__(self, "dequantize_order", DequantizeOrder(self.dequantize_order))
        if self.uses_tensor_amax:
            if self.target is None or isinstance(self.target, bool):
                raise ValueError(f"scheme {self.name!r}: rule {self.scale_rule.value!r} needs a numeric target")
            target = float(self.target)
            if not (0 < target < float("inf")):
                raise ValueError(f"scheme {self.name!r}: target must be positive and finite, got {self.target!r}")
        elif self.target is not None:
            raise ValueError(f"scheme {self.name!r}: rule {self.scale_rule.value!r} takes no target")
        if self.scale_rule not in _FORMAT_ROUNDED and self.scale != UE8M0:
            raise ValueError(f"scheme {self.name!r}: MX rules need the ue8m0 scale format")
        if self.scale_rule is ScaleRule.FOUR_OVER_SIX:
            if self.selection is None:
                raise ValueError(f"scheme {self.name!r}: four_over_six needs a selection, one of {list(Selection)}")
            object.__setattr__(self, "selection", Selection(self.selection))
            if self.block_size != 16:
                raise ValueError(f"scheme {self.name!r}: four_over_six takes 16-element blocks, got {self.block_size}")
        elif self.selection is not None:
            raise ValueError(f"scheme {self.name!r}: rule {self.scale_rule.value!r} takes no selection")

    def with_target(self, target: float) -> BlockScheme:
        if isinstance(target, float) and target == self.target:  # every FP4 operand's call: no new scheme to check
            return self
        return dataclasses.replace(self, target=target)

    @property
    def uses_tensor_amax(self) -> bool:
        """Whether the block scales depend on a tensor reference (the MX power-of-two rules read only the block)."""
        return self.scale_rule in _TENSOR_REFERENCED


SCHEMES: dict[str, BlockScheme] = {
    "ue5m3_b16": BlockScheme(name="ue5m3_b16", scale=UE5M3, block_size=16, target=448.0, zero_scale_repair=True),
    "ue5m3_b32": BlockScheme(name="ue5m3_b32", scale=UE5M3, block_size=32, target=448.0, zero_scale_repair=True),
    "nvfp4": BlockScheme(
        name="nvfp4", scale=E4M3, block_size=16, target=448.0, dequantize_order=DequantizeOrder.TE_KERNEL
    ),
    "mxfp4": BlockScheme(name="mxfp4", scale=UE8M0, block_size=32, target=None, scale_rule=ScaleRule.MX_FLOOR),
}


def _four_over_six(name: str, scale: FloatFormat, selection: Selection, **fields) -> BlockScheme:
    """A 4/6 scheme: fouroversix's FP32 order for the 6-candidate, (a_B / F) * G (``te_legacy``), target 256."""
    return BlockScheme(
        name=name,
        scale=scale,
        block_size=16,
        target=256.0,
        scale_rule=ScaleRule.FOUR_OVER_SIX,
        scale_order=ScaleOrder.TE_LEGACY,
        selection=selection,
        **fields,
    )


SCHEMES.update(
    {
        f"nvfp4_4over6_{s.value}": _four_over_six(
            f"nvfp4_4over6_{s.value}", E4M3, s, dequantize_order=DequantizeOrder.TE_KERNEL
        )
        for s in Selection
    }
)
SCHEMES.update(
    {
        f"ue5m3_b16_4over6_{s.value}": _four_over_six(f"ue5m3_b16_4over6_{s.value}", UE5M3, s, zero_scale_repair=True)
        for s in (Selection.MAE, Selection.MSE)
    }
)


# The block-scale format study (issue 26): UE5M3 under the other two top-code conventions (the authors' TE fork,
# all 256 codes finite, max 122,880; AMD ALTO, 0xFF NaN, max 114,688), and UE8M0 at blocks 16 and 32 with the OCP
# floor rule and the RCEIL rule (torchao's RCEIL, TE's float_to_e8m0).
SCHEMES.update(
    {
        f"ue5m3_b16_{fmt.name.removeprefix('ue5m3_')}": BlockScheme(
            name=f"ue5m3_b16_{fmt.name.removeprefix('ue5m3_')}", scale=fmt, block_size=16, target=448.0,
            zero_scale_repair=True,
        )
        for fmt in (UE5M3_ALL_FINITE, UE5M3_ALTO)
    }
)  # fmt: skip
SCHEMES.update(
    {
        name: BlockScheme(name=name, scale=UE8M0, block_size=block, target=None, scale_rule=rule)
        for name, block, rule in (
            ("mxfp4_rceil", 32, ScaleRule.MX_RCEIL),
            ("mxfp4_b16", 16, ScaleRule.MX_FLOOR),
            ("mxfp4_b16_rceil", 16, ScaleRule.MX_RCEIL),
        )
    }
)


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
