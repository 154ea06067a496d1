"""Run identity: what makes a checkpoint this run's, so that a resume never continues another run's trajectory.

A run's identity (:func:`run_identity`) is everything that determines its trajectory: the resolved model config
and recipe (resolved against the model, so BF16 layers and overrides are absolute layer indices), seed, schedule,
global batch, optimizer, FP4 selection, the cold/warm scale resume, the execution path, the data settings and the
prepared data's identity (the corpus manifest's and the tokenizer's SHA-256), and the memory and precision settings
that change the trajectory (BF16 parameters, the chunked loss, the scan's passes: each only when set, so the
identity of a run that does not use them is what it was before they existed). It leaves out what does not change
the bits: where and how often the run logs or checkpoints, the backend (every backend gives the same bits),
activation checkpointing (the recomputed forward gives the same bits), the world size itself (only the global batch
counts) and the other orders of the same reductions (FSDP2 or DDP, gradient sync per step or per microbatch,
resharding and prefetching), where the data lie and how many jobs prepared them.

Every checkpoint's manifest records the identity and its SHA-256 :func:`fingerprint`. Before a run resumes,
:func:`check_identity` compares them with the config's; on a mismatch :class:`RunIdentityError` lists each setting
that differs as ``key: checkpoint X, config Y`` (:func:`identity_differences`). :func:`check_run_dir` applies this to
a whole run directory: refuse it, or (``ue5m3 train --restart-on-change``, the pipeline's form) move it aside as
``<run>.superseded-<fingerprint>`` and start afresh. docs/reliability.md has the table of what is covered.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ue5m3 import config as config_loader
from ue5m3 import models
from ue5m3.layers import recipes
from ue5m3.training import checkpoint
from ue5m3.training.config import TrainConfig
from ue5m3.training.manifest import fingerprint

__all__ = [
    "RunIdentityError",
    "run_identity",
    "fingerprint",
    "identity_differences",
    "check_identity",
    "check_run_dir",
]


class RunIdentityError(ValueError):
    """A checkpoint belongs to another run (recipe, model, seed, data, settings that shape the trajectory)."""


def _file_sha256(path: Path) -> str | None:
    return checkpoint.file_sha256(path) if path.is_file() else None


def _data_identity(cfg: TrainConfig) -> dict[str, Any]:
    """The data settings and the prepared data's hashes (empty for a run fed a stream: no data section)."""
    if cfg.data is None:
        return {}
    from ue5m3 import data as data_pkg

    paths = data_pkg.data_paths(cfg.data)
    data = {
        "config": config_loader.dump(cfg.data),
        "corpus_manifest_sha256": _file_sha256(paths.corpus / "manifest.json"),
        "tokenizer_sha256": _file_sha256(paths.tokenizer),
    }
    data["config"].pop("data_dir", None)  # where it lies is not what it is
    data["config"].pop("prepare_parts", None)  # how many jobs prepared it neither: the bytes are the same
    return data


def run_identity(cfg: TrainConfig, recipe: recipes.Recipe, world: int) -> dict[str, Any]:
    """What determines a run's trajectory, world-size independent: the resolved model and recipe, seed, schedule,
    global batch, optimizer, selection, data settings and the prepared data's identity. Not in it: where and how
    often the run logs or checkpoints, the backend (the same bits on every backend) and the world size itself.

    ``recipe`` is the run's recipe resolved against its model (:meth:`TrainConfig.resolved_recipe`), so the identity
    holds the absolute layer indices the run converted with. A run that states its ``global_batch`` has the
    identity of the same run stated as ``accumulation``: the global micro-batch and the accumulation it derives.

    Raises:
        ValueError: ``global_batch`` cannot be split over ``world`` ranks (:meth:`TrainConfig.accumulation_for`).
    """
    assert not recipe.is_relative, f"run_identity needs the recipe resolved for the model, got {recipe.name!r}"
    return config_loader.dump(
        {
            **_trajectory_settings(cfg),
            "model": cfg.model,
            "model_config": dataclasses.asdict(models.config(cfg.model, **cfg.model_overrides)),
            "recipe": recipe.to_dict(),
            "seed": cfg.seed,
            "steps": cfg.steps,
            "global_micro_batch": cfg.micro_batch * world,
            "accumulation": cfg.accumulation_for(world),  # stated, or derived from global_batch
            "optim": cfg.optim,
            "fp4_select": cfg.fp4_select,
            "cold_scale_resume": cfg.cold_scale_resume,
            "execution": cfg.execution,
            "data": _data_identity(cfg),
        }
    )


