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
from typing import Any, ClassVar

from ue5m3 import config
from ue5m3.artifacts import read_json
from ue5m3.config import Range
from ue5m3.data import DataConfig
from ue5m3.layers import recipes
from ue5m3.layers.native_te import Execution
from ue5m3.layers.recipes import ModelLayers, Recipe
from ue5m3.numerics.backend import Backend

__all__ = ["OptimConfig", "TrainConfig", "model_layers", "read_run_config", "RESOLVED_CONFIG", "BLOCK_KINDS"]

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

    RANGES: ClassVar[dict[str, Range]] = {
        "lr": Range(0, 1, low_open=True, note="peak AdamW learning rate; the paper: 8e-4, runs use 1e-5 to 1e-2"),
        "betas": Range(0, 1, high_open=True, note="AdamW betas; the paper: 0.9, 0.95"),
        "eps": Range(0, 1e-3, low_open=True, note="AdamW epsilon; runs use 1e-8 to 1e-6, a larger one stalls AdamW"),
        "weight_decay": Range(0, 1, note="decoupled weight decay per unit learning rate; the paper: 0.1"),
        "grad_clip": Range(0, math.inf, low_open=True, note="global gradient-norm clip, inf: none; the paper: 1.0"),
        "warmup_steps": Range(0, 10**7, note="linear warmup steps; the paper: 0"),
        "decay_fraction": Range(0, 1, note="final fraction of the steps with linear decay; the paper: 0.15"),
        "final_lr_fraction": Range(0, 1, low_open=True, note="the last step's learning rate over the peak"),
    }

    def __post_init__(self) -> None:
        object.__setattr__(self, "betas", tuple(self.betas))
        config.check_ranges(self)
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
def _shipped_linears(model: str) -> tuple[str, ...]:
    """The eligible linears of a shipped model as shipped (a meta-device build, cached)."""
    from ue5m3 import models

    return tuple(models.eligible_linears(models.build(model, device="meta")))


