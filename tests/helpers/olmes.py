"""Helpers of the downstream evaluation tests (tests/test_olmes_*.py, test_downstream.py, test_lm_eval_adapter.py):
the skip mark for machines without the OLMES task data, the docs a built task holds, and a tiny local copy of
lm-eval's leaderboard_mmlu_pro (the ``local_mmlu_pro`` fixture of tests/conftest.py builds it per test)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from ue5m3.evaluation import olmes
from ue5m3.evaluation.olmes import taskdata

HAVE_WHEEL = taskdata.available()
needs_wheel = pytest.mark.skipif(not HAVE_WHEEL, reason=f"no OLMES task data (run `{olmes.INSTALL_HINT}`)")

# Docs per task of the Core 9 task folders the tests build (test_olmes_tasks's fixture and test_olmes_run's).
DOCS_PER_TASK = 3


def read_docs(task_dir: Path, name: str) -> list[dict]:
    """The docs of built task ``name`` in ``task_dir``, in order."""
    return [json.loads(line) for line in (task_dir / f"{name}.jsonl").read_text().splitlines()]


def lm_eval_mmlu_pro_dir() -> Path:
    """lm-eval's own leaderboard_mmlu_pro task folder."""
    return (
        Path(next(iter(importlib.util.find_spec("lm_eval").submodule_search_locations))) / "tasks/leaderboard/mmlu_pro"
    )


MMLU_PRO_COLUMNS = ("question_id", "question", "options", "answer", "answer_index", "cot_content", "category", "src")


def make_local_mmlu_pro(tmp_path):
    """lm-eval's leaderboard_mmlu_pro config, copied verbatim but for its dataset: a tiny local MMLU-Pro in JSON
    under ``tmp_path / "mmlu_pro"``; returns a TaskManager reading it and the rows.

    The validation split's first five rows (the shots) are of categories math and law; the test rows, of math, law
    and biology, have 3 to 10 options.
    """
    import re
    import shutil

    from lm_eval.tasks import TaskManager

    src = lm_eval_mmlu_pro_dir()
    task_dir = tmp_path / "mmlu_pro"
    task_dir.mkdir()
    shutil.copy(src / "utils.py", task_dir / "utils.py")
    splits = {"validation": 7, "test": 4}
    rows = {}
    for split, count in splits.items():
        rows[split] = []
        for i in range(count):
            k = (3, 10, 4, 5, 7)[i % 5]
            gold = (i * 3) % k
            options = [f"{split[0]}{i}-{j}" for j in range(k)]
            row = dict.fromkeys(MMLU_PRO_COLUMNS)
            row.update(
                question_id=i,
                question=f"{split[0]}q{i}?",
                options=options,
                answer="ABCDEFGHIJ"[gold],
                answer_index=gold,
                cot_content="",
                category=("math", "law", "biology")[i % 3] if split == "test" else ("math", "law")[i % 2],
                src=f"fixture-{split}",
            )
            rows[split].append(row)
        (task_dir / f"{split}.json").write_text("".join(json.dumps(r) + "\n" for r in rows[split]))
    config = (src / "mmlu_pro.yaml").read_text()
    local = "dataset_path: json\ndataset_kwargs:\n  data_files:\n" + "".join(
        f"    {split}: {json.dumps(str(task_dir / f'{split}.json'))}\n" for split in splits
    )
    config, count = re.subn(r"^dataset_path: .*\n", local, config, flags=re.M)
    assert count == 1 and "TIGER-Lab/MMLU-Pro" not in config
    (task_dir / "mmlu_pro.yaml").write_text(config)
    return TaskManager(include_path=str(task_dir), include_defaults=False), rows
