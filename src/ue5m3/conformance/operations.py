"""The matrix's operations: for each (operation, peer), this project's result and the peer's on one corpus case.

An :class:`Operation` names the operation and the peer, the peer's import name (to tell "not installed"), and a
function of a :class:`~ue5m3.conformance.corpus.Case` that returns an :class:`Outcome` (ours, theirs, elements
excluded from the comparison, and per known difference the elements it explains) or None where the operation does not
take the case (a ragged shape a peer refuses, NaN for a quantizer). Stochastic operations return a
:class:`Sampled` outcome instead: a goodness-of-fit statistic and its p-value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from ue5m3.conformance.adapters import fouroversix as fos
from ue5m3.conformance.adapters import mmasim as mma
from ue5m3.conformance.adapters import transformer_engine as te
from ue5m3.conformance.corpus import Case
from ue5m3.numerics import formats, gemm, hadamard
from ue5m3.numerics.quantize import quantize, unpack_fp4
from ue5m3.numerics.schemes import ScaleOrder, get_scheme

__all__ = ["Outcome", "Sampled", "Operation", "OPERATIONS"]


@dataclass
class Outcome:
    ours: torch.Tensor
    theirs: torch.Tensor
    excluded: torch.Tensor | None = None  # elements outside what the peer's arithmetic defines
    excluded_because: str = ""
    explained: dict[str, torch.Tensor] = field(default_factory=dict)  # known difference -> elements it explains


@dataclass
class Sampled:
    statistic: float
    p_value: float
    test: str


@dataclass(frozen=True)
class Operation:
    name: str
    peer: str  # the distribution name (its version goes into the matrix)
    module: str  # the import name (its absence makes the cell "not installed")
    function: Callable[[Case], Outcome | Sampled | None]
    source: str = "package"


# ----- helpers --------------------------------------------------------------------------------------------------


def _finite(case: Case) -> bool:
    return not case.nonfinite


def _per_element(blocks: torch.Tensor, width: int) -> torch.Tensor:
    return blocks.repeat_interleave(width, -1)


def _flat(*parts: torch.Tensor) -> torch.Tensor:
    return torch.cat([p.reshape(-1).to(torch.float32) for p in parts])


def _quantized_pair(q, payload: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(ours, theirs) as one flat tensor each: block scales, then payload values."""
    return _flat(q.scales, q.payload), _flat(scales, payload)


def _block_mask(mask_blocks: torch.Tensor, width: int) -> torch.Tensor:
    """A per-block mask as a mask over the flat (scales, payload) comparison."""
    return _flat(mask_blocks, _per_element(mask_blocks, width)).bool()


# ----- element casts: ml_dtypes and gfloat ----------------------------------------------------------------------


