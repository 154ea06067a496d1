"""The pipeline config loaded and checked as a whole, before any job starts.

The Snakemake schema (generated from :mod:`ue5m3.pipeline.sections`) checks each key's type; Snakemake's YAML
reader keeps the last of two duplicate keys. :func:`load` does what neither can, at the Snakefile's first line of
Python:

* duplicate keys, in every config file given (:func:`check_files`);
* every section through the strict loader of its dataclass, so each stage's own checks run (range analysis,
  accumulation, data, candidate grids, corpora, oracle specs, parity backends, grid control, ...);
* the hub files of the data path are pinned: ``tokenizer_source`` has a ``data.tokenizer_path`` to write to and
  every ``hf://`` data URI names a commit;
* every job the DAG will start, built exactly as the rules build it (:mod:`ue5m3.pipeline.jobs`), through its
  verb's loader: each training and parity run's :class:`~ue5m3.training.config.TrainConfig` (models, overrides,
  recipes, optimizer, seeds), each throughput run's config;
* the ranges of the settings a section restates for its jobs (a training section's ``steps`` is its runs'
  ``steps``, :data:`RESTATED`), each under the section's key, before any job is built from them;
* cross-references: each trained recipe has an inference policy, the sensitivity, snapshot and downstream recipes
  are known, evaluated steps are checkpoints the runs keep, the control's overridden layers exist, the witness
  names a run and a module of its model and asks for no more validation windows than the data hold, the summaries'
  windows fit the runs' logs, the downstream task names exist, each parity backend fits its run's recipe, and every
  job that needs a GPU names its partition.

Every problem is reported at once, each with its key path, in one :class:`ue5m3.config.ConfigError` naming the
files.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ue5m3 import config
from ue5m3.pipeline import jobs
from ue5m3.pipeline.sections import PipelineConfig

__all__ = ["load", "check_files", "restated"]


def check_files(paths: Iterable[str | os.PathLike[str]]) -> None:
    """Parse each config file strictly (duplicate keys refused, naming the file and both lines)."""
    for path in paths:
        config.read_yaml(path)


class _Problems:
    def __init__(self, source: str) -> None:
        self.source = source
        self.items: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.items.append(f"{path}: {message}")

    def attempt(self, path: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, its error recorded under ``path`` (the strict loaders' messages carry their own key paths)."""
        try:
            return fn()
        except (config.ConfigError, ValueError, TypeError, FileNotFoundError) as exc:
            message = str(exc).removeprefix(f"{self.source}: ")  # the loaders name the source; the list names it once
            self.items.append(f"{path}: {message}" if path else message)
            return None

    def raise_if_any(self) -> None:
        if self.items:
            listed = "\n  ".join(self.items)
            raise config.ConfigError(f"{self.source}: {len(self.items)} problem(s), nothing was started:\n  {listed}")


def load(data: Mapping[str, Any], *, source: str = "<pipeline config>") -> PipelineConfig:
    """The pipeline config from plain data (a merged YAML mapping), checked as a whole (module docstring): first
    every section's structure (all sections' problems together), then, once each section loads, every job and
    cross-reference (all their problems together).

    Raises:
        ConfigError: listing every problem with its key path, naming ``source``.
    """
    problems = _Problems(source)
    if not isinstance(data, Mapping):
        raise config.ConfigTypeError(f"{source}: expected a mapping, got {type(data).__name__}")
    sections = _load_sections(data, source, problems)
    problems.raise_if_any()
    cfg = problems.attempt("", lambda: PipelineConfig(**sections))
    problems.raise_if_any()
    _check_restated_ranges(cfg, problems)
    problems.raise_if_any()  # a run of 2^64 steps is refused before anything counts its checkpoints
    _check_jobs(cfg, problems)
    problems.raise_if_any()
    return cfg


