# Pretraining (paper sections 7.1-7.3; experiments spec sections 1-3): data, one run per (recipe, seed), the
# T = 2048 override control (paper section 5.2), summaries and the training figures. Training rules declare only
# final.json as output; checkpoints live beside it, so a re-run after an interruption resumes from the newest one.


wildcard_constraints:
    group="main|control",
    seed=r"\d+",


# A hub tokenizer (tokenizer_source: the paper's Nemotron-H tokenizer) fetched at its pinned commit into
# data.tokenizer_path, its SHA-256 checked when pinned and recorded; a local rule, as compute nodes may lack internet.
# A config without one fetches nothing.
if PIPELINE.tokenizer_source is not None:

    localrules:
        fetch_tokenizer,

    rule fetch_tokenizer:
        output:
            tokenizer=PIPELINE.data.tokenizer_path,
            record=tokenizer_record(),
        log:
            log_path("data", "fetch_tokenizer.log"),
        conda:
            "../envs/cpu.yaml"
        params:
            source=source_hash("ue5m3.data.hub"),
            config=stage_config("tokenizer_source"),
        shell:
            "ue5m3 fetch-tokenizer --config {params.config:q} --out {output.tokenizer} --record {output.record} > {log} 2>&1"


# The files of the data config's pinned hf:// URIs downloaded into <data_dir>/hub with their SHA-256 (a local rule:
# compute nodes may lack internet); the preparation jobs read these copies, never the hub. A config without hub URIs
# stages nothing.
if HUB_DATA:

    localrules:
        stage_data,

    rule stage_data:
        output:
            staged_data_record(),
        log:
            log_path("data", "stage_data.log"),
        conda:
            "../envs/cpu.yaml"
        params:
            source=source_hash("ue5m3.data.hub"),
            config=stage_config("data"),
            staging_dir=jobs.staging_dir(PIPELINE),
        shell:
            "ue5m3 stage-data --config {params.config:q} --staging-dir {params.staging_dir} --record {output} > {log} 2>&1"


# The data preparation in data.prepare_parts parallel jobs (one per part of the input files), then a merge into
# the prepared data; the bytes, and so every run's identity, are the same for every part count (docs/data.md).
rule prepare_data_part:
    """One part of the data preparation: its input units read, tokenized and written as token shards."""
    input:
        fetched_tokenizer(),
        staged_data(),
    output:
        data_part_record("{part}"),
    log:
        log_path("data", "prepare_data_part{part}.log"),
    benchmark:
        benchmark_path("data", "part{part}.tsv")
    wildcard_constraints:
        part=r"\d+",
    conda:
        "../envs/cpu.yaml"
    params:
        source=source_hash("ue5m3.data.parts"),
        config=as_json(jobs.prepare_data_settings(PIPELINE)),
    shell:
        "ue5m3 prepare-data --config {params.config:q} --part {wildcards.part} --out {output} > {log} 2>&1"


rule prepare_data:
    """The merge of every part into the corpus and its manifest (the same bytes as one job)."""
    input:
        data_part_records(),
    output:
        result_path("data", "prepared.json"),
    log:
        log_path("data", "prepare_data.log"),
    conda:
        "../envs/cpu.yaml"
    params:
        source=source_hash("ue5m3.data.build"),
        config=as_json(jobs.prepare_data_settings(PIPELINE)),
    shell:
        "ue5m3 merge-data --config {params.config:q} --out {output} {input} > {log} 2>&1"


rule train_config:
    """The validated config of one training run."""
    output:
        result_path("train", "{group}", "{variant}", "seed{seed}", "config.yaml"),
    log:
        log_path("train", "{group}", "{variant}", "seed{seed}", "train_config.log"),
    conda:
        "../envs/cpu.yaml"
    params:
        source=source_hash("ue5m3.training.config"),
        settings=run_settings,
    shell:
        "ue5m3 train-config --config {params.settings:q} --out {output} > {log} 2>&1"


rule train_run:
    """One training run (recipe, seed): resumes from its newest verified checkpoint; restarts if its settings changed."""
    input:
        config=rules.train_config.output,
        data=rules.prepare_data.output,
        # the plan: a job it refuses is never submitted; its time limit and signal margin come from it
        plan=planned_run,
    output:
        result_path("train", "{group}", "{variant}", "seed{seed}", "final.json"),
    log:
        log_path("train", "{group}", "{variant}", "seed{seed}", "train.log"),
    wildcard_constraints:
        group="main",
    conda:
        environment("train")
    threads: 1
    retries: training_retries("main")
    resources:
        # GPU runs: the section's nodes and GPUs, the plan's time limit and signal; native_te runs on the
        # Blackwell partition (they fail closed elsewhere)
        **training_resources("main"),
    params:
        source=source_hash("ue5m3.training.loop"),
        launcher=launcher_command,
    shell:
        "OMP_NUM_THREADS={threads} {params.launcher} train --config {input.config} > {log} 2>&1"


# The override control (the paper's 350M model) as a rule of its own, placed by its own section (control: one
# 4-GPU node in config/paper.yaml) and planned apart from the 8B runs.
use rule train_run as train_control with:
    wildcard_constraints:
        group="control",
    retries: training_retries("control")
    resources:
        **training_resources("control"),


rule training_summary:
    """Curves, final-window means and stability counters of a group of runs."""
    input:
        summary_finals,
    output:
        curves=result_path("train", "summary", "{group}", "curves.csv"),
        final_window=result_path("train", "summary", "{group}", "final_window.csv"),
        by_recipe=result_path("train", "summary", "{group}", "by_recipe.csv"),
    log:
        log_path("train", "summary_{group}.log"),
    conda:
        "../envs/cpu.yaml"
    params:
        source=source_hash("ue5m3.experiments.training_summary"),
        config=stage_config("training/summary"),
        runs=summary_runs,
        out_dir=subpath(output.curves, parent=True),
    shell:
        "ue5m3 summarize-training --config {params.config:q} --runs {params.runs} --out-dir {params.out_dir} > {log} 2>&1"


rule training_figures:
    """The training figures and their comparison with the paper."""
    input:
        curves=summary_table("main", "curves"),
        final_window=summary_table("main", "final_window"),
        by_recipe=summary_table("main", "by_recipe"),
        control_curves=summary_table("control", "curves"),
        control_final_window=summary_table("control", "final_window"),
        # each run's final.json: the settings the figures' captions state
        runs=finals(main_run_dirs()),
        control_runs=finals(control_run_dirs()),
    output:
        **figure_outputs("training_figures"),
    log:
        notebook=log_path("notebooks", "training.ipynb"),
    conda:
        "../envs/cpu.yaml"
    notebook:
        "../../notebooks/training.ipynb"
