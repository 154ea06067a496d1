"""Every setting written once (ue5m3.pipeline.sections): one dataclass field per config leaf, defaults only in
dataclasses, the schema generated from them, and rules that hand their verbs one --config and paths.

* the committed ``workflow/schemas/config.schema.yaml`` is :func:`ue5m3.pipeline.schema.render`'s output;
* every leaf of ``config/config.yaml`` and of ``config/paper.yaml`` (merged over it, as Snakemake merges
  ``--configfile``) sets exactly one dataclass field;
* no CLI option carries a default of its own, and no setting's default is written in two dataclasses;
* a section that restates a job's settings (the training runs, the throughput runs) declares them with the job
  dataclass's types and without defaults of its own;
* every shell rule passes ``--config``, paths and the wildcards that name its job, and nothing else.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from snakemake.utils import update_config

from ue5m3 import cli, config, pipeline
from ue5m3.pipeline import schema, sections

ROOT = Path(__file__).resolve().parents[1]


def _merged(*names: str) -> dict:
    merged: dict = {}
    for name in names:
        update_config(merged, config.read_yaml(ROOT / "config" / name))
    return merged


CONFIGS = {"cpu": _merged("config.yaml"), "paper": _merged("config.yaml", "paper.yaml")}


def test_the_committed_schema_is_generated_from_the_sections():
    path = "workflow/schemas/config.schema.yaml"
    assert (ROOT / path).read_text() == schema.render(), f"{path} is stale: python -m ue5m3.pipeline.schema {path}"


def _dataclass_of(tp: Any) -> type | None:
    """The dataclass an annotation holds (``X``, ``X | None``), or None."""
    if dataclasses.is_dataclass(tp):
        return tp
    return next((a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)), None)


def _leaves(value: Any, tp: Any, path: str, found: dict[str, tuple[str, str]], owner: tuple[str, str] | None) -> None:
    """Walk ``value`` down its annotation ``tp``, recording each leaf's path and the field (class, name) it sets."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (dict, Mapping) and args and _dataclass_of(args[1]) is not None and isinstance(value, Mapping):
        for key, item in value.items():  # a mapping of named entries (corpora, fits, parity, throughput runs)
            _leaves(item, args[1], f"{path}.{key}", found, owner)
        return
    cls = _dataclass_of(tp)
    if cls is not None and isinstance(value, Mapping):
        types = config.field_types(cls)
        for key, item in value.items():
            assert key in types, f"{path}.{key}: no field {key!r} in {cls.__name__}"
            _leaves(item, types[key], f"{path}.{key}".lstrip("."), found, (cls.__name__, key))
        return
    assert owner is not None, f"{path}: sets no dataclass field"
    found[path] = owner


@pytest.mark.parametrize("which", sorted(CONFIGS))
def test_every_leaf_of_the_shipped_configs_sets_one_dataclass_field(which):
    found: dict[str, tuple[str, str]] = {}
    _leaves(CONFIGS[which], sections.PipelineConfig, "", found, None)
    assert len(found) > 100 and found["evaluation.nll.bootstrap_samples"] == ("NllConfig", "bootstrap_samples")
    assert found["training.summary.final_window"] == ("SummaryConfig", "final_window")
    assert found["identification.fits.synthetic_probe_matched.oracle"] == ("FitEntry", "oracle")
    pipeline.load(CONFIGS[which], source=which)  # and each one is a value the field accepts


def _verbs() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_no_cli_option_carries_a_default_of_its_own():
    """A verb's settings come from its --config; its options are paths, the job's name and switches."""
    for verb, parser in _verbs().items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._StoreTrueAction | argparse._StoreFalseAction):
                continue
            assert action.default in (None, argparse.SUPPRESS, []), (
                f"ue5m3 {verb} {'/'.join(action.option_strings) or action.dest} has its own default "
                f"{action.default!r}: move the setting into the verb's config dataclass"
            )


# Each verb's library entry point takes its config object: a keyword parameter of the same name as a config field
# (with a default of its own) would be a second home for that setting.
ENTRY_POINTS = [
    ("ue5m3.evaluation.nll", "run_nll", "NllConfig"),
    ("ue5m3.evaluation.snapshot", "run_snapshot", "SnapshotConfig"),
    ("ue5m3.evaluation.olmes.run", "evaluate_run", "DownstreamConfig"),
    ("ue5m3.experiments.training_summary", "run", "SummaryConfig"),
    ("ue5m3.identify.run", "fit_emulator", "CandidateGrid"),
    ("ue5m3.identify.run", "write_corpus", "ProbesConfig"),
    ("ue5m3.identify.parity", "run", "ParityConfig"),
]


