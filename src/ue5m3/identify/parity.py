"""End-to-end parity: do two GEMM backends give bit-identical training? (gemm spec section 3).

The paper's check of its emulator against native Blackwell NVFP4 ran one forward and backward, then 100 AdamW
steps of a 1.2B model under both paths from the same weights and batches, and compared logits, loss, every
gradient, and afterwards every parameter and optimizer state, bit for bit. :func:`run` does the same for any two
backends and returns a :class:`ParityReport` with, per tensor and per group, the elements compared, the elements
bitwise equal, the relative L2 error ``||a - b|| / ||b||`` in FP64, the largest absolute difference and the ULP
distances in the tensor's own dtype, plus the per-step losses of both runs.

Backends (:class:`Backend`): ``emulated`` runs the recipe as it is; ``emulated:<gemm model>`` replaces its GEMM
output model, keeping slice width, cross-slice rounding and grid where they apply; a ``:torch`` suffix switches the
fused C kernel off, so quantization and GEMMs take the pure-torch path that must match it bit for bit;
``native_te`` is Transformer Engine NVFP4 on Blackwell and raises :class:`~ue5m3.layers.native_te.NativeUnavailable`
anywhere else, never falling back to the emulator.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from ue5m3 import models
from ue5m3.artifacts import provenance, write_json
from ue5m3.config import Range
from ue5m3.data import DataConfig, RandomTokenStream
from ue5m3.layers import native_te, recipes
from ue5m3.layers.linear import find_scale_state, find_sr_state
from ue5m3.layers.native_te import Execution
from ue5m3.numerics.backend import Backend as NumericsBackend
from ue5m3.numerics.kernels import cpu as cpu_kernel
from ue5m3.training.build import build_model, param_groups
from ue5m3.training.config import TrainConfig
from ue5m3.training.loop import loss_fn, train_step

__all__ = [
    "ParityConfig",
    "Backend",
    "TensorComparison",
    "ParityReport",
    "ulp_distance",
    "compare_tensors",
    "run",
    "write_report",
]

_BACKEND_RE = re.compile(r"native_te|emulated(?::(?P<model>\w+)(?P<torch>:torch)?)?")
_STATE_KEYS = ("exp_avg", "exp_avg_sq", "step")
_INT_VIEW = {2: torch.int16, 4: torch.int32, 8: torch.int64}  # bits of a float, by its size in bytes


@dataclass(frozen=True)
class Backend:
    """How the FP4 GEMMs of a run execute (see the module docstring for the spec grammar)."""

    execution: Execution
    gemm_model: recipes.GemmModel | None = None  # None: the recipe's own output model
    numerics: NumericsBackend = NumericsBackend.AUTO  # ":torch": the pure-torch reference, fused C kernel off

    @property
    def pure_torch(self) -> bool:
        return self.numerics is NumericsBackend.TORCH

    @classmethod
    def parse(cls, spec: str | Backend) -> Backend:
        """A backend from its spec string; ValueError names the string and the accepted forms."""
        if isinstance(spec, Backend):
            return spec
        match = _BACKEND_RE.fullmatch(spec) if isinstance(spec, str) else None
        gemm_models = [m.value for m in recipes.GemmModel]
        if match is None or match["model"] not in (None, *gemm_models):
            raise ValueError(
                f"unknown backend {spec!r}; expected 'native_te', 'emulated' or "
                f"'emulated:<gemm model>[:torch]' with a gemm model in {gemm_models}"
            )
        model = recipes.GemmModel(match["model"]) if match["model"] else None
        numerics = NumericsBackend.TORCH if match["torch"] is not None else NumericsBackend.AUTO
        return cls(Execution(spec.partition(":")[0]), model, numerics)

    @property
    def spec(self) -> str:
        model = [self.gemm_model.value] if self.gemm_model else []
        parts = [self.execution.value, *model] + ["torch"] * self.pure_torch
        return ":".join(parts)

    def recipe(self, cfg: TrainConfig) -> recipes.Recipe:
        """The run's recipe under this backend, resolved against the run's model (absolute layer indices); native_te
        first checks for Transformer Engine and Blackwell."""
        if self.execution is Execution.NATIVE_TE:
            native_te.require_native()  # fail closed before any work
        base = cfg.resolved_recipe()
        if self.gemm_model is None or self.gemm_model is base.gemm.model:
            return base
        gemm = {
            "model": self.gemm_model.value,
            "slice_width": 64 if self.gemm_model is recipes.GemmModel.MMA_SIM else base.gemm.slice_width,
            "cross_slice_rounding": base.gemm.cross_slice_rounding.value,
            "final_grid": base.gemm.final_grid if self.gemm_model is recipes.GemmModel.PROBE_MATCHED else None,
        }
        try:
            return cfg.resolved_recipe(recipes.resolve(cfg.recipe, {**cfg.recipe_overrides, "gemm": gemm}))
        except ValueError as err:
            raise ValueError(f"backend {self.spec!r} does not fit recipe {cfg.recipe!r}: {err}") from None


# ----- comparing tensors --------------------------------------------------------------------------------


def _bits(x: torch.Tensor) -> torch.Tensor:
    """The raw bit pattern of a float tensor as int64 (sign-magnitude, so -0 and +0 differ)."""
    if not x.is_floating_point() or x.element_size() not in _INT_VIEW:
        raise TypeError(f"ULP distances need a 16-, 32- or 64-bit float tensor, got {x.dtype}")
    return x.detach().contiguous().view(_INT_VIEW[x.element_size()]).to(torch.int64)


def _ordered_bits(x: torch.Tensor) -> torch.Tensor:
    """The bits remapped to two's complement, so integer order is float order and -0 and +0 both map to 0."""
    bits = _bits(x)
    return torch.where(bits < 0, torch.iinfo(_INT_VIEW[x.element_size()]).min - bits, bits)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise count of representable values between ``a`` and ``b`` in their dtype (int64).

    Adjacent floats are 1 apart, across zero the steps on both sides add up, +0 and -0 are 0 apart, infinities
    are one step beyond the largest finite value; FP64 distances saturate at the int64 maximum.

    Raises:
        ValueError: shapes or dtypes differ, or either side holds a NaN (its distance is undefined).
    """
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"ulp_distance needs equal shapes and dtypes, got {a.shape}/{a.dtype} and {b.shape}/{b.dtype}")
    nans = int((a.isnan() | b.isnan()).sum())
    if nans:
        raise ValueError(f"ulp_distance is undefined for NaN; {nans} of {a.numel()} elements are NaN on a side")
    oa, ob = _ordered_bits(a), _ordered_bits(b)
    diff = oa - ob
    wrapped = ((oa ^ ob) < 0) & ((diff ^ oa) < 0)  # int64 overflow, only possible for FP64
    limit = torch.iinfo(torch.int64)
    return torch.where(wrapped | (diff == limit.min), torch.full_like(diff, limit.max), diff.abs())


@dataclass(frozen=True, kw_only=True)
class ParityConfig:
    """Settings of ``ue5m3 parity`` (an entry of the pipeline's ``identification.parity`` adds its run's model, recipe
    and data).

    Attributes:
        backend_a: the backend under test (``native_te``, ``emulated`` or ``emulated:<gemm model>[:torch]``).
        backend_b: the reference backend of the relative errors (same spellings).
        steps: AdamW steps after the first forward and backward (also the length of the LR schedule).
        batch_size: sequences per microbatch; null: the run config's ``micro_batch``.
    """

    backend_a: str
    backend_b: str
    steps: int = 3
    batch_size: int | None = None

    RANGES: ClassVar[dict[str, Range]] = {
        "steps": Range(1, 10**6, note="AdamW steps of the comparison"),
        "batch_size": Range(1, 2**16, note="sequences per microbatch, null: the run's micro_batch"),
    }

    def __post_init__(self) -> None:
        for key in ("backend_a", "backend_b"):
            try:
                Backend.parse(getattr(self, key))
            except ValueError as err:
                raise ValueError(f"{key}: {err}") from None
        if self.steps < 1:
            raise ValueError(f"steps: at least 1 AdamW step, got {self.steps!r}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size: a positive int or null, got {self.batch_size!r}")


@dataclass(frozen=True)
class TensorComparison:
    """Agreement of a tensor (or a group of tensors) under two backends; distances use the reference ``b``."""

    dtype: str
    elements: int
    bitwise_equal_elements: int
    nan_elements: int  # NaN on either side: excluded from every distance below
    zero_sign_differs: int  # +0 vs -0: 0 ULPs apart but not bitwise equal
    diff_norm: float  # ||a - b||, FP64
    ref_norm: float  # ||b||, FP64
    max_abs_diff: float
    max_ulp: int
    ulp_1: int
    ulp_2: int
    ulp_over_2: int

    @property
    def rel_l2(self) -> float:
        return self.diff_norm / self.ref_norm if self.ref_norm else (math.inf if self.diff_norm else 0.0)

    @property
    def bitwise_equal(self) -> bool:
        return self.bitwise_equal_elements == self.elements

    @classmethod
    def merge(cls, parts: list[TensorComparison]) -> TensorComparison:
        """One summary of several tensors (norms combine as root sums of squares)."""
        total = {f.name: sum(getattr(p, f.name) for p in parts) for f in dataclasses.fields(cls)[1:]}
        total["diff_norm"] = math.sqrt(sum(p.diff_norm**2 for p in parts))
        total["ref_norm"] = math.sqrt(sum(p.ref_norm**2 for p in parts))
        total["max_abs_diff"] = max((p.max_abs_diff for p in parts), default=0.0)
        total["max_ulp"] = max((p.max_ulp for p in parts), default=0)
        return cls(dtype=",".join(sorted({p.dtype for p in parts})), **total)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "rel_l2": self.rel_l2, "bitwise_equal": self.bitwise_equal}


def compare_tensors(a: torch.Tensor, b: torch.Tensor) -> TensorComparison:
    """Bitwise, L2, absolute and ULP agreement of ``a`` with the reference ``b`` (same shape and dtype)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"cannot compare {a.shape}/{a.dtype} with {b.shape}/{b.dtype}")
    a, b = a.detach().cpu().flatten(), b.detach().cpu().flatten()
    same_bits = _bits(a) == _bits(b)
    nan = a.isnan() | b.isnan()
    keep = ~nan
    ulps = ulp_distance(a[keep], b[keep])
    a64, b64 = a[keep].double(), b[keep].double()
    diff = torch.where(same_bits[keep], 0.0, a64 - b64)  # equal infinities differ by 0, not NaN
    return TensorComparison(
        dtype=str(a.dtype).removeprefix("torch."),
        elements=a.numel(),
        bitwise_equal_elements=int(same_bits.sum()),
        nan_elements=int(nan.sum()),
        zero_sign_differs=int(((ulps == 0) & ~same_bits[keep]).sum()),
        diff_norm=float(diff.norm()) if diff.numel() else 0.0,
        ref_norm=float(b64.norm()) if b64.numel() else 0.0,
        max_abs_diff=float(diff.abs().max()) if diff.numel() else 0.0,
        max_ulp=int(ulps.max()) if ulps.numel() else 0,
        ulp_1=int((ulps == 1).sum()),
        ulp_2=int((ulps == 2).sum()),
        ulp_over_2=int((ulps > 2).sum()),
    )


