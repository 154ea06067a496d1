"""Dense decoder-only Transformer controls: the 350M target-override control and the 1.2B parity model.

Llama-style layout with a non-gated MLP (experiments spec section 2): token embedding, then per layer
``x + attn(input_layernorm(x))`` and ``x + mlp(post_attention_layernorm(x))`` with RMSNorm (eps 1e-5), GQA with
RoPE (base 10,000, Hugging Face "rotate half" layout), no biases anywhere; final RMSNorm; untied FP32 head.

The MLP is the spec's "non-gated 2-matrix MLP" (up_proj -> activation -> down_proj). The spec does not name the
activation; we use squared ReLU, the activation of the Nemotron-H MLPs the same recipes were tuned on (set
``hidden_act="gelu"`` for a GELU control). Parameter count does not depend on it.

Parameter layout of the 1.2B model (20 layers, width 2,048, 16 heads x 128 / 8 KV heads, MLP 6,144, vocab
131,072), which adds up to the paper's exact 1,291,929,600:

    embed_tokens + lm_head       2 x 131,072 x 2,048            = 536,870,912
    per layer: q, o              2 x 2,048 x 2,048              =   8,388,608
               k, v              2 x 2,048 x 1,024              =   4,194,304
               up, down          2 x 2,048 x 6,144              =  25,165,824
               two RMSNorms      2 x 2,048                      =       4,096   (x 20 layers = 754,974,720 + 81,920)
    final norm                   2,048
    total                                                        1,291,929,600

so there are no biases, two norms per layer plus a final norm, and the head is untied. Module names follow
Hugging Face Llama (``model.embed_tokens``, ``model.layers.{i}.self_attn.{q,k,v,o}_proj``,
``model.layers.{i}.mlp.{up,down}_proj``, ``model.norm``, ``lm_head``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ue5m3.models.layers import ACTIVATIONS, MLP, Attention, OutputHead, RMSNorm, embedding, init_normal_

__all__ = ["DenseConfig", "DenseBlock", "DenseDecoder", "DenseTransformer"]


@dataclass(frozen=True, kw_only=True)
class DenseConfig:
    """Dense decoder-only Transformer (field names follow Hugging Face Llama); defaults are the 350M control."""

    vocab_size: int = 131_072
    """Vocabulary size (embedding rows and logits)."""
    hidden_size: int = 1024
    """Residual stream width."""
    num_hidden_layers: int = 16
    """Number of Transformer layers."""
    num_attention_heads: int = 8
    """Query heads; head_dim = hidden_size / num_attention_heads."""
    num_key_value_heads: int = 4
    """Key/value heads (GQA)."""
    intermediate_size: int = 3072
    """MLP width (up_proj output)."""
    hidden_act: str = "relu2"
    """MLP activation: ``relu2`` (squared ReLU) or ``gelu``."""
    rope_theta: float = 10_000.0
    """RoPE base."""
    rms_norm_eps: float = 1e-5
    """Epsilon of every RMSNorm."""
    max_position_embeddings: int = 8192
    """Longest sequence the model accepts."""
    initializer_range: float = 0.02
    """Std of the normal init of embeddings and linears."""

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "intermediate_size",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size!r} must be a multiple of "
                f"num_attention_heads={self.num_attention_heads!r}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads!r} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads!r}"
            )
        if (self.hidden_size // self.num_attention_heads) % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {self.hidden_size // self.num_attention_heads!r}")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act must be one of {sorted(ACTIVATIONS)}, got {self.hidden_act!r}")

    @property
    def head_dim(self) -> int:
        """Attention head dimension hidden_size / num_attention_heads."""
        return self.hidden_size // self.num_attention_heads


class DenseBlock(nn.Module):
    """x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: DenseConfig, *, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, device=device)
        self.self_attn = Attention(
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            rope_theta=cfg.rope_theta,
            device=device,
        )
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, device=device)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act, device=device)

    def init_weights(self, std: float, generator: torch.Generator | None) -> None:
        self.input_layernorm.init_weights()
        self.self_attn.init_weights(std, generator)
        self.post_attention_layernorm.init_weights()
        self.mlp.init_weights(std, generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class DenseDecoder(nn.Module):
    """Embedding, layers and final norm (``LlamaModel`` in Hugging Face naming)."""

    def __init__(self, cfg: DenseConfig, *, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.embed_tokens = embedding(cfg.vocab_size, cfg.hidden_size, device=device)
        self.layers = nn.ModuleList(DenseBlock(cfg, device=device) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, device=device)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)  # [B, T] -> [B, T, hidden]
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class DenseTransformer(nn.Module):
    """Dense causal language model: ``model`` then the FP32 ``lm_head``."""

    def __init__(self, cfg: DenseConfig, *, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.model = DenseDecoder(cfg, device=device)
        self.lm_head = OutputHead(cfg.hidden_size, cfg.vocab_size, device=device)
        if self.lm_head.weight.device.type != "meta":
            self.init_weights()  # built on a real device: never leave torch.empty() memory in the parameters

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Initialise every parameter in place: embeddings, linears and head N(0, 0.02^2), norms 1.

        Args:
            generator: RNG on the parameters' device (None: the global RNG); draw order embedding, layers, head.
        """
        std = self.config.initializer_range
        init_normal_(self.model.embed_tokens.weight, std, generator)
        for layer in self.model.layers:
            layer.init_weights(std, generator)
        self.model.norm.init_weights()
        init_normal_(self.lm_head.weight, std, generator)

    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The final-norm output [B, T, hidden] (apply ``self.lm_head`` in chunks to bound logit memory)."""
        if input_ids.shape[-1] > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence length {input_ids.shape[-1]!r} exceeds max_position_embeddings="
                f"{self.config.max_position_embeddings!r}"
            )
        return self.model(input_ids)

    def forward(self, input_ids: torch.Tensor, *, return_hidden: bool = False) -> torch.Tensor:
        """Logits [B, T, V] in FP32 from token ids [B, T] (or the hidden states if ``return_hidden``)."""
        h = self.hidden_states(input_ids)
        return h if return_hidden else self.lm_head(h)
