"""Nemotron-H: the hybrid Mamba-2 / attention / MLP language model the paper trains (experiments spec section 2).

The stack is driven by a pattern string, one character per block: ``M`` a Mamba-2 mixer, ``*`` causal GQA
attention without positional embedding (NoPE), ``-`` a squared-ReLU MLP. Every block is pre-norm with a single
RMSNorm: ``x + mixer(norm(x))``. The paper's 8B model is

    M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-      (52 blocks: 24 M, 4 *, 24 -)

with hidden 4,096, attention 32 x 128 with 4 KV heads, MLP 21,504, Mamba-2 128 heads x 64, state 128, 8 groups,
conv 4, chunk 256, vocab 131,072 and an untied FP32 head: 8,084,075,520 parameters.

Module names follow Hugging Face ``NemotronHForCausalLM`` (``backbone.embeddings``,
``backbone.layers.{i}.norm``, ``backbone.layers.{i}.mixer.{in_proj,conv1d,A_log,D,dt_bias,norm,out_proj}``,
``...mixer.{q,k,v,o}_proj``, ``...mixer.{up,down}_proj``, ``backbone.norm_f``, ``lm_head``), so checkpoints load
by name and recipe overrides such as "layers 44-51, ``*.mixer.down_proj``" select the intended modules.

The Mamba-2 forward calls ``self.out_proj(y)`` as a module: fused kernels that read ``out_proj.weight``
directly would bypass a converted FP4 linear (gemm spec section 1), so the optional ``mamba_ssm`` backend only
replaces the SSD scan itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ue5m3.models.layers import MLP, Attention, OutputHead, RMSNorm, at_least_fp32, embedding, init_normal_
from ue5m3.models.ssd import ssd_scan

__all__ = ["NemotronHConfig", "GatedRMSNorm", "Mamba2Mixer", "NemotronHBlock", "NemotronHBackbone", "NemotronH"]

BLOCK_KINDS = {"M": "mamba", "*": "attention", "-": "mlp"}
SSD_BACKENDS = ("torch", "mamba_ssm")


@dataclass(frozen=True, kw_only=True)
class NemotronHConfig:
    """Nemotron-H architecture; field names follow Hugging Face ``NemotronHConfig``, defaults are the paper's 8B."""

    vocab_size: int = 131_072
    """Vocabulary size (embedding rows and logits)."""
    hidden_size: int = 4096
    """Residual stream width."""
    hybrid_override_pattern: str = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
    """One character per block: M = Mamba-2, * = attention, - = MLP."""
    num_attention_heads: int = 32
    """Query heads of each attention block."""
    num_key_value_heads: int = 4
    """Key/value heads (GQA); the paper used 4 (the public HF config says 8)."""
    head_dim: int = 128
    """Attention head dimension."""
    intermediate_size: int = 21_504
    """MLP width (up_proj output)."""
    mlp_hidden_act: str = "relu2"
    """MLP activation: ``relu2`` (squared ReLU) or ``gelu``."""
    mamba_num_heads: int = 128
    """Mamba-2 heads H."""
    mamba_head_dim: int = 64
    """Mamba-2 head dimension P (d_inner = H * P)."""
    ssm_state_size: int = 128
    """SSM state size N."""
    n_groups: int = 8
    """B/C groups G (each shared by H/G heads); also the groups of the gated RMSNorm."""
    conv_kernel: int = 4
    """Depthwise causal conv width over (x, B, C)."""
    chunk_size: int = 256
    """SSD chunk length (the HF config says 128; the paper trained with 256)."""
    time_step_min: float = 0.001
    """Lower end of the log-uniform dt used to initialise dt_bias."""
    time_step_max: float = 0.1
    """Upper end of the log-uniform dt used to initialise dt_bias."""
    time_step_floor: float = 1e-4
    """Floor applied to the initial dt."""
    time_step_limit: tuple[float, float] = (0.0, math.inf)
    """Clamp of dt = softplus(dt_raw + dt_bias) in the forward pass."""
    layer_norm_epsilon: float = 1e-5
    """Epsilon of every RMSNorm (block, final and gated)."""
    initializer_range: float = 0.02
    """Std of the normal init of embeddings and linears."""
    ssd_backend: str = "torch"
    """``torch`` (pure PyTorch chunked scan, any device) or ``mamba_ssm`` (Triton scan, CUDA only)."""

    def __post_init__(self) -> None:
        lo, hi = self.time_step_limit  # accept a list (YAML/JSON); store a hashable tuple of floats
        object.__setattr__(self, "time_step_limit", (float(lo), float(hi)))
        bad = sorted(set(self.hybrid_override_pattern) - set(BLOCK_KINDS))
        if not self.hybrid_override_pattern or bad:
            raise ValueError(
                f"hybrid_override_pattern {self.hybrid_override_pattern!r} must be a non-empty string of "
                f"{sorted(BLOCK_KINDS)}; found {bad!r}"
            )
        positive = ("vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim")
        positive += ("intermediate_size", "mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups")
        positive += ("conv_kernel", "chunk_size")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads!r} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads!r}"
            )
        if self.mamba_num_heads % self.n_groups:
            raise ValueError(
                f"mamba_num_heads={self.mamba_num_heads!r} must be a multiple of n_groups={self.n_groups!r}"
            )
        if self.mlp_hidden_act not in ("relu2", "gelu"):
            raise ValueError(f"mlp_hidden_act must be 'relu2' or 'gelu', got {self.mlp_hidden_act!r}")
        if self.ssd_backend not in SSD_BACKENDS:
            raise ValueError(f"ssd_backend must be one of {SSD_BACKENDS!r}, got {self.ssd_backend!r}")
        lo, hi = self.time_step_limit
        if not 0.0 <= lo < hi:
            raise ValueError(f"time_step_limit must satisfy 0 <= min < max, got {self.time_step_limit!r}")
        if not 0.0 < self.time_step_min <= self.time_step_max:
            raise ValueError(
                f"need 0 < time_step_min <= time_step_max, got {self.time_step_min!r}, {self.time_step_max!r}"
            )

    @property
    def num_hidden_layers(self) -> int:
        """Number of blocks (the pattern length)."""
        return len(self.hybrid_override_pattern)

    @property
    def mamba_d_inner(self) -> int:
        """Mamba-2 inner width H * P."""
        return self.mamba_num_heads * self.mamba_head_dim

    @property
    def mamba_conv_dim(self) -> int:
        """Channels of the depthwise conv: x, B and C (d_inner + 2 G N)."""
        return self.mamba_d_inner + 2 * self.n_groups * self.ssm_state_size

    @property
    def mamba_in_proj_size(self) -> int:
        """in_proj output: z, (x, B, C) and dt (2 d_inner + 2 G N + H)."""
        return self.mamba_d_inner + self.mamba_conv_dim + self.mamba_num_heads

    @property
    def mamba_norm_group_size(self) -> int:
        """Group size of the gated RMSNorm (d_inner / G; 1,024 in the 8B model)."""
        return self.mamba_d_inner // self.n_groups


