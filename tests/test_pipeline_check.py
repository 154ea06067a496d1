"""The pipeline config loaded and checked as a whole before any job starts (ue5m3.pipeline.check): every bad input
gets one clear error naming the key path (the reliability table in docs/reliability.md lists these cases)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from snakemake.utils import update_config

from ue5m3 import config, pipeline
from ue5m3.pipeline import jobs

ROOT = Path(__file__).resolve().parents[1]


def _default() -> dict:
    return config.read_yaml(ROOT / "config" / "config.yaml")


def _paper() -> dict:
    merged = _default()
    update_config(merged, config.read_yaml(ROOT / "config" / "paper.yaml"))  # as Snakemake merges --configfile
    return merged


@pytest.mark.parametrize("make", [_default, _paper], ids=["default", "paper"])
def test_the_shipped_configs_pass(make):
    pipeline.load(make(), source="shipped")


def test_the_paper_config_pins_the_tokenizer_and_every_hub_file():
    """Runnable as shipped: the tokenizer is fetched at a full commit and every hf:// data URI names one."""
    from ue5m3.data.hub import COMMIT, TokenizerSource, unpinned_hub_uris

    paper = _paper()
    source = TokenizerSource(**paper["tokenizer_source"])
    assert source.revision is not None and COMMIT.fullmatch(source.revision)
    hub = [u for key in ("stream_a_files", "stream_b_files") for u in paper["data"][key] if u.startswith("hf://")]
    assert hub and unpinned_hub_uris(hub) == []


