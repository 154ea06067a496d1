"""Helpers for all rule files (config validation and path builders).

All Python logic of the workflow lives here (style guide rule 10); rule files only call these helpers.
"""

import json
import os
from pathlib import Path

from snakemake.utils import validate

from ue5m3 import artifacts, workflow_config

validate(config, "../schemas/config.schema.yaml")
# What the schema cannot see, before any job starts: duplicate keys, every stage's strict loader, every run's
# settings and the cross-references between sections (errors name the key paths).
workflow_config.check_files(workflow.configfiles)
workflow_config.check(
    config, source=" + ".join(map(str, workflow.configfiles)) or "config"
)

# The conda environments' post-deploy scripts (workflow/envs/*.post-deploy.sh) install this repository from here.
os.environ.setdefault("UE5M3_SOURCE", str(workflow.basedir))

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


def benchmark_path(*parts):
    """A path under results/benchmarks/: Snakemake's timing and memory record of a costly job (`benchmark:`)."""
    return result_path("benchmarks", *parts)


def stage_config(dpath):
    """One config section (a dpath such as "identification/grid_control") as the JSON object its CLI verb
    loads with the stage's strict loader (--config); defaults for omitted keys live in the stage's dataclass.
    """
    return json.dumps(lookup(dpath=dpath, within=config), sort_keys=True)


def source_hash(module):
    """The hash of the package source a rule's CLI verb runs (its static import closure): a rule parameter, so
    that Snakemake's params rerun trigger reruns exactly the jobs a source edit affects.
    """
    return artifacts.source_hash(module)


def launcher_command(wildcards, resources):
    """The config's `launcher` with its placeholders filled from the job's own resources (never from SLURM_*
    variables, which the SLURM jobstep plugin strips inside jobs). Placeholders {nodes}, {tasks} and
    {procs_per_node} are explained in ue5m3.workflow_config.launcher."""
    return workflow_config.launcher(config["launcher"], dict(resources.items()))


def env_file(name):
    """A conda environment file of workflow/envs/ (absolute: rules choose it by a function of their wildcards)."""
    return str(Path(workflow.basedir) / "workflow" / "envs" / f"{name}.yaml")


# ----- report -------------------------------------------------------------------------------------------

# name -> (file in figures/, report category, report view): one report item per figure and comparison table.
_SECTIONS = {
    "range": "1 Range of the block-scale formats (paper section 3)",
    "accumulation": "2 FP32 accumulation statistics (paper appendix C)",
    "training": "3 Pretraining (paper sections 7.2-7.3)",
    "validation": "4 Validation loss and scale snapshot (paper sections 5.3, 7.4)",
    "downstream": "5 Downstream evaluation (paper section 7.5)",
    "identification": "6 Emulator identification (paper section 6)",
    "throughput": "7 Throughput ablation (paper section 7.6)",
}
REPORT_ITEMS = {
    name: (
        f"{name}.{kind}",
        _SECTIONS[section],
        f"{name}.{'png' if kind == 'pdf' else 'html'}",
    )
    for section, names in {
        "range": ["range_codebooks", "range_headroom", "range_worked_example"],
        "accumulation": [
            "accumulation_rtz_bias",
            "accumulation_cancellation",
            "accumulation_grid_sweep",
            "accumulation_vs_paper",
        ],
        "training": [
            "training_loss",
            "training_final_window",
            "training_stability",
            "control_override",
            "training_vs_paper",
        ],
        "validation": [
            "validation_nll",
            "validation_vs_bf16",
            "policy_sensitivity",
            "scale_snapshot",
            "validation_vs_paper",
            "policy_sensitivity_vs_paper",
            "scale_snapshot_vs_paper",
        ],
        "downstream": ["downstream", "downstream_vs_paper"],
        "identification": [
            "emulator_identification",
            "emulator_identification_vs_paper",
            "parity",
            "grid_regression_control",
            "grid_regression_control_vs_paper",
        ],
        "throughput": ["throughput_ablation", "throughput_vs_paper"],
    }.items()
    for name in names
    for kind in ["csv" if name.endswith("_vs_paper") or name == "parity" else "pdf"]
}


