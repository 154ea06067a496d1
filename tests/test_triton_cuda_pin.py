"""The kernels' own tests under the Triton that PyPI's CUDA torch 2.13.0 pins (3.7.1), beside the CPU lock's 3.9.0.

A CUDA user's environment has 3.7.1; this suite's has 3.9.0. `make` installs 3.7.1 into
``.venv/share/ue5m3/triton-3.7.1`` (``pip install --no-deps --target``, outside site-packages, so nothing else sees
it), and this test runs the kernel tests again in a child whose PYTHONPATH puts it first: the interpreter bits of
every kernel (GEMM, quantize, pack) and the compile checks against the 3.7.1 record (registers, stack, MMAs, FP64).
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ue5m3.numerics.kernels.launch import TESTED_TRITON

pytest.importorskip("triton", reason="triton is not installed (the GPU extra)")

pytestmark = [pytest.mark.triton, pytest.mark.slow]

CUDA_PIN = "3.7.1"
PINNED = Path(sys.prefix) / "share" / "ue5m3" / f"triton-{CUDA_PIN}"
TESTS = Path(__file__).resolve().parent
KERNEL_TESTS = (
    "test_triton_gemm.py",
    "test_triton_quantize.py",
    "test_triton_pack.py",
    "test_triton_versions.py",
    "test_triton_compile.py",
)


def _pinned_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PINNED), env.get("PYTHONPATH", "")) if p)
    env["TRITON_INTERPRET"] = "1"
    return env


def _require_pinned() -> None:
    if (PINNED / "triton").is_dir():
        return
    message = (
        f"triton {CUDA_PIN} is not installed in {PINNED} "
        f"(make does it: pip install --no-deps --target {PINNED} triton=={CUDA_PIN})"
    )
    if (Path(sys.prefix) / ".installed").exists():
        pytest.fail(message + "; this venv was built by make, so its install step is broken")
    pytest.skip(message)


def test_the_cuda_pin_is_one_of_the_tested_versions():
    assert CUDA_PIN in TESTED_TRITON


def test_the_kernel_tests_pass_under_the_triton_the_cuda_torch_wheel_pins(tmp_path):
    _require_pinned()
    env = _pinned_env()
    seen = subprocess.run(
        [sys.executable, "-c", "import triton; print(triton.__version__, triton.__file__)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert seen.returncode == 0, seen.stderr[-3000:]
    version, location = seen.stdout.split()
    assert version == CUDA_PIN and Path(location).is_relative_to(PINNED), seen.stdout

    report = tmp_path / "junit.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"]
    command += ["--rootdir", str(TESTS.parent), *(str(TESTS / name) for name in KERNEL_TESTS)]
    result = subprocess.run(command, cwd=TESTS.parent, env=env, capture_output=True, text=True, timeout=3000)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"

    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    # every kernel test ran under 3.7.1: a skip (a missing record, a version refused) would hide a gap
    assert counts["failures"] == counts["errors"] == counts["skipped"] == 0, (counts, result.stdout[-3000:])
    assert counts["tests"] >= 40, counts
