"""Throughput ablation of the two native NVFP4 recipes (paper table 10; experiments spec section 6).

The paper times the Nemotron-H 8B *model body* on one GB200: batch 1, sequence 1,024, synchronised forward +
backward, 100 measured steps after warm-up, once under the Transformer Engine recipe (RHT, 96 FP4 + 16 BF16
linears: 3,212.39 tokens/s) and once without RHT with all 112 linears in FP4 (3,893.87 tokens/s, +21.2%).

What is timed, per step (:class:`ModelBody`): every residual block and the final norm, forward and backward,
from a fixed hidden-state tensor ``[batch, sequence, hidden]`` drawn once on the device (it requires grad, so
the first block's dgrad runs as it does behind an embedding) to the parameter gradients, with a fixed upstream
gradient. Not timed, as in the paper: data loading, the embedding lookup, the output head and the loss, the
optimizer and any communication; nothing is compiled. On CUDA each step ends with ``torch.cuda.synchronize``,
so the wall time is the device's. Parameters are FP32 and the body runs under BF16 autocast on CUDA (FP32 on the
CPU), as the trainer runs it (:func:`ue5m3.training.loop.loss_fn`).

Every run measures the BF16 body first (plain ``nn.Linear``; the ratio column is against it), then each
configured recipe, each on a freshly built body with the same initial weights:

* ``execution: native_te`` converts the selected linears to ``te.Linear`` under ``te.autocast`` (Blackwell,
  :mod:`ue5m3.layers.native_te`). The hardware is checked before anything is built or measured: without
  Transformer Engine, without CUDA, or below compute capability 10.0 the run raises
  :class:`~ue5m3.layers.native_te.NativeUnavailable` naming what is missing, and writes nothing. It never falls
  back to the emulator.
* ``execution: emulated`` converts them to :class:`~ue5m3.layers.linear.QuantLinear` (any device), with weight
  caching off: every step re-quantizes its weights, as a training step does after each optimizer update.

The conversion records give the FP4 and BF16 linear counts of each row (96 + 16 and 112 + 0 at 8B); the CSV
and the provenance record name the execution path, GEMM output model, backend and device of every number.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import platform
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from ue5m3 import config as config_loader
from ue5m3 import models
from ue5m3.artifacts import provenance, write_csv, write_json
from ue5m3.config import Range
from ue5m3.layers import native_te, recipes
from ue5m3.layers.linear import (
    ConversionRecord,
    WeightCaching,
    convert,
    find_scale_state,
    find_sr_state,
    layer_index,
    set_weight_caching,
)
from ue5m3.layers.native_te import Execution
from ue5m3.layers.recipes import GemmModel, Recipe
from ue5m3.numerics.backend import Backend
from ue5m3.numerics.philox import SRState
from ue5m3.numerics.scaling import ScaleState
from ue5m3.training.config import model_layers

__all__ = [
    "ThroughputConfig",
    "ModelBody",
    "COLUMNS",
    "BASELINE",
    "resolve_recipe",
    "planned_linears",
    "count_linears",
    "build_body",
    "measure",
    "check_hardware",
    "run",
]

BASELINE = "bf16"
"""The recipe every run measures first; ``ratio_to_bf16`` is each row's tokens/s over its tokens/s."""

COLUMNS = [
    "run",
    "model",
    "recipe",
    "execution",
    "gemm_model",
    "backend",
    "rht",
    "fp4_linears",
    "bf16_linears",
    "device",
    "device_name",
    "compute_dtype",
    "threads",
    "batch_size",
    "sequence_length",
    "tokens_per_step",
    "warmup_steps",
    "measured_steps",
    "wall_seconds",
    "seconds_per_step",
    "tokens_per_second",
    "ratio_to_bf16",
    "peak_memory_mib",
]
"""Columns of ``throughput.csv``, one row per measured body (the BF16 baseline first)."""

_LABEL = re.compile(r"[A-Za-z0-9_]+")


