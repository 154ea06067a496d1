"""The pipeline config and the jobs it starts: the Snakemake workflow's one Python entry point (the stages and
figures are :mod:`ue5m3.stages` and :mod:`ue5m3.figures`).

* :mod:`ue5m3.pipeline.sections`: the config as dataclasses, one section per stage;
* :mod:`ue5m3.pipeline.check`: :func:`load`, the config loaded and checked as a whole before any job;
* :mod:`ue5m3.pipeline.jobs`: each job's settings, as the rules pass them to the verbs;
* :mod:`ue5m3.pipeline.schema`: the JSON schema generated from the sections.
"""

from ue5m3.pipeline.check import check_files, load
from ue5m3.pipeline.sections import PipelineConfig

__all__ = ["PipelineConfig", "load", "check_files"]
