# Pretraining (paper sections 5-6, experiments spec sections 1-3): data, one run per (recipe, seed), the
# T = 2048 override control, summaries and the training figures. Training rules declare only final.json as
# output; checkpoints live beside it, so a re-run after an interruption resumes from the newest one.


wildcard_constraints:
    group="main|control",
    seed=r"\d+",


rule prepare_data:
    output:
        result_path("data", "prepared.json"),
    log:
        log_path("data", "prepare_data.log"),
    conda:
        "../../envs/cpu.yaml"
    params:
        settings=data_settings(),
    shell:
        "ue5m3 prepare-data --config-json {params.settings:q} --out {output} > {log} 2>&1"


rule train_config:
    output:
        result_path("train", "{group}", "{variant}", "seed{seed}", "config.yaml"),
    log:
        log_path("train", "{group}", "{variant}", "seed{seed}", "train_config.log"),
    conda:
        "../../envs/cpu.yaml"
    params:
        settings=run_settings,
    shell:
        "ue5m3 train-config --json {params.settings:q} --out {output} > {log} 2>&1"


rule train_run:
    input:
        config=rules.train_config.output,
        data=rules.prepare_data.output,
    output:
        result_path("train", "{group}", "{variant}", "seed{seed}", "final.json"),
    log:
        log_path("train", "{group}", "{variant}", "seed{seed}", "train.log"),
    conda:
        "../../envs/cpu.yaml"
    threads: 1
    params:
        launcher=config["launcher"],
    shell:
        "{params.launcher} train --config {input.config} --threads {threads} > {log} 2>&1"


rule training_summary:
    input:
        finals(main_run_dirs()),
    output:
        curves=result_path("train", "summary", "main", "curves.csv"),
        final_window=result_path("train", "summary", "main", "final_window.csv"),
        by_recipe=result_path("train", "summary", "main", "by_recipe.csv"),
    log:
        log_path("train", "training_summary.log"),
    conda:
        "../../envs/cpu.yaml"
    params:
        runs=main_run_dirs(),
        window=TRAINING["final_window"],
        smoothing=TRAINING["smoothing_steps"],
        out_dir=subpath(output.curves, parent=True),
    shell:
        "ue5m3 summarize-training --runs {params.runs} --out-dir {params.out_dir} --final-window {params.window} --smoothing {params.smoothing} > {log} 2>&1"


rule control_summary:
    input:
        finals(control_run_dirs()),
    output:
        curves=result_path("train", "summary", "control", "curves.csv"),
        final_window=result_path("train", "summary", "control", "final_window.csv"),
        by_recipe=result_path("train", "summary", "control", "by_recipe.csv"),
    log:
        log_path("train", "control_summary.log"),
    conda:
        "../../envs/cpu.yaml"
    params:
        runs=control_run_dirs(),
        window=TRAINING["final_window"],
        smoothing=TRAINING["smoothing_steps"],
        out_dir=subpath(output.curves, parent=True),
    shell:
        "ue5m3 summarize-training --runs {params.runs} --out-dir {params.out_dir} --final-window {params.window} --smoothing {params.smoothing} > {log} 2>&1"


rule training_figures:
    input:
        curves=rules.training_summary.output.curves,
        final_window=rules.training_summary.output.final_window,
        by_recipe=rules.training_summary.output.by_recipe,
        control_curves=rules.control_summary.output.curves,
        control_final_window=rules.control_summary.output.final_window,
    output:
        loss=figure_path("training_loss.pdf"),
        final_window=figure_path("training_final_window.pdf"),
        stability=figure_path("training_stability.pdf"),
        control=figure_path("control_override.pdf"),
        table=figure_path("training_vs_paper.csv"),
    log:
        notebook=log_path("notebooks", "training.ipynb"),
    conda:
        "../../envs/cpu.yaml"
    notebook:
        "../../notebooks/training.ipynb"
