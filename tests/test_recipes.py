"""Tests for ue5m3.layers.recipes: named recipes, operand resolution, strict loading and lossless round trips."""

from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.recipes import eight_b, for_8b
from ue5m3 import models
from ue5m3.layers import recipes
from ue5m3.layers.recipes import (
    GemmConfig,
    GemmModel,
    LayerKind,
    LayerSelector,
    ModelLayers,
    Operand,
    Recipe,
    RoleConfig,
    TargetOverride,
)
from ue5m3.numerics.formats import Rounding
from ue5m3.numerics.scaling import OperandRole
from ue5m3.numerics.schemes import SCHEMES
from ue5m3.training.config import model_layers

# The paper's quantizer call order per linear per training step (gemm spec section 1).
CALL_ORDER = (
    Operand.FPROP_ACTIVATION,
    Operand.FPROP_WEIGHT,
    Operand.DGRAD_UPSTREAM_GRADIENT,
    Operand.WGRAD_UPSTREAM_GRADIENT,
    Operand.DGRAD_WEIGHT,
    Operand.WGRAD_ACTIVATION,
)
LATE_LAYERS = tuple(range(44, 52))
NAMED = [
    "bf16",
    "mxfp4",
    "nvfp4_4over6",
    "nvfp4_no_rht_all_linears",
    "nvfp4_te",
    "ue5m3_b16",
    "ue5m3_b16_4over6",
    "ue5m3_b32",
    "ue5m3_te_settings",
    "ue5m3_torch_control",
]


def test_names_lists_the_packaged_recipes():
    assert recipes.names() == NAMED


@pytest.mark.parametrize("name", NAMED)
def test_named_recipe_round_trips_through_dict_and_yaml(name, tmp_path):
    recipe = recipes.get(name)
    assert recipe.name == name
    assert Recipe.from_dict(recipe.to_dict()) == recipe
    assert Recipe.from_dict(copy.deepcopy(recipe.to_dict())).to_dict() == recipe.to_dict()
    path = recipes.dump(recipe, tmp_path / f"{name}.yaml")
    assert recipes.load(path) == recipe
    assert [p.name for p in tmp_path.iterdir()] == [f"{name}.yaml"]  # no temp file left behind


@pytest.mark.parametrize("name", NAMED)
def test_packaged_file_opens_with_a_comment_citing_the_paper_and_spec(name):
    text = (Path(recipes.__file__).parent / "recipe_files" / f"{name}.yaml").read_text()
    assert text.startswith(f"# {name}:")
    header = "".join(line for line in text.splitlines() if line.startswith("#"))
    assert "UE5M3 FP4 Block Scaling" in header and "spec" in header


STUDY = [
    *(f"e4m3_t{t}{s}" for t in (256, 448) for s in ("", "_4over6")),
    *(f"ue5m3_{c}t{t}" for c in ("all_finite_", "alto_") for t in (2048, 448, 8192)),
    "ue5m3_t2048",
    "ue5m3_t448",
    *(f"ue5m3_t448_d{d}" for d in (1, 10, 200)),
    "ue5m3_t8192",
    *(f"ue8m0_{r}_b{b}" for r in ("floor", "rceil") for b in (16, 32)),
]


def test_study_recipes_ship_each_one_factor_from_the_reference_arm():
    """The format study's arms (recipe_files/study, issue 26 item 4) are in the package, read by name, and differ
    from the reference arm ue5m3_t448 only in the scale scheme, the targets and D."""
    assert recipes.study_names() == sorted(STUDY)
    assert not set(STUDY) & set(NAMED)
    reference = recipes.get("ue5m3_t448").to_dict()
    assert (reference["scheme"], reference["interval"]) == ("ue5m3_b16", 50)
    assert recipes.get("ue5m3_b16").to_dict() | {"name": "ue5m3_t448", "description": reference["description"],
                                                 "target_overrides": []} == reference  # fmt: skip
    for name in STUDY:
        text = (Path(recipes.__file__).parent / "recipe_files" / "study" / f"{name}.yaml").read_text()
        assert text.startswith(f"# {name}:") and "issue 26" in text
        recipe = recipes.get(name)
        assert recipe.name == name and Recipe.from_dict(recipe.to_dict()) == recipe
        scheme = SCHEMES[recipe.scheme]
        targets = {role: cfg.target for role, cfg in recipe.roles.items()}
        if name.startswith("ue8m0"):
            assert scheme.target is None and set(targets.values()) == {None} and recipe.interval == 1
            assert (scheme.block_size, scheme.scale_rule.value) == (int(name[-2:]), f"mx_{name.split('_')[1]}")
            assert recipe.gemm.final_grid is None and not any(c.two_d for c in recipe.roles.values())
        else:
            t = float(name.split("_t")[1].split("_")[0])
            assert set(targets.values()) == {t}
            convention = name.split("_t")[0]  # e4m3, ue5m3, ue5m3_all_finite, ue5m3_alto
            assert scheme.scale.name == convention and scheme.block_size == 16
            d = int(name.split("_d")[1]) if "_d" in name else (1 if name.startswith("e4m3") else 50)
            assert recipe.interval == d
            assert (scheme.selection is not None) == name.endswith("4over6")
        same = {k: v for k, v in recipe.to_dict().items() if k not in ("name", "description", "scheme", "interval")}
        ref_same = {k: v for k, v in reference.items() if k not in ("name", "description", "scheme", "interval")}
        for role in ("activation", "weight", "upstream_gradient"):
            same["roles"][role] = {**same["roles"][role], "target": None, "two_d": None}
            ref_same["roles"][role] = {**ref_same["roles"][role], "target": None, "two_d": None}
        same["gemm"] = {**same["gemm"], "final_grid": None}
        ref_same["gemm"] = {**ref_same["gemm"], "final_grid": None}
        assert same == ref_same, name


