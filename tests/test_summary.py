"""Training summaries: smoothing, final windows, stability counts and the seed spread."""

import json

import pandas as pd
import pytest

from ue5m3.experiments import training_summary as summary


def _fake_run(root, recipe, seed, losses, grad_norms, log_every=5):
    run = root / f"{recipe}-{seed}"
    run.mkdir()
    steps = [log_every * (i + 1) for i in range(len(losses))]
    lines = [
        json.dumps(
            {
                "step": s,
                "loss": loss,
                "grad_norm": g,
                "lr": 1e-3,
                "tokens_per_s": 1.0,
                "saturated_blocks": 1,
                "zero_rounded_blocks": 0,
            }
        )
        for s, loss, g in zip(steps, losses, grad_norms, strict=True)
    ]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    final = {"recipe": recipe, "seed": seed, "config": {"steps": steps[-1], "log_every": log_every}}
    (run / "final.json").write_text(json.dumps(final))
    return run


def test_final_window_and_counters_follow_the_paper_definitions(tmp_path):
    losses = [5.0, 4.0, 3.5, 3.2, 2.9, 2.8, 2.7, 2.6, 2.5, 2.4, 2.3, 2.2, 2.1, 2.0]
    grads = [2.0, 1.5, 0.9, 1.2] + [0.5] * 10
    run = _fake_run(tmp_path, "ue5m3_b16", 1, losses, grads)
    windows = summary.final_window(summary.smooth(summary.load_runs([run]), 10), points=10)
    row = windows.iloc[0]
    assert row["final_window_mean_loss"] == pytest.approx(sum(losses[-10:]) / 10)
    assert row["endpoint_loss"] == 2.0 and row["endpoint_grad_norm"] == 0.5
    # counted after the first twelfth of 70 steps (step > 5.83): losses 4.0, 3.5, 3.2 and gradient norms 1.5, 1.2
    assert (row["losses_above_3"], row["grad_norms_above_1"]) == (3, 2)
    assert row["saturated_blocks"] == len(losses)


def test_smoothing_window_is_rescaled_to_the_logging_interval(tmp_path):
    run = _fake_run(tmp_path, "bf16", 1, [4.0, 2.0, 0.0, 2.0], [1.0, 3.0, 2.0, 9.0], log_every=5)
    smoothed = summary.smooth(summary.load_runs([run]), window_steps=10)  # two logged points
    assert smoothed["loss_smoothed"].tolist() == [4.0, 3.0, 1.0, 1.0]
    assert smoothed["grad_norm_smoothed"].tolist() == [1.0, 2.0, 2.5, 5.5]


def test_seed_spread_per_recipe(tmp_path):
    runs = [_fake_run(tmp_path, "bf16", s, [3.0, v], [0.1, 0.1]) for s, v in ((1, 2.0), (2, 2.2))]
    table = summary.by_recipe(summary.final_window(summary.load_runs(runs), points=1))
    row = table.set_index("recipe").loc["bf16"]
    assert row["final_window_mean_loss"] == pytest.approx(2.1)
    assert row["seed_std"] == pytest.approx(pd.Series([2.0, 2.2]).std())
    assert (row["seed_min"], row["seed_max"], row["seeds"]) == (2.0, 2.2, 2)


def test_unfinished_run_is_refused_naming_it(tmp_path):
    run = _fake_run(tmp_path, "bf16", 1, [3.0], [0.1])
    (run / "final.json").unlink()
    with pytest.raises(FileNotFoundError, match="has not finished"):
        summary.load_runs([run])


def test_run_writes_tables_with_provenance(tmp_path):
    runs = [_fake_run(tmp_path, r, 1, [3.0, 2.5], [0.2, 0.1]) for r in ("bf16", "ue5m3_b16")]
    paths = summary.run(runs, tmp_path / "out", summary.SummaryConfig(final_window=2, smoothing_steps=5))
    assert set(paths) == {"curves", "final_window", "by_recipe", "provenance"}
    assert len(pd.read_csv(paths["curves"])) == 4
