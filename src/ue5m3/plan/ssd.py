"""The Mamba-2 SSD scan's memory under both of the model's backends (``NemotronHConfig.ssd_backend``), for the plan.

The ``torch`` scan (:func:`ue5m3.models.ssd.ssd_scan`) is PyTorch: it runs on the meta device, so the plan measures
it inside the step. The ``mamba_ssm`` scan (``mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined``) is
Triton and runs only on CUDA; :func:`mamba_chunk_scan_combined` here is its memory, transcribed from the source of
state-spaces/mamba at commit :data:`SOURCE_COMMIT`:

* ``mamba_ssm/ops/triton/ssd_combined.py``: ``MambaChunkScanCombinedFn.forward`` / ``.backward``,
  ``_mamba_chunk_scan_combined_fwd``, ``_mamba_chunk_scan_combined_bwd``, ``_chunk_scan_chunk_state_bwd_dx``;
* ``ssd_chunk_state.py``: ``_chunk_cumsum_fwd``, ``_chunk_cumsum_bwd``, ``_chunk_state_fwd``, ``_chunk_state_bwd_db``;
* ``ssd_state_passing.py``: ``_state_passing_fwd``, ``_state_passing_bwd``;
* ``ssd_chunk_scan.py``: ``_chunk_scan_fwd``, ``_chunk_scan_bwd_dstates``, ``_chunk_scan_bwd_dC``,
  ``_chunk_scan_bwd_dcb``, ``_chunk_scan_bwd_ddAcs_stable``;
* ``ssd_bmm.py``: ``_bmm_chunk_fwd``, ``_bmm_chunk_bwd``; ``mamba_ssm/utils/determinism.py``: ``alloc_tile_workspace``.

Every torch allocation of that host code (``torch.empty``/``zeros``/``empty_like``, ``.contiguous()`` and
``.clone()`` copies, the reductions ``.sum`` / ``.cumsum`` / ``.flip`` and the in-place updates) runs here in the
same order, with the same shapes, dtypes and variable lifetimes (the same names rebound at the same places); every
Triton launch is left out (the kernels write into tensors the host code allocated and allocate nothing). Run on the
meta device under :class:`~ue5m3.plan.tracking.LiveBytes`, it counts what the scan allocates on a GPU; the values
are not computed. Transcribed is the model's call (``Mamba2Mixer``: ``D``, ``dt_bias``, ``dt_softplus=True``,
``dt_limit``; no ``z``, initial states, ``seq_idx`` or final states) on mamba_ssm's default, non-deterministic path
(``MAMBA_DETERMINISTIC`` unset and ``torch.use_deterministic_algorithms`` off, as the trainer runs; the
deterministic mode's per-tile workspaces are not transcribed). Not counted: Triton's autotuning of a kernel's first
call (its benchmark copies), and the CUDA caching allocator's rounding (the plan's reserve).

What mamba_ssm saves for the backward pass (``ctx.save_for_backward``): its output ``out`` [B, T, H, P] in x's
dtype, ``dA_cumsum`` [B, H, c, L] FP32 (c = ceil(T / L) chunks of L), and its inputs as given: ``x``, ``dt`` (the
raw time step, before softplus), ``A``, ``B``, ``C``, ``D``, ``dt_bias``. In the model x, B and C are views of the
conv output and dt a view of in_proj's output, so the saved views keep those whole storages alive. Its backward
recomputes ``dA_cumsum``, ``dt``, ``CB`` and the chunk states rather than saving them.

The SM count enters in three places (``nsplits`` of ``_chunk_state_bwd_db``, ``_chunk_scan_bwd_dC`` and
``_chunk_scan_bwd_dcb``: ``ceil(H/G / max(min(ceil(B c H / SMs), H/G), 1))`` partial sums of dB, dC and dCB, more
than one only when ceil(B c H / SMs) < H/G); :func:`sm_count` gives a job's (the largest over its GPU types: the
most splits). For the paper's 8B model at 8,192 tokens (B c H = 4,096, H/G = 16) every GPU of :data:`SM_COUNTS`
gives one split.

:func:`scan_memory` measures one layer's scan in isolation under either backend, :func:`block_memory` one block;
:func:`emulating_mamba_ssm` lets a whole meta step (:func:`ue5m3.plan.memory.training_memory`) run a model whose
``ssd_backend`` is ``mamba_ssm``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from ue5m3.models import nemotron_h
from ue5m3.models.nemotron_h import Mamba2Mixer, NemotronHConfig
from ue5m3.models.ssd import ssd_scan
from ue5m3.plan.tracking import LiveBytes

__all__ = [
    "SOURCE",
    "SOURCE_COMMIT",
    "SM_COUNTS",
    "DEFAULT_SM_COUNT",
    "sm_count",
    "mamba_chunk_scan_combined",
    "emulating_mamba_ssm",
    "ScanMemory",
    "scan_memory",
    "block_memory",
]

SOURCE = "https://github.com/state-spaces/mamba"
SOURCE_COMMIT = "e9594ce1c732d97440f0332fdc43170a2294dbfa"
"""The commit transcribed (2026-07-23, "Fix silent forward-pass corruption on Blackwell GPUs in mamba3_siso_fwd
kernel (#997)"; the SSD files as of then)."""

SM_COUNTS = {"H100": 132, "H200": 132, "B200": 148, "GB200": 148}
"""Streaming multiprocessors per GPU (``torch.cuda.get_device_properties(...).multi_processor_count``, which
mamba_ssm reads): H100 SXM5 and H200 SXM, the full GH100 configuration of 132 SMs (NVIDIA H100 Tensor Core GPU
Architecture whitepaper); B200, 2 dies of 74 SMs (GB200's GPUs are B200s)."""

DEFAULT_SM_COUNT = max(SM_COUNTS.values())
"""For a GPU type not in :data:`SM_COUNTS`, and for a measurement without a GPU: the most SMs (the most splits)."""

FP32 = torch.float32


def sm_count(gpus: Iterable[str] = ()) -> int:
    """The SM count to plan a job on ``gpus`` (GPU type names) with: the largest of theirs (more SMs, more splits
    of dB, dC and dCB: an upper bound over the job's GPU types); :data:`DEFAULT_SM_COUNT` for none or unknown."""
    counts = [SM_COUNTS.get(name, DEFAULT_SM_COUNT) for name in gpus]
    return max(counts, default=DEFAULT_SM_COUNT)


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _nsplits(batch: int, nchunks: int, nheads: int, ngroups: int, sms: int) -> int:
    """``nsplits`` of ``_chunk_state_bwd_db``, ``_chunk_scan_bwd_dC`` and ``_chunk_scan_bwd_dcb``."""
    nheads_ngroups_ratio = nheads // ngroups
    nheads_per_program = max(min(math.ceil(batch * nchunks * nheads / sms), nheads_ngroups_ratio), 1)
    return _cdiv(nheads_ngroups_ratio, nheads_per_program)


# ----- the host code, kernels left out (file and function of mamba_ssm named on each) ---------------------------


def _chunk_cumsum_fwd(dt, A, chunk_size):
    """ssd_chunk_state.py: _chunk_cumsum_fwd."""
    batch, seqlen, nheads = dt.shape
    nchunks = math.ceil(seqlen / chunk_size)
    dt_out = torch.empty(batch, nheads, nchunks, chunk_size, device=dt.device, dtype=FP32)
    dA_cumsum = torch.empty(batch, nheads, nchunks, chunk_size, device=dt.device, dtype=FP32)
    return dA_cumsum, dt_out


def _chunk_cumsum_bwd(ddA, ddt_out, dt, A, dt_bias=None, ddt=None):
    """ssd_chunk_state.py: _chunk_cumsum_bwd (non-deterministic)."""
    ddt_bias = None if dt_bias is None else torch.empty_like(dt_bias, dtype=FP32)
    if ddt is None:
        ddt = torch.empty_like(dt)
    dA = torch.empty_like(A, dtype=FP32)
    return ddt, dA, ddt_bias


def _chunk_state_fwd(B, x, dt, dA_cumsum):
    """ssd_chunk_state.py: _chunk_state_fwd (states_in_fp32=True)."""
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    dstate = B.shape[-1]
    return torch.empty((batch, nchunks, nheads, headdim, dstate), device=x.device, dtype=FP32)


def _chunk_state_bwd_db(x, dt, dA_cumsum, dstates, B, ngroups, sms):
    """ssd_chunk_state.py: _chunk_state_bwd_db (with B, non-deterministic)."""
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    dstate = dstates.shape[-1]
    ddA_cumsum = torch.empty(batch, nheads, nchunks, chunk_size, device=x.device, dtype=FP32)
    nsplits = _nsplits(batch, nchunks, nheads, ngroups, sms)
    dB = torch.empty(batch, seqlen, nsplits, ngroups, dstate, device=x.device, dtype=FP32)
    dB = dB.sum(2)
    torch.cumsum(ddA_cumsum, dim=-1, out=ddA_cumsum)
    return dB, ddA_cumsum


def _state_passing_fwd(states, dA_chunk_cumsum, out_dtype=None):
    """ssd_state_passing.py: _state_passing_fwd."""
    batch, nchunks, nheads, dim = states.shape
    out_dtype = states.dtype if out_dtype is None else out_dtype
    out = torch.empty((batch, nchunks, nheads, dim), device=states.device, dtype=out_dtype)
    final_states = torch.empty((batch, nheads, dim), device=states.device, dtype=FP32)
    return out, final_states


def _state_passing_bwd(states, dA_chunk_cumsum, dout, has_initial_states, dstates_dtype, states_dtype):
    """ssd_state_passing.py: _state_passing_bwd (no dfinal_states)."""
    batch, nchunks, nheads, dim = states.shape
    dstates = torch.empty_like(dout, dtype=dstates_dtype if dstates_dtype is not None else dout.dtype)
    if states_dtype is not None and states_dtype != states.dtype:
        states_converted = torch.empty_like(states, dtype=dstates_dtype if dstates_dtype is not None else dout.dtype)
    else:
        states_converted = None
    dinitstates = torch.empty_like(dstates[:, 0]) if has_initial_states else None
    block_size_min = 64
    n_blocks = (dim + block_size_min - 1) // block_size_min
    ddA_chunk_cumsum = torch.empty(batch, nheads, nchunks, n_blocks, dtype=FP32, device=dA_chunk_cumsum.device)
    # [..., :n_valid_blocks] with the autotuned BLOCK_SIZE (>= 64): the sum's shape is the same for any
    ddA_chunk_cumsum = ddA_chunk_cumsum[..., :n_blocks].sum(dim=-1).to(dtype=dA_chunk_cumsum.dtype)
    if states_dtype is not None and states_dtype == states.dtype:
        states_converted = states
    return dstates, ddA_chunk_cumsum, dinitstates, states_converted


def _bmm_chunk_fwd(a, b, chunk_size, output_dtype=None):
    """ssd_bmm.py: _bmm_chunk_fwd (with groups)."""
    batch, seqlen, ngroups, k = a.shape
    if a.stride(-1) != 1 and a.stride(1) != 1:
        a = a.contiguous()
    if b.stride(-1) != 1 and b.stride(1) != 1:
        b = b.contiguous()
    nchunks = math.ceil(seqlen / chunk_size)
    out_dtype = a.dtype if output_dtype is None else output_dtype
    return torch.empty((batch, nchunks, ngroups, chunk_size, chunk_size), device=a.device, dtype=out_dtype)


def _bmm_chunk_bwd(a, dout, residual=None, out=None):
    """ssd_bmm.py: _bmm_chunk_bwd."""
    if a.stride(-1) != 1 and a.stride(-2) != 1:
        a = a.contiguous()
    if dout.stride(-1) != 1 and dout.stride(-2) != 1:
        dout = dout.contiguous()
    if residual is not None and residual.stride(-1) != 1 and residual.stride(1) != 1:
        residual = residual.contiguous()
    if out is None:
        out = torch.empty_like(a)
    return out


def _chunk_scan_fwd(cb, x, dt, dA_cumsum, C, states, D=None):
    """ssd_chunk_scan.py: _chunk_scan_fwd (no z: out_x is None)."""
    batch, seqlen, nheads, headdim = x.shape
    out = torch.empty(batch, seqlen, nheads, headdim, device=x.device, dtype=x.dtype)
    return out, None


def _chunk_scan_bwd_dstates(C, dA_cumsum, dout, dtype=None):
    """ssd_chunk_scan.py: _chunk_scan_bwd_dstates."""
    batch, seqlen, nheads, headdim = dout.shape
    _, _, nchunks, chunk_size = dA_cumsum.shape
    dstate = C.shape[-1]
    dtype = C.dtype if dtype is None else dtype
    return torch.empty(batch, nchunks, nheads, headdim, dstate, device=C.device, dtype=dtype)


def _chunk_scan_bwd_dC(prev_states, dA_cumsum, dout, C, ngroups, sms):
    """ssd_chunk_scan.py: _chunk_scan_bwd_dC (with C, non-deterministic)."""
    batch, nchunks, nheads, headdim, dstate = prev_states.shape
    _, seqlen, _, _ = dout.shape
    chunk_size = dA_cumsum.shape[-1]
    ddA_cumsum_prev = torch.empty(batch, nheads, nchunks, chunk_size, device=dout.device, dtype=FP32)
    nsplits = _nsplits(batch, nchunks, nheads, ngroups, sms)
    dC = torch.empty(batch, seqlen, nsplits, ngroups, dstate, device=dout.device, dtype=FP32)
    dC = dC.sum(2)
    return dC, ddA_cumsum_prev


def _chunk_scan_bwd_dcb(x, dt, dA_cumsum, dout, ngroups, sms):
    """ssd_chunk_scan.py: _chunk_scan_bwd_dcb (no CB: no ddA_cumsum)."""
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    nsplits = _nsplits(batch, nchunks, nheads, ngroups, sms)
    dcb = torch.empty(batch, nchunks, nsplits, ngroups, chunk_size, chunk_size, device=x.device, dtype=FP32)
    return dcb.sum(2)


def _chunk_scan_bwd_ddAcs_stable(x, dt, dA_cumsum, dout, cb):
    """ssd_chunk_scan.py: _chunk_scan_bwd_ddAcs_stable."""
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    block_size_m_min = 32
    ddA_cumsum = torch.empty(
        batch, nheads, nchunks, _cdiv(chunk_size, block_size_m_min), chunk_size, device=x.device, dtype=FP32
    )
    # [:, :, :, :n_valid_blocks] with the autotuned BLOCK_SIZE_M (>= 32): the sum's shape is the same for any
    return ddA_cumsum[:, :, :, : _cdiv(chunk_size, block_size_m_min)].sum(dim=3)


def _chunk_scan_chunk_state_bwd_dx(x, dt, dA_cumsum, B, CB, dout, dstates, D=None, dx=None):
    """ssd_combined.py: _chunk_scan_chunk_state_bwd_dx (non-deterministic)."""
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    if D is not None:
        block_size_min = 32
        pid_m_tiles = _cdiv(chunk_size, block_size_min)
        dD_hdim = headdim if D.dim() == 2 else 1
        dD = torch.zeros(pid_m_tiles, batch, nchunks, nheads, dD_hdim, device=D.device, dtype=FP32)
    else:
        dD = None
    if dx is None:
        dx = torch.empty_like(x)
    ddt = torch.empty(batch, nheads, nchunks, chunk_size, device=dout.device, dtype=FP32)
    if D is not None:
        dD = dD[:pid_m_tiles].sum(dim=(0, 1, 2))  # [:n_valid_blocks]: the same shape for any autotuned block
        if D.dim() == 1:
            dD = dD.sum(dim=-1)
        dD = dD.to(dtype=D.dtype)
    return dx, ddt, dD


def _mamba_chunk_scan_combined_fwd(x, dt, A, B, C, chunk_size, D=None, dt_bias=None, dt_limit=None):
    """ssd_combined.py: _mamba_chunk_scan_combined_fwd (no z, initial states, seq_idx, cu_seqlens, state_dtype)."""
    if B.stride(-1) != 1:
        B = B.contiguous()
    if C.stride(-1) != 1:
        C = C.contiguous()
    if x.stride(-1) != 1 and x.stride(1) != 1:
        x = x.contiguous()
    if D is not None and D.stride(-1) != 1:
        D = D.contiguous()
    dstate = B.shape[-1]
    dA_cumsum, dt = _chunk_cumsum_fwd(dt, A, chunk_size)
    states = _chunk_state_fwd(B, x, dt, dA_cumsum)
    states, final_states = _state_passing_fwd(states.flatten(-2), dA_cumsum[:, :, :, -1], out_dtype=C.dtype)
    states, final_states = [t.unflatten(-1, (-1, dstate)) for t in [states, final_states]]
    CB = _bmm_chunk_fwd(C, B, chunk_size, output_dtype=FP32)
    out, out_x = _chunk_scan_fwd(CB, x, dt, dA_cumsum, C, states, D=D)
    return out, out_x, dt, dA_cumsum, states, final_states


def _mamba_chunk_scan_combined_bwd(dout, x, dt, A, B, C, out, chunk_size, D=None, dt_bias=None, *, sms):
    """ssd_combined.py: _mamba_chunk_scan_combined_bwd (no z, initial or final states, seq_idx, state_dtype)."""
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    ngroups, dstate = B.shape[2], B.shape[3]
    dB_given = torch.empty_like(B)
    dC_given = torch.empty_like(C)
    ddt_given = torch.empty_like(dt)
    dt_in = dt.clone()
    dA_cumsum, dt = _chunk_cumsum_fwd(dt_in, A, chunk_size)
    CB = _bmm_chunk_fwd(C, B, chunk_size, output_dtype=FP32)
    states = _chunk_state_fwd(B, x, dt, dA_cumsum)
    states, _ = _state_passing_fwd(states.flatten(-2), dA_cumsum[:, :, :, -1])  # `_` (final states) lives on
    states = states.unflatten(-1, (-1, dstate))
    dstates = _chunk_scan_bwd_dstates(C, dA_cumsum, dout, dtype=states.dtype)
    dstates, ddA_chunk_cumsum, dinitial_states, states = _state_passing_bwd(
        states.flatten(-2),
        dA_cumsum[:, :, :, -1],
        dstates.flatten(-2),
        has_initial_states=False,
        dstates_dtype=x.dtype,
        states_dtype=x.dtype,
    )
    states = states.unflatten(-1, (-1, dstate))
    dstates = dstates.unflatten(-1, (-1, dstate))
    dx, ddt, dD_from_x = _chunk_scan_chunk_state_bwd_dx(x, dt, dA_cumsum, B, CB, dout, dstates, D=D)
    dB, ddA_next = _chunk_state_bwd_db(x, dt, dA_cumsum, dstates, B=B, ngroups=ngroups, sms=sms)
    dC, ddA_cumsum_prev = _chunk_scan_bwd_dC(states.to(x.dtype), dA_cumsum, dout, C=C, ngroups=ngroups, sms=sms)
    dCB = _chunk_scan_bwd_dcb(x, dt, dA_cumsum, dout, ngroups=ngroups, sms=sms)
    dCB = dCB.to(CB.dtype)
    _bmm_chunk_bwd(C, dCB, residual=dB, out=dB_given)
    _bmm_chunk_bwd(B, dCB.transpose(-1, -2), residual=dC, out=dC_given)
    dD = dD_from_x
    ddA_cumsum_prev[..., -1] += ddA_chunk_cumsum
    ddA_prev = ddA_cumsum_prev.flip([-1]).cumsum(dim=-1).flip([-1])
    ddA = _chunk_scan_bwd_ddAcs_stable(x, dt, dA_cumsum, dout, CB)
    ddA += ddA_next + ddA_prev
    ddt_given, dA, ddt_bias = _chunk_cumsum_bwd(ddA, ddt, dt_in, A, dt_bias=dt_bias, ddt=ddt_given)
    return dx, ddt_given, dA, dB_given, dC_given, dD, None, ddt_bias, dinitial_states


class _MambaChunkScanCombinedFn(torch.autograd.Function):
    """ssd_combined.py: MambaChunkScanCombinedFn, its allocations only."""

    @staticmethod
    def forward(ctx, x, dt, A, B, C, chunk_size, D, dt_bias, dt_limit, sms):
        out, out_x, dt_out, dA_cumsum, states, final_states = _mamba_chunk_scan_combined_fwd(
            x, dt, A, B, C, chunk_size, D=D, dt_bias=dt_bias, dt_limit=dt_limit
        )
        ctx.save_for_backward(out, x, dt, dA_cumsum, A, B, C, D, None, dt_bias, None, None)
        ctx.chunk_size, ctx.sms = chunk_size, sms
        return out

    @staticmethod
    def backward(ctx, dout):
        out, x, dt, dA_cumsum, A, B, C, D, z, dt_bias, initial_states, seq_idx = ctx.saved_tensors
        dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states = _mamba_chunk_scan_combined_bwd(
            dout, x, dt, A, B, C, out, ctx.chunk_size, D=D, dt_bias=dt_bias, sms=ctx.sms
        )
        return dx, ddt, dA, dB, dC, None, dD, ddt_bias, None, None


def mamba_chunk_scan_combined(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = True,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    *,
    sms: int = DEFAULT_SM_COUNT,
) -> torch.Tensor:
    """mamba_ssm's ``mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=D, dt_bias=dt_bias, dt_softplus=...,
    dt_limit=...)``, its allocations only (module docstring): an empty ``out`` [B, T, H, P] in x's dtype, and in the
    backward pass empty gradients, after allocating and freeing what the source does. ``sms``: the GPU's SM count
    (:func:`sm_count`). Any device; meant for ``meta``."""
    return _MambaChunkScanCombinedFn.apply(x, dt, A, B, C, chunk_size, D, dt_bias, tuple(dt_limit), sms)


@contextlib.contextmanager
def emulating_mamba_ssm(sms: int = DEFAULT_SM_COUNT) -> Iterator[None]:
    """Within: a Mamba-2 mixer with ``ssd_backend="mamba_ssm"`` runs :func:`mamba_chunk_scan_combined` on meta
    tensors (the model's own call, ``nemotron_h._mamba_ssm_scan``, everywhere else)."""
    original = nemotron_h._mamba_ssm_scan

    def scan(x, dt, A, B, C, *, chunk_size, D, dt_bias, dt_limit):
        if x.device.type != "meta":
            return original(x, dt, A, B, C, chunk_size=chunk_size, D=D, dt_bias=dt_bias, dt_limit=dt_limit)
        return mamba_chunk_scan_combined(
            x, dt, A, B, C, chunk_size, D=D, dt_bias=dt_bias, dt_softplus=True, dt_limit=dt_limit, sms=sms
        )

    nemotron_h._mamba_ssm_scan = scan
    try:
        yield
    finally:
        nemotron_h._mamba_ssm_scan = original


# ----- one layer's scan and one block, measured ------------------------------------------------------------------


@dataclass(frozen=True)
class ScanMemory:
    """Bytes of one scan (or block) call: forward, then backward.

    Attributes:
        held: what the forward pass leaves alive for the backward pass, the inputs' storages not counted: every
            tensor saved for the backward pass (its output only where it saves it: mamba_ssm does, the torch scan
            and a block do not), what the caller keeps when it drops the output.
        inputs_kept: the inputs' storages that the saved tensors reference (mamba_ssm's saved x, B and C views
            keep the whole conv output alive in the model, its dt in_proj's output).
        forward_transient: the forward pass's largest excess over what it leaves alive (its output included).
        backward_transient: the backward pass's largest excess over what was alive before it (the incoming
            gradient not counted; the gradients it returns counted).
    """

    held: int
    inputs_kept: int
    forward_transient: int
    backward_transient: int


def _scan_inputs(cfg: NemotronHConfig, batch: int, seqlen: int, dtype: torch.dtype) -> tuple[Mamba2Mixer, dict]:
    """A meta Mamba-2 mixer of ``cfg`` in ``dtype`` and the arguments its forward pass hands the scan (x, B and C
    views of the conv output, dt of in_proj's output, as the model lays them out)."""
    mixer = Mamba2Mixer(dataclasses.replace(cfg, ssd_backend="mamba_ssm"), device="meta").to(dtype)
    captured: dict = {}
    original = nemotron_h._mamba_ssm_scan

    def capture(x, dt, A, B, C, **kwargs):
        captured.update(x=x, dt=dt, A=A, B=B, C=C, **kwargs)
        return torch.empty_like(x)

    nemotron_h._mamba_ssm_scan = capture
    try:
        with torch.no_grad():
            mixer(torch.empty(batch, seqlen, cfg.hidden_size, device="meta", dtype=dtype))
    finally:
        nemotron_h._mamba_ssm_scan = original
    return mixer, captured


def _measure(run, inputs: tuple[torch.Tensor, ...], backward, excluded: tuple[torch.Tensor, ...] = ()) -> ScanMemory:
    """``run(*inputs) -> output`` forward, then ``backward(output, incoming gradient)``, under LiveBytes (the
    inputs, ``excluded`` and the incoming gradient not counted)."""
    input_storages = WeakIdKeyDictionary()
    for t in inputs:
        input_storages[t.untyped_storage()] = t.untyped_storage().nbytes()
    saved = WeakIdKeyDictionary()

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage()] = True
        return t

    tracker = LiveBytes(exclude=(*inputs, *excluded))
    with tracker, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run(*inputs)
    forward_peak, live = tracker.peak, tracker.live
    output = out.untyped_storage()
    held = live if output in saved or output in input_storages else live - output.nbytes()
    kept = sum(size for storage, size in input_storages.items() if storage in saved)
    dout = torch.empty_like(out)
    with tracker:
        tracker.reset_peak()
        backward(out, dout)
        backward_peak = tracker.peak
    return ScanMemory(
        held=held, inputs_kept=kept, forward_transient=forward_peak - live, backward_transient=backward_peak - live
    )


def scan_memory(
    cfg: NemotronHConfig,
    batch: int,
    seqlen: int,
    *,
    backend: str,
    dtype: torch.dtype = torch.bfloat16,
    groups_per_pass: int | None = None,
    sms: int = DEFAULT_SM_COUNT,
) -> ScanMemory:
    """One Mamba-2 layer's SSD scan of a ``batch`` x ``seqlen`` micro-batch under ``backend`` (``torch``: ssd_scan
    with ``groups_per_pass``; ``mamba_ssm``: :func:`mamba_chunk_scan_combined` on ``sms`` SMs), on the meta device:
    its inputs laid out as the model hands them over, its parameters (D, dt_bias) in ``dtype`` (FSDP2's BF16 by
    default), the gradients of x, dt, B, C, D and dt_bias returned (counted in the backward transient)."""
    if backend not in nemotron_h.SSD_BACKENDS:
        raise ValueError(f"backend must be one of {nemotron_h.SSD_BACKENDS!r}, got {backend!r}")
    mixer, args = _scan_inputs(cfg, batch, seqlen, dtype)
    x, dt, B, C = (args[k].detach().requires_grad_() for k in ("x", "dt", "B", "C"))
    D, dt_bias = (p.detach().requires_grad_() for p in (mixer.D, mixer.dt_bias))
    A = args["A"].detach()

    def run(x, dt, A, B, C, D, dt_bias):
        if backend == "mamba_ssm":
            return mamba_chunk_scan_combined(
                x, dt, A, B, C, cfg.chunk_size, D=D, dt_bias=dt_bias, dt_limit=cfg.time_step_limit, sms=sms
            )
        y, _ = ssd_scan(x, dt, A, B, C, chunk_size=cfg.chunk_size, D=D, dt_bias=dt_bias,
                        dt_limit=cfg.time_step_limit, groups_per_pass=groups_per_pass)  # fmt: skip
        return y

    def backward(out: torch.Tensor, dout: torch.Tensor) -> None:
        # gradients returned, not accumulated (x, B and C are views: a leaf's .grad would be a contiguous copy)
        grads = torch.autograd.grad(out, (x, dt, B, C, D, dt_bias), dout)
        del grads

    return _measure(run, (x, dt, A, B, C, D, dt_bias), backward)


def block_memory(
    block: nn.Module, batch: int, seqlen: int, hidden: int, dtype: torch.dtype = torch.bfloat16
) -> ScanMemory:
    """One residual block of a meta model (e.g. of :func:`ue5m3.training.build.build_shell`'s, its parameters in
    the run's compute dtype) on a ``batch`` x ``seqlen`` x ``hidden`` input in ``dtype``: forward, then backward
    with each parameter's gradient dropped as soon as it is accumulated (as the plan's step does: FSDP2
    reduce-scatters and frees it); the input's and the parameters' storages are not counted."""
    u = torch.empty(batch, seqlen, hidden, device="meta", dtype=dtype, requires_grad=True)
    params = tuple(p for p in block.parameters() if p.requires_grad)

    def drop(p: torch.Tensor) -> None:
        p.grad = None

    def backward(out: torch.Tensor, dout: torch.Tensor) -> None:
        handles = [p.register_post_accumulate_grad_hook(drop) for p in (u, *params)]
        try:
            out.backward(dout)
        finally:
            for handle in handles:
                handle.remove()

    return _measure(lambda u, *_: block(u), (u, *params), backward, tuple(block.buffers()))
