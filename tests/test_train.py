"""Training: schedule, weight-decay groups, exact resume, refused corrupt checkpoints, counters and metrics."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from helpers.training import LAST_LAYER_BF16, final_state, metric_records, train_config
from ue5m3.data import RandomTokenStream as TokenStream
from ue5m3.layers import recipes
from ue5m3.training import build, checkpoint, state
from ue5m3.training import loop as train
from ue5m3.training.config import OptimConfig, TrainConfig


def _recipe_with_interval(tmp_path, interval):
    recipe = dataclasses.replace(recipes.get("ue5m3_b16"), name="ue5m3_b16_d3", interval=interval, target_overrides=())
    return str(recipes.dump(recipe, tmp_path / "recipe.yaml"))


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_schedule_is_constant_then_decays_linearly_over_the_final_15_percent_to_1_percent():
    optim = OptimConfig(lr=1.0)
    lrs = [train.lr_at(s, 100, optim) for s in range(1, 101)]
    assert lrs[:85] == [1.0] * 85
    assert lrs[-1] == pytest.approx(0.01)
    assert all(a > b for a, b in zip(lrs[85:], lrs[86:], strict=False))
    warm = OptimConfig(lr=1.0, warmup_steps=4)
    assert [train.lr_at(s, 100, warm) for s in (1, 2, 4, 5)] == [0.25, 0.5, 1.0, 1.0]


def test_weight_decay_skips_biases_norms_and_mamba_scalars():
    from ue5m3 import models

    model = models.build("nemotron_h_debug", device="cpu")
    decay, no_decay = build.param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    skipped = {names[id(p)] for p in no_decay["params"]}
    assert any(n.endswith("A_log") for n in skipped) and any(n.endswith(".D") for n in skipped)
    assert any("norm" in n for n in skipped)
    assert all(names[id(p)] not in skipped for p in decay["params"]) and no_decay["weight_decay"] == 0.0


def _assert_same_state(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("stop_at", [3, 4])
def test_resuming_at_any_step_reproduces_the_uninterrupted_run_bit_for_bit(tmp_path, stop_at):
    recipe = _recipe_with_interval(tmp_path, 3)  # stop between and at scale refreshes (1, 4, 7)
    full = train_config(tmp_path / "full", recipe=recipe)
    train.train(full, TokenStream(4096, 64))
    interrupted = train_config(tmp_path / "split", recipe=recipe)
    assert train.train(interrupted, TokenStream(4096, 64), stop_after=stop_at) is None
    train.train(interrupted, TokenStream(4096, 64))  # resumes from the last checkpoint (step 2 or 4)
    model_a, optim_a = final_state(full.run_dir)
    model_b, optim_b = final_state(interrupted.run_dir)
    _assert_same_state(model_a, model_b)
    assert optim_a["state"].keys() == optim_b["state"].keys()
    for key in optim_a["state"]:
        _assert_same_state(optim_a["state"][key], optim_b["state"][key])

    # metrics after the resume point are rewritten, not duplicated; all but the timing agree exactly
    assert metric_records(full.run_dir) == metric_records(interrupted.run_dir)
    assert [r["step"] for r in metric_records(full.run_dir)] == list(range(1, 7))


def test_stochastic_rounding_resumes_from_the_step_counter_alone(tmp_path, monkeypatch):
    """SR bits are Philox streams of (seed, module, role, step, microbatch, index): a resume that does not restore
    torch's RNG state at all (and perturbs it) still reproduces the uninterrupted run bit for bit."""
    full = train_config(tmp_path / "full", steps=4)
    train.train(full, TokenStream(4096, 64))
    split = train_config(tmp_path / "split", steps=4)
    train.train(split, TokenStream(4096, 64), stop_after=2)
    monkeypatch.setattr(state, "_set_rng_state", lambda saved: torch.manual_seed(987654321))
    train.train(split, TokenStream(4096, 64))
    model_a, _ = final_state(full.run_dir)
    model_b, _ = final_state(split.run_dir)
    _assert_same_state(model_a, model_b)


