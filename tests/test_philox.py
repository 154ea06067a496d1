"""Philox4x32-10 stochastic-rounding bits: Random123 known answers, one stream on every backend, thread count
and sharding."""

import os
import subprocess
import sys

import pytest
import torch

from ue5m3.numerics import philox
from ue5m3.numerics.kernels import cpu as cpu_kernel
from ue5m3.numerics.philox import ElementIndex, RandomStream
from ue5m3.numerics.quantize import quantize

# Random123 tests/kat_vectors, "philox4x32 10": counter (4 words), key (2 words), expected output (4 words)
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]
KAT_7_ROUNDS_ZERO = (0x5F6FB709, 0x0D893F64, 0x4F121F81, 0x4F730A48)

needs_kernel = pytest.mark.skipif(not cpu_kernel.available(), reason="no C compiler for the CPU kernel")
STREAM = RandomStream(seed=20260721, module="layers.3.mlp.down_proj", role="dgrad_upstream_gradient", step=7)


@pytest.mark.parametrize(("counter", "key", "expected"), KAT)
def test_philox_matches_the_random123_known_answers(counter, key, expected):
    assert philox.philox4x32_int(counter, key) == expected
    words = philox.philox4x32(tuple(torch.tensor([w]) for w in counter), key)
    assert tuple(int(w) for w in words) == expected


def test_philox_round_count_is_a_parameter_and_seven_rounds_match_random123():
    assert philox.philox4x32_int((0, 0, 0, 0), (0, 0), rounds=7) == KAT_7_ROUNDS_ZERO


def test_tensor_philox_equals_the_scalar_reference_on_random_counters():
    g = torch.Generator().manual_seed(0)
    counters = torch.randint(0, 1 << 32, (4, 500), generator=g, dtype=torch.int64)
    key = (0xDEADBEEF, 0x01234567)
    words = torch.stack(philox.philox4x32(tuple(counters), key))
    for i in range(counters.shape[1]):
        assert tuple(words[:, i].tolist()) == philox.philox4x32_int(tuple(counters[:, i].tolist()), key)


