"""Native Transformer Engine NVFP4 fails closed off Blackwell, and its provenance records what TE's recipe object
holds (tested against a stand-in of TE 2.16's recipe module); its real tests need TE and a Blackwell GPU."""

import dataclasses
import sys
import types

import pytest
import torch
from torch import nn

from helpers.backends import native_te_available
from ue5m3.layers import native_te, recipes
from ue5m3.numerics.formats import Rounding
from ue5m3.numerics.scaling import OperandRole


def test_native_path_fails_closed_with_an_install_hint_when_unavailable():
    if native_te_available():
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
@pytest.mark.skipif(not native_te_available(), reason="needs Transformer Engine and a Blackwell GPU (cc >= 10.0)")
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


# ----- provenance: what Transformer Engine's recipe object holds ------------------------------------------------
# Transformer Engine cannot be installed here, so a stand-in recipe module plays TE 2.16's: the names and defaults
# of transformer_engine.common.recipe at release_v2.16 (QParams, MMParams, NVFP4BlockScaling without fp8_gemm_*).


@dataclasses.dataclass(frozen=True)
class _QParams:
    power_2_scale: bool = False
    amax_epsilon: float = 0.0
    random_hadamard_transform: bool = False
    stochastic_rounding: bool = False
    fp4_2d_quantization: bool = False


@dataclasses.dataclass(frozen=True)
class _MMParams:
    use_split_accumulator: bool = True


@dataclasses.dataclass
class _NVFP4BlockScaling:
    """TE 2.16's NVFP4 recipe: three flags, the quantization parameters they imply, no split-accumulation setting."""

    disable_rht: bool = False
    disable_stochastic_rounding: bool = False
    disable_2d_quantization: bool = False
    fp8_dpa: bool = False
    fp8_mha: bool = False

    def __post_init__(self) -> None:
        self.fp4_quant_fwd_inp = _QParams(random_hadamard_transform=not self.disable_rht)
        self.fp4_quant_fwd_weight = _QParams(fp4_2d_quantization=not self.disable_2d_quantization)
        self.fp4_quant_bwd_grad = _QParams(
            random_hadamard_transform=not self.disable_rht, stochastic_rounding=not self.disable_stochastic_rounding
        )


@dataclasses.dataclass
class _RecipeWithGemmSettings(_NVFP4BlockScaling):
    """A recipe that has TE's per-GEMM settings (as TE's FP8 recipes do)."""

    fp8_gemm_fprop: _MMParams = dataclasses.field(default_factory=lambda: _MMParams(use_split_accumulator=False))
    fp8_gemm_dgrad: _MMParams = dataclasses.field(default_factory=_MMParams)
    fp8_gemm_wgrad: _MMParams = dataclasses.field(default_factory=_MMParams)


@pytest.fixture
def te_stand_in(monkeypatch):
    """``transformer_engine.common.recipe`` as a stand-in module (version 2.16.0), ``require_native`` passing."""
    root, common, recipe = (types.ModuleType(n) for n in ("transformer_engine", "transformer_engine.common", "r"))
    root.__version__ = "2.16.0"
    root.common, common.recipe = common, recipe
    recipe.NVFP4BlockScaling, recipe.MMParams = _NVFP4BlockScaling, _MMParams
    for name, module in (("transformer_engine", root), ("transformer_engine.common", common)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setitem(sys.modules, "transformer_engine.common.recipe", recipe)
    monkeypatch.setattr(native_te, "require_native", lambda: None)
    return recipe


def test_native_provenance_claims_no_split_accumulation_setting_that_te_2_16_nvfp4_does_not_have(te_stand_in):
    recipe = recipes.get("nvfp4_te")
    te_recipe = native_te.te_recipe(recipe)
    assert not hasattr(te_recipe, "fp8_gemm_dgrad") and not hasattr(te_recipe, "fp8_gemm_wgrad")  # nothing added
    record = native_te.execution_path(recipe, native_te.Execution.NATIVE_TE)["transformer_engine"]
    assert record["version"] == "2.16.0" and record["recipe_class"] == "_NVFP4BlockScaling"
    # the flags as TE's object holds them: RHT on, SR on the gradient, 2D weights (the TE recipe)
    assert (record["disable_rht"], record["disable_stochastic_rounding"], record["disable_2d_quantization"]) == (
        False,
        False,
        False,
    )
    assert record["fp4_quant_bwd_grad"]["stochastic_rounding"] is True
    assert record["fp4_quant_fwd_weight"]["fp4_2d_quantization"] is True
    # TE's modules decide split accumulation themselves; their defaults cannot be read without TE: unknown, and
    # never "forced off"
    for gemm in ("fprop", "dgrad", "wgrad"):
        assert record["split_accumulator"][gemm] == {"use_split_accumulator": None, "from": "unknown"}


def test_native_provenance_records_each_flag_of_the_recipe_it_built(te_stand_in):
    recipe = recipes.get("nvfp4_no_rht_all_linears")
    record = native_te.execution_path(recipe, native_te.Execution.NATIVE_TE)["transformer_engine"]
    assert record["disable_rht"] is True
    assert record["fp4_quant_fwd_inp"]["random_hadamard_transform"] is False
    assert record["fp4_quant_bwd_grad"]["random_hadamard_transform"] is False
    assert record["disable_stochastic_rounding"] is (
        recipe.roles[OperandRole.UPSTREAM_GRADIENT].rounding is Rounding.RNE
    )


def test_a_te_recipe_with_per_gemm_settings_has_split_accumulation_off_for_dgrad_and_wgrad(te_stand_in):
    te_stand_in.NVFP4BlockScaling = _RecipeWithGemmSettings
    te_recipe = native_te.te_recipe(recipes.get("nvfp4_te"))
    record = native_te.te_settings(te_recipe)["split_accumulator"]
    assert record["dgrad"] == {"use_split_accumulator": False, "from": "recipe.fp8_gemm_dgrad"}
    assert record["wgrad"] == {"use_split_accumulator": False, "from": "recipe.fp8_gemm_wgrad"}
    assert record["fprop"] == {"use_split_accumulator": False, "from": "recipe.fp8_gemm_fprop"}  # as the object has it
