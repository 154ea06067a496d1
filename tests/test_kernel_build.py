"""Building the C kernel (ue5m3.numerics.kernels.build): at install time by setup.py, a clear error without a
compiler, and the installed library used by first use when it fits."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ue5m3.numerics.kernels import build
from ue5m3.numerics.kernels import cpu as cpu_kernel

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "src" / "ue5m3" / "numerics" / "kernels" / "csrc"
needs_cc = pytest.mark.skipif(build.compiler() is None, reason="no C compiler")


@pytest.fixture
def fresh_load():
    cpu_kernel.load.cache_clear()
    yield
    cpu_kernel.load.cache_clear()


def test_the_key_covers_sources_compiler_and_cpu():
    sources = build.read_sources(CSRC)
    name = build.library_name(sources, "cc")
    assert name.startswith("ue5m3_kernels-") and name.endswith(".so")
    assert build.library_name(sources, "clang") != name
    changed = {**sources, "accumulate.c": sources["accumulate.c"] + b"\n"}
    assert build.library_name(changed, "cc") != name


@needs_cc
def test_first_use_takes_the_installed_library(tmp_path, monkeypatch, fresh_load):
    installed = build.install_library(CSRC, tmp_path / "lib")
    assert json.loads((tmp_path / "lib" / build.BUILD_RECORD).read_text())["library"] == installed.name
    monkeypatch.setattr(cpu_kernel, "_prebuilt_dir", lambda: tmp_path / "lib")
    monkeypatch.setenv("UE5M3_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))  # compiling now would fail: the installed one is used
    lib = cpu_kernel.load()
    assert lib._name == str(installed)
    assert not (tmp_path / "cache").exists()


def test_without_a_compiler_first_use_says_so(tmp_path, monkeypatch, fresh_load):
    monkeypatch.setattr(cpu_kernel, "_prebuilt_dir", lambda: tmp_path / "none")
    monkeypatch.setattr(build, "compiler", lambda: None)
    with pytest.raises(build.CompileError, match="no C compiler found .*install gcc"):
        cpu_kernel.load()
    assert not cpu_kernel.available()


def test_a_compiler_that_does_not_run_is_a_compile_error(tmp_path):
    with pytest.raises(build.CompileError, match="running the C compiler"):
        build.compile_library(build.read_sources(CSRC), str(tmp_path / "no-such-cc"), tmp_path)


def _setup_build(tmp_path, **env):
    """``setup.py build_py`` of a copy of the project (what pip runs), with ``env`` added."""
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "lib"))
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    command = [sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path / "out")]
    environ = {**os.environ, "UE5M3_CACHE": str(tmp_path / "cache"), **env}
    return subprocess.run(command, cwd=tree, env=environ, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@needs_cc
def test_the_install_builds_the_kernel_into_the_package(tmp_path):
    result = _setup_build(tmp_path)
    assert result.returncode == 0, result.stderr
    lib = tmp_path / "out" / "ue5m3" / "numerics" / "kernels" / "lib"
    record = json.loads((lib / build.BUILD_RECORD).read_text())
    assert (lib / record["library"]).is_file()
    assert record["library"] == build.library_name(build.read_sources(CSRC), record["compiler"])


def test_the_install_without_a_compiler_stops_with_a_clear_error(tmp_path):
    result = _setup_build(tmp_path, CC=str(tmp_path / "no-such-cc"))
    assert result.returncode != 0
    assert "building the fused C kernel failed" in result.stderr and "UE5M3_SKIP_KERNEL_BUILD=1" in result.stderr
    skipped = _setup_build(tmp_path / "skip", CC=str(tmp_path / "no-such-cc"), UE5M3_SKIP_KERNEL_BUILD="1")
    assert skipped.returncode == 0, skipped.stderr
