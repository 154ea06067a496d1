"""Model families and their named flavours (style rule 7; experiments spec section 2).

Two families, plain PyTorch with plain ``nn.Linear`` projections (FP4 conversion happens later, from outside):

* :mod:`.nemotron_h` - the hybrid Mamba-2 / attention / MLP model of the paper's 8B runs;
* :mod:`.dense` - the dense Transformer controls (350M target-override control, 1.2B parity model).

| name              | family     | what it is                                                  | parameters      |
|-------------------|------------|-------------------------------------------------------------|-----------------|
| nemotron_h_8b     | nemotron_h | the paper's 8B model, exactly                               | 8,084,075,520   |
| dense_350m        | dense      | the 350M control (hidden 1,024, 16 layers, FFN 3,072)       | 419,464,192     |
| dense_1p2b        | dense      | the 1.2B parity model, exactly                              | 1,291,929,600   |
| nemotron_h_cpu    | nemotron_h | CPU-scale hybrid (``M-M-M*-M-``, hidden 256), vocab 8,192   | 8,209,280       |
| dense_cpu         | dense      | CPU-scale dense (6 layers, hidden 256), vocab 8,192         | 7,736,576       |
| nemotron_h_debug  | nemotron_h | tiny hybrid for tests (``M-M*-M-``, hidden 64), vocab 4,096 | 712,288         |
| dense_debug       | dense      | tiny dense for tests (2 layers, hidden 128), vocab 4,096    | 1,344,128       |

(the 350M control has 419M parameters with its untied 131,072-row embedding and head; 151M without them.)
Every eligible linear of the CPU and debug flavours has both dimensions a multiple of 64, so every block size
(16, 32, 32x32 weight tiles) and the probe-matched GEMM's 64-wide K slices apply in fprop and dgrad (wgrad
reduces over tokens: keep batch x sequence a multiple of 64 too). Any config field can be overridden when building, e.g.
``build("nemotron_h_cpu", vocab_size=tokenizer_vocab)``.

Usage::

    model = build("nemotron_h_8b")                 # meta device: no memory
    names = eligible_linears(model)                # 112 names, the FP4 candidates (never lm_head)
    model.to_empty(device="cuda"); model.init_weights(torch.Generator("cuda").manual_seed(42))
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from ue5m3.models.dense import DenseConfig, DenseTransformer
from ue5m3.models.nemotron_h import BLOCK_KINDS, Mamba2Mixer, NemotronH, NemotronHConfig

__all__ = [
    "DenseConfig",
    "DenseTransformer",
    "NemotronH",
    "NemotronHConfig",
    "ModelConfig",
    "blocks",
    "build",
    "build_from_config",
    "config",
    "count_parameters",
    "eligible_linears",
    "layer_kinds",
    "materialize",
    "names",
    "no_weight_decay",
    "set_ssd_groups_per_pass",
]

ModelConfig = NemotronHConfig | DenseConfig

_FLAVOURS: dict[str, ModelConfig] = {
    "nemotron_h_8b": NemotronHConfig(),
    "dense_350m": DenseConfig(),
    "dense_1p2b": DenseConfig(
        hidden_size=2048, num_hidden_layers=20, num_attention_heads=16, num_key_value_heads=8, intermediate_size=6144
    ),
    "nemotron_h_cpu": NemotronHConfig(
        vocab_size=8192,
        hidden_size=256,
        hybrid_override_pattern="M-M-M*-M-",
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=1024,
        mamba_num_heads=16,
        mamba_head_dim=32,
        ssm_state_size=28,
        n_groups=2,
        chunk_size=64,
    ),
    "dense_cpu": DenseConfig(
        vocab_size=8192,
        hidden_size=256,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=768,
    ),
    "nemotron_h_debug": NemotronHConfig(
        vocab_size=4096,
        hidden_size=64,
        hybrid_override_pattern="M-M*-M-",
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=192,
        mamba_num_heads=16,
        mamba_head_dim=8,
        ssm_state_size=12,
        n_groups=2,
        chunk_size=16,
    ),
    "dense_debug": DenseConfig(
        vocab_size=4096,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=384,
    ),
}


def names() -> tuple[str, ...]:
    """The registered flavour names."""
    return tuple(_FLAVOURS)


def config(name: str, **overrides) -> ModelConfig:
    """The config dataclass of flavour ``name``, with any fields replaced by ``overrides`` (validated again).

    Raises:
        ValueError: unknown name.
        TypeError: an override that is not a field of the config.
    """
    if name not in _FLAVOURS:
        raise ValueError(f"unknown model {name!r}; choose one of {list(_FLAVOURS)}")
    return dataclasses.replace(_FLAVOURS[name], **overrides) if overrides else _FLAVOURS[name]


def build_from_config(
    cfg: ModelConfig,
    device: torch.device | str = "meta",
    *,
    dtype: torch.dtype | None = None,
    generator: torch.Generator | None = None,
) -> nn.Module:
    """Build the model of ``cfg``: on the meta device (default) uninitialised; elsewhere allocated and initialised.

    Args:
        cfg: a :class:`NemotronHConfig` or :class:`DenseConfig`.
        device: ``"meta"`` for a shell (then ``to_empty`` and ``init_weights``), or the device to initialise on.
        dtype: parameter dtype (default: the torch default, FP32).
        generator: RNG for :meth:`init_weights` on a real device (None: the global RNG).

    Raises:
        TypeError: ``cfg`` is not a model config.
    """
    if isinstance(cfg, NemotronHConfig):
        cls: type[nn.Module] = NemotronH
    elif isinstance(cfg, DenseConfig):
        cls = DenseTransformer
    else:
        raise TypeError(f"expected NemotronHConfig or DenseConfig, got {type(cfg).__name__}")
    model = cls(cfg, device="meta")
    if dtype is not None:
        model = model.to(dtype)
    if torch.device(device).type != "meta":
        model = materialize(model, device)
        model.init_weights(generator)
    return model


def materialize(model: nn.Module, device: torch.device | str) -> nn.Module:
    """``model.to_empty(device=device)`` for a module of plain tensors: uninitialised storage of each parameter's and
    buffer's shape, strides and dtype on ``device``. ``to_empty``'s ``empty_like`` of a meta tensor goes through
    torch's Python reference implementations, whose first use imports sympy (0.6-2 s of every process that loads a
    model); a module holding tensor subclasses (FSDP2's DTensors) goes through ``to_empty`` itself."""
    device = torch.device(device)
    tensors = [*model.parameters(), *model.buffers()]
    if any(type(t) not in (torch.Tensor, nn.Parameter) for t in tensors):
        return model.to_empty(device=device)
    return model._apply(lambda t: torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=device))


