"""The pipeline config checked as a whole before any job starts: every bad input gets one clear error naming the
key path (the reliability table in docs/reliability.md lists these cases)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from snakemake.utils import update_config

from ue5m3 import config, workflow_config

ROOT = Path(__file__).resolve().parents[1]


def _default() -> dict:
    return config.read_yaml(ROOT / "config" / "config.yaml")


def _paper() -> dict:
    merged = _default()
    update_config(merged, config.read_yaml(ROOT / "config" / "paper.yaml"))  # as Snakemake merges --configfile
    return merged


@pytest.mark.parametrize("make", [_default, _paper], ids=["default", "paper"])
def test_the_shipped_configs_pass(make):
    workflow_config.check(make(), source="shipped")


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
    "negative grad clip": ("control.optim", {"grad_clip": -1.0}, "optim.grad_clip: must be positive"),
    "string optim": ("training.optim", "fast", "optim: expected a mapping"),
    "misspelled corpus in fits": ("identification.fits.synthetic_probe_matched.corpus", "nvpf4", "unknown corpus"),
    "misspelled sensitivity recipe": ("evaluation.sensitivity_recipe", "ue5m3_b61", "evaluation.sensitivity_recipe"),
    "misspelled downstream recipe": ("evaluation.downstream_recipes", ["bf61"], "evaluation.downstream_recipes[0]"),
    "unknown policy": ("evaluation.policies.bf16", "frozen", "evaluation.policies.bf16: unknown policy"),
    "step not kept": ("evaluation.steps", [25, 30], "evaluation.steps[1]: step 30 is not a checkpoint"),
    "override beyond depth": (
        "control.override",
        {"operand": "wgrad_upstream_gradient", "module": "*.mlp.down_proj", "layers": [3, 9], "target": 2048.0},
        "control.override.layers[1]",
    ),
    "witness module": ("identification.witness.module", "model.layers.7.mlp.down_proj", "identification.witness"),
    "witness seed": ("identification.witness.seed", 5, "identification.witness.seed"),
    "data key": ("data.vocab", 4096, "data: unknown keys ['vocab']"),
    "accumulation value": ("accumulation.slice_width", "64", "accumulation.slice_width"),
    "corpus key": ("identification.corpora.nvfp4", {"scheme": "nvfp4", "seeds": 3}, "identification.corpora.nvfp4"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_value_is_refused_naming_its_key_path(case):
    dotted, value, expected = BAD[case]
    cfg = _default()
    _set(cfg, dotted, copy.deepcopy(value))
    with pytest.raises(config.ConfigError) as err:
        workflow_config.check(cfg, source="config/config.yaml")
    message = str(err.value)
    assert message.startswith("config/config.yaml: ") and "nothing was started" in message
    assert expected in message, message


def test_every_problem_is_reported_at_once():
    cfg = _default()
    cfg["training"]["seeds"] = [-1]
    cfg["evaluation"]["sensitivity_recipe"] = "nope"
    with pytest.raises(config.ConfigError, match=r"2 problem\(s\)"):
        workflow_config.check(cfg)


def test_a_packaged_recipe_left_out_of_training_is_a_subset_not_an_error():
    cfg = _default()
    cfg["training"]["recipes"] = ["bf16", "ue5m3_b16"]  # nvfp4_te stays in downstream_recipes: skipped by the rules
    workflow_config.check(cfg)


def test_duplicate_keys_in_a_config_file_are_refused_naming_the_file(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("training:\n  steps: 10\n  steps: 20\n")
    with pytest.raises(config.ConfigError, match=r"(?s)config.yaml.*duplicate key 'steps'"):
        workflow_config.check_files([path])


def test_kept_checkpoints_follow_the_trainers_pruning_rule():
    assert workflow_config.kept_checkpoints(150, 25, 25, 2) == {25, 50, 75, 100, 125, 150}
    assert workflow_config.kept_checkpoints(150, 50, 0, 2) == {100, 150}
    assert workflow_config.kept_checkpoints(10, 4, 0, 1) == {10}
