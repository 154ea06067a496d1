"""Checkpoint scale-target snapshot: where the wgrad dY^T block scales land in UE5M3 (experiments spec section 7).

One training-mode forward and backward of the first held-out sequence, with no update, on an unconverted
(high-precision) copy of the checkpoint. Hooks on selected linears (default: the down projections of the final
four layers) capture X, W and dY; the wgrad operand dY^T [out, T] is cut into blocks of 16 along the token
(reduction) dimension and each block's amax a_B becomes a raw scale code u = a_B * T / g for the current dY amax
g and each target T, computed in the quantizer's FP32 order (G = T * 6 / g, then u = a_B * (G * (1/6))), then
rounded RNE to UE5M3. Counted per module and target: zero blocks, nonzero raw codes below 2^-17 and 2^-18,
codes that round to zero before repair, saturated codes (u above UE5M3's max). Histograms bin log10|value| of
X, W, dY, the block maxima and the raw codes in 0.125-wide bins over [-16, 8). This illustrates codebook
placement at one checkpoint; it is not a replay of the D = 50 history.

The pass runs as the trainer runs the 8B step, so that it fits on one GPU: every block checkpointed (recomputed in
the backward pass), the FP32 head and cross entropy in chunks of 256 positions
(:func:`ue5m3.training.loss.chunked_cross_entropy`), and parameter gradients only where the hooked modules' dY
needs them (the blocks from the first hooked one on). None of this changes dY's bits on the CPU (tested): the
chunked loss changes the loss only by FP32 summation order, and dY never reads the head's weight gradient.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from ue5m3 import config, models
from ue5m3.artifacts import provenance, write_csv, write_json
from ue5m3.config import Range
from ue5m3.evaluation.inference import default_device, load_checkpoint_weights
from ue5m3.layers.linear import layer_index
from ue5m3.numerics import formats
from ue5m3.training import checkpoint, parallelize
from ue5m3.training.config import read_run_config
from ue5m3.training.loss import HEAD_CHUNK, lm_loss

__all__ = [
    "SnapshotConfig",
    "BLOCK",
    "Capture",
    "default_modules",
    "capture",
    "block_maxima",
    "raw_codes",
    "code_counts",
    "log10_histogram",
    "run_snapshot",
]

BLOCK = 16
BIN_WIDTH, BIN_LOW, BIN_HIGH = 0.125, -16.0, 8.0


@dataclass(frozen=True, kw_only=True)
class SnapshotConfig:
    """Settings of ``ue5m3 scale-snapshot`` (the pipeline's ``evaluation.snapshot``).

    Attributes:
        modules: fnmatch patterns of the linears to hook; null: the down projections of the final four layers.
        targets: tensor-scale targets T whose raw UE5M3 codes are counted (the paper: 448 and 2048).
    """

    modules: tuple[str, ...] | None = None
    targets: tuple[float, ...] = (448.0, 2048.0)

    RANGES: ClassVar[dict[str, Range]] = {
        "targets": Range(1, 2**16, note="a tensor-scale target T; the paper: 448 to 4096"),
    }

    def __post_init__(self) -> None:
        if self.modules is not None and not self.modules:
            raise ValueError("modules: null (the default modules) or at least one pattern, got []")
        if not self.targets or any(not 0 < t < float("inf") for t in self.targets):
            raise ValueError(f"targets: a non-empty list of positive numbers, got {list(self.targets)!r}")


@dataclass(frozen=True)
class Capture:
    """High-precision tensors of one linear: X [T, in], W [out, in], dY [T, out] (FP32 copies)."""

    x: torch.Tensor
    w: torch.Tensor
    dy: torch.Tensor


def default_modules(model: nn.Module, *, last: int = 4) -> list[str]:
    """Names of the down projections of the ``last`` highest-numbered layers that have one."""
    downs = [
        (layer_index(n), n) for n, m in model.named_modules() if isinstance(m, nn.Linear) and n.endswith("down_proj")
    ]
    downs = [(i, n) for i, n in downs if i is not None]
    return [n for _, n in sorted(downs)[-last:]]


def _select(model: nn.Module, patterns: Sequence[str] | None) -> list[str]:
    if not patterns:
        return default_modules(model)
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    chosen = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    if not chosen:
        raise ValueError(f"module patterns {list(patterns)!r} match no linear; linears are e.g. {names[:6]}")
    return chosen


def _needs_grad(model: nn.Module, modules: Sequence[str]) -> list[nn.Parameter]:
    """The parameters whose gradients the hooked modules' dY needs computed: those of the blocks from the first
    hooked one on (so the activations from there on require gradients); everything when a hooked module lies
    outside the blocks. The others are set not to require gradients for the pass (no gradient memory for them)."""
    layers = [layer_index(name) for name in modules]
    if any(layer is None for layer in layers):
        return list(model.parameters())
    first = min(layers)
    return [p for n, p in model.named_parameters() if (layer_index(n) is not None and layer_index(n) >= first)]


def capture(
    model: nn.Module, window: torch.Tensor, modules: Sequence[str], *, loss_chunk: int = HEAD_CHUNK
) -> dict[str, Capture]:
    """One training-mode forward and backward of ``window`` (int64 [L + 1]) with hooks; no parameter update.

    The loss is the trainer's (:func:`ue5m3.training.loss.lm_loss`, ``loss_chunk`` positions per FP32 head chunk;
    0: all at once); only the parameters :func:`_needs_grad` names require gradients during the pass.

    Returns:
        module name -> :class:`Capture` on the CPU (the pass runs on the model's device); gradients are cleared
        afterwards.
    """
    device = next(model.parameters()).device
    window = window.to(device)
    inputs, targets = window[None, :-1], window[None, 1:]  # [1, L] each
    seen: dict[str, dict[str, torch.Tensor]] = {name: {} for name in modules}
    handles = []
    for name in modules:
        module = model.get_submodule(name)

        def forward_hook(mod, args, output, name=name):
            seen[name]["x"] = args[0].detach().reshape(-1, mod.in_features).float().to("cpu", copy=True)  # [T, in]

        def backward_hook(mod, grad_input, grad_output, name=name):
            seen[name]["dy"] = grad_output[0].detach().reshape(-1, mod.out_features).float().to("cpu", copy=True)

        handles += [module.register_forward_hook(forward_hook), module.register_full_backward_hook(backward_hook)]
    was_training = model.training
    requires = {p: p.requires_grad for p in model.parameters()}
    needed = {id(p) for p in _needs_grad(model, modules)}
    model.train()
    try:
        for p in model.parameters():
            p.requires_grad_(id(p) in needed and requires[p])
        lm_loss(model, inputs, targets, chunk=loss_chunk, autocast=False).backward()  # high precision, no autocast
    finally:
        for handle in handles:
            handle.remove()
        for p, flag in requires.items():
            p.requires_grad_(flag)
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    return {
        name: Capture(
            x=seen[name]["x"],
            w=model.get_submodule(name).weight.detach().float().to("cpu", copy=True),
            dy=seen[name]["dy"],  # [T, out]
        )
        for name in modules
    }


def block_maxima(dy: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """Block maxima of dY^T along tokens: dY [T, out] -> [out, T / block].

    Raises:
        ValueError: T is not a multiple of ``block``.
    """
    tokens, out = dy.shape
    if tokens % block:
        raise ValueError(f"{tokens} tokens are not a multiple of the block size {block}; use a longer sequence")
    return dy.t().abs().reshape(out, tokens // block, block).amax(dim=-1)  # [out, T] -> [out, T/B, B] -> [out, T/B]


def raw_codes(block_amax: torch.Tensor, reference: float, target: float) -> torch.Tensor:
    """Raw UE5M3 codes u = a_B * T / g in the quantizer's FP32 order: G = T * 6 / g, then a_B * (G * (1/6))."""
    g = torch.tensor(reference, dtype=torch.float32)
    if float(g) == 0:
        return torch.zeros_like(block_amax, dtype=torch.float32)
    big_g = torch.clamp(torch.tensor(target, dtype=torch.float32) * 6.0 / g, max=torch.finfo(torch.float32).max)
    inv_f = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(6.0, dtype=torch.float32)
    return block_amax.to(torch.float32) * (big_g * inv_f)


def code_counts(block_amax: torch.Tensor, reference: float, target: float) -> dict[str, int | float]:
    """Counts of one module and target (see the module docstring)."""
    u = raw_codes(block_amax, reference, target)
    limit = formats.UE5M3.max_finite
    rounded = formats.round_to_format(torch.clamp(u, max=limit), formats.UE5M3)
    nonzero = block_amax > 0
    return {
        "target": target,
        "dy_amax": reference,
        "blocks": int(u.numel()),
        "zero_blocks": int((~nonzero).sum()),
        "below_2^-17": int((nonzero & (u < 2.0**-17)).sum()),
        "below_2^-18": int((nonzero & (u < 2.0**-18)).sum()),
        "zero_rounded_before_repair": int((rounded == 0).sum()),
        "saturated": int((u > limit).sum()),
    }


def log10_histogram(values: torch.Tensor) -> tuple[np.ndarray, dict[str, int]]:
    """Counts of log10|value| in 0.125-wide bins over [-16, 8), plus zeros and out-of-range counts."""
    mags = values.detach().abs().double().flatten().numpy()
    zeros = int((mags == 0).sum())
    logs = np.log10(mags[mags > 0])
    edges = np.arange(BIN_LOW, BIN_HIGH + BIN_WIDTH / 2, BIN_WIDTH)
    counts, _ = np.histogram(logs, bins=edges)
    extra = {"zeros": zeros, "below_range": int((logs < BIN_LOW).sum()), "above_range": int((logs >= BIN_HIGH).sum())}
    return counts, extra


def _rows(captures: dict[str, Capture], targets: Sequence[float]) -> tuple[list[dict], list[dict], dict[str, Any]]:
    count_rows, hist_rows, excluded = [], [], {}
    edges = np.arange(BIN_LOW, BIN_HIGH + BIN_WIDTH / 2, BIN_WIDTH)
    for name, cap in captures.items():
        reference = float(cap.dy.abs().amax())
        amax = block_maxima(cap.dy)
        quantities = {"x": cap.x, "w": cap.w, "dy": cap.dy, "dyt_block_amax": amax}
        for target in targets:
            count_rows.append({"module": name, **code_counts(amax, reference, target)})
            quantities[f"raw_code_t{int(target)}"] = raw_codes(amax, reference, target)
        for quantity, values in quantities.items():
            counts, extra = log10_histogram(values)
            excluded[f"{name}/{quantity}"] = extra
            hist_rows += [
                {"module": name, "quantity": quantity, "bin_low": float(lo), "bin_high": float(hi), "count": int(c)}
                for lo, hi, c in zip(edges[:-1], edges[1:], counts, strict=True)
            ]
    return count_rows, hist_rows, excluded


def run_snapshot(
    run_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    step: int | None = None,
    cfg: SnapshotConfig | None = None,
    window: torch.Tensor | None = None,
    device: torch.device | str | None = None,
) -> dict[str, Path]:
    """Snapshot a checkpoint: write counts.csv, histograms.csv and provenance.json under ``out_dir``.

    Args:
        run_dir: the training run directory.
        out_dir: output directory.
        step: checkpoint step (default: newest).
        cfg: the hooked modules and the targets (:class:`SnapshotConfig`; its defaults when None).
        window: int64 [L + 1] tokens (default: the first window of the run's validation set).
        device: where the forward and backward run (default: CUDA if available, else CPU); the statistics are
            computed on the CPU from FP32 copies either way.

    Returns:
        name -> written path.
    """
    settings = cfg if cfg is not None else SnapshotConfig()
    cfg = read_run_config(run_dir)
    state, manifest, path = load_checkpoint_weights(run_dir, step)
    model = models.build(cfg.model, device="meta", **cfg.model_overrides)
    models.materialize(model, torch.device(device) if device is not None else default_device())
    model.load_state_dict(state)
    parallelize.checkpoint_blocks(model, range(len(models.blocks(model))))  # as the trainer's 8B step
    if window is None:
        from ue5m3 import data

        window = data.open_data(cfg.require_data()).validation.windows[0]
    names = _select(model, settings.modules)
    count_rows, hist_rows, excluded = _rows(capture(model, window, names), settings.targets)
    out_dir = Path(out_dir)
    paths = {name: out_dir / f"{name}.csv" for name in ("counts", "histograms")}
    paths["provenance"] = out_dir / "provenance.json"
    write_csv(paths["counts"], count_rows, ["module", *[k for k in count_rows[0] if k != "module"]])
    write_csv(paths["histograms"], hist_rows, ["module", "quantity", "bin_low", "bin_high", "count"])
    record = provenance(
        "scale-snapshot",
        {"run_dir": str(run_dir), "step": step, **config.dump(settings)},
        checkpoint=str(path),
        checkpoint_sha256=checkpoint.weights_sha256(manifest),
        hooked_modules=names,
        sequence_tokens=int(window.numel()) - 1,
        histogram_excluded=excluded,
    )
    write_json(paths["provenance"], record)
    return paths
