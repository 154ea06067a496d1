"""A training checkpoint as a Hugging Face ``NemotronH`` directory, in one call (``ue5m3 export-hf``).

:func:`export_hf` reads a run's checkpoint (either format, ``full`` or ``sharded``; verified first), rebuilds the
run's model from its ``config.resolved.json`` and writes, through :func:`ue5m3.models.hf.save_pretrained`:

* ``config.json`` and ``model.safetensors``, which ``transformers.AutoModelForCausalLM.from_pretrained(out_dir)``
  and :func:`ue5m3.models.hf.load_pretrained` load (the current transformers-5 keys by default; the legacy ones
  with ``legacy_keys``);
* ``tokenizer.json`` and ``tokenizer_config.json`` (a ``PreTrainedTokenizerFast`` with the run's BOS/EOS tokens),
  when the run's tokenizer file is still there, so ``AutoTokenizer.from_pretrained(out_dir)`` works too;
* ``ue5m3_export.json``, the provenance: the checkpoint, its step and weights hash, the run's recipe.

The weights are the run's high-precision (master) weights. The FP4 recipe is not part of a Hugging Face directory:
transformers evaluates the model as the project's ``bf16`` policy does (``force_bf16`` on a quantized run), up to
the Mamba-2 ``dt`` clamp difference described in :mod:`ue5m3.models.hf`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ue5m3 import models
from ue5m3.artifacts import provenance
from ue5m3.data import DataConfig, data_paths, open_tokenizer
from ue5m3.evaluation.inference import load_checkpoint_weights
from ue5m3.models import hf
from ue5m3.models.nemotron_h import NemotronHConfig
from ue5m3.training import checkpoint
from ue5m3.training.config import read_run_config

__all__ = ["export_hf", "PROVENANCE_NAME"]

PROVENANCE_NAME = "ue5m3_export.json"


def _read_checkpoint(source: Path, step: int | None) -> tuple[Path, dict[str, Any], dict[str, Any], Path]:
    """(run dir, model state, manifest, checkpoint dir) of a run directory or of one checkpoint directory."""
    if (source / checkpoint.MANIFEST).is_file():  # runs/x/checkpoints/step-XXXXXXXX
        if step is not None:
            raise ValueError(f"{str(source)!r} is one checkpoint; step={step!r} applies to a run directory only")
        manifest = checkpoint.verify(source, complete=True)
        return source.parent.parent, checkpoint.load_model_state(source, manifest), manifest, source
    state, manifest, path = load_checkpoint_weights(source, step)
    return source, state, manifest, path


def _tokenizer_files(data: DataConfig) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """(extra files, extra config keys, tokenizer path) for the run's tokenizer; nothing when its file is gone."""
    path = data_paths(data).tokenizer
    if not path.is_file():
        return {}, {}, None
    tokenizer = open_tokenizer(data)
    tokenizer_config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": data.bos_token,
        "eos_token": data.eos_token,
        "add_bos_token": False,  # the project never adds BOS/EOS when encoding (ue5m3.data.TextTokenizer)
        "add_eos_token": False,
        "model_max_length": data.sequence_length,
    }
    if tokenizer.tokenizer.token_to_id("<pad>") is not None:
        tokenizer_config["pad_token"] = "<pad>"
    files = {"tokenizer.json": path, "tokenizer_config.json": json.dumps(tokenizer_config, indent=2).encode()}
    return files, {"bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id}, str(path)


def export_hf(
    source: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    step: int | None = None,
    legacy_keys: bool = False,
    overwrite: bool = False,
) -> dict[str, Path]:
    """Write a run's checkpoint as a transformers-loadable Nemotron-H directory.

    Args:
        source: a training run directory (``config.resolved.json``, ``checkpoints/``) or one of its checkpoint
            directories (``checkpoints/step-XXXXXXXX``).
        out_dir: the directory to create.
        step: checkpoint step of a run directory (default: the newest).
        legacy_keys: write the legacy config spelling (``hybrid_override_pattern``).
        overwrite: replace an existing non-empty ``out_dir``.

    Returns:
        The files written: ``config``, ``weights``, ``provenance`` and, when the run's tokenizer exists,
        ``tokenizer``.

    Raises:
        CheckpointError: no checkpoint, a missing step, or a corrupted file (named).
        FileNotFoundError: ``source`` is not a run directory.
        ValueError: the run's model is not a Nemotron-H model, or ``out_dir`` exists (without ``overwrite``).
    """
    run_dir, state, manifest, path = _read_checkpoint(Path(source), step)
    cfg = read_run_config(run_dir)
    model_cfg = models.config(cfg.model, **cfg.model_overrides)
    if not isinstance(model_cfg, NemotronHConfig):
        raise ValueError(
            f"run {str(run_dir)!r} trained {cfg.model!r}, a {type(model_cfg).__name__}; only Nemotron-H models "
            "export to Hugging Face (NemotronHForCausalLM)"
        )
    model = models.build_from_config(model_cfg)  # meta: the checkpoint's tensors become the parameters
    model.load_state_dict(state, assign=True)
    data = cfg.require_data()
    files, config_extra, tokenizer = _tokenizer_files(data)
    # NoPE attention and Mamba-2 have no position limit; record the trained length for tools that read one
    config_extra["max_position_embeddings"] = data.sequence_length
    record = provenance(
        "export-hf",
        {"source": str(source), "step": step, "legacy_keys": legacy_keys},
        run_dir=str(run_dir),
        checkpoint=str(path),
        checkpoint_step=manifest["step"],
        checkpoint_sha256=checkpoint.weights_sha256(manifest),
        run_recipe=cfg.recipe,
        model=cfg.model,
        model_overrides=dict(cfg.model_overrides),
        tokenizer=tokenizer,
        numerics="high-precision weights only: the FP4 recipe is not exported (the project's bf16 policy)",
    )
    files[PROVENANCE_NAME] = (json.dumps(record, indent=2, sort_keys=True) + "\n").encode()
    out = hf.save_pretrained(
        model, out_dir, legacy_keys=legacy_keys, config_extra=config_extra, files=files, overwrite=overwrite
    )
    written = {"config": out / hf.CONFIG_NAME, "weights": out / hf.WEIGHTS_NAME, "provenance": out / PROVENANCE_NAME}
    if tokenizer is not None:
        written["tokenizer"] = out / "tokenizer.json"
    return written
