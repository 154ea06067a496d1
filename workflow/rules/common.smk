"""Helpers of every file of rules: the config loaded once, paths, each job's --config, resources, and the figures.

All Python logic of the workflow lives here (style guide rule 10); rule files only call these helpers. The config
is validated against the schema generated from ue5m3.pipeline.sections, then loaded and checked as a whole
(ue5m3.pipeline.load: every stage's loader, every run's settings, the cross-references), before any job starts.
"""

import json
import re
import shlex
import os
import sys
from pathlib import Path

from snakemake.utils import validate

from ue5m3 import artifacts
from ue5m3 import report as ue5m3_report
from ue5m3 import config as configs
from ue5m3 import pipeline
from ue5m3.evaluation.inference import InferencePolicy
from ue5m3.identify.oracles import OracleConfig
from ue5m3.identify.parity import ParityConfig
from ue5m3.identify.run import WitnessConfig
from ue5m3 import figures, stages
from ue5m3.pipeline import jobs
from ue5m3.data import hub
from ue5m3.plan import run as plan_stage
from snakemake.exceptions import WorkflowError

validate(config, "../schemas/config.schema.yaml")
pipeline.check_files(workflow.configfiles)
PIPELINE = pipeline.load(config, source=" + ".join(map(str, workflow.configfiles)) or "config")
# Every default filled in (from the dataclasses, their one home): what lookup() and the report's captions read.
config.update(configs.dump(PIPELINE))

# The conda environments' post-deploy scripts (workflow/envs/*.post-deploy.sh) install this repository from here.
os.environ.setdefault("UE5M3_SOURCE", str(workflow.basedir))
# The rules call `ue5m3`, and the notebook rules Jupyter, from PATH: the tools installed beside the Python that runs
# Snakemake come first, so `.venv/bin/snakemake ...` works with nothing exported (a job's conda environment, where
# one is used, puts its own first).
os.environ.update(PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))

TRAINING, CONTROL = PIPELINE.training, PIPELINE.control
EVALUATION, IDENT, THROUGHPUT = (
    PIPELINE.evaluation,
    PIPELINE.identification,
    PIPELINE.throughput,
)
CONTROL_VARIANTS = jobs.CONTROL_VARIANTS
POLICIES = "|".join(p.value for p in InferencePolicy)


# ----- paths, sources and each job's --config ----------------------------------------------------------


def result_path(*parts):
    """A path under the configured results directory."""
    return str(Path(PIPELINE.results_dir).joinpath(*parts))


def figure_path(name):
    """A path under the configured figures directory."""
    return str(Path(PIPELINE.figures_dir) / name)


def log_path(*parts):
    """A path under logs/ (one log per rule, and executed notebooks)."""
    return str(Path("logs").joinpath(*parts))


def benchmark_path(*parts):
    """A path under results/benchmarks/: Snakemake's timing and memory record of a costly job (`benchmark:`)."""
    return result_path("benchmarks", *parts)


def stage_config(dpath):
    """One config section (a dpath such as "identification/grid_control") as the JSON object its CLI verb
    loads with the stage's strict loader (--config)."""
    return json.dumps(lookup(dpath=dpath, within=config), sort_keys=True)


def as_json(settings):
    return json.dumps(settings, sort_keys=True)


def source_hash(module):
    """The hash of the package source a rule's CLI verb runs (its static import closure): a rule parameter, so
    that Snakemake's params rerun trigger reruns exactly the jobs a source edit affects."""
    return artifacts.source_hash(module)


def launcher_command(wildcards, resources):
    """The config's `launcher` with its placeholders filled from the job's own resources (never from SLURM_*
    variables, which the SLURM jobstep plugin strips inside jobs; ue5m3.pipeline.jobs.launcher)."""
    return jobs.launcher(PIPELINE.launcher, dict(resources.items()))


# ----- where a job runs: one helper for every rule ------------------------------------------------------


def _gpu_job(kind, wildcards):
    """(partition, GPUs) of a job that runs on a GPU partition named in the config; None for any other job (the
    profile places it). A native training run's GPUs come from the profile (several nodes)."""
    if kind == "train":
        native = jobs.run_execution(PIPELINE, wildcards.group, wildcards.variant) == "native_te"
        return (TRAINING.native_partition, 0) if native else None
    if kind == "evaluation":  # NLL, downstream and the snapshot: the evaluation section's GPUs, else CPU jobs
        return (EVALUATION.partition, EVALUATION.gpus) if EVALUATION.gpus else None
    if kind == "fit":
        fit = IDENT.fits[wildcards.fit]
        return (fit.partition, 1) if fit.on_hardware else None
    if kind == "parity":
        entry = IDENT.parity[wildcards.name]
        return (entry.partition, 1) if entry.native else None
    if kind == "throughput":
        run = THROUGHPUT.runs[wildcards.throughput_run]
        return (run.partition, 1) if run.on_gpu else None
    raise ValueError(f"unknown job kind {kind!r}")


