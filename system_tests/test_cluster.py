"""System test: the pipeline through `snakemake --profile cluster` on a real SLURM controller on this machine.

`make test-cluster` runs it (after `make test` in .ci/run). cluster/local/up.sh brings up munge, slurmctld and
slurmd with two partitions and two fake GPUs (installing slurm-wlm and munge with apt on a fresh machine);
cluster/local/down.sh removes all of it afterwards. The workflow runs with the cluster profile and the local
overlay (cluster/local/profile, cluster/local/config.yaml) on a CPU-scale slice of the DAG.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from ue5m3.training import checkpoint

ROOT = Path(__file__).resolve().parents[1]
STATE = Path("/tmp/ue5m3-slurm-systest")  # short: munge's socket path must fit in 108 bytes
RUN = "results/train/main/ue5m3_b16/seed1"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the local SLURM cluster needs root (slurmd, munged)")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env


@pytest.fixture(scope="module")
def cluster():
    up = subprocess.run([str(ROOT / "cluster/local/up.sh"), str(STATE)], capture_output=True, text=True, check=False)
    if up.returncode != 0:
        subprocess.run([str(ROOT / "cluster/local/down.sh"), str(STATE)], check=False)
        pytest.fail(f"the local SLURM cluster did not come up:\n{up.stdout}\n{up.stderr}")
    yield STATE
    subprocess.run([str(ROOT / "cluster/local/down.sh"), str(STATE)], check=False)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, cluster):
    """A working directory with the CPU-scale config cut to a slice: one FP4 run of 4 steps on a small corpus."""
    work = tmp_path_factory.mktemp("cluster")
    shutil.copytree(ROOT / "config", work / "config")
    config = yaml.safe_load((work / "config" / "config.yaml").read_text())
    tiny = {"seeds": [1], "steps": 4, "log_every": 1, "checkpoint_every": 2, "keep_every": 2}
    config["training"].update(tiny, recipes=["bf16", "ue5m3_b16"], final_window=2, smoothing_steps=2)
    config["control"].update(tiny)
    config["data"].update(
        max_documents=120,
        validation_fraction=0.1,
        calibration_fraction=0.1,
        validation_windows=4,
        calibration_windows=2,
    )
    config["evaluation"].update(steps=[2, 4], replay_orders=2, bootstrap_samples=50, downstream_examples=4)
    (work / "config" / "tiny.yaml").write_text(yaml.safe_dump(config))
    return work


def _snakemake(work: Path, *targets: str) -> subprocess.CompletedProcess:
    command = ["snakemake", *targets, "--profile", "cluster", "--workflow-profile", "cluster/local/profile"]
    command += ["--snakefile", str(ROOT / "Snakefile"), "--directory", str(work)]
    command += ["--configfile", str(work / "config" / "tiny.yaml"), str(ROOT / "cluster" / "local" / "config.yaml")]
    result = subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=1500, check=False)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stdout[-4000:]}\n{result.stderr[-6000:]}"
    return result


def _slurm_job(output: str, rule: str) -> str:
    found = re.findall(rf"submitted with SLURM jobid (\d+) \(log: \S*rule_{rule}\b", output)
    assert found, f"no SLURM job of rule {rule} in:\n{output[-3000:]}"
    return found[-1]


def _model(run_dir: Path, step: int) -> dict:
    return checkpoint.load_model_state(run_dir / "checkpoints" / f"step-{step:08d}")


def _metrics(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "tokens_per_s"} for line in lines]


def _assert_equals_direct_run(work: Path, run_dir: Path, step: int, *launch: str) -> None:
    """Train the run's own config again, outside SLURM, with ``launch`` (the command before `train`), and compare
    the checkpoint of ``step`` and the metrics bit for bit."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["run_dir"] = "results/direct"
    (work / "direct.yaml").write_text(yaml.safe_dump(config))
    direct = subprocess.run(
        [*launch, "train", "--config", "direct.yaml"],
        cwd=work,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert direct.returncode == 0, direct.stderr[-4000:]
    a, b = _model(run_dir, step), _model(work / "results" / "direct", step)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _metrics(run_dir) == _metrics(work / "results" / "direct")
    finals = [json.loads((d / "final.json").read_text()) for d in (run_dir, work / "results" / "direct")]
    assert finals[0]["checkpoint_sha256"] == finals[1]["checkpoint_sha256"]  # the weights' provenance hash too


def test_training_launched_by_srun_and_torchrun_equals_the_same_run_without_slurm(workdir):
    result = _snakemake(workdir, f"{RUN}/final.json")
    output = result.stdout + result.stderr
    job = _slurm_job(output, "train_run")
    run_dir = workdir / RUN
    manifest = json.loads((run_dir / "checkpoints" / "step-00000004" / "manifest.json").read_text())
    assert manifest["meta"]["world_size"] == 2  # two srun tasks, one torchrun rendezvous
    log = (workdir / "logs" / "train" / "main" / "ue5m3_b16" / "seed1" / "train.log").read_text()
    assert "invalid literal" not in log, log
    assert job

    # the same two-process run without SLURM
    _assert_equals_direct_run(workdir, run_dir, 4, "torchrun", "--standalone", "--nproc-per-node", "2", "-m", "ue5m3")


def test_an_evaluation_job_runs_on_the_gpu_partition_with_a_gpu(workdir):
    target = "results/eval/nll/ue5m3_b16/seed1/step4/cold_d50_replay.json"
    result = _snakemake(workdir, target)
    job = _slurm_job(result.stdout + result.stderr, "evaluate_nll")
    shown = subprocess.run(["scontrol", "show", "job", job], env=_env(), capture_output=True, text=True, check=True)
    assert "Partition=gpu" in shown.stdout and re.search(r"gres[:/]gpu[:=](fake:)?1", shown.stdout), shown.stdout
    assert "JobState=COMPLETED" in shown.stdout
    record = json.loads((workdir / target).read_text())
    assert record["policy"] == "cold_d50_replay"


def test_a_training_job_at_its_time_limit_resumes_from_its_signal_time_checkpoint(cluster, tmp_path):
    """runtime 3 minutes with --signal=USR1@120: SLURM signals the job's steps a minute in (once: the rule's step
    must exist by then, which Snakemake's start inside the job takes about 20 s of), the trainer writes a checkpoint
    of that step and exits; Snakemake resubmits (retries) and the run resumes. The result is the same bytes as the
    run trained in one go without SLURM."""
    shutil.copytree(ROOT / "config", tmp_path / "config")
    config = yaml.safe_load((tmp_path / "config" / "config.yaml").read_text())
    config["training"].update(
        seeds=[1], steps=70, log_every=1, checkpoint_every=1000, keep_every=0, recipes=["ue5m3_b16"], micro_batch=2
    )
    config["data"].update(max_documents=120, validation_fraction=0.1, calibration_fraction=0.1)
    config["evaluation"]["steps"] = [70]
    config["launcher"] = "ue5m3"
    (tmp_path / "config" / "tiny.yaml").write_text(yaml.safe_dump(config))
    command = ["snakemake", f"{RUN}/final.json", "--profile", "cluster", "--workflow-profile", "cluster/local/profile"]
    command += ["--snakefile", str(ROOT / "Snakefile"), "--directory", str(tmp_path), "--retries", "9"]
    command += ["--set-resources", "train_run:runtime=3", "train_run:tasks=1"]  # no mpi: the rule runs as a job step
    command += ["train_run:slurm_extra='--signal=USR1@120'", "--configfile", str(tmp_path / "config" / "tiny.yaml")]
    result = subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=1800, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    attempts = re.findall(r"submitted with SLURM jobid (\d+) \(log: \S*rule_train_run\b", output)
    assert len(attempts) >= 2, f"the run finished inside one job; nothing was resumed:\n{output[-3000:]}"
    log = (tmp_path / "logs" / "train" / "main" / "ue5m3_b16" / "seed1" / "train.log").read_text()
    assert "resumed from" in log, log[-2000:]

    run_dir = tmp_path / RUN
    _assert_equals_direct_run(tmp_path, run_dir, 70, "ue5m3")
