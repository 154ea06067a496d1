"""Every Triton kernel of the package compiles for the GPUs it is meant for (Hopper sm_90, Blackwell sm_100), on this
CPU machine: Triton's own compiler and the ptxas it ships, no GPU needed. The interpreter tests check the
kernels' arithmetic; this checks what the interpreter cannot: that the GPU code generation accepts them (3-D
reshapes and reductions, a scalar branch around a tensor-core dot, the inline ``add.rz.f32``).

The compilation runs in a child process without ``TRITON_INTERPRET`` (under it, ``triton.jit`` makes interpreted
functions that do not compile): ``python tests/test_triton_compile.py CAPABILITY`` prints one JSON line per kernel.
"""

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is not installed (the GPU extra)")

pytestmark = [pytest.mark.triton, pytest.mark.slow]

INTEGER_ARGUMENTS = {"seed": "u64", "last_seed": "u64", "first_seed": "u64"}
FLOAT_ARGUMENTS = {"grid", "bound", "scale_max", "inv_f"}
POINTER_TYPES = {
    "a16_ptr": "*fp16",
    "b16_ptr": "*fp16",
    "out_ptr": "*fp16",
    "shift_ptr": "*i32",
    "shift_a_ptr": "*i32",
    "shift_b_ptr": "*i32",
    "paths_ptr": "*u8",
    "flags_ptr": "*u8",
    "last_flags_ptr": "*u8",
    "first_flags_ptr": "*u8",
    "bits_ptr": "*i64",
    "base_ptr": "*i64",
}


def _compile(kernel, constants: dict, capability: int, num_warps: int = 4):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {}
    for name in inspect.signature(kernel.fn).parameters:
        if name in constants:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = POINTER_TYPES.get(name, "*fp32")
        elif name in FLOAT_ARGUMENTS:
            signature[name] = "fp32"
        else:
            signature[name] = INTEGER_ARGUMENTS.get(name, "i64" if "base" in name or "stride" in name else "i32")
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants)
    options = {"num_warps": num_warps, "enable_fp_fusion": False}
    return triton.compile(source, target=GPUTarget("cuda", capability, 32), options=options)


# the scale rule of ue5m3_b16: tensor-scaled in TE's order onto UE5M3 (3 mantissa bits, exponents -14..15), repaired
UE5M3_SCALES = dict(RULE=0, ORDER=0, SCALE_MBITS=3, SCALE_EMIN=-14, SCALE_EMAX=15, ZERO_REPAIR=True, SELECTION=0)
# nvfp4_4over6_mse: 4/6 (rule 4) in fouroversix's order onto E4M3 (3 mantissa bits, exponents -6..8), MSE selection
FOUR_OVER_SIX_SCALES = dict(RULE=4, ORDER=1, SCALE_MBITS=3, SCALE_EMIN=-6, SCALE_EMAX=8, ZERO_REPAIR=False, SELECTION=1)


def _cases() -> dict:
    from ue5m3.numerics.kernels import triton_gemm, triton_quantize

    return {
        "probe_matched": (
            triton_gemm._probe_kernel,
            dict(BLOCK=16, COLUMN_BLOCK=16, WIDTH=64, RTZ=True, HARDWARE_RTZ=True, SNAP=True, BM=128, BN=128, SUB=32),
            8,
        ),
        "prepare": (
            triton_gemm._prepare_kernel,
            dict(BLOCK=16, WIDTH=64, MBITS=3, VECTORS=32, DEPTH_LIMIT=24, SHIFT_LOW=-30, SHIFT_HIGH=50),
            4,
        ),
        "mma_sim": (
            triton_gemm._mma_sim_kernel,
            dict(BLOCK=16, COLUMN_BLOCK=1, MIN_EXP_A=-14, MIN_EXP_B=-14, BM=32, BN=32),
            4,
        ),
        "quantize": (
            triton_quantize._quantize_kernel,
            dict(L=16, L_POW2=16, BLOCKS=64, MODE=4, EXPLICIT_BITS=False, BIT_COUNT=53, **UE5M3_SCALES),
            4,
        ),
        "quantize_both_axes": (
            triton_quantize._quantize_both_axes_kernel,
            dict(
                L=16,
                TILE_ROWS=64,
                TILE_COLS=64,
                **UE5M3_SCALES,
                LAST=True,
                LAST_MODE=2,
                LAST_BITS=8,
                FIRST=True,
                FIRST_MODE=3,
                FIRST_BITS=8,
            ),
            4,
        ),
        "quantize_4over6": (
            triton_quantize._quantize_kernel,
            dict(L=16, L_POW2=16, BLOCKS=64, MODE=0, EXPLICIT_BITS=False, BIT_COUNT=0, **FOUR_OVER_SIX_SCALES),
            4,
        ),
        "quantize_4over6_tiles": (
            triton_quantize._quantize_kernel,
            dict(L=256, L_POW2=256, BLOCKS=4, MODE=0, EXPLICIT_BITS=False, BIT_COUNT=0, **FOUR_OVER_SIX_SCALES),
            4,
        ),
        "quantize_both_axes_4over6": (
            triton_quantize._quantize_both_axes_kernel,
            dict(
                L=16,
                TILE_ROWS=64,
                TILE_COLS=64,
                **FOUR_OVER_SIX_SCALES,
                LAST=True,
                LAST_MODE=0,
                LAST_BITS=0,
                FIRST=True,
                FIRST_MODE=2,
                FIRST_BITS=8,
            ),
            4,
        ),
    }


def _compile_all(capability: int) -> None:
    """The child process: compile every case for ``capability`` and print one JSON line each."""
    for case, (kernel, constants, num_warps) in _cases().items():
        compiled = _compile(kernel, constants, capability, num_warps)
        ptx = compiled.asm["ptx"]
        print(json.dumps({"case": case, "cubin_bytes": len(compiled.asm["cubin"]), "add_rz": "add.rz.f32" in ptx}))


@pytest.mark.parametrize("capability", [90, 100], ids=["sm_90", "sm_100"])
def test_every_kernel_compiles_for_the_gpu(capability):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(root / "tests"), env.get("PYTHONPATH", "")])
    child = subprocess.run(
        [sys.executable, __file__, str(capability)], env=env, capture_output=True, text=True, timeout=900
    )
    assert child.returncode == 0, child.stderr[-4000:]
    results = {r["case"]: r for r in map(json.loads, child.stdout.splitlines())}
    assert set(results) == {
        "probe_matched",
        "prepare",
        "mma_sim",
        "quantize",
        "quantize_both_axes",
        "quantize_4over6",
        "quantize_4over6_tiles",
        "quantize_both_axes_4over6",
    }
    assert all(r["cubin_bytes"] > 0 for r in results.values())
    assert results["probe_matched"]["add_rz"]  # the hardware's round-toward-zero addition, not the emulation


if __name__ == "__main__":
    _compile_all(int(sys.argv[1]))
