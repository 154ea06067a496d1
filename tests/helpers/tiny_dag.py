"""The whole DAG on the tiny `.test/` config, run with Snakemake as the README's user runs it.

``make test`` runs it fresh into ``.test/dag/`` (tests/test_tiny_dag.py: every stage, the notebooks' Run All, the
README's one-figure rebuild, the captions) and leaves it there; ``make test-cluster`` renders its Snakemake report
in a browser from the same directory (system_tests/test_report.py), after Snakemake has brought it up to date (a
rule reruns when its code, its config or the source hash of the package it calls changed since).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TINY_DAG = ROOT / ".test" / "dag"
CONFIG = ROOT / ".test" / "config.yaml"


def environment() -> dict[str, str]:
    """This interpreter's scripts first on PATH (ue5m3, papermill), as `make` puts the venv's."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def snakemake(work: Path, *args: str) -> None:
    command = ["snakemake", "--snakefile", str(ROOT / "Snakefile"), "--directory", str(work)]
    command += ["--configfile", str(CONFIG), *args]
    result = subprocess.run(command, cwd=work, env=environment(), capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"


def run(work: Path = TINY_DAG, *, fresh: bool) -> Path:
    """Every rule of the DAG in ``work``: from nothing when ``fresh``, else what is missing or out of date."""
    if fresh and work.exists():
        shutil.rmtree(work)
    if not (work / "config").is_dir():
        work.mkdir(parents=True, exist_ok=True)
        shutil.copytree(ROOT / "config", work / "config")
    snakemake(work, "--cores", "2", "--rerun-incomplete")
    return work