def restated() -> dict[type, dict[str, tuple[type, str]]]:
    """The settings a section restates for its jobs: section class -> {field: (job dataclass, job field)}. Such a
    field's default and range live in the job's dataclass; the section holds the value (its range is checked here,
    under the section's key)."""
    from ue5m3.data import DataConfig
    from ue5m3.experiments.throughput import ThroughputConfig
    from ue5m3.pipeline import sections
    from ue5m3.training.config import TrainConfig

    runs = {key: (TrainConfig, key) for key in sections.RUN_KEYS if key != "optim"}
    shared = [
        f.name for f in dataclasses.fields(sections.ThroughputSection) if f.name in config.ranges(ThroughputConfig)
    ]
    return {
        sections.TrainingSection: {**runs, "seeds": (TrainConfig, "seed")},
        sections.ControlSection: {**runs, "seeds": (TrainConfig, "seed")},
        sections.EvaluationSection: {"steps": (TrainConfig, "steps")},
        sections.WitnessEntry: {"seed": (TrainConfig, "seed")},
        sections.ParityEntry: {"sequence_length": (DataConfig, "sequence_length")},
        sections.ThroughputSection: {name: (ThroughputConfig, name) for name in shared},
    }


def _sections_with_paths(value: Any, path: str) -> Iterable[tuple[str, Any]]:
    """(key path, dataclass instance) of every section inside ``value``, ``value`` itself included."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        yield path, value
        for f in dataclasses.fields(value):
            yield from _sections_with_paths(getattr(value, f.name), f"{path}.{f.name}" if path else f.name)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _sections_with_paths(item, f"{path}.{key}")


def _check_restated_ranges(cfg: PipelineConfig, problems: _Problems) -> None:
    table = restated()
    for path, section in _sections_with_paths(cfg, ""):
        for name, (job, key) in table.get(type(section), {}).items():
            label = f"{path}.{name}" if path else name
            problems.items.extend(config.outside(config.ranges(job)[key], getattr(section, name), label))


def _load_sections(data: Mapping[str, Any], source: str, problems: _Problems) -> dict[str, Any]:
    """Each top-level section through its dataclass's strict loader, every section's problems collected."""
    fields = {f.name: f for f in dataclasses.fields(PipelineConfig)}
    types = config.field_types(PipelineConfig)
    unknown = sorted(set(data) - set(fields))
    if unknown:
        problems.add("<root>", f"unknown keys {unknown}; expected {list(fields)}")
    sections = {}
    for name, value in data.items():
        if name in fields:
            loaded = problems.attempt(
                "", lambda name=name, value=value: config.load_as(types[name], value, source=source, path=name)
            )
            sections[name] = loaded
    missing = [n for n, f in fields.items() if n not in data and not config.has_default(f)]
    if missing:
        problems.add("<root>", f"missing keys {missing}")
    return sections


def _check_jobs(cfg: PipelineConfig, problems: _Problems) -> None:
    try:
        jobs.launcher(cfg.launcher, {})
    except (KeyError, IndexError, ValueError) as exc:
        problems.add(
            "launcher", f"unknown placeholder {exc} in {cfg.launcher!r}; accepted: {list(jobs.LAUNCHER_FIELDS)}"
        )
    _check_hub_pins(cfg, problems)
    _check_runs(cfg, problems)
    _check_control_override(cfg, problems)
    _check_evaluation(cfg, problems)
    _check_windows(cfg, problems)
    _check_downstream_tasks(cfg, problems)
    _check_identification(cfg, problems)
    _check_parity_backends(cfg, problems)
    _check_throughput(cfg, problems)
    _check_placement(cfg, problems)


def _check_placement(cfg: PipelineConfig, problems: _Problems) -> None:
    """Every GPU job names a partition whose GPU types the plan knows (``plan.partitions``), and a section's world
    size divides its global batch, before the plan or any job runs."""
    from ue5m3.training.config import TrainConfig

    known = sorted(cfg.plan.partitions)
    wanted = [("training", cfg.training), ("control", cfg.control)]
    for key, section in wanted:
        if not section.gpus_per_node:
            continue
        partitions = [("partition", section.partition)]
        if key == "training" and any(e == "native_te" for e in cfg.training.execution.values()):
            partitions.append(("native_partition", cfg.training.native_partition))
        for field_name, partition in partitions:
            if partition is None:
                problems.add(f"{key}.{field_name}", "GPU runs (gpus_per_node > 0) need the partition of their GPUs")
            elif partition not in cfg.plan.partitions:
                problems.add(
                    f"{key}.{field_name}",
                    f"partition {partition!r} is not in plan.partitions ({known}): name the GPU types it may hold, "
                    "so the plan can check the runs against them",
                )
        # the trainer's own rule (TrainConfig.accumulation_for) on the section's world size, before any job starts
        group, variant = (
            ("main", cfg.training.recipes[0]) if key == "training" else ("control", jobs.CONTROL_VARIANTS[0])
        )
        settings = jobs.run_settings(cfg, group, variant, section.seeds[0])
        problems.attempt(
            key,
            lambda settings=settings, world=section.world_size: TrainConfig.from_dict(
                settings, source="its run"
            ).accumulation_for(world),
        )
    if cfg.evaluation.gpus and cfg.evaluation.partition is None:
        problems.add(
            "evaluation.partition", "evaluations on a GPU (evaluation.gpus 1) need the partition of their GPUs"
        )
    elif cfg.evaluation.gpus and cfg.evaluation.partition not in cfg.plan.partitions:
        problems.add(
            "evaluation.partition",
            f"partition {cfg.evaluation.partition!r} is not in plan.partitions ({known})",
        )
    for name, run in cfg.throughput.runs.items():
        if run.on_gpu and run.partition and run.partition not in cfg.plan.partitions:
            problems.add(
                f"throughput.runs.{name}.partition", f"partition {run.partition!r} is not in plan.partitions ({known})"
            )


def _check_hub_pins(cfg: PipelineConfig, problems: _Problems) -> None:
    """The hub files of the data path are pinned: the tokenizer source has a file to go to, and every ``hf://``
    data URI names a commit."""
    from ue5m3.data.hub import unpinned_hub_uris

    if cfg.tokenizer_source is not None and cfg.data.tokenizer_path is None:
        problems.add(
            "data.tokenizer_path",
            "tokenizer_source is set, so rule fetch_tokenizer needs a path to write the file to; set "
            "data.tokenizer_path (e.g. tokenizers/<name>/tokenizer.json)",
        )
    for key in ("stream_a_files", "stream_b_files"):
        for i, uri in enumerate(getattr(cfg.data, key)):
            if unpinned_hub_uris([uri]):
                problems.add(
                    f"data.{key}[{i}]",
                    f"{uri!r} names no commit; pin the dataset revision as "
                    "hf://datasets/<owner>/<name>@<40-digit commit>/<path> (docs/data.md)",
                )


def _check_runs(cfg: PipelineConfig, problems: _Problems) -> None:
    """Every run the DAG starts (one seed each: the seed changes nothing a check could see), through the trainer's
    loader."""
    from ue5m3.training.config import TrainConfig

    for group, section, variants in (
        ("main", cfg.training, cfg.training.recipes),
        ("control", cfg.control, jobs.CONTROL_VARIANTS),
    ):
        for i, variant in enumerate(variants):
            path = f"training.recipes[{i}]" if group == "main" else f"control ({variant})"
            settings = jobs.run_settings(cfg, group, variant, section.seeds[0])
            problems.attempt(path, lambda settings=settings: TrainConfig.from_dict(settings, source="its run"))


def _model_linears(model: str, overrides: Mapping[str, Any]) -> tuple[list[str], list[str]] | None:
    """(every module name, every eligible linear) of a model built on the meta device; None when it cannot be."""
    from ue5m3 import models

    try:
        built = models.build(model, device="meta", **overrides)
    except (ValueError, TypeError):
        return None  # reported by the run check
    return [name for name, _ in built.named_modules()], models.eligible_linears(built)


def _check_control_override(cfg: PipelineConfig, problems: _Problems) -> None:
    from ue5m3.layers.linear import layer_index

    control = cfg.control
    found = _model_linears(control.model, control.model_overrides)
    override = control.override
    if found is None:
        return
    _, linears = found
    pattern = override.get("module", "*")
    layers = override.get("layers") or []
    if isinstance(layers, Mapping):  # counted from the model's end: check the layers it selects in this model
        from ue5m3.layers.recipes import LayerSelector
        from ue5m3.training.config import model_layers

        try:
            selector = config.load(LayerSelector, layers, path="control.override.layers", complete=True)
            layers = selector.select(model_layers(control.model, control.model_overrides))
        except ValueError:
            return  # reported by the override run's check, with the key path
        keys = ["control.override.layers"] * len(layers)
    else:
        keys = [f"control.override.layers[{i}]" for i in range(len(layers))]
    for key, layer in zip(keys, layers, strict=True):
        if not any(layer_index(n) == layer and fnmatch.fnmatchcase(n, pattern) for n in linears):
            problems.add(key, f"model {control.model!r} has no linear matching {pattern!r} in layer {layer!r}")


def _check_evaluation(cfg: PipelineConfig, problems: _Problems) -> None:
    from ue5m3.layers import recipes as packaged_recipes
    from ue5m3.training.config import TrainConfig

    ev, recipes = cfg.evaluation, cfg.training.recipes
    for recipe in recipes:
        if recipe not in ev.policies:
            problems.add("evaluation.policies", f"trained recipe {recipe!r} has no inference policy")
    # a packaged recipe that is not trained is skipped by the rules (a subset run); any other name is a mistake
    known = packaged_recipes.names()
    named = [("evaluation.sensitivity_recipe", ev.sensitivity_recipe)]
    named += [
        (f"evaluation.{key}[{i}]", r)
        for key in ("snapshot_recipes", "downstream_recipes")
        for i, r in enumerate(getattr(ev, key))
    ]
    for path, recipe in named:
        if recipe not in known and recipe not in recipes:
            problems.add(path, f"unknown recipe {recipe!r}; known recipes: {known}")
    keep = next(f.default for f in dataclasses.fields(TrainConfig) if f.name == "keep_checkpoints")
    t = cfg.training
    kept = jobs.kept_checkpoints(t.steps, t.checkpoint_every, t.keep_every, keep)
    for i, step in enumerate(ev.steps):
        if step not in kept:
            problems.add(f"evaluation.steps[{i}]", f"step {step!r} is not a checkpoint the runs keep {sorted(kept)}")


def _check_identification(cfg: PipelineConfig, problems: _Problems) -> None:
    from ue5m3.training.config import TrainConfig

    ident = cfg.identification
    for name, fit in ident.fits.items():
        if fit.on_hardware and not fit.partition:
            problems.add(
                f"identification.fits.{name}.partition",
                f"oracle {fit.oracle!r} records on a GPU: name the SLURM partition of its GPUs",
            )
    for name, entry in ident.parity.items():
        settings = jobs.parity_settings(cfg, name)
        problems.attempt(
            f"identification.parity.{name}", lambda settings=settings: TrainConfig.from_dict(settings, source="its run")
        )
        if entry.native and not entry.partition:
            problems.add(
                f"identification.parity.{name}.partition",
                "a native_te backend runs on a Blackwell GPU: name its SLURM partition",
            )
    witness = ident.witness
    if witness is None:
        return
    section = cfg.training if witness.group == "main" else cfg.control
    variants = cfg.training.recipes if witness.group == "main" else jobs.CONTROL_VARIANTS
    if witness.variant not in variants:
        problems.add("identification.witness.variant", f"{witness.variant!r} is not one of {list(variants)}")
    if witness.seed not in section.seeds:
        problems.add("identification.witness.seed", f"{witness.seed!r} is not one of {list(section.seeds)}")
    found = _model_linears(section.model, section.model_overrides)
    if found is not None and witness.module not in found[1]:
        problems.add(
            "identification.witness.module",
            f"model {section.model!r} has no linear {witness.module!r} (e.g. {found[1][-3:]})",
        )


def _check_throughput(cfg: PipelineConfig, problems: _Problems) -> None:
    from ue5m3.experiments.throughput import ThroughputConfig

    for name, run in cfg.throughput.runs.items():
        settings = jobs.throughput_settings(cfg, name)
        problems.attempt(
            f"throughput.runs.{name}",
            lambda settings=settings: config.load(ThroughputConfig, settings, source="its settings"),
        )
        if run.on_gpu and not run.partition:
            problems.add(
                f"throughput.runs.{name}.partition", f"device {run.device!r}: name the SLURM partition of its GPUs"
            )


def _logged_points(steps: int, log_every: int) -> int:
    """The metrics records of a run (every ``log_every`` steps and the last step)."""
    return steps // log_every + (1 if steps % log_every else 0)


def _check_windows(cfg: PipelineConfig, problems: _Problems) -> None:
    """The windows the stages average over fit what the runs and the data hold."""
    summary = cfg.training.summary
    for group, section in (("training", cfg.training), ("control", cfg.control)):
        points = _logged_points(section.steps, section.log_every)
        if summary.final_window > points:
            problems.add(
                "training.summary.final_window",
                f"{summary.final_window} logged points, but the {group} runs log {points} ({group}.steps "
                f"{section.steps}, log_every {section.log_every}); the final window would be the whole run",
            )
        if summary.smoothing_steps > section.steps:
            problems.add(
                "training.summary.smoothing_steps",
                f"{summary.smoothing_steps} steps, longer than the {group} runs ({section.steps} steps)",
            )
    witness = cfg.identification.witness
    if witness is not None and witness.sequences > cfg.data.validation_windows:
        problems.add(
            "identification.witness.sequences",
            f"{witness.sequences} validation windows, but data.validation_windows is {cfg.data.validation_windows}",
        )


def _check_downstream_tasks(cfg: PipelineConfig, problems: _Problems) -> None:
    """Every downstream task name is a Core 9 task, ``mmlu``, an MMLU subject or a hub task."""
    from ue5m3.evaluation.olmes.run import check_task_names

    for i, task in enumerate(cfg.evaluation.downstream.tasks):
        problems.attempt(f"evaluation.downstream.tasks[{i}]", lambda task=task: check_task_names([task]))


def _check_parity_backends(cfg: PipelineConfig, problems: _Problems) -> None:
    """Each parity backend runs its entry's recipe: a native_te backend a recipe with a native path, an emulated
    GEMM model one the recipe's settings fit (what the job would find only once it ran)."""
    from ue5m3.identify.parity import Backend
    from ue5m3.layers.native_te import Execution
    from ue5m3.training.config import TrainConfig

    for name, entry in cfg.identification.parity.items():
        try:
            run = TrainConfig.from_dict(jobs.parity_settings(cfg, name), source="its run")
        except (config.ConfigError, ValueError, TypeError):
            continue  # reported by the identification check
        for key in ("backend_a", "backend_b"):
            backend = Backend.parse(getattr(entry, key))
            path = f"identification.parity.{name}.{key}"
            if backend.execution is Execution.NATIVE_TE:
                if not run.resolved_recipe().native_te:
                    problems.add(path, f"'native_te' needs a recipe with a native path; {entry.recipe!r} has none")
                continue
            problems.attempt(path, lambda backend=backend, run=run: backend.recipe(run))
