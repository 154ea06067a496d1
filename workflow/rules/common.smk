"""Helpers for all rule files (config validation and path builders).

All Python logic of the workflow lives here (style guide rule 10); rule files only call these helpers.
"""

import json
from pathlib import Path

from snakemake.utils import validate

from ue5m3 import artifacts, workflow_config

validate(config, "../schemas/config.schema.yaml")
# What the schema cannot see, before any job starts: duplicate keys, every stage's strict loader, every run's
# settings and the cross-references between sections (errors name the key paths).
workflow_config.check_files(workflow.configfiles)
workflow_config.check(config, source=" + ".join(map(str, workflow.configfiles)) or "config")

RESULTS_DIR = Path(config["results_dir"])
FIGURES_DIR = Path(config["figures_dir"])
LOGS_DIR = Path("logs")


def result_path(*parts):
    """A path under the configured results directory."""
    return str(RESULTS_DIR.joinpath(*parts))


def figure_path(name):
    """A path under the configured figures directory."""
    return str(FIGURES_DIR / name)


def log_path(*parts):
    """A path under logs/ (one log per rule, and executed notebooks)."""
    return str(LOGS_DIR.joinpath(*parts))


def stage_config(dpath):
    """One config section (a dpath such as "identification/grid_control") as the JSON object its CLI verb
    loads with the stage's strict loader (--config); defaults for omitted keys live in the stage's dataclass.
    """
    return json.dumps(lookup(dpath=dpath, within=config), sort_keys=True)


def source_hash(module):
    """The hash of the package source a rule's CLI verb runs (its static import closure): a rule parameter, so
    that Snakemake's params rerun trigger reruns exactly the jobs a source edit affects."""
    return artifacts.source_hash(module)


def launcher_command(wildcards, resources):
    """The config's `launcher` with its placeholders filled from the job's own resources (never from SLURM_*
    variables, which the SLURM jobstep plugin strips inside jobs). Placeholders {nodes}, {tasks} and
    {procs_per_node} are explained in ue5m3.workflow_config.launcher."""
    return workflow_config.launcher(config["launcher"], dict(resources.items()))


def env_file(name):
    """A conda environment file of workflow/envs/ (absolute: rules choose it by a function of their wildcards)."""
    return str(Path(workflow.basedir) / "workflow" / "envs" / f"{name}.yaml")


def all_figures():
    """Every final figure: the inputs of `rule all`. Add each new figure rule here."""
    return [
        *rules.range_figures.output,
        *rules.accumulation_figures.output,
        *rules.training_figures.output,
        *rules.evaluation_figures.output,
        *rules.downstream_figures.output,
        *rules.identification_figures.output,
        *rules.grid_control_figures.output,
    ]


# ----- training ----------------------------------------------------------------------------------------

TRAINING = config["training"]
CONTROL = config["control"]
CONTROL_VARIANTS = workflow_config.CONTROL_VARIANTS


def run_dir(group, variant, seed):
    """results/train/{group}/{variant}/seed{seed}: checkpoints, metrics and final.json of one run."""
    return workflow_config.run_dir(config, group, variant, seed)


def main_run_dirs():
    return [
        run_dir("main", recipe, seed)
        for recipe in TRAINING["recipes"]
        for seed in TRAINING["seeds"]
    ]


def control_run_dirs():
    return [
        run_dir("control", variant, seed)
        for variant in CONTROL_VARIANTS
        for seed in CONTROL["seeds"]
    ]


def finals(run_dirs):
    return [str(Path(d) / "final.json") for d in run_dirs]


def summary_runs(wildcards):
    """The run directories one training summary covers: the main runs or the T = 2048 control's."""
    return main_run_dirs() if wildcards.group == "main" else control_run_dirs()


def summary_finals(wildcards):
    return finals(summary_runs(wildcards))


def summary_table(group, table):
    return result_path("train", "summary", group, f"{table}.csv")


def run_settings(wildcards):
    """The JSON settings of one run for `ue5m3 train-config` (validated there, strictly)."""
    settings = workflow_config.run_settings(
        config, wildcards.group, wildcards.variant, wildcards.seed
    )
    return json.dumps(settings, sort_keys=True)


# ----- evaluation --------------------------------------------------------------------------------------

EVALUATION = config["evaluation"]


def nll_result(recipe, seed, step, policy):
    return result_path(
        "eval", "nll", recipe, f"seed{seed}", f"step{step}", f"{policy}.json"
    )


def nll_results():
    """Every validation-NLL result: each recipe's policy at every evaluated checkpoint, plus the sensitivity
    of the proposed recipe to the inference policy at the last checkpoint."""
    wanted = [
        (recipe, seed, step, EVALUATION["policies"][recipe])
        for recipe in TRAINING["recipes"]
        for seed in TRAINING["seeds"]
        for step in EVALUATION["steps"]
    ]
    if EVALUATION["sensitivity_recipe"] in TRAINING["recipes"]:
        last = max(EVALUATION["steps"])
        wanted += [
            (EVALUATION["sensitivity_recipe"], seed, last, policy)
            for seed in TRAINING["seeds"]
            for policy in EVALUATION["sensitivity_policies"]
        ]
    return sorted({nll_result(*item) for item in wanted})