def _trajectory_settings(cfg: TrainConfig) -> dict[str, Any]:
    """The memory and precision settings that change a run's bits, each only when it departs from the behaviour
    before it existed (so existing runs keep their fingerprints): BF16 parameters (and what the FP4 linears
    quantize then), the chunked loss, the scan's passes."""
    settings: dict[str, Any] = {}
    if cfg.mixed_precision:
        settings.update(param_dtype=cfg.param_dtype, fp4_weight_dtype=cfg.fp4_weight_dtype)
    if cfg.loss_chunk:
        settings["loss_chunk"] = cfg.loss_chunk
    model = models.config(cfg.model, **cfg.model_overrides)
    if 0 < cfg.ssd_groups_per_pass < getattr(model, "n_groups", 0):  # fewer passes than groups: one pass
        settings["ssd_groups_per_pass"] = cfg.ssd_groups_per_pass
    return settings


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def identity_differences(recorded: Mapping[str, Any] | None, current: Mapping[str, Any]) -> list[str]:
    """'key: checkpoint X, config Y' for every setting that differs (the whole identity when none was recorded)."""
    if recorded is None:
        return ["<identity>: the checkpoint records none (written before run identities, or not by this trainer)"]
    old, new = _flatten(recorded), _flatten(current)
    return [
        f"{key}: checkpoint {old.get(key, '<absent>')!r}, config {new.get(key, '<absent>')!r}"
        for key in sorted(set(old) | set(new))
        if old.get(key, "<absent>") != new.get(key, "<absent>")
    ]


def check_identity(path: Path, manifest: Mapping[str, Any], identity: Mapping[str, Any]) -> None:
    """Pass if the checkpoint at ``path`` (its verified ``manifest``) is this run's.

    Raises:
        RunIdentityError: it is another run's; the message lists what differs and how to start afresh.
    """
    recorded = manifest.get("meta", {}).get("identity")
    if recorded is not None and manifest["meta"].get("fingerprint") == fingerprint(identity):
        return
    differences = identity_differences(recorded, identity)
    if differences:
        listed = "\n  ".join(differences)
        raise RunIdentityError(
            f"checkpoint {path} belongs to another run; what differs:\n  {listed}\n"
            "use a new run directory, or `ue5m3 train --restart-on-change` to set this one aside and start afresh"
        )


def check_run_dir(
    run_dir: Path,
    found: tuple[Path, Mapping[str, Any]] | None,
    identity: Mapping[str, Any],
    *,
    restart_on_change: bool,
) -> bool:
    """Rank 0, holding the run lock: if ``found``, the newest valid checkpoint with its verified manifest
    (:func:`~ue5m3.training.checkpoint.newest_valid`), is another run's, refuse (naming what differs) or, with
    ``restart_on_change``, move the whole directory aside.

    Returns:
        True when the directory was moved aside (the caller then locks the new, empty directory).

    Raises:
        RunIdentityError: another run's checkpoint, without ``restart_on_change``.
    """
    if found is None:
        return False
    try:
        check_identity(*found, identity)
        return False
    except RunIdentityError as err:
        if not restart_on_change:
            raise
        old = found[1].get("meta", {}).get("fingerprint") or "unidentified"
        aside = run_dir.with_name(f"{run_dir.name}.superseded-{old[:12]}")
        n = 1
        while aside.exists():
            n += 1
            aside = run_dir.with_name(f"{run_dir.name}.superseded-{old[:12]}-{n}")
        os.replace(run_dir, aside)  # the lock file moves with it; this process still holds the lock on it
        run_dir.mkdir(parents=True)
        warnings.warn(f"{err}\nthe settings changed: moved the old run to {aside}; starting afresh", stacklevel=2)
        return True