def test_unknown_recipe_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="ue5m3_b16") as info:
        recipes.get("ue5m3_b64")
    assert "'ue5m3_b64'" in str(info.value)
    with pytest.raises(TypeError):
        recipes.get(16)


def test_operand_roles_and_gemms():
    assert [(o.gemm, o.role) for o in Operand] == [
        ("fprop", OperandRole.ACTIVATION),
        ("fprop", OperandRole.WEIGHT),
        ("dgrad", OperandRole.UPSTREAM_GRADIENT),
        ("dgrad", OperandRole.WEIGHT),
        ("wgrad", OperandRole.UPSTREAM_GRADIENT),
        ("wgrad", OperandRole.ACTIVATION),
    ]


@pytest.mark.parametrize("name", ["ue5m3_b16", "ue5m3_b32", "ue5m3_torch_control"])
def test_proposed_recipe_pins_the_six_quantizer_calls(name):
    specs = recipes.get(name).operand_specs("backbone.layers.3.mixer.up_proj", 3)
    calls = [specs[o] for o in CALL_ORDER]
    assert [s.rounding for s in calls] == ["rne", "rne", "sf", "sf", "rne", "rne"]
    assert all(isinstance(s.rounding, Rounding) for s in calls)
    assert [s.target for s in calls] == [448.0] * 6
    assert [s.two_d for s in calls] == [False, True, False, False, True, False]
    assert [s.rht for s in calls] == [False] * 6
    assert [s.role for s in calls] == [o.role for o in CALL_ORDER]


def test_proposed_recipe_settings():
    r = recipes.get("ue5m3_b16")
    assert (r.scheme, r.block_size, r.interval, r.bf16_layers, r.native_te) == ("ue5m3_b16", 16, 50, (), False)
    assert r.gemm == GemmConfig(model=GemmModel.PROBE_MATCHED, slice_width=64, final_grid=1024)
    assert recipes.get("ue5m3_b32").block_size == 32
    assert recipes.get("ue5m3_torch_control").gemm == GemmConfig(model=GemmModel.ENCODED_FP32)


@pytest.mark.parametrize("name", ["ue5m3_b16", "ue5m3_b32", "ue5m3_torch_control"])
def test_override_sets_2048_only_on_wgrad_dy_of_the_named_modules(name):
    r = for_8b(name)
    specs = r.operand_specs("backbone.layers.45.mixer.down_proj", 45)
    assert {o: s.target for o, s in specs.items()} == {
        o: (2048.0 if o is Operand.WGRAD_UPSTREAM_GRADIENT else 448.0) for o in Operand
    }
    # same module kind outside layers 44-51, another module in layer 45, no layer: all keep 448
    for module, layer in [
        ("backbone.layers.43.mixer.down_proj", 43),
        ("backbone.layers.45.mixer.up_proj", 45),
        ("backbone.layers.45.mixer.down_proj", None),
        ("backbone.layers.45.mixer.down_proj.extra", 45),
    ]:
        assert [s.target for s in r.operand_specs(module, layer).values()] == [448.0] * 6


def test_first_matching_override_wins():
    base = recipes.get("ue5m3_b16").to_dict()
    base["target_overrides"].insert(
        0, {"operand": "wgrad_upstream_gradient", "module": "*down_proj", "layers": [45], "target": 1024.0}
    )
    r = Recipe.from_dict(base).for_model(eight_b())
    assert r.operand_specs("m.down_proj", 45)[Operand.WGRAD_UPSTREAM_GRADIENT].target == 1024.0
    assert r.operand_specs("m.mixer.down_proj", 47)[Operand.WGRAD_UPSTREAM_GRADIENT].target == 2048.0


