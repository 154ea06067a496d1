"""Validation NLL: the paper's protocol, exact token accounting, bootstrap and order intervals, the CLI verb."""

import json
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ue5m3 import cli
from ue5m3.data import open_data
from ue5m3.evaluation.inference import load_for_inference
from ue5m3.evaluation.nll import (
    NllConfig,
    SequenceNLL,
    bootstrap_interval,
    evaluation_orders,
    load_results,
    order_summary,
    paired_bootstrap,
    percent_vs_bf16,
    run_nll,
    sequence_nll,
    t_quantile,
)
from ue5m3.training.checkpoint import CheckpointError


@pytest.fixture(scope="module")
def run(tiny_run):
    """The shared tiny run (read-only) and its validation set."""
    run_dir, config = tiny_run
    return run_dir, open_data(config).validation


def test_nll_token_accounting_is_exact_and_matches_a_full_logits_cross_entropy(run):
    run_dir, validation = run
    loaded = load_for_inference(run_dir, policy="current_tensor")
    result = sequence_nll(loaded, validation, chunk=16)  # 4 head chunks per 64-token sequence
    assert result.total_tokens == len(validation) * 64 and result.tokens.tolist() == [64] * len(validation)
    total = 0.0
    for window in validation.windows:
        logits = loaded.forward_unit(window[None, :-1])[0]  # [64, V] in one piece
        total += float(F.cross_entropy(logits, window[1:], reduction="sum").double())
    assert result.nll == pytest.approx(total / result.total_tokens, abs=1e-6)
    assert loaded.units == 2 * len(validation)


def test_nll_progress_logs_the_windows_and_the_running_nll(run, caplog, monkeypatch):
    import logging

    from ue5m3 import logs

    monkeypatch.setattr(logs, "interactive", lambda: False)  # a log file, not a terminal
    caplog.set_level(logging.INFO, logger="ue5m3.evaluation.nll")
    run_dir, validation = run
    result = sequence_nll(load_for_inference(run_dir, policy="current_tensor"), validation)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "ue5m3.evaluation.nll"]
    assert line.startswith(f"validation NLL: window 4/4, nll {result.nll:.5f}, tokens 256, ") and "window/s" in line


def test_replay_depends_on_the_evaluation_order_and_current_tensor_does_not(run):
    run_dir, validation = run
    orders = evaluation_orders(len(validation), 2, seed=0)
    reverse = tuple(reversed(range(len(validation))))
    assert orders[0] == (0, 1, 2, 3) and sorted(orders[1]) == [0, 1, 2, 3]
    replay = [
        sequence_nll(load_for_inference(run_dir, policy="cold_d50_replay"), validation, order=o)
        for o in (orders[0], reverse)
    ]
    current = [
        sequence_nll(load_for_inference(run_dir, policy="current_tensor"), validation, order=o)
        for o in (orders[0], reverse)
    ]
    assert not np.array_equal(replay[0].nll_sum, replay[1].nll_sum)
    assert np.array_equal(current[0].nll_sum, current[1].nll_sum)


def test_bootstrap_interval_contains_the_estimate_and_is_seeded():
    rng = np.random.default_rng(1)
    tokens = np.full(50, 64, dtype=np.int64)
    result = SequenceNLL(nll_sum=rng.normal(150, 10, 50), tokens=tokens, order=tuple(range(50)))
    low, high = bootstrap_interval(result, samples=500, seed=3)
    assert low < result.nll < high
    assert bootstrap_interval(result, samples=500, seed=3) == (low, high)
    assert bootstrap_interval(result, samples=500, seed=4) != (low, high)


def test_paired_bootstrap_is_seeded_contains_the_difference_and_needs_the_same_sequences():
    rng = np.random.default_rng(2)
    tokens = np.full(40, 64, dtype=np.int64)
    a = SequenceNLL(nll_sum=rng.normal(150, 10, 40), tokens=tokens, order=tuple(range(40)))
    b = SequenceNLL(nll_sum=a.nll_sum + rng.normal(0.5, 0.1, 40), tokens=tokens, order=tuple(range(40)))
    out = paired_bootstrap(a, b, samples=500, seed=0)
    assert out["low"] < out["difference"] < out["high"] < 0
    assert paired_bootstrap(a, b, samples=500, seed=0) == out
    short = SequenceNLL(nll_sum=a.nll_sum[:10], tokens=tokens[:10], order=tuple(range(10)))
    with pytest.raises(ValueError, match="same sequences"):
        paired_bootstrap(a, short)


def test_order_summary_reports_mean_min_max_and_a_t_interval():
    assert t_quantile(0.975, 1) == pytest.approx(12.7062, abs=1e-3)
    assert t_quantile(0.975, 10) == pytest.approx(2.2281, abs=1e-3)
    summary = order_summary([2.0, 2.1, 2.3])
    assert summary["mean"] == pytest.approx(2.1333333) and (summary["min"], summary["max"]) == (2.0, 2.3)
    half = 4.3027 * np.std([2.0, 2.1, 2.3], ddof=1) / np.sqrt(3)
    assert summary["t_high"] - summary["mean"] == pytest.approx(half, rel=1e-4)
    assert order_summary([2.0])["t_low"] is None


def test_percent_vs_bf16_is_positive_when_the_candidate_is_lower():
    assert percent_vs_bf16(2.0, 1.9) == pytest.approx(5.0)
    assert percent_vs_bf16(2.0, 2.1) == pytest.approx(-5.0)


