"""The scale ladder (ue5m3.experiments.ladder): exact paired-t power against textbook sample sizes, scipy's noncentral
t and a simulation; the paired spread and its scaling by hand; the rung configs loaded whole by the pipeline check and
costed by the plan's estimate; the docs' table is what the module renders."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ue5m3 import config
from ue5m3.cli import rungs
from ue5m3.evaluation.nll import t_quantile
from ue5m3.experiments import ladder

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("d", "n", "power"), [(0.2, 199, 0.8016910), (0.5, 34, 0.8077775), (0.8, 15, 0.8213105),
                                               (1.0, 10, 0.8030969)])  # fmt: skip
def test_seeds_needed_are_the_textbook_paired_t_sample_sizes(d, n, power):
    """G*Power's paired t-test, two-tailed, alpha 0.05, power 0.80 (standardised effect d = mean / sd): n and the
    actual power it prints."""
    assert ladder.seeds_needed(d, 1.0) == n
    assert ladder.seeds_needed(-d * 0.01, 0.01) == n  # only the ratio and not the sign matters
    assert ladder.paired_power(n, d, 1.0) == pytest.approx(power, abs=2e-6)
    assert ladder.paired_power(n - 1, d, 1.0) < 0.8


@pytest.mark.parametrize("n", [2, 3, 5, 12, 60, 400])
def test_power_at_no_effect_is_alpha(n):
    """At a zero effect the test rejects with probability alpha, by the definition of the t quantile."""
    assert ladder.paired_power(n, 0.0, 1.0) == pytest.approx(0.05, abs=1e-5)
    assert ladder.paired_power(n, 0.0, 1.0, alpha=0.2) == pytest.approx(0.2, abs=1e-5)


def test_power_matches_scipys_noncentral_t():
    stats = pytest.importorskip("scipy.stats")
    for n in (2, 3, 4, 7, 20, 150, 3000):
        for d in (0.05, 0.3, 1.0, 2.5):
            c = stats.t.ppf(0.975, n - 1)
            nc = d * math.sqrt(n)
            exact = stats.nct.sf(c, n - 1, nc) + stats.nct.cdf(-c, n - 1, nc)
            assert ladder.paired_power(n, d, 1.0) == pytest.approx(exact, abs=2e-6), (n, d)


def test_equivalence_power_matches_a_simulation():
    """The share of simulated seed sets whose 95% t interval lies inside the margin."""
    rng = np.random.default_rng(7)
    for n, effect, sd, margin in ((4, 0.0, 1.0, 2.0), (10, 0.2, 1.0, 0.8), (6, 0.01, 0.02, 0.03)):
        draws = rng.normal(effect, sd, size=(200_000, n))
        mean, s = draws.mean(axis=1), draws.std(axis=1, ddof=1)
        half = t_quantile(0.975, n - 1) * s / math.sqrt(n)
        share = float(np.mean((mean - half >= -margin) & (mean + half <= margin)))
        assert ladder.equivalence_power(n, effect, sd, margin) == pytest.approx(share, abs=4e-3)


def test_equivalence_seeds_grow_as_the_margin_shrinks_and_refusals():
    wide, narrow = ladder.seeds_needed(0.0, 1.0, margin=2.0), ladder.seeds_needed(0.0, 1.0, margin=0.5)
    assert 2 <= wide < narrow
    assert ladder.equivalence_power(narrow, 0.0, 1.0, 0.5) >= 0.8 > ladder.equivalence_power(narrow - 1, 0.0, 1.0, 0.5)
    assert ladder.seeds_needed(1e-6, 1.0, most=1000) is None
    for bad in (
        lambda: ladder.paired_power(1, 1, 1),
        lambda: ladder.paired_power(3, 1, 0),
        lambda: ladder.seeds_needed(0, 1),
    ):
        with pytest.raises(ValueError):
            bad()


@pytest.mark.parametrize(("n", "sd"), [(2, 1.0), (3, 0.13), (10, 0.05), (80, 0.1276)])
def test_detectable_effect_is_the_inverse_of_seeds_needed(n, sd):
    effect = ladder.detectable_effect(n, sd)
    assert ladder.paired_power(n, effect, sd) == pytest.approx(0.8, abs=1e-6)
    assert ladder.seeds_needed(effect * 1.001, sd) <= n < ladder.seeds_needed(effect * 0.99, sd)


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
    assert at_cpu["held"] == ladder.seeds_needed(-0.02, at_cpu["sd_held"])  # the CPU rung: the measured effect
    assert at_gpu["sd_shrunk"] == pytest.approx(0.1 / 5**0.5)  # a GPU rung: shrunk with the window's tokens
    assert at_gpu["held"] == ladder.seeds_needed(-0.0384, at_gpu["sd_held"])  # and sized for the paper's effect


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


@pytest.mark.slow
def test_the_docs_hold_the_rendered_ladder():
    """docs/experiments.md's ladder section is what ``ue5m3 ladder`` renders now."""
    doc = (ROOT / "docs" / "experiments.md").read_text(encoding="utf-8")
    section = doc.split(ladder.BEGIN, 1)[1].split(ladder.END, 1)[0]
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
    doc.write_text(f"# head\n\n{ladder.BEGIN}\nstale\n{ladder.END}\n\ntail\n", encoding="utf-8")
    assert cli.main(["ladder", "--write", str(doc)]) == 0
    assert doc.read_text(encoding="utf-8") == f"# head\n\n{ladder.BEGIN}\n{printed}{ladder.END}\n\ntail\n"