def build(
    name: str,
    device: torch.device | str = "meta",
    *,
    dtype: torch.dtype | None = None,
    generator: torch.Generator | None = None,
    **overrides,
) -> nn.Module:
    """Build flavour ``name`` (see :func:`build_from_config`); ``overrides`` replace config fields."""
    return build_from_config(config(name, **overrides), device, dtype=dtype, generator=generator)


def eligible_linears(model: nn.Module) -> list[str]:
    """Names of the exact ``nn.Linear`` modules other than ``lm_head``: the FP4 conversion candidates.

    Nemotron-H 8B has 112 (24 Mamba x in/out_proj, 4 attention x q/k/v/o, 24 MLP x up/down); the dense 1.2B has
    120. Already-converted modules are no longer ``nn.Linear`` and are not listed.
    """
    return [name for name, m in model.named_modules() if type(m) is nn.Linear and name != "lm_head"]


def layer_kinds(cfg: ModelConfig) -> tuple[frozenset[str], ...]:
    """Per numbered layer, the kinds of sublayer its residual block holds (what recipe layer selectors count).

    A Nemotron-H block holds one, from its pattern character: ``mamba`` (M), ``attention`` (*) or ``mlp`` (-); a
    dense Transformer layer holds ``attention`` and ``mlp``. The 8B model's final 8 layers are 4 ``mamba`` and
    4 ``mlp`` blocks (44-51); its final 4 ``mlp`` layers are 45, 47, 49 and 51.

    Raises:
        TypeError: ``cfg`` is not a model config.
    """
    if isinstance(cfg, NemotronHConfig):
        return tuple(frozenset({BLOCK_KINDS[c]}) for c in cfg.hybrid_override_pattern)
    if isinstance(cfg, DenseConfig):
        return (frozenset({"attention", "mlp"}),) * cfg.num_hidden_layers
    raise TypeError(f"expected NemotronHConfig or DenseConfig, got {type(cfg).__name__}")


def blocks(model: nn.Module) -> list[nn.Module]:
    """The model's residual blocks in order (the units to ``fully_shard`` before the root).

    Raises:
        TypeError: ``model`` is not one of our model classes.
    """
    if isinstance(model, NemotronH):
        return list(model.backbone.layers)
    if isinstance(model, DenseTransformer):
        return list(model.model.layers)
    raise TypeError(f"expected a NemotronH or DenseTransformer, got {type(model).__name__}")


def set_ssd_groups_per_pass(model: nn.Module, groups: int | None) -> int:
    """Run every Mamba-2 mixer's torch SSD scan over the heads of ``groups`` B/C groups at a time, each pass
    recomputed in the backward pass (:func:`ue5m3.models.ssd.ssd_scan`'s ``groups_per_pass``; None: one pass).
    A runtime setting of the modules, not of the architecture: the config and the parameters are unchanged.

    Returns:
        How many mixers were set (0 for a model without Mamba-2 blocks).

    Raises:
        ValueError: ``groups`` is not None or a positive int.
    """
    if groups is not None and (isinstance(groups, bool) or not isinstance(groups, int) or groups < 1):
        raise ValueError(f"groups must be None or a positive int, got {groups!r}")
    mixers = [m for m in model.modules() if isinstance(m, Mamba2Mixer)]
    for mixer in mixers:
        mixer.scan_groups_per_pass = groups
    return len(mixers)


def no_weight_decay(model: nn.Module) -> list[str]:
    """Parameters conventionally excluded from weight decay: every one with fewer than 2 dimensions.

    That is the norm weights, the conv bias and Mamba-2's A_log, D and dt_bias (experiments spec: "A_log, D,
    norms, biases excluded"); embeddings, linears, the head and the conv kernel are decayed.
    """
    return [name for name, p in model.named_parameters() if p.ndim < 2]


def count_parameters(model: nn.Module) -> int:
    """Total number of parameter elements (works on the meta device)."""
    return sum(p.numel() for p in model.parameters())
