"""Memory planning on torch's ``meta`` device: inside ``backend.planning()`` the Triton adapters allocate exactly what
they allocate when they launch (the interpreter on the CPU here, a GPU elsewhere) and launch nothing, so a plan of the
8B step counts the GPU path's tensors, in seconds. Outside it, ``meta`` keeps the torch path."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels run on CPU tensors

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("triton", reason="triton is not installed (the GPU extra)")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("these tests run the kernels under TRITON_INTERPRET=1", allow_module_level=True)

from ue5m3.layers import recipes  # noqa: E402
from ue5m3.layers.linear import convert, find_scale_state  # noqa: E402
from ue5m3.numerics import gemm  # noqa: E402
from ue5m3.numerics.backend import planning, planning_active  # noqa: E402
from ue5m3.numerics.checks import DeferredChecks  # noqa: E402
from ue5m3.numerics.kernels import launch, triton_gemm  # noqa: E402
from ue5m3.numerics.philox import RandomStream, SRState  # noqa: E402
from ue5m3.numerics.quantize import AxisQuantization, quantize, quantize_both_axes  # noqa: E402

pytestmark = [
    pytest.mark.triton,
    pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning", "ignore:overflow encountered:RuntimeWarning"),
]


class Allocations(TorchDispatchMode):
    """Every tensor an op allocates (an output that aliases no input), as (op, shape, dtype, bytes), in order. Copies
    from another device are left out: the CPU tensors a call moves to its device (a 0-dim constant) are copies on
    meta or CUDA and the tensor itself on the CPU."""

    def __init__(self):
        super().__init__()
        self.records = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        source = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if func.overloadpacket.__name__ == "_to_copy" and source is not None and source.device != out.device:
            return out
        for value, ret in zip(outputs, func._schema.returns, strict=False):
            if isinstance(value, torch.Tensor) and ret.alias_info is None and value.numel():
                name = func.overloadpacket.__name__
                self.records.append((name, tuple(value.shape), value.dtype, value.numel() * value.element_size()))
        return out


def _allocations(fn, device: str) -> list:
    """The allocations of ``fn(device)()``: ``fn`` makes the inputs on ``device`` (unrecorded) and returns the call.
    One unrecorded call first builds what a process builds once (decoding tables per device)."""
    fn(device)()
    call = fn(device)
    with Allocations() as recorder:
        call()
    return recorder.records


def _same_on_meta(fn) -> list:
    """The call's allocations on the CPU under the interpreter and on meta inside planning(): equal."""
    interpreted = _allocations(fn, "cpu")
    with planning():
        planned = _allocations(fn, "meta")
    assert planned == interpreted
    return planned


@pytest.fixture
def gpu_tiles(monkeypatch):
    """The interpreter at the GPU's probe tiles: a plan counts the GPU's ``taken`` flags and tile bounds."""
    monkeypatch.setattr(triton_gemm, "INTERPRETER_TILES", triton_gemm.PROBE_TILES[90])


def _operands(a, b, scheme="ue5m3_b16", two_d=True):
    checks = DeferredChecks()  # a meta tensor quantizes only with its finiteness checks deferred (no read back)
    return (
        quantize(a, scheme, backend="triton", checks=checks),
        quantize(b, scheme, axis=0, two_d=two_d, backend="triton", checks=checks),
    )


@pytest.mark.parametrize("scheme", ["ue5m3_b16", "nvfp4", "mxfp4"])
@pytest.mark.parametrize("model", ["probe_matched", "mma_sim"])
def test_a_gemm_on_meta_allocates_what_the_kernel_path_allocates(scheme, model, gpu_tiles):
    def call(device):
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(80, 256, generator=g).to(device), torch.randn(256, 96, generator=g).to(device)
        return lambda: gemm.matmul(*_operands(a, b, scheme=scheme), model, backend="triton")

    records = _same_on_meta(call)
    names = [r[0] for r in records]
    assert "empty" in names  # the kernels' outputs and, for probe_matched, the prepared operands and bounds
    if model == "probe_matched":
        assert (torch.Size([80, 256]), torch.float16) in [(torch.Size(r[1]), r[2]) for r in records]


