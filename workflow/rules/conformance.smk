# The FP4 conformance matrix (beyond the paper): every installed peer implementation against this one
# on one corpus of tensors, one judged cell per operation and peer, with the peers' versions and the
# counterexamples.


rule conformance:
    """The matrix: conformance.csv, conformance.json (peers' versions, corpus SHA-256) and the counterexamples."""
    output:
        matrix=result_path("conformance", "conformance.csv"),
        provenance=result_path("conformance", "conformance.json"),
        counterexamples=directory(result_path("conformance", "counterexamples")),
    log:
        log_path("conformance", "conformance.log"),
    conda:
        "../envs/cpu.yaml"
    params:
        source=source_hash("ue5m3.conformance.run"),
        config=stage_config("conformance"),
        out_dir=subpath(output.matrix, parent=True),
    shell:
        "ue5m3 conformance --config {params.config:q} --out-dir {params.out_dir} > {log} 2>&1"


rule conformance_figures:
    """The matrix as a figure and as the report's table."""
    input:
        matrix=rules.conformance.output.matrix,
        provenance=rules.conformance.output.provenance,
    output:
        **figure_outputs("conformance_figures"),
    log:
        notebook=log_path("notebooks", "conformance.ipynb"),
    conda:
        "../envs/cpu.yaml"
    notebook:
        "../../notebooks/conformance.ipynb"
