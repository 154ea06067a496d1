"""Post-load inference: policies, the work-unit counter, refused checkpoints, recipes and calibration sets."""

import dataclasses
import shutil

import pytest
import torch

from ue5m3.data import EvalSet, open_data
from ue5m3.evaluation.inference import InferencePolicy, InferenceScales, load_for_inference
from ue5m3.layers import recipes
from ue5m3.layers.linear import QuantLinear
from ue5m3.training.checkpoint import CheckpointError


def test_replay_refreshes_activation_references_at_units_1_51_101_and_holds_between():
    scales = InferenceScales("cold_d50_replay")
    held = []
    for unit in range(1, 121):
        assert scales.begin_unit() == unit
        held.append(float(scales.reference("activation", "m", torch.tensor([float(unit)]))))
    assert held == [1.0] * 50 + [51.0] * 50 + [101.0] * 20
    assert scales.refresh_units() == {"activation/m": 101}


def test_current_tensor_refreshes_every_unit():
    scales = InferenceScales("current_tensor")
    values = []
    for unit in range(1, 6):
        scales.begin_unit()
        values.append(float(scales.reference("activation", "m", torch.tensor([float(unit)]))))
    assert values == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_inference_scales_refuse_gradients_steps_and_unfrozen_weights():
    scales = InferenceScales("current_tensor")
    scales.begin_unit()
    with pytest.raises(RuntimeError, match="forward-only"):
        scales.reference("upstream_gradient", "m", torch.ones(2))
    with pytest.raises(RuntimeError, match="freeze_weights"):
        scales.reference("weight", "m", torch.ones(2))
    with pytest.raises(RuntimeError, match="begin_unit"):
        scales.begin_step(1)
    with pytest.raises(ValueError, match="unknown inference policy 'delayed'"):
        InferenceScales("delayed")


def test_forward_unit_advances_the_counter_once_and_every_module_is_in_inference(tiny_run):
    run_dir, _ = tiny_run
    loaded = load_for_inference(run_dir, policy="cold_d50_replay", device="cpu")
    quant = [m for m in loaded.model.modules() if isinstance(m, QuantLinear)]
    assert quant and all(m.inference and m.scale_state is loaded.scales for m in quant)
    ids = torch.randint(0, 300, (1, 64), generator=torch.Generator().manual_seed(0))
    for _ in range(3):
        logits = loaded.forward_unit(ids)
    assert logits.shape == (1, 64, 300) and logits.dtype == torch.float32
    assert loaded.scales.unit == 3 and loaded.units == 3
    # frozen weights: each is quantized once and reused by every later unit
    assert all((m.weight_cache.misses, m.weight_cache.hits) == (1, 2) for m in quant)
    refreshes = loaded.scales.refresh_units()
    assert len(refreshes) == len(quant) and set(refreshes.values()) == {1}


def test_weights_are_frozen_once_at_their_loaded_amax(tiny_run):
    run_dir, _ = tiny_run
    loaded = load_for_inference(run_dir, policy="current_tensor", device="cpu")
    for module in loaded.model.modules():
        if isinstance(module, QuantLinear):
            ref = loaded.scales.reference("weight", module.policy.module, module.weight)
            assert float(ref) == float(module.weight.detach().abs().amax())


def test_identity_records_checkpoint_hash_recipe_policy_and_gemm(tiny_run):
    run_dir, _ = tiny_run
    loaded = load_for_inference(run_dir, policy="current_tensor", device="cpu")
    identity = loaded.identity
    assert len(identity["checkpoint_sha256"]) == 64 and identity["checkpoint_step"] == 2
    assert identity["recipe"] == "ue5m3_b16" and identity["policy"] == "current_tensor"
    assert identity["gemm_output_model"] == "probe_matched" and identity["seed"] == 5


def test_calibrated_frozen_refuses_calibration_that_overlaps_validation(tiny_run):
    run_dir, config = tiny_run
    opened = open_data(config)
    with pytest.raises(ValueError, match="share .* document"):
        load_for_inference(
            run_dir, policy="calibrated_frozen", calibration=opened.validation, validation=opened.validation
        )
    disguised = EvalSet(name="calibration", windows=opened.validation.windows[:1], document_ids=("other",))
    with pytest.raises(ValueError, match="also occur in the validation set"):
        load_for_inference(run_dir, policy="calibrated_frozen", calibration=disguised, validation=opened.validation)
    with pytest.raises(ValueError, match="needs a non-empty calibration set"):
        load_for_inference(run_dir, policy="calibrated_frozen")


def test_calibrated_frozen_holds_the_running_max_of_the_calibration_stream(tiny_run):
    run_dir, config = tiny_run
    opened = open_data(config)
    loaded = load_for_inference(
        run_dir, policy="calibrated_frozen", calibration=opened.calibration, validation=opened.validation
    )
    frozen = loaded.scales.frozen_activations
    assert loaded.scales.unit == len(opened.calibration) == 2
    assert len(frozen) == sum(isinstance(m, QuantLinear) for m in loaded.model.modules())
    loaded.forward_unit(opened.validation.windows[:1, :-1])
    assert loaded.scales.frozen_activations == frozen and loaded.scales.unit == 3
    # the frozen value of the first module is the max over both calibration sequences' current amax
    current = load_for_inference(run_dir, policy="current_tensor")
    name = next(iter(frozen))
    seen = []
    module = current.model.get_submodule(name)
    handle = module.register_forward_pre_hook(lambda m, a: seen.append(float(a[0].abs().amax())))
    for inputs, _ in opened.calibration:
        current.forward_unit(inputs)
    handle.remove()
    assert frozen[name] == max(seen)


def test_a_corrupted_checkpoint_is_refused_naming_the_file(tiny_run, tmp_path):
    run_dir, _ = tiny_run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    model_pt = copy / "checkpoints" / "step-00000002" / "model.pt"
    raw = bytearray(model_pt.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    model_pt.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="model.pt"):
        load_for_inference(copy, policy="current_tensor")
    with pytest.raises(CheckpointError, match="step-00000007"):
        load_for_inference(run_dir, 7, policy="current_tensor")


def test_a_mismatched_recipe_is_refused_naming_both(tiny_run):
    run_dir, _ = tiny_run
    with pytest.raises(ValueError, match="'ue5m3_b32'.*'ue5m3_b16'"):
        load_for_inference(run_dir, policy="current_tensor", recipe="ue5m3_b32")
    # the given recipe is resolved for the run's model: the final 8 layers do not fit the 2-layer debug model
    with pytest.raises(ValueError, match=r"bf16_layers: selects the last 8 layers, but model 'dense_debug' has 2"):
        load_for_inference(run_dir, policy="current_tensor", recipe="ue5m3_te_settings")
    te_settings = recipes.get("ue5m3_te_settings")
    te_settings = dataclasses.replace(te_settings, bf16_layers=recipes.LayerSelector(last=1))
    same_scheme = load_for_inference(run_dir, policy="current_tensor", recipe=te_settings)
    assert same_scheme.identity["recipe"] == "ue5m3_te_settings"
    assert type(same_scheme.model.get_submodule("model.layers.1.mlp.up_proj")) is torch.nn.Linear  # its BF16 layer


def test_bf16_policy_on_a_quantized_run_must_be_forced(tiny_run):
    run_dir, _ = tiny_run
    with pytest.raises(ValueError, match="force_bf16"):
        load_for_inference(run_dir, policy="bf16")
    loaded = load_for_inference(run_dir, policy=InferencePolicy.BF16, force_bf16=True)
    assert loaded.scales is None and not any(isinstance(m, QuantLinear) for m in loaded.model.modules())
