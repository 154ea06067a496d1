"""The Triton versions and platforms the kernels take: a Triton outside the tested range is refused at import with a
message naming the versions, the refusal reaches ``backend='triton'`` as its reason (``auto`` falls back to torch),
and on ROCm the kernels refuse, naming why (their PTX paths are NVIDIA's), instead of picking the inline
``add.rz.f32`` because ``device.type == 'cuda'``."""

import importlib
import sys

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (the GPU extra)")

from ue5m3.numerics import backend  # noqa: E402
from ue5m3.numerics.kernels import launch  # noqa: E402

pytestmark = pytest.mark.triton

KERNEL_MODULES = (
    "triton_gemm",
    "triton_probe_parts",
    "triton_probe_exact",
    "triton_mma_sim",
    "triton_quantize",
    "triton_quantize_parts",
    "triton_pack",
)


@pytest.mark.parametrize("version", ["3.7.0", "3.7.1", "3.8.2", "3.9.0", "3.9.1+git1234"])
def test_the_tested_minor_versions_are_accepted(version):
    launch.check_triton_version(version)


@pytest.mark.parametrize("version", ["3.6.0", "3.10.0", "4.0.0", "2.3.1", "nightly"])
def test_other_versions_are_refused_naming_the_tested_ones(version):
    with pytest.raises(ImportError, match=rf"triton {version} is not supported.*3\.7\.1 and 3\.9\.0"):
        launch.check_triton_version(version)


def test_this_environments_triton_is_one_the_kernels_take():
    import triton

    launch.check_triton_version(triton.__version__)
    assert triton.__version__.split("+")[0] in launch.TESTED_TRITON or "3.7" <= triton.__version__[:3] <= "3.9"


@pytest.mark.parametrize("module", KERNEL_MODULES)
def test_an_unsupported_triton_is_refused_at_import_and_named_as_the_reason(module, monkeypatch):
    import triton

    from ue5m3.numerics import kernels

    name = f"ue5m3.numerics.kernels.{module}"
    original = importlib.import_module(name)
    with monkeypatch.context() as scoped:  # the package attribute and sys.modules get the original module back
        scoped.setattr(kernels, module, original)
        scoped.setitem(sys.modules, name, original)
        _refused_then_imported(module, name, triton, scoped)


def _refused_then_imported(module, name, triton, monkeypatch):
    original_version = triton.__version__
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(ImportError, match="triton 3.6.0 is not supported"):
        importlib.import_module(name)
    monkeypatch.delitem(sys.modules, name, raising=False)
    reason = backend.triton_import_reason(module)
    assert reason is not None and "3.7.1 and 3.9.0" in reason and "backend='torch'" in reason
    # with the version restored the module imports again
    monkeypatch.setattr(triton, "__version__", original_version)
    monkeypatch.delitem(sys.modules, name, raising=False)
    assert backend.triton_import_reason(module) is None


def test_a_refused_triton_is_the_reason_backend_triton_gives(monkeypatch):
    from ue5m3.numerics.quantize import quantize

    monkeypatch.setattr(backend, "triton_import_reason", lambda module: "triton 3.6.0 is not supported (test)")
    x = torch.randn(4, 32)
    with pytest.raises(ValueError, match="triton 3.6.0 is not supported"):
        quantize(x, "ue5m3_b16", backend="triton")
    assert backend.triton_reason(x, quantize(x, "ue5m3_b16").scheme) == "triton 3.6.0 is not supported (test)"


def test_rocm_is_refused_by_name_and_never_takes_the_ptx_rounding(monkeypatch):
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.version, "hip", None)
    assert launch.triton_device_reason(cuda) is None and launch.hardware_rtz(cuda)
    monkeypatch.setattr(torch.version, "hip", "6.4.0")
    reason = launch.triton_device_reason(cuda)
    assert reason is not None and "ROCm" in reason and "NVIDIA" in reason and "backend='torch'" in reason
    assert not launch.hardware_rtz(cuda)
    assert launch.hardware_rtz(torch.device("meta")) and not launch.hardware_rtz(torch.device("cpu"))
