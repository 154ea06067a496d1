"""Post-load inference: a trained checkpoint rebuilt under its recipe with one activation policy (numerics spec 4).

Evaluating a checkpoint needs tensor references for the forward GEMMs, but the training caches describe the
last training step, not the evaluation. The spec's post-load lifecycle, implemented by :class:`InferenceScales`:

* reset every reference; freeze each loaded weight's amax once (weights do not change at inference);
* then exactly one activation policy (:class:`InferencePolicy`):

  - ``current_tensor``: D = 1, every activation quantized with its own current amax (stateless);
  - ``cold_d50_replay``: a cold D = 50 sample-and-hold whose counter advances once per complete model forward
    ("work unit": one batch-1 sequence for validation NLL), so references refresh at units 1, 51, 101, ... and
    are never reset between tasks. The results depend on the evaluation order, which is part of their identity;
  - ``calibrated_frozen``: a calibration stream disjoint from validation runs with current scaling while the
    running max amax per module is recorded, then frozen;
  - ``bf16``: no quantization at all (a BF16 run, or forced).

Every converted module runs forward-only without stochastic rounding (``QuantLinear.set_inference``).
:class:`InferenceScales` has the ``reference(role, module, tensor)`` signature that
:class:`ue5m3.layers.linear.QuantLinear` calls, so it replaces the training
:class:`ue5m3.numerics.scaling.ScaleState` without touching the GEMM code.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ue5m3 import models
from ue5m3.evaluation.policies import REPLAY_INTERVAL, InferencePolicy
from ue5m3.layers import recipes
from ue5m3.layers.linear import QuantLinear, convert, find_quant_stats
from ue5m3.numerics.checks import DeferredChecks
from ue5m3.numerics.scaling import OperandRole, ScaleState
from ue5m3.training import checkpoint
from ue5m3.training.checkpoint import CheckpointError
from ue5m3.training.config import TrainConfig, read_run_config

__all__ = [
    "InferencePolicy",
    "InferenceScales",
    "InferenceModel",
    "REPLAY_INTERVAL",
    "load_for_inference",
    "load_checkpoint_weights",
    "default_device",
    "order_id",
]


def _coerce_policy(policy: object) -> InferencePolicy:
    try:
        return InferencePolicy(policy)
    except ValueError:
        options = [p.value for p in InferencePolicy]
        raise ValueError(f"unknown inference policy {policy!r}; choose one of {options}") from None


class InferenceScales:
    """Tensor references at inference: frozen weights plus one activation policy.

    ``begin_unit()`` opens the next work unit (one complete model forward). Activations then follow the policy:
    ``current_tensor`` refreshes every unit (a :class:`ScaleState` with D = 1), ``cold_d50_replay`` holds for
    D = 50 units from a cold start (refreshes at units 1, 51, 101, ...; never reset), ``calibrated_frozen``
    returns the recorded running max once :meth:`freeze_activations` has run (during calibration it behaves like
    ``current_tensor`` and records the running max per module). Weights return the amax frozen by
    :meth:`freeze_weights`. Upstream gradients are refused: inference is forward-only.

    Args:
        policy: a quantized :class:`InferencePolicy` (not ``bf16``).
    """

    def __init__(self, policy: InferencePolicy | str) -> None:
        policy = _coerce_policy(policy)
        if policy is InferencePolicy.BF16:
            raise ValueError("policy 'bf16' quantizes nothing and needs no InferenceScales")
        self.policy = policy
        interval = REPLAY_INTERVAL if policy is InferencePolicy.COLD_D50_REPLAY else 1
        self._live = ScaleState(interval)  # reset: a cold state, whatever the checkpoint held
        self._unit = 0
        self._weights: dict[str, torch.Tensor] = {}
        self._calibration: dict[str, torch.Tensor] = {}
        self._frozen: dict[str, torch.Tensor] | None = None
        self._weight_freezes = 0

    @property
    def weight_epoch(self) -> int:
        """Weight references are frozen: they change only when :meth:`freeze_weights` runs again."""
        return self._weight_freezes

    @property
    def unit(self) -> int:
        """The current work unit (0 before the first)."""
        return self._unit

    @property
    def frozen_activations(self) -> dict[str, float] | None:
        """The frozen activation references of ``calibrated_frozen`` (None before freezing)."""
        return None if self._frozen is None else {k: float(v) for k, v in self._frozen.items()}

    def begin_unit(self) -> int:
        """Open the next work unit; returns its number (1, 2, ...)."""
        self._unit += 1
        self._live.begin_step(self._unit)
        return self._unit

    def begin_step(self, step: int) -> None:
        """Refused: inference advances by work units (:meth:`begin_unit`), never by optimizer steps."""
        raise RuntimeError("InferenceScales advances once per work unit; call begin_unit(), not begin_step()")

    def freeze_weights(self, model: nn.Module) -> None:
        """Record each converted weight's amax once (FP32, like a training refresh)."""
        self._weight_freezes += 1
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, QuantLinear):
                    self._weights[module.policy.module] = module.weight.detach().abs().amax().to(torch.float32)

    def freeze_activations(self) -> None:
        """End calibration: hold the running max per module from now on (``calibrated_frozen`` only)."""
        if self.policy is not InferencePolicy.CALIBRATED_FROZEN:
            raise ValueError(f"freeze_activations is for policy 'calibrated_frozen', not {self.policy.value!r}")
        if not self._calibration:
            raise ValueError("no calibration forward ran before freeze_activations(); feed the calibration stream")
        self._frozen = dict(self._calibration)

    def reference(
        self, role: OperandRole | str, module: str, tensor: torch.Tensor, checks: DeferredChecks | None = None
    ) -> torch.Tensor:
        """The reference amax of ``tensor`` as ``(role, module)`` in the current unit (FP32 0-dim).

        ``checks`` defers the refreshed amax's finiteness check to the unit's single read
        (:meth:`InferenceModel.forward_unit`)."""
        role = OperandRole(role)
        if role is OperandRole.WEIGHT:
            if module not in self._weights:
                raise RuntimeError(f"no frozen weight amax for {module!r}; call freeze_weights(model) after loading")
            return self._weights[module].to(device=tensor.device, copy=True)
        if role is OperandRole.UPSTREAM_GRADIENT:
            raise RuntimeError(f"inference is forward-only, but {module!r} asked for an upstream-gradient reference")
        if self._frozen is not None:
            if module not in self._frozen:
                raise RuntimeError(f"module {module!r} saw no calibration forward; its activation has no reference")
            return self._frozen[module].to(device=tensor.device, copy=True)
        if self._unit == 0:
            raise RuntimeError("reference() before the first work unit; call begin_unit() per model forward")
        ref = self._live.reference(role, module, tensor, checks)
        if self.policy is InferencePolicy.CALIBRATED_FROZEN:
            held = self._calibration.get(module)
            value = ref.detach().cpu()
            self._calibration[module] = value if held is None else torch.maximum(held, value)
        return ref

    def refresh_units(self) -> dict[str, int]:
        """Last refresh unit of each live activation reference (``role/module`` -> unit)."""
        return {key: entry["last_refresh"] for key, entry in self._live.state_dict()["entries"].items()}