@pytest.mark.parametrize("name", ["ue5m3_te_settings", "nvfp4_te"])
def test_te_style_recipes_put_rht_only_on_wgrad_slots_and_keep_late_layers_bf16(name):
    assert recipes.get(name).bf16_layers == LayerSelector(last=8)
    r = for_8b(name)
    assert r.interval == 1 and r.bf16_layers == LATE_LAYERS and r.target_overrides == ()
    specs = r.operand_specs("backbone.layers.0.mixer.in_proj", 0)
    assert {o for o, s in specs.items() if s.rht} == {Operand.WGRAD_UPSTREAM_GRADIENT, Operand.WGRAD_ACTIVATION}
    assert [r.is_bf16_layer(layer) for layer in (None, 0, 43, 44, 51, 52)] == [False, False, False, True, True, False]
    with pytest.raises(ValueError, match="is_bf16_layer"):
        r.operand_specs("backbone.layers.45.mixer.down_proj", 45)


def test_nvfp4_recipes():
    te, no_rht = recipes.get("nvfp4_te"), recipes.get("nvfp4_no_rht_all_linears")
    assert te.native_te and no_rht.native_te and te.scheme == no_rht.scheme == "nvfp4"
    assert te.roles[OperandRole.UPSTREAM_GRADIENT].rounding is Rounding.SR_TE
    assert no_rht.bf16_layers == () and not any(s.rht for s in no_rht.operand_specs("x", 45).values())


def test_4over6_recipes_select_over_nvfp4_and_ue5m3_scales():
    """nvfp4_4over6 is nvfp4_te with TE's 4/6 (MAE) scheme and T = 256 everywhere, emulated; ue5m3_b16_4over6 is the
    proposed recipe with 4/6 (MSE) over UE5M3 scales, its targets and override unchanged."""
    four, te = recipes.get("nvfp4_4over6"), recipes.get("nvfp4_te")
    assert four.scheme == "nvfp4_4over6_mae" and not four.native_te
    assert {role: spec.target for role, spec in four.roles.items()} == dict.fromkeys(te.roles, 256.0)
    assert four.roles[OperandRole.UPSTREAM_GRADIENT].rounding is Rounding.SR_TE
    assert (four.bf16_layers, four.interval, four.gemm) == (te.bf16_layers, te.interval, te.gemm)
    ue, proposed = recipes.get("ue5m3_b16_4over6"), recipes.get("ue5m3_b16")
    assert ue.scheme == "ue5m3_b16_4over6_mse" and ue.interval == 50
    assert (ue.roles, ue.target_overrides, ue.gemm) == (proposed.roles, proposed.target_overrides, proposed.gemm)


def test_mxfp4_and_bf16_recipes():
    mx = recipes.get("mxfp4")
    specs = mx.operand_specs("x", 0)
    assert [s.target for s in specs.values()] == [None] * 6 and not any(s.two_d for s in specs.values())
    assert mx.gemm.model is GemmModel.DECODED and mx.block_size == 32
    bf16 = recipes.get("bf16")
    assert not bf16.is_quantized and bf16.roles == {} and bf16.block_size is None
    with pytest.raises(ValueError, match="BF16"):
        bf16.operand_specs("x", 0)


# ----- strict validation ---------------------------------------------------------------------------------


def _set(path, value):
    def mutate(d):
        *parents, last = path
        for key in parents:
            d = d[key]
        d[last] = value

    return mutate


def _delete(*path):
    def mutate(d):
        *parents, last = path
        for key in parents:
            d = d[key]
        del d[last]

    return mutate


def _both(*mutations):
    def mutate(d):
        for m in mutations:
            m(d)

    return mutate


def _rename_role(d):
    d["roles"]["gradient"] = d["roles"].pop("upstream_gradient")