def test_run_nll_writes_json_and_sequences_with_provenance(run, tmp_path):
    run_dir, validation = run
    out = tmp_path / "replay.json"
    record = run_nll(run_dir, out, policy="cold_d50_replay", cfg=NllConfig(replay_orders=3), validation=validation)
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(record))
    assert written["tokens"] == 256 and written["order_summary"]["orders"] == 3
    assert len(set(written["evaluation_order_ids"])) == 3 and written["checkpoint_sha256"]
    assert written["versions"]["torch"] and written["policy"] == "cold_d50_replay"
    lines = (tmp_path / "replay.sequences.csv").read_text().splitlines()
    assert lines[0] == "sequence,tokens,nll_sum_order0,nll_sum_order1,nll_sum_order2" and len(lines) == 5
    current = run_nll(run_dir, tmp_path / "current.json", policy="current_tensor", validation=validation)
    assert current["bootstrap_95"]["low"] <= current["nll"] <= current["bootstrap_95"]["high"]
    with pytest.raises(ValueError, match="order-independent"):
        run_nll(run_dir, tmp_path / "bad.json", policy="current_tensor", orders=2, validation=validation)
    # the config's replay orders apply to the order-dependent policy only
    once = run_nll(
        run_dir, tmp_path / "once.json", policy="current_tensor", cfg=NllConfig(replay_orders=3), validation=validation
    )
    assert len(once["order_nll"]) == 1 and once["nll"] == current["nll"]
    table = load_results([out, tmp_path / "current.json"])
    assert list(table["policy"]) == ["cold_d50_replay", "current_tensor"]
    replay = table.iloc[0]
    assert replay["orders"] == 3 and replay["low"] <= replay["nll"] <= replay["high"]
    assert table.iloc[1]["nll"] == current["nll"] and (table["step"] == 2).all()


def test_run_nll_writes_nothing_for_a_corrupted_checkpoint(run, tmp_path):
    run_dir, validation = run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    (copy / "checkpoints" / "step-00000002" / "model.pt").write_bytes(b"garbage")
    out = tmp_path / "out.json"
    with pytest.raises(CheckpointError, match="model.pt"):
        run_nll(copy, out, policy="current_tensor", validation=validation)
    assert not out.exists() and not (tmp_path / "out.sequences.csv").exists()


def test_evaluate_nll_verb_reads_the_runs_data_and_writes_the_result(run, tmp_path, capsys):
    run_dir, _ = run
    out = tmp_path / "bf16.json"
    assert (
        cli.main(
            ["evaluate-nll", "--config", '{"force_bf16": true}', "--run-dir", str(run_dir), "--policy", "bf16"]
            + ["--out", str(out)]
        )
        == 0
    )
    assert json.loads(out.read_text())["tokens"] == 256
    bad = tmp_path / "b32.json"
    assert cli.main(["evaluate-nll", "--run-dir", str(run_dir), "--policy", "bf16", "--out", str(bad)]) == 2
    assert "force_bf16" in capsys.readouterr().err and not bad.exists()


def test_evaluate_nll_of_several_checkpoints_in_one_process_writes_the_bytes_of_one_call_each(run, tmp_path):
    """Several --step/--out pairs in one process (one import, the held-out windows read once): each output is
    written as its own call writes it; calibrated_frozen reads the calibration windows too."""
    run_dir, _ = run
    config = ["--config", '{"bootstrap_samples": 20}', "--run-dir", str(run_dir), "--policy", "calibrated_frozen"]
    alone = tmp_path / "alone" / "step2.json"
    assert cli.main(["evaluate-nll", *config, "--step", "2", "--out", str(alone)]) == 0
    together = [tmp_path / "together" / name for name in ("a.json", "b.json")]
    pairs = [arg for out in together for arg in ("--step", "2", "--out", str(out))]
    assert cli.main(["evaluate-nll", *config, *pairs]) == 0
    for out in together:
        assert out.read_bytes() == alone.read_bytes()
        assert out.with_suffix(".sequences.csv").read_bytes() == alone.with_suffix(".sequences.csv").read_bytes()


@pytest.mark.parametrize(
    "pairs", [["--step", "2", "--out", "a.json", "--out", "b.json"], ["--step", "2", "--step", "2", "--out", "a.json"]]
)
def test_evaluate_nll_refuses_steps_and_outputs_that_do_not_pair(run, tmp_path, capsys, pairs):
    run_dir, _ = run
    pairs = [str(tmp_path / a) if a.endswith(".json") else a for a in pairs]
    assert cli.main(["evaluate-nll", "--run-dir", str(run_dir), "--policy", "bf16", *pairs]) == 2
    assert "one distinct --out per --step" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_evaluate_nll_help_lists_the_policies(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["evaluate-nll", "--help"])
    assert exit_info.value.code == 0
    assert "cold_d50_replay" in capsys.readouterr().out


def test_head_is_fp32_and_chunking_does_not_change_the_result(run):
    run_dir, validation = run
    loaded = load_for_inference(run_dir, policy="current_tensor")
    whole = sequence_nll(loaded, validation, chunk=256)
    chunked = sequence_nll(loaded, validation, chunk=7)
    # the FP32 head GEMM's blocking depends on the row count, so sums agree to FP32 rounding, not bit for bit
    assert np.allclose(whole.nll_sum, chunked.nll_sum, rtol=1e-7, atol=0)
    assert loaded.head(torch.zeros(3, 128)).dtype == torch.float32


def test_an_nll_job_loads_no_pandas():
    """The evaluate-nll verb's modules leave pandas (about 1 s of import) to load_results, which only the summaries
    and notebooks call."""
    import subprocess
    import sys

    script = "import sys, ue5m3.cli.evaluation, ue5m3.evaluation.nll; print('pandas' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split()[-1] == "False"
