"""Packaging: the license, the citation file (the software and the paper), the changelog and the package metadata
agree with each other and with the package; the wheel built as users build it is pure Python, as its
``py3-none-any`` tag says (the C kernel ships as sources and compiles on first use), carries the license, installs
and runs from a folder of its own, and building leaves nothing in the checkout."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import types
import zipfile
from pathlib import Path

import pytest
import yaml

import ue5m3

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
CFF_REQUIRED = {"cff-version", "message", "title", "authors"}  # CFF 1.2.0's required keys


def test_the_package_version_is_the_pyproject_version():
    assert ue5m3.__version__ == PYPROJECT["version"]


def test_citation_cff_cites_the_software_at_its_version_and_prefers_the_paper():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert CFF_REQUIRED <= set(cff) and cff["cff-version"] == "1.2.0"
    assert cff["type"] == "software" and cff["title"] == "ue5m3"
    assert cff["version"] == PYPROJECT["version"]  # a string, not a YAML float
    assert cff["license"] == PYPROJECT["license"]
    assert all(author.get("name") or author.get("family-names") for author in cff["authors"])
    paper = cff["preferred-citation"]
    assert paper["title"] == "UE5M3 FP4 Block Scaling for Stable Language Model Pretraining"
    assert [a["family-names"] for a in paper["authors"]] == ["Hu", "Luschi", "Balanca"]
    assert paper["year"] == 2026 and {"type", "title", "authors"} <= set(paper)
    assert {"type": "other", "value": "arXiv:2609.02846"}.items() <= paper["identifiers"][0].items()


def test_pyproject_declares_license_authors_classifiers_keywords_and_readme():
    assert PYPROJECT["license"] == "Apache-2.0" and PYPROJECT["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()
    assert PYPROJECT["authors"] and all(a.get("name") for a in PYPROJECT["authors"])
    assert PYPROJECT["classifiers"] and PYPROJECT["keywords"]
    # with an SPDX license expression (PEP 639), a License :: classifier is an error
    assert not [c for c in PYPROJECT["classifiers"] if c.startswith("License ::")]
    assert (ROOT / PYPROJECT["readme"]).is_file()


def test_the_changelog_keeps_a_changelog_with_an_unreleased_section():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog") and "## [Unreleased]" in text
    assert re.search(r"^### (Added|Changed|Fixed)$", text, re.M)


# ----- the built distributions ------------------------------------------------------------------------------------

LIBRARY_SUFFIXES = (".so", ".pyd", ".dll", ".dylib")


def _tree(root: Path) -> set[str]:
    """Every file and folder under ``root``, relative to it."""
    return {str(p.relative_to(root)) + ("/" if p.is_dir() else "") for p in root.rglob("*")}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A copy of the checkout as a clean clone holds it (git's tracked and not-ignored files), built as users do:
    ``pip wheel .``, ``pip install .`` (into a target folder) and the sdist; with the installed backend, offline
    (no build isolation). Returns the copy, its file tree before the builds, the wheel, the sdist and the target."""
    pytest.importorskip("hatchling")
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the clean-clone file list comes from git")
    root = tmp_path_factory.mktemp("packaging")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    tree = root / "ue5m3"
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():  # an index entry deleted in the work tree is not in a clone of the work
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, tree / name)
    before = _tree(tree)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-cache-dir"]
    offline = ["--no-build-isolation", "--no-deps", "--no-index"]
    for command in (
        [*pip, "wheel", *offline, "-q", ".", "-w", str(root / "wheels")],
        [*pip, "install", *offline, "-q", "--target", str(root / "target"), "."],
        [sys.executable, "-c", f"from hatchling.build import build_sdist; print(build_sdist({str(root / 'sdist')!r}))"],
    ):
        done = subprocess.run(command, cwd=tree, capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = (root / "wheels").glob("*.whl")
    (sdist,) = (root / "sdist").glob("*.tar.gz")
    return types.SimpleNamespace(tree=tree, before=before, wheel=wheel, sdist=sdist, target=root / "target")


def test_building_and_installing_leave_no_debris_in_the_checkout(built):
    assert _tree(built.tree) == built.before  # no build/, no *.egg-info, no compiled kernel


def test_the_wheel_is_pure_python_as_its_tag_says_and_ships_the_kernel_sources(built):
    assert built.wheel.name == f"ue5m3-{ue5m3.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(built.wheel) as wheel:
        names = wheel.namelist()
        info = wheel.read(f"ue5m3-{ue5m3.__version__}.dist-info/WHEEL").decode()
    assert "Root-Is-Purelib: true" in info and "Tag: py3-none-any" in info
    assert not [n for n in names if n.endswith(LIBRARY_SUFFIXES)]
    kernels = "ue5m3/numerics/kernels/csrc/"
    assert {f"{kernels}{n}" for n in ("block_quantize.c", "accumulate.c", "philox.h")} <= set(names)
    assert "ue5m3/layers/recipe_files/bf16.yaml" in names and "ue5m3/reference_data/SHA256SUMS" in names
    assert not [n for n in names if "__pycache__" in n or n.startswith(("tests/", "src/"))]


def test_the_license_is_in_the_built_metadata_and_the_sdist(built):
    with zipfile.ZipFile(built.wheel) as wheel:
        dist_info = f"ue5m3-{ue5m3.__version__}.dist-info"
        metadata = wheel.read(f"{dist_info}/METADATA").decode()
        assert "Apache License" in wheel.read(f"{dist_info}/licenses/LICENSE").decode()
    assert "License-Expression: Apache-2.0" in metadata and "License-File: LICENSE" in metadata
    assert "Classifier: Intended Audience :: Science/Research" in metadata and "Author: " in metadata
    with tarfile.open(built.sdist) as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {"LICENSE", "CITATION.cff", "CHANGELOG.md", "pyproject.toml", "block_quantize.c"} <= names
    assert not [n for n in names if n.endswith(LIBRARY_SUFFIXES)]


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
def test_the_installed_wheel_imports_and_compiles_the_kernel_on_first_use(built, tmp_path):
    """Installed by ``pip install .`` into a folder of its own (no ue5m3 elsewhere on its path before it), the
    package imports from there, ships no library, and its first kernel use compiles one into the cache."""
    script = (
        "import ue5m3, torch\n"
        "from ue5m3.numerics.kernels import cpu\n"
        "from ue5m3.numerics.quantize import quantize\n"
        "x = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))\n"
        "a, b = (quantize(x, 'ue5m3_b16', backend=k).dequantize() for k in ('cpu_kernel', 'torch'))\n"
        "assert torch.equal(a.view(torch.int32), b.view(torch.int32))\n"
        "print(ue5m3.__file__)\n"
        "print(cpu.load()._name)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(built.target), "UE5M3_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    module, library = done.stdout.split()
    assert Path(module).is_relative_to(built.target)
    assert Path(library).parent == tmp_path / "cache" and Path(library).name.startswith("ue5m3_kernels-native-")
    assert not [p for p in built.target.rglob("*") if p.name.endswith(LIBRARY_SUFFIXES)]
