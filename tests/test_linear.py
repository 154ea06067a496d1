"""The FP4 linear layer: operand roles, quantizer calls, GEMM routing, gradients, dtypes and conversion."""

import dataclasses

import pytest
import torch
from torch import nn

from helpers.recipes import for_8b
from ue5m3.layers import linear, matmul, recipes, telemetry
from ue5m3.layers.linear import FP4Matmul, QuantLinear, convert, find_quant_stats, find_scale_state
from ue5m3.layers.recipes import GemmModel, Operand
from ue5m3.layers.weight_cache import WeightCache
from ue5m3.numerics import philox
from ue5m3.numerics.philox import SRState
from ue5m3.numerics.quantize import quantize


def _layer(recipe_name="ue5m3_b16", name="model.layers.3.mlp.up_proj", in_f=64, out_f=128, seed=0, gemm=None):
    torch.manual_seed(seed)
    model = nn.Module()
    model.proj = nn.Linear(in_f, out_f)
    recipe = for_8b(recipe_name)  # module names of the 8B model's layers below
    if gemm is not None:
        recipe = dataclasses.replace(
            recipe, gemm=dataclasses.replace(recipe.gemm, model=GemmModel(gemm), final_grid=None)
        )
    records = convert(model, recipe, select=["proj"])
    layer = model.proj
    layer.policy = dataclasses.replace(
        layer.policy, module=name, operands=recipe.operand_specs(name, linear.layer_index(name))
    )
    return layer, records


def _record_quantizer_calls(monkeypatch):
    """Every operand quantization of the layer, in call order: each result of the one entry point
    (matmul.quantize_operands: one tensor, one operand or the two copies of X or dY from one read)."""
    calls = []
    original = matmul.quantize_operands

    def recording(tensor, *operands, **kwargs):
        results = original(tensor, *operands, **kwargs)
        for operand, q in zip(operands, results, strict=True):
            calls.append(
                {
                    "operand": operand.spec.operand,
                    "rounding": q.rounding.value,
                    "target": q.scheme.target,
                    "two_d": q.layout.two_d,
                    "reference": operand.reference,
                    "stream": operand.stream,
                    "index": operand.index,
                    "shape": tuple(q.shape),
                    "q": q,
                }
            )
        return results

    monkeypatch.setattr(matmul, "quantize_operands", recording)
    return calls


def _step(layer, tokens=64, seed=1):
    find_scale_state(layer).begin_step(1)
    x = torch.randn(tokens, layer.in_features, generator=torch.Generator().manual_seed(seed), requires_grad=True)
    y = layer(x)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed + 1))
    y.backward(dy)
    return x, y, dy


def test_proposed_recipe_makes_exactly_six_quantizer_calls_with_the_paper_settings(monkeypatch):
    layer, _ = _layer()
    calls = _record_quantizer_calls(monkeypatch)
    _step(layer)
    # the forward pass also quantizes X's wgrad copy (its packed form is what the backward keeps); X's and dY's
    # two copies come as pairs (one read of the tensor on the Triton backend)
    order = [
        Operand.FPROP_ACTIVATION,
        Operand.WGRAD_ACTIVATION,
        Operand.FPROP_WEIGHT,
        Operand.DGRAD_UPSTREAM_GRADIENT,
        Operand.WGRAD_UPSTREAM_GRADIENT,
        Operand.DGRAD_WEIGHT,
    ]
    assert [c["operand"] for c in calls] == order
    assert [c["rounding"] for c in calls] == ["rne", "rne", "rne", "sf", "sf", "rne"]
    assert [c["target"] for c in calls] == [448.0] * 6
    assert [c["two_d"] for c in calls] == [False, False, True, False, False, True]


def test_both_backward_gemms_share_one_dy_reference_and_reuse_forward_references(monkeypatch):
    layer, _ = _layer()
    calls = _record_quantizer_calls(monkeypatch)
    _, _, dy = _step(layer)
    by_operand = {c["operand"]: c for c in calls}
    assert (
        by_operand[Operand.DGRAD_UPSTREAM_GRADIENT]["reference"]
        is by_operand[Operand.WGRAD_UPSTREAM_GRADIENT]["reference"]
    )
    assert float(by_operand[Operand.DGRAD_UPSTREAM_GRADIENT]["reference"]) == float(dy.abs().max())
    assert by_operand[Operand.FPROP_ACTIVATION]["reference"] is by_operand[Operand.WGRAD_ACTIVATION]["reference"]
    assert by_operand[Operand.FPROP_WEIGHT]["reference"] is by_operand[Operand.DGRAD_WEIGHT]["reference"]


