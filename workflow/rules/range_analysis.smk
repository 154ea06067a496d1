# Dynamic range of the block-scale formats (paper sections 4.1 and 5.2): tables from the CLI, figures from a
# notebook.


rule range_analysis:
    """Codebooks, headroom and the worked example of the block-scale formats (analytic)."""
    output:
        formats=result_path("range_analysis", "formats.csv"),
        headroom=result_path("range_analysis", "headroom.csv"),
        worked_example=result_path("range_analysis", "worked_example.csv"),
        codebooks=result_path("range_analysis", "codebooks.csv"),
        provenance=result_path("range_analysis", "provenance.json"),
    log:
        log_path("range_analysis", "range_analysis.log"),
    conda:
        "../envs/cpu.yaml"
    params:
        source=source_hash("ue5m3.experiments.range_analysis"),
        config=stage_config("range_analysis"),
        out_dir=subpath(output.formats, parent=True),
    shell:
        "ue5m3 range-analysis --config {params.config:q} --out-dir {params.out_dir} > {log} 2>&1"


rule range_figures:
    """The range-analysis figures."""
    input:
        formats=rules.range_analysis.output.formats,
        codebooks=rules.range_analysis.output.codebooks,
        headroom=rules.range_analysis.output.headroom,
        worked_example=rules.range_analysis.output.worked_example,
        provenance=rules.range_analysis.output.provenance,
    output:
        **figure_outputs("range_figures"),
    log:
        notebook=log_path("notebooks", "range_analysis.ipynb"),
    conda:
        "../envs/cpu.yaml"
    notebook:
        "../../notebooks/range_analysis.ipynb"
