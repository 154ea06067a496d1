"""The plan's Mamba-2 scan under both backends (ue5m3.plan.ssd): mamba_ssm's scan transcribed from its source
allocates what that source allocates (bytes from the shapes, by hand), the plan's step under mamba_ssm is the torch
step with one scan's share swapped for the other's in every Mamba-2 layer, and the plan writes both backends' memory
on one row per job and GPU type."""

from __future__ import annotations

import dataclasses
import importlib.util
import math

import pytest
import torch

from ue5m3 import config as config_loader
from ue5m3 import models
from ue5m3.models import nemotron_h
from ue5m3.plan import memory, ssd
from ue5m3.plan import run as plan
from ue5m3.training.config import TrainConfig

DEBUG = {"vocab_size": 512, "hybrid_override_pattern": "*-M-M-M-M-M-"}  # as tests/test_plan.py: 5 Mamba-2 layers


def _expected(cfg: nemotron_h.NemotronHConfig, b: int, t: int, sms: int) -> ssd.ScanMemory:
    """mamba_ssm's scan of a BF16 model (x, B, C views of the conv output, dt of in_proj's output; D and dt_bias
    BF16, A FP32), by hand from the shapes the source allocates (ssd_combined.py and the files it calls)."""
    h, p, g, n, L = cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.n_groups, cfg.ssm_state_size, cfg.chunk_size
    e, f = 2, 4  # BF16 and FP32 bytes
    c = math.ceil(t / L)
    X = b * t * h * p * e  # out, dx
    BN, BN4 = b * t * g * n * e, b * t * g * n * f  # B or C (and copies, dB/dC given); dB or dC in FP32
    Tdt = b * t * h * e  # dt as given (ddt given, its clone)
    H4 = b * h * c * L * f  # dA_cumsum, dt_out, ddt, the ddA's
    S4, Se = b * c * h * p * n * f, b * c * h * p * n * e  # chunk states in FP32, in BF16
    F4 = b * h * p * n * f  # final states
    CB4 = b * c * g * L * L * f  # CB, dCB
    ratio = h // g  # nsplits of dB, dC and dCB
    ns = math.ceil(ratio / max(min(math.ceil(b * c * h / sms), ratio), 1))
    held = X + H4  # saved: out and dA_cumsum (x, dt, A, B, C, D, dt_bias are the inputs)
    kept = b * t * cfg.mamba_conv_dim * e + b * t * cfg.mamba_in_proj_size * e + h * f + 2 * h * e
    # forward: B and C made contiguous, dt_out and dA_cumsum, FP32 states -> BF16 passed states (+ final), CB, out
    forward_peak = max(2 * BN + 2 * H4 + S4 + Se + F4, 2 * BN + 2 * H4 + Se + F4 + CB4 + X)
    # backward, in the order of _mamba_chunk_scan_combined_bwd
    r = 2 * BN + Tdt + Tdt + 2 * H4 + CB4  # dB, dC, ddt given; dt clone; dt_out, dA_cumsum; CB
    peaks = [r + 2 * S4 + F4]  # chunk states (FP32) and passed states (FP32, final states kept as `_`)
    r += S4 + F4 + S4  # ... the chunk states freed; dstates (FP32)
    peaks.append(r + 2 * Se + b * h * c * math.ceil(p * n / 64) * f + b * h * c * f)  # _state_passing_bwd
    r += -2 * S4 + 2 * Se + b * h * c * f  # BF16 dstates and states replace the FP32 ones; ddA_chunk_cumsum
    peaks.append(r + math.ceil(L / 32) * b * c * h * f + X + H4 + h * f)  # dD partials, dx, ddt, dD's sum
    r += X + H4 + h * e  # dx, ddt, dD (BF16)
    peaks.append(r + H4 + ns * BN4 + BN4)  # ddA_next, dB partials, their sum
    r += H4 + BN4
    peaks.append(r + H4 + ns * BN4 + BN4)  # ddA_cumsum_prev, dC partials, their sum
    r += H4 + BN4
    peaks.append(r + ns * CB4 + CB4)  # dCB partials, their sum
    r += CB4
    peaks.append(r + BN)  # _bmm_chunk_bwd's contiguous copy of C (then of B)
    peaks.append(r + 2 * H4)  # ddA_prev: flip, cumsum, flip
    r += H4
    peaks.append(r + math.ceil(L / 32) * H4 + H4)  # _chunk_scan_bwd_ddAcs_stable's partials and their sum
    r += H4
    peaks.append(r + H4)  # ddA_next + ddA_prev
    peaks.append(r + 2 * h * f)  # ddt_bias, dA
    return ssd.ScanMemory(
        held=held, inputs_kept=kept, forward_transient=forward_peak - held, backward_transient=max(peaks)
    )