def partition(kind):
    """The `slurm_partition` resource of a rule's jobs ("": the profile's choice)."""

    def of(wildcards):
        job = _gpu_job(kind, wildcards)
        return job[0] if job else ""

    return of


def gres(kind):
    """The `gres` resource of a rule's jobs ("gpu:N", or "": none, or the profile's)."""

    def of(wildcards):
        job = _gpu_job(kind, wildcards)
        return f"gpu:{job[1]}" if job and job[1] else ""

    return of


def environment(kind):
    """The conda environment of a rule's jobs: the CUDA one on a GPU partition, else the CPU one."""

    def of(wildcards):
        name = "cuda" if _gpu_job(kind, wildcards) else "cpu"
        return str(Path(workflow.basedir) / "workflow" / "envs" / f"{name}.yaml")

    return of


# ----- figures and their report views (ue5m3.figures) ----------------------------------------


def caption_file(name):
    """The report caption of one figure, written from its registry entry (a Jinja template) into .snakemake/."""
    path = Path(".snakemake", "ue5m3-captions", f"{name}.rst").resolve()  # the working directory's
    text = f"{figures.figure(name).caption}\n"
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(path)


def figure_outputs(rule):
    """A notebook rule's outputs: each figure or table of the registry it draws, and that item's report view
    (`<key>_view`, written by the same job, so `snakemake --report report.html <figure>` holds it)."""
    outputs = {}
    for item in figures.figures_of(rule):
        outputs[item.key] = figure_path(item.file)
        outputs[f"{item.key}_view"] = report(
            result_path("report", item.view),
            caption=caption_file(item.name),
            category=stages.category(item.stage),
            # one label: the report makes a second label a toggle in a category of two items (claims, grid
            # control), and its view then looks up an item it does not have
            labels={"item": f"{item.title} ({item.file})"},
        )
    return outputs


def report_front_page():
    """The report's front page: workflow/report/workflow.rst, then the claims table (figures/claims.csv) once it
    exists, written into .snakemake/ (the verdict first, numbers rounded for reading: ue5m3.report)."""
    text = (Path(workflow.basedir) / "workflow" / "report" / "workflow.rst").read_text()
    claims = Path(figure_path("claims.csv"))
    path = Path(".snakemake", "ue5m3-report", "front_page.rst").resolve()
    page = f"{text}\n{ue5m3_report.claims_section(claims)}\n"
    if not path.is_file() or path.read_text() != page:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(page)
    return str(path)


def all_figures():
    """Every figure and table of the registry: the inputs of `rule all`."""
    return [figure_path(item.file) for item in figures.FIGURES]


def report_views():
    """Every figure's report view."""
    return [result_path("report", item.view) for item in figures.FIGURES]


# ----- data --------------------------------------------------------------------------------------------


def fetched_tokenizer():
    """The tokenizer file and record of rule fetch_tokenizer when the config names a hub tokenizer_source; none
    otherwise (the CPU config trains its BPE offline, or data.tokenizer_path names a file you provide)."""
    if PIPELINE.tokenizer_source is None:
        return []
    return [PIPELINE.data.tokenizer_path, tokenizer_record()]


def tokenizer_record():
    """The record of the fetched tokenizer (repository, commit, file, SHA-256 and size)."""
    return result_path("data", "tokenizer_source.json")


HUB_DATA = bool(hub.hub_uris(PIPELINE.data))


def staged_data_record():
    return str(Path(jobs.staging_dir(PIPELINE)) / "staged.json")


def staged_data():
    """The record of the staged hub files (rule stage_data), an input of the preparation jobs; none without hub URIs."""
    return [staged_data_record()] if HUB_DATA else []


def data_part_record(part):
    """The part manifest that `ue5m3 prepare-data --part` writes for one part of the data preparation."""
    return result_path("data", "parts", f"part{part}.json")


def data_part_records():
    """Every part's manifest: the inputs of the merge (data.prepare_parts of them)."""
    return [data_part_record(part) for part in range(PIPELINE.data.prepare_parts)]


# ----- training ----------------------------------------------------------------------------------------


def run_dir(group, variant, seed):
    """results/train/{group}/{variant}/seed{seed}: checkpoints, metrics and final.json of one run."""
    return jobs.run_dir(PIPELINE, group, variant, seed)


def main_run_dirs():
    return [run_dir("main", r, s) for r in TRAINING.recipes for s in TRAINING.seeds]