UG = ("roles", "upstream_gradient")
BAD = {
    "unknown root key": ("ue5m3_b16", _set(("seed",), 1), ValueError, "<root>", "unknown keys ['seed']"),
    "missing root key": ("ue5m3_b16", _delete("interval"), ValueError, "<root>", "missing keys ['interval']"),
    "unknown role key": ("ue5m3_b16", _set((*UG, "sr"), True), ValueError, "roles.upstream_gradient", "['sr']"),
    "missing gemm key": ("ue5m3_b16", _delete("gemm", "final_grid"), ValueError, "gemm", "['final_grid']"),
    "missing override key": (
        "ue5m3_b16",
        _delete("target_overrides", 0, "layers"),
        ValueError,
        "target_overrides[0]",
        "layers",
    ),
    "bool target": ("ue5m3_b16", _set((*UG, "target"), True), TypeError, "roles.upstream_gradient.target", "True"),
    "string target": ("ue5m3_b16", _set((*UG, "target"), "448"), TypeError, "roles.upstream_gradient.target", "str"),
    "nan target": ("ue5m3_b16", _set((*UG, "target"), math.nan), ValueError, "roles.upstream_gradient.target", "nan"),
    "inf target": ("ue5m3_b16", _set((*UG, "target"), math.inf), ValueError, "roles.upstream_gradient.target", "inf"),
    "negative target": (
        "ue5m3_b16",
        _set((*UG, "target"), -448.0),
        ValueError,
        "roles.upstream_gradient.target",
        "-448",
    ),
    "zero override target": (
        "ue5m3_b16",
        _set(("target_overrides", 0, "target"), 0),
        ValueError,
        "target_overrides[0].target",
        "0",
    ),
    "null target with a tensor scale": (
        "ue5m3_b16",
        _set((*UG, "target"), None),
        ValueError,
        "roles.upstream_gradient.target",
        "None",
    ),
    "target without a tensor scale": (
        "mxfp4",
        _set(("roles", "weight", "target"), 448.0),
        ValueError,
        "roles.weight.target",
        "448",
    ),
    "wrong rounding": (
        "ue5m3_b16",
        _set((*UG, "rounding"), "stochastic"),
        ValueError,
        "roles.upstream_gradient.rounding",
        "'sf'",
    ),
    "wrong role name": ("ue5m3_b16", _rename_role, ValueError, "roles.gradient", "'upstream_gradient'"),
    "wrong gemm model": ("ue5m3_b16", _set(("gemm", "model"), "exact"), ValueError, "gemm.model", "'probe_matched'"),
    "wrong operand": (
        "ue5m3_b16",
        _set(("target_overrides", 0, "operand"), "wgrad_dy"),
        ValueError,
        "target_overrides[0].operand",
        "'wgrad_upstream_gradient'",
    ),
    "unknown scheme": ("ue5m3_b16", _set(("scheme",), "ue5m3_b64"), ValueError, "scheme", "'ue5m3_b16'"),
    "cross-slice sf": (
        "ue5m3_b16",
        _set(("gemm", "cross_slice_rounding"), "sf"),
        ValueError,
        "gemm.cross_slice_rounding",
        "'rtz' or 'rne'",
    ),
    "slice not a multiple of 16": (
        "ue5m3_b16",
        _set(("gemm", "slice_width"), 40),
        ValueError,
        "gemm.slice_width",
        "40",
    ),
    "slice not a multiple of the block": (
        "ue5m3_b32",
        _set(("gemm", "slice_width"), 48),
        ValueError,
        "gemm.slice_width",
        "32",
    ),
    "mma_sim slice not 64": (
        "ue5m3_torch_control",
        _set(("gemm",), {"model": "mma_sim", "slice_width": 128, "cross_slice_rounding": "rtz", "final_grid": None}),
        ValueError,
        "gemm.slice_width",
        "128",
    ),
    "grid not a power of two": ("ue5m3_b16", _set(("gemm", "final_grid"), 1000), ValueError, "gemm.final_grid", "1000"),
    "grid without probe_matched": (
        "ue5m3_torch_control",
        _set(("gemm", "final_grid"), 1024),
        ValueError,
        "gemm.final_grid",
        "probe_matched",
    ),
    "bool interval": ("ue5m3_b16", _set(("interval",), True), TypeError, "interval", "bool"),
    "zero interval": ("ue5m3_b16", _set(("interval",), 0), ValueError, "interval", "0"),
    "float layer": ("ue5m3_te_settings", _set(("bf16_layers",), [44.0, 45]), TypeError, "bf16_layers[0]", "44.0"),
    "negative override layer": (
        "ue5m3_b16",
        _set(("target_overrides", 0, "layers"), [-1, 45]),
        ValueError,
        "target_overrides[0].layers[0]",
        "-1",
    ),
    "empty override layers": (
        "ue5m3_b16",
        _set(("target_overrides", 0, "layers"), []),
        ValueError,
        "target_overrides[0].layers",
        "at least one",
    ),
    "override on a bf16 layer": (
        "ue5m3_b16",
        _both(_set(("bf16_layers",), [47]), _set(("target_overrides", 0, "layers"), [45, 47])),
        ValueError,
        "target_overrides[0].layers",
        "[47]",
    ),
    "selector without kind": ("nvfp4_te", _delete("bf16_layers", "kind"), ValueError, "bf16_layers", "['kind']"),
    "selector unknown key": (
        "nvfp4_te",
        _set(("bf16_layers", "of"), "mamba"),
        ValueError,
        "bf16_layers",
        "unknown keys ['of']",
    ),
    "selector unknown kind": (
        "ue5m3_b16",
        _set(("target_overrides", 0, "layers", "kind"), "mlps"),
        ValueError,
        "target_overrides[0].layers.kind",
        "'mlp'",
    ),
    "selector negative count": ("nvfp4_te", _set(("bf16_layers", "last"), -8), ValueError, "bf16_layers.last", "-8"),
    "selector bool count": ("nvfp4_te", _set(("bf16_layers", "first"), True), TypeError, "bf16_layers.first", "True"),
    "selector float count": ("nvfp4_te", _set(("bf16_layers", "last"), 8.0), TypeError, "bf16_layers.last", "8.0"),
    "selector of no layer": ("nvfp4_te", _set(("bf16_layers", "last"), 0), ValueError, "bf16_layers.last", "no layer"),
    "selector on bf16": (
        "bf16",
        _set(("bf16_layers",), {"first": 0, "last": 8, "kind": None}),
        ValueError,
        "bf16_layers",
        "BF16",
    ),
    "string layers": ("nvfp4_te", _set(("bf16_layers",), "last 8"), TypeError, "bf16_layers", "'last 8'"),
    "gemm not a mapping": ("ue5m3_b16", _set(("gemm",), ["probe_matched"]), TypeError, "gemm", "list"),
    "string two_d": ("ue5m3_b16", _set(("roles", "weight", "two_d"), "yes"), TypeError, "roles.weight.two_d", "'yes'"),
    "two_d on activation": (
        "ue5m3_b16",
        _set(("roles", "activation", "two_d"), True),
        ValueError,
        "roles.activation.two_d",
        "weight",
    ),
    "two_d on mxfp4": ("mxfp4", _set(("roles", "weight", "two_d"), True), ValueError, "roles.weight.two_d", "1D"),
    "rht on weight": ("ue5m3_b16", _set(("roles", "weight", "rht"), True), ValueError, "roles.weight.rht", "wgrad"),
    "missing role": ("ue5m3_b16", _delete("roles", "weight"), ValueError, "roles", "['weight']"),
    "roles on bf16": (
        "bf16",
        _set(("roles",), {"weight": {"rounding": "rne", "target": 448.0, "two_d": True, "rht": False}}),
        ValueError,
        "roles",
        "BF16",
    ),
    "quantized gemm on bf16": ("bf16", _set(("gemm", "model"), "decoded"), ValueError, "gemm.model", "BF16"),
    "bf16 gemm on a scheme": (
        "ue5m3_torch_control",
        _set(("gemm", "model"), "bf16"),
        ValueError,
        "gemm.model",
        "'bf16'",
    ),
    "native_te with ue5m3": ("ue5m3_te_settings", _set(("native_te",), True), ValueError, "native_te", "'nvfp4'"),
    "native_te with D=50": ("nvfp4_te", _set(("interval",), 50), ValueError, "native_te", "interval 1"),
    "native_te with T=2048": (
        "nvfp4_te",
        _set((*UG, "target"), 2048.0),
        ValueError,
        "roles.upstream_gradient.target",
        "448",
    ),
    "bad name": ("ue5m3_b16", _set(("name",), "my recipe"), ValueError, "name", "'my recipe'"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_strict_loading_names_the_key_path_and_the_source_file(case, tmp_path):
    name, mutate, exc, key, detail = BAD[case]
    data = recipes.get(name).to_dict()
    mutate(data)
    path = tmp_path / "edited.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(exc) as info:
        recipes.load(path)
    message = str(info.value)
    assert message.startswith(f"{path}: {key}"), message
    assert detail in message, message
    with pytest.raises(exc, match=r"^<dict>: "):
        Recipe.from_dict(data)
    with pytest.raises(exc, match=r"^mine\.yaml: "):
        Recipe.from_dict(data, source="mine.yaml")


def test_load_rejects_invalid_yaml_and_non_mappings(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: [unclosed\n")
    with pytest.raises(ValueError, match=str(path)):
        recipes.load(path)
    path.write_text("- ue5m3_b16\n")
    with pytest.raises(TypeError, match=rf"^{path}: <root>: expected a mapping"):
        recipes.load(path)


def test_constructors_refuse_unconverted_values():
    with pytest.raises(TypeError, match="rounding"):
        RoleConfig(rounding="rne", target=448.0)
    with pytest.raises(TypeError, match="target"):
        RoleConfig(rounding=Rounding.RNE, target=True)
    with pytest.raises(TypeError, match="operand"):
        TargetOverride(operand="wgrad_upstream_gradient", module="*", layers=(1,), target=2048.0)
    with pytest.raises(ValueError, match="layers"):
        TargetOverride(operand=Operand.FPROP_WEIGHT, module="*", layers=(), target=2048.0)
    with pytest.raises(TypeError, match="layers"):
        TargetOverride(operand=Operand.FPROP_WEIGHT, module="*", layers=[1], target=2048.0)


def test_roles_are_canonical_and_read_only():
    r = recipes.get("ue5m3_b16")
    roles = dict(reversed(list(r.roles.items())))
    same = Recipe(**{**{f: getattr(r, f) for f in r.__dataclass_fields__}, "roles": roles})
    assert same == r and list(same.roles) == list(OperandRole)
    with pytest.raises(TypeError):
        same.roles[OperandRole.WEIGHT] = r.roles[OperandRole.ACTIVATION]


def test_dump_replaces_an_existing_file(tmp_path):
    path = tmp_path / "r.yaml"
    recipes.dump(recipes.get("mxfp4"), path)
    recipes.dump(recipes.get("ue5m3_b16"), path)
    assert recipes.load(path) == recipes.get("ue5m3_b16")
    assert [p.name for p in tmp_path.iterdir()] == ["r.yaml"]


# ----- property: random valid recipes round-trip --------------------------------------------------------

_targets = st.floats(min_value=0.0, exclude_min=True, allow_infinity=False, allow_nan=False)
_layers = st.lists(st.integers(0, 200), unique=True, max_size=6).map(tuple)
_kinds = st.none() | st.sampled_from(list(LayerKind))
_selectors = st.builds(LayerSelector, first=st.integers(0, 8), last=st.integers(1, 8), kind=_kinds) | st.builds(
    LayerSelector, first=st.integers(1, 8), last=st.just(0), kind=_kinds
)


@st.composite
def _recipes(draw):
    name = draw(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,24}", fullmatch=True))
    description = draw(st.text(max_size=40))
    scheme = draw(st.sampled_from([None, *sorted(SCHEMES)]))
    if scheme is None:
        return Recipe(
            name=name, description=description, scheme=None, interval=1, roles={}, gemm=GemmConfig(model=GemmModel.BF16)
        )
    block = SCHEMES[scheme].block_size
    scaled = SCHEMES[scheme].target is not None
    native = scheme == "nvfp4" and draw(st.booleans())
    model = draw(st.sampled_from([m for m in GemmModel if m is not GemmModel.BF16]))
    gemm = GemmConfig(
        model=model,
        slice_width=64 if model is GemmModel.MMA_SIM else draw(st.integers(1, 16)) * max(block, 16),
        cross_slice_rounding=draw(st.sampled_from([Rounding.RTZ, Rounding.RNE])),
        final_grid=draw(st.none() | st.integers(1, 30).map(lambda k: 2**k))
        if model is GemmModel.PROBE_MATCHED
        else None,
    )
    roles = {
        role: RoleConfig(
            rounding=draw(st.sampled_from(list(Rounding))),
            target=(448.0 if native else draw(_targets)) if scaled else None,
            two_d=scaled and role is OperandRole.WEIGHT and draw(st.booleans()),
            rht=role is not OperandRole.WEIGHT and draw(st.booleans()),
        )
        for role in OperandRole
    }
    bf16_layers = draw(_layers | _selectors)
    overrides = ()
    if scaled and not native:
        taken = bf16_layers if isinstance(bf16_layers, tuple) else ()
        free = st.integers(0, 200).filter(lambda x: x not in taken)
        overrides = draw(
            st.lists(
                st.builds(
                    TargetOverride,
                    operand=st.sampled_from(list(Operand)),
                    module=st.text(min_size=1, max_size=20),
                    layers=st.lists(free, min_size=1, max_size=4, unique=True).map(tuple) | _selectors,
                    target=_targets,
                ),
                max_size=3,
            ).map(tuple)
        )
    return Recipe(
        name=name,
        description=description,
        scheme=scheme,
        interval=1 if native or not scaled else draw(st.integers(1, 10_000)),
        roles=roles,
        gemm=gemm,
        bf16_layers=bf16_layers,
        target_overrides=overrides,
        native_te=native,
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(recipe=_recipes())
def test_random_valid_recipes_round_trip(recipe, tmp_path):
    assert Recipe.from_dict(recipe.to_dict()) == recipe
    assert recipes.load(recipes.dump(recipe, tmp_path / "r.yaml")) == recipe


def test_dump_keeps_characters_yaml_reads_as_line_breaks(tmp_path):
    data = recipes.get("ue5m3_b16").to_dict()
    data["description"] = "a\x85b\u2028c é"
    data["target_overrides"][0]["module"] = "*\x85down_proj"
    recipe = Recipe.from_dict(data)
    assert recipes.load(recipes.dump(recipe, tmp_path / "r.yaml")) == recipe


def test_recipe_gemm_models_are_the_gemm_layers_output_models_plus_bf16():
    """recipes.GemmModel spells gemm.OutputModel's models (plus bf16); the two must not drift apart."""
    from ue5m3.layers.recipes import GemmModel
    from ue5m3.numerics.gemm import OutputModel

    assert {m.value for m in GemmModel} == {m.value for m in OutputModel} | {"bf16"}


# ----- layers named relative to the model's depth --------------------------------------------------------

# What the packaged recipes named by absolute index before they counted layers from the model's end.
FORMER_BF16_LAYERS = {"nvfp4_te": LATE_LAYERS, "ue5m3_te_settings": LATE_LAYERS, "nvfp4_4over6": LATE_LAYERS}
FORMER_OVERRIDE_LAYERS = {
    name: LATE_LAYERS for name in ("ue5m3_b16", "ue5m3_b32", "ue5m3_torch_control", "ue5m3_b16_4over6")
}  # (the 4/6 recipes came later, with the relative selectors: they hold the same layers)


@pytest.mark.parametrize("name", NAMED)
def test_packaged_recipes_resolve_at_8b_to_exactly_the_absolute_layers_they_named_before(name):
    """The resolved recipe is what a run's identity holds, so the 8B runs' identities do not change."""
    recipe = recipes.get(name)
    assert recipe.is_relative == (name in FORMER_BF16_LAYERS or name in FORMER_OVERRIDE_LAYERS)
    expected = recipe.to_dict()
    if name in FORMER_BF16_LAYERS:
        expected["bf16_layers"] = list(FORMER_BF16_LAYERS[name])
    for override in expected["target_overrides"]:
        override["layers"] = list(FORMER_OVERRIDE_LAYERS[name])
    resolved = for_8b(recipe)
    assert resolved.to_dict() == expected and not resolved.is_relative
    assert resolved.for_model(eight_b()) == resolved  # resolving again changes nothing


CPU_PATTERN = "*-M-M-M-M-M-"  # config/config.yaml's training model: the 8B model's final 12 blocks


@pytest.mark.parametrize(
    ("model", "overrides", "final_8", "final_4_mlp"),
    [
        ("nemotron_h_8b", {}, tuple(range(44, 52)), (45, 47, 49, 51)),
        ("dense_1p2b", {}, tuple(range(12, 20)), (16, 17, 18, 19)),
        ("dense_350m", {}, tuple(range(8, 16)), (12, 13, 14, 15)),
        ("nemotron_h_cpu", {}, tuple(range(1, 9)), (1, 3, 6, 8)),
        ("nemotron_h_debug", {"hybrid_override_pattern": CPU_PATTERN}, tuple(range(4, 12)), (5, 7, 9, 11)),
    ],
    ids=["8b", "1.2b", "350m", "cpu", "cpu-training"],
)
def test_selectors_count_from_the_end_of_each_model(model, overrides, final_8, final_4_mlp):
    layers = model_layers(model, overrides)
    assert LayerSelector(last=8).select(layers) == final_8
    assert LayerSelector(last=4, kind=LayerKind.MLP).select(layers) == final_4_mlp
    assert for_8b("nvfp4_te").bf16_layers == LATE_LAYERS
    assert recipes.get("nvfp4_te").for_model(layers).bf16_layers == final_8


def test_first_and_last_combine_and_a_kind_counts_only_the_layers_holding_it():
    layers = eight_b()
    assert layers.summary() == "52 layers: 24 mamba, 4 attention, 24 mlp"
    assert LayerSelector(first=2, last=8).select(layers) == (0, 1, *range(44, 52))
    assert LayerSelector(first=2, kind=LayerKind.MAMBA).select(layers) == (0, 2)
    assert LayerSelector(last=4, kind=LayerKind.ATTENTION).select(layers) == (7, 18, 29, 40)
    assert LayerSelector(first=26, last=26).select(layers) == tuple(range(52))  # every layer, exactly
    assert LayerSelector(last=4, kind=LayerKind.MLP).describe() == "the last 4 'mlp' layers"


def test_the_final_8_layers_and_the_final_4_mlp_layers_select_the_same_8b_down_projections():
    """The file's {last: 8} says what the paper's "layers 45, 47, 49, 51 down_proj" means at 8B."""
    from ue5m3.layers.linear import layer_index

    base = recipes.get("ue5m3_b16")
    mlp_override = dataclasses.replace(base.target_overrides[0], layers=LayerSelector(last=4, kind=LayerKind.MLP))
    by_kind = dataclasses.replace(base, target_overrides=(mlp_override,)).for_model(eight_b())
    by_depth = for_8b(base)
    assert by_kind.target_overrides[0].layers == (45, 47, 49, 51)
    for name in eight_b().linears:
        assert by_kind.operand_specs(name, layer_index(name)) == by_depth.operand_specs(name, layer_index(name))


def test_a_selection_the_model_cannot_hold_is_refused_naming_the_key_the_model_and_its_depth():
    debug = model_layers("nemotron_h_debug")
    with pytest.raises(
        ValueError,
        match=r"^bf16_layers: selects the last 8 layers, but model 'nemotron_h_debug' has 7 layers: 3 mamba, "
        r"1 attention, 3 mlp.*\(recipe 'nvfp4_te' for model 'nemotron_h_debug'\)$",
    ):
        recipes.get("nvfp4_te").for_model(debug)
    base = recipes.get("ue5m3_b16")
    mlp_override = dataclasses.replace(base.target_overrides[0], layers=LayerSelector(last=4, kind=LayerKind.MLP))
    with pytest.raises(ValueError, match=r"^target_overrides\[0\]\.layers: selects the last 4 'mlp' layers, but .* 7"):
        dataclasses.replace(base, target_overrides=(mlp_override,)).for_model(debug)
    beyond = dataclasses.replace(recipes.get("nvfp4_te"), bf16_layers=(3, 7))
    with pytest.raises(ValueError, match=r"^bf16_layers\[1\]: layer 7 does not exist in model 'nemotron_h_debug'"):
        beyond.for_model(debug)
    assert dataclasses.replace(beyond, bf16_layers=(3, 6)).for_model(debug).bf16_layers == (3, 6)


def test_a_relative_recipe_decides_for_a_numbered_layer_only_once_resolved():
    te = recipes.get("nvfp4_te")
    assert te.is_bf16_layer(None) is False
    with pytest.raises(ValueError, match=r"^bf16_layers: the last 8 layers depend on the model's depth.*for_model"):
        te.is_bf16_layer(45)
    b16 = recipes.get("ue5m3_b16")
    assert b16.operand_specs("backbone.layers.45.mixer.up_proj", 45)  # not the override's module: no question
    with pytest.raises(ValueError, match=r"^target_overrides\[0\]\.layers: the last 8 layers depend .*'ue5m3_b16'"):
        b16.operand_specs("backbone.layers.45.mixer.down_proj", 45)


def test_an_override_no_linear_of_the_model_matches_is_left_out_when_resolved():
    dense = model_layers("dense_350m")
    base = recipes.get("ue5m3_b16")
    assert base.for_model(dense).target_overrides == ()  # *.mixer.down_proj: a Nemotron-H module name
    control = dataclasses.replace(base.target_overrides[0], module="*.mlp.down_proj", layers=LayerSelector(last=4))
    resolved = dataclasses.replace(base, target_overrides=(control,)).for_model(dense)
    assert resolved.target_overrides[0].layers == (12, 13, 14, 15)  # the paper's 350M control


def test_an_override_no_shipped_model_matches_is_refused_naming_them():
    """A typo matches no linear of the run's model nor of any other shipped model (their lists are built only on
    this path): refused, naming the models looked at."""
    base = recipes.get("ue5m3_b16")
    typo = dataclasses.replace(base.target_overrides[0], module="*.mlp.down_projj")
    with pytest.raises(
        ValueError, match=r"'\*\.mlp\.down_projj' matches no linear of model 'dense_350m' nor .*nemotron_h_8b"
    ):
        dataclasses.replace(base, target_overrides=(typo,)).for_model(model_layers("dense_350m"))
    with pytest.raises(TypeError, match="shipped_linears"):
        ModelLayers(model="m", kinds=(), linears=(), shipped_linears=["nemotron_h_8b"])


def test_a_resolved_override_on_a_bf16_layer_is_refused():
    r = dataclasses.replace(recipes.get("ue5m3_b16"), bf16_layers=LayerSelector(last=1))
    with pytest.raises(
        ValueError, match=r"^target_overrides\[0\]\.layers: layers \[51\] are in bf16_layers.*'nemotron_h_8b'"
    ):
        r.for_model(eight_b())


def test_selectors_and_model_layers_refuse_bad_values():
    with pytest.raises(TypeError, match="kind"):
        LayerSelector(last=8, kind="mlp")
    with pytest.raises(ValueError, match="no layer"):
        LayerSelector()
    with pytest.raises(TypeError, match="last"):
        LayerSelector(last=True)
    with pytest.raises(ValueError, match=r"kinds\[1\]"):
        ModelLayers(model="m", kinds=({"mamba"}, {"moe"}), linears=())
    with pytest.raises(ValueError, match=r"kinds\[0\]"):
        ModelLayers(model="m", kinds=("mamba",), linears=())
    with pytest.raises(TypeError, match="ModelLayers"):
        recipes.get("nvfp4_te").for_model(52)


@pytest.mark.parametrize("name", models.names())
def test_every_models_layer_kinds_are_layer_kinds(name):
    kinds = models.layer_kinds(models.config(name))
    assert len(kinds) == len(models.blocks(models.build(name))) and set().union(*kinds) <= set(LayerKind)
