"""The pipeline config (``config/config.yaml``, ``config/paper.yaml``) checked as a whole before any job starts.

The Snakemake schema checks each key's type. Snakemake's YAML reader keeps the last of two duplicate keys. What
neither checks is done here, at the Snakefile's first line of Python:

* duplicate keys, in every config file given;
* every stage section, through that stage's own strict loader (range analysis, accumulation, data, probe corpora,
  grid control, each throughput run);
* the hub files of the data path are pinned: ``tokenizer_source`` (its strict loader, and a ``data.tokenizer_path``
  to write to) and a commit in every ``hf://`` data URI;
* every training run the DAG will start, built exactly as the rules build it (:func:`run_settings`), through the
  trainer's strict loader: models, model overrides, recipes, optimizer settings and seeds;
* cross-references: each trained recipe has an inference policy, the sensitivity, snapshot and downstream recipes
  are trained, evaluated steps are checkpoints the runs keep, the control's overridden layers exist, each fit's
  corpus exists, and the witness names a run and a module of its model.

Every problem is reported at once, each with the key path, in one :class:`ue5m3.config.ConfigError` naming the
files.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ue5m3 import config

__all__ = [
    "check",
    "check_files",
    "run_settings",
    "parity_settings",
    "throughput_settings",
    "kept_checkpoints",
    "launcher",
    "CONTROL_VARIANTS",
]

CONTROL_VARIANTS = ("t448", "override")


def check_files(paths: Iterable[str | os.PathLike[str]]) -> None:
    """Parse each config file strictly (duplicate keys refused, naming the file and both lines)."""
    for path in paths:
        config.read_yaml(path)


# ----- what the rules start -----------------------------------------------------------------------------


def run_dir(cfg: Mapping[str, Any], group: str, variant: str, seed: int | str) -> str:
    """results/train/{group}/{variant}/seed{seed}: checkpoints, metrics and final.json of one run."""
    return os.path.join(cfg["results_dir"], "train", group, variant, f"seed{seed}")


def _control_overrides(control: Mapping[str, Any], variant: str) -> dict[str, Any]:
    if variant == "t448":
        return {}
    override = control["override"]
    return {"name": f"{control['recipe']}_t{int(override['target'])}_override", "target_overrides": [override]}


def run_settings(cfg: Mapping[str, Any], group: str, variant: str, seed: int | str) -> dict[str, Any]:
    """The settings of one training run (``ue5m3 train-config`` validates and writes them)."""
    main = group == "main"
    section = cfg["training"] if main else cfg["control"]
    keys = ("steps", "micro_batch", "accumulation", "log_every", "checkpoint_every", "keep_every", "optim")
    return {
        "execution": run_execution(cfg, group, variant),
        "run_dir": run_dir(cfg, group, variant, seed),
        "model": section["model"],
        "model_overrides": section["model_overrides"],
        "recipe": variant if main else section["recipe"],
        "recipe_overrides": {} if main else _control_overrides(section, variant),
        "seed": int(seed),
        "data": cfg["data"],
        **{key: section[key] for key in keys},
    }


def run_execution(cfg: Mapping[str, Any], group: str, variant: str) -> str:
    """``emulated`` or ``native_te``: the main runs take it from ``training.execution`` (per recipe), the control's
    are emulated."""
    if group != "main":
        return "emulated"
    return cfg["training"].get("execution", {}).get(variant, "emulated")


def parity_settings(cfg: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The training settings of one parity comparison's run."""
    entry = cfg["identification"]["parity"][name]
    return {
        "run_dir": os.path.join(cfg["results_dir"], "identify", "parity", "runs", name),
        "model": entry["model"],
        "model_overrides": entry["model_overrides"],
        "recipe": entry["recipe"],
        "recipe_overrides": entry.get("recipe_overrides", {}),
        "seed": 0,
        "data": {**cfg["data"], "sequence_length": entry["sequence_length"]},
        "steps": entry["steps"],
        "micro_batch": entry["batch_size"],
        "accumulation": 1,
        "log_every": 1,
        "checkpoint_every": entry["steps"],
        "keep_every": 0,
        "optim": cfg["training"]["optim"],
    }


THROUGHPUT_RUN_KEYS = ("execution", "device", "recipes")
THROUGHPUT_SHARED_KEYS = (
    "model",
    "model_overrides",
    "batch_size",
    "sequence_length",
    "warmup_steps",
    "measured_steps",
    "seed",
)


