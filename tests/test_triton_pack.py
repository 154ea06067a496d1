"""The Triton pack and unpack kernels against the torch path, bit for bit, under the Triton interpreter on the CPU:
every E2M1 code (both zeros), and the storage form of quantized tensors of every FP4 scheme."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels run on CPU tensors

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (the GPU extra)")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("these tests run the kernels under TRITON_INTERPRET=1", allow_module_level=True)

from helpers.bits import same_bits  # noqa: E402
from ue5m3.numerics import formats  # noqa: E402
from ue5m3.numerics.kernels import triton_pack  # noqa: E402
from ue5m3.numerics.quantize import quantize  # noqa: E402

pytestmark = pytest.mark.triton


def test_every_pair_of_e2m1_codes_packs_and_unpacks_as_the_torch_path():
    codes = torch.arange(16)
    pairs = torch.cartesian_prod(codes, codes)  # [256, 2]: every byte
    values = formats.decode(pairs.reshape(-1), "e2m1").reshape(256, 2)
    assert bool(torch.signbit(values[pairs == 8]).all())  # code 8 is -0.0
    packed = triton_pack.pack_e2m1(values)
    assert torch.equal(packed[:, 0].long(), pairs[:, 0] | (pairs[:, 1] << 4))  # element 2i in the low nibble
    assert same_bits(triton_pack.unpack_e2m1(packed), values)


@pytest.mark.parametrize("scheme", ["ue5m3_b16", "nvfp4", "mxfp4"])
@pytest.mark.parametrize("two_d", [False, True])
def test_the_storage_form_is_the_torch_paths_bit_for_bit(scheme, two_d):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(96, 160, generator=g) * torch.exp2(torch.randint(-8, 8, (96, 160), generator=g).float())
    x[3, :40] = -0.0
    q = quantize(x, scheme, two_d=two_d)
    by_kernel, by_torch = q.pack(kernel=True), q.pack(kernel=False)
    assert all(same_bits(a, b) for a, b in zip(by_kernel.tensors(), by_torch.tensors(), strict=True))
    for unpacked in (by_kernel.unpack(kernel=True), by_torch.unpack(kernel=False)):
        assert same_bits(unpacked.payload_blocks, q.payload_blocks)
        assert same_bits(unpacked.scale_values, q.scale_values)


def test_the_kernels_refuse_what_they_do_not_take():
    with pytest.raises(ValueError, match="even last axis"):
        triton_pack.pack_e2m1(torch.zeros(3, 5))
    with pytest.raises(ValueError, match="uint8"):
        triton_pack.unpack_e2m1(torch.zeros(3, 5))


def test_64_bit_offsets_give_the_same_codes(monkeypatch):
    """A launch takes 64-bit offsets only past 2^31 - 1 elements; forced here, the same bytes and values."""
    x = torch.randn(40, 96, generator=torch.Generator().manual_seed(3))
    values = quantize(x, "ue5m3_b16").payload_blocks
    narrow = triton_pack.pack_e2m1(values)
    monkeypatch.setattr(triton_pack, "INT32_LIMIT", 100)
    assert triton_pack.pack_launch(values)[1].constants["INDEX64"]
    assert triton_pack.unpack_launch(narrow)[1].constants["INDEX64"]
    assert same_bits(triton_pack.pack_e2m1(values), narrow)
    assert same_bits(triton_pack.unpack_e2m1(narrow), values)