@pytest.mark.parametrize(("batch", "seqlen", "sms"), [(2, 64, 132), (2, 64, 8), (1, 56, 148)])
def test_the_transcription_allocates_what_mamba_ssm_allocates(batch, seqlen, sms):
    """Saved bytes, the inputs kept, forward and backward transients of the transcribed scan on the meta device equal
    the hand count of the source's allocations (nsplits 8 and 1; a length that is not a multiple of the chunk)."""
    cfg = models.config("nemotron_h_debug")
    measured = ssd.scan_memory(cfg, batch, seqlen, backend="mamba_ssm", sms=sms)
    assert measured == _expected(cfg, batch, seqlen, sms)


def test_the_8b_scan_saves_its_output_and_dA_cumsum():
    """The paper's layer, 1 x 8,192 tokens: out (BF16 [1, 8192, 128, 64]) and dA_cumsum (FP32 [1, 128, 32, 256])."""
    cfg = models.config("nemotron_h_8b")
    measured = ssd.scan_memory(cfg, 1, 8192, backend="mamba_ssm", sms=ssd.sm_count(["H100"]))
    assert measured.held == 8192 * 128 * 64 * 2 + 128 * 32 * 256 * 4 == 138_412_032
    assert measured == _expected(cfg, 1, 8192, 132)


def test_the_sm_count_is_the_largest_of_the_jobs_gpu_types():
    assert ssd.sm_count(["H100", "H200"]) == 132
    assert ssd.sm_count(["H100", "B200"]) == 148
    assert ssd.sm_count([]) == ssd.sm_count(["unknown"]) == ssd.DEFAULT_SM_COUNT


def _cfg(backend: str, recipe: str = "bf16", **settings) -> TrainConfig:
    overrides = {**DEBUG, "ssd_backend": backend}
    fields = dict(run_dir="unused", model="nemotron_h_debug", recipe=recipe, seed=3, steps=1, micro_batch=1,
                  accumulation=2, param_dtype="bfloat16", model_overrides=overrides)  # fmt: skip
    return TrainConfig(data=None, **{**fields, **settings})


@pytest.mark.parametrize("recipe", ["bf16", "ue5m3_b16"])
def test_the_mamba_ssm_step_swaps_each_layers_scan_share(recipe):
    """Without checkpointing, the step's activations under mamba_ssm are the torch step's, less the torch scan's
    share and plus mamba_ssm's in each of the 5 Mamba-2 layers, each scan measured alone: the torch scan keeps its
    saved tensors (FP32 copies of its inputs and the chunked intermediates); mamba_ssm keeps its saved out and
    dA_cumsum and, through its saved x, B and C views, the conv output (BF16 [1, 64, conv_dim]), which nothing else
    in the layer keeps (in_proj's output, which its saved dt views, the conv keeps anyway)."""
    torch_step = memory.training_memory(_cfg("torch", recipe), 1, 64)
    mamba_step = memory.training_memory(_cfg("mamba_ssm", recipe), 1, 64)
    model_cfg = models.config("nemotron_h_debug", **DEBUG)
    layers = model_cfg.hybrid_override_pattern.count("M")
    torch_share = ssd.scan_memory(model_cfg, 1, 64, backend="torch").held
    mamba_share = ssd.scan_memory(model_cfg, 1, 64, backend="mamba_ssm").held + 64 * model_cfg.mamba_conv_dim * 2
    assert mamba_step.activations == torch_step.activations - layers * torch_share + layers * mamba_share
    assert mamba_step.activations < torch_step.activations
    assert (mamba_step.parameters, mamba_step.fp4_caches) == (torch_step.parameters, torch_step.fp4_caches)
    assert nemotron_h._mamba_ssm_scan.__name__ == "_mamba_ssm_scan"  # the model's own call restored