# ----- running both backends ----------------------------------------------------------------------------

GROUPS = ("logits", "loss", "gradients", "parameters", *_STATE_KEYS)


@dataclass(frozen=True)
class ParityReport:
    """Backend A against backend B (the reference): per group, per tensor comparisons and per-step losses."""

    backend_a: str
    backend_b: str
    executions: tuple[Mapping[str, Any], Mapping[str, Any]]  # what actually ran (incl. whether the C kernel did)
    config: Mapping[str, Any]  # the TrainConfig as run (steps and micro_batch replaced)
    sequence_length: int
    device: str
    tensors: Mapping[str, Mapping[str, TensorComparison]]  # group -> tensor name -> comparison
    losses_a: tuple[float, ...]
    losses_b: tuple[float, ...]

    @property
    def groups(self) -> dict[str, TensorComparison]:
        return {group: TensorComparison.merge(list(items.values())) for group, items in self.tensors.items()}

    @property
    def losses_equal(self) -> bool:
        return [x.hex() for x in self.losses_a] == [x.hex() for x in self.losses_b]

    @property
    def first_difference(self) -> tuple[str, str] | None:
        """(group, tensor name) of the first tensor that is not bitwise equal, in forward-backward-step order."""
        unequal = ((g, n) for g, items in self.tensors.items() for n, c in items.items() if not c.bitwise_equal)
        return next(unequal, None)

    @property
    def bitwise_equal(self) -> bool:
        return self.first_difference is None and self.losses_equal

    def to_dict(self) -> dict[str, Any]:
        return {
            "backends": {"a": self.backend_a, "b": self.backend_b},
            "executions": list(self.executions),
            "config": dict(self.config),
            "sequence_length": self.sequence_length,
            "device": self.device,
            "bitwise_equal": self.bitwise_equal,
            "first_difference": list(self.first_difference or []) or None,
            "groups": {group: c.to_dict() for group, c in self.groups.items()},
            "tensors": {g: {n: c.to_dict() for n, c in items.items()} for g, items in self.tensors.items()},
            "losses": {"a": list(self.losses_a), "b": list(self.losses_b), "equal": self.losses_equal},
        }


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True)


