# The Snakemake report (`make report`, or `snakemake --report report.html` after a run): every figure as a PNG
# and every comparison table as an HTML table, each with its caption (workflow/report/<name>.rst) in the
# category of its paper section. The PDFs and CSVs in figures/ stay the canonical outputs; these are their
# report views (a browser shows neither a PDF nor a CSV inline). One local job renders them all.

check_report_items()


rule report_views:
    """The report's view of every figure and comparison table, each marked for the report with its caption."""
    input:
        report_sources(),
    output:
        **report_outputs(),
    log:
        log_path("report", "report_views.log"),
    localrule: True
    conda:
        "../envs/cpu.yaml"
    params:
        source=source_hash("ue5m3.report"),
        pairs=report_pairs(),
    shell:
        "ue5m3 render-report-item {params.pairs} > {log} 2>&1"
