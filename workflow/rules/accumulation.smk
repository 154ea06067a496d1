# Statistical consequences of the probe-matched FP32 accumulation (paper appendix C): tables from the CLI, figures
# from a notebook.


rule accumulation_stats:
    """Appendix C statistics of the probe-matched FP32 accumulation against exact sums (RTZ bias, cancellation, grid sweep)."""
    output:
        rtz_bias=result_path("accumulation", "rtz_bias.csv"),
        regression=result_path("accumulation", "regression.csv"),
        cancellation=result_path("accumulation", "cancellation.csv"),
        grid_sweep=result_path("accumulation", "grid_sweep.csv"),
        provenance=result_path("accumulation", "provenance.json"),
    log:
        log_path("accumulation", "accumulation_stats.log"),
    benchmark:
        benchmark_path("accumulation_stats.tsv")
    conda:
        "../envs/cpu.yaml"
    params:
        source=source_hash("ue5m3.experiments.accumulation"),
        config=stage_config("accumulation"),
        out_dir=subpath(output.rtz_bias, parent=True),
    shell:
        "ue5m3 accumulation-stats --config {params.config:q} --out-dir {params.out_dir} > {log} 2>&1"


rule accumulation_figures:
    """The accumulation figures and their comparison with the paper's appendix C table."""
    input:
        rtz_bias=rules.accumulation_stats.output.rtz_bias,
        regression=rules.accumulation_stats.output.regression,
        cancellation=rules.accumulation_stats.output.cancellation,
        grid_sweep=rules.accumulation_stats.output.grid_sweep,
        provenance=rules.accumulation_stats.output.provenance,
    output:
        **figure_outputs("accumulation_figures"),
    log:
        notebook=log_path("notebooks", "accumulation_statistics.ipynb"),
    conda:
        "../envs/cpu.yaml"
    notebook:
        "../../notebooks/accumulation_statistics.ipynb"
