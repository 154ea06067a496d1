"""Packaging: the license, the citation file (the software and the paper), the changelog and the package metadata
agree with each other and with the package, and the license travels in the built metadata and sdist."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
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


def test_the_license_is_in_the_built_metadata_and_the_sdist(tmp_path):
    """Built in a copy with the installed setuptools (PEP 517 hooks, no network): metadata and sdist only."""
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} predates PEP 639 license expressions (77)")
    for name in ("pyproject.toml", "README.md", "LICENSE", "CITATION.cff", "CHANGELOG.md", "MANIFEST.in"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "src" / "ue5m3").mkdir(parents=True)
    (tmp_path / "src" / "ue5m3" / "__init__.py").write_text(f'__version__ = "{ue5m3.__version__}"\n')
    (tmp_path / "out").mkdir()
    hooks = "from setuptools import build_meta as b; m = b.prepare_metadata_for_build_wheel('out'); "
    hooks += "s = b.build_sdist('out'); print('built', m, s)"
    done = subprocess.run([sys.executable, "-c", hooks], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (built,) = [line for line in done.stdout.splitlines() if line.startswith("built ")]
    dist_info, sdist = built.split()[1:]
    metadata = (tmp_path / "out" / dist_info / "METADATA").read_text()
    assert "License-Expression: Apache-2.0" in metadata and "License-File: LICENSE" in metadata
    assert "Classifier: Intended Audience :: Science/Research" in metadata and "Author: " in metadata
    assert (tmp_path / "out" / dist_info / "licenses" / "LICENSE").is_file()
    with tarfile.open(tmp_path / "out" / sdist) as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {"LICENSE", "CITATION.cff", "CHANGELOG.md"} <= names
