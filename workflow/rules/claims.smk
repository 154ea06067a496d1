# The paper's claims, decided (paper sections 5-7 and appendices A-C): each claim with the experiment that tests it,
# judged from the results of the other stages by paired statistics over seeds.


rule claims_figures:
    """The claims table (the report's first page) and the claims on one axis."""
    input:
        final_window=summary_table("main", "final_window"),
        control_final_window=summary_table("control", "final_window"),
        nll=nll_results(),
        downstream=downstream_results(),
        throughput=throughput_outputs("throughput.csv"),
        fits=[str(Path(d) / "summary.json") for d in fit_dirs()],
        runs=finals(main_run_dirs()),
    output:
        **figure_outputs("claims_figures"),
    log:
        notebook=log_path("notebooks", "claims.ipynb"),
    conda:
        "../envs/cpu.yaml"
    notebook:
        "../../notebooks/claims.ipynb"