def _fresh(cfg: TrainConfig, recipe: recipes.Recipe, device: torch.device, seq: int) -> tuple[nn.Module, Any]:
    """The initial model and the batch stream, identical for every backend (seeded by ``cfg.seed``)."""
    model, _ = build_model(cfg, recipe, device)
    vocab = models.config(cfg.model, **cfg.model_overrides).vocab_size
    return model, RandomTokenStream(vocab, seq, seed=cfg.seed)


def _forward_backward(cfg: TrainConfig, recipe: recipes.Recipe, device: torch.device, seq: int) -> dict:
    """Logits, loss and every gradient (of the unscaled loss) of the first microbatch that training sees."""
    model, stream = _fresh(cfg, recipe, device, seq)
    state, sr = find_scale_state(model), find_sr_state(model)
    if state is not None:
        state.begin_step(1)
    if sr is not None:
        sr.begin_step(1)
    captured: list[torch.Tensor] = []
    handle = model.register_forward_hook(lambda _module, _inputs, output: captured.append(_cpu(output)))
    inputs, targets = stream.next_batch(cfg.micro_batch)
    autocast = native_te.autocast(recipe) if cfg.execution is Execution.NATIVE_TE else contextlib.nullcontext()
    with autocast:
        loss = loss_fn(model, inputs, targets)
    handle.remove()
    loss.backward()
    grads = {name: _cpu(p.grad) for name, p in model.named_parameters() if p.grad is not None}
    return {"logits": {"logits": captured[0]}, "loss": {"loss": _cpu(loss)}, "gradients": grads}


