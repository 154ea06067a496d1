# Emulator identification (paper section 6 and appendix B; gemm spec sections 3-4): probe corpora, oracle
# recordings (emulators here, hardware oracles on GPU nodes), fits of the candidate grid with the paper's tables,
# backend parity, the tiny grid-regression control (paper appendix C), and their figures.


wildcard_constraints:
    corpus=r"[A-Za-z0-9_]+",
    fit=r"[A-Za-z0-9_]+",
    name=r"[A-Za-z0-9_]+",


rule identify_corpus:
    """A probe corpus for emulator identification (witnesses mined from the control run's checkpoint)."""
    input:
        witness_final,
    output:
        corpus_path("{corpus}"),
    log:
        log_path("identify", "corpus_{corpus}.log"),
    conda:
        "../envs/cpu.yaml"
    params:
        source=source_hash("ue5m3.identify.run"),
        config=probes_config,
        witness_run=witness_option,
    shell:
        "ue5m3 make-probes --config {params.config:q} {params.witness_run} --out {output} > {log} 2>&1"


rule identify_record:
    """The oracle's outputs on a probe corpus (a hardware oracle on its GPU, or an emulator)."""
    input:
        fit_corpus,
    output:
        result_path("identify", "fits", "{fit}", "labels.safetensors"),
    log:
        log_path("identify", "record_{fit}.log"),
    conda:
        environment("fit")
    resources:
        slurm_partition=partition("fit"),
        gres=gres("fit"),
    params:
        source=source_hash("ue5m3.identify.oracles"),
        config=oracle_config,
    shell:
        "ue5m3 record-oracle --config {params.config:q} --corpus {input} --out {output} > {log} 2>&1"


rule identify_fit:
    """Fit of the candidate GEMM output models to the recorded oracle outputs."""
    input:
        corpus=fit_corpus,
        labels=rules.identify_record.output,
    output:
        matches=result_path("identify", "fits", "{fit}", "matches.csv"),
        tables=result_path("identify", "fits", "{fit}", "tables.csv"),
        summary=result_path("identify", "fits", "{fit}", "summary.json"),
    log:
        log_path("identify", "fit_{fit}.log"),
    benchmark:
        benchmark_path("identify", "fits", "{fit}.tsv")
    conda:
        "../envs/cpu.yaml"
    params:
        source=source_hash("ue5m3.identify.run"),
        config=candidates_config,
        out_dir=subpath(output.summary, parent=True),
    shell:
        "ue5m3 fit-emulator --config {params.config:q} --corpus {input.corpus} --labels {input.labels} --out {params.out_dir} > {log} 2>&1"


rule identify_parity_config:
    """The training config of one parity comparison's run."""
    output:
        result_path("identify", "parity", "configs", "{name}.yaml"),
    log:
        log_path("identify", "parity_config_{name}.log"),
    conda:
        "../envs/cpu.yaml"
    params:
        source=source_hash("ue5m3.training.config"),
        settings=parity_run_settings,
    shell:
        "ue5m3 train-config --config {params.settings:q} --out {output} > {log} 2>&1"


rule identify_parity:
    """Parity of two GEMM backends on one training run (losses and gradients compared)."""
    input:
        rules.identify_parity_config.output,
    output:
        result_path("identify", "parity", "{name}.json"),
    log:
        log_path("identify", "parity_{name}.log"),
    conda:
        environment("parity")
    resources:
        slurm_partition=partition("parity"),
        gres=gres("parity"),
    params:
        source=source_hash("ue5m3.identify.parity"),
        config=parity_config,
    shell:
        "ue5m3 parity --config {params.config:q} --run-config {input} --out {output} > {log} 2>&1"


rule grid_control:
    """The grid-regression control at the paper's size: match counts per final-lattice denominator."""
    output:
        runs=result_path("identify", "grid_control", "runs.csv"),
        curves=result_path("identify", "grid_control", "curves.csv"),
        summary=result_path("identify", "grid_control", "summary.json"),
    log:
        log_path("identify", "grid_control.log"),
    benchmark:
        benchmark_path("identify", "grid_control.tsv")
    conda:
        "../envs/cpu.yaml"
    threads: 1
    params:
        source=source_hash("ue5m3.identify.grid_control"),
        config=stage_config("identification/grid_control"),
        out_dir=subpath(output.summary, parent=True),
    shell:
        "OMP_NUM_THREADS={threads} ue5m3 grid-control --config {params.config:q} --out-dir {params.out_dir} > {log} 2>&1"


rule identification_figures:
    """The identification figure and tables (fits and parity)."""
    input:
        summaries=[str(Path(d) / "summary.json") for d in fit_dirs()],
        tables=[str(Path(d) / "tables.csv") for d in fit_dirs()],
        parity=parity_reports(),
    output:
        **figure_outputs("identification_figures"),
    log:
        notebook=log_path("notebooks", "emulator_identification.ipynb"),
    conda:
        "../envs/cpu.yaml"
    notebook:
        "../../notebooks/emulator_identification.ipynb"


rule grid_control_figures:
    """The grid-regression control figure and its comparison with the paper."""
    input:
        runs=rules.grid_control.output.runs,
        curves=rules.grid_control.output.curves,
        summary=rules.grid_control.output.summary,
    output:
        **figure_outputs("grid_control_figures"),
    log:
        notebook=log_path("notebooks", "grid_regression_control.ipynb"),
    conda:
        "../envs/cpu.yaml"
    notebook:
        "../../notebooks/grid_regression_control.ipynb"
