"""The Triton kernels as the GPU runs them: compiled for an NVIDIA architecture on any machine, and read back.

:func:`shipped_launches` describes, on torch's ``meta`` device inside planning, the launches the adapters make on
the 8B model's shapes (``Launch`` objects: the kernel, its grid, its arguments and compile-time constants, for the
tiles of the architecture asked for). :func:`compile_launch` compiles one the way Triton's launcher would
(the same argument specialisation: 32- or 64-bit integers, 16-byte alignment, constants), with Triton's own
compiler and ptxas, for ``sm_90`` or ``sm_100``; no GPU is needed. :func:`statistics` reads the cubin back with
``cuobjdump`` (Triton ships it): registers, stack bytes, shared memory, and the instruction mix that decides the
speed: tensor-core MMAs, FP64 instructions, local-memory stores and loads (spills), 64-bit address arithmetic
(``IMAD.WIDE``), and the occupancy those registers and that shared memory allow.

These are properties of the compiled code, deterministic for a Triton version: ``tests/test_triton_compile.py``
fails on a spill or FP64 in the fast path, ``benchmarks/gpu_check.py`` records them beside its timings, and
``python -m ue5m3.numerics.kernels.compiled`` prints the table docs/performance.md holds. Run it without
``TRITON_INTERPRET`` (under it ``triton.jit`` makes interpreted functions, which do not compile).
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import tempfile

import torch

from ue5m3.numerics.kernels.launch import Launch, planning

__all__ = ["shipped_launches", "compile_launch", "statistics", "report", "write_record", "FAST_PATH_KERNELS"]

# The kernels that must hold no FP64 instruction and spill nothing (the fast path and the memory-bound passes).
FAST_PATH_KERNELS = (
    "prepare A",
    "prepare B (2D tiles)",
    "probe fast",
    "quantize ue5m3_b16 rne",
    "quantize ue5m3_b16 sr (53 bits)",
    "quantize nvfp4_4over6_mse",
    "quantize nvfp4_4over6 tiles",
    "quantize both axes ue5m3_b16 rne + sf",
    "quantize both axes nvfp4 sr_te + sr_te",
    "quantize both axes 4over6",
    "pack e2m1",
    "unpack e2m1",
)
# Registers and shared memory per SM (sm_90 and sm_100 alike) and the most resident CTAs and threads per SM.
REGISTERS_PER_SM, SHARED_PER_SM, CTAS_PER_SM, THREADS_PER_SM = 65536, 228 * 1024, 32, 2048
_MMA = ("HMMA", "HGMMA", "UTCHMMA", "UTCQMMA", "UTCMMA", "UTCOMMA")


def shipped_launches(capability: int) -> dict[str, Launch]:
    """The launches the adapters make for the 8B model's shapes (8,192 tokens, 4096 features), by case name, with
    ``capability``'s tiles: described on ``meta`` (nothing runs)."""
    from ue5m3.numerics.kernels import triton_gemm, triton_mma_sim, triton_pack, triton_quantize
    from ue5m3.numerics.quantize import AxisQuantization, quantize, quantize_both_axes

    tiles = triton_gemm.PROBE_TILES[capability]
    out: dict[str, Launch] = {}
    recorded: list[Launch] = []

    def recording(launches, device):
        recorded.extend(launches)

    meta = {"device": "meta"}
    with planning():
        original = (triton_gemm.run, triton_mma_sim.run, triton_quantize.run)
        triton_gemm.run = triton_mma_sim.run = triton_quantize.run = recording
        try:
            a, sa = torch.empty(8192, 4096, **meta), torch.empty(8192, 256, **meta)
            b, sb = torch.empty(4096, 4096, **meta), torch.empty(256, 256, **meta)
            kwargs = dict(block=16, column_block=16, width=64, rtz=True, grid=1024, alpha=1.0, tiles=tiles)
            launches, _, _ = triton_gemm.probe_gemm_launches(a, sa, b, sb, **kwargs)
            out.update(zip(("prepare A", "prepare B (2D tiles)", "probe fast", "probe exact"), launches, strict=True))
            triton_mma_sim.mma_sim_payload(
                a, sa, b, sb, block=16, column_block=16, min_exponent_a=-14, min_exponent_b=-14, alpha=1.0
            )
            out["mma_sim"] = recorded.pop()
            from ue5m3.numerics.checks import DeferredChecks
            from ue5m3.numerics.philox import RandomStream

            stream = RandomStream(seed=1, module="m", role="dgrad_upstream_gradient", step=1)
            x = torch.empty(8192, 4096, **meta)
            checks = DeferredChecks()
            cases = {
                "quantize ue5m3_b16 rne": dict(scheme="ue5m3_b16"),
                "quantize ue5m3_b16 sr (53 bits)": dict(scheme="ue5m3_b16", rounding="sr", stream=stream),
                "quantize nvfp4_4over6_mse": dict(scheme="nvfp4_4over6_mse"),
                "quantize nvfp4_4over6 tiles": dict(scheme="nvfp4_4over6_mse", two_d=True),
            }
            for name, case in cases.items():
                quantize(x, case.pop("scheme"), backend="triton", checks=checks, **case)
                out[name] = recorded.pop()
            sf = AxisQuantization(rounding="sf", stream=stream)
            sr_te = AxisQuantization(rounding="sr_te", stream=stream)
            both = {
                "quantize both axes ue5m3_b16 rne + sf": ("ue5m3_b16", AxisQuantization(), sf),
                "quantize both axes nvfp4 sr_te + sr_te": ("nvfp4", sr_te, sr_te),
                "quantize both axes 4over6": ("nvfp4_4over6_mse", AxisQuantization(), sf),
            }
            for name, (scheme, last, first) in both.items():
                quantize_both_axes(x, scheme, last, first, transposed=True, backend="triton", checks=checks)
                out[name] = recorded.pop()
        finally:
            triton_gemm.run, triton_mma_sim.run, triton_quantize.run = original
        out["pack e2m1"] = triton_pack.pack_launch(torch.empty(8192, 4096, **meta))[1]
        out["unpack e2m1"] = triton_pack.unpack_launch(torch.empty(8192, 2048, dtype=torch.uint8, **meta))[1]
    return out