@pytest.mark.parametrize("bit_count", [8, 53])
def test_bits_of_element_i_come_from_counter_i_over_elements_per_counter(bit_count):
    bits = philox.random_bits(STREAM, (3, 5), bit_count).flatten().tolist()
    per = philox.elements_per_counter(bit_count)
    k = STREAM.key
    for i, value in enumerate(bits):
        words = philox.philox4x32_int((i // per, 0, STREAM.step, STREAM.microbatch), k)
        if bit_count == 8:
            assert value == words[i % per] >> 24
        else:
            lane = i % per
            assert value == (words[2 * lane] << 21) | (words[2 * lane + 1] >> 11)
        assert 0 <= value < 1 << bit_count


def test_streams_differ_by_seed_module_role_step_and_microbatch():
    base = philox.random_bits(STREAM, (64,), 8)
    for field, value in [
        ("seed", 1),
        ("module", "x"),
        ("role", "wgrad_upstream_gradient"),
        ("step", 8),
        ("microbatch", 1),
    ]:
        other = RandomStream(**{**STREAM.__dict__, field: value})
        assert not torch.equal(philox.random_bits(other, (64,), 8), base), field


def test_random_stream_refuses_bad_counters():
    with pytest.raises(ValueError, match="step"):
        RandomStream(seed=1, step=-1)
    with pytest.raises(ValueError, match="microbatch"):
        RandomStream(seed=1, microbatch=1 << 32)
    with pytest.raises(ValueError, match="seed"):
        RandomStream(seed=True)


@pytest.mark.parametrize("bit_count", [8, 53])
@pytest.mark.parametrize("split", ["rows", "columns"])
def test_two_shardings_of_one_tensor_draw_identical_bits(bit_count, split):
    full = philox.random_bits(STREAM, (12, 40), bit_count)
    if split == "rows":
        shards = [((0, 0), (5, 40)), ((5, 0), (7, 40))]
    else:
        shards = [((0, 0), (12, 17)), ((0, 17), (12, 23))]
    for offset, shape in shards:
        local = philox.random_bits(STREAM, shape, bit_count, index=ElementIndex((12, 40), offset))
        rows, cols = slice(offset[0], offset[0] + shape[0]), slice(offset[1], offset[1] + shape[1])
        assert torch.equal(local, full[rows, cols])


def test_element_index_refuses_shards_outside_the_global_tensor():
    with pytest.raises(ValueError, match="dimension 1"):
        ElementIndex((4, 8), (0, 6)).indices((4, 4), "dy")
    with pytest.raises(ValueError, match="dimensions"):
        ElementIndex((4, 8)).indices((4,), "dy")


LAYOUTS = {
    "1d-last": ((64, 96), {}),
    "1d-axis0": ((64, 48), {"axis": 0}),
    "2d": ((48, 64), {"two_d": True}),
    "ragged": ((33, 40), {}),
    "3d-axis1": ((3, 32, 5), {"axis": 1}),
}


@needs_kernel
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("mode", ["sf", "sr_te", "sr"])
@pytest.mark.parametrize("scheme", ["ue5m3_b16", "nvfp4", "mxfp4"])
def test_kernel_draws_the_same_philox_bits_as_the_torch_reference(scheme, mode, layout):
    shape, kwargs = LAYOUTS[layout]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    q_torch = quantize(x, scheme, rounding=mode, stream=STREAM, backend="torch", **kwargs)
    q_kernel = quantize(x, scheme, rounding=mode, stream=STREAM, backend="cpu_kernel", **kwargs)
    assert torch.equal(q_torch.payload.view(torch.int32), q_kernel.payload.view(torch.int32))
    explicit = philox.random_bits(STREAM, shape, q_torch.rounding.random_bit_count)
    q_bits = quantize(x, scheme, rounding=mode, random_bits=explicit, backend="torch", **kwargs)
    assert torch.equal(q_bits.payload, q_torch.payload)


@needs_kernel
@pytest.mark.parametrize("backend", ["torch", "cpu_kernel"])
def test_sharded_quantization_draws_the_bits_of_the_whole_tensor(backend):
    """Rows split across two ranks (1D blocks along the last axis, one shared reference): each shard's payload is
    the matching slice of the whole tensor's, element for element."""
    x = torch.randn(24, 64, generator=torch.Generator().manual_seed(2))
    g = x.abs().max()
    whole = quantize(x, "ue5m3_b16", tensor_amax=g, rounding="sf", stream=STREAM, backend=backend).payload
    for start, stop in [(0, 10), (10, 24)]:
        shard = quantize(
            x[start:stop],
            "ue5m3_b16",
            tensor_amax=g,
            rounding="sf",
            stream=STREAM,
            index=ElementIndex((24, 64), (start, 0)),
            backend=backend,
        ).payload
        assert torch.equal(shard, whole[start:stop])


_THREADS_SCRIPT = """
import hashlib, torch
from ue5m3.numerics.philox import RandomStream
from ue5m3.numerics.quantize import quantize
x = torch.randn(512, 1024, generator=torch.Generator().manual_seed(3))
q = quantize(x, "ue5m3_b16", rounding="sf", stream=RandomStream(seed=5, module="m", role="r"), backend="{backend}")
print(hashlib.sha256(q.payload.numpy().tobytes()).hexdigest())
"""


@needs_kernel
def test_stochastic_rounding_bits_do_not_depend_on_the_thread_count_or_backend():
    digests = set()
    for threads in ("1", "2"):
        for backend in ("torch", "cpu_kernel"):
            env = {**os.environ, "OMP_NUM_THREADS": threads}
            out = subprocess.run(
                [sys.executable, "-c", _THREADS_SCRIPT.format(backend=backend)],
                capture_output=True,
                text=True,
                env=env,
                check=True,
            )
            digests.add(out.stdout.strip())
    assert len(digests) == 1


def test_without_a_stream_a_generator_seeds_a_fresh_one_reproducibly():
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(4))
    a = quantize(x, "ue5m3_b16", rounding="sf", generator=torch.Generator().manual_seed(9)).payload
    b = quantize(x, "ue5m3_b16", rounding="sf", generator=torch.Generator().manual_seed(9)).payload
    c = quantize(x, "ue5m3_b16", rounding="sf", generator=torch.Generator().manual_seed(10)).payload
    assert torch.equal(a, b) and not torch.equal(a, c)
