"""The GPU check: one command on any machine with a CUDA GPU, sized to finish in about 8 minutes.

    python benchmarks/gpu_check.py [--out results/gpu_check.json] [--docs docs/performance.md] [--quick]

1. Bit identity on the real hardware: the Triton quantize kernel (every named scheme, RCEIL, every rounding with
   in-kernel Philox bits, 1D along either axis, 2D tiles, ragged shapes), the two-axis kernel (both copies of X and
   dY from one read), the Triton probe_matched GEMM on both of its paths (the exact FP16 tensor-core fast path and
   the TwoSum path; the hardware's add.rz.f32; a negative value in the snap's dead zone) and a training step of the
   FP4 linear against the CPU reference computed in the same process, bit for bit.
2. Benchmarks as same-run ratios: quantize time against a device copy of the same tensor; probe_matched against a
   BF16 ``torch.mm`` on the Nemotron-H 8B GEMM shapes (and with the fast path off, the exact path's cost; with B
   prepared once, as a held weight; with 1% outlier channels at x100 and x1000, their exact-path share); on real
   operands, those one training microbatch of the paper's 1.2B control at init gives its first and last blocks'
   GEMMs (captured as benchmarks/exact_share.py does, each beside its exact-path share); the FP4
   linear forward+backward (time and peak memory) against BF16 ``nn.Linear``; a two-layer Nemotron-H 8B training
   step (tokens/s, peak memory) against BF16.
3. On a Hopper GPU (compute capability 9.x), the FP8 emulator identification of docs/identification.md at CPU-scale
   corpus sizes: the structure the fitter finds in ``torch._scaled_mm`` with and without fast accumulation.

4. ptxas's statistics of every shipped kernel for this GPU's architecture (``ue5m3.numerics.kernels.compiled``), and
   the seconds each part took.

It writes one JSON and replaces the "GPU check" section of docs/performance.md (between its markers) with the
results and the GPU's name. Without a CUDA device it exits with status 2 and says so; nothing is written.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import json
import platform
import sys
import time
from pathlib import Path

import torch

BEGIN, END = "<!-- gpu-check:begin -->", "<!-- gpu-check:end -->"
DEVICE = "cuda"  # tests run the identity suite on "cpu" under TRITON_INTERPRET=1 (the same code, in the interpreter)
# Sizes of the identity cases: rows x columns of a quantized tensor, rows x K x columns of a GEMM and of the linear
# step (tokens x in x out). The interpreter test shrinks them; the kernels' paths and edges stay the same.
SIZES = {"quantize": (256, 512), "both_axes": (320, 448), "gemm": (192, 512, 160), "linear": (256, 512, 384)}
SHAPES_8B = {  # (tokens, in, out) of the Nemotron-H 8B linears at 8,192 tokens per microbatch
    "mamba in_proj": (8192, 4096, 18560),
    "mamba out_proj": (8192, 8192, 4096),
    "mlp up_proj": (8192, 4096, 21504),
    "mlp down_proj": (8192, 21504, 4096),
    "attention q/o": (8192, 4096, 4096),
}


def _sync() -> None:
    if torch.device(DEVICE).type == "cuda":
        torch.cuda.synchronize()


def _time(fn, repeats: int) -> float:
    """Best wall time of ``fn`` in seconds, device-synchronised, after one warm-up call."""
    fn()
    _sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync()
        best = min(best, time.perf_counter() - start)
    return best


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


def bit_identity(quick: bool) -> list[dict]:
    """Every GPU kernel case against the CPU reference: a list of {case, equal}."""
    from ue5m3.numerics import gemm
    from ue5m3.numerics.formats import UE8M0
    from ue5m3.numerics.philox import RandomStream
    from ue5m3.numerics.quantize import quantize
    from ue5m3.numerics.schemes import BlockScheme, ScaleRule, get_scheme

    schemes = {name: get_scheme(name) for name in ("ue5m3_b16", "ue5m3_b32", "nvfp4", "mxfp4")}
    schemes["mx_rceil"] = BlockScheme(
        name="mx_rceil", scale=UE8M0, block_size=32, target=None, scale_rule=ScaleRule.MX_RCEIL
    )
    rows, cols = SIZES["quantize"]
    layouts = {"1d": ((rows, cols), {}), "axis0": ((cols, 96), {"axis": 0}), "2d": ((rows, rows), {"two_d": True})}
    layouts["ragged"] = ((97, 200), {})
    stream = RandomStream(seed=7, module="gpu_check", role="dgrad_upstream_gradient", step=1)
    out = []
    g = torch.Generator().manual_seed(0)
    for scheme_name, scheme in schemes.items():
        for rounding in ("rne", "rtz", "sf", "sr_te", "sr"):
            for layout, (shape, kwargs) in layouts.items():
                if quick and layout != "1d":
                    continue
                x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-6, 6, shape, generator=g).float())
                sr = stream if rounding in ("sf", "sr_te", "sr") else None
                ref = quantize(x, scheme, rounding=rounding, stream=sr, backend="torch", **kwargs)
                got = quantize(x.to(DEVICE), scheme, rounding=rounding, stream=sr, backend="triton", **kwargs)
                equal = all(
                    _same_bits(getattr(got, f), getattr(ref, f)) for f in ("payload", "scales", "decode_scales")
                )
                out.append({"case": f"quantize {scheme_name} {rounding} {layout}", "equal": equal})
    from ue5m3.numerics.quantize import AxisQuantization, quantize_both_axes

    for scheme_name in ("ue5m3_b16", "nvfp4", "mxfp4"):
        for rounding in ("rne", "sf", "sr_te"):
            if quick and rounding == "sr_te":
                continue
            rows, cols = SIZES["both_axes"]
            x = torch.randn(rows, cols, generator=g) * torch.exp2(torch.randint(-6, 6, (1, cols), generator=g).float())
            sr = stream if rounding != "rne" else None
            last, first = AxisQuantization(rounding=rounding, stream=sr), AxisQuantization(rounding=rounding, stream=sr)
            ref = (
                quantize(x, scheme_name, rounding=rounding, stream=sr, backend="torch"),
                quantize(x.t(), scheme_name, rounding=rounding, stream=sr, backend="torch"),
            )
            got = quantize_both_axes(x.to(DEVICE), scheme_name, last, first, transposed=True, backend="triton")
            equal = all(
                _same_bits(getattr(q, f), getattr(r, f))
                for q, r in zip(got, ref, strict=True)
                for f in ("payload", "scales", "decode_scales")
            )
            out.append({"case": f"quantize both axes {scheme_name} {rounding}", "equal": equal})
    for scheme_name in ("ue5m3_b16", "ue5m3_b32", "nvfp4", "mxfp4"):
        for two_d in (False, True):
            for rounding, grid in (("rtz", 1024), ("rne", None)):
                m, k, n = SIZES["gemm"]
                a = torch.randn(m, k, generator=g)
                b = torch.randn(k, n, generator=g)
                a_q, b_q = quantize(a, scheme_name), quantize(b, scheme_name, axis=0, two_d=two_d)
                ref = gemm.matmul(a_q, b_q, "probe_matched", cross_slice_rounding=rounding, final_grid=grid)
                a_g, b_g = quantize(a.to(DEVICE), scheme_name), quantize(b.to(DEVICE), scheme_name, axis=0, two_d=two_d)
                got = gemm.matmul(
                    a_g, b_g, "probe_matched", cross_slice_rounding=rounding, final_grid=grid, backend="triton"
                )
                out.append(
                    {"case": f"probe_matched {scheme_name} 2d={two_d} {rounding}", "equal": _same_bits(got, ref)}
                )
    out += _probe_paths_identity(g)
    out.append({"case": "FP4 linear training step (ue5m3_b16, SR)", "equal": _linear_step_identity()})
    return out


def _probe_paths_identity(g: torch.Generator) -> list[dict]:
    """Both paths of the Triton probe_matched kernel, forced, against the CPU reference: operands whose blocks lie
    far apart (the bounds send them to the exact path unless forced) and a value in the snap's dead zone."""
    from ue5m3.numerics import gemm
    from ue5m3.numerics.kernels import triton_gemm
    from ue5m3.numerics.quantize import quantize

    m, k, n = SIZES["gemm"]
    spread = torch.exp2(3 * torch.randn(m, k // 16, generator=g)).repeat_interleave(16, 1)
    a = torch.randn(m, k, generator=g) * spread
    b = torch.randn(k, n, generator=g)
    dead = torch.zeros(2, 64)
    dead[0, 0], dead[1, 0], dead[0, 16] = -1.0, 1.0, 2.0**20
    dead_b = torch.zeros(64, 2)
    dead_b[0], dead_b[32] = 1.0, 2.0**20
    out = []
    for label, (x, w) in {"wide blocks": (a, b), "dead zone": (dead, dead_b)}.items():
        a_q, b_q = quantize(x, "ue5m3_b16"), quantize(w, "ue5m3_b16", axis=0)
        ref = gemm.matmul(a_q, b_q, "probe_matched")
        a_g, b_g = quantize(x.to(DEVICE), "ue5m3_b16"), quantize(w.to(DEVICE), "ue5m3_b16", axis=0)
        for path, bound in (("bounded", triton_gemm.FAST_BOUND), ("exact path", 0.0)):
            got = _probe(a_g, b_g, bound)[0]
            out.append({"case": f"probe_matched {label}, {path}", "equal": _same_bits(got, ref)})
    return out


def _linear_step_identity() -> bool:
    """Output, input gradient and weight gradient of one FP4 linear step (SR streams, the pairs) on the GPU's Triton
    backend against the CPU's."""
    from torch import nn

    from ue5m3.layers import recipes
    from ue5m3.layers.linear import convert, find_scale_state
    from ue5m3.numerics.philox import SRState

    def step(device: str, backend: str) -> tuple[torch.Tensor, ...]:
        torch.manual_seed(0)
        tokens, features_in, features_out = SIZES["linear"]
        model = nn.Sequential(nn.Linear(features_in, features_out, bias=False)).to(device)
        sr = SRState(3)
        convert(model, recipes.get("ue5m3_b16"), select=["0"], sr_state=sr, backend=backend)
        find_scale_state(model).begin_step(1)
        sr.begin_step(1)
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(tokens, features_in, generator=gen).to(device).requires_grad_()
        y = model(x)
        y.backward(torch.randn(y.shape, generator=gen).to(device))
        return y.detach(), x.grad, model[0].weight.grad

    return all(_same_bits(a, b) for a, b in zip(step(DEVICE, "triton"), step("cpu", "auto"), strict=True))


def bench_quantize(repeats: int) -> list[dict]:
    from ue5m3.numerics.philox import RandomStream
    from ue5m3.numerics.quantize import AxisQuantization, quantize, quantize_both_axes

    x = torch.randn(8192, 8192, device="cuda")
    stream = RandomStream(seed=0, module="bench", role="dgrad_upstream_gradient", step=1)
    copy = _time(lambda: x.clone(), repeats)
    rows = [{"case": "copy (x.clone())", "seconds": copy, "copy_bandwidth_fraction": 1.0}]
    for name, fn in {
        "ue5m3_b16 1D RNE": lambda: quantize(x, "ue5m3_b16", backend="triton"),
        "ue5m3_b16 1D SF": lambda: quantize(x, "ue5m3_b16", rounding="sf", stream=stream, backend="triton"),
        "ue5m3_b16 2D tiles": lambda: quantize(x, "ue5m3_b16", two_d=True, backend="triton"),
        "nvfp4 sr_te": lambda: quantize(x, "nvfp4", rounding="sr_te", stream=stream, backend="triton"),
        # two outputs from one read: against one copy, 1.0 would be two quantizations at copy speed each
        "ue5m3_b16 both axes (X fprop + wgrad copy)": lambda: quantize_both_axes(
            x, "ue5m3_b16", AxisQuantization(), AxisQuantization(), backend="triton"
        ),
    }.items():
        t = _time(fn, repeats)
        rows.append({"case": name, "seconds": t, "copy_bandwidth_fraction": copy / t})
    return rows


def bench_gemm(repeats: int, quick: bool) -> list[dict]:
    from ue5m3.numerics import gemm
    from ue5m3.numerics.kernels import triton_gemm
    from ue5m3.numerics.quantize import quantize

    rows = []
    for label, (m, k, n) in SHAPES_8B.items():
        if quick and label != "attention q/o":
            continue
        a, b = torch.randn(m, k, device=DEVICE), torch.randn(k, n, device=DEVICE)
        a16, b16 = a.bfloat16(), b.bfloat16()
        a_q, b_q = quantize(a, "ue5m3_b16"), quantize(b, "ue5m3_b16", axis=0, two_d=True)
        base = _time(lambda a16=a16, b16=b16: torch.mm(a16, b16), repeats)
        t = _time(lambda a_q=a_q, b_q=b_q: gemm.matmul(a_q, b_q, "probe_matched", backend="triton"), repeats)
        exact_path = _time(lambda a_q=a_q, b_q=b_q: _probe(a_q, b_q, 0.0)[0], max(1, repeats // 3))
        fraction = float(_probe(a_q, b_q, triton_gemm.FAST_BOUND)[1].float().mean())
        rows.append(
            {
                "case": f"probe_matched {label} {m}x{k}x{n} (exact path on {100 * fraction:.1f}% of tile-slices)",
                "seconds": t,
                "bf16_mm_seconds": base,
                "x_bf16": t / base,
            }
        )
        rows.append(
            {
                "case": f"probe_matched {label}, fast path off (TwoSum everywhere)",
                "seconds": exact_path,
                "x_bf16": exact_path / base,
            }
        )
        if label != "attention q/o":
            continue
        # the weight's prepared operand held (WeightCache(keep_prepared=True)): the GEMM prepares A only
        prepared = gemm.prepare_operand(b_q, "probe_matched", backend="triton")
        held = _time(
            lambda a_q=a_q, b_q=b_q, p=prepared: gemm.matmul(a_q, b_q, "probe_matched", backend="triton", prepared_b=p),
            repeats,
        )
        rows.append({"case": f"probe_matched {label}, B prepared once", "seconds": held, "x_bf16": held / base})
        # operands with outlier channels: the exact path's share and what it costs
        for factor in (100.0, 1000.0):
            x = a.clone()
            x[:, torch.randperm(k)[: max(k // 100, 1)].to(DEVICE)] *= factor  # 1% of the channels
            x_q = quantize(x, "ue5m3_b16")
            t = _time(lambda x_q=x_q, b_q=b_q: gemm.matmul(x_q, b_q, "probe_matched", backend="triton"), repeats)
            share = float(_probe(x_q, b_q, triton_gemm.FAST_BOUND)[1].float().mean())
            rows.append(
                {
                    "case": f"probe_matched {label}, 1% outlier channels x{factor:.0f} "
                    f"(exact path on {100 * share:.1f}% of tile-slices)",
                    "seconds": t,
                    "x_bf16": t / base,
                    "exact_share": share,
                }
            )
    return rows


CAPTURED = {"model": "dense_1p2b", "overrides": {}, "sequence": 4096}
"""Whose operands :func:`bench_captured` times: one microbatch of the paper's 1.2B control at init (the model of
``benchmarks/records/exact_share_dense_1p2b_init.json``, at 4,096 tokens). The interpreter test shrinks it."""


def _sibling(name: str):
    """``benchmarks/<name>.py``, beside this script, loaded by its path: nothing is added to ``sys.path``, where the
    scripts' names (``identify``, ``train``) would shadow other modules."""
    spec = importlib.util.spec_from_file_location(f"ue5m3_benchmarks_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bench_captured(repeats: int, quick: bool) -> list[dict]:
    """probe_matched on real operands: one training microbatch of CAPTURED's model at init under ue5m3_b16 on this
    GPU, every FP4 GEMM's operands as the recipe quantizes them (``benchmarks/exact_share.py``'s capture), and the
    GEMMs of its first and last blocks (the last only, ``quick``) timed against a BF16 ``torch.mm`` of their shape,
    each beside its exact-path share."""
    exact_share = _sibling("exact_share")
    from ue5m3 import models
    from ue5m3.layers import recipes
    from ue5m3.layers.linear import layer_index
    from ue5m3.layers.matmul import run_gemm
    from ue5m3.training.config import model_layers

    name, overrides, sequence = CAPTURED["model"], CAPTURED["overrides"], CAPTURED["sequence"]
    model = models.build(name, device="cpu", generator=torch.Generator().manual_seed(0), **overrides).to(DEVICE)
    vocab = overrides.get("vocab_size", models.config(name).vocab_size)
    tokens = torch.randint(0, vocab, (1, sequence + 1), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    blocks = sorted({layer_index(layer) for layer in models.eligible_linears(model)})
    timed_blocks = {blocks[-1]} if quick else {blocks[0], blocks[-1]}
    recipe = recipes.get("ue5m3_b16").for_model(model_layers(name, overrides))
    captured = exact_share.capture(
        model, recipe, tokens, keep_operands=lambda layer: layer_index(layer) in timed_blocks
    )
    summary = exact_share.summarise(captured)
    rows = []
    for row in (r for r in captured if "operands" in r):
        (a_q, b_q), config = row["operands"], row["gemm_config"]
        m, k, n = row["shape"]
        a16 = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16)
        b16 = torch.randn(k, n, device=DEVICE, dtype=torch.bfloat16)
        base = _time(lambda a16=a16, b16=b16: torch.mm(a16, b16), repeats)
        t = _time(lambda a_q=a_q, b_q=b_q, c=config: run_gemm(a_q, b_q, c, backend="triton"), repeats)
        share = row["exact"] / max(row["tile_slices"], 1)
        rows.append(
            {
                "case": f"probe_matched captured {name} init {row['layer']} {row['gemm']} {m}x{k}x{n} "
                f"(exact path on {100 * share:.1f}% of tile-slices)",
                "seconds": t,
                "bf16_mm_seconds": base,
                "x_bf16": t / base,
                "exact_share": share,
            }
        )
    timed = sum(r["seconds"] for r in rows), sum(r["bf16_mm_seconds"] for r in rows)
    rows.append(
        {
            "case": f"probe_matched captured {name} init, the {len(rows)} GEMMs above together (all "
            f"{len(captured)} GEMMs of the microbatch: exact path on {100 * summary['share']:.1f}% of tile-slices)",
            "seconds": timed[0],
            "x_bf16": timed[0] / timed[1],
            "captured": {k: summary[k] for k in ("share", "flagged_share", "per_gemm")},
        }
    )
    return rows


def compiled_statistics() -> dict:
    """ptxas's statistics of every shipped kernel for this GPU's architecture (Hopper's or Blackwell's tiles), from
    :mod:`ue5m3.numerics.kernels.compiled`: what the timings above ran."""
    from ue5m3.numerics.kernels import compiled

    major, minor = torch.cuda.get_device_capability()
    capability = 100 if major * 10 + minor >= 100 else 90
    if major < 9:
        return {}
    return {"capability": capability, "kernels": compiled.report(capability)}


def _probe(a_q, b_q, bound: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton probe_matched GEMM of two ue5m3_b16 operands (the paper's settings) with the fast path's bound set
    to ``bound`` (0: the exact path everywhere): the result and the path each tile-slice took."""
    from ue5m3.numerics import gemm
    from ue5m3.numerics.kernels import triton_gemm

    return triton_gemm.probe_gemm_payload(
        a_q.payload,
        a_q.scales,
        b_q.payload,
        b_q.scales,
        block=16,
        column_block=16 if b_q.layout.two_d else 1,
        width=64,
        rtz=True,
        grid=1024,
        alpha=gemm.alpha(a_q, b_q),
        paths=True,
        fast_bound=bound,
    )


def bench_linear(repeats: int) -> list[dict]:
    from torch import nn

    from ue5m3.layers import recipes
    from ue5m3.layers.linear import convert, find_scale_state
    from ue5m3.numerics.philox import SRState

    tokens, features_in, features_out = 8192, 4096, 4096
    x = torch.randn(tokens, features_in, device="cuda")
    grad = torch.randn(tokens, features_out, device="cuda")
    bf16 = nn.Linear(features_in, features_out, device="cuda", dtype=torch.bfloat16)
    fp4 = nn.Sequential(nn.Linear(features_in, features_out, device="cuda"))
    convert(fp4, recipes.get("ue5m3_b16"), select=["0"], sr_state=SRState(0))
    state, step = find_scale_state(fp4), [0]

    def run_bf16():
        bf16(x.bfloat16().requires_grad_()).backward(grad.bfloat16())

    def run_fp4():
        step[0] += 1
        state.begin_step(step[0])
        fp4(x.clone().requires_grad_()).backward(grad)

    def peak_mib(fn) -> float:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / 2**20

    base, t = _time(run_bf16, repeats), _time(run_fp4, repeats)
    return [
        {
            "case": f"FP4 linear fwd+bwd {tokens}x{features_in}->{features_out}",
            "seconds": t,
            "bf16_seconds": base,
            "x_bf16": t / base,
            "peak_mib": peak_mib(run_fp4),
            "bf16_peak_mib": peak_mib(run_bf16),
        }
    ]


def _step_case(recipe_name: str, seq: int, batch: int, repeats: int) -> dict:
    """One two-layer Nemotron-H 8B training step (a Mamba block and an MLP block at full width and vocabulary)."""
    from ue5m3 import models
    from ue5m3.layers import recipes
    from ue5m3.layers.linear import convert, find_scale_state
    from ue5m3.numerics.philox import SRState
    from ue5m3.training.loop import loss_fn

    torch.cuda.reset_peak_memory_stats()
    model = models.build("nemotron_h_8b", device="cuda", hybrid_override_pattern="M-")
    # two blocks hold no "final 8 layers": both run in FP4, without the recipe's BF16 layers and overrides
    recipe = dataclasses.replace(recipes.get(recipe_name), bf16_layers=(), target_overrides=())
    convert(model, recipe, select=models.eligible_linears(model), sr_state=SRState(0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    state, step = find_scale_state(model), [0]
    vocab = models.config("nemotron_h_8b").vocab_size
    tokens = torch.randint(0, vocab, (batch, seq + 1), device="cuda")

    def one() -> None:
        step[0] += 1
        if state is not None:
            state.begin_step(step[0])
        loss_fn(model, tokens[:, :-1], tokens[:, 1:]).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    t = _time(one, repeats)
    return {
        "case": f"nemotron_h_8b 2 layers, {recipe_name}",
        "seconds": t,
        "tokens_per_s": batch * seq / t,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
    }


def bench_step(repeats: int) -> list[dict]:
    rows = [_step_case(name, 4096, 1, repeats) for name in ("bf16", "ue5m3_b16")]
    rows[1]["x_bf16"] = rows[1]["seconds"] / rows[0]["seconds"]
    return rows


def identify_hopper(quick: bool) -> list[dict]:
    """The FP8 identification of docs/identification.md on this Hopper GPU, at CPU-scale corpus sizes: the
    candidates matching every probe of ``torch._scaled_mm`` with and without fast accumulation."""
    from ue5m3.identify import CorpusConfig, candidate_grid, fit, make_corpus
    from ue5m3.identify.oracles import HopperFP8Oracle

    corpus = make_corpus(CorpusConfig(scheme="fp8_e4m3"))
    grid = candidate_grid(
        slice_widths=(16, 32, 64, 128),
        partial_bits=(None, 12, 13, 14, 24) if quick else (None, 12, 13, 14, 15, 24),
        roundings=("rne", "rtz"),
        promotions=(None, 128) if quick else (None, 128, 256, 512),
        final_grids=(None,),
        extra=(),
    )
    rows = []
    for fast in (False, True):
        start = time.perf_counter()
        table = fit(corpus, HopperFP8Oracle(fast_accum=fast), grid)
        rows.append(
            {
                "case": f"Hopper FP8 identification, use_fast_accum={fast}",
                "identified": table.identified(),
                "best": table.best(),
                "cells": table.cells,
                "best_score": table.score(table.best()),
                "seconds": time.perf_counter() - start,
            }
        )
    return rows


def render_markdown(result: dict) -> str:
    """The docs section for one check's JSON result."""
    lines = [
        BEGIN,
        f"**{result['date']}, {result['gpu']}** (`python benchmarks/gpu_check.py`; torch {result['torch']}, "
        f"triton {result['triton']}).",
        "",
        f"Bit identity against the CPU reference: {result['identical']} of {result['cases']} cases identical"
        + ("." if result["identical"] == result["cases"] else f"; different: {', '.join(result['different'])}."),
        "",
        "| benchmark | s | ratio |",
        "|---|---:|---:|",
    ]
    for row in result["benchmarks"]:
        ratio = next(
            (
                f"{row[k]:.2f} {label}"
                for k, label in (("x_bf16", "x BF16"), ("copy_bandwidth_fraction", "of copy bandwidth"))
                if k in row
            ),
            "",
        )
        extra = (
            f", {row['tokens_per_s']:.0f} tokens/s, {row['peak_memory_gib']:.1f} GiB peak"
            if "tokens_per_s" in row
            else ""
        )
        if "peak_mib" in row:
            extra += f", peak {row['peak_mib']:.0f} MiB (BF16 {row['bf16_peak_mib']:.0f} MiB)"
        lines.append(f"| {row['case']}{extra} | {row['seconds']:.4f} | {ratio} |")
    kernels = result.get("compiled", {}).get("kernels", {})
    if kernels:
        lines += ["", f"Compiled for sm_{result['compiled']['capability']} (ptxas via Triton {result['triton']}):", ""]
        lines += [
            "| kernel | registers | stack bytes | shared bytes | CTAs / SM | MMAs | FP64 |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name, k in kernels.items():
            lines.append(
                f"| {name} | {k['registers']} | {k['stack_bytes']} | {k['shared_bytes']} | {k['ctas_per_sm']} | "
                f"{k['mma']} | {k['fp64']} |"
            )
    if result.get("section_seconds"):
        spent = ", ".join(f"{k} {v:.0f} s" for k, v in result["section_seconds"].items())
        lines += ["", f"Time per part: {spent}."]
    for row in result.get("identification", []):
        found = ", ".join(row["identified"]) or f"none; best {row['best']} with {row['best_score']}/{row['cells']}"
        lines += ["", f"{row['case']} ({row['cells']} cells, {row['seconds']:.0f} s): {found}."]
    lines.append(END)
    return "\n".join(lines)


def update_docs(path: Path, section: str) -> None:
    """Replace the text between the GPU-check markers of ``path`` with ``section`` (which carries the markers)."""
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{path} has no '{BEGIN}' ... '{END}' section to fill")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(head + section + tail)
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/gpu_check.json"))
    parser.add_argument("--docs", type=Path, default=Path("docs/performance.md"))
    parser.add_argument("--quick", action="store_true", help="fewer cases and shapes (about 2 minutes)")
    parser.add_argument("--skip-identification", action="store_true", help="no Hopper FP8 identification")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; this check runs on a machine with a CUDA GPU (nothing written)")
        return 2
    import triton

    repeats = 3 if args.quick else 10
    seconds: dict[str, float] = {}

    def timed(name, fn, *a):
        start = time.perf_counter()
        try:
            return fn(*a)
        finally:
            seconds[name] = time.perf_counter() - start

    identity = timed("identity", bit_identity, args.quick)
    benchmarks = timed("quantize", bench_quantize, repeats) + timed("gemm", bench_gemm, repeats, args.quick)
    benchmarks += timed("captured", bench_captured, repeats, args.quick)
    benchmarks += timed("linear", bench_linear, repeats) + timed("step", bench_step, 2 if args.quick else 5)
    hopper = torch.cuda.get_device_capability()[0] == 9
    run_identification = hopper and not args.skip_identification
    identification = timed("identification", identify_hopper, args.quick) if run_identification else []
    kernels = timed("compiled", compiled_statistics)
    result = {
        "date": datetime.date.today().isoformat(),
        "gpu": torch.cuda.get_device_name(),
        "capability": list(torch.cuda.get_device_capability()),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "cases": len(identity),
        "identical": sum(c["equal"] for c in identity),
        "different": [c["case"] for c in identity if not c["equal"]],
        "identity": identity,
        "benchmarks": benchmarks,
        "identification": identification,
        "compiled": kernels,
        "section_seconds": seconds,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    update_docs(args.docs, render_markdown(result))
    print(render_markdown(result))
    return 0 if result["identical"] == result["cases"] else 1


if __name__ == "__main__":
    sys.exit(main())