def test_with_every_block_recomputed_the_scan_moves_into_the_transient():
    """Every block recomputed: the activations are the blocks' inputs under either scan, the transient differs."""
    torch_step = memory.training_memory(_cfg("torch", activation_checkpointing="every_block"), 1, 64)
    mamba_step = memory.training_memory(_cfg("mamba_ssm", activation_checkpointing="every_block"), 1, 64)
    assert mamba_step.activations == torch_step.activations
    assert mamba_step.transient < torch_step.transient


def test_a_block_of_either_scan_differs_by_the_scans_shares():
    """One Mamba-2 block alone: the same difference as the step's per layer (test above), its output not held."""
    model_cfg = models.config("nemotron_h_debug", **DEBUG)
    held = {}
    for backend in nemotron_h.SSD_BACKENDS:
        block = nemotron_h.NemotronHBlock("M", dataclasses.replace(model_cfg, ssd_backend=backend), device="meta")
        with ssd.emulating_mamba_ssm():
            held[backend] = ssd.block_memory(block.to(torch.bfloat16), 1, 64, model_cfg.hidden_size).held
    scans = {b: ssd.scan_memory(model_cfg, 1, 64, backend=b).held for b in nemotron_h.SSD_BACKENDS}
    conv_output = 64 * model_cfg.mamba_conv_dim * 2
    assert held["mamba_ssm"] - held["torch"] == scans["mamba_ssm"] + conv_output - scans["torch"]


def _job(name: str, model: str, backend: str | None = None, **fields) -> dict:
    overrides = {"vocab_size": 512, "num_hidden_layers": 4} if model == "dense_debug" else dict(DEBUG)
    if backend:
        overrides["ssd_backend"] = backend
    settings = {"run_dir": "r", "model": model, "recipe": "bf16", "seed": 1, "steps": 10, "micro_batch": 1,
                "accumulation": 0, "global_batch": 8, "data": None, "param_dtype": "bfloat16",
                "model_overrides": overrides}  # fmt: skip
    return {"name": name, "rule": "train_run", "kind": "train", "settings": settings, "sequence_length": 64,
            "steps": 10, "nodes": 1, "gpus_per_node": 4, "partition": "gpu", **fields}  # fmt: skip


def test_the_plan_writes_both_scans_on_the_jobs_row(tmp_path):
    """A training job of a Mamba-2 model: its own scan's terms (unchanged) and the other scan's activations,
    transient, peak and fit on the same row per GPU type; a dense model's row names no scan."""
    jobs = [
        _job("train_run/hybrid/torch", "nemotron_h_debug"),
        _job("train_run/hybrid/mamba_ssm", "nemotron_h_debug", "mamba_ssm"),
        _job("train_run/dense", "dense_debug"),
    ]
    raw = {"partitions": {"gpu": ["H100", "H200"]}, "jobs": jobs}
    paths = plan.run(config_loader.load(plan.PlanConfig, raw, source="test"), tmp_path)
    rows = {(r["job"], r["gpu"]): r for r in plan.read_plan(paths["plan"])}
    assert len(rows) == 6 and list(next(iter(rows.values()))) == plan.COLUMNS
    world = 4

    def terms(backend):
        cfg = _cfg(backend, accumulation=0, global_batch=8, steps=10, seed=1, run_dir="r")
        return memory.training_memory(cfg, world, 64, sms=132)

    own, other = terms("torch"), terms("mamba_ssm")
    for gpu in ("H100", "H200"):
        row = rows[("train_run/hybrid/torch", gpu)]
        assert (row["ssd_backend"], row["other_scan"], row["other_scan_fits"]) == ("torch", "mamba_ssm", "True")
        assert float(row["activations_gb"]) == own.activations / plan.GB
        assert float(row["other_scan_activations_gb"]) == other.activations / plan.GB
        assert float(row["other_scan_transient_gb"]) == other.transient / plan.GB
        assert float(row["other_scan_peak_gb"]) == other.peak / plan.GB
        flipped = rows[("train_run/hybrid/mamba_ssm", gpu)]
        assert (flipped["ssd_backend"], flipped["other_scan"]) == ("mamba_ssm", "torch")
        assert float(flipped["activations_gb"]) == other.activations / plan.GB
        assert float(flipped["other_scan_activations_gb"]) == own.activations / plan.GB
        dense = rows[("train_run/dense", gpu)]
        assert [dense[k] for k in ("ssd_backend", "other_scan", "other_scan_peak_gb", "other_scan_fits")] == [""] * 4


