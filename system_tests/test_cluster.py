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
import time
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
    config["training"].update(tiny, recipes=["bf16", "ue5m3_b16"], summary={"final_window": 2, "smoothing_steps": 2})
    config["control"].update(tiny)
    config["data"].update(
        max_documents=120,
        validation_fraction=0.1,
        calibration_fraction=0.1,
        validation_windows=4,
        calibration_windows=2,
    )
    config["evaluation"].update(steps=[2, 4], nll={"replay_orders": 2, "bootstrap_samples": 50})
    config["evaluation"]["downstream"]["examples"] = 4
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


def _start_direct_run(work: Path, run_dir: Path, name: str, *launch: str) -> subprocess.Popen:
    """Train the run's own config again, outside SLURM, in results/<name>, with ``launch`` (the command before
    `train`); returns the running process."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["run_dir"] = f"results/{name}"
    (work / f"{name}.yaml").write_text(yaml.safe_dump(config))
    return subprocess.Popen(
        [*launch, "train", "--config", f"{name}.yaml"],
        cwd=work,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _assert_equals_direct_run(work: Path, run_dir: Path, step: int, direct: subprocess.Popen, name: str) -> None:
    """The checkpoint of ``step``, the metrics and the weights' provenance hash of the run equal those of the
    direct run, bit for bit."""
    _, err = direct.communicate(timeout=900)
    assert direct.returncode == 0, err[-4000:]
    a, b = _model(run_dir, step), _model(work / "results" / name, step)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _metrics(run_dir) == _metrics(work / "results" / name)
    finals = [json.loads((d / "final.json").read_text()) for d in (run_dir, work / "results" / name)]
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
    launch = ("torchrun", "--standalone", "--nproc-per-node", "2", "-m", "ue5m3")
    _assert_equals_direct_run(workdir, run_dir, 4, _start_direct_run(workdir, run_dir, "direct", *launch), "direct")


def test_an_evaluation_job_runs_on_the_gpu_partition_with_a_gpu(workdir):
    target = "results/eval/nll/ue5m3_b16/seed1/step4/cold_d50_replay.json"
    result = _snakemake(workdir, target)
    job = _slurm_job(result.stdout + result.stderr, "evaluate_nll")
    shown = subprocess.run(["scontrol", "show", "job", job], env=_env(), capture_output=True, text=True, check=True)
    assert "Partition=gpu" in shown.stdout and re.search(r"gres[:/]gpu[:=](fake:)?1", shown.stdout), shown.stdout
    assert "JobState=COMPLETED" in shown.stdout
    record = json.loads((workdir / target).read_text())
    assert record["policy"] == "cold_d50_replay"


def _running_job(rule: str) -> str | None:
    """The SLURM job id of the running job of ``rule`` (the executor puts the rule in the job's comment)."""
    shown = subprocess.run(["squeue", "-h", "-t", "R", "-o", "%i %k"], env=_env(), capture_output=True, text=True)
    found = [line.split()[0] for line in shown.stdout.splitlines() if f"rule_{rule}" in line]
    return found[0] if found else None


def _elapsed_seconds(job: str) -> int:
    shown = subprocess.run(["scontrol", "show", "job", job], env=_env(), capture_output=True, text=True, check=True)
    days, _, clock = re.search(r"RunTime=(\S+)", shown.stdout).group(1).rpartition("-")
    hours, minutes, seconds = (int(v) for v in clock.split(":"))
    return int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds


def test_a_training_job_at_its_time_limit_resumes_from_its_signal_time_checkpoint(workdir):
    """A training job submitted with `--signal=USR1@120` (the profile's signal-before-the-limit pattern) has its time
    limit moved, once it is training, to about 2 minutes from now: slurmctld sends the warning signal to the job step
    at its next periodic check, as it would 2 minutes before a real limit. The
    trainer writes a checkpoint of that step and exits; Snakemake resubmits (retries), the run resumes and ends with
    the same bytes as the run trained in one go without SLURM (trained meanwhile on the other core).

    The run is sized to outlast the signal's latency (one periodic check, at most 30 s; 24 s seen) with a margin:
    about 90 s of training on this project's 2-core machine. It reuses the module's prepared data (a second seed of
    the same configuration)."""
    config = yaml.safe_load((workdir / "config" / "tiny.yaml").read_text())
    config["training"].update(
        seeds=[2], steps=300, log_every=1, checkpoint_every=1000, keep_every=0, recipes=["ue5m3_b16"], micro_batch=2
    )
    config["evaluation"]["steps"] = [300]
    config["launcher"] = "ue5m3"
    (workdir / "config" / "time_limit.yaml").write_text(yaml.safe_dump(config))
    run = "results/train/main/ue5m3_b16/seed2"
    command = ["snakemake", f"{run}/final.json", "--profile", "cluster", "--workflow-profile", "cluster/local/profile"]
    command += ["--snakefile", str(ROOT / "Snakefile"), "--directory", str(workdir), "--retries", "2"]
    command += ["--set-resources", "train_run:runtime=30", "train_run:tasks=1"]  # no mpi: the rule is a job step
    command += ["train_run:slurm_extra='--signal=USR1@120'"]
    command += ["--configfile", str(workdir / "config" / "time_limit.yaml")]
    log_path = workdir / "time_limit_snakemake.log"  # a file, not a pipe: nothing reads it until the end
    with open(log_path, "w") as sink:
        workflow = subprocess.Popen(command, cwd=ROOT, env=_env(), stdout=sink, stderr=subprocess.STDOUT, text=True)
    run_dir, direct, moved = workdir / run, None, None
    try:
        deadline = time.monotonic() + 1200
        while workflow.poll() is None and time.monotonic() < deadline:
            if direct is None and (run_dir / "config.yaml").exists():
                direct = _start_direct_run(workdir, run_dir, "direct-seed2", "ue5m3")
            metrics = run_dir / "metrics.jsonl"
            if moved is None and metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
                job = _running_job("train_run")
                if job is not None:
                    # whole minutes (SLURM's resolution), rounded down: the warning 120 s before the limit is
                    # already due, and slurmctld sends it at its next periodic check; the limit itself is still ahead
                    limit = (_elapsed_seconds(job) + 120) // 60
                    subprocess.run(["scontrol", "update", f"JobId={job}", f"TimeLimit={limit}"], env=_env(), check=True)
                    moved = job
            time.sleep(0.5)
        output = log_path.read_text()
        assert workflow.returncode == 0, output[-6000:]
    finally:
        if workflow.poll() is None:
            workflow.kill()
    assert moved is not None, "the time limit was never moved: the first job finished before 3 logged steps"
    attempts = re.findall(r"submitted with SLURM jobid (\d+) \(log: \S*rule_train_run\b", output)
    assert len(attempts) == 2 and attempts[0] == moved, f"expected one resubmission of job {moved}:\n{output[-3000:]}"
    log = (workdir / "logs" / "train" / "main" / "ue5m3_b16" / "seed2" / "train.log").read_text()
    assert "resumed from" in log, log[-2000:]
    _assert_equals_direct_run(workdir, run_dir, 300, direct, "direct-seed2")
