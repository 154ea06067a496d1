# The plan (issue on paper scale; beyond the paper's text): every GPU-sized job of the pipeline counted on the meta
# device against the GPUs its partition may hold, before any is submitted. Training jobs wait for it: a job that
# does not fit or cannot finish within plan.max_jobs_per_run jobs is refused naming the numbers, and the training
# rules take their time limit and signal margin from it (common.smk: planned_run, training_resources).


checkpoint plan:
    """Per job and GPU type: the per-rank memory terms and their peak, the collectives, the step time, the jobs."""
    output:
        plan=result_path("plan", "plan.csv"),
        table=result_path("plan", "plan.md"),
        provenance=result_path("plan", "plan.json"),
    log:
        log_path("plan", "plan.log"),
    conda:
        "../envs/cpu.yaml"
    params:
        source=source_hash("ue5m3.plan.run"),
        config=as_json(jobs.plan_config(PIPELINE)),
        out_dir=subpath(output.plan, parent=True),
    shell:
        "ue5m3 plan --config {params.config:q} --out-dir {params.out_dir} > {log} 2>&1"
