"""The Mamba-2 state-space-duality (SSD) scan in pure PyTorch, plus a sequential float64 reference.

Per head h, with state S_t [P, N] (head dim P, state size N), the selective SSM is

    dt_t = clamp(softplus(dt_raw_t + dt_bias), dt_limit)
    S_t  = exp(dt_t * A) * S_{t-1} + (dt_t * x_t) B_t^T        (x_t [P], B_t [N], A < 0 a scalar per head)
    y_t  = S_t C_t + D * x_t

where B and C are shared by the H/G heads of a group. :func:`ssd_scan` evaluates it with the chunked "minimal
SSD" algorithm (experiments spec section 2): split the sequence into chunks of length L and

1. intra-chunk: the quadratic (attention-like) form y = (C B^T * decay mask) (dt x) inside each chunk;
2. chunk states: the state each chunk would leave behind starting from zero;
3. inter-chunk recurrence: propagate states across chunks (from the optional initial state) with each chunk's
   total decay, itself written as one small quadratic form over chunks;
4. state to output: add each chunk's incoming state, decayed to each position and read out through C.

Sequences whose length is not a multiple of L are zero-padded at the end: a padded step has dt*x = 0 and
dt*A = 0, so it neither writes to nor decays the state, and the returned final state is the state after the
last real token. Everything is computed in FP32 (FP64 when the input is FP64), as the fused kernels do.
:func:`ssd_sequential` is the token-by-token recurrence, used as the oracle in tests.

Memory: steps 1-4 hold several FP32 [B, H, c, L, L] tensors (1 GB each for the 8B model at 8,192 tokens, chunk 256)
and the backward pass saves them. Heads never mix, so ``groups_per_pass`` runs the four steps over the heads of a
few B/C groups at a time, each pass recomputed in the backward pass: only one pass's intermediates are ever alive
(1/8 of them per pass of one group in the 8B model), for one more forward of the scan.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

__all__ = ["ssd_scan", "ssd_sequential", "segment_sum"]

_NO_LIMIT = (0.0, float("inf"))


def segment_sum(a: torch.Tensor) -> torch.Tensor:
    """out[..., i, j] = a[..., j+1] + ... + a[..., i] for i >= j (0 on the diagonal), -inf above it.

    Built by masking then cumulative-summing (not as a difference of two prefix sums), so each entry only adds
    the terms it contains and stays accurate however large the total decay. Used for the inter-chunk recurrence.

    Args:
        a: [..., T].

    Returns:
        [..., T, T].
    """
    t = a.shape[-1]
    # [..., T] -> [..., T(k), T(j)] holding a[k] at (k, j)
    rows = a[..., :, None].expand(*a.shape, t)
    strictly_lower = torch.ones(t, t, dtype=torch.bool, device=a.device).tril(-1)  # k > j
    out = rows.masked_fill(~strictly_lower, 0.0).cumsum(dim=-2)  # sum over j < k <= i
    lower = torch.ones(t, t, dtype=torch.bool, device=a.device).tril(0)
    return out.masked_fill(~lower, float("-inf"))


def _check_shapes(x, dt, A, B, C, D, dt_bias, initial_state) -> tuple[int, int, int, int, int, int]:
    if x.ndim != 4:
        raise ValueError(f"x must be [batch, length, heads, head_dim], got shape {tuple(x.shape)!r}")
    b, seqlen, h, p = x.shape
    if B.ndim != 4 or B.shape[:2] != (b, seqlen) or C.shape != B.shape:
        raise ValueError(
            f"B and C must be [batch, length, groups, state] = [{b}, {seqlen}, G, N], got "
            f"{tuple(B.shape)!r} and {tuple(C.shape)!r}"
        )
    g, n = B.shape[2], B.shape[3]
    if h % g:
        raise ValueError(f"heads={h!r} must be a multiple of groups={g!r}")
    if dt.shape != (b, seqlen, h) or A.shape != (h,):
        raise ValueError(f"dt must be [{b}, {seqlen}, {h}] and A [{h}], got {tuple(dt.shape)!r} and {tuple(A.shape)!r}")
    for name, vec in (("D", D), ("dt_bias", dt_bias)):
        if vec is not None and vec.shape != (h,):
            raise ValueError(f"{name} must be [{h}], got {tuple(vec.shape)!r}")
    if initial_state is not None and initial_state.shape != (b, h, p, n):
        raise ValueError(f"initial_state must be [{b}, {h}, {p}, {n}], got {tuple(initial_state.shape)!r}")
    return b, seqlen, h, p, g, n


def _time_step(dt: torch.Tensor, dt_bias: torch.Tensor | None, dt_limit: tuple[float, float]) -> torch.Tensor:
    if dt_bias is not None:
        dt = dt + dt_bias
    return F.softplus(dt).clamp(min=dt_limit[0], max=dt_limit[1])


def _scan_heads(
    xdt: torch.Tensor, a: torch.Tensor, B: torch.Tensor, C: torch.Tensor, initial_state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 1-4 of the chunked scan for a set of heads and the B/C groups they read.

    Args:
        xdt: dt * x [B, c, L, H, P].
        a: log of the per-step decay [B, H, c, L].
        B: [B, c, L, G, N], G dividing H (head h reads group h // (H / G)).
        C: [B, c, L, G, N].
        initial_state: [B, H, P, N].

    Returns:
        (y [B, c, L, H, P], final_state [B, H, P, N]), in the compute dtype.
    """
    b, c, L, h, p = xdt.shape
    g = B.shape[3]
    r = h // g
    # Each group's B/C broadcast to its r = H/G heads (head h uses group h // r): [B, c, L, G, N] -> [B, c, L, H, N]
    Bh, Ch = B.repeat_interleave(r, dim=3), C.repeat_interleave(r, dim=3)
    a_cum = a.cumsum(dim=-1)  # [B, H, c, L]: log decay from the chunk start to each position (inclusive)

    # 1. intra-chunk: y_l = sum_{s <= l} (C_l . B_s) exp(a_{s+1} + ... + a_l) dt_s x_s. The exponent is the
    # difference of two prefix sums, as the fused Triton kernel computes it; segment_sum would add only the
    # terms in range but costs a masked cumsum over [B, H, c, L, L], the dominant cost on CPU.
    causal = torch.ones(L, L, dtype=torch.bool, device=xdt.device).tril()
    exponent = (a_cum[..., :, None] - a_cum[..., None, :]).masked_fill(~causal, float("-inf"))  # [B, H, c, L, L]
    cb = torch.einsum("bclgn,bcsgn->bgcls", C, B)  # [B, G, c, L, L]: C_l . B_s, shared by the group's heads
    # [B, H, c, L, L] -> [B, G, r, c, L, L] (times cb per group) -> [B, H, c, L, L]
    scores = (torch.exp(exponent).view(b, g, r, c, L, L) * cb[:, :, None]).view(b, h, c, L, L)
    y = torch.einsum("bhcls,bcshp->bclhp", scores, xdt)  # [B, c, L, H, P]

    # 2. chunk states: the state each chunk leaves behind when it starts from zero
    decay_to_end = torch.exp(a_cum[..., -1:] - a_cum)  # [B, H, c, L]
    weighted_b = Bh * decay_to_end.permute(0, 2, 3, 1)[..., None]  # [B, c, L, H, N]
    states = torch.einsum("bclhn,bclhp->bchpn", weighted_b, xdt)  # [B, c, H, P, N]

    # 3. inter-chunk recurrence over [initial, chunk 0, ..., chunk c-1] with each chunk's total decay
    states = torch.cat([initial_state[:, None], states], dim=1)  # [B, c+1, H, P, N]
    chunk_decay = torch.exp(segment_sum(F.pad(a_cum[..., -1], (1, 0))))  # [B, H, c+1, c+1]
    states = torch.einsum("bhzc,bchpn->bzhpn", chunk_decay, states)  # [B, c+1, H, P, N]
    incoming, final_state = states[:, :-1], states[:, -1]  # state entering each chunk; after the last token

    # 4. state to output: y_l += exp(a_1 + ... + a_l) C_l . S_in
    y_off = torch.einsum("bclhn,bchpn->bclhp", Ch, incoming)  # [B, c, L, H, P]
    return y + y_off * torch.exp(a_cum).permute(0, 2, 3, 1)[..., None], final_state


