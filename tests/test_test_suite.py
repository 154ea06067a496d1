"""The test suite's own layout: a test module imports helpers from the ``helpers`` package and fixtures come from
conftest.py, so no module of tests/ imports a test module or conftest; and no helper module is named like an
installed module (the distributed worker runs as a script from tests/helpers/, which then heads ``sys.path``)."""

from __future__ import annotations

import ast
import importlib.machinery
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
HELPERS = TESTS / "helpers"


def _imported(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, top-level module name) of every absolute import in ``tree``, at any depth, and of every
    ``importlib.import_module``/``__import__`` call with a literal name."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value))
    return [(line, module.split(".")[0]) for line, module in found]


def test_no_module_of_the_suite_imports_a_test_module_or_conftest():
    modules = [*sorted(TESTS.glob("test_*.py")), TESTS / "conftest.py", *sorted(HELPERS.glob("*.py"))]
    offences = [
        f"{path.relative_to(TESTS)}:{line}: imports {name}"
        for path in modules
        for line, name in _imported(ast.parse(path.read_text(), filename=str(path)))
        if name.startswith("test_") or name == "conftest"
    ]
    assert offences == [], "move what is shared into tests/helpers/ (or a fixture into conftest.py):\n" + "\n".join(
        offences
    )


def test_no_helper_module_shadows_an_installed_module():
    ours = {TESTS, HELPERS, TESTS.parent}
    elsewhere = [p for p in sys.path if p and Path(p).resolve() not in ours]
    names = sorted(p.stem for p in HELPERS.glob("*.py") if p.stem != "__init__")
    shadowing = [
        name
        for name in names
        if name in sys.stdlib_module_names or importlib.machinery.PathFinder.find_spec(name, elsewhere) is not None
    ]
    assert shadowing == []
