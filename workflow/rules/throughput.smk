# The native NVFP4 execution ablation (paper section 7.6 (table 10); experiments spec section 6): model-body
# tokens/s of the BF16 body and each recipe, one job per configured run (native TE on a Blackwell GPU, emulated on
# any device), and the figure beside the paper's native numbers.


rule throughput:
    """Model-body throughput of one configured run: the BF16 body, then each recipe (native TE fails closed off Blackwell)."""
    output:
        table=result_path("throughput", "{throughput_run}", "throughput.csv"),
        provenance=result_path("throughput", "{throughput_run}", "provenance.json"),
    log:
        log_path("throughput", "{throughput_run}.log"),
    wildcard_constraints:
        throughput_run=r"[A-Za-z0-9_]+",
    conda:
        environment("throughput")
    threads: 1
    resources:
        slurm_partition=partition("throughput"),
        gres=gres("throughput"),
    params:
        source=source_hash("ue5m3.experiments.throughput"),
        settings=throughput_settings,
        out_dir=subpath(output.table, parent=True),
    shell:
        "OMP_NUM_THREADS={threads} ue5m3 throughput --config {params.settings:q} --out-dir {params.out_dir} > {log} 2>&1"


rule throughput_figures:
    """The throughput-ablation figure and its comparison with the paper's table 10."""
    input:
        tables=throughput_outputs("throughput.csv"),
        provenances=throughput_outputs("provenance.json"),
    output:
        **figure_outputs("throughput_figures"),
    log:
        notebook=log_path("notebooks", "throughput.ipynb"),
    conda:
        "../envs/cpu.yaml"
    notebook:
        "../../notebooks/throughput.ipynb"