def _cast_inputs(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    x = case.x.reshape(-1)
    nonfinite = ~torch.isfinite(x)
    return torch.where(nonfinite, torch.zeros_like(x), x), nonfinite


def _ml_dtypes_cast(fmt_name: str, dtype_name: str, clamp: float | None = None):
    def run(case: Case) -> Outcome:
        import ml_dtypes

        x, nonfinite = _cast_inputs(case)
        values = case.x.reshape(-1).numpy()
        theirs = torch.from_numpy(values.astype(getattr(ml_dtypes, dtype_name)).astype(np.float32))
        ours = formats.round(x, fmt_name, "rne")
        out = Outcome(ours, theirs, excluded=nonfinite, excluded_because="NaN/inf inputs (the quantizers refuse them)")
        if clamp is not None:
            out.explained["ml_dtypes_overflow"] = x.abs() > clamp
        return out

    return run


def _gfloat_info(fmt_name: str):
    import gfloat
    from gfloat import formats as gf

    if fmt_name == "ue5m3":  # the paper's UE5M3 (spec 2): 8 bits, 4 of precision, bias 15, unsigned, 8 high NaNs
        return gfloat.FormatInfo(
            "ue5m3",
            k=8,
            precision=4,
            bias=15,
            is_signed=False,
            domain=gfloat.Domain.Finite,
            has_nz=False,
            num_high_nans=8,
            has_subnormals=True,
            is_twos_complement=False,
        )
    return {"e2m1": gf.format_info_ocp_e2m1, "e4m3": gf.format_info_ocp_e4m3}[fmt_name]


def _gfloat_cast(fmt_name: str, mode: str):
    def run(case: Case) -> Outcome:
        import gfloat

        x, nonfinite = _cast_inputs(case)
        if fmt_name == "ue5m3":
            x = x.abs()
        rnd = gfloat.RoundMode.TiesToEven if mode == "rne" else gfloat.RoundMode.TowardZero
        theirs = gfloat.round_ndarray(_gfloat_info(fmt_name), x.double().numpy(), rnd, sat=True)
        ours = formats.round(x, fmt_name, mode)
        return Outcome(
            ours, torch.from_numpy(theirs.astype(np.float32)), excluded=nonfinite, excluded_because="NaN/inf inputs"
        )

    return run


def _gfloat_stochastic(case: Case) -> Sampled | None:
    """E2M1 stochastic rounding: per value, this project's full-precision Bernoulli SR and gfloat's
    ``RoundMode.Stochastic`` (23 random bits) drawn 64 times each; a chi-square test of the round-up counts."""
    import gfloat
    from scipy import stats

    if case.name != "gaussian":
        return None
    draws = 64
    x = (case.x.reshape(-1)[:512].abs() * 1.5).clamp(max=5.9)
    grid = x.repeat(draws)
    ours = formats.round(grid, "e2m1", "sr", generator=torch.Generator().manual_seed(1))
    rng = np.random.default_rng(2)
    bits = rng.integers(0, 1 << 23, grid.numel(), dtype=np.int64)
    theirs = gfloat.round_ndarray(
        _gfloat_info("e2m1"),
        grid.double().numpy(),
        gfloat.RoundMode.Stochastic,
        sat=True,
        srbits=bits,
        srnumbits=23,
    )
    down = formats.round(grid, "e2m1", "rtz")
    up_ours = (ours > down).reshape(draws, -1).sum(0).double()
    up_theirs = torch.from_numpy(theirs.astype(np.float32) > down.numpy()).reshape(draws, -1).sum(0).double()
    total = up_ours + up_theirs
    keep = (total > 0) & (total < 2 * draws)
    statistic = float((((up_ours - up_theirs) ** 2) / total)[keep].sum())
    dof = int(keep.sum())
    return Sampled(statistic, float(stats.chi2.sf(statistic, dof)), f"chi-square of round-up counts, {draws} draws")


# ----- torchao ---------------------------------------------------------------------------------------------------


def _torchao_nvfp4(order: ScaleOrder):
    def run(case: Case) -> Outcome | None:
        from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize

        if not _finite(case) or case.x.shape[1] % 16:
            return None
        x = case.x
        amax = x.abs().max()
        scales, packed = nvfp4_quantize(x, block_size=16, per_tensor_scale=amax / 2688.0 if amax > 0 else None)
        payload = formats.decode(unpack_fp4(packed.view(torch.uint8)).long(), "e2m1").reshape(x.shape)
        q = quantize(x, dataclasses.replace(get_scheme("nvfp4"), scale_order=order), backend="torch")
        ours, theirs = _quantized_pair(q, payload, scales.to(torch.float32).reshape(q.scales.shape))
        out = Outcome(ours, theirs)
        as_torchao = quantize(x, dataclasses.replace(get_scheme("nvfp4"), scale_order="torchao"), backend="torch")
        floor = as_torchao.scales < 2.0**-6
        out.explained["torchao_scale_floor"] = _block_mask(floor, 16)
        if order is not ScaleOrder.TORCHAO:
            out.explained["torchao_scale_order"] = _block_mask(as_torchao.scales != q.scales, 16)
        return out

    return run


def _fp32_log2_rounds_down(x: torch.Tensor, width: int) -> torch.Tensor:
    """Per block: torchao's RCEIL descale a_B / 6 (FP32 division, as torchao) lies above a power of two 2^k, yet
    its FP32 log2 rounds to k, so torchao's ceil(log2(...)) stays at k (just below 2^k, the rounding is harmless)."""
    descale = x.abs().reshape(*x.shape[:-1], -1, width).amax(-1) / 6.0
    log2 = torch.log2(descale)
    return torch.isfinite(log2) & (log2 == torch.round(log2)) & (descale > torch.exp2(log2))


def _torchao_mx(scheme, mode_name: str):
    def run(case: Case) -> Outcome | None:
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.mx_tensor import to_mx

        if not _finite(case) or case.x.shape[1] % 32:
            return None
        scales, packed = to_mx(case.x, torch.float4_e2m1fn_x2, 32, getattr(ScaleCalculationMode, mode_name))
        q = quantize(case.x, scheme, backend="torch")
        payload = formats.decode(unpack_fp4(packed.view(torch.uint8)).long(), "e2m1").reshape(case.x.shape)
        ours = _flat(q.scale_codes.to(torch.float32), q.payload)
        theirs = _flat(scales.view(torch.uint8).to(torch.float32).reshape(q.scales.shape), payload)
        out = Outcome(ours, theirs)
        out.explained["torchao_e8m0_min_scale"] = _block_mask(q.scale_codes == 0, 32)
        if mode_name == "RCEIL":
            out.explained["torchao_rceil_fp32_log2"] = _block_mask(_fp32_log2_rounds_down(case.x, 32), 32)
        return out

    return run


# ----- fouroversix -----------------------------------------------------------------------------------------------


def _fouroversix(rule: str, two_d: bool = False):
    def run(case: Case) -> Outcome | None:
        rows, cols = case.x.shape
        if not _finite(case) or cols % 16 or (two_d and rows % 16):
            return None
        payload, scales = fos.reference_quantize(case.x, rule, two_d=two_d)
        if rule == "static_6":
            scheme = dataclasses.replace(get_scheme("nvfp4"), scale_order="te_legacy")
        else:
            scheme = get_scheme(f"nvfp4_4over6_{rule}")
        q = quantize(case.x, scheme, two_d=two_d, backend="torch")
        ours, theirs = _quantized_pair(q, payload, scales)
        undefined = fos.undefined_blocks(payload, scales, two_d=two_d)
        per_element = _per_element(undefined, 16)
        if two_d:
            per_element = per_element.repeat_interleave(16, 0)
        excluded = _flat(undefined, per_element).bool()
        out = Outcome(
            ours, theirs, excluded=excluded, excluded_because="fouroversix_unsaturated_e2m1, zero_scale_payload"
        )
        negative_zero = torch.signbit(case.x) & (case.x == 0)
        out.explained["fouroversix_negative_zero"] = _flat(torch.zeros_like(q.scales), negative_zero).bool()
        return out

    return run


def _fouroversix_rht(case: Case) -> Outcome | None:
    from fouroversix.quantize.utils import get_rht_matrix

    if not _finite(case) or case.x.shape[1] % 16:
        return None
    matrix = get_rht_matrix(device="cpu").to(torch.float32)  # fouroversix's 16x16 RHT, in FP32 here
    theirs = (case.x.reshape(-1, 16) @ matrix).reshape(case.x.shape)
    ours = hadamard.rht(case.x, out_dtype=torch.float32)
    out = Outcome(ours, theirs)
    if not torch.equal(matrix, hadamard.rht(torch.eye(16), out_dtype=torch.float32)):
        out.explained["rht_signs"] = torch.ones(ours.numel(), dtype=torch.bool)
    return out


# ----- ModelOpt --------------------------------------------------------------------------------------------------


def _modelopt_nvfp4(case: Case) -> Outcome | None:
    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    if not _finite(case) or case.x.shape[1] % 16 or not bool(case.x.abs().max() > 0):
        return None
    qt, block_scales, _ = NVFP4QTensor.quantize(case.x, 16)
    packed = qt._quantized_data.view(torch.uint8)
    payload = formats.decode(unpack_fp4(packed).long(), "e2m1").reshape(case.x.shape)
    q = quantize(case.x, "nvfp4", backend="torch")
    ours, theirs = _quantized_pair(q, payload, block_scales.to(torch.float32).reshape(q.scales.shape))
    out = Outcome(ours, theirs)
    as_torchao = quantize(case.x, dataclasses.replace(get_scheme("nvfp4"), scale_order="torchao"), backend="torch")
    out.explained["modelopt_scale_order"] = _block_mask(as_torchao.scales != q.scales, 16)
    # the payload this project's scales give when x is divided by the decoded scale, as ModelOpt does
    decoded = (q.scales * (case.x.abs().max() / 2688.0)).repeat_interleave(16, -1)[:, : case.x.shape[1]]
    divided = formats.round(torch.clamp(torch.nan_to_num(case.x / decoded, nan=0.0), -6.0, 6.0), "e2m1", "rne")
    by_division = (divided == payload) & (divided != q.payload)
    out.explained["modelopt_division"] = _flat(torch.zeros_like(q.scales), by_division).bool()
    out.explained["zero_scale_payload"] = _block_mask(q.scales == 0, 16)
    negative_zero = torch.signbit(case.x) & (case.x == 0)
    out.explained["modelopt_negative_zero"] = _flat(torch.zeros_like(q.scales), negative_zero).bool()
    return out


# ----- Transformer Engine (transcription) ------------------------------------------------------------------------


def _transformer_engine_nvfp4(case: Case) -> Outcome | None:
    if not _finite(case) or case.x.shape[1] % 16:
        return None
    payload, scales = te.reference_quantize(case.x)
    q = quantize(case.x, "nvfp4", backend="torch")
    ours, theirs = _quantized_pair(q, payload, scales)
    out = Outcome(ours, theirs)
    negative_zero = torch.signbit(case.x) & (case.x == 0)
    out.explained["te_negative_zero"] = _flat(torch.zeros_like(q.scales), negative_zero).bool()
    return out


# ----- MMA-Sim ---------------------------------------------------------------------------------------------------


def _mmasim_gemm(scheme: str):
    def run(case: Case) -> Outcome | None:
        rows, cols = case.x.shape
        if not _finite(case) or cols % 64 or rows < 2:
            return None
        a = case.x[: min(rows, 32)]
        b = case.x.flip(0)[: min(rows, 16)].t().contiguous()
        a_q, b_q = quantize(a, scheme), quantize(b, scheme, axis=0)
        theirs = mma.block_scaled_accumulator(a_q, b_q) * gemm.alpha(a_q, b_q)
        return Outcome(gemm.matmul(a_q, b_q, "mma_sim"), theirs)

    return run


OPERATIONS: list[Operation] = [
    Operation("E2M1 cast (RNE)", "ml_dtypes", "ml_dtypes", _ml_dtypes_cast("e2m1", "float4_e2m1fn")),
    Operation("E4M3 cast (RNE)", "ml_dtypes", "ml_dtypes", _ml_dtypes_cast("e4m3", "float8_e4m3fn", clamp=448.0)),
    Operation("E2M1 cast (RNE)", "gfloat", "gfloat", _gfloat_cast("e2m1", "rne")),
    Operation("E2M1 cast (RTZ)", "gfloat", "gfloat", _gfloat_cast("e2m1", "rtz")),
    Operation("E4M3 cast (RNE)", "gfloat", "gfloat", _gfloat_cast("e4m3", "rne")),
    Operation("UE5M3 cast (RNE)", "gfloat", "gfloat", _gfloat_cast("ue5m3", "rne")),
    Operation("UE5M3 cast (RTZ)", "gfloat", "gfloat", _gfloat_cast("ue5m3", "rtz")),
    Operation("E2M1 stochastic rounding", "gfloat", "gfloat", _gfloat_stochastic),
    Operation("NVFP4 quantize (TE order)", "torchao", "torchao", _torchao_nvfp4(ScaleOrder.TE)),
    Operation("NVFP4 quantize (torchao order)", "torchao", "torchao", _torchao_nvfp4(ScaleOrder.TORCHAO)),
    Operation("MXFP4 quantize (floor)", "torchao", "torchao", _torchao_mx(get_scheme("mxfp4"), "FLOOR")),
    Operation(
        "MXFP4 quantize (rceil)",
        "torchao",
        "torchao",
        _torchao_mx(dataclasses.replace(get_scheme("mxfp4"), scale_rule="mx_rceil"), "RCEIL"),
    ),
    Operation("NVFP4 quantize (TE order)", "transformer-engine", "", _transformer_engine_nvfp4, te.SOURCE),
    Operation("NVFP4 quantize (TE order)", "nvidia-modelopt", "modelopt", _modelopt_nvfp4),
    Operation("NVFP4 quantize (legacy order)", "fouroversix", "fouroversix", _fouroversix("static_6")),
    Operation("4/6 selection (MAE)", "fouroversix", "fouroversix", _fouroversix("mae")),
    Operation("4/6 selection (MSE)", "fouroversix", "fouroversix", _fouroversix("mse")),
    Operation("4/6 selection (abs max)", "fouroversix", "fouroversix", _fouroversix("abs_max")),
    Operation("4/6 selection (MSE, 16x16 tiles)", "fouroversix", "fouroversix", _fouroversix("mse", two_d=True)),
    Operation("RHT (16-point)", "fouroversix", "fouroversix", _fouroversix_rht),
    Operation("block-scaled GEMM (NVFP4)", "mmasim", "mmasim", _mmasim_gemm("nvfp4")),
    Operation("block-scaled GEMM (MXFP4)", "mmasim", "mmasim", _mmasim_gemm("mxfp4")),
    Operation("block-scaled GEMM (UE5M3 B16, as FP16 scales)", "mmasim", "mmasim", _mmasim_gemm("ue5m3_b16")),
]
