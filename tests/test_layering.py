"""The package's architecture as a test: imports point down the floors, and no module imports run in a cycle.

Floors, bottom to top (a unit may import only units on lower floors, and itself):

0. ``config``: the strict config loader (imports nothing of the package);
1. ``artifacts``, ``reference``, ``logs``, ``stages``: atomic outputs, provenance, the paper's numbers, the log
   format and progress, the registry of stages and figures;
2. ``numerics``: formats, quantizers, Hadamard, scale lifecycle, GEMM models, exact arithmetic, kernels; ``report``:
   the report views of figures and tables;
3. ``layers``, ``models``, ``data``: FP4 layers and recipes; plain models; corpora and loaders (mutually
   independent);
4. ``training``;
5. ``evaluation``;
6. ``identify``, ``experiments``, ``plotting``, ``conformance`` (mutually independent);
7. ``pipeline``: the pipeline config as dataclasses, checked as a whole, its jobs and its figure registry;
8. ``cli``, then ``__main__``.

Inside ``numerics`` the modules have their own order (``NUMERICS_ORDER``), and nothing outside ``training``
imports the training loop except the CLI's training verbs and identification's parity harness (which trains).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "ue5m3"

FLOORS: list[set[str]] = [
    {"config"},
    {"artifacts", "reference", "logs", "stages"},
    {"numerics", "report", "figures"},
    {"layers", "models", "data"},
    {"training"},
    {"evaluation"},
    {"identify", "experiments", "plotting", "conformance", "plan"},
    {"pipeline"},
    {"cli"},
    {"__main__"},
]
NUMERICS_ORDER = [
    "philox",
    "checks",
    "formats",
    "exact",
    "schemes",
    "scale_rules",
    "layout",
    "kernels.launch",  # allocation and launch of device kernels: a leaf (torch only) that the containers consult
    "kernels.triton_pack",  # the E2M1 pack/unpack kernels of the containers (launch only)
    "kernels.cpu",  # the C kernel's bindings (its build only): quantizer, GEMM, and the containers' CPU packing
    "quantized",
    "encode",
    "kernels",
    "backend",
    "arguments",
    "quantize",
    "hadamard",
    "scaling",
    "gemm",
    "fast_path",  # which tile-slices the Triton GEMMs send to the exact path, restated in torch from gemm's checks
    "kernels.compiled",  # the compile report drives the quantizer and GEMMs to compile every kernel: it comes last
]
LOOP_IMPORTERS = {"ue5m3.cli.training", "ue5m3.identify.parity"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(dotted: str) -> bool:
    rel = Path(*dotted.split("."))
    return (SRC.parent / rel).with_suffix(".py").is_file() or (SRC.parent / rel / "__init__.py").is_file()


def _imports(path: Path, me: str | None = None) -> set[str]:
    """Every ue5m3 module ``path`` imports (``from ue5m3.a import b`` resolves to ``ue5m3.a.b`` when that is a
    module), at any depth of the file (imports inside functions count)."""
    me = me or _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "ue5m3"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != "ue5m3":
                continue
            for alias in node.names:
                child = f"{module}.{alias.name}"
                found.add(child if _is_module(child) else module)
    found.discard(me)
    return found


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in sorted(SRC.rglob("*.py"))}


def _unit(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _floor(unit: str) -> int:
    for i, units in enumerate(FLOORS):
        if unit in units:
            return i
    raise AssertionError(f"unit {unit!r} of src/ue5m3 is on no floor: add it to FLOORS in {__file__}")


GRAPH = _graph()


def test_every_top_level_unit_has_a_floor():
    units = {_unit(m) for m in GRAPH} - {None}
    for unit in units:
        _floor(unit)


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_point_down_the_floors(module):
    me = _unit(module)
    if me is None:
        return
    upward = sorted(
        target
        for target in GRAPH[module]
        if (unit := _unit(target)) is not None and unit != me and _floor(unit) >= _floor(me)
    )
    assert not upward, f"{module} (floor {_floor(me)}) imports {upward} on its own floor or above"


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if _unit(m) == "numerics"))
def test_numerics_modules_import_only_earlier_numerics_modules(module):
    def rank(name: str) -> int:
        parts = name.split(".")
        if ".".join(parts[2:4]) in NUMERICS_ORDER:  # a submodule ranked on its own
            return NUMERICS_ORDER.index(".".join(parts[2:4]))
        return NUMERICS_ORDER.index(parts[2]) if len(parts) > 2 else -1

    later = sorted(t for t in GRAPH[module] if _unit(t) == "numerics" and t != module and rank(t) >= rank(module))
    later = [t for t in later if not t.startswith(module + ".") and not module.startswith(t + ".")]
    later = [t for t in later if t.split(".")[:3] != module.split(".")[:3]]  # a unit may import itself (kernels.*)
    assert not later, f"{module} imports {later}, which come after it in {NUMERICS_ORDER}"


def test_only_the_cli_and_the_parity_harness_import_the_training_loop():
    importers = {m for m, targets in GRAPH.items() if "ue5m3.training.loop" in targets}
    assert importers <= LOOP_IMPORTERS | {"ue5m3.training"}, sorted(importers - LOOP_IMPORTERS)


def test_no_module_import_cycle():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH.get(v, ()):
            if w not in GRAPH:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            component.append(v)
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_the_checker_sees_an_upward_import(tmp_path):
    fake = tmp_path / "probe.py"
    fake.write_text("from ue5m3.training import checkpoint\nfrom .. import models\n")
    imports = _imports(fake, "ue5m3.numerics.probe")
    assert imports == {"ue5m3.training.checkpoint", "ue5m3.models"}
    imports.discard("ue5m3.models")
    assert imports == {"ue5m3.training.checkpoint"}
    assert _floor(_unit("ue5m3.training.checkpoint")) > _floor("numerics")