def control_run_dirs():
    return [run_dir("control", v, s) for v in CONTROL_VARIANTS for s in CONTROL.seeds]


def finals(run_dirs):
    return [str(Path(d) / "final.json") for d in run_dirs]


def main_run_final(wildcards):
    """The final.json (rule train_run's output) of the main run a job evaluates."""
    return expand(
        rules.train_run.output[0],
        group="main",
        variant=wildcards.recipe,
        seed=wildcards.seed,
    )


def summary_runs(wildcards):
    """The run directories one training summary covers: the main runs or the T = 2048 control's."""
    return main_run_dirs() if wildcards.group == "main" else control_run_dirs()


def summary_finals(wildcards):
    return finals(summary_runs(wildcards))


def summary_table(group, table):
    return expand(getattr(rules.training_summary.output, table), group=group)[0]


def run_settings(wildcards):
    """The JSON settings of one run for `ue5m3 train-config` (validated there, strictly)."""
    settings = jobs.run_settings(
        PIPELINE, wildcards.group, wildcards.variant, wildcards.seed
    )
    return as_json(settings)


# ----- evaluation --------------------------------------------------------------------------------------


def nll_result(recipe, seed, step, policy):
    path = ("eval", "nll", recipe, f"seed{seed}", f"step{step}", f"{policy}.json")
    return result_path(*path)


def nll_results():
    """Every validation-NLL result: each recipe's policy at every evaluated checkpoint, plus the sensitivity
    of the proposed recipe to the inference policy at the last checkpoint."""
    wanted = [
        (recipe, seed, step, EVALUATION.policies[recipe].value)
        for recipe in TRAINING.recipes
        for seed in TRAINING.seeds
        for step in EVALUATION.steps
    ]
    if EVALUATION.sensitivity_recipe in TRAINING.recipes:
        wanted += [
            (EVALUATION.sensitivity_recipe, seed, max(EVALUATION.steps), policy.value)
            for seed in TRAINING.seeds
            for policy in EVALUATION.sensitivity_policies
        ]
    return sorted({nll_result(*item) for item in wanted})


def nll_checkpoint_arguments(wildcards, output):
    """`--step S --out O` for each checkpoint one NLL job evaluates (evaluation.nll_job: run)."""
    return " ".join(
        f"--step {step} --out {shlex.quote(str(out))}"
        for step, out in zip(EVALUATION.steps, output, strict=True)
    )


def sensitivity_constraints():
    """The wildcards of the sensitivity evaluations (the sensitivity recipe's last checkpoint under each policy
    other than its own), so that rule evaluate_nll_policies matches nothing else."""
    own = EVALUATION.policies.get(EVALUATION.sensitivity_recipe)
    others = [p.value for p in EVALUATION.sensitivity_policies if p is not own]
    return {
        "recipe": re.escape(EVALUATION.sensitivity_recipe),
        "step": str(max(EVALUATION.steps)),
        "policy": "|".join(re.escape(p) for p in others) or "(?!)",  # (?!) matches nothing
    }


def snapshot_dirs():
    seed = TRAINING.seeds[0]
    return [
        result_path("eval", "snapshot", recipe, f"seed{seed}")
        for recipe in EVALUATION.snapshot_recipes
    ]


def snapshot_tables(name):
    return [str(Path(d) / f"{name}.csv") for d in snapshot_dirs()]


def downstream_tasks_dir():
    """The lm-eval task dir shared by every downstream evaluation (one per subsample size)."""
    n = EVALUATION.downstream.examples
    return result_path("eval", "downstream", "tasks", f"n{n}" if n else "all")


def downstream_result(recipe, seed, step, policy):
    path = ("eval", "downstream", recipe, f"seed{seed}", f"step{step}", f"{policy}.json")
    return result_path(*path)


def downstream_results():
    """Each downstream recipe (that is also trained) under its policy, every seed, at the last evaluated step."""
    return [
        downstream_result(
            recipe, seed, max(EVALUATION.steps), EVALUATION.policies[recipe].value
        )
        for recipe in EVALUATION.downstream_recipes
        if recipe in TRAINING.recipes
        for seed in TRAINING.seeds
    ]


# ----- identification ----------------------------------------------------------------------------------


def corpus_path(name):
    return result_path("identify", "corpora", f"{name}.safetensors")


def probes_config(wildcards):
    """The --config of `ue5m3 make-probes`: the corpus and the witness GEMM (ProbesConfig)."""
    witness = IDENT.witness
    return as_json(
        {
            "corpus": configs.dump(IDENT.corpora[wildcards.corpus]),
            "witness": None if witness is None else jobs.job_config(witness, WitnessConfig),
        }
    )