@dataclass(frozen=True, kw_only=True)
class ThroughputConfig:
    """Configuration of ``ue5m3 throughput`` (defaults: the paper's protocol, native on one Blackwell GPU).

    The pipeline builds one per entry of ``throughput.runs`` (:func:`ue5m3.pipeline.jobs.throughput_settings`).

    Attributes:
        run: this run's name in the tables and figures (the pipeline: its key in ``throughput.runs``).
        model: model flavour (:func:`ue5m3.models.names`); only its blocks and final norm are timed.
        model_overrides: config fields of the flavour to replace (e.g. the 8B block pattern at debug width).
        recipes: recipes timed after the BF16 baseline, by packaged name or recipe file; never ``bf16`` itself.
        execution: ``native_te`` (Transformer Engine, Blackwell only; fails closed elsewhere) or ``emulated``.
        device: ``cpu``, ``cuda`` or ``cuda:N``; ``native_te`` needs CUDA.
        backend: who computes the emulated quantizations and GEMMs (``auto``: the device's fused kernels).
        batch_size: sequences per step.
        sequence_length: tokens per sequence.
        warmup_steps: untimed steps before the measurement (kernel selection, allocator, caches).
        measured_steps: timed steps.
        seed: initial weights, the hidden-state input, the upstream gradient and the stochastic-rounding streams.
    """

    run: str = "native"
    model: str = "nemotron_h_8b"
    model_overrides: Mapping[str, Any] = field(default_factory=dict)
    recipes: tuple[str, ...] = ("nvfp4_te", "nvfp4_no_rht_all_linears")
    execution: Execution = Execution.NATIVE_TE
    device: str = "cuda"
    backend: Backend = Backend.AUTO
    batch_size: int = 1
    sequence_length: int = 1024
    warmup_steps: int = 10
    measured_steps: int = 100
    seed: int = 0

    RANGES: ClassVar[dict[str, Range]] = {
        "batch_size": Range(1, 2**16, note="sequences per step"),
        "sequence_length": Range(1, 2**20, note="tokens per sequence; the paper: 8,192"),
        "warmup_steps": Range(0, 10**6, note="untimed steps"),
        "measured_steps": Range(1, 10**6, note="timed steps"),
        "seed": Range(0, 2**63 - 1, note="a seed"),
    }

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_overrides", dict(self.model_overrides))
        object.__setattr__(self, "recipes", tuple(self.recipes))
        if not _LABEL.fullmatch(self.run):
            raise ValueError(f"run: a name of letters, digits and '_', got {self.run!r}")
        if self.model not in models.names():
            raise ValueError(f"model: unknown model {self.model!r}; known models: {list(models.names())}")
        try:
            models.config(self.model, **self.model_overrides)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"model_overrides: {exc}") from None
        self._check_recipes()
        try:
            device = torch.device(self.device)
        except RuntimeError:
            device = None
        if device is None or device.type not in ("cpu", "cuda"):
            raise ValueError(f"device: expected 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if self.execution is Execution.NATIVE_TE and device.type != "cuda":
            raise ValueError(f"device: execution 'native_te' runs on a CUDA device, got {self.device!r}")
        for key, low in (("batch_size", 1), ("sequence_length", 1), ("warmup_steps", 0), ("measured_steps", 1)):
            value = getattr(self, key)
            if value < low:
                raise ValueError(f"{key}: must be an int >= {low}, got {value!r}")
        if self.seed < 0:
            raise ValueError(f"seed: must be a non-negative int, got {self.seed!r}")

    def _check_recipes(self) -> None:
        if not self.recipes:
            raise ValueError("recipes: name at least one recipe to time against the BF16 baseline")
        if len(set(self.recipes)) != len(self.recipes):
            raise ValueError(f"recipes: duplicate recipes {list(self.recipes)!r}")
        for i, spec in enumerate(self.recipes):
            try:
                recipe = resolve_recipe(self, spec)
            except (ValueError, TypeError, FileNotFoundError) as exc:
                raise ValueError(f"recipes[{i}]: {exc}") from None
            if recipe.gemm.model is GemmModel.BF16:
                raise ValueError(f"recipes[{i}]: {spec!r} is the BF16 baseline, which every run measures first")
            if self.execution is Execution.NATIVE_TE and not recipe.native_te:
                native = [n for n in recipes.names() if recipes.get(n).native_te]
                raise ValueError(
                    f"recipes[{i}]: {spec!r} has no native Transformer Engine path; native recipes: {native} "
                    "(time the others with execution 'emulated')"
                )


def resolve_recipe(cfg: ThroughputConfig, spec: str) -> Recipe:
    """Recipe ``spec`` resolved against the run's model (depth-relative layer keys become its indices: "the final 8
    layers" are 44-51 of the 8B pattern), as the trainer resolves a run's recipe.

    Raises:
        ValueError: an unknown recipe, or a layer key the model cannot satisfy (naming the model and its depth).
    """
    return recipes.resolve(spec).for_model(model_layers(cfg.model, cfg.model_overrides))


# ----- the timed module ---------------------------------------------------------------------------------


def _final_norm(model: nn.Module) -> nn.Module:
    if isinstance(model, models.NemotronH):
        return model.backbone.norm_f
    if isinstance(model, models.DenseTransformer):
        return model.model.norm
    raise TypeError(f"expected a NemotronH or DenseTransformer, got {type(model).__name__}")


class ModelBody(nn.Module):
    """The timed part of a language model: its residual blocks in order, then the final norm.

    No embedding lookup and no output head: it maps hidden states ``[B, T, hidden]`` to the final-norm output of
    the same shape. It holds the model's own (already converted) block modules, so their names in ``model`` and
    their recipe decisions (BF16 layers by block index) are unchanged.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(models.blocks(model))
        self.final_norm = _final_norm(model)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            hidden = block(hidden)  # [B, T, hidden] -> [B, T, hidden]
        return self.final_norm(hidden)


def planned_linears(model: nn.Module, recipe: Recipe) -> dict[str, int]:
    """How many eligible linears of ``model`` a recipe (resolved for it, :func:`resolve_recipe`) runs in FP4 and in
    BF16 (no conversion; any device).

    Nemotron-H 8B: ``nvfp4_te`` 96 + 16 (layers 44-51 in BF16), ``nvfp4_no_rht_all_linears`` 112 + 0, ``bf16``
    0 + 112.
    """
    names = models.eligible_linears(model)
    bf16 = sum(1 for n in names if recipe.gemm.model is GemmModel.BF16 or recipe.is_bf16_layer(layer_index(n)))
    return {"fp4_linears": len(names) - bf16, "bf16_linears": bf16}


def count_linears(records: Sequence[ConversionRecord]) -> dict[str, int]:
    """FP4 and BF16 linear counts of a conversion's records."""
    fp4 = sum(1 for r in records if r.status in ("converted", "already_converted"))
    return {"fp4_linears": fp4, "bf16_linears": len(records) - fp4}


def build_body(
    cfg: ThroughputConfig, recipe: Recipe, execution: Execution, device: torch.device | str
) -> tuple[ModelBody, tuple[ConversionRecord, ...]]:
    """Build ``cfg.model``, initialise it from ``cfg.seed`` on ``device`` and convert every eligible linear under
    ``recipe`` (resolved for the model, :func:`resolve_recipe`).

    On the meta device nothing is allocated or initialised (the 8B model's conversion can be audited anywhere).

    Returns:
        (the body, one conversion record per eligible linear).

    Raises:
        NativeUnavailable: ``execution`` is native_te and Transformer Engine or a Blackwell GPU is missing.
    """
    device = torch.device(device)
    model = models.build(cfg.model, device="meta", **cfg.model_overrides)
    if device.type != "meta":
        model.to_empty(device=device)
        model.init_weights(torch.Generator(device).manual_seed(cfg.seed))
    select = models.eligible_linears(model)
    planned = planned_linears(model, recipe)
    if execution is Execution.NATIVE_TE and recipe.native_te:
        records = native_te.convert_native(model, recipe, select=select)
    else:
        records = convert(model, recipe, select=select, sr_state=SRState(cfg.seed), backend=cfg.backend)
        # as the trainer with one microbatch per step: every step quantizes its weights afresh (no packed copies
        # held between steps, whose memory a training step would not have either)
        set_weight_caching(model, WeightCaching.OFF)
    assert count_linears(records) == planned, (count_linears(records), planned)
    return ModelBody(model), records


# ----- measurement --------------------------------------------------------------------------------------


def check_hardware(cfg: ThroughputConfig) -> None:
    """Fail before anything is built when the run cannot run here (never a silent fallback).

    Raises:
        NativeUnavailable: native_te without Transformer Engine, without CUDA, or below compute capability 10.0.
        ValueError: a CUDA device requested where there is none, or a device index that does not exist.
    """
    if cfg.execution is Execution.NATIVE_TE:
        try:
            native_te.require_native()
        except native_te.NativeUnavailable as err:
            raise native_te.NativeUnavailable(
                f"run {cfg.run!r} (execution native_te) needs Transformer Engine, CUDA and a Blackwell GPU "
                f"(compute capability >= 10.0); nothing was measured or written: {err} "
                "(to time the recipes here, set execution 'emulated')"
            ) from err
    device = torch.device(cfg.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {cfg.device!r}: CUDA is not available here; run on a GPU node or set device 'cpu'"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device {cfg.device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")


logger = logging.getLogger(__name__)


def _log(message: str) -> None:
    logger.info(message)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def _autocast(recipe: Recipe, execution: Execution, device: torch.device) -> Iterator[None]:
    """BF16 autocast on CUDA (FP32 on the CPU), as the trainer; inside TE's autocast for a native recipe."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"))
        if execution is Execution.NATIVE_TE and recipe.native_te:
            stack.enter_context(native_te.autocast(recipe))
        yield


def _step(
    body: ModelBody,
    hidden: torch.Tensor,
    upstream: torch.Tensor,
    step: int,
    recipe: Recipe,
    execution: Execution,
    state: ScaleState | None,
    sr: SRState | None,
) -> None:
    """One forward + backward of the body (not synchronised: the caller synchronises)."""
    if state is not None:
        state.begin_step(step)  # current scaling (D = 1) for the NVFP4 recipes: fresh references every step
    if sr is not None:
        sr.begin_step(step)
    body.zero_grad(set_to_none=True)  # as after an optimizer step: backward allocates fresh gradients
    hidden.grad = None
    with _autocast(recipe, execution, hidden.device):
        out = body(hidden)
    out.backward(upstream.to(out.dtype))


def measure(
    body: ModelBody, cfg: ThroughputConfig, recipe: Recipe, execution: Execution, device: torch.device
) -> dict[str, float]:
    """Warm up, then time ``cfg.measured_steps`` synchronised forward + backward steps of ``body``.

    Returns:
        wall_seconds (all measured steps), seconds_per_step, tokens_per_second, peak_memory_mib (CUDA; else None).
    """
    generator = torch.Generator(device).manual_seed(cfg.seed)
    hidden_size = models.config(cfg.model, **cfg.model_overrides).hidden_size
    shape = (cfg.batch_size, cfg.sequence_length, hidden_size)
    hidden = torch.randn(shape, generator=generator, device=device).requires_grad_(True)
    # dY of a mean token loss is about 1/tokens per element; its scale does not change the work done
    upstream = torch.randn(shape, generator=generator, device=device) / (cfg.batch_size * cfg.sequence_length)
    states = {"state": find_scale_state(body), "sr": find_sr_state(body)}  # looked up once, outside the timing
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for step in range(1, cfg.warmup_steps + 1):
        _step(body, hidden, upstream, step, recipe, execution, **states)
    _synchronize(device)
    first = cfg.warmup_steps + 1
    report_every = max(1, cfg.measured_steps // 10)
    start = time.perf_counter()
    for step in range(first, first + cfg.measured_steps):
        _step(body, hidden, upstream, step, recipe, execution, **states)
        _synchronize(device)  # synchronised steps: the wall time is the device's, not the launch queue's
        done = step - first + 1
        if done % report_every == 0 or done == cfg.measured_steps:
            _log(f"  {recipe.name}: {done}/{cfg.measured_steps} steps, {time.perf_counter() - start:.3f} s")
    wall = time.perf_counter() - start
    tokens = cfg.batch_size * cfg.sequence_length * cfg.measured_steps
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    return {
        "wall_seconds": wall,
        "seconds_per_step": wall / cfg.measured_steps,
        "tokens_per_second": tokens / wall,
        "peak_memory_mib": peak,
    }


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine() or "cpu"


def _device_facts(device: torch.device) -> dict[str, Any]:
    facts: dict[str, Any] = {"device": str(device), "threads": torch.get_num_threads()}
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        facts |= {
            "device_name": torch.cuda.get_device_name(device),
            "compute_capability": f"{major}.{minor}",
            "torch_cuda": torch.version.cuda,
        }
    else:
        facts |= {"device_name": _cpu_name()}
    try:
        facts["transformer_engine"] = metadata.version("transformer_engine")
    except metadata.PackageNotFoundError:
        facts["transformer_engine"] = None
    return facts


def _row(
    cfg: ThroughputConfig, recipe: Recipe, execution: Execution, counts: Mapping[str, int], facts: Mapping[str, Any]
) -> dict[str, Any]:
    path = native_te.execution_path(recipe, execution, "torch" if recipe.gemm.model is GemmModel.BF16 else cfg.backend)
    device = torch.device(cfg.device)
    return {
        "run": cfg.run,
        "model": cfg.model,
        "recipe": recipe.name,
        "execution": path["execution"],
        "gemm_model": path["gemm_model"],
        "backend": path["backend"],
        "rht": "yes" if any(role.rht for role in recipe.roles.values()) else "no",
        **counts,
        "device": facts["device"],
        "device_name": facts["device_name"],
        "compute_dtype": "bfloat16_autocast" if device.type == "cuda" else "float32",
        "threads": facts["threads"],
        "batch_size": cfg.batch_size,
        "sequence_length": cfg.sequence_length,
        "tokens_per_step": cfg.batch_size * cfg.sequence_length,
        "warmup_steps": cfg.warmup_steps,
        "measured_steps": cfg.measured_steps,
    }


def run(cfg: ThroughputConfig, out_dir: str | Path) -> dict[str, Path]:
    """Time the BF16 body and each recipe's; write throughput.csv and provenance.json (only when all succeed).

    Raises:
        NativeUnavailable: see :func:`check_hardware` (raised before anything is built or written).
        ValueError: see :func:`check_hardware`.
    """
    check_hardware(cfg)
    device = torch.device(cfg.device)
    facts = _device_facts(device)
    plan = [(resolve_recipe(cfg, BASELINE), Execution.EMULATED)]
    plan += [(resolve_recipe(cfg, spec), cfg.execution) for spec in cfg.recipes]
    _log(
        f"run {cfg.run!r}: {cfg.model} body on {facts['device']} ({facts['device_name']}), batch {cfg.batch_size} x "
        f"{cfg.sequence_length} tokens, {cfg.warmup_steps} warm-up + {cfg.measured_steps} measured steps"
    )
    rows, conversions = [], {}
    for recipe, execution in plan:
        body, records = build_body(cfg, recipe, execution, device)
        counts = count_linears(records)
        path = native_te.execution_path(recipe, execution, cfg.backend)
        _log(
            f"{recipe.name} ({path['execution']}, {path['gemm_model']}): {counts['fp4_linears']} FP4 + "
            f"{counts['bf16_linears']} BF16 linears"
        )
        row = _row(cfg, recipe, execution, counts, facts) | measure(body, cfg, recipe, execution, device)
        _log(
            f"{recipe.name}: {row['wall_seconds']:.3f} s for {cfg.measured_steps} steps, "
            f"{row['tokens_per_second']:.2f} tokens/s"
        )
        rows.append(row)
        conversions[recipe.name] = [dataclasses.asdict(r) for r in records]
        del body
        _release(device)
    baseline = rows[0]["tokens_per_second"]
    for row in rows:
        row["ratio_to_bf16"] = row["tokens_per_second"] / baseline
    out = Path(out_dir)
    paths = {"table": out / "throughput.csv", "provenance": out / "provenance.json"}
    write_csv(paths["table"], rows, COLUMNS)
    record = provenance("throughput", config_loader.dump(cfg), hardware=facts, conversions=conversions)
    write_json(paths["provenance"], record)
    return paths