def _scan_in_passes(
    xdt: torch.Tensor,
    a: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    initial_state: torch.Tensor,
    groups_per_pass: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_scan_heads` over ``groups_per_pass`` B/C groups (and their heads) at a time, each pass recomputed in
    the backward pass (non-reentrant :func:`torch.utils.checkpoint.checkpoint`): the forward keeps one pass's
    [B, heads, c, L, L] intermediates alive at a time and saves only the pass's inputs (views of the scan's), the
    backward recomputes and frees one pass after another. Heads never mix in the scan, so every output element is
    computed by the same operations as in one pass over all heads (the forward is the same bit for bit); the
    gradients of B and C go through batched GEMMs of fewer groups, whose kernels may order a reduction differently
    (FP32 rounding, measured at most ~1e-7 relative)."""
    h, g = xdt.shape[3], B.shape[3]
    r = h // g
    track = torch.is_grad_enabled() and any(t.requires_grad for t in (xdt, a, B, C, initial_state))
    ys, finals = [], []
    for first in range(0, g, groups_per_pass):
        groups = slice(first, min(first + groups_per_pass, g))
        heads = slice(groups.start * r, groups.stop * r)
        args = (xdt[:, :, :, heads], a[:, heads], B[:, :, :, groups], C[:, :, :, groups], initial_state[:, heads])
        if track:
            y, final = checkpoint(_scan_heads, *args, use_reentrant=False)
        else:
            y, final = _scan_heads(*args)
        ys.append(y)
        finals.append(final)
    return torch.cat(ys, dim=3), torch.cat(finals, dim=1)


def ssd_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    chunk_size: int,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_limit: tuple[float, float] = _NO_LIMIT,
    initial_state: torch.Tensor | None = None,
    groups_per_pass: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked SSD scan (intra-chunk quadratic form, chunk states, inter-chunk recurrence, state to output).

    Args:
        x: inputs [B, T, H, P].
        dt: raw time steps [B, T, H], before ``softplus(dt + dt_bias)`` and the clamp to ``dt_limit``.
        A: per-head decay rates [H] (negative: A = -exp(A_log)).
        B: input projections [B, T, G, N]; head h uses group h // (H / G).
        C: output projections [B, T, G, N].
        chunk_size: chunk length L; T need not be a multiple of it (the tail is zero-padded).
        D: per-head skip [H], adds D * x to the output (None: no skip).
        dt_bias: per-head time-step bias [H] (None: no bias).
        dt_limit: (min, max) clamp of the time step after softplus.
        initial_state: state before the first token [B, H, P, N] (None: zeros).
        groups_per_pass: scan the heads of this many B/C groups at a time, each pass recomputed in the backward
            pass, so that the [B, heads, c, L, L] intermediates of only one pass are alive (None: all heads in one
            pass, nothing recomputed). The forward gives the same bits either way (heads never mix in the scan); the
            gradients of B and C agree to FP32 rounding (see :func:`_scan_in_passes`).

    Returns:
        (y [B, T, H, P] in x's dtype, final_state [B, H, P, N] in the compute dtype, FP32 or FP64).

    Raises:
        ValueError: on inconsistent shapes, a non-positive chunk size or a non-positive ``groups_per_pass``.
    """
    b, seqlen, h, p, g, n = _check_shapes(x, dt, A, B, C, D, dt_bias, initial_state)
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size!r}")
    if groups_per_pass is not None and (isinstance(groups_per_pass, bool) or groups_per_pass < 1):
        raise ValueError(f"groups_per_pass must be None or a positive int, got {groups_per_pass!r}")
    cd = torch.promote_types(x.dtype, torch.float32)  # compute dtype: FP32, or FP64 for FP64 inputs
    dt = _time_step(dt.to(cd), None if dt_bias is None else dt_bias.to(cd), dt_limit)  # [B, T, H]
    xdt = x.to(cd) * dt[..., None]  # [B, T, H, P]: the discretised input dt * x
    a = dt * A.to(cd)  # [B, T, H]: log of the per-step decay
    B, C = B.to(cd), C.to(cd)

    pad = (-seqlen) % chunk_size
    if pad:  # zero steps at the end: no input, no decay (see the module docstring)
        xdt, a, B, C = (F.pad(t, (0, 0) * (t.ndim - 2) + (0, pad)) for t in (xdt, a, B, C))
    c, L = (seqlen + pad) // chunk_size, chunk_size
    xdt = xdt.reshape(b, c, L, h, p)  # [B, T', H, P] -> [B, c, L, H, P]
    B = B.reshape(b, c, L, g, n)  # [B, T', G, N] -> [B, c, L, G, N]
    C = C.reshape(b, c, L, g, n)
    a = a.reshape(b, c, L, h).permute(0, 3, 1, 2)  # [B, T', H] -> [B, c, L, H] -> [B, H, c, L]
    if initial_state is None:
        initial_state = torch.zeros(b, h, p, n, dtype=cd, device=x.device)
    initial_state = initial_state.to(cd)
    if groups_per_pass is None or groups_per_pass >= g:
        y, final_state = _scan_heads(xdt, a, B, C, initial_state)
    else:
        y, final_state = _scan_in_passes(xdt, a, B, C, initial_state, groups_per_pass)

    y = y.reshape(b, c * L, h, p)[:, :seqlen]  # [B, c, L, H, P] -> [B, T', H, P] -> [B, T, H, P]
    if D is not None:
        y = y + x.to(cd) * D.to(cd)[:, None]
    return y.to(x.dtype), final_state


def ssd_sequential(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_limit: tuple[float, float] = _NO_LIMIT,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same map as :func:`ssd_scan`, one token at a time in float64 (slow; the test oracle).

    Returns:
        (y [B, T, H, P], final_state [B, H, P, N]), both float64.
    """
    b, seqlen, h, p, g, n = _check_shapes(x, dt, A, B, C, D, dt_bias, initial_state)
    f64 = torch.float64
    x, dt, A, B, C = (t.to(f64) for t in (x, dt, A, B, C))
    state = torch.zeros(b, h, p, n, dtype=f64) if initial_state is None else initial_state.to(f64).clone()
    group_of_head = torch.arange(h) // (h // g)  # [H]
    ys = []
    for t in range(seqlen):
        step = dt[:, t] + (0.0 if dt_bias is None else dt_bias.to(f64))  # [B, H]
        step = torch.log1p(torch.exp(step)).clamp(min=dt_limit[0], max=dt_limit[1])  # softplus, written out
        b_t, c_t = B[:, t, group_of_head], C[:, t, group_of_head]  # [B, H, N]
        decay = torch.exp(step * A)[:, :, None, None]  # [B, H, 1, 1]
        state = decay * state + (step[:, :, None] * x[:, t])[..., None] * b_t[:, :, None, :]
        y_t = (state * c_t[:, :, None, :]).sum(-1)  # [B, H, P]
        if D is not None:
            y_t = y_t + D.to(f64)[:, None] * x[:, t]
        ys.append(y_t)
    return torch.stack(ys, dim=1), state