def test_cold_scale_resume_drops_the_caches_and_changes_the_trajectory(tmp_path):
    recipe = _recipe_with_interval(tmp_path, 3)
    warm = train_config(tmp_path / "warm", recipe=recipe)
    train.train(warm, TokenStream(4096, 64), stop_after=3)
    train.train(warm, TokenStream(4096, 64))
    cold = train_config(tmp_path / "cold", recipe=recipe, cold_scale_resume=True)
    train.train(cold, TokenStream(4096, 64), stop_after=3)
    train.train(cold, TokenStream(4096, 64))
    a, _ = final_state(warm.run_dir)
    b, _ = final_state(cold.run_dir)
    assert any(not torch.equal(a[k], b[k]) for k in a)


def test_corrupted_or_truncated_checkpoint_is_refused_with_the_file_named(tmp_path):
    cfg = train_config(tmp_path, steps=2)
    train.train(cfg, TokenStream(4096, 64))
    ckpt = checkpoint.latest(Path(cfg.run_dir) / "checkpoints")
    model_file = ckpt / "model.pt"
    data = model_file.read_bytes()
    model_file.write_bytes(data[: len(data) // 2])
    with pytest.raises(checkpoint.CheckpointError, match="model.pt.*truncated"):
        train.train(dataclasses.replace(cfg, steps=4), TokenStream(4096, 64))
    model_file.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(checkpoint.CheckpointError, match="model.pt.*corrupted"):
        train.train(dataclasses.replace(cfg, steps=4), TokenStream(4096, 64))


def test_run_records_metrics_counters_conversion_and_provenance(tmp_path):
    cfg = train_config(tmp_path, steps=4, log_every=2)
    final = train.train(cfg, TokenStream(4096, 64))
    record = json.loads(final.read_text())
    assert record["recipe"] == "ue5m3_b16" and record["seed"] == 3 and record["step"] == 4
    assert set(record["counters"]) == {"loss_above_3", "grad_norm_above_1"}
    assert (
        record["checkpoint_sha256"]
        == checkpoint.verify(checkpoint.latest(Path(cfg.run_dir) / "checkpoints"))["files"]["model.pt"]["sha256"]
    )
    metrics = [json.loads(line) for line in (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [2, 4]
    assert {"loss", "grad_norm", "lr", "tokens_per_s", "zero_rounded_blocks", "saturated_blocks"} <= set(metrics[0])
    conversion = json.loads((Path(cfg.run_dir) / "conversion.json").read_text())
    assert conversion and all(r["status"] == "converted" for r in conversion)


def test_bf16_recipe_trains_without_fp4_modules(tmp_path):
    final = train.train(train_config(tmp_path, recipe="bf16", steps=2), TokenStream(4096, 64))
    assert json.loads(final.read_text())["recipe"] == "bf16"


def test_config_rejects_unknown_and_missing_keys_naming_them(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "run_dir: x\nmodel: dense_debug\nrecipe: bf16\nseed: 1\nsteps: 2\nmicro_batch: 1\naccumulation: 1\n"
        "data: null\nbogus: 1\n"
    )
    with pytest.raises(ValueError, match=r"unknown keys \['bogus'\]"):
        TrainConfig.from_yaml(path)
    path.write_text("run_dir: x\nmodel: dense_debug\n")
    with pytest.raises(ValueError, match="missing keys"):
        TrainConfig.from_yaml(path)


def test_native_te_execution_fails_closed_without_a_blackwell_gpu(tmp_path):
    from ue5m3.layers import native_te

    try:
        native_te.require_native()
    except native_te.NativeUnavailable:
        pass
    else:
        pytest.skip("a Blackwell GPU with Transformer Engine is present")
    cfg = train_config(tmp_path, recipe="nvfp4_te", recipe_overrides=LAST_LAYER_BF16, steps=1, execution="native_te")
    with pytest.raises(native_te.NativeUnavailable):
        train.train(cfg, TokenStream(4096, 64))
    assert not (tmp_path / "run").exists()  # refused before the run directory (or its lock) is made


def test_native_execution_is_refused_for_a_recipe_without_a_native_path(tmp_path):
    with pytest.raises(ValueError, match=r"execution: recipe 'ue5m3_b16' has no native Transformer Engine path"):
        train_config(tmp_path, recipe="ue5m3_b16", steps=1, execution="native_te")


def test_data_parallel_is_checked_and_auto_is_fsdp2_on_both_execution_paths(tmp_path):
    nvfp4 = {"recipe": "nvfp4_te", "recipe_overrides": LAST_LAYER_BF16, "steps": 1}
    assert train_config(tmp_path, **nvfp4).parallelism == "fsdp2"
    assert train_config(tmp_path, **nvfp4, execution="native_te").parallelism == "fsdp2"  # sharded, not replicated
    assert train_config(tmp_path, **nvfp4, execution="native_te", data_parallel="ddp").parallelism == "ddp"
    with pytest.raises(ValueError, match="data_parallel: must be one of"):
        train_config(tmp_path, recipe="bf16", steps=1, data_parallel="zero3")
    with pytest.raises(ValueError, match="param_dtype: 'bfloat16' is FSDP2's mixed precision"):
        train_config(tmp_path, recipe="bf16", steps=1, data_parallel="ddp", param_dtype="bfloat16")


def test_final_record_says_the_run_was_emulated(tmp_path):
    cfg = train_config(tmp_path, recipe="nvfp4_te", recipe_overrides=LAST_LAYER_BF16, steps=1)
    final = train.train(cfg, TokenStream(4096, 64))
    assert json.loads(final.read_text())["execution"] == {
        "execution": "emulated",
        "gemm_model": "probe_matched",
        "recipe": "nvfp4_te",
        "backend": "auto",
    }


@pytest.mark.parametrize("recipe", ["nvfp4_te", "ue5m3_b16"])
def test_the_cpu_scale_runs_keep_the_final_8_layers_in_bf16_and_override_their_down_projections(recipe):
    """config/config.yaml's main runs exercise the recipes' final-layer rules as the 8B runs do."""
    from ue5m3 import config as config_loader
    from ue5m3 import pipeline
    from ue5m3.layers.linear import QuantLinear
    from ue5m3.layers.recipes import Operand
    from ue5m3.pipeline import jobs

    cpu = pipeline.load(config_loader.read_yaml(Path(__file__).resolve().parents[1] / "config" / "config.yaml"))
    cfg = TrainConfig.from_dict(jobs.run_settings(cpu, "main", recipe, 1))
    model, records = build.build_model(cfg, cfg.resolved_recipe(), torch.device("cpu"))
    exempt = {r.layer for r in records if r.status == "bf16_exempt"}
    converted = {r.layer for r in records if r.status == "converted"}
    if recipe == "nvfp4_te":  # 16 BF16 linears in the final 8 blocks, as at 8B; every kind in FP4 before them
        assert exempt == set(range(4, 12)) and converted == set(range(4))
        assert sum(r.status == "bf16_exempt" for r in records) == 16
    else:
        assert exempt == set() and converted == set(range(12))
    down_projections = {
        r.layer: model.get_submodule(r.name).policy.operands[Operand.WGRAD_UPSTREAM_GRADIENT].target
        for r in records
        if r.name.endswith("mixer.down_proj") and isinstance(model.get_submodule(r.name), QuantLinear)
    }
    # the T = 2048 override reaches the down projections of the final 8 blocks (those of nvfp4_te are BF16)
    late = {} if recipe == "nvfp4_te" else {5: 2048.0, 7: 2048.0, 9: 2048.0, 11: 2048.0}
    assert down_projections == {1: 448.0, 3: 448.0, **late}