def _train(cfg: TrainConfig, recipe: recipes.Recipe, device: torch.device, seq: int) -> tuple[dict, list[float]]:
    """Parameters and AdamW states after ``cfg.steps`` optimizer steps from a fresh build, and the losses."""
    model, stream = _fresh(cfg, recipe, device, seq)
    optimizer = torch.optim.AdamW(
        param_groups(model, cfg.optim.weight_decay),
        lr=cfg.optim.lr,
        betas=cfg.optim.betas,
        eps=cfg.optim.eps,
        foreach=False,  # as train.train: the per-parameter loop, the same operations on every backend
    )
    losses = [train_step(step, model, optimizer, stream, cfg, recipe)["loss"] for step in range(1, cfg.steps + 1)]
    out: dict[str, dict[str, torch.Tensor]] = {"parameters": {}, **{key: {} for key in _STATE_KEYS}}
    for name, param in model.named_parameters():
        out["parameters"][name] = _cpu(param)
        for key, value in optimizer.state.get(param, {}).items():
            if key in _STATE_KEYS:
                out[key][name] = _cpu(value)
    return out, losses


def _run_backend(
    cfg: TrainConfig, backend: Backend, recipe: recipes.Recipe, device: torch.device, seq: int
) -> tuple[dict, list[float], dict[str, Any]]:
    """Both phases under one backend, each from the initial weights and the start of the seeded streams."""
    # ":torch" is the run's numerics backend: every quantization and GEMM of the converted layers takes it
    cfg = dataclasses.replace(cfg, execution=backend.execution, backend=backend.numerics)
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(cfg.seed)  # the stochastic-rounding stream, as train.train seeds it on one rank
        first = _forward_backward(cfg, recipe, device, seq)
        torch.manual_seed(cfg.seed)
        trained, losses = _train(cfg, recipe, device, seq)
        execution = native_te.execution_path(recipe, backend.execution, backend.numerics)
        execution["cpu_kernel"] = (
            backend.execution is Execution.EMULATED
            and not backend.pure_torch
            and device.type == "cpu"
            and cpu_kernel.available()
        )
    # "backend" names the parity side (its spec); the numerics backend it ran with stays beside it
    execution["numerics_backend"] = execution.pop("backend")
    return {**first, **trained}, losses, {"backend": backend.spec, **execution}


