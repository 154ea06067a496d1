"""Hugging Face interop: ``NemotronH`` ``config.json`` in both spellings, safetensors weights, whole directories.

Our module names already are the names in Hugging Face checkpoint files (``backbone.*`` / ``lm_head`` for
Nemotron-H, ``model.*`` / ``lm_head`` for the Llama-style dense models), so checkpoints map one to one, tensor by
tensor, with no renaming. (transformers 5 renames ``backbone.`` to ``model.`` in memory and back when it saves, so
its files use ``backbone.*`` too; :func:`load_pretrained` also takes ``model.*`` files.)

Config keys. transformers 5 writes the block pattern as ``layers_block_type`` (a list of ``linear_attention``,
``full_attention``, ``mlp``) and non-finite floats as ``{"__float__": "Infinity"}``; the original NVIDIA configs
(and readers before transformers 5) use ``hybrid_override_pattern`` (a string of ``M``, ``*``, ``-``), the block
names ``mamba`` / ``attention``, ``mamba_n_groups``-style aliases and a bare ``Infinity``. :func:`config_from_hf`
reads every one of these; :func:`hf_config_dict` writes the current spelling by default and the legacy one with
``legacy_keys=True`` (for readers that predate ``layers_block_type``, such as NVIDIA's remote code, which derive it
from ``hybrid_override_pattern``; transformers 5 reads that spelling too. Only transformers 5 is tested here).

Keys absent from the file take the Hugging Face class defaults, which differ from the paper's 8B in two places:
``num_key_value_heads`` (HF 8, paper 4) and ``chunk_size`` (HF 128, paper 256); pass ``**overrides`` to
reproduce the paper's variant from the public config. Settings our implementation does not have (biases, tied
embeddings, MoE blocks, FP32 residuals, exact-erf GELU, ...) raise ``ValueError`` rather than being dropped
silently. Our ``gelu`` is the tanh approximation, which Hugging Face spells ``gelu_pytorch_tanh``.

One difference in the forward pass remains: transformers 5 (seen in 5.24.0) clamps the Mamba-2 ``dt`` from below at
``time_step_min`` (0.001), not at ``time_step_limit[0]`` (0.0) as our model, mamba_ssm and the config say. The two
agree wherever ``softplus(dt_raw + dt_bias) >= time_step_min``; heads whose step size falls below it are computed
with a slightly larger step by transformers.

:func:`save_pretrained` and :func:`load_pretrained` move a whole model to and from a transformers-loadable
directory (``config.json`` + ``model.safetensors``). FP4 numerics are not part of such a directory: it holds the
high-precision weights, so transformers evaluates what the project's ``bf16`` inference policy evaluates. A
training run's checkpoint is exported with :func:`ue5m3.evaluation.export.export_hf` (``ue5m3 export-hf``).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ue5m3.artifacts import atomic_path
from ue5m3.models.nemotron_h import NemotronH, NemotronHConfig

__all__ = [
    "config_from_hf",
    "hf_config_dict",
    "save_safetensors",
    "load_safetensors",
    "save_pretrained",
    "load_pretrained",
]

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
# Hugging Face block names, current (transformers 5) and legacy, -> our pattern characters
_BLOCK_TYPES = {"mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*", "mlp": "-"}
_CURRENT_BLOCK_TYPES = {"M": "linear_attention", "*": "full_attention", "-": "mlp"}
# Hugging Face activation names (ACT2FN) -> ours; ours -> the name written. HF "gelu" is the exact erf GELU, which
# we do not implement (our "gelu" is the tanh approximation).
_ACTIVATIONS_IN = {"relu2": "relu2", "gelu_pytorch_tanh": "gelu", "gelu_new": "gelu"}
_ACTIVATIONS_OUT = {"relu2": "relu2", "gelu": "gelu_pytorch_tanh"}
# transformers 5's JSON encoding of non-finite floats (PreTrainedConfig._encode_special_floats)
_FLOAT_TAG = "__float__"
_FLOAT_TAGS = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


def _decode_floats(obj: Any) -> Any:
    """Replace transformers 5's ``{"__float__": "Infinity"}`` (and ``-Infinity``, ``NaN``) by the float, anywhere."""
    if isinstance(obj, Mapping):
        if set(obj) == {_FLOAT_TAG} and obj[_FLOAT_TAG] in _FLOAT_TAGS:
            return _FLOAT_TAGS[obj[_FLOAT_TAG]]
        return {k: _decode_floats(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_decode_floats(v) for v in obj]
    return obj


def _encode_floats(obj: Any) -> Any:
    """The inverse of :func:`_decode_floats`: what transformers 5 writes for inf, -inf and NaN."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return {_FLOAT_TAG: "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")}
    if isinstance(obj, Mapping):
        return {k: _encode_floats(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_encode_floats(v) for v in obj]
    return obj


def _lookup(raw: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[str, Any] | None:
    for key in keys:
        if key in raw:
            return key, raw[key]
    return None


def _pattern(raw: Mapping[str, Any]) -> str:
    found = []
    if raw.get("layers_block_type") is not None:  # transformers 5
        types = raw["layers_block_type"]
        unknown = sorted({t for t in types if t not in _BLOCK_TYPES})
        if unknown:
            raise ValueError(
                f"layers_block_type has unsupported block types {unknown!r}; supported: {sorted(_BLOCK_TYPES)}"
            )
        found.append("".join(_BLOCK_TYPES[t] for t in types))
    if raw.get("hybrid_override_pattern") is not None:  # transformers 4, NVIDIA's configs
        found.append(raw["hybrid_override_pattern"])
    if not found:
        raise ValueError("the config has neither 'layers_block_type' nor 'hybrid_override_pattern'")
    if len(found) == 2 and found[0] != found[1]:
        raise ValueError(
            f"layers_block_type (pattern {found[0]!r}) disagrees with hybrid_override_pattern {found[1]!r}"
        )
    pattern = found[0]
    if not isinstance(pattern, str) or not pattern or set(pattern) - set("M*-"):
        raise ValueError(f"hybrid_override_pattern {pattern!r} must use only 'M', '*' and '-' (no MoE 'E' blocks)")
    layers = raw.get("num_hidden_layers")
    if layers is not None and layers != len(pattern):
        raise ValueError(f"num_hidden_layers={layers!r} disagrees with the {len(pattern)}-block pattern {pattern!r}")
    return pattern


def _read_config(source: str | os.PathLike | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(source, Mapping):
        return _decode_floats(source)
    path = Path(source)
    if path.is_dir():
        path = path / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{str(path)!r} does not exist (expected a Hugging Face config.json)")
    return _decode_floats(json.loads(path.read_text()))


def config_from_hf(source: str | os.PathLike | Mapping[str, Any], **overrides: Any) -> NemotronHConfig:
    """Read a Hugging Face ``NemotronH`` config into a :class:`NemotronHConfig`.

    Both spellings are read: transformers 5's (``layers_block_type``, ``{"__float__": "Infinity"}``) and the
    legacy one (``hybrid_override_pattern``, ``mamba_*`` aliases, a bare ``Infinity``); a file holding both
    patterns must have them agree.

    Args:
        source: a ``config.json`` path, a directory holding one, or the already-parsed dict.
        **overrides: fields to set afterwards, e.g. ``num_key_value_heads=4, chunk_size=256`` for the paper's 8B.

    Returns:
        The validated config.

    Raises:
        ValueError: a wrong ``model_type``, a missing required key, or a setting this implementation lacks.
        FileNotFoundError: ``source`` is a path without a config.json.
    """
    raw = _read_config(source)
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
    if "mlp_hidden_act" in fields:
        act = fields["mlp_hidden_act"]
        if act not in _ACTIVATIONS_IN:
            raise ValueError(
                f"mlp_hidden_act={act!r} is not supported; supported: {sorted(_ACTIVATIONS_IN)} "
                "(Hugging Face 'gelu' is the exact erf GELU; ours is the tanh approximation, 'gelu_pytorch_tanh')"
            )
        fields["mlp_hidden_act"] = _ACTIVATIONS_IN[act]
    fields.update(overrides)
    return NemotronHConfig(**fields)


def hf_config_dict(cfg: NemotronHConfig, *, legacy_keys: bool = False) -> dict[str, Any]:
    """A Hugging Face ``NemotronH`` ``config.json`` dict describing ``cfg`` (inverse of :func:`config_from_hf`).

    Args:
        cfg: the model config.
        legacy_keys: write the legacy spelling (``hybrid_override_pattern``, ``time_step_limit`` with a
            bare ``inf``, which ``json.dumps`` writes as ``Infinity``) instead of transformers 5's
            (``layers_block_type``, ``{"__float__": "Infinity"}``). transformers 5 reads both.
    """
    out: dict[str, Any] = {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h"}
    if legacy_keys:
        out["hybrid_override_pattern"] = cfg.hybrid_override_pattern
    else:
        out["layers_block_type"] = [_CURRENT_BLOCK_TYPES[c] for c in cfg.hybrid_override_pattern]
    out["num_hidden_layers"] = cfg.num_hidden_layers
    for field, keys in _KEYS.items():
        value = getattr(cfg, field)
        out[keys[0]] = list(value) if isinstance(value, tuple) else value
    out["mlp_hidden_act"] = _ACTIVATIONS_OUT[cfg.mlp_hidden_act]
    for keys, accepted in _FIXED.items():
        out[keys[0]] = accepted
    if cfg.mamba_d_inner % cfg.hidden_size == 0:
        out["expand"] = cfg.mamba_d_inner // cfg.hidden_size
    return out if legacy_keys else _encode_floats(out)


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
            ``model.safetensors.index.json`` (the Hugging Face layouts). For a :class:`NemotronH`, a file named
            with transformers 5's in-memory ``model.*`` prefix is read as ``backbone.*``.
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
    if isinstance(model, NemotronH) and not any(k.startswith("backbone.") for k in tensors):
        # transformers 5's in-memory names (``model.*``), e.g. a state dict saved without its reverse renaming
        tensors = {("backbone." + k[len("model.") :] if k.startswith("model.") else k): v for k, v in tensors.items()}
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


def _weights_dtype(model: nn.Module) -> str:
    dtypes = {p.dtype for p in model.parameters()}
    if len(dtypes) != 1:
        raise ValueError(f"the model mixes parameter dtypes {sorted(map(str, dtypes))}; cast it to one first")
    return str(dtypes.pop()).removeprefix("torch.")


def save_pretrained(
    model: nn.Module,
    out_dir: str | os.PathLike,
    *,
    legacy_keys: bool = False,
    config_extra: Mapping[str, Any] | None = None,
    files: Mapping[str, str | os.PathLike | bytes] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``model`` as a transformers-loadable ``NemotronH`` directory: ``config.json`` and ``model.safetensors``.

    ``transformers.AutoModelForCausalLM.from_pretrained(out_dir)`` (transformers >= 5, either spelling) loads it,
    and so does :func:`load_pretrained`. The directory is built
    under a temporary sibling name and renamed into place, so a reader never sees a partial export. The weights keep
    their dtype, which ``config.json`` records (``dtype``; ``torch_dtype`` too with ``legacy_keys``).

    Args:
        model: a :class:`NemotronH` with real (not meta) plain weights (an unconverted model: FP4 linears are
            not exported; load the checkpoint into a plain model).
        out_dir: the directory to create.
        legacy_keys: write the legacy config spelling (see :func:`hf_config_dict`).
        config_extra: more ``config.json`` keys (e.g. ``bos_token_id``, ``eos_token_id``, ``pad_token_id``).
        files: more files to put in the directory, name -> source path or bytes (e.g. ``tokenizer.json``).
        overwrite: replace an existing non-empty ``out_dir`` (otherwise that is an error).

    Returns:
        ``out_dir``.

    Raises:
        TypeError: ``model`` is not a Nemotron-H model.
        ValueError: ``out_dir`` exists and is not empty (without ``overwrite``), a name in ``files`` or
            ``config_extra`` clashes with what this writes, or meta or mixed-dtype parameters.
    """
    if not isinstance(model, NemotronH):
        raise TypeError(f"save_pretrained exports Nemotron-H models (NemotronH), got {type(model).__name__}")
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())) and not overwrite:
        raise ValueError(f"{str(out_dir)!r} exists and is not empty; pass overwrite=True to replace it")
    files = dict(files or {})
    clash = sorted({CONFIG_NAME, WEIGHTS_NAME} & set(files))
    if clash or any("/" in name or name.startswith(".") for name in files):
        raise ValueError(f"extra files must be plain names other than {[CONFIG_NAME, WEIGHTS_NAME]}, got {clash}")
    config = hf_config_dict(model.config, legacy_keys=legacy_keys)
    dtype = _weights_dtype(model)
    config["dtype"] = dtype
    if legacy_keys:
        config["torch_dtype"] = dtype
    extra = dict(config_extra or {})
    clash = sorted(set(extra) & set(config))
    if clash:
        raise ValueError(f"config_extra must not replace the model's own keys {clash}")
    config.update(extra if legacy_keys else _encode_floats(extra))

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        save_safetensors(model, tmp / WEIGHTS_NAME)
        (tmp / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        for name, source in files.items():
            if isinstance(source, bytes):
                (tmp / name).write_bytes(source)
            else:
                shutil.copyfile(source, tmp / name)
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp creates 0700; give the result a plain mkdir's permissions
        if out_dir.is_dir():  # overwrite (or an empty directory): the old one goes just before the rename
            shutil.rmtree(out_dir)
        elif out_dir.exists():
            out_dir.unlink()
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def load_pretrained(
    path: str | os.PathLike,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    **overrides: Any,
) -> NemotronH:
    """Load a Hugging Face ``NemotronH`` directory (ours, or one ``transformers`` saved) as a :class:`NemotronH`.

    Args:
        path: a directory with ``config.json`` and ``model.safetensors`` (or a sharded
            ``model.safetensors.index.json``).
        device: where to put the model.
        dtype: cast the parameters to this dtype (default: keep the file's).
        **overrides: config fields to replace (e.g. ``ssd_backend="mamba_ssm"``); see :func:`config_from_hf`.
            ``time_step_limit=(time_step_min, math.inf)`` reproduces transformers 5's ``dt`` clamp.

    Returns:
        The model in eval mode; its weights equal the file's bit for bit (when ``dtype`` is None).

    Raises:
        FileNotFoundError: no config.json or no weights.
        ValueError: a config this implementation cannot represent, or weights that do not match it.
    """
    cfg = config_from_hf(path, **overrides)
    model = NemotronH(cfg, device="meta")
    load_safetensors(model, path)
    if dtype is not None:
        model = model.to(dtype)
    return model.to(device).eval()
