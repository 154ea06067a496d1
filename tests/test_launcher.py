"""Training jobs launched by srun + torchrun get the profile's whole signal margin: the launcher of config/paper.yaml
(and of the local cluster's overlay) gives torchrun the margin of the job's ``--signal`` as its shutdown timeout and
lets it forward SIGUSR1, so torchrun never kills a worker that is writing its signal-time checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ue5m3.pipeline import jobs

ROOT = Path(__file__).resolve().parents[1]


def _yaml(path: str) -> dict:
    return yaml.safe_load((ROOT / path).read_text())


@pytest.mark.parametrize(
    ("slurm_extra", "margin"),
    [
        ("'--exclusive --ntasks-per-node=1 --signal=TERM@900'", 900),
        ("--signal=B:USR1@120", 120),
        ("--signal USR1", 60),  # SLURM's default margin without @
        ("--signal=TERM@60 --signal=TERM@300", 300),  # the last one wins, as on sbatch's command line
        ("''", jobs.TORCHRUN_SHUTDOWN_S),  # no warning signal: only scancel or preemption signal the job
        (None, jobs.TORCHRUN_SHUTDOWN_S),
    ],
)
def test_the_signal_margin_is_the_at_of_the_jobs_signal_option(slurm_extra, margin):
    assert jobs.signal_margin_s({"slurm_extra": slurm_extra} if slurm_extra is not None else {}) == margin


@pytest.mark.parametrize("margin_minutes", [5, 15, 47])
def test_the_paper_launcher_gives_torchrun_the_plans_margin_and_sigusr1(margin_minutes):
    """A GPU training job's resources as the training rules build them: the section's nodes and GPUs, the plan's
    signal margin (ue5m3.plan.run.job_resources) in the job's --signal."""
    resources = {"nodes": 8, "tasks": 8, "gres": "gpu:4", "slurm_extra": jobs.training_slurm_extra(margin_minutes)}
    command = jobs.launcher(_yaml("config/paper.yaml")["launcher"], resources)
    assert f"--signal=TERM@{margin_minutes * 60}'" in resources["slurm_extra"]
    assert f"--shutdown-timeout={margin_minutes * 60} " in command
    assert "--nnodes=8 " in command and "--nproc-per-node=4 " in command
    assert "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 " in command
    assert command.index("--shutdown-timeout") > command.index("torchrun")  # torchrun's option, not srun's


def test_the_cluster_profile_leaves_the_training_jobs_size_and_signal_to_the_config_and_the_plan():
    for rule in ("train_run", "train_control"):
        resources = _yaml("cluster/config.yaml")["set-resources"][rule]
        assert not {"nodes", "tasks", "gres", "runtime", "slurm_extra"} & set(resources), rule


def test_the_local_clusters_launcher_takes_the_margin_of_the_job_it_starts():
    launcher = _yaml("cluster/local/config.yaml")["launcher"]
    resources = {**_yaml("cluster/local/profile/config.yaml")["set-resources"]["train_run"]}
    assert "--shutdown-timeout=30 " in jobs.launcher(launcher, resources)  # the overlay asks for no signal
    resources["slurm_extra"] = "'--signal=TERM@180'"  # the system test's time-limit job
    assert "--shutdown-timeout=180 " in jobs.launcher(launcher, resources)
