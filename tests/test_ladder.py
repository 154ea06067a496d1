"""The scale ladder (ue5m3.experiments.ladder, ladder_docs): the paired spread and its scaling by hand; the rung configs
loaded whole by the pipeline check and costed by the plan's estimate; the docs' table is what the module renders."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ue5m3 import config
from ue5m3.cli import rungs
from ue5m3.experiments import ladder, ladder_docs, power

ROOT = Path(__file__).resolve().parents[1]


def test_at_the_measured_scale_the_spread_is_held_never_shrunk():
    """The CPU rung trains the measured runs' model and tokens: more logged points shrink only the window part."""
    spread = ladder.Spread("ue5m3_b16", "nvfp4_te", (1, 2, 3), -0.02, 0.1, 0.01, 10, 1024)
    claim = next(c for c in ladder.CLAIMS if c.key == "training_loss_vs_te")
    sizing = ladder.ClaimSizing(
        claim, -0.0384, spread, "training", None, "measured: CPU runs", ("ue5m3_b16", "nvfp4_te")
    )

    class Training:
        recipes = ("ue5m3_b16", "nvfp4_te")

    class Cfg:
        training = Training

    def summary(rung):
        return ladder.RungSummary(rung, "m", 1.0, Training.recipes, tuple(range(1, 9)), 150, 1024, 153600, 51200, (1,),
                                  16, "", 0.0, 8192)  # fmt: skip

    cpu, gpu = ladder.RUNGS[0], ladder.RUNGS[1]
    at_cpu, at_gpu = ladder.decisions(sizing, summary(cpu), Cfg), ladder.decisions(sizing, summary(gpu), Cfg)
    assert at_cpu["sd_shrunk"] == at_cpu["sd_held"] == pytest.approx(math.hypot(spread.trajectory_sd, 0.01 / 5**0.5))
    assert at_cpu["held"] == power.seeds_needed(-0.0384, at_cpu["sd_held"])  # the CPU rung: the paper's effect too
    assert at_gpu["sd_shrunk"] == pytest.approx(0.1 / 5**0.5)  # a GPU rung: shrunk with the window's tokens
    assert at_gpu["held"] == power.seeds_needed(-0.0384, at_gpu["sd_held"])  # and sized for the paper's effect


def _curves(effects, noise, points=10, steps_every=5):
    """Two recipes over seeds: the treatment's loss is the baseline's plus a seed's effect, a trend and ``noise``
    (one residual pattern per seed) at each logged step."""
    rows = []
    steps = [steps_every * (i + 1) for i in range(points)]
    for seed, effect in enumerate(effects, start=1):
        for i, step in enumerate(steps):
            base = 6.0 - 0.001 * step + 0.05 * math.sin(step + seed)  # the batch's own difficulty: shared, cancels
            rows.append({"recipe": "b", "seed": seed, "step": step, "loss": base})
            rows.append({"recipe": "a", "seed": seed, "step": step, "loss": base + effect + 1e-4 * step + noise[i]})
    return pd.DataFrame(rows)


def test_spread_of_noise_free_windows_is_the_sd_of_the_seed_effects():
    effects = [-0.10, -0.05, -0.12]
    spread = ladder.spread_from_curves(_curves(effects, [0.0] * 10), "a", "b", points=10, tokens_per_point=1024)
    trend = 1e-4 * np.mean([5 * (i + 1) for i in range(10)])
    assert spread.seeds == (1, 2, 3)
    assert spread.effect == pytest.approx(np.mean(effects) + trend)
    assert spread.sd == pytest.approx(np.std(effects, ddof=1))
    assert spread.window_sd == pytest.approx(0.0, abs=1e-9)
    assert spread.trajectory_sd == pytest.approx(spread.sd)
    assert spread.window_tokens == 10 * 1024


def test_window_sd_is_the_residual_sd_about_the_line_over_root_points():
    noise = [0.02, -0.02] * 5  # the same zig-zag in every seed: no spread over seeds, all window noise
    spread = ladder.spread_from_curves(_curves([-0.1, -0.1], noise), "a", "b", points=10, tokens_per_point=100)
    x = np.arange(10.0)
    residual = np.array(noise) - np.polyval(np.polyfit(x, noise, 1), x)
    assert spread.window_sd == pytest.approx(math.sqrt((residual**2).sum() / 8) / math.sqrt(10))
    assert spread.sd == pytest.approx(0.0, abs=1e-12)
    assert spread.trajectory_sd == 0.0
    with pytest.raises(ValueError, match="seed"):
        ladder.spread_from_curves(_curves([-0.1], noise), "a", "b", points=10, tokens_per_point=100)


def test_rung_sd_scales_the_window_part_with_the_tokens():
    spread = ladder.Spread("a", "b", (1, 2, 3), -0.1, 0.05, 0.03, 10, 1000)  # trajectory part 0.04
    assert spread.trajectory_sd == pytest.approx(0.04)
    assert ladder.rung_sd(spread, 10_000, hold_trajectory=True) == pytest.approx(0.05)
    assert ladder.rung_sd(spread, 40_000, hold_trajectory=True) == pytest.approx(math.hypot(0.04, 0.015))
    assert ladder.rung_sd(spread, 40_000, hold_trajectory=False) == pytest.approx(0.025)