def _config_class(module: Any, name: str) -> type:
    import ue5m3.identify.candidates as candidates

    return getattr(module, name, None) or getattr(candidates, name)


@pytest.mark.parametrize(("module", "function", "cls"), ENTRY_POINTS, ids=[f"{m}.{f}" for m, f, _ in ENTRY_POINTS])
def test_a_verbs_settings_reach_its_entry_point_only_through_its_config(module, function, cls):
    import importlib
    import inspect

    loaded = importlib.import_module(module)
    fields = {f.name for f in dataclasses.fields(_config_class(loaded, cls))}
    parameters = inspect.signature(getattr(loaded, function)).parameters
    restated = sorted(n for n, p in parameters.items() if n in fields and p.default is not inspect.Parameter.empty)
    assert not restated, f"{module}.{function} takes {restated} with defaults of its own; they live in {cls}"


def test_the_rules_write_no_setting_of_their_own():
    """Rule files hold paths, names and helpers: no number or list of values that a config section should hold."""
    for smk in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        # docstrings blanked line for line, so that the numbers still point at the file's lines
        text = re.sub(r'"""(.*?)"""', lambda m: "\n" * m.group(0).count("\n"), smk.read_text(), flags=re.S)
        for number, line in enumerate(text.splitlines(), start=1):
            code = line.split("#", 1)[0]
            literal = re.search(r"(?<![\w.{\\\[])(\d+\.\d+|\d{2,})(?![\w}])", code)
            assert literal is None or "gpu:" in code, f"{smk.name}:{number}: {line.strip()!r} writes a setting"


MIRRORS = [
    (sections.TrainingSection, "ue5m3.training.config.TrainConfig", ("model", "model_overrides", *sections.RUN_KEYS)),
    (sections.ControlSection, "ue5m3.training.config.TrainConfig", ("model", "model_overrides", *sections.RUN_KEYS)),
    (
        sections.ThroughputSection,
        "ue5m3.experiments.throughput.ThroughputConfig",
        ("model", "model_overrides", "batch_size", "sequence_length", "warmup_steps", "measured_steps", "seed"),
    ),
    (sections.ThroughputRun, "ue5m3.experiments.throughput.ThroughputConfig", ("execution", "device", "recipes")),
]


@pytest.mark.parametrize(("section", "job", "keys"), MIRRORS, ids=[m[0].__name__ for m in MIRRORS])
def test_a_section_restating_a_jobs_settings_uses_its_types_and_no_defaults(section, job, keys):
    import importlib

    module, _, name = job.rpartition(".")
    job_cls = getattr(importlib.import_module(module), name)
    ours, theirs = config.field_types(section), config.field_types(job_cls)
    fields = {f.name: f for f in dataclasses.fields(section)}
    for key in keys:
        assert ours[key] == theirs[key], (
            f"{section.__name__}.{key} is {ours[key]}, {job_cls.__name__}.{key} {theirs[key]}"
        )
        assert not config.has_default(fields[key]), f"{section.__name__}.{key}: the default lives in {job_cls.__name__}"


# --- the rules -----------------------------------------------------------------------------------------

PATH_PARAMS = {"run_dir", "out_dir", "tasks_dir", "runs", "witness_run", "staging_dir"}


def _shell_commands() -> dict[str, str]:
    commands = {}
    for smk in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        text = smk.read_text()
        for match in re.finditer(r"^(?:rule|    rule) (\w+):(.*?)(?=^\S|^    rule |\Z)", text, re.S | re.M):
            shell = re.search(r'shell:\s*\n\s*"(.*?)"\n', match.group(2), re.S)
            if shell:
                commands[match.group(1)] = shell.group(1)
    return commands


def test_every_shell_rule_passes_its_config_paths_and_wildcards_only():
    commands = _shell_commands()
    assert len(commands) >= 17, sorted(commands)
    for rule, command in commands.items():
        command = command.split(">", 1)[0]  # the log redirection
        for option, value in re.findall(r"(--[\w-]+)(?:\s+(\S+))?", command):
            if option == "--config":
                assert value in ("{params.config:q}", "{params.settings:q}", "{input.config}"), (rule, value)
                continue
            assert value is not None and value.startswith("{"), f"rule {rule}: {option} {value!r} is not a path"
            name = value.strip("{}").split(":")[0]
            section, _, key = name.partition(".")
            ok = section in ("input", "output", "log", "wildcards") or (section == "params" and key in PATH_PARAMS)
            assert ok, f"rule {rule}: {option} {value} is a setting: pass it in the verb's --config"
