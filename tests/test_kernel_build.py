"""Building the C kernel on first use (ue5m3.numerics.kernels.build, .cpu): the cache key, the ISA levels (the same
bits at every level), and failing closed without a compiler (backend="auto" then runs the torch path, saying why once;
backend="cpu_kernel" refuses, naming the missing compiler). The wheel itself ships no library: tests/test_packaging.py.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from ue5m3.numerics import gemm
from ue5m3.numerics.kernels import build
from ue5m3.numerics.kernels import cpu as cpu_kernel
from ue5m3.numerics.quantize import quantize

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "src" / "ue5m3" / "numerics" / "kernels" / "csrc"
needs_cc = pytest.mark.skipif(build.compiler() is None, reason="no C compiler")
LEVELS = [isa for isa in build.ISA_FLAGS if build.isa_reason(isa) is None]


@pytest.fixture
def fresh_load(monkeypatch):
    """First use again: no library compiled in this process yet, nothing told yet."""
    cpu_kernel._library.cache_clear()
    monkeypatch.setattr(cpu_kernel, "_told", set())
    yield
    cpu_kernel._library.cache_clear()


def test_the_key_covers_sources_compiler_isa_level_and_cpu(monkeypatch):
    sources = build.read_sources(CSRC)
    name = build.library_name(sources, "cc")
    assert name.startswith("ue5m3_kernels-native-") and name.endswith(".so")
    assert build.library_name(sources, "clang") != name
    assert build.library_name(sources, "cc", "portable") != name
    changed = {**sources, "accumulate.c": sources["accumulate.c"] + b"\n"}
    assert build.library_name(changed, "cc") != name
    monkeypatch.setattr(build, "cpu_identity", lambda: b"model name : another CPU")
    assert build.library_name(sources, "cc") != name


def test_the_flags_live_in_one_table_and_every_level_keeps_exact_fp32():
    assert set(build.ISA_FLAGS) >= {"portable", "avx2", "native"}
    for isa in build.ISA_FLAGS:
        flags = build.flags(isa)
        assert "-ffp-contract=off" in flags and "-fno-fast-math" in flags and "-ffast-math" not in flags
    assert not [f for f in build.flags("portable") if f.startswith("-march")]
    assert "-march=native" in build.flags("native")


def test_an_unknown_isa_level_names_the_accepted_ones(monkeypatch):
    monkeypatch.setenv(build.ISA_ENV, "avx9")
    with pytest.raises(ValueError, match=r"UE5M3_KERNEL_ISA='avx9' .*'avx2', 'avx512', 'native', 'portable'"):
        build.kernel_isa()
    monkeypatch.delenv(build.ISA_ENV)
    assert build.kernel_isa() == build.DEFAULT_ISA == "native"


def test_a_cpu_without_the_levels_instructions_is_refused_before_compiling(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "cpu_flags", lambda: frozenset({"sse2"}))
    monkeypatch.setattr(build.platform, "machine", lambda: "x86_64")
    with pytest.raises(build.CompileError, match="this CPU lacks .*avx2.*which ISA level 'avx2' needs"):
        build.compile_library(build.read_sources(CSRC), "cc", tmp_path, "avx2")
    assert not list(tmp_path.iterdir())


def test_a_compiler_that_does_not_run_is_a_compile_error(tmp_path):
    with pytest.raises(build.CompileError, match="running the C compiler"):
        build.compile_library(build.read_sources(CSRC), str(tmp_path / "no-such-cc"), tmp_path, "portable")


def test_without_a_compiler_auto_runs_the_torch_path_says_why_once_and_cpu_kernel_refuses(
    tmp_path, monkeypatch, fresh_load
):
    monkeypatch.setenv("UE5M3_CACHE", str(tmp_path / "cache"))  # nothing compiled there yet
    monkeypatch.setattr(build, "compiler", lambda: None)
    with pytest.raises(build.CompileError, match="no C compiler found .*install gcc"):
        cpu_kernel.load()
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        auto = [quantize(x, "ue5m3_b16", backend="auto") for _ in range(3)]
    told = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(told) == 1 and "no C compiler found" in str(told[0].message)
    assert "backend='auto' computes with the torch path" in str(told[0].message)
    reference = quantize(x, "ue5m3_b16", backend="torch")
    assert all(torch.equal(q.dequantize().view(torch.int32), reference.dequantize().view(torch.int32)) for q in auto)
    with pytest.raises(ValueError, match="backend='cpu_kernel' cannot quantize .*no C compiler found"):
        quantize(x, "ue5m3_b16", backend="cpu_kernel")
    assert not (tmp_path / "cache").exists()


@needs_cc
def test_first_use_compiles_into_the_cache_and_later_uses_load_it(tmp_path, monkeypatch, fresh_load):
    monkeypatch.setenv("UE5M3_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(build.ISA_ENV, "portable")
    lib = cpu_kernel.load()
    (built,) = (tmp_path / "cache").glob("ue5m3_kernels-portable-*.so")
    assert lib._name == str(built)

    def no_compiling(*args, **kwargs):
        raise AssertionError(f"compiled again: {args}")

    cpu_kernel._library.cache_clear()  # as a new process would: the library in the cache is loaded as it is
    monkeypatch.setattr(build.subprocess, "run", no_compiling)
    assert cpu_kernel.load()._name == str(built)


@pytest.fixture(scope="module")
def level_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("kernel_levels")


def _on_level(monkeypatch, cache: Path, isa: str) -> None:
    monkeypatch.setenv("UE5M3_CACHE", str(cache))
    monkeypatch.setenv(build.ISA_ENV, isa)


@pytest.mark.slow
@needs_cc
@pytest.mark.parametrize("isa", LEVELS)
def test_every_isa_level_quantizes_and_multiplies_to_the_same_bits(isa, level_cache, monkeypatch, fresh_load):
    """Each level this CPU runs (portable without the AVX2 payload GEMM, avx2 with it, avx512 with the 512-bit
    micro-kernels, native with the widest this CPU has) against the torch path: quantization under RNE and
    stochastic rounding, and the probe-matched GEMM on both of its kernels (the FP32 payload one, and the FP64
    encoded one that MXFP4 scales beyond 2^100 take), on ragged row bands and column panels."""
    _on_level(monkeypatch, level_cache, isa)
    flags = build.cpu_flags()
    assert cpu_kernel.has_payload_gemm() == (isa != "portable" and {"avx2", "fma"} <= flags)
    widest = 512 if {"avx512f", "avx512dq", "avx512vl"} <= flags else 256 if {"avx2", "fma"} <= flags else 0
    assert cpu_kernel.gemm_vector_bits() == {"portable": 0, "avx2": 256, "avx512": 512, "native": widest}[isa]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(32, 128, generator=g) * torch.exp2(torch.randint(-20, 20, (32, 1), generator=g).float())
    for scheme, rounding in (("ue5m3_b16", "rne"), ("nvfp4", "sr")):
        got, want = (
            quantize(x, scheme, rounding=rounding, generator=torch.Generator().manual_seed(1), backend=backend)
            for backend in ("cpu_kernel", "torch")
        )
        assert torch.equal(got.dequantize().view(torch.int32), want.dequantize().view(torch.int32))
    b = torch.randn(128, 40, generator=g)
    a_q, b_q = quantize(x[:13], "ue5m3_b16"), quantize(b, "ue5m3_b16", axis=0)
    kwargs = {"cross_slice_rounding": "rtz", "final_grid": 1024}
    got, want = (gemm.matmul(a_q, b_q, "probe_matched", backend=b, **kwargs) for b in ("cpu_kernel", "torch"))
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    a_q, b_q = quantize(x[:13] * 2.0**90, "mxfp4"), quantize(b * 2.0**-60, "mxfp4", axis=0)
    got, want = (gemm.matmul(a_q, b_q, "probe_matched", backend=b, **kwargs) for b in ("cpu_kernel", "torch"))
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)) and got.abs().max() > 0
    (built,) = level_cache.glob(f"ue5m3_kernels-{isa}-*.so")
    assert built.is_file()
