"""The plan stage (ue5m3.plan): memory counted on the meta device equals a real CPU step's, FSDP2 shards as counted,
the budget and the refusals name their numbers, and the stage writes one row per job and GPU type."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from ue5m3 import config as config_loader
from ue5m3.layers.linear import QuantLinear
from ue5m3.plan import cost, memory
from ue5m3.plan import run as plan
from ue5m3.plan.gpus import gpu_type
from ue5m3.training.build import build_model, build_shell
from ue5m3.training.config import TrainConfig
from ue5m3.training.loss import lm_loss

DEBUG = {"vocab_size": 512, "hybrid_override_pattern": "*-M-M-M-M-M-"}  # the CPU DAG's 12 layers, a small vocabulary


def _cfg(recipe: str = "ue5m3_b16", model: str = "nemotron_h_debug", **settings) -> TrainConfig:
    overrides = DEBUG if model == "nemotron_h_debug" else {"vocab_size": 512, "num_hidden_layers": 8}
    fields = dict(run_dir="unused", model=model, recipe=recipe, seed=3, steps=1, micro_batch=1, accumulation=2,
                  model_overrides=overrides)  # fmt: skip
    return TrainConfig(data=None, **{**fields, **settings})


def _cpu_step(cfg: TrainConfig, sequence_length: int) -> memory.StepCounts:
    """The step training_memory runs on meta, run for real on the CPU (the trainer's build, real weights)."""
    model, _ = build_model(cfg, cfg.resolved_recipe(), torch.device("cpu"))
    for module in model.modules():  # the weights' quantizations held packed, as on the GPU the plan is for
        if isinstance(module, QuantLinear):
            module.weight_cache.packed = True
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    tokens = torch.randint(0, vocab, (cfg.micro_batch, sequence_length + 1), generator=generator)

    def step(microbatch: int):
        memory._begin(model, 1, microbatch)
        return (lambda: lm_loss(model, tokens[:, :-1], tokens[:, 1:], chunk=cfg.loss_chunk)), (lambda y: y.backward())

    return memory.measure_step(model, step, memory.MEASURED_MICROBATCHES, exclude=(tokens,))


@pytest.mark.parametrize(
    ("recipe", "checkpointing"), [("bf16", "none"), ("ue5m3_b16", "every_block"), ("nvfp4_te", "selective")]
)
def test_the_meta_step_counts_what_a_cpu_step_holds(recipe, checkpointing):
    """Activations and FP4 caches of the meta step are the CPU step's bytes exactly (the same build, the fused
    attention the CPU runs, the FP4 kernels' allocations); the transient peak is the meta step's own estimate."""
    cfg = _cfg(recipe, activation_checkpointing=checkpointing)
    planned = memory.training_memory(cfg, 1, 64)
    real = _cpu_step(cfg, 64)
    assert (planned.activations, planned.fp4_caches) == (real.activations, real.fp4_caches)
    assert planned.activations > 0 and planned.transient > 0
    assert (planned.fp4_caches > 0) == (recipe != "bf16")


def test_checkpointing_and_a_chunked_head_hold_less():
    base = memory.training_memory(_cfg("bf16"), 1, 64)
    lean = memory.training_memory(_cfg("bf16", activation_checkpointing="every_block", loss_chunk=16), 1, 64)
    assert lean.activations < base.activations / 2


@pytest.mark.parametrize(("shape", "world", "numel"), [((10, 3), 4, 9), ((8,), 8, 1), ((7, 2, 2), 32, 4), ((), 4, 1)])
def test_a_shard_is_a_padded_chunk_of_dim_0(shape, world, numel):
    assert memory.shard_numel(shape, world) == numel


def test_fsdp2_terms_shard_the_fp32_masters_and_gather_bf16():
    """At world size 8 with BF16 parameters: FP32 masters, gradients and moments cut 8 ways (padded per parameter);
    the gathered root and blocks in BF16; the unsharded FP32 gradient accumulation only when microbatches are
    reduced once per step."""
    cfg = _cfg("bf16", model="dense_debug", param_dtype="bfloat16", global_batch=32, accumulation=0)
    shell, _ = build_shell(cfg, cfg.resolved_recipe(), world_size=8)
    params = [p for p in shell.parameters() if p.requires_grad]
    sharded = sum(memory.shard_numel(p.shape, 8) for p in params) * 4
    padded_full = sum(memory.shard_numel(p.shape, 8) * 8 for p in params) * 4
    terms = memory.static_terms(shell, cfg, 8)
    assert terms["optimizer"] == 2 * sharded
    assert sharded < terms["parameters"] < sharded + padded_full // 2  # + BF16 root and in-flight blocks
    assert terms["gradients"] > sharded + padded_full  # accumulation 2 over the step
    once = memory.static_terms(shell, dataclasses.replace(cfg, gradient_sync="every_microbatch"), 8)
    assert terms["gradients"] - once["gradients"] == padded_full
    ddp = memory.static_terms(shell, dataclasses.replace(cfg, data_parallel="ddp", param_dtype="float32"), 8)
    full = sum(p.numel() for p in params) * 4
    assert ddp == {"parameters": full, "gradients": 2 * full, "optimizer": 2 * full}


# ----- the budget, the refusal and the stage ---------------------------------------------------------------


def _job(name: str = "train_run/main/ue5m3_b16/seed1", **fields) -> dict:
    settings = {"run_dir": "r", "model": "dense_debug", "recipe": "ue5m3_b16", "seed": 1, "steps": 10,
                "micro_batch": 1, "accumulation": 0, "global_batch": 8, "data": None,
                "model_overrides": {"vocab_size": 512, "num_hidden_layers": 4}}  # fmt: skip
    return {"name": name, "rule": "train_run", "kind": "train", "settings": settings, "sequence_length": 64,
            "steps": 10, "nodes": 1, "gpus_per_node": 4, "partition": "gpu", **fields}  # fmt: skip


def _plan_config(**settings) -> plan.PlanConfig:
    raw = {"partitions": {"gpu": ["H100", "H200"]}, "jobs": [_job()], **settings}
    return config_loader.load(plan.PlanConfig, raw, source="test")


def test_the_stage_writes_a_row_per_job_and_gpu_type_and_measures_each_setting_once(tmp_path):
    jobs = [_job(), _job("train_run/main/ue5m3_b16/seed2"), _job("train_run/main/bf16/seed1")]
    jobs[1]["settings"] = {**jobs[1]["settings"], "seed": 2}
    jobs[2]["settings"] = {**jobs[2]["settings"], "recipe": "bf16"}
    paths = plan.run(_plan_config(jobs=jobs), tmp_path)
    rows = plan.read_plan(paths["plan"])
    assert list(rows[0]) == plan.COLUMNS
    assert [(r["job"], r["gpu"]) for r in rows] == [(j["name"], g) for j in jobs for g in ("H100", "H200")]
    assert json.loads(paths["provenance"].read_text())["measured"] == 2  # the two seeds share one measurement
    first = rows[0]
    assert first["fits"] == "True" and first["covers"] == "True" and first["refusal"] == ""
    assert (first["world_size"], first["accumulation"]) == ("4", "2")  # global batch 8 on 4 GPUs, micro-batch 1
    assert int(first["reduce_scatters"]) > 0 and float(first["link_gb"]) > 0
    assert plan.refusal(rows, jobs[0]["name"]) == ""
    sized = plan.job_resources(rows, jobs[0]["name"])
    assert sized["retries"] == 0 and 5 <= sized["signal_margin"] and sized["runtime"] < 72 * 60


def _row(**values) -> dict:
    row = dict.fromkeys(plan.COLUMNS, "")
    row.update(job="j", gpu="H100", run_hours="100", time_limit_hours="72", signal_margin_minutes="20", retries="1")
    row.update(values)
    return row


def test_a_job_that_does_not_fit_or_finish_is_refused_naming_its_numbers():
    memory_row = {"fits": False, "covers": True, "peak_gb": 90.04, "reserve_gb": 6.4, "gpu": "H100",
                  "gpu_memory_gb": 80.0, **{f"{k}_gb": 1.0 for k in
                  ("parameters", "gradients", "optimizer", "fp4_caches", "activations", "transient")}}  # fmt: skip
    text = plan._refusal_text(memory_row)
    assert "needs 90.0 GB per GPU" in text and "6.4 reserve" in text and "H100's 80 GB" in text
    budget_row = {"fits": True, "covers": False, "run_hours": 1676.4, "jobs_needed": 25, "time_limit_hours": 72.0,
                  "gpu": "H100", "max_jobs": 8}  # fmt: skip
    expected = "needs 1676 h (25 jobs of 72 h on H100), more than max_jobs_per_run 8 allows"
    assert plan._refusal_text(budget_row) == expected
    rows = [_row(refusal=""), _row(gpu="H200", refusal="needs 1676 h"), _row(job="k", refusal="x")]
    assert plan.refusal(rows, "j") == "H200: needs 1676 h"


def test_the_resources_are_the_largest_over_the_partitions_gpu_types():
    rows = [_row(), _row(gpu="H200", run_hours="90", signal_margin_minutes="25", retries="2")]
    assert plan.job_resources(rows, "j") == {"runtime": 72 * 60, "signal_margin": 25, "retries": 2}
    short = [_row(run_hours="2", retries="0")]
    assert plan.job_resources(short, "j") == {"runtime": 2 * 60 + 20 + 30, "signal_margin": 20, "retries": 0}
    assert plan.job_resources([_row(gpu="cpu")], "j") == {}


def test_the_signal_margin_covers_the_step_and_the_nodes_checkpoint_shards():
    terms = memory.MemoryTerms(parameters=10**9, gradients=0, optimizer=2 * 10**9, fp4_caches=0, activations=0,
                               transient=0)  # fmt: skip
    job = plan.PlanJob(name="j", rule="train_run", kind="train", settings={}, sequence_length=1, steps=1,
                       gpus_per_node=4)  # fmt: skip
    # 4 GPUs x 3 GB written twice at 2 GB/s = 12 s, a step of 600 s, a minute: 11.2 minutes
    assert plan._signal_margin_minutes(terms, job, 600.0, 2.0) == 12
    assert plan._signal_margin_minutes(terms, job, 1.0, 2.0) == 5


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"partitions": {"gpu": ["A100"]}}, "partitions.gpu[0]: unknown GPU type 'A100'"),
        ({"partitions": {"gpu": []}}, "partitions.gpu: at least one GPU type"),
        ({"partitions": {"cpu": ["H100"]}}, "jobs.train_run/main/ue5m3_b16/seed1: partition 'gpu' holds no GPU"),
        ({"max_jobs_per_run": 0}, "max_jobs_per_run"),
        ({"memory_reserve": 0.5}, "memory_reserve"),
    ],
)
def test_a_bad_plan_setting_is_refused_naming_its_key(settings, message):
    with pytest.raises(config_loader.ConfigError, match=f"(?s){message.replace('[', '.').replace(']', '.')}"):
        _plan_config(**settings)


