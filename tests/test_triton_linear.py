"""The FP4 linear on the Triton backend (two-axis quantization, the probe_matched kernel) against the torch path,
forward and backward, bit for bit, under the Triton interpreter on the CPU: the GPU training path as a whole."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels run on CPU tensors

import pytest
import torch
from torch import nn

pytest.importorskip("triton", reason="triton is not installed (the GPU extra)")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("these tests run the kernels under TRITON_INTERPRET=1", allow_module_level=True)

from recipe_helpers import for_8b  # noqa: E402
from ue5m3.layers.linear import convert, find_scale_state  # noqa: E402
from ue5m3.numerics.kernels import triton_quantize  # noqa: E402
from ue5m3.numerics.philox import SRState  # noqa: E402

pytestmark = [
    pytest.mark.triton,
    pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning", "ignore:overflow encountered:RuntimeWarning"),
]


def _step(recipe_name: str, backend: str, name: str):
    torch.manual_seed(0)
    model = nn.Module()
    model.proj = nn.Linear(128, 192, bias=False)
    sr = SRState(5)
    records = convert(model, for_8b(recipe_name), select=["proj"], sr_state=sr, backend=backend)
    assert records[0].status == "converted"
    model.proj.policy = type(model.proj.policy)(**{**model.proj.policy.__dict__, "module": name})
    find_scale_state(model).begin_step(1)
    sr.begin_step(1)
    sr.begin_microbatch(0)
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(64, 128, generator=g) * torch.exp2(torch.randint(-3, 4, (1, 128), generator=g))).requires_grad_()
    y = model.proj(x)
    y.backward(torch.randn(y.shape, generator=g))
    return y.detach(), x.grad, model.proj.weight.grad


@pytest.mark.parametrize(
    ("recipe_name", "pairs_expected"),
    [("ue5m3_b16", 2), ("ue5m3_te_settings", 0), ("nvfp4_te", 0), ("nvfp4_no_rht_all_linears", 2)],
)
def test_a_training_step_of_the_fp4_linear_on_triton_equals_the_torch_path(recipe_name, pairs_expected, monkeypatch):
    name = "backbone.layers.45.mixer.down_proj"  # the 8B recipe's T = 2048 override reaches its wgrad dY^T
    fused = []
    original = triton_quantize.quantize_both_axes
    monkeypatch.setattr(triton_quantize, "quantize_both_axes", lambda x, **k: fused.append(k) or original(x, **k))
    got = _step(recipe_name, "triton", name)
    expected = _step(recipe_name, "torch", name)
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))
    # X's and dY's two copies each come from one read, except where the wgrad copies are Hadamard-transformed (TE
    # settings and TE's NVFP4 recipe: RHT(X^T) and RHT(dY^T) with their own current amax)
    pairs = [(k["last"] is not None, k["first"] is not None) for k in fused]
    assert pairs.count((True, True)) == pairs_expected
