"""Compiling the fused C kernel on first use, on the machine that runs it: the one home of its compile flags.

The package ships the kernel's C sources (``csrc/``), never a compiled library, so the wheel is pure Python and its
``py3-none-any`` tag is true. :func:`ue5m3.numerics.kernels.cpu.load` compiles the sources with :func:`compile_library`
the first time the kernel is needed, into the cache (``$UE5M3_CACHE``, default ``~/.cache/ue5m3``), atomically so
that concurrent first uses do not race; later uses load the cached file. Installing therefore needs no compiler; a
machine without one runs the torch path (``backend="auto"``), whose results are identical.

ISA levels (:data:`ISA_FLAGS`, chosen by ``$UE5M3_KERNEL_ISA``, default ``native``):

* ``portable``: no ``-march`` flag, the compiler's default target (x86-64 baseline on Debian's gcc); the
  probe-matched GEMM's FP32 payload path (AVX2 + FMA) is compiled out.
* ``avx2``: ``-march=x86-64-v3`` (AVX2, FMA, BMI1/2, F16C, LZCNT, MOVBE), refused on a CPU without those.
* ``avx512``: ``-march=x86-64-v4`` (x86-64-v3 plus AVX-512 F, BW, CD, DQ and VL): the probe-matched GEMM's
  micro-kernels on 512-bit registers; refused on a CPU without those.
* ``native``: ``-march=native``, everything this CPU has (the AVX-512 micro-kernels where it has AVX-512 F, DQ and
  VL, the AVX2 ones where it has AVX2 and FMA).

Every level computes the same bits (the C kernel uses no fast-math and no FP contraction;
tests/test_kernel_build.py compares the levels with each other and tests/test_cpu_kernel.py with the torch path);
a level changes speed only. A new level is one more entry in :data:`ISA_FLAGS` and :data:`ISA_CPU_FLAGS`. The
library's file name carries a key: the SHA-256 of the sources, the compiler, the flags and this CPU's model and
feature flags, so one cache can serve several kinds of CPU (a shared home directory).

Standard library only: no torch, so it can run anywhere, including a build tool.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "SOURCES",
    "HEADERS",
    "FLAGS",
    "ISA_FLAGS",
    "ISA_CPU_FLAGS",
    "ISA_ENV",
    "DEFAULT_ISA",
    "NO_COMPILER",
    "CompileError",
    "compiler",
    "cpu_identity",
    "cpu_flags",
    "kernel_isa",
    "isa_reason",
    "flags",
    "cache_dir",
    "library_name",
    "read_sources",
    "compile_library",
]

SOURCES = ("block_quantize.c", "accumulate.c")
HEADERS = ("philox.h",)
FLAGS = ["-O3", "-fPIC", "-shared", "-fopenmp", "-fno-fast-math", "-ffp-contract=off", "-std=c99"]
"""Flags of every ISA level; exactness holds because FP contraction is off and fast-math is never on."""
ISA_FLAGS: dict[str, list[str]] = {
    "portable": [],
    "avx2": ["-march=x86-64-v3"],
    "avx512": ["-march=x86-64-v4"],
    "native": ["-march=native"],
}
"""The instruction-set levels the kernel can be built for, and the flags of each (added to :data:`FLAGS`)."""
ISA_CPU_FLAGS: dict[str, tuple[str, ...]] = {
    "avx2": ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"),  # x86-64-v3; abm is LZCNT
    "avx512": ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave")
    + ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"),  # x86-64-v4
}
"""The ``/proc/cpuinfo`` flags a level needs (levels not listed run on any CPU the compiler targets)."""
ISA_ENV = "UE5M3_KERNEL_ISA"
DEFAULT_ISA = "native"
NO_COMPILER = "no C compiler found (looked for $CC, cc and gcc)"


class CompileError(RuntimeError):
    """The kernel could not be compiled or loaded."""


def compiler() -> str | None:
    """The C compiler: ``$CC``, else ``cc`` or ``gcc`` on PATH; None when there is none."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _first_cpu() -> str:
    try:
        return Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return f"model name : {platform.processor()} {platform.machine()}"


