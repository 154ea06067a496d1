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

from helpers.recipes import for_8b  # noqa: E402
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


def _accumulated_steps(backend: str, mode: str, prepared_calls: list, keep_prepared: bool = False, held=None):
    """Two optimizer steps of three microbatches (an in-place update between them) of a converted linear; returns
    every output and gradient (``held``: a list that gets the cache's bytes after each step's last microbatch)."""
    from ue5m3.layers.linear import set_weight_caching
    from ue5m3.numerics.kernels import triton_gemm

    torch.manual_seed(0)
    model = nn.Module()
    model.proj = nn.Linear(128, 192, bias=False)
    sr = SRState(5)
    convert(model, for_8b("ue5m3_b16"), select=["proj"], sr_state=sr, backend=backend)
    set_weight_caching(model, mode, keep_prepared=keep_prepared)
    state = find_scale_state(model)
    g = torch.Generator().manual_seed(1)
    original = triton_gemm.prepare_operand
    out = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            triton_gemm,
            "prepare_operand",
            lambda *a, **k: prepared_calls.append(k["operand"]) or original(*a, **k),
        )
        for step in (1, 2):
            state.begin_step(step)
            sr.begin_step(step)
            for microbatch in range(3):
                sr.begin_microbatch(microbatch)
                x = torch.randn(64, 128, generator=g).requires_grad_()
                y = model.proj(x)
                y.backward(torch.randn(y.shape, generator=g))
                out += [y.detach(), x.grad]
            out.append(model.proj.weight.grad.clone())
            if held is not None:
                held.append(model.proj.weight_cache.nbytes)
            with torch.no_grad():
                model.proj.weight.mul_(0.5)
            model.proj.weight.grad = None
    return out


def test_the_weights_prepared_operand_is_made_once_per_step_when_kept_and_changes_no_bit():
    """With ``keep_prepared`` (opt-in), W^T's and W's prepared GEMM operands (FP16 slice values, shifts, tile
    bounds) are made once per step, not in every microbatch's fprop and dgrad (2 preparations per step instead of
    6); by default the cache holds only the packed quantizations and every GEMM prepares its own B. Outputs and
    gradients are the torch path's bit for bit either way."""
    kept_calls, default_calls = [], []
    kept_bytes, default_bytes = [], []
    kept = _accumulated_steps("triton", "version", kept_calls, keep_prepared=True, held=kept_bytes)
    default = _accumulated_steps("triton", "version", default_calls, held=default_bytes)
    reference = _accumulated_steps("torch", "off", [])
    # per step: W^T and W once (kept) or in each of 3 microbatches, and wgrad's B (X) in each microbatch
    assert kept_calls.count("B") == 2 * (2 + 3)
    assert default_calls.count("B") == 2 * (2 * 3 + 3)
    assert kept_calls.count("A") == default_calls.count("A") == 2 * 3 * 3
    # held beyond the packed W^T and W when kept: per operand B [K, N] (W^T: K = 128, N = 192; W: K = 192, N = 128)
    # 2 bytes per element of FP16 values, an int32 shift per column and 64-wide slice, and the two FP32 bounds per
    # slice and tile of 64 columns (the interpreter's tiles): 2 x 3 and 3 x 2 of them
    prepared = 2 * (128 * 192 * 2 + 4 * 128 * 192 // 64) + 2 * 4 * (2 * 3 + 3 * 2)
    assert default_bytes[0] == default_bytes[1] > 0
    assert kept_bytes == [default_bytes[0] + prepared] * 2
    for a, b, c in zip(kept, default, reference, strict=True):
        for other in (b, c):
            assert torch.equal(a.view(torch.int32), other.view(torch.int32))
