"""The identification verbs: make-probes, record-oracle, fit-emulator, parity and grid-control end to end."""

import csv
import json

import pytest
import torch
import yaml

from ue5m3 import cli

SMALL = {"order_k": 256, "order_permutations": 16, "threshold_k": 512, "threshold_cells": 192, "broad_m": 16,
         "broad_n": 16, "broad_k": 256, "broad_cells": 32}  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.safetensors"
    assert cli.main(["make-probes", "--config", json.dumps({"corpus": SMALL}), "--out", str(path)]) == 0
    return path


def test_fit_emulator_recovers_the_hidden_candidate_through_a_recording(corpus, tmp_path):
    labels = tmp_path / "labels.safetensors"
    oracle = json.dumps({"oracle": "emulator:w32-exact-rtz-g2048"})
    assert cli.main(["record-oracle", "--config", oracle, "--corpus", str(corpus), "--out", str(labels)]) == 0
    out = tmp_path / "fit"
    assert cli.main(["fit-emulator", "--corpus", str(corpus), "--labels", str(labels), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["identified"] == ["w32-exact-rtz-g2048"] and summary["recovered"] is True
    assert summary["provenance"]["command"] == "fit-emulator"
    with (out / "tables.csv").open() as handle:
        experiments = {row["experiment"] for row in csv.DictReader(handle)}
    assert {"order_tests_group_width", "order_tests_final_grid", "packed_random_cells_fp32_exact"} <= experiments


def test_hardware_oracle_fails_closed_with_exit_code_3(corpus, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    code = cli.main(["fit-emulator", "--corpus", str(corpus), "--oracle", "native_te_nvfp4", "--out", str(tmp_path)])
    assert code == 3
    assert "unavailable here" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_bad_corpus_config_names_the_key(tmp_path, capsys):
    code = cli.main(
        ["make-probes", "--config", '{"corpus": {"broad_k": 100}}', "--out", str(tmp_path / "c.safetensors")]
    )
    assert code == 2
    assert "corpus.broad_k" in capsys.readouterr().err
    assert not (tmp_path / "c.safetensors").exists()


def test_parity_verb_reports_bitwise_equality(tmp_path):
    config = {
        "run_dir": str(tmp_path / "run"),
        "model": "dense_debug",
        "model_overrides": {"hidden_size": 64, "num_key_value_heads": 4, "intermediate_size": 128, "vocab_size": 512},
        "recipe": "ue5m3_b16",
        "seed": 3,
        "steps": 1,
        "micro_batch": 2,
        "accumulation": 1,
        "data": {"corpus": "sotu_cpython", "sequence_length": 32, "vocab_size": 512},
        "optim": {"lr": 0.003},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "parity.json"
    backends = {"backend_a": "emulated:probe_matched", "backend_b": "emulated:probe_matched:torch", "steps": 1}
    args = ["parity", "--config", json.dumps(backends), "--run-config", str(path), "--out", str(out)]
    assert cli.main(args) == 0
    record = json.loads(out.read_text())
    assert record["report"]["bitwise_equal"] is True and record["command"] == "parity"


def test_bad_settings_are_refused_before_any_work(corpus, tmp_path, capsys):
    """An unknown oracle, a malformed candidate grid and a bad parity backend name their key; nothing is written."""
    bad = [
        ["record-oracle", "--config", '{"oracle": "hopper"}', "--corpus", str(corpus), "--out", str(tmp_path / "l")],
        ["fit-emulator", "--config", '{"slice_widths": [0, 64]}', "--corpus", str(corpus), "--oracle",
         "emulator:w64-exact-rtz-g1024", "--out", str(tmp_path / "f")],
        ["parity", "--config", '{"backend_a": "emulated:nope", "backend_b": "emulated"}', "--run-config",
         str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "p.json")],
    ]  # fmt: skip
    expected = ["unknown oracle 'hopper'", "slice_widths[0]: must be in [1, 1,048,576]", "backend_a: unknown backend"]
    for args, message in zip(bad, expected, strict=True):
        assert cli.main(args) == 2
        assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_grid_control_verb_writes_its_tables(tmp_path):
    settings = {"seeds": [41], "grids": [None, 1024], "roundings": ["rne"], "steps": 3}
    args = ["grid-control", "--config", json.dumps(settings)]
    assert cli.main([*args, "--out-dir", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["bitwise_identical_across_grids"] == {"41/rne": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curves.csv", "runs.csv", "summary.json"]