def test_the_paper_window_sd_comes_from_its_350m_control():
    mean, window, tokens = ladder.paper_window_sd()
    assert tokens == 10 * 768 * 8192
    assert -0.01 < mean < 0 and 0 < window < abs(mean)


def test_the_shipped_cpu_windows_are_paired_final_windows():
    curves = pd.read_csv(ladder.CPU_WINDOWS)
    assert set(curves.columns) == {"recipe", "seed", "step", "loss"}
    runs = curves.groupby(["recipe", "seed"])
    assert sorted(runs.groups) == [
        (r, s) for r in ("nvfp4_no_rht_all_linears", "nvfp4_te", "ue5m3_b16") for s in (1, 2, 3)
    ]
    for _, run in runs:
        assert list(run["step"]) == [105 + 5 * i for i in range(10)]  # the CPU DAG's last 10 points of 150 steps
    sizings = {s.claim.key: s for s in ladder.claim_sizings(curves, points=10, tokens_per_point=1024)}
    assert sizings["no_rht_with_ue5m3"].spread.seeds == sizings["training_loss_vs_te"].spread.seeds == (1, 2, 3)
    assert sizings["no_rht_with_ue5m3"].paper_effect == pytest.approx(2.309 - 2.442)
    assert sizings["selective_sr"].spread is None and sizings["selective_sr"].paper_effect is None


def test_merge_is_snakemakes_configfile_merge():
    update_config = pytest.importorskip("snakemake.utils").update_config
    for rung in ladder.RUNGS:
        ours = config.read_yaml(ROOT / "config" / "config.yaml")
        theirs = config.read_yaml(ROOT / "config" / "config.yaml")
        for name in rung.configs:
            ladder.merge_configs(ours, config.read_yaml(ROOT / name))
            update_config(theirs, config.read_yaml(ROOT / name))
        assert ours == theirs, rung.key


@pytest.mark.slow
def test_the_rung_configs_load_whole_and_their_gpu_jobs_pass_the_plans_settings():
    """Each study config merged over config/config.yaml passes the pipeline check; its GPU jobs name partitions that
    hold GPU types (the plan's own check of the jobs it is given); the CPU rung trains on the CPU and the GPU rungs
    fit their budgets by the plan's estimate."""
    from ue5m3.pipeline import jobs
    from ue5m3.plan.run import PlanConfig

    for rung in ladder.RUNGS[:3]:
        cfg = rungs.rung_config(rung)
        plan = config.load(PlanConfig, jobs.plan_config(cfg), source=rung.key)
        summary = rungs.summarize_rung(rung, cfg)
        assert summary.runs == len(cfg.training.recipes) * len(cfg.training.seeds) + 2 * len(cfg.control.seeds)
        if rung.budget_gpu_hours is None:
            assert summary.gpu_hours == 0 and not any(job.gpus_per_node for job in plan.jobs)
        else:
            assert 0.5 * rung.budget_gpu_hours < summary.gpu_hours <= rung.budget_gpu_hours, rung.key
            assert all(job.gpus_per_node and job.partition == "gpu" for job in plan.jobs if job.kind == "train")


def test_the_cpu_rung_has_the_seeds_that_find_the_largest_paper_effect():
    """The CPU rung is sized by power: its seeds reach the held number of the largest paper-sized effect it trains."""
    sizings = ladder.claim_sizings(
        pd.read_csv(ladder.CPU_WINDOWS), points=10, tokens_per_point=ladder.CPU_TOKENS_PER_POINT
    )
    rung = ladder.RUNGS[0]
    cfg = rungs.rung_config(rung)
    summary = rungs.summarize_rung(rung, cfg)
    sized = [s for s in sizings if s.spread is not None and s.paper_effect is not None and s.window == "training"]
    largest = max(sized, key=lambda s: abs(s.paper_effect))
    assert largest.claim.key == "no_rht_with_ue5m3"
    decided = ladder.decisions(largest, summary, cfg)
    assert decided["decidable"] == "yes" and decided["held"] <= len(summary.seeds) <= decided["held"] + 2


@pytest.mark.slow
def test_the_docs_hold_the_rendered_ladder():
    """docs/experiments.md's ladder section is what ``ue5m3 ladder`` renders now."""
    doc = (ROOT / "docs" / "experiments.md").read_text(encoding="utf-8")
    section = doc.split(ladder_docs.BEGIN, 1)[1].split(ladder_docs.END, 1)[0]
    text = rungs.render()
    assert section == "\n" + text
    assert "| rung |" in text and "no_rht_with_ue5m3" in text


@pytest.mark.slow
def test_the_ladder_verb_prints_the_section_and_writes_it_between_the_markers(tmp_path, capsys):
    from ue5m3 import cli

    assert cli.main(["ladder"]) == 0
    printed = capsys.readouterr().out
    assert "| rung |" in printed and "no_rht_with_ue5m3" in printed
    doc = tmp_path / "doc.md"
    doc.write_text(f"# head\n\n{ladder_docs.BEGIN}\nstale\n{ladder_docs.END}\n\ntail\n", encoding="utf-8")
    assert cli.main(["ladder", "--write", str(doc)]) == 0
    assert doc.read_text(encoding="utf-8") == f"# head\n\n{ladder_docs.BEGIN}\n{printed}{ladder_docs.END}\n\ntail\n"
