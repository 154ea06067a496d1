"""Every Triton kernel of the package, at the launches the adapters make on the 8B model's shapes, compiled for the
GPUs it is meant for (Hopper sm_90, Blackwell sm_100) on this CPU machine with Triton's own compiler and the ptxas
it ships, and read back with its cuobjdump (:mod:`ue5m3.numerics.kernels.compiled`). The interpreter tests check
the kernels' arithmetic; this checks what the GPU would run: no spills anywhere, no FP64 on the fast path and in
the memory-bound passes (FP64 lives in the exact-path kernels alone), tensor-core MMAs in the GEMMs, the hardware's
``add.rz.f32``, 32-bit offsets at these sizes, and the statistics recorded in
``benchmarks/records/compiled_kernels.json`` for this Triton version (registers, stack, shared memory, occupancy,
instruction mix): properties of the compiled code, deterministic for a Triton version, not timings.

The compilation runs in a child process without ``TRITON_INTERPRET`` (under it, ``triton.jit`` makes interpreted
functions that do not compile): ``python -m ue5m3.numerics.kernels.compiled 90 100``.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is not installed (the GPU extra)")

pytestmark = [pytest.mark.triton, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "benchmarks" / "records" / "compiled_kernels.json"
CAPABILITIES = (90, 100)
WRITE = "python -m ue5m3.numerics.kernels.compiled --write benchmarks/records/compiled_kernels.json"


@pytest.fixture(scope="module")
def compiled() -> dict[int, dict[str, dict]]:
    """{capability: {case: statistics}} from one child process compiling every shipped launch for both."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    child = subprocess.run(
        [sys.executable, "-m", "ue5m3.numerics.kernels.compiled", *map(str, CAPABILITIES)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
        cwd=ROOT,
    )
    assert child.returncode == 0, child.stderr[-4000:]
    out: dict[int, dict[str, dict]] = {c: {} for c in CAPABILITIES}
    for line in child.stdout.splitlines():
        row = json.loads(line)
        out[row.pop("capability")][row.pop("case")] = row
    return out


@pytest.mark.parametrize("capability", CAPABILITIES, ids=["sm_90", "sm_100"])
def test_the_shipped_kernels_spill_nothing_and_keep_fp64_off_the_fast_path(compiled, capability):
    from ue5m3.numerics.kernels.compiled import FAST_PATH_KERNELS

    stats = compiled[capability]
    assert set(FAST_PATH_KERNELS) | {"probe exact", "mma_sim"} == set(stats)
    spilling = {c: (s["stack_bytes"], s["local_stores"], s["local_loads"]) for c, s in stats.items()}
    assert {c: v for c, v in spilling.items() if v != (0, 0, 0)} == {}, "a kernel spills (stack bytes, STL, LDL)"
    assert {c: stats[c]["fp64"] for c in FAST_PATH_KERNELS if stats[c]["fp64"]} == {}, "FP64 on the fast path"
    fast, exact = stats["probe fast"], stats["probe exact"]
    assert fast["mma"] > 0 and exact["mma"] > 0 and stats["mma_sim"]["mma"] > 0  # tensor-core dots
    assert exact["fp64"] > 0  # the exact path's TwoSum chain is FP64, in its own kernel
    assert fast["ptx_add_rz"] and exact["ptx_add_rz"]  # the hardware's round-toward-zero addition
    assert fast["ctas_per_sm"] >= 1 and fast["warps_per_sm"] >= 8
    # 8,192 x 4,096 operands: every offset fits 32 bits, and the launches take them
    assert not any(s["constants"].get("INDEX64", False) for s in stats.values())


@pytest.mark.parametrize("capability", CAPABILITIES, ids=["sm_90", "sm_100"])
def test_the_record_holds_what_this_triton_compiles(compiled, capability):
    import triton

    from ue5m3.numerics.kernels.launch import TESTED_TRITON

    if triton.__version__ not in TESTED_TRITON:
        pytest.skip(f"triton {triton.__version__} is not one of the recorded versions {TESTED_TRITON}")
    record = json.loads(RECORD.read_text())
    recorded = record["triton"].get(triton.__version__, {}).get(str(capability))
    assert recorded is not None, f"the record has no triton {triton.__version__} sm_{capability}: run {WRITE}"
    changed = {
        case: {k: (recorded.get(case, {}).get(k), v) for k, v in stats.items() if recorded.get(case, {}).get(k) != v}
        for case, stats in compiled[capability].items()
    }
    changed = {case: diff for case, diff in changed.items() if diff}
    assert changed == {} and set(recorded) == set(compiled[capability]), (
        f"the compiled kernels differ from the record ((recorded, now) per field): {changed}; if the change is "
        f"meant, run {WRITE} and update docs/performance.md"
    )
