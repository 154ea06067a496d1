"""What every comparison table shares: the record form of JSON results, the reference tables keyed by recipe and
the baseline recipe."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import pandas as pd

__all__ = ["Record", "BASELINE", "reference_by_recipe"]

Record = tuple[str | os.PathLike[str], Mapping[str, Any]]
"""A JSON result as ``(path, parsed record)``; some tables read identity (recipe, seed, name) off the path."""

BASELINE = "bf16"
"""The recipe every gap and percent is measured against."""


def reference_by_recipe(paper: pd.DataFrame) -> pd.DataFrame:
    """A reference table keyed by this project's recipe names (the reference files call the column config)."""
    return paper.rename(columns={"config": "recipe"})
