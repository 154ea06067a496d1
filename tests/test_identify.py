"""Emulator identification: candidate models against the GEMM layer and exact rationals, probes, oracles and
the fitter's self-test (it must recover the hidden parameters of a synthetic oracle exactly)."""

from __future__ import annotations

import csv
import math
from fractions import Fraction
from pathlib import Path

import pytest
import torch

from ue5m3.identify import (
    EmulatorOracle,
    OracleUnavailable,
    RecordedOracle,
    candidate_grid,
    fit,
    make_corpus,
    make_oracle,
    parse,
    record,
)
from ue5m3.identify.candidates import Candidate, accumulate_cells
from ue5m3.identify.corpus import Corpus
from ue5m3.identify.oracles import HopperFP8Oracle, NativeNVFP4Oracle
from ue5m3.identify.probes import FP8, CorpusConfig, Probe, _bf16_midpoint_distance, witness_probe
from ue5m3.numerics import gemm
from ue5m3.numerics.quantize import quantize

SMALL = CorpusConfig(
    order_k=512, order_permutations=32, threshold_k=512, threshold_cells=256, broad_m=32, broad_n=32,
    broad_k=512, broad_cells=128,
)  # fmt: skip
REFERENCE = Path(__file__).resolve().parents[1] / "src" / "ue5m3" / "reference_data" / "emulator_identification.csv"


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return make_corpus(SMALL)


# ----- candidates --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["w64-exact-rtz-g1024", "wK-exact-rne", "w32-fused13-rtz-p128", "w64-fused35-rtz", "w16-exact-rne-g4096"]
)
def test_candidate_names_round_trip(name: str) -> None:
    assert parse(name).name == name


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"slice_width": 64, "rounding": "sf"}, "rounding"),
        ({"slice_width": 64, "final_grid": 1000}, "final_grid"),
        ({"slice_width": None, "partial_bits": 13}, "fused"),
        ({"slice_width": 64, "partial_bits": 48}, "partial_bits"),
        ({"slice_width": 64, "promotion": 96}, "promotion"),
        ({"slice_width": 64, "promotion": 64}, "promotion"),
    ],
)
def test_candidate_rejects_bad_parameters(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Candidate(**kwargs)


def test_parse_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="cannot parse candidate 'w64-rtz'"):
        parse("w64-rtz")


def test_grid_sizes() -> None:
    grid = candidate_grid()
    # 5 widths x 2 roundings x 6 grids, MMA-Sim, and the exact sum under each grid
    assert len(grid) == 60 + 1 + 6
    assert len({c.name for c in grid}) == len(grid)