def throughput_settings(cfg: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The settings of one throughput run (``ue5m3 throughput`` loads them with its strict loader): the section's
    shared settings and the run's own (``partition`` is the cluster's business and stays out)."""
    section = cfg["throughput"]
    entry = section["runs"][name]
    return {
        "run": name,
        **{key: section[key] for key in THROUGHPUT_SHARED_KEYS},
        **{key: entry[key] for key in THROUGHPUT_RUN_KEYS},
    }


def kept_checkpoints(steps: int, checkpoint_every: int, keep_every: int, keep: int) -> set[int]:
    """The checkpoint steps a finished run still holds (the trainer's pruning rule)."""
    written = sorted({*range(checkpoint_every, steps + 1, checkpoint_every), steps})
    protected = set(range(keep_every, steps + 1, keep_every)) if keep_every else set()
    return set(written[-keep:]) | (protected & set(written))


LAUNCHER_FIELDS = ("nodes", "tasks", "procs_per_node")


def launcher(template: str, resources: Mapping[str, Any]) -> str:
    """A training job's launch command from the config's ``launcher`` template and the job's resources.

    ``{nodes}`` is the ``nodes`` resource (1 without one), ``{tasks}`` the ``tasks`` resource (one per node without
    one) and ``{procs_per_node}`` the GPUs per node of a ``gres: gpu:N`` request, else the ``procs_per_node``
    resource, else 1. Both come from what the job asked for,
    so the command is the same inside SLURM (whose jobstep plugin strips ``SLURM_*`` variables) and outside it.
    """
    nodes = int(resources.get("nodes") or 1)
    procs = resources.get("procs_per_node")
    gres = str(resources.get("gres") or "")
    if gres.startswith("gpu:"):
        procs = int(gres.rsplit(":", 1)[-1])
    tasks = int(resources.get("tasks") or nodes)
    return template.format(nodes=nodes, tasks=tasks, procs_per_node=int(procs or 1))


# ----- the check ----------------------------------------------------------------------------------------


class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.items.append(f"{path}: {message}")

    def attempt(self, path: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, its error recorded under ``path`` (the strict loaders' messages carry their own key paths)."""
        try:
            return fn()
        except (config.ConfigError, ValueError, TypeError, FileNotFoundError) as exc:
            self.items.append(f"{path}: {exc}" if path else str(exc))
            return None


def check(cfg: Mapping[str, Any], *, source: str = "<pipeline config>") -> None:
    """Check the whole pipeline config (see the module docstring).

    Raises:
        ConfigError: listing every problem with its key path, naming ``source``.
    """
    problems = _Problems()
    try:
        launcher(cfg["launcher"], {})
    except (KeyError, IndexError, ValueError) as exc:
        problems.add("launcher", f"unknown placeholder {exc} in {cfg['launcher']!r}; accepted: {list(LAUNCHER_FIELDS)}")
    _check_stages(cfg, problems)
    trained = _check_training(cfg, problems)
    _check_evaluation(cfg, trained, problems)
    _check_identification(cfg, trained, problems)
    if problems.items:
        listed = "\n  ".join(problems.items)
        raise config.ConfigError(f"{source}: {len(problems.items)} problem(s), nothing was started:\n  {listed}")


def _check_stages(cfg: Mapping[str, Any], problems: _Problems) -> None:
    from ue5m3.data import DataConfig
    from ue5m3.experiments.accumulation import AccumulationConfig
    from ue5m3.experiments.range_analysis import RangeAnalysisConfig
    from ue5m3.identify.grid_control import GridControlConfig
    from ue5m3.identify.probes import CorpusConfig

    problems.attempt("", lambda: config.load(RangeAnalysisConfig, cfg["range_analysis"], path="range_analysis"))
    problems.attempt("", lambda: config.load(AccumulationConfig, cfg["accumulation"], path="accumulation"))
    problems.attempt("", lambda: DataConfig.from_dict(cfg["data"], source="config"))
    _check_hub_pins(cfg, problems)
    ident = cfg["identification"]
    for name, corpus in ident["corpora"].items():
        path = f"identification.corpora.{name}"
        problems.attempt("", lambda corpus=corpus, path=path: config.load(CorpusConfig, corpus, path=path))
    grid = ident["grid_control"]
    problems.attempt("", lambda: config.load(GridControlConfig, grid, path="identification.grid_control"))
    _check_throughput(cfg, problems)


def _check_hub_pins(cfg: Mapping[str, Any], problems: _Problems) -> None:
    """The hub files of the data path are pinned: the tokenizer source loads strictly and has a file to go to, and
    every ``hf://`` data URI names a commit."""
    from ue5m3.data.hub import TokenizerSource, unpinned_hub_uris

    source = cfg.get("tokenizer_source")
    if source is not None:
        problems.attempt("", lambda: TokenizerSource.from_dict(source, source="config"))
        if cfg["data"].get("tokenizer_path") is None:
            problems.add(
                "data.tokenizer_path",
                "tokenizer_source is set, so rule fetch_tokenizer needs a path to write the file to; set "
                "data.tokenizer_path (e.g. tokenizers/<name>/tokenizer.json)",
            )
    for key in ("stream_a_files", "stream_b_files"):
        for i, uri in enumerate(cfg["data"].get(key) or []):
            if isinstance(uri, str) and unpinned_hub_uris([uri]):
                problems.add(
                    f"data.{key}[{i}]",
                    f"{uri!r} names no commit; pin the dataset revision as "
                    "hf://datasets/<owner>/<name>@<40-digit commit>/<path> (docs/data.md)",
                )


def _check_throughput(cfg: Mapping[str, Any], problems: _Problems) -> None:
    from ue5m3.experiments.throughput import ThroughputConfig

    for name in cfg["throughput"]["runs"]:
        settings = throughput_settings(cfg, name)
        problems.attempt(
            f"throughput.runs.{name}",
            lambda settings=settings: config.load(ThroughputConfig, settings, source="its settings"),
        )


def _check_training(cfg: Mapping[str, Any], problems: _Problems) -> dict[str, Any]:
    """Every run the DAG starts, through the trainer's loader; returns the main and control sections' facts."""
    from ue5m3.training.config import TrainConfig

    facts: dict[str, Any] = {}
    for group, section_name in (("main", "training"), ("control", "control")):
        section = cfg[section_name]
        seeds = section["seeds"]
        for i, seed in enumerate(seeds):
            if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
                problems.add(f"{section_name}.seeds[{i}]", f"a seed is a non-negative int, got {seed!r}")
        if len(set(map(str, seeds))) != len(seeds):
            problems.add(f"{section_name}.seeds", f"duplicate seeds {seeds!r} (two runs would share a directory)")
        variants = section["recipes"] if group == "main" else CONTROL_VARIANTS
        if group == "main" and len(set(variants)) != len(variants):
            problems.add("training.recipes", f"duplicate recipes {variants!r}")
        seed = next((s for s in seeds if isinstance(s, int) and not isinstance(s, bool) and s >= 0), 0)
        for i, variant in enumerate(variants):
            path = f"training.recipes[{i}]" if group == "main" else f"control ({variant})"
            settings = run_settings(cfg, group, variant, seed)
            problems.attempt(path, lambda settings=settings: TrainConfig.from_dict(settings, source="its run"))
        facts[group] = {"variants": list(variants), "seeds": list(seeds), "section": section}
    for recipe in cfg["training"].get("execution", {}):
        if recipe not in cfg["training"]["recipes"]:
            problems.add(
                f"training.execution.{recipe}", f"names no run (training.recipes: {cfg['training']['recipes']})"
            )
    _check_control_override(cfg["control"], problems)
    return facts


def _model_linears(model: str, overrides: Mapping[str, Any]) -> tuple[list[str], list[str]] | None:
    """(every module name, every eligible linear) of a model built on the meta device; None when it cannot be."""
    from ue5m3 import models

    try:
        built = models.build(model, device="meta", **overrides)
    except (ValueError, TypeError):
        return None  # reported by the run check
    return [name for name, _ in built.named_modules()], models.eligible_linears(built)


def _check_control_override(control: Mapping[str, Any], problems: _Problems) -> None:
    from ue5m3.layers.linear import layer_index

    found = _model_linears(control["model"], control["model_overrides"])
    override = control["override"]
    if found is None or not isinstance(override, Mapping):
        return
    _, linears = found
    pattern = override.get("module", "*")
    layers = override.get("layers") or []
    if isinstance(layers, Mapping):  # counted from the model's end: check the layers it selects in this model
        from ue5m3.layers.recipes import LayerSelector
        from ue5m3.training.config import model_layers

        try:
            selector = config.load(LayerSelector, layers, path="control.override.layers", complete=True)
            layers = selector.select(model_layers(control["model"], control["model_overrides"]))
        except ValueError:
            return  # reported by the override run's check, with the key path
        keys = ["control.override.layers"] * len(layers)
    else:
        keys = [f"control.override.layers[{i}]" for i in range(len(layers))]
    for key, layer in zip(keys, layers, strict=True):
        if not any(layer_index(n) == layer and fnmatch.fnmatchcase(n, pattern) for n in linears):
            problems.add(key, f"model {control['model']!r} has no linear matching {pattern!r} in layer {layer!r}")


def _check_evaluation(cfg: Mapping[str, Any], trained: Mapping[str, Any], problems: _Problems) -> None:
    from ue5m3.evaluation.inference import InferencePolicy
    from ue5m3.layers import recipes as packaged_recipes

    ev = cfg["evaluation"]
    recipes = trained["main"]["variants"]
    accepted = [p.value for p in InferencePolicy]
    for name, policy in ev["policies"].items():
        if policy not in accepted:
            problems.add(f"evaluation.policies.{name}", f"unknown policy {policy!r}; accepted: {accepted}")
    for recipe in recipes:
        if recipe not in ev["policies"]:
            problems.add("evaluation.policies", f"trained recipe {recipe!r} has no inference policy")
    for i, policy in enumerate(ev["sensitivity_policies"]):
        if policy not in accepted:
            problems.add(f"evaluation.sensitivity_policies[{i}]", f"unknown policy {policy!r}; accepted: {accepted}")
    # a packaged recipe that is not trained is skipped by the rules (a subset run); any other name is a mistake
    known = packaged_recipes.names()
    named = [("evaluation.sensitivity_recipe", ev["sensitivity_recipe"])]
    named += [
        (f"evaluation.{key}[{i}]", r)
        for key in ("snapshot_recipes", "downstream_recipes")
        for i, r in enumerate(ev[key])
    ]
    for path, recipe in named:
        if recipe not in known and recipe not in recipes:
            problems.add(path, f"unknown recipe {recipe!r}; known recipes: {known}")
    training = trained["main"]["section"]
    kept = kept_checkpoints(
        training["steps"], training["checkpoint_every"], training["keep_every"], training.get("keep_checkpoints", 2)
    )
    for i, step in enumerate(ev["steps"]):
        if step not in kept:
            problems.add(f"evaluation.steps[{i}]", f"step {step!r} is not a checkpoint the runs keep {sorted(kept)}")


def _check_identification(cfg: Mapping[str, Any], trained: Mapping[str, Any], problems: _Problems) -> None:
    from ue5m3.training.config import TrainConfig

    ident = cfg["identification"]
    for name, fit in ident["fits"].items():
        if fit["corpus"] not in ident["corpora"]:
            problems.add(
                f"identification.fits.{name}.corpus",
                f"unknown corpus {fit['corpus']!r}; identification.corpora has {sorted(ident['corpora'])}",
            )
    for name in ident["parity"]:
        settings = parity_settings(cfg, name)
        problems.attempt(
            f"identification.parity.{name}",
            lambda settings=settings: TrainConfig.from_dict(settings, source="its run"),
        )
    witness = ident["witness"]
    if witness is None:
        return
    group = trained.get(witness["group"])
    if group is None:
        problems.add("identification.witness.group", f"unknown group {witness['group']!r}; accepted: main, control")
        return
    if witness["variant"] not in group["variants"]:
        problems.add("identification.witness.variant", f"{witness['variant']!r} is not one of {group['variants']}")
    if witness["seed"] not in group["seeds"]:
        problems.add("identification.witness.seed", f"{witness['seed']!r} is not one of {group['seeds']}")
    section = group["section"]
    found = _model_linears(section["model"], section["model_overrides"])
    if found is not None and witness["module"] not in found[1]:
        problems.add(
            "identification.witness.module",
            f"model {section['model']!r} has no linear {witness['module']!r} (e.g. {found[1][-3:]})",
        )
