"""Native Transformer Engine NVFP4 fails closed off Blackwell; its real tests need TE and a Blackwell GPU."""

import pytest
import torch
from torch import nn

from ue5m3.layers import native_te, recipes


def _native_available() -> bool:
    try:
        native_te.require_native()
    except native_te.NativeUnavailable:
        return False
    return True


def test_native_path_fails_closed_with_an_install_hint_when_unavailable():
    if _native_available():
        pytest.skip("a Blackwell GPU with Transformer Engine is present")
    with pytest.raises(native_te.NativeUnavailable, match="Transformer Engine|compute capability|CUDA"):
        native_te.autocast(recipes.get("nvfp4_te"))
    with pytest.raises(native_te.NativeUnavailable):
        native_te.convert_native(nn.Sequential(nn.Linear(16, 16)), recipes.get("nvfp4_te"), select=["0"])


def test_recipes_without_a_native_path_are_refused_before_touching_the_gpu():
    with pytest.raises(ValueError, match="native_te is false"):
        native_te.te_recipe(recipes.get("ue5m3_b16"))


def test_execution_path_records_emulation():
    assert native_te.execution_path(recipes.get("nvfp4_te"), native_te.Execution.EMULATED, "torch") == {
        "execution": "emulated",
        "gemm_model": "probe_matched",
        "recipe": "nvfp4_te",
        "backend": "torch",
    }


@pytest.mark.gpu
@pytest.mark.skipif(not _native_available(), reason="needs Transformer Engine and a Blackwell GPU (cc >= 10.0)")
def test_native_te_linear_trains_a_step_under_the_nvfp4_recipe():  # pragma: no cover - Blackwell only
    recipe = recipes.get("nvfp4_te")
    te_recipe = native_te.te_recipe(recipe)
    assert te_recipe.disable_rht is False and te_recipe.disable_2d_quantization is False
    model = nn.Sequential(nn.Linear(256, 256)).cuda().to(torch.bfloat16)
    native_te.convert_native(model, recipe, select=["0"])
    x = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16)
    with native_te.autocast(recipe):
        y = model(x)
    y.float().sum().backward()
    assert torch.isfinite(model[0].weight.grad).all()