def test_target_override_reaches_only_the_wgrad_dy_of_the_named_modules(monkeypatch):
    calls = _record_quantizer_calls(monkeypatch)
    layer, _ = _layer(name="backbone.layers.45.mixer.down_proj")
    _step(layer)
    targets = {c["operand"]: c["target"] for c in calls}
    assert targets.pop(Operand.WGRAD_UPSTREAM_GRADIENT) == 2048.0
    assert set(targets.values()) == {448.0}
    calls.clear()
    other, _ = _layer(name="backbone.layers.45.mixer.up_proj")
    _step(other)
    assert {c["target"] for c in calls} == {448.0}


def test_gemms_are_routed_with_the_operand_shapes_of_the_spec(monkeypatch):
    shapes = []
    original = matmul.run_gemm
    monkeypatch.setattr(
        matmul,
        "run_gemm",
        lambda a, b, cfg, **kw: shapes.append((tuple(a.shape), tuple(b.shape))) or original(a, b, cfg, **kw),
    )
    layer, _ = _layer(in_f=64, out_f=128)
    _step(layer, tokens=192)
    assert shapes == [((192, 64), (64, 128)), ((192, 128), (128, 64)), ((128, 192), (192, 64))]


def test_decoded_model_gradients_equal_autograd_through_the_dequantized_operands(monkeypatch):
    layer, _ = _layer(gemm="decoded")
    calls = _record_quantizer_calls(monkeypatch)
    x, y, dy = _step(layer)
    q = {c["operand"]: c["q"] for c in calls}
    x_deq = q[Operand.FPROP_ACTIVATION].dequantize().requires_grad_()
    assert torch.equal(y, x_deq @ q[Operand.FPROP_WEIGHT].dequantize() + layer.bias)
    assert torch.equal(x.grad, q[Operand.DGRAD_UPSTREAM_GRADIENT].dequantize() @ q[Operand.DGRAD_WEIGHT].dequantize())
    assert torch.equal(
        layer.weight.grad, q[Operand.WGRAD_UPSTREAM_GRADIENT].dequantize() @ q[Operand.WGRAD_ACTIVATION].dequantize()
    )
    assert torch.equal(layer.bias.grad, dy.sum(0))


def test_te_settings_apply_rht_to_both_wgrad_operands_with_current_amax(monkeypatch):
    layer, _ = _layer("ue5m3_te_settings")
    calls = _record_quantizer_calls(monkeypatch)
    _step(layer)
    refs = {c["operand"]: c["reference"] for c in calls}
    assert refs[Operand.WGRAD_UPSTREAM_GRADIENT] is None and refs[Operand.WGRAD_ACTIVATION] is None
    assert refs[Operand.DGRAD_UPSTREAM_GRADIENT] is not None


def test_bf16_activations_give_bf16_outputs_and_gradients_in_parameter_dtypes():
    layer, _ = _layer()
    find_scale_state(layer).begin_step(1)
    x = torch.randn(64, 64, dtype=torch.bfloat16, requires_grad=True)
    y = layer(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == torch.bfloat16 and layer.weight.grad.dtype == torch.float32


def test_inference_mode_is_forward_only_deterministic_and_draws_no_random_bits():
    layer, _ = _layer()
    find_scale_state(layer).begin_step(1)
    layer.set_inference()
    x = torch.randn(8, 8, 64)
    with torch.no_grad():
        state = torch.get_rng_state()
        y1 = layer(x)
        assert torch.equal(state, torch.get_rng_state())
        y2 = layer(x)
    assert torch.equal(y1, y2) and y1.shape == (8, 8, 128)


def test_a_forward_under_no_grad_makes_no_wgrad_copy_of_x_and_gives_the_same_output(monkeypatch):
    """Evaluation runs under ``no_grad``, where ``needs_input_grad`` still says the weight wants a gradient: the
    layer quantizes X for fprop only (no wgrad copy along tokens, nothing packed), with the bits of a grad-mode
    forward's fprop."""
    calls = _record_quantizer_calls(monkeypatch)
    layer, _ = _layer()
    find_scale_state(layer).begin_step(1)
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(3))
    with_grad = layer(x)
    made = [c["operand"] for c in calls]
    assert Operand.WGRAD_ACTIVATION in made
    calls.clear()
    with torch.no_grad():
        without = layer(x)
    assert [c["operand"] for c in calls] == [Operand.FPROP_ACTIVATION]  # the weight's copy comes from the cache
    assert torch.equal(with_grad.detach(), without)