def report_views():
    """Every report item's view (a PNG per figure, an HTML table per comparison table)."""
    return [result_path("report", view) for _, _, view in REPORT_ITEMS.values()]


def report_sources():
    return [figure_path(source) for source, _, _ in REPORT_ITEMS.values()]


def report_outputs():
    """name -> the view marked for the report, with its caption and category."""
    return {
        item: report(
            result_path("report", view),
            caption=str(Path(workflow.basedir) / "workflow" / "report" / f"{item}.rst"),
            category=category,
        )
        for item, (_, category, view) in REPORT_ITEMS.items()
    }


def report_pairs():
    """`source view` pairs for `ue5m3 render-report-item`."""
    return " ".join(
        f"{figure_path(source)} {result_path('report', view)}"
        for source, _, view in REPORT_ITEMS.values()
    )


def check_report_items():
    """Every figure and table of `rule all` has a report item (with a caption); called once all rules exist."""
    missing = sorted(
        {Path(f).name for f in all_figures()}
        - {source for source, _, _ in REPORT_ITEMS.values()}
    )
    if missing:
        raise ValueError(
            f"figures without a report item (add them to REPORT_ITEMS in common.smk): {missing}"
        )


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
        *rules.throughput_figures.output,
    ]


# ----- data --------------------------------------------------------------------------------------------


def fetched_tokenizer():
    """The tokenizer file and record of rule fetch_tokenizer when the config names a hub tokenizer_source; none
    otherwise (the CPU config trains its BPE offline, or data.tokenizer_path names a file you provide).
    """
    if config["tokenizer_source"] is None:
        return []
    return [config["data"]["tokenizer_path"], tokenizer_record()]


def tokenizer_record():
    """The record of the fetched tokenizer (repository, commit, file, SHA-256 and size)."""
    return result_path("data", "tokenizer_source.json")


def data_part_record(part):
    """The part manifest that `ue5m3 prepare-data --part` writes for one part of the data preparation."""
    return result_path("data", "parts", f"part{part}.json")


def data_part_records():
    """Every part's manifest: the inputs of the merge (data.prepare_parts of them)."""
    return [data_part_record(part) for part in range(config["data"]["prepare_parts"])]


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


def run_is_native(wildcards):
    return (
        workflow_config.run_execution(config, wildcards.group, wildcards.variant)
        == "native_te"
    )


def train_partition(wildcards):
    """A native_te run goes to the Blackwell partition of the config; an emulated one where the profile says."""
    return TRAINING["native_partition"] if run_is_native(wildcards) else ""


def train_env(wildcards):
    return env_file("cuda" if run_is_native(wildcards) else "cpu")


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


# ----- throughput --------------------------------------------------------------------------------------

THROUGHPUT = config["throughput"]


def throughput_outputs(name):
    """One of each run's outputs (throughput.csv or provenance.json), every configured run, in config order."""
    return [result_path("throughput", run, name) for run in THROUGHPUT["runs"]]


def throughput_settings(wildcards):
    """The run's ThroughputConfig fields as JSON (`ue5m3 throughput` loads them strictly)."""
    return json.dumps(
        workflow_config.throughput_settings(config, wildcards.throughput_run),
        sort_keys=True,
    )


def throughput_on_gpu(wildcards):
    return THROUGHPUT["runs"][wildcards.throughput_run]["device"].startswith("cuda")


def throughput_partition(wildcards):
    """A CUDA run goes to its configured partition (default "gpu"; native_te: a Blackwell one); a CPU run anywhere."""
    if not throughput_on_gpu(wildcards):
        return ""
    return THROUGHPUT["runs"][wildcards.throughput_run].get("partition", "gpu")


def throughput_gres(wildcards):
    return "gpu:1" if throughput_on_gpu(wildcards) else ""


def throughput_env(wildcards):
    return env_file("cuda" if throughput_on_gpu(wildcards) else "cpu")
