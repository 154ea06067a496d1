"""Helpers for all rule files (config validation and path builders).

All Python logic of the workflow lives here (style guide rule 10); rule files only call these helpers.
"""

from pathlib import Path

from snakemake.utils import validate

validate(config, "../schemas/config.schema.yaml")

RESULTS_DIR = Path(config["results_dir"])
FIGURES_DIR = Path(config["figures_dir"])
LOGS_DIR = Path("logs")


def result_path(*parts):
    """A path under the configured results directory."""
    return str(RESULTS_DIR.joinpath(*parts))


def figure_path(name):
    """A path under the configured figures directory."""
    return str(FIGURES_DIR / name)


def log_path(*parts):
    """A path under logs/ (one log per rule, and executed notebooks)."""
    return str(LOGS_DIR.joinpath(*parts))


def all_figures():
    """Every final figure: the inputs of `rule all`. Add each new figure rule here."""
    return [*rules.range_figures.output, *rules.accumulation_figures.output]