def replay_orders(wildcards):
    return EVALUATION["replay_orders"] if wildcards.policy == "cold_d50_replay" else 1


def snapshot_dirs():
    seed = TRAINING["seeds"][0]
    return [
        result_path("eval", "snapshot", recipe, f"seed{seed}")
        for recipe in EVALUATION["snapshot_recipes"]
    ]


def snapshot_counts():
    return [str(Path(d) / "counts.csv") for d in snapshot_dirs()]


def snapshot_histograms():
    return [str(Path(d) / "histograms.csv") for d in snapshot_dirs()]


def downstream_tasks_dir():
    """The lm-eval task dir shared by every downstream evaluation (one per subsample size)."""
    n = EVALUATION["downstream_examples"]
    return result_path("eval", "downstream", "tasks", f"n{n}" if n else "all")


def downstream_result(recipe, seed, step, policy):
    return result_path(
        "eval", "downstream", recipe, f"seed{seed}", f"step{step}", f"{policy}.json"
    )


def downstream_results():
    """Each downstream recipe (that is also trained) under its policy, every seed, at the last evaluated step."""
    last = max(EVALUATION["steps"])
    return [
        downstream_result(recipe, seed, last, EVALUATION["policies"][recipe])
        for recipe in EVALUATION["downstream_recipes"]
        if recipe in TRAINING["recipes"]
        for seed in TRAINING["seeds"]
    ]


def downstream_examples_arg():
    n = EVALUATION["downstream_examples"]
    return "all" if n is None else n


# ----- identification ----------------------------------------------------------------------------------

IDENT = config["identification"]


def is_hardware(fit):
    return not IDENT["fits"][fit]["oracle"].startswith("emulator:")


def corpus_path(name):
    return result_path("identify", "corpora", f"{name}.safetensors")


def corpus_settings(wildcards):
    """The corpus's CorpusConfig fields as JSON (validated by `ue5m3 make-probes`)."""
    return json.dumps(IDENT["corpora"][wildcards.corpus], sort_keys=True)


def witness_inputs(wildcards):
    """The witness run's final.json, so that its checkpoint exists before the corpus is made."""
    w = IDENT["witness"]
    return (
        []
        if w is None
        else [str(Path(run_dir(w["group"], w["variant"], w["seed"])) / "final.json")]
    )


def witness_args(wildcards):
    w = IDENT["witness"]
    if w is None:
        return ""
    return (
        f"--witness-run {run_dir(w['group'], w['variant'], w['seed'])} "
        f"--witness-module {w['module']} --witness-sequences {w['sequences']}"
    )


def fit_oracle(wildcards):
    return IDENT["fits"][wildcards.fit]["oracle"]


def fit_corpus(wildcards):
    return corpus_path(IDENT["fits"][wildcards.fit]["corpus"])


def fit_partition(wildcards):
    """A hardware oracle records on its configured GPU partition; an emulator anywhere ("" = the default)."""
    fit = IDENT["fits"][wildcards.fit]
    return fit.get("partition", "gpu") if is_hardware(wildcards.fit) else ""


def fit_gres(wildcards):
    return "gpu:1" if is_hardware(wildcards.fit) else ""


def fit_env(wildcards):
    return env_file("cuda" if is_hardware(wildcards.fit) else "cpu")


def candidate_args(wildcards):
    """The fit's candidate grid as `ue5m3 fit-emulator` flags (null -> none)."""
    grid = IDENT["fits"][wildcards.fit].get("candidates", IDENT["candidates"])

    def words(values):
        return " ".join("none" if v is None else str(v) for v in values)

    flags = [
        f"--{key.replace('_', '-')} {words(grid[key])}"
        for key in (
            "slice_widths",
            "partial_bits",
            "roundings",
            "promotions",
            "final_grids",
        )
    ]
    flags.append("--extra " + " ".join(grid["extra"]))
    return " ".join(flags)


def fit_dirs():
    return [result_path("identify", "fits", fit) for fit in IDENT["fits"]]


def parity_is_native(name):
    entry = IDENT["parity"][name]
    return "native_te" in (entry["backend_a"], entry["backend_b"])


def parity_reports():
    return [
        result_path("identify", "parity", f"{name}.json") for name in IDENT["parity"]
    ]


def parity_settings(wildcards):
    """A TrainConfig for the parity run (`ue5m3 train-config` validates it)."""
    return json.dumps(
        workflow_config.parity_settings(config, wildcards.name), sort_keys=True
    )


def parity_value(key):
    """A params function reading one key of the parity entry named by the wildcard."""
    return lambda wildcards: IDENT["parity"][wildcards.name][key]


def parity_partition(wildcards):
    """A native_te parity run goes to its configured GPU partition; an emulated one anywhere."""
    if not parity_is_native(wildcards.name):
        return ""
    return IDENT["parity"][wildcards.name].get("partition", "gpu")


def parity_gres(wildcards):
    return "gpu:1" if parity_is_native(wildcards.name) else ""


def parity_env(wildcards):
    return env_file("cuda" if parity_is_native(wildcards.name) else "cpu")
