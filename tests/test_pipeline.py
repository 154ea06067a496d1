"""Tests for the Snakemake pipeline: dry runs, lint, config schema, notebook pairing, env pins.

The dry runs and lint call the `snakemake` next to this interpreter (the project's .venv), from the
repository root, exactly as a user would. The real run of the range pipeline is marked slow and needs
the `ue5m3 range-analysis` CLI.
"""

import copy
import csv
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
# Style guide rule 11, with room for prose: few code cells, each thin (drawing only; anything beyond a group-by
# belongs in the library), while markdown cells explain what each output shows and how to read it against the paper.
MAX_CODE_CELLS = 6
MAX_CODE_CELL_LINES = 60


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
    # the native baselines go to the Blackwell partition, the emulated runs to the training section's
    runs = [block for block in result.stdout.split("\nrule ") if block.startswith("train_run:")]
    partitions = {
        re.search(r"variant=(\w+)", block).group(1): re.search(r"slurm_partition=(\w*)", block).group(1)
        for block in runs
    }
    assert partitions["nvfp4_te"] == partitions["nvfp4_no_rht_all_linears"] == "blackwell"
    assert partitions["ue5m3_b16"] == partitions["bf16"] == "gpu"


def test_a_gpu_sized_dry_run_over_a_plan_made_for_another_configuration_names_the_job_and_the_fix(tmp_path):
    """The paper's training jobs take their time limit and signal margin from the plan on disk; a plan made for the
    CPU-scale config (CPU rows only) has none for them, and the dry run says which job, which file and what to run,
    instead of a KeyError from inside the resource function."""
    from ue5m3.plan.run import COLUMNS

    shutil.copytree(ROOT / "config", tmp_path / "config")
    plan_dir = tmp_path / "results" / "plan"
    plan_dir.mkdir(parents=True)
    with (plan_dir / "plan.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, COLUMNS, restval="")
        writer.writeheader()
        row = {"job": "train_run/main/bf16/seed1", "gpu": "cpu", "run_hours": "0.02", "time_limit_hours": "0"}
        writer.writerow({**row, "signal_margin_minutes": "0", "retries": "0"})
    for name in ("plan.md", "plan.json"):
        (plan_dir / name).write_text("")
    args = ["-n", "--profile", "cluster", "--configfile", "config/paper.yaml", "--directory", str(tmp_path)]
    result = _run("snakemake", *args, "--snakefile", str(ROOT / "Snakefile"))
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert re.search(r"train_run/main/\w+/seed\d+: results/plan/plan\.csv has no GPU row for this job", output), output
    assert "snakemake --forcerun plan" in output and "KeyError" not in output, output[-3000:]


def _job_counts(stdout: str) -> dict[str, int]:
    """Snakemake's job-stats table of a dry run: jobs per rule."""
    counts = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit() and re.fullmatch(r"\w+", parts[0]):
            counts[parts[0]] = int(parts[1])
    return counts


def _nll_outputs(stdout: str) -> set[str]:
    return set(re.findall(r"results/eval/nll/[\w/]+\.json", stdout))


def test_nll_jobs_cover_a_run_or_a_checkpoint_and_make_the_same_results(tmp_path):
    """evaluation.nll_job: run gives one NLL job per run and policy over its 6 checkpoints and one per seed for each
    other sensitivity policy at the last step; checkpoint gives one job per checkpoint; the results are the same
    files either way."""
    per_run = _snakemake("-n", "--forceall")
    counts = _job_counts(per_run.stdout)
    pipeline = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    runs = len(pipeline["training"]["recipes"]) * len(pipeline["training"]["seeds"])
    steps = len(pipeline["evaluation"]["steps"])
    own = pipeline["evaluation"]["policies"][pipeline["evaluation"]["sensitivity_recipe"]]
    others = [p for p in pipeline["evaluation"]["sensitivity_policies"] if p != own]
    sensitivity = len(others) * len(pipeline["training"]["seeds"])
    assert counts["evaluate_nll"] == runs and counts["evaluate_nll_policies"] == sensitivity
    override = tmp_path / "per_checkpoint.yaml"
    override.write_text("evaluation: {nll_job: checkpoint}\n")
    per_checkpoint = _snakemake("-n", "--forceall", "--configfile", str(override))
    counts = _job_counts(per_checkpoint.stdout)
    assert counts["evaluate_nll"] == runs * steps + sensitivity and "evaluate_nll_policies" not in counts
    assert _nll_outputs(per_run.stdout) == _nll_outputs(per_checkpoint.stdout)
    assert len(_nll_outputs(per_run.stdout)) == runs * steps + sensitivity


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


def _section_keys() -> list[tuple[str, ...]]:
    config = _load(CONFIGS[0])
    keys = [(key,) for key in config]
    keys += [(section, key) for section, value in config.items() if isinstance(value, dict) for key in value]
    return keys


def _has_default(key: tuple[str, ...]) -> bool:
    """Whether the dataclass field a top-level or section key sets has a default (ue5m3.pipeline.sections)."""
    import dataclasses

    from ue5m3 import config as configs
    from ue5m3.pipeline import PipelineConfig

    cls = PipelineConfig
    for name in key[:-1]:
        cls = configs.field_types(cls)[name]
        cls = next((a for a in getattr(cls, "__args__", ()) if dataclasses.is_dataclass(a)), cls)
    field = next(f for f in dataclasses.fields(cls) if f.name == key[-1])
    return configs.has_default(field)


@pytest.mark.parametrize("key", _section_keys(), ids="/".join)
def test_schema_requires_exactly_the_keys_without_a_default(key):
    config = copy.deepcopy(_load(CONFIGS[0]))
    section = config
    for name in key[:-1]:
        section = section[name]
    if not isinstance(section, dict):
        pytest.skip(f"{'/'.join(key[:-1])} is null here")
    del section[key[-1]]
    if _has_default(key):
        validate(config, str(SCHEMA))  # its dataclass fills it in
    else:
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
def test_notebook_has_language_info_a_parameters_cell_and_few_thin_code_cells(script):
    notebook = nbformat.read(script.with_suffix(".ipynb"), as_version=4)
    assert notebook.metadata["language_info"]["name"] == "python"  # Snakemake's notebook: needs it
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert len(code) <= MAX_CODE_CELLS
    assert max(len(cell.source.splitlines()) for cell in code) <= MAX_CODE_CELL_LINES
    tagged = [cell for cell in notebook.cells if "parameters" in cell.metadata.get("tags", [])]
    assert len(tagged) == 1


@pytest.mark.parametrize("script", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_markdown_says_what_each_output_shows_against_the_paper(script):
    """The notebook opens with a markdown cell that names the paper and every file it writes (the defaults of its
    parameters cell under figures/), and a markdown cell comes before every code cell that saves a figure."""
    cells = nbformat.read(script.with_suffix(".ipynb"), as_version=4).cells
    opening = cells[0]
    assert opening.cell_type == "markdown" and "paper" in opening.source.lower()
    parameters = next(cell for cell in cells if "parameters" in cell.metadata.get("tags", []))
    outputs = re.findall(r"figures/([\w.]+)", parameters.source)
    assert outputs, "the parameters cell names no figures/ output"
    assert [name for name in outputs if name not in opening.source] == []
    for before, cell in zip(cells, cells[1:], strict=False):
        if cell.cell_type == "code" and "save_figure(" in cell.source:
            assert before.cell_type == "markdown", f"no markdown cell before:\n{cell.source[:200]}"


def test_figures_readme_shows_the_registrys_figures_table():
    from ue5m3 import figures

    assert figures.figures_table() in (ROOT / "figures" / "README.md").read_text()


# --- environments -------------------------------------------------------------------------------------


def _pins(lines) -> dict[str, str]:
    pins = {}
    for line in lines:
        match = re.fullmatch(r"\s*([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^\s#]+)\s*", line)
        if match:
            pins[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = match.group(2)
    return pins


ENV_FILES = sorted((ROOT / "workflow" / "envs").glob("*.yaml"))


def _pip_section(env_file: Path) -> list[str]:
    return next(d["pip"] for d in _load(env_file)["dependencies"] if isinstance(d, dict))


def test_the_conda_env_files_are_found():
    assert [p.name for p in ENV_FILES] == ["cpu.yaml", "cuda.yaml"]


@pytest.mark.parametrize("env_file", ENV_FILES, ids=lambda p: p.name)
def test_conda_env_pins_match_constraints(env_file):
    constraints = _pins((ROOT / "constraints.txt").read_text().splitlines())
    pins = _pins(_pip_section(env_file))
    assert pins, f"{env_file.name} pins nothing"
    assert {name: constraints.get(name) for name in pins} == pins


def _requirement_name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0)).lower()


@pytest.mark.parametrize("env_file", ENV_FILES, ids=lambda p: p.name)
def test_conda_envs_pin_every_dependency_and_hold_no_relative_path(env_file):
    """Snakemake creates an env from a copy under .snakemake/conda/: a relative path (`-e ../..`) would point
    elsewhere there. The env pins every dependency of the package and its pipeline, eval and hub extras (its
    post-deploy script installs the repository with --no-deps), and that script exists."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = {_requirement_name(r) for r in project["dependencies"]}
    wanted |= {_requirement_name(r) for extra in ("pipeline", "eval", "hub") for r in extras[extra]}
    wanted -= {"jupyterlab"}  # for people exploring results, not for jobs
    wanted -= {"transformers", "accelerate"}  # for users' own `lm_eval --model hf` on an export; no rule runs it
    section = _pip_section(env_file)
    assert not [line for line in section if line.startswith(("-e", "--editable", ".", "/")) or "../" in line]
    assert sorted(wanted - set(_pins(section))) == []
    deploy = env_file.with_suffix(".post-deploy.sh")
    script = deploy.read_text()
    assert 'pip install --no-deps -e "$UE5M3_SOURCE"' in script and "ue5m3 fetch-olmes-data" in script
    assert "UE5M3_SOURCE" in (ROOT / "workflow" / "rules" / "common.smk").read_text()


def test_transformer_engine_is_pinned_alike_everywhere():
    import tomllib

    gpu = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    (pinned,) = [r for r in gpu if r.startswith("transformer-engine")]
    version = pinned.split("==")[1]
    assert _pins((ROOT / "constraints.txt").read_text().splitlines())["transformer-engine"] == version
    assert f'"{pinned}"' in (ROOT / "workflow" / "envs" / "cuda.post-deploy.sh").read_text()


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
    pdfs = ["range_codebooks.pdf", "range_headroom.pdf", "range_worked_example.pdf"]
    targets = [f"figures/{name}" for name in pdfs]
    run = ("--cores", "2", "--snakefile", str(ROOT / "Snakefile"), "--directory", str(tmp_path), *targets)
    _snakemake(*run, timeout=600)
    first = {name: (tmp_path / "figures" / name).read_bytes() for name in pdfs}
    assert (tmp_path / "results" / "range_analysis" / "provenance.json").is_file()
    assert (tmp_path / "logs" / "notebooks" / "range_analysis.ipynb").is_file()
    _snakemake(*run, "--forcerun", "range_figures", timeout=600)
    assert {name: (tmp_path / "figures" / name).read_bytes() for name in pdfs} == first


# The whole DAG on the tiny .test/config.yaml, end to end, with the notebooks and the README's commands on its
# results: tests/test_tiny_dag.py; its report in a headless browser: system_tests/test_report.py.


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
