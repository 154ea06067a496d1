"""The config of one training run: :class:`TrainConfig` and its optimizer section :class:`OptimConfig`.

These are the contract between the pipeline and the trainer: `ue5m3 train-config` validates a run's settings
with the strict loader (:func:`ue5m3.config.load`) and writes them as the YAML that `ue5m3 train --config` reads;
evaluation reads the same record back from a run directory (:func:`read_run_config`). Defaults live here and only
here.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ue5m3 import config
from ue5m3.data import DataConfig
from ue5m3.layers import recipes
from ue5m3.layers.native_te import Execution
from ue5m3.layers.recipes import ModelLayers, Recipe
from ue5m3.numerics.backend import Backend

__all__ = ["OptimConfig", "TrainConfig", "model_layers", "read_run_config", "RESOLVED_CONFIG"]

# The resolved config a run writes beside its checkpoints (read back by evaluation).
RESOLVED_CONFIG = "config.resolved.json"


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """AdamW and schedule (experiments spec section 1).

    Attributes:
        lr: peak learning rate.
        betas: AdamW betas.
        eps: AdamW epsilon.
        weight_decay: decoupled weight decay (not applied to biases, norms, A_log, D, dt_bias, embeddings' norms).
        grad_clip: global gradient-norm clip.
        warmup_steps: linear warmup steps (the paper: 0).
        decay_fraction: final fraction of steps with linear decay.
        final_lr_fraction: learning rate at the last step as a fraction of the peak.
    """

    lr: float = 8e-4
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    warmup_steps: int = 0
    decay_fraction: float = 0.15
    final_lr_fraction: float = 0.01

    def __post_init__(self) -> None:
        object.__setattr__(self, "betas", tuple(self.betas))
        if not 0 < self.lr < math.inf:
            raise ValueError(f"lr: must be positive, got {self.lr!r}")
        for i, beta in enumerate(self.betas):
            if not 0 <= beta < 1:
                raise ValueError(f"betas[{i}]: must lie in [0, 1), got {beta!r}")
        if not 0 < self.eps < math.inf:
            raise ValueError(f"eps: must be positive and finite, got {self.eps!r}")
        if not 0 <= self.weight_decay < math.inf:
            raise ValueError(f"weight_decay: must be >= 0 and finite, got {self.weight_decay!r}")
        # inf disables clipping; a non-positive clip would flip or zero every gradient
        if not self.grad_clip > 0:
            raise ValueError(f"grad_clip: must be positive (inf: no clipping), got {self.grad_clip!r}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps: must be >= 0, got {self.warmup_steps!r}")
        if not 0 <= self.decay_fraction <= 1:
            raise ValueError(f"decay_fraction: must lie in [0, 1], got {self.decay_fraction!r}")
        if not 0 < self.final_lr_fraction <= 1:
            raise ValueError(f"final_lr_fraction: must lie in (0, 1], got {self.final_lr_fraction!r}")


@functools.cache
def _model_layers(model: str, overrides_json: str) -> ModelLayers:
    from ue5m3 import models

    cfg = models.config(model, **json.loads(overrides_json))
    linears = models.eligible_linears(models.build_from_config(cfg, device="meta"))
    return ModelLayers(model=model, kinds=models.layer_kinds(cfg), linears=tuple(linears))


def model_layers(model: str, overrides: Mapping[str, Any] | None = None) -> ModelLayers:
    """What recipe layer selectors resolve against for ``model`` with ``overrides``: each layer's kinds and the
    eligible linears (from a meta-device build, cached per model and overrides)."""
    return _model_layers(model, json.dumps(dict(overrides or {}), sort_keys=True))


DATA_PARALLEL = ("auto", "fsdp2", "ddp")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One training run.

    Attributes:
        run_dir: directory for checkpoints, metrics and the final record.
        model: a name in :func:`ue5m3.models.names`.
        model_overrides: config fields to override (e.g. ``vocab_size`` to match the tokenizer).
        recipe: a named recipe or a path to a recipe YAML file.
        recipe_overrides: recipe keys to replace (validated like a recipe file), e.g. ``name`` and
            ``target_overrides`` for the T = 2048 control.
        seed: seed of initialisation, data order and stochastic rounding.
        steps: optimizer steps.
        micro_batch: sequences per microbatch and rank.
        accumulation: microbatches per optimizer step.
        data: the data section (:class:`ue5m3.data.DataConfig`; its ``sequence_length`` is the run's), parsed
            once by the loader; None for a run fed a stream by its caller (:func:`ue5m3.training.loop.train`'s
            ``stream``, as tests and benchmarks do).
        optim: see :class:`OptimConfig`.
        fp4_select: module-name patterns to convert (default: every eligible linear of the model).
        log_every: steps between metric records.
        checkpoint_every: steps between checkpoints (the final step always checkpoints).
        keep_checkpoints: rolling checkpoints kept (those at multiples of ``keep_every`` stay too).
        keep_every: checkpoints at multiples of this step are never pruned (0: none).
        cold_scale_resume: on resume, drop the scale caches as the paper's runs did (default: exact resume).
        execution: ``emulated`` (the recipe's GEMM output model, any device) or ``native_te`` (Transformer
            Engine NVFP4 on Blackwell, for recipes with a native path; fails closed elsewhere).
        data_parallel: how many processes share the work: ``fsdp2`` (parameters, gradients and optimizer state
            sharded per block), ``ddp`` (replicated; gradients all-reduced) or ``auto``: FSDP2 for the emulated
            path, DDP for ``native_te`` (the data parallelism Transformer Engine's NVFP4 linears support; FSDP2
            sharding of ``te.Linear`` is not wired). One process uses neither.
        backend: who computes the emulated quantizations and GEMMs (:class:`ue5m3.numerics.backend.Backend`);
            every backend gives the same bits, so it changes speed, never results.
        restart_on_change: when the run directory holds another run's checkpoints (its settings changed), move it
            aside to ``<run_dir>.superseded-<fingerprint>`` and start afresh (the pipeline's choice); otherwise such a
            run is refused, naming what differs. Not part of the run's identity.
    """

    run_dir: str
    model: str
    recipe: str
    seed: int
    steps: int
    micro_batch: int
    accumulation: int
    data: DataConfig | None
    model_overrides: Mapping[str, Any] = field(default_factory=dict)
    recipe_overrides: Mapping[str, Any] = field(default_factory=dict)
    optim: OptimConfig = field(default_factory=OptimConfig)
    fp4_select: tuple[str, ...] | None = None
    log_every: int = 1
    checkpoint_every: int = 100
    keep_checkpoints: int = 2
    keep_every: int = 0
    cold_scale_resume: bool = False
    execution: Execution = Execution.EMULATED
    data_parallel: str = "auto"
    backend: Backend = Backend.AUTO
    restart_on_change: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "execution", Execution(self.execution))
        if self.data_parallel not in DATA_PARALLEL:
            raise ValueError(f"data_parallel: must be one of {list(DATA_PARALLEL)}, got {self.data_parallel!r}")
        if self.execution is Execution.NATIVE_TE and self.data_parallel == "fsdp2":
            raise ValueError(
                "data_parallel: 'fsdp2' with execution 'native_te' is not supported (FSDP2 sharding of te.Linear "
                "is not wired); use 'ddp' or 'auto'"
            )
        object.__setattr__(self, "backend", Backend(self.backend))
        for key in ("steps", "micro_batch", "accumulation", "log_every", "checkpoint_every"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key}: must be a positive int, got {value!r}")
        if isinstance(self.optim, Mapping):
            object.__setattr__(self, "optim", config.load(OptimConfig, self.optim, path="optim"))
        if isinstance(self.data, Mapping):  # built in code from plain data (the loader has built a DataConfig)
            object.__setattr__(self, "data", config.load(DataConfig, self.data, path="data"))
        if not isinstance(self.data, DataConfig | None):
            raise TypeError(f"data: expected a DataConfig, a mapping or None, got {type(self.data).__name__}")
        if self.fp4_select is not None:
            object.__setattr__(self, "fp4_select", tuple(self.fp4_select))
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"seed: must be a non-negative int below 2^63, got {self.seed!r}")
        if self.keep_checkpoints < 1:
            raise ValueError(f"keep_checkpoints: must be >= 1 (resume needs one), got {self.keep_checkpoints!r}")
        if self.keep_every < 0:
            raise ValueError(
                f"keep_every: must be >= 0 (0: keep none beyond the rolling ones), got {self.keep_every!r}"
            )
        if self.optim.warmup_steps > self.steps:
            raise ValueError(f"optim.warmup_steps: {self.optim.warmup_steps} exceeds steps ({self.steps})")
        self._check_references()

    @property
    def parallelism(self) -> str:
        """``fsdp2`` or ``ddp``: what ``auto`` means for this run's execution path."""
        if self.data_parallel != "auto":
            return self.data_parallel
        return "ddp" if self.execution is Execution.NATIVE_TE else "fsdp2"

    def _check_references(self) -> None:
        """The names the run refers to exist: model and its overrides, recipe and its overrides, data, layers."""
        from ue5m3 import models

        if self.model not in models.names():
            raise ValueError(f"model: unknown model {self.model!r}; known models: {list(models.names())}")
        try:
            model_cfg = models.config(self.model, **self.model_overrides)
        except TypeError as exc:
            fields = sorted(f.name for f in dataclasses.fields(models.config(self.model)))
            unknown = sorted(set(self.model_overrides) - set(fields))
            raise ValueError(
                f"model_overrides: unknown keys {unknown} for model {self.model!r}; fields: {fields}"
            ) from (exc)
        except ValueError as exc:
            raise ValueError(f"model_overrides: {exc}") from None
        try:
            recipe = recipes.resolve(self.recipe, self.recipe_overrides)
        except (ValueError, TypeError, FileNotFoundError) as exc:
            raise ValueError(f"recipe: {exc}") from None
        if self.execution is Execution.NATIVE_TE and not recipe.native_te:
            raise ValueError(
                f"execution: recipe {recipe.name!r} has no native Transformer Engine path (native_te: false); "
                "run it 'emulated'"
            )
        # the recipe's layer keys against this model: a selector asking for more layers than it has, or an index
        # beyond its last layer, is refused here, before any job starts
        try:
            self.resolved_recipe(recipe)
        except ValueError as exc:
            raise ValueError(f"recipe: {exc}") from None
        # the one vocabulary check: the model's embedding must cover every token id the tokenizer writes
        if self.data is not None and model_cfg.vocab_size != self.data.vocab_size:
            raise ValueError(
                f"model_overrides: model {self.model!r} has vocab_size {model_cfg.vocab_size} but data.vocab_size "
                f"is {self.data.vocab_size}; set model_overrides.vocab_size to the tokenizer's size"
            )
        if self.fp4_select is not None:
            eligible = list(model_layers(self.model, self.model_overrides).linears)
            for i, pattern in enumerate(self.fp4_select):
                if not any(fnmatch.fnmatchcase(name, pattern) for name in eligible):
                    raise ValueError(
                        f"fp4_select[{i}]: pattern {pattern!r} matches no linear of {self.model!r} "
                        f"(e.g. {eligible[:3]})"
                    )

    def resolved_recipe(self, recipe: Recipe | None = None) -> Recipe:
        """The run's recipe (or ``recipe``) resolved against the run's model (:meth:`Recipe.for_model`).

        Every consumer of a run's recipe (training, the run identity, evaluation, parity, the native TE path) uses
        this one, so each sees the same absolute layer indices.

        Raises:
            ValueError: a layer key the model cannot satisfy (the message names the key, the model and its depth).
        """
        if recipe is None:
            recipe = recipes.resolve(self.recipe, self.recipe_overrides)
        return recipe.for_model(model_layers(self.model, self.model_overrides))

    def require_data(self) -> DataConfig:
        """The data section, for the steps that read the run's own data (its training stream, evaluation sets,
        tokenizer).

        Raises:
            ValueError: the run has none (``data: null``: it was fed a stream by its caller).
        """
        if self.data is None:
            raise ValueError(
                f"run {self.run_dir!r} has no data section (data: null; it was fed a stream by its caller), so it "
                "has no data of its own to read; give its config a data section"
            )
        return self.data

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "<train config>") -> TrainConfig:
        """The strict loader (:func:`ue5m3.config.load`); errors name ``source`` and the key path."""
        return config.load(cls, data, source=source)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> TrainConfig:
        return cls.from_dict(config.read_yaml(path), source=os.fspath(path))

    def to_dict(self) -> dict[str, Any]:
        return config.dump(self)


def read_run_config(run_dir: str | os.PathLike[str]) -> TrainConfig:
    """The :class:`TrainConfig` a run recorded in its ``config.resolved.json``.

    Raises:
        FileNotFoundError: the directory holds no resolved config (not a training run, or never started).
    """
    path = Path(run_dir) / RESOLVED_CONFIG
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: {run_dir} is not a training run directory")
    return TrainConfig.from_dict(json.loads(path.read_text()), source=str(path))