# ----- time ------------------------------------------------------------------------------------------------


def test_the_estimate_orders_the_recipes_as_their_operations_say():
    cfg = dataclasses.replace(_cfg(micro_batch=1), model="nemotron_h_8b", model_overrides={})
    fp4 = {r: sum(f for _, _, f in cost.linears(dataclasses.replace(cfg, recipe=r))) for r in ("bf16", "nvfp4_te")}
    assert fp4 == {"bf16": 0, "nvfp4_te": 96}
    assert sum(f for _, _, f in cost.linears(cfg)) == 112
    eff, tokens = cost.Efficiency(), 8192
    for name in ("H100", "B200"):
        gpu = gpu_type(name)
        seconds = {
            r: cost.microbatch_seconds(dataclasses.replace(cfg, recipe=r), gpu, tokens, eff, native=False)
            for r in ("bf16", "ue5m3_b16", "ue5m3_torch_control")
        }
        assert seconds["ue5m3_torch_control"] > seconds["ue5m3_b16"] > seconds["bf16"]
    b200 = gpu_type("B200")
    native = cost.microbatch_seconds(dataclasses.replace(cfg, recipe="nvfp4_te"), b200, tokens, eff, native=True)
    assert native < cost.microbatch_seconds(dataclasses.replace(cfg, recipe="bf16"), b200, tokens, eff, native=False)