def test_convert_keeps_the_same_parameters_is_idempotent_and_reports_what_it_did():
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
    params = [id(p) for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters())
    records = convert(model, recipes.get("ue5m3_b16"), select=["0", "2"])
    assert [r.status for r in records] == ["converted", "converted"]
    assert isinstance(model[0], QuantLinear) and isinstance(model[2], QuantLinear)
    assert [id(p) for p in model.parameters()] == params
    assert opt.param_groups[0]["params"][0] is model[0].weight
    again = convert(model, recipes.get("ue5m3_b16"), select=["0", "2"])
    assert [r.status for r in again] == ["already_converted"] * 2
    assert find_scale_state(model) is model[0].scale_state is model[2].scale_state


def test_convert_exempts_bf16_layers_of_the_recipe():
    model = nn.Module()
    model.layers = nn.ModuleList([nn.ModuleDict({"proj": nn.Linear(16, 16)}) for _ in range(46)])
    records = convert(model, for_8b("nvfp4_te"), select=["layers.*.proj"])
    status = {r.layer: r.status for r in records}
    assert status[43] == "converted" and status[44] == "bf16_exempt" and status[45] == "bf16_exempt"
    assert type(model.layers[44]["proj"]) is nn.Linear


def test_convert_refuses_a_recipe_naming_layers_relative_to_a_depth_it_was_not_resolved_for():
    model = nn.Module()
    model.layers = nn.ModuleList([nn.ModuleDict({"proj": nn.Linear(16, 16)}) for _ in range(2)])
    with pytest.raises(ValueError, match=r"'nvfp4_te' names layers relative to the model's depth.*for_model"):
        convert(model, recipes.get("nvfp4_te"), select=["layers.*.proj"])
    assert all(type(layer["proj"]) is nn.Linear for layer in model.layers)  # decided before anything changed


def test_convert_refuses_subclasses_and_aliases_before_changing_anything():
    class MyLinear(nn.Linear):
        pass

    model = nn.Sequential(nn.Linear(16, 16), MyLinear(16, 16))
    with pytest.raises(TypeError, match="MyLinear"):
        convert(model, recipes.get("ue5m3_b16"), select=["*"])
    assert type(model[0]) is nn.Linear
    shared = nn.Linear(16, 16)
    aliased = nn.Sequential(nn.Linear(16, 16), shared, shared)
    with pytest.raises(ValueError, match="aliased"):
        convert(aliased, recipes.get("ue5m3_b16"), select=["*"])
    assert all(type(m) is nn.Linear for m in aliased)


def test_convert_requires_a_selector():
    with pytest.raises(TypeError, match="select"):
        convert(nn.Sequential(nn.Linear(16, 16)), recipes.get("ue5m3_b16"), select="0")


def test_bf16_recipe_converts_nothing():
    model = nn.Sequential(nn.Linear(16, 16))
    records = convert(model, recipes.get("bf16"), select=["0"])
    assert records[0].status == "bf16_exempt" and type(model[0]) is nn.Linear