def witness_run():
    """The run the witness GEMM is mined from (none without a witness)."""
    w = IDENT.witness
    return [] if w is None else [run_dir(w.group, w.variant, w.seed)]


def witness_final(wildcards):
    """The witness run's final.json, so that its checkpoint exists before the corpus is made."""
    return finals(witness_run())


def witness_option(wildcards):
    return " ".join(f"--witness-run {d}" for d in witness_run())


def oracle_config(wildcards):
    """The --config of `ue5m3 record-oracle` (OracleConfig): the fit's oracle."""
    return as_json(jobs.job_config(IDENT.fits[wildcards.fit], OracleConfig))


def candidates_config(wildcards):
    """The --config of `ue5m3 fit-emulator`: the fit's candidate grid, or the section's default one."""
    grid = IDENT.fits[wildcards.fit].candidates or IDENT.candidates
    return as_json(configs.dump(grid))


def fit_corpus(wildcards):
    return corpus_path(IDENT.fits[wildcards.fit].corpus)


def fit_dirs():
    return [result_path("identify", "fits", fit) for fit in IDENT.fits]


def parity_reports():
    return [result_path("identify", "parity", f"{name}.json") for name in IDENT.parity]


def parity_run_settings(wildcards):
    """A TrainConfig for the parity run (`ue5m3 train-config` validates it)."""
    return as_json(jobs.parity_settings(PIPELINE, wildcards.name))


def parity_config(wildcards):
    """The --config of `ue5m3 parity` (ParityConfig): the two backends, the steps and the batch size."""
    return as_json(jobs.job_config(IDENT.parity[wildcards.name], ParityConfig))


# ----- evaluation and throughput job configs -----------------------------------------------------------


def nll_config():
    return as_json(configs.dump(EVALUATION.nll))


def downstream_config():
    return as_json(configs.dump(EVALUATION.downstream))


def throughput_outputs(name):
    """One of each run's outputs (throughput.csv or provenance.json), every configured run, in config order."""
    return [result_path("throughput", run, name) for run in THROUGHPUT.runs]


def throughput_settings(wildcards):
    """The run's ThroughputConfig fields as JSON (`ue5m3 throughput` loads them strictly)."""
    return as_json(jobs.throughput_settings(PIPELINE, wildcards.throughput_run))


# ----- the plan: training jobs checked and sized before they are submitted --------------------------------


def planned_run(wildcards):
    """The plan (an input of every training job): raises, naming the numbers, when the plan refuses the job."""
    plan_csv = checkpoints.plan.get().output.plan
    name = jobs.plan_job_name(wildcards.group, wildcards.variant, wildcards.seed)
    reason = plan_stage.refusal(plan_stage.read_plan(plan_csv), name)
    if reason:
        raise WorkflowError(
            f"{name}: not submitted, the plan refuses it: {reason}. See {plan_csv}; change the run's placement "
            f"(nodes, gpus_per_node, partition), its memory settings or the plan section's budget."
        )
    return plan_csv


def _planned(resource, group):
    def of(wildcards, input):
        name = jobs.plan_job_name(group, wildcards.variant, wildcards.seed)
        sized = plan_stage.job_resources(plan_stage.read_plan(input.plan), name)
        if not sized:  # a plan made for another configuration (a dry run reads the plan already on disk)
            raise WorkflowError(
                f"{name}: {input.plan} has no GPU row for this job: it was planned for another configuration; "
                f"remake it (snakemake --forcerun plan) before sizing this run"
            )
        if resource == "slurm_extra":
            return jobs.training_slurm_extra(sized["signal_margin"])
        return sized[resource]

    return of


def training_resources(group):
    """The resources of a training rule's jobs: a CPU section's are the profile's (its partition from the
    execution); a GPU section's nodes and GPUs are its own, one torchrun per node, and its time limit and signal
    margin the plan's."""
    section = TRAINING if group == "main" else CONTROL
    if not section.gpus_per_node:
        return {"slurm_partition": partition("train")}
    return {
        "slurm_partition": lambda wildcards: (
            TRAINING.native_partition
            if jobs.run_execution(PIPELINE, group, wildcards.variant) == "native_te"
            else section.partition
        ),
        "nodes": section.nodes,
        "tasks": section.nodes,
        "gres": f"gpu:{section.gpus_per_node}",
        "runtime": _planned("runtime", group),
        "slurm_extra": _planned("slurm_extra", group),
    }


def training_retries(group):
    """Resubmissions of a GPU section's jobs: the plan's budget (it refuses a run needing more jobs); a CPU
    section's: the profile's (None)."""
    section = TRAINING if group == "main" else CONTROL
    return PIPELINE.plan.max_jobs_per_run - 1 if section.gpus_per_node else None
