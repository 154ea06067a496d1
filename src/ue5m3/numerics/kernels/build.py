"""Compiling the fused C kernel: the one build recipe shared by the install (``setup.py``) and the first use.

Standard library only, so that ``setup.py`` can run it in pip's isolated build environment (no torch there). The
library's file name carries a key: the SHA-256 of the sources, the compiler and its flags, and this CPU's model and
feature flags (``-march=native`` code is valid only on the kind of CPU that built it). The install builds it into the
package (``ue5m3/numerics/kernels/lib/``; an editable install into the cache, ``$UE5M3_CACHE``, default
``~/.cache/ue5m3``); :func:`ue5m3.numerics.kernels.cpu.load` uses a library whose key matches and otherwise
compiles into the cache on first use (another CPU, compiler or source version).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "SOURCES",
    "HEADERS",
    "FLAGS",
    "CompileError",
    "compiler",
    "cpu_identity",
    "cache_dir",
    "library_name",
    "read_sources",
    "compile_library",
    "NO_COMPILER",
    "BUILD_RECORD",
    "install_library",
]

SOURCES = ("block_quantize.c", "accumulate.c")
HEADERS = ("philox.h",)
# -march=native: the library is built on the machine that runs it (the key includes the CPU); exactness holds
# because FP contraction is off and fast-math is never on.
FLAGS = ["-O3", "-march=native", "-fPIC", "-shared", "-fopenmp", "-fno-fast-math", "-ffp-contract=off", "-std=c99"]
NO_COMPILER = "no C compiler found (looked for $CC, cc and gcc)"
BUILD_RECORD = "build.json"
"""Beside an installed library: ``{"library": name, "compiler": cc}``, so first use can recompute its key."""


class CompileError(RuntimeError):
    """The kernel could not be compiled or loaded."""


def compiler() -> str | None:
    """The C compiler: ``$CC``, else ``cc`` or ``gcc`` on PATH; None when there is none."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def cpu_identity() -> bytes:
    """Model and feature flags of this CPU (a -march=native build is only valid on the same kind)."""
    try:
        info = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        import platform

        info = platform.processor() + platform.machine()
    return "\n".join(line for line in info.splitlines() if line.startswith(("model name", "flags"))).encode()


def cache_dir() -> Path:
    """Where first use compiles the library: ``$UE5M3_CACHE``, default ``~/.cache/ue5m3``."""
    return Path(os.environ.get("UE5M3_CACHE", Path.home() / ".cache" / "ue5m3"))


def read_sources(csrc: Path) -> dict[str, bytes]:
    """The kernel's sources and headers from a ``csrc`` directory, by file name."""
    return {name: (Path(csrc) / name).read_bytes() for name in SOURCES + HEADERS}


def library_name(sources: Mapping[str, bytes], cc: str) -> str:
    """``ue5m3_kernels-<key>.so``: the key hashes the sources, the compiler and flags, and this CPU."""
    identity = b"".join(sources[name] for name in SOURCES + HEADERS) + " ".join([cc, *FLAGS]).encode()
    key = hashlib.sha256(identity + cpu_identity()).hexdigest()[:16]  # the compiler too: CC may change the ISA
    return f"ue5m3_kernels-{key}.so"


def compile_library(sources: Mapping[str, bytes], cc: str | None, directory: Path) -> Path:
    """Compile the library into ``directory`` (atomically: concurrent builds do not race); return its path.

    Raises:
        CompileError: no compiler, or compilation failed (the compiler's message is included).
    """
    if cc is None:
        raise CompileError(NO_COMPILER)
    target = Path(directory) / library_name(sources, cc)
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
            result = subprocess.run([cc, *FLAGS, *paths, "-o", str(out)], capture_output=True, text=True)
        except OSError as err:  # $CC names no executable
            raise CompileError(f"running the C compiler {cc!r} failed: {err}") from err
        if result.returncode != 0:
            raise CompileError(f"compiling {', '.join(SOURCES)} with {cc} failed:\n{result.stderr}")
        os.replace(out, target)
    return target


def install_library(csrc: Path, directory: Path) -> Path:
    """The install-time build: compile the sources of ``csrc`` into ``directory`` and write its build record.

    Raises:
        CompileError: no compiler, or compilation failed.
    """
    import json

    cc = compiler()
    sources = read_sources(csrc)
    target = compile_library(sources, cc, directory)
    record = {"library": target.name, "compiler": cc}
    (Path(directory) / BUILD_RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return target