@pytest.mark.parametrize(
    "name",
    [
        "ue5m3_b16",
        "ue5m3_b32",
        "ue5m3_torch_control",
        "ue5m3_te_settings",
        "nvfp4_te",
        "nvfp4_no_rht_all_linears",
        "mxfp4",
    ],
)
def test_every_quantized_recipe_trains_a_step_with_finite_gradients(name):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64))
    convert(model, recipes.get(name), select=["0", "2"])
    find_scale_state(model).begin_step(1)
    loss = model(torch.randn(64, 64)).square().mean()
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_quant_stats_count_zero_rounded_and_saturated_blocks_across_the_model():
    layer, _ = _layer()  # UE5M3 B16, D = 50: references are held between refreshes
    stats, state = find_quant_stats(layer), find_scale_state(layer)
    state.begin_step(1)
    with torch.no_grad():
        layer(torch.zeros(64, 64))  # every activation block of the first step rounds its scale to zero
    first = stats.pop()
    assert (
        first["zero_rounded_blocks"] == 64 * 64 // 16 and first["quantized_blocks"] == 64 * 64 // 16 + 64 * 128 // 256
    )
    state.begin_step(2)  # reference held at 0 -> G = 1; a huge activation now saturates its blocks
    with torch.no_grad():
        layer(torch.full((64, 64), 1e6))
    assert stats.pop()["saturated_blocks"] == 64 * 64 // 16


def test_diagnostics_stay_per_layer_and_per_operand_slot_on_the_device():
    layer, _ = _layer()
    find_scale_state(layer).begin_step(1)
    with torch.no_grad():
        layer(torch.randn(64, 64))
    counts = layer.telemetry.counts  # int64 [6 operand slots, 4 counts], in Operand order
    assert counts.dtype == torch.int64 and counts.shape == (len(Operand), len(telemetry.COUNTS))
    column = telemetry.COUNTS.index("quantized_blocks")
    fprop = {Operand.FPROP_ACTIVATION: 64 * 64 // 16, Operand.FPROP_WEIGHT: 64 * 128 // 256}
    assert counts[:, column].tolist() == [fprop.get(slot, 0) for slot in Operand]  # a forward writes fprop rows only
    counts.zero_()
    # a training step: every GEMM counts its two operands, the wgrad copy of X in the backward pass
    layer(torch.randn(64, 64, requires_grad=True)).sum().backward()
    assert all(n > 0 for n in counts[:, column].tolist())


def test_a_models_deferred_checks_raise_in_the_order_they_were_made_across_its_layers():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64))
    convert(model, recipes.get("ue5m3_b16"), select=["0", "2"])
    find_scale_state(model).begin_step(1)
    dy = torch.randn(64, 64)
    dy[0, 0] = float("inf")
    model(torch.randn(64, 64)).backward(dy)  # the backward pass meets the bad dY in the last layer first
    stats = find_quant_stats(model)
    assert len(stats.checks) > 0 and all(len(m.telemetry.checks) > 0 for m in (model[0], model[2]))
    with pytest.raises(ValueError, match=r"^non-finite amax for role 'upstream_gradient', module '2' .*more\)$"):
        stats.pop()
    assert len(stats.checks) == 0  # read and cleared for every layer


def _sr_layer(sr: SRState):
    torch.manual_seed(0)
    model = nn.Module()
    model.proj = nn.Linear(64, 64)
    convert(model, recipes.get("ue5m3_b16"), select=["proj"], sr_state=sr)
    return model.proj


def _dy_bits(monkeypatch, sr: SRState, dy: torch.Tensor, x: torch.Tensor) -> dict:
    """The SR bits the two stochastic quantizations of dY draw under ``sr`` (from the recorded call sites)."""
    layer = _sr_layer(sr)
    calls = _record_quantizer_calls(monkeypatch)
    find_scale_state(layer).begin_step(max(sr.step, 1))
    layer(x.clone().requires_grad_()).backward(dy)
    monkeypatch.undo()
    return {
        c["operand"]: philox.random_bits(c["stream"], c["shape"], 8, index=c["index"])
        for c in calls
        if c["rounding"] == "sf"
    }


def test_sr_bits_are_keyed_by_module_role_step_and_microbatch(monkeypatch):
    x, dy = torch.randn(64, 64), torch.randn(64, 64)
    sr = SRState(7)
    sr.begin_step(3)
    bits = _dy_bits(monkeypatch, sr, dy, x)
    assert set(bits) == {Operand.DGRAD_UPSTREAM_GRADIENT, Operand.WGRAD_UPSTREAM_GRADIENT}
    again = _dy_bits(monkeypatch, sr, dy, x)
    assert all(torch.equal(bits[k], again[k]) for k in bits)  # a pure function of the counters
    sr.begin_microbatch(1)
    other = _dy_bits(monkeypatch, sr, dy, x)
    assert not torch.equal(bits[Operand.DGRAD_UPSTREAM_GRADIENT], other[Operand.DGRAD_UPSTREAM_GRADIENT])
    assert not torch.equal(bits[Operand.DGRAD_UPSTREAM_GRADIENT][:, :16], bits[Operand.WGRAD_UPSTREAM_GRADIENT][:16].T)


