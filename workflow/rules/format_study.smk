# The block-scale format study (beyond the paper) and the scale telemetry with its early warning (beyond the
# paper (its Proposition 1)): every trained recipe paired per seed with the study's reference arm
# and with BF16, the runs' telemetry and the early warning; tables from the CLI, figures from a notebook. The default
# config runs it on the main runs (seconds); config/study_formats.yaml trains the study's arms through the same rules.


rule format_study:
    """The format study's tables: paired effects, scale telemetry per step and per run, early warnings."""
    input:
        runs=finals(main_run_dirs()),
        final_window=summary_table("main", "final_window"),
    output:
        study=result_path("format_study", "study.csv"),
        telemetry=result_path("format_study", "telemetry.csv"),
        run_telemetry=result_path("format_study", "run_telemetry.csv"),
        warnings=result_path("format_study", "warnings.csv"),
        provenance=result_path("format_study", "provenance.json"),
    log:
        log_path("format_study", "format_study.log"),
    conda:
        "../envs/cpu.yaml"
    params:
        source=source_hash("ue5m3.experiments.format_study"),
        config=stage_config("format_study"),
        runs=main_run_dirs(),
        out_dir=subpath(output.study, parent=True),
    shell:
        "ue5m3 format-study --config {params.config:q} --runs {params.runs} --final-window {input.final_window} "
        "--out-dir {params.out_dir} > {log} 2>&1"


rule format_study_figures:
    """The format study's figure and table, the telemetry figure and the early-warning table."""
    input:
        study=rules.format_study.output.study,
        telemetry=rules.format_study.output.telemetry,
        warnings=rules.format_study.output.warnings,
        provenance=rules.format_study.output.provenance,
        runs=finals(main_run_dirs()),
    output:
        **figure_outputs("format_study_figures"),
    log:
        notebook=log_path("notebooks", "format_study.ipynb"),
    conda:
        "../envs/cpu.yaml"
    notebook:
        "../../notebooks/format_study.ipynb"
