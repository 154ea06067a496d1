"""Tests for the Snakemake pipeline: dry runs, lint, config schema, notebook pairing, env pins.

The dry runs and lint call the `snakemake` next to this interpreter (the project's .venv), from the
repository root, exactly as a user would. The real run of the range pipeline is marked slow and needs
the `ue5m3 range-analysis` CLI.
"""

import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jupytext
import nbformat
import pytest
import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "workflow" / "schemas" / "config.schema.yaml"
CONFIGS = [ROOT / "config" / "config.yaml", ROOT / "config" / "paper.yaml"]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.py"))
MAX_NOTEBOOK_CELLS = 6  # style guide rule 11


def _env() -> dict[str, str]:
    """The environment with this interpreter's bin directory first on PATH, as `make` sets it up."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def _run(*args: str, cwd: Path = ROOT, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout, check=False)


def _snakemake(*args: str, cwd: Path = ROOT, timeout: float = 120) -> subprocess.CompletedProcess:
    result = _run("snakemake", *args, cwd=cwd, timeout=timeout)
    assert result.returncode == 0, f"snakemake {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


# --- workflow -----------------------------------------------------------------------------------------


# --forceall: plan every job even when results/ is up to date from an earlier run.
def test_dry_run_with_the_default_config_passes():
    result = _snakemake("-n", "--forceall")
    assert "range_figures" in result.stdout


def test_dry_run_with_the_cluster_profile_and_paper_config_passes():
    result = _snakemake("-n", "--forceall", "--profile", "cluster", "--configfile", "config/paper.yaml")
    assert "Using profile cluster" in result.stdout + result.stderr
    assert "range_figures" in result.stdout


def test_lint_passes():
    _snakemake("--lint")


# --- config schema ------------------------------------------------------------------------------------


def _merged(path):
    """A config as Snakemake sees it: --configfile merged (recursively) over config/config.yaml."""

    def merge(base, over):
        out = dict(base)
        for key, value in over.items():
            out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        return out

    return merge(_load(CONFIGS[0]), _load(path))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_satisfy_the_schema(path):
    validate(_merged(path), str(SCHEMA))


@pytest.mark.parametrize(
    ("where", "key"),
    [((), "unknown_section"), (("range_analysis",), "unknown_option")],
    ids=["top level", "in a section"],
)
def test_schema_rejects_an_unknown_key(where, key):
    config = _load(CONFIGS[0])
    section = config
    for name in where:
        section = section[name]
    section[key] = 1
    with pytest.raises(WorkflowError, match=key):
        validate(config, str(SCHEMA))


def _required_keys() -> list[tuple[str, ...]]:
    config = _load(CONFIGS[0])
    keys = [(key,) for key in config]
    keys += [(section, key) for section, value in config.items() if isinstance(value, dict) for key in value]
    return keys


@pytest.mark.parametrize("key", _required_keys(), ids="/".join)
def test_schema_rejects_a_config_missing_a_key(key):
    config = copy.deepcopy(_load(CONFIGS[0]))
    section = config
    for name in key[:-1]:
        section = section[name]
    del section[key[-1]]
    with pytest.raises(WorkflowError, match=f"'{key[-1]}' is a required property"):
        validate(config, str(SCHEMA))


def test_schema_rejects_a_wrongly_typed_value():
    config = _load(CONFIGS[0])
    config["range_analysis"]["targets"] = [448, "2048"]
    with pytest.raises(WorkflowError):
        validate(config, str(SCHEMA))


# --- notebooks ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("script", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_script_and_ipynb_are_in_sync(script):
    ipynb = script.with_suffix(".ipynb")
    assert ipynb.is_file(), f"{ipynb.name} is missing: run `jupytext --sync {script.relative_to(ROOT)}`"
    from_script = jupytext.read(script)
    from_ipynb = jupytext.read(ipynb)
    cells = [(c.cell_type, c.source, c.metadata.get("tags")) for c in from_script.cells]
    assert cells == [(c.cell_type, c.source, c.metadata.get("tags")) for c in from_ipynb.cells], (
        f"{ipynb.name} differs from {script.name}: run `jupytext --sync {script.relative_to(ROOT)}`"
    )


@pytest.mark.parametrize("script", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_has_language_info_a_parameters_cell_and_at_most_six_cells(script):
    notebook = nbformat.read(script.with_suffix(".ipynb"), as_version=4)
    assert notebook.metadata["language_info"]["name"] == "python"  # Snakemake's notebook: needs it
    assert len(notebook.cells) <= MAX_NOTEBOOK_CELLS
    tagged = [cell for cell in notebook.cells if "parameters" in cell.metadata.get("tags", [])]
    assert len(tagged) == 1


# --- environments -------------------------------------------------------------------------------------


def _pins(lines) -> dict[str, str]:
    pins = {}
    for line in lines:
        match = re.fullmatch(r"\s*([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^\s#]+)\s*", line)
        if match:
            pins[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = match.group(2)
    return pins


@pytest.mark.parametrize("env_file", sorted((ROOT / "envs").glob("*.yaml")), ids=lambda p: p.name)
def test_conda_env_pins_match_constraints(env_file):
    constraints = _pins((ROOT / "constraints.txt").read_text().splitlines())
    pip_section = next(d["pip"] for d in _load(env_file)["dependencies"] if isinstance(d, dict))
    pins = _pins(pip_section)
    assert pins, f"{env_file.name} pins nothing"
    assert {name: constraints.get(name) for name in pins} == pins


# --- real run -----------------------------------------------------------------------------------------


def _range_analysis_cli_missing() -> str | None:
    """Why the real range pipeline cannot run here, or None when it can."""
    if shutil.which("ue5m3", path=_env()["PATH"]) is None:
        return "the `ue5m3` command is not installed (pip install -e .)"
    result = _run("ue5m3", "range-analysis", "--help", timeout=60)
    if result.returncode != 0:
        return "`ue5m3 range-analysis` is not implemented yet (`ue5m3 range-analysis --help` fails)"
    return None


@pytest.mark.slow
def test_range_pipeline_runs_and_its_figures_are_byte_stable(tmp_path):
    reason = _range_analysis_cli_missing()
    if reason:
        pytest.skip(reason)
    shutil.copytree(ROOT / "config", tmp_path / "config")
    figures = ["range_codebooks.pdf", "range_headroom.pdf", "range_worked_example.pdf"]
    targets = [f"figures/{name}" for name in figures]
    run = ("--cores", "2", "--snakefile", str(ROOT / "Snakefile"), "--directory", str(tmp_path), *targets)
    _snakemake(*run, timeout=600)
    first = {name: (tmp_path / "figures" / name).read_bytes() for name in figures}
    assert (tmp_path / "results" / "range_analysis" / "provenance.json").is_file()
    assert (tmp_path / "logs" / "notebooks" / "range_analysis.ipynb").is_file()
    _snakemake(*run, "--forcerun", "range_figures", timeout=600)
    assert {name: (tmp_path / "figures" / name).read_bytes() for name in figures} == first


@pytest.mark.slow
def test_training_and_evaluation_stages_run_end_to_end_on_a_tiny_config(tmp_path):
    """Data, training runs (two recipes), the override control, evaluations, summaries and figures."""
    shutil.copytree(ROOT / "config", tmp_path / "config")
    config = _load(tmp_path / "config" / "config.yaml")
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
    (tmp_path / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    targets = [
        "figures/training_loss.pdf",
        "figures/control_override.pdf",
        "figures/training_vs_paper.csv",
        "figures/validation_nll.pdf",
        "figures/policy_sensitivity.pdf",
        "figures/scale_snapshot.pdf",
        "figures/downstream.pdf",
    ]
    _snakemake(
        "--cores", "2", "--snakefile", str(ROOT / "Snakefile"), "--directory", str(tmp_path), *targets, timeout=900
    )
    for target in targets:
        assert (tmp_path / target).stat().st_size > 0
    summary = (tmp_path / "results" / "train" / "summary" / "main" / "by_recipe.csv").read_text()
    assert "bf16" in summary and "ue5m3_b16" in summary
    control = (tmp_path / "results" / "train" / "summary" / "control" / "final_window.csv").read_text()
    assert "ue5m3_b16_t2048_override" in control
    assert (tmp_path / "results" / "train" / "main" / "ue5m3_b16" / "seed1" / "checkpoints" / "step-00000004").is_dir()
    evaluated = sorted(
        p.stem for p in (tmp_path / "results" / "eval" / "nll" / "ue5m3_b16" / "seed1" / "step4").glob("*.json")
    )
    assert evaluated == ["calibrated_frozen", "cold_d50_replay", "current_tensor"]
    downstream = tmp_path / "results" / "eval" / "downstream" / "ue5m3_b16" / "seed1" / "step4" / "cold_d50_replay.json"
    assert json.loads(downstream.read_text())["aggregates"]["mmlu"]["best"] is not None
    assert "ue5m3_b16" in (tmp_path / "figures" / "downstream_vs_paper.csv").read_text()


def test_an_interrupted_reproduce_resumes_with_the_same_command(tmp_path):
    """SIGKILL the whole run while a job runs (a stale Snakemake lock and an incomplete output stay behind); the
    same command then finishes, rerunning what was incomplete."""
    reason = _range_analysis_cli_missing()
    if reason:
        pytest.skip(reason)
    shutil.copytree(ROOT / "config", tmp_path / "config")
    targets = ["figures/range_codebooks.pdf", "figures/range_headroom.pdf", "figures/range_worked_example.pdf"]
    command = [str(ROOT / "workflow" / "reproduce.sh"), "--cores", "1", "--snakefile", str(ROOT / "Snakefile")]
    command += ["--directory", str(tmp_path), *targets]
    process = subprocess.Popen(
        command, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    locks, deadline = tmp_path / ".snakemake" / "locks", time.monotonic() + 300
    while not (tmp_path / "logs" / "range_analysis" / "range_analysis.log").exists() and process.poll() is None:
        assert time.monotonic() < deadline, "the first job never started"
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert locks.is_dir() and any(locks.iterdir()), "a killed run leaves its lock"
    blocked = _run("snakemake", *command[1:], cwd=ROOT, timeout=300)
    assert blocked.returncode != 0 and "lock" in (blocked.stdout + blocked.stderr).lower()
    resumed = subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert "stale Snakemake lock" in resumed.stderr
    for target in targets:
        assert (tmp_path / target).stat().st_size > 0