def test_each_data_parallel_rank_draws_the_bits_of_its_tokens_in_the_global_microbatch(monkeypatch):
    """World 2: rank r holds tokens [64 r, 64 r + 64) of the global microbatch; its dY (tokens along rows) and
    dY^T (tokens along columns) draw exactly the world-1 run's bits at those tokens."""
    x, dy = torch.randn(128, 64), torch.randn(128, 64)

    def state(**shard):
        sr = SRState(7, **shard)
        sr.begin_step(2)
        return sr

    whole = _dy_bits(monkeypatch, state(), dy, x)
    for rank in range(2):
        tokens = slice(64 * rank, 64 * rank + 64)
        shard = _dy_bits(monkeypatch, state(rank=rank, world=2), dy[tokens], x[tokens])
        assert torch.equal(shard[Operand.DGRAD_UPSTREAM_GRADIENT], whole[Operand.DGRAD_UPSTREAM_GRADIENT][tokens])
        assert torch.equal(shard[Operand.WGRAD_UPSTREAM_GRADIENT], whole[Operand.WGRAD_UPSTREAM_GRADIENT][:, tokens])


# ----- memory: the weight quantized once per step, X kept in packed form ---------------------------------


def _accumulating_steps(mode, steps=2, microbatches=3, monkeypatch=None):
    """Steps of three accumulated microbatches with an in-place weight update between steps; returns the outputs,
    the accumulated gradients per step, and the weight quantizer calls made."""
    layer, _ = _layer()
    sr = SRState(7)
    layer.sr_state = sr
    linear.set_weight_caching(layer, mode)
    calls = _record_quantizer_calls(monkeypatch) if monkeypatch is not None else []
    state, gen = find_scale_state(layer), torch.Generator().manual_seed(3)
    outputs, grads = [], []
    for step in range(1, steps + 1):
        state.begin_step(step)
        sr.begin_step(step)
        for microbatch in range(microbatches):
            sr.begin_microbatch(microbatch)
            x = torch.randn(64, layer.in_features, generator=gen, requires_grad=True)
            y = layer(x)
            y.backward(torch.randn(y.shape, generator=gen))
            outputs += [y.detach(), x.grad]
        grads.append(layer.weight.grad.clone())
        with torch.no_grad():  # an optimizer's in-place update
            layer.weight.sub_(0.1 * layer.weight.grad)
        layer.weight.grad = None
    weight_calls = [c for c in calls if c["operand"] in (Operand.FPROP_WEIGHT, Operand.DGRAD_WEIGHT)]
    return layer, outputs + grads, weight_calls


@pytest.mark.parametrize("mode", ["version", "step"])
def test_the_weight_is_quantized_once_per_step_and_reused_with_the_same_bits(mode, monkeypatch):
    _, reference, uncached_calls = _accumulating_steps("off", monkeypatch=monkeypatch)
    monkeypatch.undo()
    layer, results, calls = _accumulating_steps(mode, monkeypatch=monkeypatch)
    assert len(uncached_calls) == 2 * 3 * 2  # fprop and dgrad weight, 3 microbatches, 2 steps
    assert len(calls) == 2 * 2  # once per step each
    assert layer.weight_cache.hits == 2 * 2 * 2
    for got, want in zip(results, reference, strict=True):
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("packed", [None, True, False])
def test_a_cache_hit_gives_the_bits_recomputing_gives_packed_or_not(packed):
    # on the CPU the cache holds a quantization unpacked by default (packing every miss and unpacking every hit
    # cost more there than the copy's memory); packed or not, a hit is the quantization itself
    weight = torch.randn(64, 48, generator=torch.Generator().manual_seed(3))
    cache = WeightCache(packed=packed)

    def make():
        return quantize(weight, "ue5m3_b16", two_d=True)

    first, _ = cache.get(Operand.FPROP_WEIGHT, weight, 1, make)
    second, _ = cache.get(Operand.FPROP_WEIGHT, weight, 1, make)
    assert (cache.misses, cache.hits) == (1, 1)
    fresh = make()
    for field in ("payload_blocks", "scale_values", "decode_scales_blocks", "block_amax", "global_decode_scale"):
        assert torch.equal(getattr(second, field), getattr(fresh, field)), field
    # packed: half a byte per element and a byte per scale code (plus a few 0-dim tensors); unpacked: the FP32
    # payload alone is 4 bytes per element
    per_element = cache.nbytes / weight.numel()
    assert per_element < 1 if packed else per_element > 4


