# Statistical consequences of the probe-matched FP32 accumulation (paper appendix C): tables from the CLI,
# figures from a notebook.


rule accumulation_stats:
    output:
        rtz_bias=result_path("accumulation", "rtz_bias.csv"),
        regression=result_path("accumulation", "regression.csv"),
        cancellation=result_path("accumulation", "cancellation.csv"),
        grid_sweep=result_path("accumulation", "grid_sweep.csv"),
        provenance=result_path("accumulation", "provenance.json"),
    log:
        log_path("accumulation", "accumulation_stats.log"),
    conda:
        "../../envs/cpu.yaml"
    params:
        seed=config["accumulation"]["seed"],
        slice_width=config["accumulation"]["slice_width"],
        grid=config["accumulation"]["grid"],
        dots=config["accumulation"]["dots"],
        k=config["accumulation"]["k"],
        distributions=config["accumulation"]["distributions"],
        operands=config["accumulation"]["operands"],
        gain_rho=config["accumulation"]["gain_rho"],
        regression_examples=config["accumulation"]["regression_examples"],
        regression_features=config["accumulation"]["regression_features"],
        cancellation_trials=config["accumulation"]["cancellation_trials"],
        cancellation_partials=config["accumulation"]["cancellation_partials"],
        cancellation_scales=config["accumulation"]["cancellation_scales"],
        sigmas=config["accumulation"]["sigmas"],
        sweep_sigma=config["accumulation"]["sweep_sigma"],
        sweep_scale=config["accumulation"]["sweep_scale"],
        sweep_grids=config["accumulation"]["sweep_grids"],
        out_dir=subpath(output.rtz_bias, parent=True),
    shell:
        "ue5m3 accumulation-stats --seed {params.seed} --slice-width {params.slice_width} --grid {params.grid} --dots {params.dots} --k {params.k} --distributions {params.distributions} --operands {params.operands} --gain-rho {params.gain_rho} --regression-examples {params.regression_examples} --regression-features {params.regression_features} --cancellation-trials {params.cancellation_trials} --cancellation-partials {params.cancellation_partials} --cancellation-scales {params.cancellation_scales} --sigmas {params.sigmas} --sweep-sigma {params.sweep_sigma} --sweep-scale {params.sweep_scale} --sweep-grids {params.sweep_grids} --out-dir {params.out_dir} > {log} 2>&1"


rule accumulation_figures:
    input:
        rtz_bias=rules.accumulation_stats.output.rtz_bias,
        regression=rules.accumulation_stats.output.regression,
        cancellation=rules.accumulation_stats.output.cancellation,
        grid_sweep=rules.accumulation_stats.output.grid_sweep,
    output:
        rtz_bias=figure_path("accumulation_rtz_bias.pdf"),
        cancellation=figure_path("accumulation_cancellation.pdf"),
        grid_sweep=figure_path("accumulation_grid_sweep.pdf"),
        comparison=figure_path("accumulation_vs_paper.csv"),
    log:
        notebook=log_path("notebooks", "accumulation_statistics.ipynb"),
    conda:
        "../../envs/cpu.yaml"
    notebook:
        "../../notebooks/accumulation_statistics.ipynb"