def order_id(order: Sequence[int]) -> str:
    """A short identity of an evaluation order (SHA-256 of the comma-joined indices, 16 hex digits)."""
    return hashlib.sha256(",".join(str(int(i)) for i in order).encode()).hexdigest()[:16]


@dataclass
class InferenceModel:
    """A loaded checkpoint ready for evaluation; :meth:`forward_unit` is one work unit.

    Attributes:
        model: the rebuilt model (eval mode, converted linears in inference mode).
        scales: the reference state (None for ``bf16``).
        policy: the activation policy.
        identity: what identifies results computed with it (checkpoint hash, recipe, policy, GEMM model, seed,
            versions); the evaluation order id is added by the evaluator.
    """

    model: nn.Module
    scales: InferenceScales | None
    policy: InferencePolicy
    identity: dict[str, Any] = field(default_factory=dict)
    units: int = 0

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def forward_unit(self, input_ids: torch.Tensor, *, return_hidden: bool = False) -> torch.Tensor:
        """One complete model forward (advances the work-unit counter once).

        Args:
            input_ids: int64 [B, T] (B = 1 for validation NLL).
            return_hidden: return the final-norm hidden states [B, T, hidden] instead of FP32 logits [B, T, V].
        """
        self.units += 1
        if self.scales is not None:
            self.scales.begin_unit()
        device = self.device
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            hidden = self.model.hidden_states(input_ids.to(device))
        stats = find_quant_stats(self.model)
        if stats is not None:  # the unit's one read of the quantizers' deferred finiteness checks
            stats.checks.raise_if_any()
        return hidden if return_hidden else self.head(hidden)

    @torch.no_grad()
    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The output head in FP32 (never quantized): [..., hidden] -> [..., V]."""
        head = self.model.lm_head
        bias = None if head.bias is None else head.bias.float()
        return F.linear(hidden.float(), head.weight.float(), bias)


# ----- loading ------------------------------------------------------------------------------------------


def load_checkpoint_weights(
    run_dir: str | os.PathLike[str], step: int | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, Any], Path]:
    """Verify a checkpoint of the run completely and load only its model weights: checkpoint ``step``, or (None) the
    newest that verifies, a newer one that does not passed over with a warning naming it (never moved: the trainer
    may hold the run).

    Returns:
        (model state dict, manifest, checkpoint directory).

    Raises:
        CheckpointError: no checkpoint verifies, or the requested one is missing or does not verify (a file missing,
            truncated or corrupted, a folder named for another step, a malformed manifest), naming it.
    """
    root = Path(run_dir) / "checkpoints"
    if step is None:
        found = checkpoint.newest_valid(root, set_aside=False)
        if found is None:
            raise CheckpointError(f"no checkpoint under {root}; train the run first")
        path, manifest = found
    else:
        path, manifest = checkpoint.at_step(root, step)
    return checkpoint.load_model_state(path, manifest), manifest, path


def _run_recipe(run_dir: Path, cfg: TrainConfig) -> recipes.Recipe:
    recipe = cfg.resolved_recipe()  # absolute layer indices of the run's model, as the run converted with
    final = run_dir / "final.json"
    if final.is_file():
        recorded = json.loads(final.read_text()).get("recipe")
        if recorded is not None and recorded != recipe.name:
            raise ValueError(f"{final} records recipe {recorded!r} but the run's config resolves to {recipe.name!r}")
    return recipe


def _check_recipe(given: recipes.Recipe, run: recipes.Recipe) -> None:
    if (given.scheme, given.block_size) != (run.scheme, run.block_size):
        raise ValueError(
            f"recipe {given.name!r} (scheme {given.scheme!r}, block size {given.block_size!r}) does not match the "
            f"run's recipe {run.name!r} (scheme {run.scheme!r}, block size {run.block_size!r}); evaluate with the "
            "run's recipe or one of the same scheme"
        )


def load_for_inference(
    run_dir: str | os.PathLike[str],
    step: int | None = None,
    *,
    policy: InferencePolicy | str,
    recipe: recipes.Recipe | str | None = None,
    calibration: Any = None,
    validation: Any = None,
    force_bf16: bool = False,
    device: torch.device | str | None = None,
) -> InferenceModel:
    """Rebuild a run's checkpoint for evaluation under exactly one activation policy.

    Args:
        run_dir: the training run directory (``config.resolved.json``, ``checkpoints/``, ``final.json``).
        step: checkpoint step (default: the newest).
        policy: an :class:`InferencePolicy` or its value.
        recipe: a recipe (or name) to evaluate under; must share the run's scheme and block size (default: the
            run's recipe). Either is resolved against the run's model (its layer selectors become indices).
        calibration: the calibration :class:`ue5m3.data.EvalSet` (``calibrated_frozen`` only).
        validation: the validation EvalSet the results will be computed on (``calibrated_frozen``: checked
            disjoint from ``calibration``).
        force_bf16: allow policy ``bf16`` on a quantized run (evaluates its weights unquantized).
        device: where to run (default: CUDA if available, else CPU).

    Raises:
        CheckpointError: a missing or corrupted checkpoint (the message names the file).
        ValueError: a recipe mismatch, a policy that does not fit the recipe, or overlapping calibration and
            validation sets.
    """
    policy = _coerce_policy(policy)
    run_dir = Path(run_dir)
    cfg = read_run_config(run_dir)
    run_recipe = _run_recipe(run_dir, cfg)
    if recipe is not None:
        recipe = cfg.resolved_recipe(recipes.get(recipe) if isinstance(recipe, str) else recipe)
        _check_recipe(recipe, run_recipe)
    else:
        recipe = run_recipe
    _check_policy(policy, recipe, force_bf16, calibration, validation)
    if cfg.execution != "emulated":
        raise ValueError(f"run {run_dir} used execution {cfg.execution!r}; only emulated runs can be reloaded here")
    state, manifest, path = load_checkpoint_weights(run_dir, step)
    device = torch.device(device) if device is not None else default_device()
    model = models.build(cfg.model, device="meta", **cfg.model_overrides)
    scales = None
    if policy is not InferencePolicy.BF16:
        scales = InferenceScales(policy)
        select = cfg.fp4_select if cfg.fp4_select is not None else tuple(models.eligible_linears(model))
        convert(model, recipe, select=select, scale_state=scales)  # type: ignore[arg-type]  # same reference() API
    models.materialize(model, device)
    model.load_state_dict(state)
    model.eval()
    for module in model.modules():
        if isinstance(module, QuantLinear):
            module.set_inference()
    identity = {
        "checkpoint": str(path),
        "checkpoint_step": manifest["step"],
        "checkpoint_sha256": checkpoint.weights_sha256(manifest),
        "recipe": recipe.name,
        "run_recipe": run_recipe.name,
        "policy": policy.value,
        "gemm_output_model": recipe.gemm.model.value if policy is not InferencePolicy.BF16 else "bf16",
        "seed": cfg.seed,
        "model": cfg.model,
    }
    loaded = InferenceModel(model=model, scales=scales, policy=policy, identity=identity)
    if scales is not None:
        scales.freeze_weights(model)
        if policy is InferencePolicy.CALIBRATED_FROZEN:
            for inputs, _ in calibration:
                loaded.forward_unit(inputs, return_hidden=True)
            scales.freeze_activations()
            identity["calibration_sha256"] = calibration.sha256()
            identity["calibration_sequences"] = len(calibration)
    return loaded


def default_device() -> torch.device:
    """Where evaluations run unless told: the current CUDA device if there is one, else the CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def _check_policy(policy: InferencePolicy, recipe: recipes.Recipe, force_bf16: bool, calibration, validation) -> None:
    if policy is InferencePolicy.BF16:
        if recipe.is_quantized and not force_bf16:
            raise ValueError(
                f"policy 'bf16' on the quantized recipe {recipe.name!r} evaluates without quantization; "
                "pass force_bf16=True to do so deliberately"
            )
        return
    if not recipe.is_quantized:
        raise ValueError(f"policy {policy.value!r} needs a quantized recipe; {recipe.name!r} is BF16: use 'bf16'")
    if policy is InferencePolicy.CALIBRATED_FROZEN:
        if calibration is None or validation is None or len(calibration) == 0:
            raise ValueError("policy 'calibrated_frozen' needs a non-empty calibration set and the validation set")
        _check_disjoint(calibration, validation)
    elif calibration is not None:
        raise ValueError(f"a calibration set is only used by 'calibrated_frozen', not {policy.value!r}")


def _check_disjoint(calibration: Any, validation: Any) -> None:
    """Refuse calibration data that shares documents or windows with validation."""
    shared = sorted(set(calibration.document_ids) & set(validation.document_ids))
    if shared:
        raise ValueError(
            f"the calibration and validation sets share {len(shared)} document(s): {shared[:10]}; calibrate on "
            "the data's calibration split (open_data(...).calibration), which is disjoint from validation"
        )
    val_rows = {tuple(row.tolist()) for row in validation.windows}
    overlapping = [i for i, row in enumerate(calibration.windows) if tuple(row.tolist()) in val_rows]
    if overlapping:
        raise ValueError(
            f"calibration windows {overlapping[:10]} also occur in the validation set; calibrate on the data's "
            "calibration split, which is disjoint from validation"
        )