def test_the_version_cache_sees_in_place_updates_and_data_swaps_within_a_step():
    layer, _ = _layer()
    find_scale_state(layer).begin_step(1)
    x = torch.randn(32, layer.in_features)
    with torch.no_grad():
        first = layer(x)
        layer.weight.mul_(0.5)  # in place: the version counter moves
        halved = layer(x)
        layer.weight.data = layer.weight.data * 2.0  # a .data swap: the storage moves
        again = layer(x)
    linear.set_weight_caching(layer, "off")
    with torch.no_grad():
        assert torch.equal(again, layer(x)) and torch.equal(again, first)
        layer.weight.mul_(0.5)
        assert torch.equal(halved, layer(x))
    assert not torch.equal(first, halved)


def test_stochastically_rounded_weights_are_never_cached(monkeypatch):
    layer, _ = _layer()
    weight_sr = dataclasses.replace(layer.policy.operands[Operand.FPROP_WEIGHT], rounding="sr")
    layer.policy = dataclasses.replace(
        layer.policy, operands={**layer.policy.operands, Operand.FPROP_WEIGHT: weight_sr}
    )
    calls = _record_quantizer_calls(monkeypatch)
    find_scale_state(layer).begin_step(1)
    with torch.no_grad():
        layer(torch.randn(8, layer.in_features)), layer(torch.randn(8, layer.in_features))
    assert [c["operand"] for c in calls].count(Operand.FPROP_WEIGHT) == 2


def _saved_for_backward(layer, x):
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = FP4Matmul.apply(x, layer.weight, layer.resolve_call(x))
    return y, saved


@pytest.mark.parametrize("recipe_name", ["ue5m3_b16", "nvfp4_te", "mxfp4"])
def test_the_backward_keeps_the_packed_wgrad_copy_of_x_instead_of_x(recipe_name):
    layer, _ = _layer(recipe_name, in_f=256, out_f=64)
    find_scale_state(layer).begin_step(1)
    x = torch.randn(128, 256, requires_grad=True)
    _, saved = _saved_for_backward(layer, x)
    others = [t for t in saved if t is not layer.weight]
    assert len(others) == len(saved) - 1  # the weight is held as the parameter itself, no copy
    assert all(t.data_ptr() != x.data_ptr() and t.dtype != torch.float32 or t.numel() < x.numel() for t in others)
    block = linear.get_scheme(recipes.get(recipe_name).scheme).block_size
    per_element = 0.5 + 1 / block + 4 / block  # packed payload, scale code, FP32 block amax
    assert sum(t.numel() * t.element_size() for t in others) <= 128 * 256 * per_element + 64


def test_no_gradient_work_for_inputs_that_need_none(monkeypatch):
    layer, _ = _layer()
    calls = _record_quantizer_calls(monkeypatch)
    find_scale_state(layer).begin_step(1)
    layer.weight.requires_grad_(False)
    layer.bias.requires_grad_(False)
    x = torch.randn(64, layer.in_features, requires_grad=True)
    layer(x).sum().backward()
    assert {c["operand"] for c in calls}.isdisjoint({Operand.WGRAD_ACTIVATION, Operand.WGRAD_UPSTREAM_GRADIENT})
    assert x.grad is not None and layer.weight.grad is None
    calls.clear()
    layer.weight.requires_grad_(True)
    layer(torch.randn(64, layer.in_features)).sum().backward()  # the input needs no gradient
    assert {c["operand"] for c in calls}.isdisjoint({Operand.DGRAD_WEIGHT, Operand.DGRAD_UPSTREAM_GRADIENT})
    assert layer.weight.grad is not None
