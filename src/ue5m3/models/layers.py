"""Building blocks shared by the model families: RMSNorm, the FP32 output head, GQA attention and the MLP.

Everything here is plain PyTorch with plain ``nn.Linear`` projections (style rule 7): quantisation is applied
later by :func:`ue5m3.layers.linear.convert`, which swaps selected linears for FP4 modules that share the same
Parameters. For that reason every forward calls its projections as modules (``self.q_proj(x)``), never
``F.linear(x, self.q_proj.weight)``, and weight initialisation goes through each module's ``.weight`` attribute
rather than through ``isinstance(m, nn.Linear)`` so that it still works after conversion.

Facts (experiments spec section 2): pre-norm RMSNorm with eps 1e-5; attention is GQA with no biases and causal
SDPA (NoPE in Nemotron-H, RoPE base 10,000 in the dense controls); the MLP is non-gated, up_proj -> activation ->
down_proj, no biases; the output head always computes in FP32 from its (possibly BF16) parameter.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ue5m3.numerics.backend import exact_fp32

__all__ = ["RMSNorm", "OutputHead", "Attention", "MLP", "ACTIVATIONS", "apply_rope", "init_normal_", "at_least_fp32"]


def at_least_fp32(dtype: torch.dtype) -> torch.dtype:
    """The compute dtype for reductions: FP32 for BF16/FP16/FP32 tensors, FP64 for FP64 ones (tests)."""
    return torch.promote_types(dtype, torch.float32)


def init_normal_(weight: torch.Tensor, std: float, generator: torch.Generator | None) -> None:
    """Fill ``weight`` in place with N(0, std^2) draws from ``generator`` (global RNG if None)."""
    with torch.no_grad():
        nn.init.normal_(weight, mean=0.0, std=std, generator=generator)


def embedding(num_embeddings: int, dim: int, *, device: torch.device | str | None = None) -> nn.Embedding:
    """An ``nn.Embedding``; on the meta device without its own initialisation (``init_weights`` initialises every
    weight after ``to_empty``): a meta ``normal_`` imports torch._dynamo, over a second of each process that only
    wants the model's module names."""
    if device is not None and torch.device(device).type == "meta":
        return nn.Embedding(num_embeddings, dim, _weight=torch.empty(num_embeddings, dim, device="meta"))
    return nn.Embedding(num_embeddings, dim, device=device)


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, normalised in FP32 and returned in the input dtype."""

    def __init__(self, dim: int, eps: float = 1e-5, *, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim, device=device))

    def init_weights(self) -> None:
        with torch.no_grad():
            nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # FP32 statistics: a BF16 mean of squares over 4,096 channels loses the low bits of the scale.
        cd = at_least_fp32(x.dtype)
        h = x.to(cd)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * self.weight.to(cd)).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class OutputHead(nn.Linear):
    """The LM head: logits = float32(h) @ float32(W)^T, whatever the parameter dtype.

    A subclass of ``nn.Linear`` on purpose: module conversion only accepts exact ``nn.Linear`` modules, so the head
    can never be turned into an FP4 linear by a broad selector (gemm spec: "Output head always computes in FP32
    with its BF16 parameter").
    """

    def __init__(self, in_features: int, out_features: int, *, device: torch.device | str | None = None) -> None:
        super().__init__(in_features, out_features, bias=False, device=device)

    def reset_parameters(self) -> None:
        # Initialisation is the model's init_weights (std 0.02); skip nn.Linear's kaiming default.
        pass

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cd = at_least_fp32(self.weight.dtype)
        with exact_fp32(x.device):  # under the body's BF16 autocast the head would otherwise run in BF16
            return F.linear(x.to(cd), self.weight.to(cd))


def _relu2(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x).square()


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


ACTIVATIONS = {"relu2": _relu2, "gelu": _gelu}
"""MLP activations by their config spelling: squared ReLU (Nemotron-H) and tanh-approximated GELU."""


class MLP(nn.Module):
    """Non-gated two-matrix MLP: down_proj(act(up_proj(x))), no biases."""

    def __init__(
        self, hidden: int, intermediate: int, activation: str, *, device: torch.device | str | None = None
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown MLP activation {activation!r}; choose one of {sorted(ACTIVATIONS)}")
        self.activation = activation
        self.up_proj = nn.Linear(hidden, intermediate, bias=False, device=device)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False, device=device)

    def init_weights(self, std: float, generator: torch.Generator | None) -> None:
        init_normal_(self.up_proj.weight, std, generator)
        init_normal_(self.down_proj.weight, std, generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(ACTIVATIONS[self.activation](self.up_proj(x)))

    def extra_repr(self) -> str:
        return f"activation={self.activation}"


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(q: torch.Tensor, k: torch.Tensor, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding in the Hugging Face "rotate half" layout (frequency i pairs dims i and i + d/2).

    Args:
        q: queries [B, H, T, D].
        k: keys [B, KV, T, D].
        theta: the RoPE base (10,000 for the dense controls).

    Returns:
        The rotated (q, k) in their input dtypes. Angles are computed in FP32 (FP64 for FP64 inputs) on each call:
        no cached buffers, so a model built on the meta device needs no buffer initialisation.
    """
    t, d = q.shape[-2], q.shape[-1]
    cd = at_least_fp32(q.dtype)
    inv_freq = theta ** (-torch.arange(0, d, 2, device=q.device, dtype=cd) / d)  # [D/2]
    angles = torch.outer(torch.arange(t, device=q.device, dtype=cd), inv_freq)  # [T, D/2]
    angles = torch.cat((angles, angles), dim=-1)  # [T, D]
    cos, sin = angles.cos(), angles.sin()
    q_rot = q.to(cd) * cos + _rotate_half(q.to(cd)) * sin
    k_rot = k.to(cd) * cos + _rotate_half(k.to(cd)) * sin
    return q_rot.to(q.dtype), k_rot.to(k.dtype)


class Attention(nn.Module):
    """Causal grouped-query attention, no biases; RoPE when ``rope_theta`` is given, otherwise NoPE."""

    def __init__(
        self,
        hidden: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        rope_theta: float | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads!r} must be a multiple of num_kv_heads={num_kv_heads!r}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.rope_theta = rope_theta
        self.q_proj = nn.Linear(hidden, num_heads * head_dim, bias=False, device=device)
        self.k_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=False, device=device)
        self.v_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=False, device=device)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden, bias=False, device=device)

    def init_weights(self, std: float, generator: torch.Generator | None) -> None:
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.o_proj):
            init_normal_(proj.weight, std, generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # [B, T, H*D] -> [B, T, H, D] -> [B, H, T, D]
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        # [B, T, KV*D] -> [B, T, KV, D] -> [B, KV, T, D]
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if self.rope_theta is not None:
            q, k = apply_rope(q, k, self.rope_theta)
        # Softmax scale 1/sqrt(D) (SDPA default); KV heads are shared by consecutive groups of query heads.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.num_heads != self.num_kv_heads)
        # [B, H, T, D] -> [B, T, H, D] -> [B, T, H*D]
        y = y.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim)
        return self.o_proj(y)

    def extra_repr(self) -> str:
        pos = "NoPE" if self.rope_theta is None else f"RoPE(theta={self.rope_theta:g})"
        return f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, {pos}"