def _operands(scheme: str, m: int, k: int, n: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=gen) * torch.exp2(
        torch.randint(-8, 8, (m, k // 16), generator=gen)
    ).repeat_interleave(16, 1)
    b = torch.randn(k, n, generator=gen) * torch.exp2(
        torch.randint(-8, 8, (k // 16, n), generator=gen)
    ).repeat_interleave(16, 0)
    return quantize(a, scheme, axis=1), quantize(b, scheme, axis=0)


@pytest.mark.parametrize("scheme", ["nvfp4", "ue5m3_b16"])
@pytest.mark.parametrize(
    ("width", "rounding", "grid"), [(64, "rtz", 1024), (64, "rne", None), (32, "rtz", None), (128, "rne", 4096)]
)
def test_exact_candidates_equal_probe_matched_gemm(scheme: str, width: int, rounding: str, grid: int | None) -> None:
    a_q, b_q = _operands(scheme, 12, 256, 10, seed=width)
    full = gemm.matmul(a_q, b_q, "probe_matched", slice_width=width, cross_slice_rounding=rounding, final_grid=grid)
    products = a_q.encoded().double()[:, None, :] * b_q.encoded().double().T[None, :, :]  # [M, N, K]
    cand = Candidate(slice_width=width, rounding=rounding, final_grid=grid)
    out = accumulate_cells(products.reshape(-1, 256), cand, block=16) * gemm.alpha(a_q, b_q)
    assert torch.equal(out.view(torch.int32), full.reshape(-1).view(torch.int32))


def test_fused35_equals_mma_sim_gemm() -> None:
    a_q, b_q = _operands("nvfp4", 9, 512, 7, seed=3)
    full = gemm.matmul(a_q, b_q, "mma_sim")
    products = a_q.encoded().double()[:, None, :] * b_q.encoded().double().T[None, :, :]
    out = accumulate_cells(products.reshape(-1, 512), parse("w64-fused35-rtz"), block=16) * gemm.alpha(a_q, b_q)
    assert torch.equal(out.view(torch.int32), full.reshape(-1).view(torch.int32))


# Scalar reference in exact rationals ----------------------------------------------------------------------


def _round_fp32(x: Fraction, rounding: str) -> Fraction:
    if x == 0:
        return Fraction(0)
    sign, mag = (1 if x > 0 else -1), abs(x)
    e = math.floor(math.log2(mag.numerator) - math.log2(mag.denominator))
    while Fraction(2) ** e > mag:
        e -= 1
    while Fraction(2) ** (e + 1) <= mag:
        e += 1
    quantum = Fraction(2) ** max(e - 23, -149)
    n, rest = divmod(mag, quantum)
    if rounding == "rne" and (rest > quantum / 2 or (rest == quantum / 2 and n % 2)):
        n += 1
    return sign * n * quantum


def _snap(x: Fraction, grid: int | None) -> Fraction:
    if grid is None:
        return x
    scaled = x * grid
    n = math.floor(scaled)
    rest = scaled - n
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2):
        n += 1
    return Fraction(n, grid)


def _truncate(t: Fraction, quantum: Fraction) -> Fraction:
    n = abs(t) // quantum
    return (n if t >= 0 else -n) * quantum


def _reference(products: list[Fraction], c: Candidate, block: int) -> Fraction:
    width = c.slice_width or len(products)
    span = c.promotion or width
    products = products + [Fraction(0)] * (-len(products) % span)
    outer, inner = Fraction(0), Fraction(0)
    for j in range(len(products) // width):
        chunk = products[j * width : (j + 1) * width]
        if c.partial_bits is None:
            inner = _round_fp32(inner + _round_fp32(sum(chunk), "rne"), c.rounding.value)
        else:
            terms = [sum(chunk[i : i + block]) for i in range(0, width, block)] + [inner]
            nonzero = [abs(t) for t in terms if t != 0]
            if nonzero:
                top = max(math.floor(math.log2(float(t))) for t in nonzero)  # floats suffice: exact powers of two
                top = max(e for e in range(top - 1, top + 2) if Fraction(2) ** e <= max(nonzero))
                quantum = Fraction(2) ** (top - c.partial_bits)
                inner = _round_fp32(sum(_truncate(t, quantum) for t in terms), c.rounding.value)
        if c.promotion is not None and ((j + 1) * width) % c.promotion == 0:
            outer, inner = _round_fp32(outer + inner, "rne"), Fraction(0)
    acc = inner if c.promotion is None else _round_fp32(outer + inner, "rne")
    return _snap(acc, c.final_grid)


@pytest.mark.parametrize(
    ("name", "block"),
    [("w32-fused13-rtz-p128", 1), ("w32-fused14-rne", 1), ("w64-fused35-rtz", 16), ("w16-exact-rtz-p64-g2048", 16),
     ("wK-exact-rne-g1024", 16), ("w64-exact-rtz", 16), ("w32-exact-rne-p96", 16), ("w48-exact-rtz", 16)],
)  # fmt: skip
def test_candidates_against_exact_rationals(name: str, block: int) -> None:
    gen = torch.Generator().manual_seed(len(name))
    k = 272  # not a multiple of every slice: exercises the zero padding of the last slice
    scale = torch.exp2(torch.randint(-30, 12, (6, k), generator=gen).to(torch.float64))
    products = torch.randint(-64, 65, (6, k), generator=gen).to(torch.float64) * scale
    out = accumulate_cells(products, parse(name), block=block)
    for row in range(6):
        expected = _reference([Fraction(float(p)) for p in products[row]], parse(name), block)
        assert Fraction(float(out[row])) == expected, (name, row)


# ----- probes -------------------------------------------------------------------------------------------------


def test_corpus_families_and_fixed_points(corpus: Corpus) -> None:
    assert set(corpus.probes) == {"order", "threshold", "broad_packed", "broad_quantized"}
    for probe in corpus.probes.values():
        a_q, b_q = probe.quantized()
        assert torch.equal(a_q.dequantize(), probe.a) and torch.equal(b_q.dequantize(), probe.b)
    packed = corpus.probes["broad_packed"]
    enc_a, _, alpha = packed.encoded()
    assert float(alpha) == 1.0
    scales = packed.quantized()[0].scales[:-1]  # the carrier row aside
    assert set(torch.log2(scales[scales > 0]).tolist()) <= set(range(-5, 7))
    order = corpus.probes["order"]
    sums = order.products().sum(1)
    assert torch.all(sums == sums[0])  # permutations keep the products, hence the exact sum


def test_probe_rejects_non_fixed_point() -> None:
    a = torch.randn(4, 32)
    with pytest.raises(ValueError, match="operand A is not a fixed point"):
        Probe(
            family="broad_packed",
            scheme="nvfp4",
            a=a,
            b=torch.zeros(32, 4),
            rows=torch.tensor([0]),
            cols=torch.tensor([0]),
        )


def test_corpus_round_trip_and_truncation(corpus: Corpus, tmp_path: Path) -> None:
    path = corpus.save(tmp_path / "corpus.safetensors")
    loaded = Corpus.load(path)
    assert loaded.config == corpus.config and set(loaded.probes) == set(corpus.probes)
    for name, probe in corpus.probes.items():
        assert torch.equal(loaded.probes[name].a, probe.a) and torch.equal(loaded.probes[name].rows, probe.rows)
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(ValueError, match="broken.safetensors is not a readable ue5m3 probe corpus"):
        Corpus.load(broken)
    with pytest.raises(FileNotFoundError, match="make-probes"):
        Corpus.load(tmp_path / "missing.safetensors")


def test_bf16_midpoint_distance() -> None:
    one = torch.tensor([1.0 + 2.0**-8, 1.0 + 2.0**-8 + 2.0**-12, 1.0, -(1.0 + 2.0**-8)])
    assert _bf16_midpoint_distance(one).tolist() == [0.0, 2.0**-12 / 2.0**-7, 0.5, 0.0]


def test_witnesses_lie_near_bf16_midpoints() -> None:
    gen = torch.Generator().manual_seed(5)
    x, w = torch.randn(256, 256, generator=gen), torch.randn(64, 256, generator=gen) * 0.05
    probe = witness_probe(x, w, SMALL)
    decoded = (probe.a @ probe.b)[probe.rows, probe.cols]
    assert probe.compare == "bf16" and 0 < probe.rows.numel() <= SMALL.witness_cells
    assert bool((_bf16_midpoint_distance(decoded) <= SMALL.witness_tolerance).all())


# ----- oracles ------------------------------------------------------------------------------------------------


def test_hardware_oracles_fail_closed() -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present: the hardware oracles may run here")
    with pytest.raises(OracleUnavailable, match="needs a CUDA GPU"):
        HopperFP8Oracle()
    with pytest.raises(OracleUnavailable, match="native_te_nvfp4"):
        NativeNVFP4Oracle()
    with pytest.raises(OracleUnavailable):
        make_oracle("hopper_fp8:fast")


def test_make_oracle_rejects_unknown_spec() -> None:
    with pytest.raises(ValueError, match="unknown oracle 'tpu'"):
        make_oracle("tpu")


def test_recorded_oracle_replays_and_checks_the_corpus(corpus: Corpus, tmp_path: Path) -> None:
    path = corpus.save(tmp_path / "corpus.safetensors")
    hidden = EmulatorOracle("w32-exact-rne-g2048")
    recording = record(hidden, corpus, path, tmp_path / "labels.safetensors")
    replay = RecordedOracle(recording, path)
    for name, probe in corpus.probes.items():
        assert torch.equal(replay.outputs(probe), hidden.outputs(probe)), name
    other = make_corpus(CorpusConfig(**{**SMALL.__dict__, "seed": 7}), families=("threshold",))
    other_path = other.save(tmp_path / "other.safetensors")
    with pytest.raises(ValueError, match="recorded on corpus sha256"):
        RecordedOracle(recording, other_path)


# ----- the fitter ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("hidden", ["w64-exact-rtz-g1024", "w32-exact-rne-g2048", "w64-fused35-rtz", "w128-exact-rtz"])
def test_self_test_recovers_hidden_parameters(corpus: Corpus, hidden: str) -> None:
    grid = candidate_grid(partial_bits=(None, 35))
    table = fit(corpus, EmulatorOracle(hidden), grid)
    assert table.identified() == [hidden]
    assert table.best() == hidden


def test_self_test_fp8_structure() -> None:
    corpus = make_corpus(CorpusConfig(**{**SMALL.__dict__, "scheme": FP8}))
    grid = candidate_grid(
        slice_widths=(16, 32, 64), partial_bits=(None, 13, 14), promotions=(None, 128), final_grids=(None,),
        extra=(), exact_sum=False,
    )  # fmt: skip
    table = fit(corpus, EmulatorOracle("w32-fused13-rtz-p128"), grid)
    # a 13-bit fused sum of 33 terms always fits FP32: the rne twin is the same model
    assert sorted(table.identified()) == ["w32-fused13-rne-p128", "w32-fused13-rtz-p128"]
    assert parse("w32-fused13-rne-p128").twin_of(parse("w32-fused13-rtz-p128"), block=1)
    assert not parse("w32-fused24-rne").twin_of(parse("w32-fused24-rtz"), block=1)  # 24 + 1 + 6 bits > 24
    assert not parse("w64-fused35-rne").twin_of(parse("w64-fused35-rtz"), block=16)


def test_paper_tables_cover_the_reference_rows(corpus: Corpus) -> None:
    table = fit(corpus, EmulatorOracle("w64-exact-rtz-g1024"), candidate_grid())
    rows = table.paper_tables()
    ours = {(r["experiment"], r["variant"]) for r in rows}
    with REFERENCE.open() as handle:
        reference = {(r["experiment"], r["variant"]) for r in csv.DictReader(handle)}
    missing = {r for r in reference - ours if r[0] != "bf16_witnesses"}  # no witness family in this corpus
    assert not missing
    by_variant = {(r["experiment"], r["variant"]): r for r in rows}
    assert (
        by_variant[("order_tests_group_width", "rtz_64")]["passed"]
        == by_variant[("order_tests_group_width", "rtz_64")]["total"]
    )


def test_span_bits_counts_bit_positions() -> None:
    from ue5m3.identify.corpus import _span_bits

    products = torch.tensor([[1.0, 2.0**-30, 0.0], [3.0, -3.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    assert _span_bits(products).tolist() == [31, 2, 0]


def test_witnesses_feed_the_corpus_and_its_provenance() -> None:
    gen = torch.Generator().manual_seed(11)
    # block magnitudes spread over 2^18: some witness products span more than FP32's 24 bits
    spread = torch.exp2(torch.randint(-14, 4, (128, 16), generator=gen).float()).repeat_interleave(16, 1)
    x, w = torch.randn(128, 256, generator=gen) * spread, torch.randn(64, 256, generator=gen) * 0.05
    corpus = make_corpus(SMALL, witness_gemm=(x, w), families=("witness", "order"))
    assert set(corpus.probes) == {"witness", "order"}
    base = corpus.provenance["order_base"]
    assert base["source"] == "witness" and base["span_bits"] > 24
    row, col = base["cell"]
    order, witness = corpus.probes["order"], corpus.probes["witness"]
    assert torch.equal(order.a[0], witness.a[row]) and torch.equal(order.b[:, 0], witness.b[:, col])
    # the carrier row keeps the witness tensor's amax, hence every block scale of the base row
    a_q = order.quantized()[0]
    assert torch.equal(a_q.scales[0], witness.quantized()[0].scales[row])
    # without wide witnesses the base is the wide synthetic pair
    narrow = make_corpus(SMALL, witness_gemm=(torch.randn(128, 256, generator=gen), w), families=("witness", "order"))
    assert narrow.provenance["order_base"]["source"] == "synthetic_wide"


def test_hopper_fp8_glue_feeds_scaled_mm_as_cublas_wants(monkeypatch) -> None:
    """The oracle's own code (padding, FP8 casts, column-major B, unit scales, cell gathering) against a stand-in
    for ``torch._scaled_mm`` that checks its inputs; the real GEMM needs an H100/H200 and is not faked here."""
    from ue5m3.identify import oracles

    seen = {}

    def scaled_mm(a, b, *, scale_a, scale_b, out_dtype, use_fast_accum):
        assert a.dtype == b.dtype == torch.float8_e4m3fn and out_dtype == torch.float32
        assert a.shape[0] % 16 == 0 and b.shape[1] % 16 == 0 and b.stride(0) == 1  # column-major B
        assert scale_a.dim() == scale_b.dim() == 0 and float(scale_a) == float(scale_b) == 1.0
        seen["fast"] = use_fast_accum
        return a.to(torch.float64).matmul(b.to(torch.float64)).to(torch.float32)

    monkeypatch.setattr(oracles, "_cuda_device", lambda *_: torch.device("cpu"))
    monkeypatch.setattr(torch, "_scaled_mm", scaled_mm, raising=False)
    corpus = make_corpus(CorpusConfig(**{**SMALL.__dict__, "scheme": FP8}), families=("broad_packed", "threshold"))
    oracle = oracles.HopperFP8Oracle(fast_accum=True)
    for probe in corpus.probes.values():
        expected = (probe.a.double() @ probe.b.double()).float()[probe.rows, probe.cols]
        assert torch.equal(oracle.outputs(probe), expected)
    odd = Probe(  # 5 x 32 @ 32 x 7: padded to 16 x 16 for _scaled_mm, the padding never read back
        family="broad_packed", scheme=FP8, a=torch.full((5, 32), 0.5), b=torch.full((32, 7), 2.0),
        rows=torch.tensor([0, 4]), cols=torch.tensor([6, 0]),
    )  # fmt: skip
    assert oracle.outputs(odd).tolist() == [32.0, 32.0]
    assert seen["fast"] is True
    with pytest.raises(ValueError, match="needs an fp8_e4m3 corpus"):
        oracle.outputs(make_corpus(SMALL, families=("threshold",)).probes["threshold"])


def test_paper_tables_skip_variants_the_best_candidate_cannot_take() -> None:
    from ue5m3.identify.fit import MatchTable

    names = ("w32-fused13-rtz-p128", "w64-fused13-rtz-p128", "w128-exact-rtz")  # w128 + p128 cannot exist
    table = MatchTable(
        candidates=names, passed={n: {"order": 4} for n in names}, total={"order": 4}, oracle={"kind": "test"}
    )
    rows = table.paper_tables("w32-fused13-rtz-p128")
    widths = [r["variant"] for r in rows if r["experiment"] == "order_tests_group_width"]
    assert widths == ["rtz_32", "rtz_64"]