def cpu_identity() -> bytes:
    """Model and feature flags of this CPU (a ``-march=native`` build is only valid on the same kind)."""
    return "\n".join(line for line in _first_cpu().splitlines() if line.startswith(("model name", "flags"))).encode()


def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags as ``/proc/cpuinfo`` names them (empty where there is no such file)."""
    for line in _first_cpu().splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def kernel_isa() -> str:
    """The ISA level to build and load: ``$UE5M3_KERNEL_ISA``, default :data:`DEFAULT_ISA`.

    Raises:
        ValueError: a level that is not in :data:`ISA_FLAGS`, naming the accepted ones.
    """
    isa = os.environ.get(ISA_ENV, DEFAULT_ISA)
    if isa not in ISA_FLAGS:
        raise ValueError(f"{ISA_ENV}={isa!r} is not an ISA level of the C kernel; expected one of {sorted(ISA_FLAGS)}")
    return isa


def isa_reason(isa: str) -> str | None:
    """Why this CPU cannot run the ``isa`` build (None if it can)."""
    if isa not in ISA_FLAGS:
        raise ValueError(f"unknown ISA level {isa!r}; expected one of {sorted(ISA_FLAGS)}")
    needed = ISA_CPU_FLAGS.get(isa, ())
    if needed and platform.machine() not in ("x86_64", "AMD64"):
        return f"ISA level {isa!r} is x86-64 only (this machine is {platform.machine()})"
    missing = sorted(set(needed) - cpu_flags())
    if missing:
        return f"this CPU lacks {', '.join(missing)}, which ISA level {isa!r} needs"
    return None


def flags(isa: str) -> list[str]:
    """The compile flags of the ``isa`` build."""
    return [*FLAGS, *ISA_FLAGS[isa]]


def cache_dir() -> Path:
    """Where first use compiles the library: ``$UE5M3_CACHE``, default ``~/.cache/ue5m3``."""
    return Path(os.environ.get("UE5M3_CACHE", Path.home() / ".cache" / "ue5m3"))


def read_sources(csrc: Path) -> dict[str, bytes]:
    """The kernel's sources and headers from a ``csrc`` directory, by file name."""
    return {name: (Path(csrc) / name).read_bytes() for name in SOURCES + HEADERS}


def library_name(sources: Mapping[str, bytes], cc: str, isa: str = DEFAULT_ISA) -> str:
    """``ue5m3_kernels-<isa>-<key>.so``: the key hashes the sources, the compiler and flags, and this CPU."""
    identity = b"".join(sources[name] for name in SOURCES + HEADERS) + " ".join([cc, *flags(isa)]).encode()
    key = hashlib.sha256(identity + cpu_identity()).hexdigest()[:16]  # the compiler too: CC may change the ISA
    return f"ue5m3_kernels-{isa}-{key}.so"


def compile_library(sources: Mapping[str, bytes], cc: str | None, directory: Path, isa: str = DEFAULT_ISA) -> Path:
    """Compile the ``isa`` build into ``directory`` (atomically: concurrent builds do not race); return its path.

    A library of the same key already there is returned as it is.

    Raises:
        CompileError: no compiler, a CPU that cannot run the level, or compilation failed (the compiler's message
            is included).
        ValueError: an unknown ISA level.
    """
    reason = isa_reason(isa)
    if reason is not None:
        raise CompileError(reason)
    if cc is None:
        raise CompileError(NO_COMPILER)
    target = Path(directory) / library_name(sources, cc, isa)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        paths = []
        for name, data in sources.items():
            (Path(tmp) / name).write_bytes(data)
            if name in SOURCES:
                paths.append(str(Path(tmp) / name))
        out = Path(tmp) / "lib.so"
        try:
            result = subprocess.run([cc, *flags(isa), *paths, "-o", str(out)], capture_output=True, text=True)
        except OSError as err:  # $CC names no executable
            raise CompileError(f"running the C compiler {cc!r} failed: {err}") from err
        if result.returncode != 0:
            raise CompileError(f"compiling {', '.join(SOURCES)} with {cc} ({isa}) failed:\n{result.stderr}")
        os.replace(out, target)
    return target