def compile_launch(launch: Launch, capability: int):
    """``launch`` compiled for NVIDIA ``sm_<capability>`` as Triton's launcher compiles it (its argument
    specialisation, constants and options), on this machine; returns Triton's compiled kernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    kernel = launch.kernel
    if not hasattr(kernel, "params"):
        raise RuntimeError("the kernels compile only without TRITON_INTERPRET=1 (run this in a separate process)")
    target = GPUTarget("cuda", capability, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    constants = dict(launch.constants)
    bound, specialization, options = binder(*launch.args, **constants)
    options, signature, constexprs, attrs = kernel._pack_args(backend, constants, bound, specialization, options)
    return triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target, options=options.__dict__)


def _tool(name: str) -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def statistics(compiled) -> dict:
    """Registers, stack, shared memory, the instruction mix and the occupancy of one compiled kernel."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        usage = subprocess.run([_tool("cuobjdump"), "-res-usage", path], capture_output=True, text=True, check=True)
        sass = subprocess.run([_tool("cuobjdump"), "-sass", path], capture_output=True, text=True, check=True)
    fields = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", usage.stdout))
    opcodes = collections.Counter(
        match.group(1)
        for match in re.finditer(
            r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T\d]\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)", sass.stdout
        )
    )
    base = collections.Counter()
    for opcode, count in opcodes.items():
        base[opcode.split(".")[0]] += count
    fp64 = sum(c for op, c in opcodes.items() if re.match(r"D(ADD|MUL|FMA|SETP|MNMX|MUL)\b", op) or "F64" in op)
    registers = int(fields.get("REG", 0))
    warps = compiled.metadata.num_warps
    threads = 32 * warps
    shared = max(int(compiled.metadata.shared), int(fields.get("SHARED", 0)))
    # registers are allocated per warp in units of 256 (8 per thread)
    per_warp = -(-max(registers, 1) * 32 // 256) * 256
    occupancy = min(
        CTAS_PER_SM,
        THREADS_PER_SM // threads,
        REGISTERS_PER_SM // (per_warp * warps),
        SHARED_PER_SM // shared if shared else CTAS_PER_SM,
    )
    return {
        "registers": registers,
        "stack_bytes": int(fields.get("STACK", 0)),
        "local_bytes": int(fields.get("LOCAL", 0)),
        "shared_bytes": shared,
        "warps": warps,
        "ctas_per_sm": occupancy,
        "warps_per_sm": occupancy * warps,
        "instructions": sum(opcodes.values()),
        "mma": sum(c for op, c in base.items() if op in _MMA),
        "fp64": fp64,
        "local_stores": base["STL"],
        "local_loads": base["LDL"],
        "imad_wide": sum(c for op, c in opcodes.items() if op.startswith("IMAD.WIDE")),
        "ptx_add_rz": "add.rz.f32" in compiled.asm["ptx"],
    }


def report(capability: int) -> dict[str, dict]:
    """:func:`statistics` of every shipped launch compiled for ``capability``, by case name."""
    import triton

    out = {}
    for name, launch in shipped_launches(capability).items():
        stats = statistics(compile_launch(launch, capability))
        constants = {k: v for k, v in launch.constants.items() if k.isupper() or k in ("num_warps", "num_stages")}
        out[name] = {"kernel": launch.kernel.fn.__name__, "triton": triton.__version__, **stats, "constants": constants}
    return out


def write_record(path: str, capabilities: list[int]) -> dict:
    """Merge this Triton version's :func:`report` for ``capabilities`` into the JSON record at ``path``
    (``benchmarks/records/compiled_kernels.json``: {"schema": ..., "triton": {version: {capability: {case:
    statistics}}}}) and return the record."""
    import triton

    record = {"schema": RECORD_SCHEMA, "triton": {}}
    if os.path.exists(path):
        with open(path) as f:
            record = json.load(f)
    versions = record.setdefault("triton", {})
    versions[triton.__version__] = {str(c): report(c) for c in capabilities}
    record["triton"] = dict(sorted(versions.items()))
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)
    return record


RECORD_SCHEMA = (
    "per Triton version and compute capability, per shipped launch (8B shapes): the kernel, its compile-time "
    "constants, registers per thread, stack and local bytes per thread, shared bytes per CTA, warps, the CTAs and "
    "warps per SM those allow, SASS instructions in all, tensor-core MMA instructions, FP64 instructions, "
    "local-memory stores and loads, IMAD.WIDE (64-bit address arithmetic) and whether the PTX holds add.rz.f32 "
    "(ue5m3.numerics.kernels.compiled.statistics)"
)


def main(argv: list[str] | None = None) -> int:
    """``python -m ue5m3.numerics.kernels.compiled [--write RECORD] [CAPABILITY ...]``: one JSON line per kernel and
    architecture (90 and 100 by default); with ``--write``, this Triton version's entries of the record are
    replaced."""
    args = list(argv if argv is not None else sys.argv[1:])
    path = None
    if "--write" in args:
        at = args.index("--write")
        path = args[at + 1]
        del args[at : at + 2]
    capabilities = [int(c) for c in args] or [90, 100]
    if path is not None:
        write_record(path, capabilities)
        return 0
    for capability in capabilities:
        for name, stats in report(capability).items():
            print(json.dumps({"case": name, "capability": capability, **stats}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
