"""Operands of a real model GEMM, for witness mining: the inputs and weight of one linear of a trained run."""

from __future__ import annotations

import os
from typing import Any

import torch

__all__ = ["capture_linear"]


def capture_linear(
    run_dir: str | os.PathLike[str], module: str, *, step: int | None = None, sequences: int = 4
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """(x [tokens, in], w [out, in], info): what ``module`` of a run's checkpoint sees on validation windows.

    The model runs in FP32 without FP4 conversion (the witness probe quantizes the operands itself, as the
    forward GEMM does); ``info`` records the checkpoint, its manifest hash and the shapes.

    Raises:
        FileNotFoundError / CheckpointError: not a run directory, or no (valid) checkpoint.
        KeyError: the model has no module of that name (the message lists the linears it has).
    """
    from ue5m3 import data, models  # noqa: PLC0415 - pipeline-level imports, kept off the numerics path
    from ue5m3.evaluation.inference import load_checkpoint_weights  # noqa: PLC0415
    from ue5m3.training.checkpoint import weights_sha256  # noqa: PLC0415
    from ue5m3.training.config import read_run_config  # noqa: PLC0415

    cfg = read_run_config(run_dir)
    state, manifest, path = load_checkpoint_weights(run_dir, step)
    model = models.build(cfg.model, device="cpu", **cfg.model_overrides)
    model.load_state_dict(state)
    model.eval()
    modules = dict(model.named_modules())
    if module not in modules or not isinstance(modules[module], torch.nn.Linear):
        linears = [n for n, m in modules.items() if isinstance(m, torch.nn.Linear)]
        raise KeyError(f"{run_dir}: no linear named {module!r}; linears: {linears}")
    opened = data.open_data(cfg.require_data())
    captured: list[torch.Tensor] = []
    hook = modules[module].register_forward_hook(lambda _m, args, _out: captured.append(args[0].detach()))
    try:
        with torch.no_grad():
            for index, (inputs, _) in enumerate(opened.validation):
                if index >= sequences:
                    break
                model(inputs)
    finally:
        hook.remove()
    if not captured:
        raise ValueError(f"{run_dir}: the validation split yielded no windows")
    x = torch.cat([c.reshape(-1, c.shape[-1]) for c in captured]).float()
    w = modules[module].weight.detach().float()
    info = {
        "run_dir": str(run_dir),
        "checkpoint": str(path),
        "model_sha256": weights_sha256(manifest),
        "module": module,
        "x_shape": list(x.shape),
        "w_shape": list(w.shape),
    }
    return x, w, info
