"""Known differences between peers and this project, each named with its cause (an operation order, a clamp, a
quirk), so that a cell that differs says why. A cell names those of its operation's differences that explain its
differing elements; differing elements no known difference explains make the cell ``unexplained``."""

from __future__ import annotations

__all__ = ["KNOWN"]

KNOWN = {
    "torchao_scale_order": (
        "torchao forms the NVFP4 block scale as (a_B / 6) / (g / 2688); current Transformer Engine (this project's "
        "nvfp4) as a_B * (G * fp32(1/6)): the two round differently at E4M3 midpoints"
    ),
    "torchao_scale_floor": (
        "torchao clamps NVFP4 block scales below 2^-6 up to 2^-6 (E4M3's smallest normal); Transformer Engine does "
        "not, so blocks far below the tensor amax keep subnormal (or zero) scales here"
    ),
    "torchao_e8m0_min_scale": (
        "torchao's to_mx stores a UE8M0 scale code 0 (2^-127) but divides the block by max(scale, 2^-126) (FP32's "
        "smallest normal, mx_tensor.py's F32_MIN_NORMAL clamp): the payload of a block at the minimum scale is halved"
    ),
    "torchao_rceil_fp32_log2": (
        "torchao's RCEIL (its eager fallback, mx_tensor.py's _to_mx_rceil) takes ceil(log2(a_B / 6)) with an FP32 "
        "log2, which rounds to the integer k when a_B / 6 is a few ulps above 2^k: the scale is 2^k, not the "
        "2^(k+1) of TE's float_to_e8m0 / cvt.rp.ue8m0 (this project's exponent-bit round-up), so the payload doubles"
    ),
    "fouroversix_negative_zero": (
        "fouroversix's E2M1 rounding is sign(x) * magnitude, and sign(-0.0) is 0: an input -0.0 becomes +0.0"
    ),
    "fouroversix_unsaturated_e2m1": (
        "fouroversix's reference E2M1 rounding has no saturation: a scaled value of 7 or more (a block whose E4M3 "
        "scale is subnormal and rounded far down) becomes 8, outside E2M1, and its 4/6 error uses that 8"
    ),
    "zero_scale_payload": (
        "a block whose scale is zero: the peer writes payload 0, Transformer Engine's encoder (this project's) "
        "x * FP32max clamped to +-6; both dequantize to 0"
    ),
    "modelopt_division": (
        "ModelOpt divides each element by the decoded block scale (x / (s_block * s_tensor)); Transformer Engine "
        "multiplies by the FP32 reciprocal of the decoded scale, and the two cross E2M1 midpoints differently"
    ),
    "modelopt_negative_zero": (
        "ModelOpt's _cast_fp4 sets the E2M1 sign bit from x < 0, which is false for -0.0: an input -0.0 becomes "
        "code 0, +0.0; this project keeps the sign of zero"
    ),
    "modelopt_scale_order": (
        "ModelOpt forms the block scale as (a_B / 6) / (g / 2688) (torchao's order), not TE's a_B * (G * (1/6))"
    ),
    "ml_dtypes_overflow": "ml_dtypes casts out-of-range values to NaN (E4M3) or inf (E5M2); the project saturates",
    "nonfinite_input": "NaN and inf inputs: the project's casts saturate inf to the format max; the peer keeps them",
    "rht_signs": (
        "a different sign vector: the project's RHT uses Transformer Engine's fixed wgrad signs; the peer its own"
    ),
    "te_negative_zero": (
        "Transformer Engine's cast_to_fp4x2 maps an input element that is -0.0 to code 0, +0.0 (its first bucket is "
        "[0, 0.25], which -0.0 compares into); this project keeps the sign of zero"
    ),
    "mmasim_repository_alignment": (
        "the MMA-Sim repository at c7851383 let a 16-element group of all-zero products set the alignment; the "
        "released mmasim 2.1.1 (and this project's mma_sim) gives it e_zero = -139"
    ),
}
