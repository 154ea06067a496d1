"""Hugging Face interop: read a ``NemotronH`` ``config.json``, and save/load weights as safetensors.

Our module names already are the Hugging Face ones (``backbone.*`` / ``lm_head`` for Nemotron-H, ``model.*`` /
``lm_head`` for the Llama-style dense models), so checkpoints map one to one, tensor by tensor, with no renaming.

:func:`config_from_hf` accepts both spellings Hugging Face has used (``hybrid_override_pattern`` or
``layers_block_type``; ``n_groups`` or ``mamba_n_groups``, ...). Keys absent from the file take the Hugging Face
class defaults, which differ from the paper's 8B in two places: ``num_key_value_heads`` (HF 8, paper 4) and
``chunk_size`` (HF 128, paper 256); pass ``**overrides`` to reproduce the paper's variant from the public config.
Settings our implementation does not have (biases, tied embeddings, MoE blocks, FP32 residuals, ...) raise
``ValueError`` rather than being dropped silently.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ue5m3.artifacts import atomic_path
from ue5m3.models.nemotron_h import NemotronHConfig

__all__ = ["config_from_hf", "hf_config_dict", "save_safetensors", "load_safetensors"]

# our field -> the keys Hugging Face has used for it (first is the current spelling)
_KEYS: dict[str, tuple[str, ...]] = {
    "vocab_size": ("vocab_size",),
    "hidden_size": ("hidden_size",),
    "num_attention_heads": ("num_attention_heads",),
    "num_key_value_heads": ("num_key_value_heads",),
    "head_dim": ("head_dim",),
    "intermediate_size": ("intermediate_size",),
    "mlp_hidden_act": ("mlp_hidden_act",),
    "mamba_num_heads": ("mamba_num_heads",),
    "mamba_head_dim": ("mamba_head_dim",),
    "ssm_state_size": ("ssm_state_size",),
    "n_groups": ("n_groups", "mamba_n_groups"),
    "conv_kernel": ("conv_kernel", "mamba_d_conv"),
    "chunk_size": ("chunk_size", "mamba_chunk_size"),
    "time_step_min": ("time_step_min", "mamba_dt_min"),
    "time_step_max": ("time_step_max", "mamba_dt_max"),
    "time_step_floor": ("time_step_floor", "mamba_dt_init_floor"),
    "time_step_limit": ("time_step_limit", "mamba_dt_limit"),
    "layer_norm_epsilon": ("layer_norm_epsilon",),
    "initializer_range": ("initializer_range",),
}
# Hugging Face NemotronHConfig defaults where they differ from ours (the paper's 8B)
_HF_DEFAULTS = {"num_key_value_heads": 8, "chunk_size": 128}
_REQUIRED = ("vocab_size", "hidden_size")
# settings we do not implement: key (and aliases) -> the only accepted value
_FIXED: dict[tuple[str, ...], Any] = {
    ("tie_word_embeddings",): False,
    ("attention_bias",): False,
    ("mlp_bias",): False,
    ("use_bias",): False,
    ("mamba_proj_bias",): False,
    ("use_conv_bias", "mamba_conv_bias"): True,
    ("mamba_hidden_act",): "silu",
    ("residual_in_fp32",): False,
    ("num_nextn_predict_layers",): 0,
    ("sliding_window",): None,
}
_BLOCK_TYPES = {"mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*", "mlp": "-"}


def _lookup(raw: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[str, Any] | None:
    for key in keys:
        if key in raw:
            return key, raw[key]
    return None


def _pattern(raw: Mapping[str, Any]) -> str:
    if "hybrid_override_pattern" in raw:
        pattern = raw["hybrid_override_pattern"]
    elif raw.get("layers_block_type") is not None:
        types = raw["layers_block_type"]
        unknown = sorted({t for t in types if t not in _BLOCK_TYPES})
        if unknown:
            raise ValueError(
                f"layers_block_type has unsupported block types {unknown!r}; supported: {sorted(_BLOCK_TYPES)}"
            )
        pattern = "".join(_BLOCK_TYPES[t] for t in types)
    else:
        raise ValueError("the config has neither 'hybrid_override_pattern' nor 'layers_block_type'")
    if not isinstance(pattern, str) or set(pattern) - set("M*-"):
        raise ValueError(f"hybrid_override_pattern {pattern!r} must use only 'M', '*' and '-' (no MoE 'E' blocks)")
    layers = raw.get("num_hidden_layers")
    if layers is not None and layers != len(pattern):
        raise ValueError(f"num_hidden_layers={layers!r} disagrees with the {len(pattern)}-block pattern {pattern!r}")
    return pattern


def config_from_hf(source: str | os.PathLike | Mapping[str, Any], **overrides: Any) -> NemotronHConfig:
    """Read a Hugging Face ``NemotronH`` config into a :class:`NemotronHConfig`.

    Args:
        source: a ``config.json`` path, a directory holding one, or the already-parsed dict.
        **overrides: fields to set afterwards, e.g. ``num_key_value_heads=4, chunk_size=256`` for the paper's 8B.

    Returns:
        The validated config.

    Raises:
        ValueError: a wrong ``model_type``, a missing required key, or a setting this implementation lacks.
        FileNotFoundError: ``source`` is a path without a config.json.
    """
    if isinstance(source, Mapping):
        raw = dict(source)
    else:
        path = Path(source)
        if path.is_dir():
            path = path / "config.json"
        raw = json.loads(path.read_text())
    if raw.get("model_type", "nemotron_h") != "nemotron_h":
        raise ValueError(f"expected model_type 'nemotron_h', got {raw['model_type']!r}")
    missing = [key for key in _REQUIRED if key not in raw]
    if missing:
        raise ValueError(f"the config lacks required keys {missing!r}")
    for keys, accepted in _FIXED.items():
        found = _lookup(raw, keys)
        if found is not None and found[1] != accepted:
            raise ValueError(f"{found[0]}={found[1]!r} is not supported (only {accepted!r})")

    fields: dict[str, Any] = {"hybrid_override_pattern": _pattern(raw)}
    for field, keys in _KEYS.items():
        found = _lookup(raw, keys)
        if found is not None:
            fields[field] = found[1]
        elif field in _HF_DEFAULTS:
            fields[field] = _HF_DEFAULTS[field]
    fields.update(overrides)
    return NemotronHConfig(**fields)


def hf_config_dict(cfg: NemotronHConfig) -> dict[str, Any]:
    """A Hugging Face ``NemotronH`` ``config.json`` dict describing ``cfg`` (inverse of :func:`config_from_hf`)."""
    out: dict[str, Any] = {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h"}
    out["hybrid_override_pattern"] = cfg.hybrid_override_pattern
    out["num_hidden_layers"] = cfg.num_hidden_layers
    for field, keys in _KEYS.items():
        value = getattr(cfg, field)
        out[keys[0]] = list(value) if isinstance(value, tuple) else value
    for keys, accepted in _FIXED.items():
        out[keys[0]] = accepted
    if cfg.mamba_d_inner % cfg.hidden_size == 0:
        out["expand"] = cfg.mamba_d_inner // cfg.hidden_size
    return out


def save_safetensors(model: nn.Module, path: str | os.PathLike, *, metadata: Mapping[str, str] | None = None) -> Path:
    """Write ``model.state_dict()`` (under its Hugging Face names) to one safetensors file, atomically.

    The file is written to a temporary name next to ``path`` and moved into place with ``os.replace``, so a reader
    never sees a partial checkpoint. Tensors keep their dtype; they are copied to CPU first. Sharded (FSDP) models
    must gather a full state dict first.

    Args:
        model: any module (its state dict must hold no meta tensors).
        path: the destination file, e.g. ``out/model.safetensors``.
        metadata: extra string metadata stored in the header (``format: pt`` is always set).

    Returns:
        The path written.

    Raises:
        ValueError: the model still has meta (uninitialised) tensors.
    """
    try:
        from safetensors.torch import save_file
    except ImportError as err:  # pragma: no cover - declared dependency
        raise ImportError("save_safetensors needs safetensors (pip install safetensors)") from err
    state = model.state_dict()
    on_meta = [name for name, t in state.items() if t.is_meta]
    if on_meta:
        raise ValueError(f"cannot save meta tensors {on_meta[:5]!r}...; call to_empty() and init_weights() first")
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in state.items()}
    path = Path(path)
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={**(metadata or {}), "format": "pt"})
    return path


def _checkpoint_files(path: Path) -> list[Path]:
    if not path.is_dir():
        return [path]
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [path / name for name in sorted(set(weight_map.values()))]
    single = path / "model.safetensors"
    if single.exists():
        return [single]
    raise FileNotFoundError(f"{str(path)!r} has neither model.safetensors nor model.safetensors.index.json")


def load_safetensors(model: nn.Module, path: str | os.PathLike, *, strict: bool = True) -> None:
    """Load safetensors weights into ``model`` by name (bit-exact when the dtypes agree).

    Args:
        model: the destination; a meta-device model receives the loaded tensors as its parameters.
        path: a ``.safetensors`` file, or a directory with ``model.safetensors`` or a sharded
            ``model.safetensors.index.json`` (the Hugging Face layouts).
        strict: require the checkpoint's names to equal the model's.

    Raises:
        ValueError: missing or unexpected names (when strict), or a shape mismatch.
    """
    try:
        from safetensors.torch import load_file
    except ImportError as err:  # pragma: no cover - declared dependency
        raise ImportError("load_safetensors needs safetensors (pip install safetensors)") from err
    tensors: dict[str, torch.Tensor] = {}
    for file in _checkpoint_files(Path(path)):
        tensors.update(load_file(str(file)))
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if strict and (missing or unexpected):
        raise ValueError(
            f"checkpoint {str(path)!r} does not match the model: missing {missing[:8]!r} "
            f"({len(missing)}), unexpected {unexpected[:8]!r} ({len(unexpected)})"
        )
    wrong = [
        (k, tuple(tensors[k].shape), tuple(v.shape))
        for k, v in expected.items()
        if k in tensors and tensors[k].shape != v.shape
    ]
    if wrong:
        raise ValueError(f"shape mismatches (name, checkpoint, model): {wrong[:8]!r}")
    on_meta = any(t.is_meta for t in expected.values())
    model.load_state_dict(tensors, strict=strict, assign=on_meta)