def test_communication_hides_behind_compute_but_one_units_share():
    eff = cost.Efficiency()
    assert cost.communication_seconds(0, 10, 5.0, 1e9, eff) == 5.0
    comm = 100e9 / (50e9 * eff.network)
    assert math.isclose(cost.communication_seconds(100e9, 10, 1.0, 50e9, eff), comm + comm / 10)


def test_a_measured_step_time_replaces_the_estimate(tmp_path):
    record = tmp_path / "gpu_check.json"
    entry = {"model": "nemotron_h_8b", "recipe": "ue5m3_b16", "tokens": 8192, "microbatch_seconds": 1.25}
    record.write_text(json.dumps({"gpu": "H200", "step_times": [entry]}))
    assert cost.measured_seconds([record], "H200", "nemotron_h_8b", "ue5m3_b16", 8192) == 1.25
    assert cost.measured_seconds([record], "H100", "nemotron_h_8b", "ue5m3_b16", 8192) is None
    assert cost.measured_seconds([record], "H200", "nemotron_h_8b", "bf16", 8192) is None


def test_a_snapshot_holds_gradients_only_of_the_blocks_its_hooks_need(tmp_path):
    """The scale snapshot's pass (every block recomputed, no optimizer): FP32 weights of the whole model, gradients
    of the blocks from the first hooked down projection on (ue5m3.evaluation.snapshot), far less than all."""
    job = _job("scale_snapshot/ue5m3_b16/seed1", rule="scale_snapshot", kind="snapshot", gpus_per_node=1)
    job["settings"] = {**job["settings"], "recipe": "bf16", "activation_checkpointing": "every_block"}
    terms, basis, _ = plan._memory(config_loader.load(plan.PlanJob, job, source="test"))
    assert terms.optimizer == 0 and 0 < terms.gradients < terms.parameters and "hooked" in basis