def _compare_group(group: str, a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, TensorComparison]:
    if a.keys() != b.keys():
        raise ValueError(f"{group}: the backends differ in tensors {sorted(a.keys() ^ b.keys())}")
    return {name: compare_tensors(a[name], b[name]) for name in a}


def run(cfg: TrainConfig, parity: ParityConfig, *, device: str | torch.device | None = None) -> ParityReport:
    """Train ``cfg``'s model under both backends from the same weights, batches and random stream; compare.

    Args:
        cfg: the run (model, recipe, seed, optimizer, accumulation); sequence length from ``cfg.data``.
        parity: the two backends (B is the reference of the relative errors), the steps and the batch size.
        device: where both run (default: CUDA if a backend is native_te, else the CPU, the emulator's device).

    Raises:
        ValueError: a bad backend spec, or one that does not fit the recipe.
        NativeUnavailable: a native_te backend without Transformer Engine on a Blackwell GPU.
    """
    a, b = Backend.parse(parity.backend_a), Backend.parse(parity.backend_b)
    recipe_a, recipe_b = a.recipe(cfg), b.recipe(cfg)  # both validated before either runs
    batch = cfg.micro_batch if parity.batch_size is None else parity.batch_size
    cfg = dataclasses.replace(cfg, steps=parity.steps, micro_batch=batch)
    native = Execution.NATIVE_TE in (a.execution, b.execution)
    device = torch.device(device or ("cuda" if native else "cpu"))
    seq = cfg.data.sequence_length if cfg.data is not None else DataConfig.sequence_length
    tensors_a, losses_a, execution_a = _run_backend(cfg, a, recipe_a, device, seq)
    tensors_b, losses_b, execution_b = _run_backend(cfg, b, recipe_b, device, seq)
    return ParityReport(
        backend_a=a.spec,
        backend_b=b.spec,
        executions=(execution_a, execution_b),
        config=cfg.to_dict(),
        sequence_length=seq,
        device=str(device),
        tensors={group: _compare_group(group, tensors_a[group], tensors_b[group]) for group in GROUPS},
        losses_a=tuple(losses_a),
        losses_b=tuple(losses_b),
    )


def write_report(report: ParityReport, path: str | os.PathLike[str]) -> None:
    """Write the report as JSON atomically, wrapped in a provenance record (config, backends, seed, versions)."""
    backends = [report.backend_a, report.backend_b]
    record = provenance("parity", report.config, backends=backends, seed=report.config["seed"], report=report.to_dict())
    write_json(path, record)
