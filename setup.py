"""Build step of the install: compile the fused C kernel (everything else is declared in pyproject.toml).

`pip install` (or building a wheel) compiles src/ue5m3/numerics/kernels/csrc with the same recipe as the kernel's
first use (ue5m3.numerics.kernels.build): into the package's kernels/lib/ for a regular install, into the kernel
cache ($UE5M3_CACHE, default ~/.cache/ue5m3) for an editable one. Without a C compiler the install stops with an
error saying so; set UE5M3_SKIP_KERNEL_BUILD=1 to install anyway (the library then compiles on first use where a
compiler appears; until then backend="auto" runs the torch path, whose results are identical).
"""

import importlib.util
import os
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
KERNELS = HERE / "src" / "ue5m3" / "numerics" / "kernels"
SKIP = "UE5M3_SKIP_KERNEL_BUILD"


def _kernel_build():
    """ue5m3.numerics.kernels.build, loaded from its file (standard library only: no torch at build time)."""
    spec = importlib.util.spec_from_file_location("_ue5m3_kernel_build", KERNELS / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithKernel(build_py):
    """build_py, then the C kernel."""

    def run(self):
        super().run()
        if os.environ.get(SKIP) == "1":
            print(f"ue5m3: {SKIP}=1, the C kernel is not built now (it compiles on first use where a compiler is)")
            return
        build = _kernel_build()
        if getattr(self, "editable_mode", False):
            directory = build.cache_dir()
        else:
            directory = Path(self.build_lib) / "ue5m3" / "numerics" / "kernels" / "lib"
        try:
            library = build.install_library(KERNELS / "csrc", directory)
        except build.CompileError as err:
            raise SystemExit(
                f"ue5m3: building the fused C kernel failed: {err}\n"
                "Install a C compiler with OpenMP (e.g. `apt-get install gcc`, or set CC), or set "
                f"{SKIP}=1 to install without it (the torch path gives identical results)."
            ) from err
        print(f"ue5m3: built the C kernel {library}")


setup(cmdclass={"build_py": BuildPyWithKernel})