def _set(cfg: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    node = cfg
    for key in parents:
        node = node[key]
    node[last] = value


BAD = {
    "unknown recipe": (
        "training.recipes",
        ["bf16", "ue5m3_b61"],
        "training.recipes[1]: its run: recipe: unknown recipe 'ue5m3_b61'",
    ),
    "negative seed": ("training.seeds", [-1], "training.seeds[0]: a seed is a non-negative int"),
    "duplicate seeds": ("control.seeds", [1, 1], "control.seeds: duplicate seeds"),
    "unknown model": ("training.model", "nemotron_h_debgu", "model: unknown model 'nemotron_h_debgu'"),
    "unknown model override": ("control.model_overrides", {"vocab_size": 4096, "layers": 3}, "unknown keys ['layers']"),
    "vocabulary mismatch": ("training.model_overrides", {"vocab_size": 8192}, "has vocab_size 8192"),
    "unknown optim key": ("training.optim", {"lr": 0.003, "momentum": 0.9}, "optim: unknown keys ['momentum']"),
    "negative grad clip": ("control.optim", {"grad_clip": -1.0}, "optim.grad_clip: must be > 0"),
    "string optim": ("training.optim", "fast", "optim: expected a mapping"),
    "misspelled corpus in fits": ("identification.fits.synthetic_probe_matched.corpus", "nvpf4", "unknown corpus"),
    "misspelled sensitivity recipe": ("evaluation.sensitivity_recipe", "ue5m3_b61", "evaluation.sensitivity_recipe"),
    "misspelled downstream recipe": ("evaluation.downstream_recipes", ["bf61"], "evaluation.downstream_recipes[0]"),
    "unknown policy": ("evaluation.policies.bf16", "frozen", "evaluation.policies.bf16: unknown value 'frozen'"),
    "step not kept": ("evaluation.steps", [25, 30], "evaluation.steps[1]: step 30 is not a checkpoint"),
    "override beyond depth": (
        "control.override",
        {"operand": "wgrad_upstream_gradient", "module": "*.mlp.down_proj", "layers": [3, 9], "target": 2048.0},
        "control.override.layers[1]",
    ),
    "override selector beyond depth": (
        "control.override.layers",
        {"first": 0, "last": 5, "kind": None},
        "control (override): its run: recipe: target_overrides[0].layers: selects the last 5 layers, but model "
        "'dense_debug' has 4 layers",
    ),
    "override selector key": ("control.override.layers", {"last": 2}, "missing keys ['first', 'kind']"),
    "training model too shallow for the final 8 layers": (
        "training.model_overrides",
        {"vocab_size": 4096},
        "training.recipes[3]: its run: recipe: bf16_layers: selects the last 8 layers, but model 'nemotron_h_debug' "
        "has 7 layers",
    ),
    "witness module": ("identification.witness.module", "model.layers.7.mlp.down_proj", "identification.witness"),
    "witness seed": ("identification.witness.seed", 5, "identification.witness.seed"),
    "data key": ("data.vocab", 4096, "data: unknown keys ['vocab']"),
    "zero data parts": (
        "data.prepare_parts",
        0,
        "data.prepare_parts: must be in [1, 16,384] (parallel preparation jobs), got 0",
    ),
    "data parts without tokenizer": ("data.prepare_parts", 4, "data.prepare_parts: 4 parts need a fixed tokenizer"),
    "accumulation value": ("accumulation.slice_width", "64", "accumulation.slice_width"),
    "native run of no recipe": ("training.execution", {"nvfp4_tee": "native_te"}, "training.execution.nvfp4_tee"),
    "native run without a native path": (
        "training.execution",
        {"ue5m3_b16": "native_te"},
        "execution: recipe 'ue5m3_b16' has no native Transformer Engine path",
    ),
    "corpus key": ("identification.corpora.nvfp4", {"scheme": "nvfp4", "seeds": 3}, "identification.corpora.nvfp4"),
    "GPU runs without a partition": ("control.gpus_per_node", 4, "control.partition: GPU runs (gpus_per_node > 0)"),
    "GPU partition the plan does not know": (
        "training",
        {"gpus_per_node": 4, "partition": "gpu"},
        "training.partition: partition 'gpu' is not in plan.partitions ([])",
    ),
    "GPU evaluations without a partition": ("evaluation.gpus", 1, "evaluation.partition: evaluations on a GPU"),
    "global batch the GPUs cannot split": (
        "training",
        {"gpus_per_node": 4, "partition": "gpu", "accumulation": 0, "global_batch": 16},
        "training: global_batch: 16 sequences per step cannot be split over 4 rank(s) of micro_batch 8",
    ),
    "multi-node CPU runs": ("control.nodes", 2, "control.nodes: 2 nodes of CPU jobs"),
    "unknown GPU type": ("plan", {"partitions": {"gpu": ["A100"]}}, "plan.partitions.gpu[0]: unknown GPU type 'A100'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_value_is_refused_naming_its_key_path(case):
    dotted, value, expected = BAD[case]
    cfg = _default()
    if isinstance(value, dict) and dotted in ("training", "plan"):  # fields added to a section
        cfg.setdefault(dotted, {}).update(copy.deepcopy(value))
    else:
        _set(cfg, dotted, copy.deepcopy(value))
    with pytest.raises(config.ConfigError) as err:
        pipeline.load(cfg, source="config/config.yaml")
    message = str(err.value)
    assert message.startswith("config/config.yaml: ") and "nothing was started" in message
    assert expected in message, message


def test_every_problem_is_reported_at_once():
    """All sections' structural problems together; once every section loads, all cross-reference problems."""
    cfg = _default()
    cfg["training"]["seeds"] = [-1]
    cfg["identification"]["corpora"]["nvfp4"]["broad_k"] = 100
    with pytest.raises(config.ConfigError, match=r"2 problem\(s\)") as err:
        pipeline.load(cfg)
    assert "training.seeds[0]" in str(err.value) and "identification.corpora.nvfp4" in str(err.value)
    cfg = _default()
    cfg["evaluation"]["sensitivity_recipe"] = "nope"
    cfg["evaluation"]["steps"] = [25, 30]
    with pytest.raises(config.ConfigError, match=r"2 problem\(s\)"):
        pipeline.load(cfg)


def test_a_packaged_recipe_left_out_of_training_is_a_subset_not_an_error():
    cfg = _default()
    cfg["training"]["recipes"] = ["bf16", "ue5m3_b16"]  # nvfp4_te stays in downstream_recipes: skipped by the rules
    pipeline.load(cfg)


def test_duplicate_keys_in_a_config_file_are_refused_naming_the_file(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("training:\n  steps: 10\n  steps: 20\n")
    with pytest.raises(config.ConfigError, match=r"(?s)config.yaml.*duplicate key 'steps'"):
        pipeline.check_files([path])


def test_kept_checkpoints_follow_the_trainers_pruning_rule():
    assert jobs.kept_checkpoints(150, 25, 25, 2) == {25, 50, 75, 100, 125, 150}
    assert jobs.kept_checkpoints(150, 50, 0, 2) == {100, 150}
    assert jobs.kept_checkpoints(10, 4, 0, 1) == {10}


def test_the_paper_runs_the_two_nvidia_baselines_natively_and_the_rest_emulated():
    cfg = pipeline.load(_paper())
    executions = {r: jobs.run_settings(cfg, "main", r, 42)["execution"] for r in cfg.training.recipes}
    assert {r for r, e in executions.items() if e == "native_te"} == {"nvfp4_te", "nvfp4_no_rht_all_linears"}
    assert jobs.run_settings(cfg, "control", "t448", 42)["execution"] == "emulated"
    assert jobs.run_settings(pipeline.load(_default()), "main", "nvfp4_te", 1)["execution"] == "emulated"


def test_the_override_control_and_the_parity_run_name_their_models_final_layers():
    from ue5m3.numerics.formats import Rounding
    from ue5m3.numerics.scaling import OperandRole
    from ue5m3.training.config import TrainConfig

    def resolved(settings):
        return TrainConfig.from_dict(settings).resolved_recipe()

    cpu, paper = pipeline.load(_default()), pipeline.load(_paper())
    assert resolved(jobs.run_settings(cpu, "control", "override", 1)).target_overrides[0].layers == (2, 3)
    control = resolved(jobs.run_settings(paper, "control", "override", 42))
    assert control.target_overrides[0].layers == (12, 13, 14, 15)  # the paper's 350M control
    assert resolved(jobs.run_settings(paper, "control", "t448", 42)).target_overrides == ()
    parity = resolved(jobs.parity_settings(paper, "native_vs_emulator_1p2b"))
    assert parity.bf16_layers == (16, 17, 18, 19)  # 96 FP4 + 24 BF16 linears of the 1.2B model
    assert parity.roles[OperandRole.UPSTREAM_GRADIENT].rounding is Rounding.RNE  # SR off
    main = resolved(jobs.run_settings(paper, "main", "nvfp4_te", 42))
    assert main.bf16_layers == tuple(range(44, 52))


def test_an_hf_uri_without_a_pinned_commit_is_refused():
    cfg = _paper()
    cfg["data"]["stream_b_files"] = [*cfg["data"]["stream_b_files"], "hf://datasets/allenai/olmo-mix-1124/data/x/*.gz"]
    with pytest.raises(config.ConfigError, match=r"data\.stream_b_files\[6\]: .* names no commit"):
        pipeline.load(cfg)


def test_the_paper_pins_its_hub_files():
    cfg = _paper()
    uris = cfg["data"]["stream_a_files"] + cfg["data"]["stream_b_files"]
    assert all("@8162bd79c6dc4fea470506531a8d791badc06b4b/" in uri for uri in uris)
    assert cfg["tokenizer_source"]["repo"] and cfg["data"]["tokenizer_path"]
    assert _default()["tokenizer_source"] is None  # the CPU config downloads nothing


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"revision": "main"}, "tokenizer_source.revision: expected a full commit hash"),
        ({"sha256": "abc"}, "tokenizer_source.sha256"),
        ({"branch": "main"}, "unknown keys ['branch']"),
    ],
)
def test_a_bad_tokenizer_source_is_refused(change, expected):
    cfg = _paper()
    cfg["tokenizer_source"] = {**cfg["tokenizer_source"], **change}
    with pytest.raises(config.ConfigError) as err:
        pipeline.load(cfg)
    assert expected in str(err.value)


def test_a_tokenizer_source_needs_a_tokenizer_path():
    cfg = _default()
    cfg["tokenizer_source"] = {"repo": "a/b", "revision": None, "file": "tokenizer.json", "sha256": None}
    with pytest.raises(config.ConfigError, match="data.tokenizer_path: tokenizer_source is set"):
        pipeline.load(cfg)