_MAMBA_SSM = importlib.util.find_spec("mamba_ssm") is not None


@pytest.mark.skipif(
    not (torch.cuda.is_available() and _MAMBA_SSM),
    reason="needs CUDA and the mamba-ssm package (the scan is Triton); the transcription is checked above by hand",
)
def test_on_a_gpu_mamba_ssm_allocates_what_the_transcription_counts():
    """The real scan on CUDA, its inputs laid out as the model's (views of a BF16 conv output and in_proj output):
    torch.cuda's allocated bytes after the forward pass and its peaks in both passes equal the meta count, to the
    caching allocator's rounding (512-byte blocks)."""
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

    cfg = models.config("nemotron_h_cpu")
    b, t = 2, 256
    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    expected = ssd.scan_memory(cfg, b, t, backend="mamba_ssm", sms=sms)
    h, g, n, p = cfg.mamba_num_heads, cfg.n_groups, cfg.ssm_state_size, cfg.mamba_head_dim
    in_proj = torch.randn(b, t, cfg.mamba_in_proj_size, device=device, dtype=torch.bfloat16)
    conv = torch.randn(b, cfg.mamba_conv_dim, t, device=device, dtype=torch.bfloat16).transpose(1, 2)
    x, bm, cm = conv.split([cfg.mamba_d_inner, g * n, g * n], dim=-1)
    x, bm, cm = x.reshape(b, t, h, p), bm.reshape(b, t, g, n), cm.reshape(b, t, g, n)
    dt = in_proj[..., -h:]
    x, dt, bm, cm = (v.detach().requires_grad_() for v in (x, dt, bm, cm))
    D = torch.ones(h, device=device, dtype=torch.bfloat16, requires_grad=True)
    dt_bias = torch.zeros(h, device=device, dtype=torch.bfloat16, requires_grad=True)
    A = -torch.arange(1, h + 1, device=device, dtype=torch.float32)
    wrt = (x, dt, bm, cm, D, dt_bias)

    def step() -> torch.Tensor:
        return mamba_chunk_scan_combined(x, dt, A, bm, cm, cfg.chunk_size, D=D, dt_bias=dt_bias, dt_softplus=True,
                                         dt_limit=cfg.time_step_limit)  # fmt: skip

    out = step()  # warm-up: Triton's autotuning copies on each kernel's first call
    torch.autograd.grad(out, wrt, torch.randn_like(out))
    del out
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = step()
    torch.cuda.synchronize()
    held, forward_peak = torch.cuda.memory_allocated() - base, torch.cuda.max_memory_allocated() - base
    dout = torch.randn_like(out)
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    grads = torch.autograd.grad(out, wrt, dout)
    torch.cuda.synchronize()
    backward_peak = torch.cuda.max_memory_allocated() - before
    del grads
    slack = 64 * 512  # rounding of the few dozen allocations to 512-byte blocks
    assert abs(held - expected.held) <= slack
    assert abs(forward_peak - held - expected.forward_transient) <= slack
    assert abs(backward_peak - expected.backward_transient) <= slack
