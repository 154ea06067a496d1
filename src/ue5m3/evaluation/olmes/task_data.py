"""Reads a built task's docs from the file its YAML names relative to the task folder, so the folder can be moved.

This file is copied into every task folder as ``ue5m3_task_data.py`` (:data:`ue5m3.evaluation.olmes.tasks.LOADER`).
Each task's YAML names it as ``custom_dataset: !function ue5m3_task_data.load`` with ``dataset_kwargs: {data_file:
<name>.jsonl}``: lm-eval 0.4 resolves a ``!function`` module next to the YAML file first
(``lm_eval/tasks/_yaml_loader.py``) and calls ``custom_dataset(**metadata, **dataset_kwargs)``
(``lm_eval/api/task.py``, ``ConfigurableTask.download``), so the data path is found from this file's own place and
no absolute path is written anywhere. lm-eval's plain ``dataset_path: json`` cannot do that: ``datasets`` resolves a
relative ``data_files`` against the working directory. The docs are loaded exactly as ``dataset_path: json`` would
load them (``datasets.load_dataset("json", ...)``), so the requests and scores are the same.

Standard library and ``datasets`` only (a dependency of lm-eval): the folder works with lm-eval alone, without
ue5m3 installed (``lm_eval --model hf --include_path <folder> --tasks ue5m3_...``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["load"]


def load(*, data_file: str, **metadata: Any) -> Any:
    """The task's docs as a ``datasets.DatasetDict`` with one ``test`` split.

    Args:
        data_file: the docs (JSON lines), relative to the folder this file is in.
        metadata: the task's ``metadata`` (its version; unused).
    """
    import datasets

    path = Path(__file__).resolve().parent / data_file
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the docs of this task are missing from its folder {path.parent}")
    return datasets.load_dataset("json", data_files={"test": str(path)})
