"""Loading a script of ``benchmarks/`` as a module, for the tests of its CPU-side behaviour."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` imported as the module ``name`` (registered in ``sys.modules``)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
