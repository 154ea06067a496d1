"""System test: the pipeline through `snakemake --profile cluster` on a real SLURM controller on this machine.

`make test-cluster` runs it (.ci/run: beside `make test`, sharing the cores with its workers). cluster/local/up.sh
brings up munge, slurmctld and slurmd with two partitions and two fake GPUs (installing slurm-wlm and munge with apt
on a fresh machine);
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
    config["identification"]["witness"]["sequences"] = 4  # the witness reads validation windows: at most those
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


SLOW_SAVE_S = 40
"""How long the slow storage holds the signal-time save: more than torchrun's default shutdown timeout (30 s)."""
MARGIN_S = 180
"""The job's signal margin (``--signal=TERM@180``): the launcher gives it to torchrun as its shutdown timeout."""


def _slow_storage(work: Path, checkpoints: Path) -> dict[str, str]:
    """The environment of the slow storage (system_tests/slow_fsync.c, built here): the first fsync under
    ``checkpoints`` sleeps SLOW_SAVE_S seconds and writes what it slowed into the token file."""
    library = work / "libslowfsync.so"
    compiler = os.environ.get("CC", "cc")
    built = subprocess.run(
        [compiler, "-shared", "-fPIC", "-o", str(library), str(ROOT / "system_tests" / "slow_fsync.c"), "-ldl"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, f"the slow-storage shim did not build:\n{built.stderr}"
    return {
        "LD_PRELOAD": str(library),
        "SLOW_FSYNC_SECONDS": str(SLOW_SAVE_S),
        "SLOW_FSYNC_UNDER": f"{checkpoints}/",
        "SLOW_FSYNC_TOKEN": str(work / "slow_fsync.token"),
    }


def test_a_training_job_at_its_time_limit_checkpoints_under_srun_and_torchrun_on_slow_storage_and_resumes(workdir):
    """A training job launched as the paper's are (srun + torchrun, two ranks, c10d rendezvous) and submitted with
    `--signal=TERM@180` (the profile's signal-before-the-limit pattern) has its time limit moved, once it is
    training, to less than 3 minutes from now: slurmctld sends TERM to every process of the job step (each torchrun
    and its worker) at its next periodic check, as it would 3 minutes before a real limit. The storage is slow
    (system_tests/slow_fsync.c): the signal-time save takes at least 40 s, more than torchrun's default 30 s
    shutdown timeout, after which torchrun would have killed its workers mid-save. The launcher gives torchrun the
    job's margin instead (`--shutdown-timeout={signal_margin_s}`), so the workers write their checkpoint and exit;
    Snakemake resubmits (retries), the run resumes from that checkpoint (the only one before the end) and ends with
    the same bytes as the two-rank run trained in one go without SLURM (trained meanwhile on the other core).

    The run is sized to outlast the signal's latency (one periodic check, at most 30 s; 24 s seen) with a margin:
    about 90 s of training per rank on this project's 2-core machine (several times that on a loaded one). It reuses
    the module's prepared data (a second seed of the same configuration); run alone, it prepares them first, and the
    direct run starts once they exist."""
    config = yaml.safe_load((workdir / "config" / "tiny.yaml").read_text())
    config["training"].update(
        seeds=[2], steps=300, log_every=1, checkpoint_every=1000, keep_every=0, recipes=["ue5m3_b16"], micro_batch=2
    )
    config["evaluation"]["steps"] = [300]
    (workdir / "config" / "time_limit.yaml").write_text(yaml.safe_dump(config))
    run = "results/train/main/ue5m3_b16/seed2"
    run_dir = workdir / run
    # the local profile with this job's time limit and signal (--set-resources would replace the profile's whole
    # resource set of the rule, its two srun tasks included)
    profile = yaml.safe_load((ROOT / "cluster" / "local" / "profile" / "config.yaml").read_text())
    profile["set-resources"]["train_run"].update(runtime=30, slurm_extra=f"'--signal=TERM@{MARGIN_S}'")
    (workdir / "time_limit_profile").mkdir(exist_ok=True)
    (workdir / "time_limit_profile" / "config.yaml").write_text(yaml.safe_dump(profile))
    command = ["snakemake", f"{run}/final.json", "--profile", "cluster"]
    command += ["--workflow-profile", str(workdir / "time_limit_profile")]
    command += ["--snakefile", str(ROOT / "Snakefile"), "--directory", str(workdir), "--retries", "2"]
    command += ["--configfile", str(workdir / "config" / "time_limit.yaml"), str(ROOT / "cluster/local/config.yaml")]
    env = {**_env(), **_slow_storage(workdir, run_dir / "checkpoints")}  # the jobs inherit it (sbatch exports it)
    log_path = workdir / "time_limit_snakemake.log"  # a file, not a pipe: nothing reads it until the end
    with open(log_path, "w") as sink:
        workflow = subprocess.Popen(command, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, text=True)
    direct, moved = None, None
    launch = ("torchrun", "--standalone", "--nproc-per-node", "2", "-m", "ue5m3")
    prepared = workdir / "results" / "data" / "prepared.json"  # run alone, this test prepares the data itself
    try:
        deadline = time.monotonic() + 2400  # a guard against a hang: the data jobs and 300 steps on a loaded machine
        while workflow.poll() is None and time.monotonic() < deadline:
            if direct is None and (run_dir / "config.yaml").exists() and prepared.exists():
                direct = _start_direct_run(workdir, run_dir, "direct-seed2", *launch)
            metrics = run_dir / "metrics.jsonl"
            if moved is None and metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
                job = _running_job("train_run")
                if job is not None:
                    # whole minutes (SLURM's resolution), rounded down: the warning MARGIN_S before the limit is
                    # already due, and slurmctld sends it at its next periodic check; the limit itself is still ahead
                    limit = (_elapsed_seconds(job) + MARGIN_S) // 60
                    subprocess.run(["scontrol", "update", f"JobId={job}", f"TimeLimit={limit}"], env=_env(), check=True)
                    moved = job
            time.sleep(0.5)
        output = log_path.read_text()
        assert workflow.returncode is not None, f"the workflow did not finish in 40 minutes:\n{output[-3000:]}"
        assert workflow.returncode == 0, output[-6000:]
    finally:
        if workflow.poll() is None:
            workflow.kill()
        if direct is not None and direct.poll() is None and workflow.returncode != 0:
            direct.kill()
    assert moved is not None, "the time limit was never moved: the first job finished before 3 logged steps"
    attempts = re.findall(r"submitted with SLURM jobid (\d+) \(log: \S*rule_train_run\b", output)
    assert len(attempts) == 2 and attempts[0] == moved, f"expected one resubmission of job {moved}:\n{output[-3000:]}"
    # the log is the resubmitted job's (each attempt writes it anew): it resumed from a checkpoint before the end,
    # which only the signal can have asked for (checkpoint_every 1000, no wall-time checkpoints)
    log = (workdir / "logs" / "train" / "main" / "ue5m3_b16" / "seed2" / "train.log").read_text()
    resumed = re.search(r"resumed from \S*step-(\d{8}) \(step (\d+)\)", log)
    assert resumed and int(resumed.group(1)) == int(resumed.group(2)), log[-3000:]
    step = int(resumed.group(2))
    assert 3 <= step < 300, log[-3000:]
    # the slow storage held the signal-time save (a file of its temporary directory) for SLOW_SAVE_S seconds
    token = (workdir / "slow_fsync.token").read_text()
    saving = re.escape(f"{run_dir / 'checkpoints'}/.step-{step:08d}.")  # the save's temporary directory
    assert re.search(rf"slept {SLOW_SAVE_S} s in fsync of {saving}", token), token
    _assert_equals_direct_run(workdir, run_dir, 300, direct, "direct-seed2")