class GatedRMSNorm(nn.Module):
    """Grouped gated RMSNorm before out_proj: weight * rmsnorm_per_group(y * silu(z)), normalised in FP32."""

    def __init__(self, dim: int, group_size: int, eps: float, *, device: torch.device | str | None = None) -> None:
        super().__init__()
        if dim % group_size:
            raise ValueError(f"dim={dim!r} must be a multiple of group_size={group_size!r}")
        self.group_size, self.eps = group_size, eps
        self.weight = nn.Parameter(torch.empty(dim, device=device))

    def init_weights(self) -> None:
        with torch.no_grad():
            nn.init.ones_(self.weight)

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        cd = at_least_fp32(y.dtype)
        h = y.to(cd) * F.silu(z.to(cd))
        # [..., d_inner] -> [..., G, d_inner/G]: each group is normalised on its own
        h = h.view(*h.shape[:-1], -1, self.group_size)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        h = h.flatten(-2)  # [..., G, d_inner/G] -> [..., d_inner]
        return (h * self.weight.to(cd)).to(y.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, group_size={self.group_size}, eps={self.eps}"


def _mamba_ssm_scan(x, dt, A, B, C, *, chunk_size, D, dt_bias, dt_limit) -> torch.Tensor:
    """The Triton SSD scan from ``mamba_ssm`` (CUDA only); the same contract as :func:`ssd_scan`'s y."""
    if x.device.type != "cuda":
        raise ValueError(
            f"ssd_backend='mamba_ssm' needs CUDA tensors, got device {x.device!r}; use ssd_backend='torch'"
        )
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except ImportError as err:  # pragma: no cover - optional GPU dependency
        raise ImportError(
            "ssd_backend='mamba_ssm' needs the mamba-ssm package (pip install mamba-ssm --no-build-isolation); "
            "or use ssd_backend='torch'"
        ) from err
    return mamba_chunk_scan_combined(
        x, dt, A, B, C, chunk_size, D=D, dt_bias=dt_bias, dt_softplus=True, dt_limit=tuple(dt_limit)
    )


class Mamba2Mixer(nn.Module):
    """Mamba-2 mixer: in_proj -> causal depthwise conv + SiLU over (x, B, C) -> SSD scan -> gated norm -> out_proj."""

    def __init__(self, cfg: NemotronHConfig, *, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        h, d_inner, conv_dim = cfg.mamba_num_heads, cfg.mamba_d_inner, cfg.mamba_conv_dim
        self.in_proj = nn.Linear(cfg.hidden_size, cfg.mamba_in_proj_size, bias=False, device=device)
        self.conv1d = nn.Conv1d(
            conv_dim, conv_dim, cfg.conv_kernel, groups=conv_dim, padding=cfg.conv_kernel - 1, bias=True, device=device
        )
        self.dt_bias = nn.Parameter(torch.empty(h, device=device))
        self.A_log = nn.Parameter(torch.empty(h, device=device))
        self.D = nn.Parameter(torch.empty(h, device=device))
        self.norm = GatedRMSNorm(d_inner, cfg.mamba_norm_group_size, cfg.layer_norm_epsilon, device=device)
        self.out_proj = nn.Linear(d_inner, cfg.hidden_size, bias=False, device=device)
        # how the torch scan trades memory for recompute (ssd_scan's groups_per_pass; None: one pass): a runtime
        # setting of the module, not of the architecture (ue5m3.models.set_ssd_groups_per_pass)
        self.scan_groups_per_pass: int | None = None

    def init_weights(self, generator: torch.Generator | None) -> None:
        cfg = self.cfg
        init_normal_(self.in_proj.weight, cfg.initializer_range, generator)
        init_normal_(self.out_proj.weight, cfg.initializer_range, generator)
        with torch.no_grad():
            # PyTorch's default Conv1d init for a depthwise kernel: U(+-1/sqrt(fan_in)), fan_in = kernel width.
            bound = 1.0 / math.sqrt(cfg.conv_kernel)
            nn.init.uniform_(self.conv1d.weight, -bound, bound, generator=generator)
            nn.init.uniform_(self.conv1d.bias, -bound, bound, generator=generator)
            h = cfg.mamba_num_heads
            self.A_log.copy_(torch.log(torch.arange(1, h + 1, dtype=torch.float32)))  # A = -(1..H)
            self.D.fill_(1.0)
            # dt ~ log-uniform in [time_step_min, time_step_max], floored; dt_bias = softplus^-1(dt).
            u = torch.rand(h, generator=generator, device=self.dt_bias.device, dtype=torch.float32)
            lo, hi = math.log(cfg.time_step_min), math.log(cfg.time_step_max)
            dt = torch.exp(u * (hi - lo) + lo).clamp(min=cfg.time_step_floor)
            self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus, stable for small dt
        self.norm.init_weights()

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        b, t, _ = u.shape
        h, p, g, n = cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.n_groups, cfg.ssm_state_size
        z, xbc, dt = self.in_proj(u).split([cfg.mamba_d_inner, cfg.mamba_conv_dim, h], dim=-1)
        # Causal depthwise conv over time: [B, T, C] -> [B, C, T]; padding K-1 on both sides, keep the first T
        # outputs (position t sees t-K+1..t); back to [B, T, C].
        xbc = F.silu(self.conv1d(xbc.transpose(1, 2))[..., :t].transpose(1, 2))
        x, bmat, cmat = xbc.split([cfg.mamba_d_inner, g * n, g * n], dim=-1)
        x = x.reshape(b, t, h, p)  # [B, T, H*P] -> [B, T, H, P]
        bmat = bmat.reshape(b, t, g, n)  # [B, T, G*N] -> [B, T, G, N]
        cmat = cmat.reshape(b, t, g, n)
        A = -torch.exp(self.A_log.to(at_least_fp32(self.A_log.dtype)))  # [H], FP32 even for BF16 parameters
        if cfg.ssd_backend == "mamba_ssm":
            y = _mamba_ssm_scan(
                x,
                dt,
                A,
                bmat,
                cmat,
                chunk_size=cfg.chunk_size,
                D=self.D,
                dt_bias=self.dt_bias,
                dt_limit=cfg.time_step_limit,
            )
        else:
            y, _ = ssd_scan(
                x,
                dt,
                A,
                bmat,
                cmat,
                chunk_size=cfg.chunk_size,
                D=self.D,
                dt_bias=self.dt_bias,
                dt_limit=cfg.time_step_limit,
                groups_per_pass=self.scan_groups_per_pass,
            )
        y = y.reshape(b, t, cfg.mamba_d_inner)  # [B, T, H, P] -> [B, T, H*P]
        # A module call, never out_proj.weight: a converted FP4 out_proj must see this GEMM.
        return self.out_proj(self.norm(y, z))

    def extra_repr(self) -> str:
        cfg = self.cfg
        return (
            f"heads={cfg.mamba_num_heads}, head_dim={cfg.mamba_head_dim}, state={cfg.ssm_state_size}, "
            f"groups={cfg.n_groups}, chunk={cfg.chunk_size}, backend={cfg.ssd_backend}"
            + (f", groups_per_pass={self.scan_groups_per_pass}" if self.scan_groups_per_pass else "")
        )


class NemotronHBlock(nn.Module):
    """One pre-norm residual block: x + mixer(norm(x)), the mixer chosen by the pattern character."""

    def __init__(self, kind: str, cfg: NemotronHConfig, *, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.kind = BLOCK_KINDS[kind]
        self.norm = RMSNorm(cfg.hidden_size, cfg.layer_norm_epsilon, device=device)
        if kind == "M":
            self.mixer: nn.Module = Mamba2Mixer(cfg, device=device)
        elif kind == "*":
            self.mixer = Attention(
                cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, device=device
            )
        else:
            self.mixer = MLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_hidden_act, device=device)

    def init_weights(self, std: float, generator: torch.Generator | None) -> None:
        self.norm.init_weights()
        if isinstance(self.mixer, Mamba2Mixer):
            self.mixer.init_weights(generator)
        else:
            self.mixer.init_weights(std, generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mixer(self.norm(x))

    def extra_repr(self) -> str:
        return f"kind={self.kind}"


class NemotronHBackbone(nn.Module):
    """Embedding, the pattern's blocks and the final norm (``NemotronHModel`` in Hugging Face naming)."""

    def __init__(self, cfg: NemotronHConfig, *, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.embeddings = embedding(cfg.vocab_size, cfg.hidden_size, device=device)
        self.layers = nn.ModuleList(NemotronHBlock(k, cfg, device=device) for k in cfg.hybrid_override_pattern)
        self.norm_f = RMSNorm(cfg.hidden_size, cfg.layer_norm_epsilon, device=device)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(input_ids)  # [B, T] -> [B, T, hidden]
        for layer in self.layers:
            x = layer(x)
        return self.norm_f(x)


class NemotronH(nn.Module):
    """Nemotron-H causal language model: ``backbone`` then the FP32 ``lm_head``.

    Build order for training (style rule 8): construct on the meta device, convert, shard, then
    ``to_empty(device=...)`` and :meth:`init_weights`.
    """

    def __init__(self, cfg: NemotronHConfig, *, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.backbone = NemotronHBackbone(cfg, device=device)
        self.lm_head = OutputHead(cfg.hidden_size, cfg.vocab_size, device=device)
        if self.lm_head.weight.device.type != "meta":
            self.init_weights()  # built on a real device: never leave torch.empty() memory in the parameters

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Initialise every parameter in place (embeddings, linears and head N(0, 0.02^2); norms 1; Mamba-2 A_log,
        D, dt_bias and conv as in the spec). Works after ``to_empty`` and after FP4 conversion.

        Args:
            generator: RNG on the parameters' device (None: the global RNG). Draw order is fixed: embedding,
                blocks in order, head.
        """
        std = self.config.initializer_range
        init_normal_(self.backbone.embeddings.weight, std, generator)
        for layer in self.backbone.layers:
            layer.init_weights(std, generator)
        self.backbone.norm_f.init_weights()
        init_normal_(self.lm_head.weight, std, generator)

    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The final-norm output [B, T, hidden] (apply ``self.lm_head`` in chunks to bound logit memory)."""
        return self.backbone(input_ids)

    def forward(self, input_ids: torch.Tensor, *, return_hidden: bool = False) -> torch.Tensor:
        """Logits [B, T, V] in FP32 from token ids [B, T] (or the hidden states if ``return_hidden``)."""
        h = self.hidden_states(input_ids)
        return h if return_hidden else self.lm_head(h)
