"""The JSON schema of the pipeline config, generated from :class:`~ue5m3.pipeline.sections.PipelineConfig`.

``workflow/schemas/config.schema.yaml`` is this module's output, committed so that Snakemake validates a config
before the package is imported (``tests/test_pipeline_schema.py`` fails when it is stale). Each property carries
its field's documentation. Regenerate it after changing a section::

    python -m ue5m3.pipeline.schema workflow/schemas/config.schema.yaml
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from ue5m3 import config
from ue5m3.pipeline.sections import PipelineConfig

__all__ = ["pipeline_schema", "render", "main"]

HEADER = (
    "# JSON schema (written in YAML) of config/*.yaml, generated from ue5m3.pipeline.sections.PipelineConfig: do not\n"
    "# edit. Regenerate with `python -m ue5m3.pipeline.schema workflow/schemas/config.schema.yaml`.\n"
)


def pipeline_schema() -> dict[str, Any]:
    """The schema: what the strict loader accepts, as types and keys, with each field's documentation."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "description": "ue5m3 pipeline configuration (ue5m3.pipeline.sections.PipelineConfig)",
        **config.schema(PipelineConfig),
    }


def render() -> str:
    """The schema file's text."""
    return HEADER + yaml.safe_dump(pipeline_schema(), sort_keys=False, width=118, allow_unicode=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m ue5m3.pipeline.schema OUT.yaml", file=sys.stderr)
        return 2
    Path(args[0]).write_text(render(), encoding="utf-8")
    print(f"wrote {args[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
