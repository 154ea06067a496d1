# Held-out evaluation (experiments spec sections 4, 5 and 7): validation NLL per checkpoint under each recipe's
# inference policy (paper section 7.4), its sensitivity to the policy (paper appendix A), the checkpoint
# scale-target snapshot (paper section 5.3), downstream accuracy (paper section 7.5), and their figures.


wildcard_constraints:
    step=r"\d+",
    policy=POLICIES,


if EVALUATION.nll_job == "run":

    rule evaluate_nll:
        """Validation NLL of every evaluated checkpoint of one run under one inference policy, in one process (the
        held-out windows read once), one result per checkpoint (evaluation.nll_job: run)."""
        input:
            main_run_final,
        output:
            [nll_result("{recipe}", "{seed}", step, "{policy}") for step in EVALUATION.steps],
        log:
            log_path("eval", "nll", "{recipe}", "seed{seed}", "{policy}.log"),
        benchmark:
            benchmark_path("eval", "nll", "{recipe}", "seed{seed}", "{policy}.tsv")
        conda:
            environment("evaluation")
        threads: 1
        resources:
            slurm_partition=partition("evaluation"),
            gres=gres("evaluation"),
        params:
            source=source_hash("ue5m3.evaluation.nll"),
            config=nll_config(),
            run_dir=subpath(input[0], parent=True),
            checkpoints=nll_checkpoint_arguments,
        shell:
            "OMP_NUM_THREADS={threads} ue5m3 evaluate-nll --config {params.config:q} --run-dir {params.run_dir} --policy {wildcards.policy} {params.checkpoints} > {log} 2>&1"

    rule evaluate_nll_policies:
        """Validation NLL of the sensitivity recipe's last checkpoint under each other inference policy (paper
        appendix A): one checkpoint per job, not the run's every one."""
        input:
            main_run_final,
        output:
            nll_result("{recipe}", "{seed}", "{step}", "{policy}"),
        log:
            log_path("eval", "nll", "{recipe}", "seed{seed}", "step{step}", "{policy}.log"),
        benchmark:
            benchmark_path(
                "eval", "nll", "{recipe}", "seed{seed}", "step{step}", "{policy}.tsv"
            )
        wildcard_constraints:
            **sensitivity_constraints(),
        conda:
            environment("evaluation")
        threads: 1
        resources:
            slurm_partition=partition("evaluation"),
            gres=gres("evaluation"),
        params:
            source=source_hash("ue5m3.evaluation.nll"),
            config=nll_config(),
            run_dir=subpath(input[0], parent=True),
        shell:
            "OMP_NUM_THREADS={threads} ue5m3 evaluate-nll --config {params.config:q} --run-dir {params.run_dir} --step {wildcards.step} --policy {wildcards.policy} --out {output} > {log} 2>&1"

    ruleorder: evaluate_nll_policies > evaluate_nll

else:

    rule evaluate_nll:
        """Validation NLL of one checkpoint under one inference policy (evaluation.nll_job: checkpoint)."""
        input:
            main_run_final,
        output:
            nll_result("{recipe}", "{seed}", "{step}", "{policy}"),
        log:
            log_path("eval", "nll", "{recipe}", "seed{seed}", "step{step}", "{policy}.log"),
        benchmark:
            benchmark_path(
                "eval", "nll", "{recipe}", "seed{seed}", "step{step}", "{policy}.tsv"
            )
        conda:
            environment("evaluation")
        threads: 1
        resources:
            slurm_partition=partition("evaluation"),
            gres=gres("evaluation"),
        params:
            source=source_hash("ue5m3.evaluation.nll"),
            config=nll_config(),
            run_dir=subpath(input[0], parent=True),
        shell:
            "OMP_NUM_THREADS={threads} ue5m3 evaluate-nll --config {params.config:q} --run-dir {params.run_dir} --step {wildcards.step} --policy {wildcards.policy} --out {output} > {log} 2>&1"


rule scale_snapshot:
    """The checkpoint scale-target snapshot: raw UE5M3 codes of late down projections' dY block maxima."""
    input:
        main_run_final,
    output:
        counts=result_path("eval", "snapshot", "{recipe}", "seed{seed}", "counts.csv"),
        histograms=result_path(
            "eval", "snapshot", "{recipe}", "seed{seed}", "histograms.csv"
        ),
    log:
        log_path("eval", "snapshot", "{recipe}", "seed{seed}.log"),
    benchmark:
        benchmark_path("eval", "snapshot", "{recipe}", "seed{seed}.tsv")
    conda:
        environment("evaluation")
    resources:
        slurm_partition=partition("evaluation"),
        gres=gres("evaluation"),
    params:
        source=source_hash("ue5m3.evaluation.snapshot"),
        config=stage_config("evaluation/snapshot"),
        run_dir=subpath(input[0], parent=True),
        out_dir=subpath(output.counts, parent=True),
    shell:
        "ue5m3 scale-snapshot --config {params.config:q} --run-dir {params.run_dir} --out-dir {params.out_dir} > {log} 2>&1"


rule evaluation_figures:
    """Validation-NLL, policy-sensitivity and snapshot figures, with the comparison tables."""
    input:
        nll=nll_results(),
        snapshot_counts=snapshot_tables("counts"),
        snapshot_histograms=snapshot_tables("histograms"),
    output:
        **figure_outputs("evaluation_figures"),
    log:
        notebook=log_path("notebooks", "evaluation.ipynb"),
    conda:
        "../envs/cpu.yaml"
    notebook:
        "../../notebooks/evaluation.ipynb"


rule evaluate_downstream:
    """Downstream accuracy (OLMES-style Core 9 and MMLU, offline) of one checkpoint under one policy."""
    input:
        main_run_final,
    output:
        downstream_result("{recipe}", "{seed}", "{step}", "{policy}"),
    log:
        log_path(
            "eval",
            "downstream",
            "{recipe}",
            "seed{seed}",
            "step{step}",
            "{policy}.log",
        ),
    benchmark:
        benchmark_path(
            "eval",
            "downstream",
            "{recipe}",
            "seed{seed}",
            "step{step}",
            "{policy}.tsv",
        )
    conda:
        environment("evaluation")
    threads: 1
    resources:
        slurm_partition=partition("evaluation"),
        gres=gres("evaluation"),
    params:
        source=source_hash("ue5m3.evaluation.olmes"),
        config=downstream_config(),
        run_dir=subpath(input[0], parent=True),
        tasks_dir=downstream_tasks_dir(),
    shell:
        "OMP_NUM_THREADS={threads} ue5m3 evaluate-downstream --config {params.config:q} --run-dir {params.run_dir} --step {wildcards.step} --policy {wildcards.policy} --tasks-dir {params.tasks_dir} --out {output} > {log} 2>&1"


rule downstream_figures:
    """The downstream figure and its comparison with the paper's aggregates."""
    input:
        downstream_results(),
    output:
        **figure_outputs("downstream_figures"),
    log:
        notebook=log_path("notebooks", "downstream.ipynb"),
    conda:
        "../envs/cpu.yaml"
    notebook:
        "../../notebooks/downstream.ipynb"