class _ShippedLinears(Mapping):
    """The other shipped models' eligible linears, each built when first read: only an override that matches none
    of the run's own linears reads them, and the 8B model's meta build alone takes over a second."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self._names = names

    def __getitem__(self, name: str) -> tuple[str, ...]:
        if name not in self._names:
            raise KeyError(name)
        return _shipped_linears(name)

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


@functools.cache
def _model_layers(model: str, overrides_json: str) -> ModelLayers:
    from ue5m3 import models

    cfg = models.config(model, **json.loads(overrides_json))
    linears = models.eligible_linears(models.build_from_config(cfg, device="meta"))
    shipped = _ShippedLinears(tuple(name for name in models.names() if name != model))
    return ModelLayers(model=model, kinds=models.layer_kinds(cfg), linears=tuple(linears), shipped_linears=shipped)


def model_layers(model: str, overrides: Mapping[str, Any] | None = None) -> ModelLayers:
    """What recipe layer selectors resolve against for ``model`` with ``overrides``: each layer's kinds and the
    eligible linears (from a meta-device build, cached per model and overrides)."""
    return _model_layers(model, json.dumps(dict(overrides or {}), sort_keys=True))


DATA_PARALLEL = ("auto", "fsdp2", "ddp")
ACTIVATION_CHECKPOINTING = ("none", "every_block", "selective")
BLOCK_KINDS = ("mamba", "attention", "mlp")
PARAM_DTYPES = ("float32", "bfloat16")
FP4_WEIGHT_DTYPES = ("param", "float32")
GRADIENT_SYNC = ("last_microbatch", "every_microbatch")
RESHARD_AFTER_FORWARD = ("default", "always", "never")


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
        accumulation: microbatches per optimizer step; 0 (the default): derived from ``global_batch``. Give
            ``accumulation`` or ``global_batch``, not both.
        global_batch: sequences per optimizer step over all ranks (the paper: 768). The accumulation is then
            ``global_batch`` / (``micro_batch`` x world size), and a world size that does not divide it is refused
            when the run starts, naming the numbers (:meth:`accumulation_for`). 0 (the default): the global batch
            is ``micro_batch`` x ``accumulation`` x world size. Either way the run's identity holds the global
            micro-batch (``micro_batch`` x world size) and the accumulation, so a run stated both ways is the same
            run.
        data: the data section (:class:`ue5m3.data.DataConfig`; its ``sequence_length`` is the run's), parsed
            once by the loader; None for a run fed a stream by its caller (:func:`ue5m3.training.loop.train`'s
            ``stream``, as tests and benchmarks do).
        optim: see :class:`OptimConfig`.
        fp4_select: module-name patterns to convert (default: every eligible linear of the model).
        log_every: steps between metric records.
        checkpoint_every: steps between checkpoints (the final step always checkpoints).
        checkpoint_every_minutes: also checkpoint once this many minutes of wall time have passed since the run
            started or last saved (e.g. 30), which bounds the work lost when a node dies without warning (0: only
            ``checkpoint_every``; :class:`~ue5m3.training.stops.WallClockCheckpoints`). These are rolling
            checkpoints like the others (``keep_checkpoints``); not part of the run's identity.
        keep_checkpoints: rolling checkpoints kept (those at multiples of ``keep_every`` stay too).
        keep_every: checkpoints at multiples of this step are never pruned (0: none).
        cold_scale_resume: on resume, drop the scale caches as the paper's runs did (default: exact resume).
        execution: ``emulated`` (the recipe's GEMM output model, any device) or ``native_te`` (Transformer
            Engine NVFP4 on Blackwell, for recipes with a native path; fails closed elsewhere).
        data_parallel: how many processes share the work: ``fsdp2`` (parameters, gradients and optimizer state
            sharded per block; ``te.Linear`` modules too on the ``native_te`` path, as Transformer Engine 2.16's
            FSDP2 tests shard them), ``ddp`` (replicated; gradients all-reduced) or ``auto`` (FSDP2). One process
            uses neither (except a ``bfloat16`` run: FSDP2 over a one-process group, see ``param_dtype``).
        activation_checkpointing: which residual blocks recompute their forward pass in the backward pass instead
            of keeping their activations (:mod:`ue5m3.training.parallelize`): ``none``, ``every_block`` or
            ``selective`` (the blocks of a kind in ``checkpoint_kinds``). The same bits either way, so not part of
            the run's identity.
        checkpoint_kinds: the block kinds ``selective`` checkpoints (``mamba``, ``attention``, ``mlp``; a dense
            layer is both ``attention`` and ``mlp``). The default, Mamba-2 and attention blocks, recomputes the
            blocks that hold the most activation memory per recomputed FLOP (the scan's [heads, L, L] forms, the
            T x T scores of a math-kernel attention) and keeps the MLPs', whose two wide GEMMs are the dearest to
            recompute under FP4 emulation.
        ssd_groups_per_pass: run the Mamba-2 torch scan over the heads of this many B/C groups at a time, each pass
            recomputed in the backward pass (:func:`ue5m3.models.ssd.ssd_scan`); 0: all heads in one pass. The
            forward is the same; the gradients of B and C agree to FP32 rounding, so a non-zero value is part of
            the run's identity.
        loss_chunk: positions per chunk of the FP32 head and cross entropy, each chunk recomputed in the backward
            pass, so the full [tokens, vocab] FP32 logits are never alive (:mod:`ue5m3.training.loss`); 0: the
            whole microbatch at once. The loss and gradients agree to FP32 summation order (the head's weight
            gradient sums its chunks), so a non-zero value is part of the run's identity.
        param_dtype: the parameters' dtype in the forward and backward passes: ``float32``, or ``bfloat16`` as the
            paper ran (BF16 parameters, FP32 reductions: FSDP2's ``MixedPrecisionPolicy(param_dtype=bfloat16,
            reduce_dtype=float32)``, FP32 master weights and optimizer state, gradients accumulated and reduced in
            FP32). ``bfloat16`` is FSDP2's, whatever the world size: one process runs FSDP2 over a one-process
            group, and DDP is refused. Part of the run's identity when ``bfloat16``.
        fp4_weight_dtype: what the FP4 linears quantize when ``param_dtype`` is ``bfloat16``: ``param`` (the
            all-gathered BF16 weight, as TorchTitan's FSDP gives it to any module: the paper's setup) or
            ``float32`` (each FP4 linear its own FSDP2 unit all-gathered in FP32, so it quantizes its FP32 master
            weight; the other parameters stay BF16). Part of the run's identity with ``bfloat16``.
        gradient_sync: when FSDP2 reduce-scatters gradients: ``last_microbatch`` (accumulated unsharded in FP32 over
            the step's microbatches, one reduce-scatter per step) or ``every_microbatch`` (sharded after each
            microbatch: less memory, ``accumulation`` times the traffic). DDP always all-reduces once per step.
            The same sums in another order, like the world size: not part of the run's identity.
        fsdp_reshard_after_forward: FSDP2's ``reshard_after_forward`` per block (as torchtitan's policy):
            ``default`` and ``always`` free each block's gathered parameters after its forward pass (the root's stay
            gathered for the backward pass), ``never`` keeps every block's. Not part of the identity.
        fsdp_prefetch: 0: FSDP2's implicit prefetching (the next all-gather issued as the CPU runs ahead in the
            forward pass, one block ahead in the backward pass); k >= 1: explicit prefetching of the next k blocks
            in the forward and the previous k in the backward pass. Not part of the identity.
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
    data: DataConfig | None
    accumulation: int = 0
    global_batch: int = 0
    model_overrides: Mapping[str, Any] = field(default_factory=dict)
    recipe_overrides: Mapping[str, Any] = field(default_factory=dict)
    optim: OptimConfig = field(default_factory=OptimConfig)
    fp4_select: tuple[str, ...] | None = None
    log_every: int = 1
    checkpoint_every: int = 100
    checkpoint_every_minutes: float = 0.0
    keep_checkpoints: int = 2
    keep_every: int = 0
    cold_scale_resume: bool = False
    execution: Execution = Execution.EMULATED
    data_parallel: str = "auto"
    activation_checkpointing: str = "none"
    checkpoint_kinds: tuple[str, ...] = ("mamba", "attention")
    ssd_groups_per_pass: int = 0
    loss_chunk: int = 0
    param_dtype: str = "float32"
    fp4_weight_dtype: str = "param"
    gradient_sync: str = "last_microbatch"
    fsdp_reshard_after_forward: str = "default"
    fsdp_prefetch: int = 0
    backend: Backend = Backend.AUTO
    restart_on_change: bool = False

    RANGES: ClassVar[dict[str, Range]] = {
        "seed": Range(0, 2**63 - 1, note="seed of initialisation, data order and stochastic rounding"),
        "steps": Range(1, 10**7, note="optimizer steps of the run; the paper's: 30,000"),
        "micro_batch": Range(1, 2**16, note="sequences per microbatch and rank; the paper: 1"),
        "accumulation": Range(0, 2**16, note="microbatches per optimizer step, 0: from global_batch; the paper: 24"),
        "global_batch": Range(0, 2**24, note="sequences per optimizer step over all ranks, 0: off; the paper: 768"),
        "log_every": Range(1, 10**7, note="steps between metric records"),
        "checkpoint_every": Range(1, 10**7, note="steps between checkpoints"),
        "checkpoint_every_minutes": Range(0, 7 * 24 * 60, note="minutes between wall-time checkpoints, 0: off"),
        "keep_checkpoints": Range(1, 10**4, note="rolling checkpoints kept"),
        "keep_every": Range(0, 10**7, note="steps between checkpoints never pruned, 0: none"),
        "ssd_groups_per_pass": Range(0, 2**10, note="B/C groups per pass of the Mamba-2 scan, 0: all at once"),
        "loss_chunk": Range(0, 2**24, note="positions per chunk of the FP32 head, 0: the whole microbatch"),
        "fsdp_prefetch": Range(0, 2**10, note="blocks FSDP2 prefetches explicitly, 0: implicit prefetching"),
    }

    def __post_init__(self) -> None:
        object.__setattr__(self, "execution", Execution(self.execution))
        object.__setattr__(self, "checkpoint_kinds", tuple(self.checkpoint_kinds))
        self._check_run_dir()
        config.check_ranges(self)
        self._check_memory_and_parallelism()
        object.__setattr__(self, "backend", Backend(self.backend))
        for key in ("steps", "micro_batch", "log_every", "checkpoint_every"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key}: must be a positive int, got {value!r}")
        self._check_batch()
        minutes = self.checkpoint_every_minutes
        if isinstance(minutes, bool) or not isinstance(minutes, int | float) or not 0 <= minutes < math.inf:
            raise ValueError(f"checkpoint_every_minutes: must be >= 0 and finite (0: off), got {minutes!r}")
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

    def _check_run_dir(self) -> None:
        """``run_dir`` names a directory: not empty (which would be the current directory), not a file."""
        run_dir = self.run_dir
        if not isinstance(run_dir, str) or not run_dir.strip() or "\0" in run_dir:
            raise ValueError(
                f"run_dir: must be the path of the run's directory (e.g. results/train/<run>), got {run_dir!r}; an "
                "empty one would train into the current directory"
            )
        if Path(run_dir).exists() and not Path(run_dir).is_dir():
            raise ValueError(f"run_dir: {run_dir!r} is a file, not a directory; give the run a directory of its own")

    def _check_memory_and_parallelism(self) -> None:
        """The data-parallel, checkpointing, precision and FSDP2 settings name known choices and fit together."""
        for key, choices in (
            ("data_parallel", DATA_PARALLEL),
            ("activation_checkpointing", ACTIVATION_CHECKPOINTING),
            ("param_dtype", PARAM_DTYPES),
            ("fp4_weight_dtype", FP4_WEIGHT_DTYPES),
            ("gradient_sync", GRADIENT_SYNC),
            ("fsdp_reshard_after_forward", RESHARD_AFTER_FORWARD),
        ):
            if getattr(self, key) not in choices:
                raise ValueError(f"{key}: must be one of {list(choices)}, got {getattr(self, key)!r}")
        unknown = sorted(set(self.checkpoint_kinds) - set(BLOCK_KINDS))
        if unknown or not self.checkpoint_kinds:
            raise ValueError(
                f"checkpoint_kinds: at least one of {list(BLOCK_KINDS)}, got {list(self.checkpoint_kinds)!r}"
            )
        for key in ("ssd_groups_per_pass", "loss_chunk", "fsdp_prefetch"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{key}: must be an int >= 0, got {value!r}")
        if self.param_dtype == "bfloat16" and self.parallelism != "fsdp2":
            raise ValueError(
                "param_dtype: 'bfloat16' is FSDP2's mixed precision (BF16 parameters, FP32 reductions); use "
                f"data_parallel 'fsdp2' or 'auto', not {self.data_parallel!r}"
            )

    def _check_batch(self) -> None:
        """``accumulation`` or ``global_batch``, one of them, and a global batch of whole microbatches."""
        for key in ("accumulation", "global_batch"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{key}: must be an int >= 0 (0: not given), got {value!r}")
        if self.accumulation and self.global_batch:
            raise ValueError(
                f"global_batch: give global_batch ({self.global_batch}) or accumulation ({self.accumulation}), not "
                "both: the accumulation follows from the global batch, micro_batch and the world size"
            )
        if not self.accumulation and not self.global_batch:
            raise ValueError(
                "accumulation: give accumulation (microbatches per optimizer step) or global_batch (sequences per "
                "optimizer step over all ranks); neither is set"
            )
        if self.global_batch % self.micro_batch:
            raise ValueError(
                f"global_batch: {self.global_batch} sequences per step is not a multiple of micro_batch "
                f"({self.micro_batch})"
            )

    def accumulation_for(self, world_size: int) -> int:
        """Microbatches per optimizer step on ``world_size`` ranks: ``accumulation``, or ``global_batch`` /
        (``micro_batch`` x ``world_size``).

        Raises:
            ValueError: ``global_batch`` is not a multiple of ``micro_batch`` x ``world_size`` (the message names
                the three numbers and the world sizes that would do).
        """
        if not self.global_batch:
            return self.accumulation
        per_microbatch = self.micro_batch * world_size
        if self.global_batch % per_microbatch:
            microbatches = self.global_batch // self.micro_batch
            raise ValueError(
                f"global_batch: {self.global_batch} sequences per step cannot be split over {world_size} rank(s) of "
                f"micro_batch {self.micro_batch}: {self.global_batch} is not a multiple of {self.micro_batch} x "
                f"{world_size} = {per_microbatch}; run on a world size that divides {microbatches} (global_batch / "
                "micro_batch), or change micro_batch"
            )
        return self.global_batch // per_microbatch

    @property
    def parallelism(self) -> str:
        """``fsdp2`` or ``ddp``: what ``auto`` means (FSDP2, on either execution path)."""
        return "fsdp2" if self.data_parallel == "auto" else self.data_parallel

    @property
    def mixed_precision(self) -> bool:
        """Whether the run computes with BF16 parameters over FP32 masters (``param_dtype: bfloat16``): then it runs
        FSDP2 on any world size, one process included."""
        return self.param_dtype == "bfloat16"

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
        TornFileError: the record does not parse (a write cut short), naming it and how to write it again.
    """
    path = Path(run_dir) / RESOLVED_CONFIG
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: {run_dir} is not a training run directory")
    remedy = "the trainer writes it when a run starts: rerun `ue5m3 train` on the run's config (it resumes)"
    return TrainConfig.from_dict(read_json(path, remedy=remedy), source=str(path))