@pytest.mark.parametrize("kwargs", [{}, {"two_d": True}, {"axis": 0}, {"rounding": "sf"}, {"rounding": "sr"}], ids=str)
def test_a_quantization_on_meta_allocates_what_the_kernel_path_allocates(kwargs):
    stream = RandomStream(seed=3, module="m", role="dgrad_upstream_gradient", step=1)
    extra = {"stream": stream} if "rounding" in kwargs else {}

    def call(device):
        x = torch.randn(96, 160, generator=torch.Generator().manual_seed(1)).to(device)
        return lambda: quantize(x, "nvfp4", backend="triton", checks=DeferredChecks(), **kwargs, **extra)

    _same_on_meta(call)


def test_both_axes_on_meta_allocate_what_the_kernel_path_allocates():
    stream = RandomStream(seed=3, module="m", role="dgrad_upstream_gradient", step=1)

    def call(device):
        x = torch.randn(96, 160, generator=torch.Generator().manual_seed(1)).to(device)
        last, first = AxisQuantization(), AxisQuantization(rounding="sf", stream=stream, target=2048.0)
        checks = DeferredChecks()
        return lambda: quantize_both_axes(x, "ue5m3_b16", last, first, transposed=True, backend="triton", checks=checks)

    _same_on_meta(call)


def _linear_step(recipe_name: str, backend: str, tokens: int, features_in: int, features_out: int):
    """fn(device) for _allocations: the converted linear and its input made, then one forward and backward."""

    def make(device):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(features_in, features_out, bias=False, device=device))
        sr = SRState(3)
        convert(model, recipes.get(recipe_name), select=["0"], sr_state=sr, backend=backend)
        find_scale_state(model).begin_step(1)
        sr.begin_step(1)
        sr.begin_microbatch(0)
        x = torch.randn(tokens, features_in, device=device, requires_grad=True)
        grad = torch.ones(tokens, features_out, device=device)

        def step():
            y = model(x)
            y.backward(grad)
            return y, x.grad, model[0].weight.grad

        return step

    return make


@pytest.mark.parametrize("recipe_name", ["ue5m3_b16", "nvfp4_te", "mxfp4"])
def test_an_fp4_linear_step_on_meta_allocates_what_the_kernel_path_allocates(recipe_name, gpu_tiles):
    _same_on_meta(_linear_step(recipe_name, "triton", 64, 128, 192))


def test_auto_on_meta_takes_the_triton_path_only_inside_planning(monkeypatch):
    """Inside planning(), 'auto' on meta describes the Triton launches (none runs) and allocates what 'triton' does;
    outside it, meta runs the torch path (no Triton launch described at all)."""
    from ue5m3.numerics.kernels import triton_quantize

    described = []

    def recording_run(launches, device):
        described.extend(launches)
        launch.run(launches, device)

    monkeypatch.setattr(triton_gemm, "run", recording_run)
    monkeypatch.setattr(triton_quantize, "run", recording_run)
    step = _linear_step("ue5m3_b16", "auto", 64, 128, 192)
    step("meta")()
    assert described == [] and not planning_active()
    with planning():
        auto = _allocations(step, "meta")
        assert planning_active()
    kernels = {d.kernel for d in described}
    assert {
        triton_gemm._probe_fast_kernel,
        triton_gemm._probe_exact_kernel,
        triton_quantize._quantize_both_axes_kernel,
    } <= kernels
    with planning():
        assert auto == _allocations(_linear_step("ue5m3_b16", "triton", 64, 128, 192), "meta")


def test_triton_on_meta_outside_planning_is_refused():
    with pytest.raises(ValueError, match="planning"):
        quantize(torch.empty(16, 64, device="meta"), "ue5m3_b16", backend="triton", checks=DeferredChecks())


@pytest.mark.parametrize("recipe_name", ["ue5m3_b16", "nvfp4_te", "mxfp4"])
def test_an_8b_linear_step_is_planned_without_the_torch_paths_loops(recipe_name, monkeypatch):
    """8,192 tokens, 4096 -> 4096 (the attention projections of the 8B model): on meta the torch path's
    probe-matched loops take minutes; inside planning() none of them runs (they would raise here), the step's
    kernels are described and their tensors allocated (seconds; the time is reported, never asserted)."""

    def refuse(*args, **kwargs):
        raise AssertionError("the torch path's exact loops ran inside planning()")

    monkeypatch.setattr(gemm, "_probe_matched_rows", refuse)
    monkeypatch.setattr(gemm, "_mma_sim_tile", refuse)
    with planning():
        y, grad_x, grad_w = _linear_step(recipe_name, "auto", 8192, 4096, 4096)("meta")()
    assert y.shape == (8192, 4096) and grad_x.shape == (8192, 4096) and grad_w.shape == (4096, 4096)
