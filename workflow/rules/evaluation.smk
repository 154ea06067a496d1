# Held-out evaluation (paper section 5.3 and the validation figures; experiments spec sections 4 and 7):
# validation NLL per checkpoint under each recipe's inference policy, the policy sensitivity, the checkpoint
# scale-target snapshot, and the figures beside the paper's numbers.


wildcard_constraints:
    step=r"\d+",
    policy="bf16|current_tensor|cold_d50_replay|calibrated_frozen",


rule evaluate_nll:
    """Validation NLL of one checkpoint under one inference policy (held-out windows, FP64 sums)."""
    input:
        result_path("train", "main", "{recipe}", "seed{seed}", "final.json"),
    output:
        result_path(
            "eval", "nll", "{recipe}", "seed{seed}", "step{step}", "{policy}.json"
        ),
    log:
        log_path("eval", "nll", "{recipe}", "seed{seed}", "step{step}", "{policy}.log"),
    benchmark:
        benchmark_path(
            "eval", "nll", "{recipe}", "seed{seed}", "step{step}", "{policy}.tsv"
        )
    conda:
        "../envs/cpu.yaml"
    threads: 1
    params:
        source=source_hash("ue5m3.evaluation.nll"),
        run_dir=subpath(input[0], parent=True),
        orders=replay_orders,
        samples=EVALUATION["bootstrap_samples"],
    shell:
        "OMP_NUM_THREADS={threads} ue5m3 evaluate-nll --run-dir {params.run_dir} --step {wildcards.step} --policy {wildcards.policy} --orders {params.orders} --bootstrap-samples {params.samples} --out {output} > {log} 2>&1"


rule scale_snapshot:
    """The checkpoint scale-target snapshot: raw UE5M3 codes of late down projections' dY block maxima."""
    input:
        result_path("train", "main", "{recipe}", "seed{seed}", "final.json"),
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
        "../envs/cpu.yaml"
    params:
        source=source_hash("ue5m3.evaluation.snapshot"),
        run_dir=subpath(input[0], parent=True),
        out_dir=subpath(output.counts, parent=True),
    shell:
        "ue5m3 scale-snapshot --run-dir {params.run_dir} --out-dir {params.out_dir} > {log} 2>&1"


rule evaluation_figures:
    """Validation-NLL, policy-sensitivity and snapshot figures, with the comparison tables."""
    input:
        nll=nll_results(),
        snapshot_counts=snapshot_counts(),
        snapshot_histograms=snapshot_histograms(),
    output:
        nll=figure_path("validation_nll.pdf"),
        vs_bf16=figure_path("validation_vs_bf16.pdf"),
        sensitivity=figure_path("policy_sensitivity.pdf"),
        snapshot=figure_path("scale_snapshot.pdf"),
        table=figure_path("validation_vs_paper.csv"),
        sensitivity_table=figure_path("policy_sensitivity_vs_paper.csv"),
        snapshot_table=figure_path("scale_snapshot_vs_paper.csv"),
    log:
        notebook=log_path("notebooks", "evaluation.ipynb"),
    conda:
        "../envs/cpu.yaml"
    notebook:
        "../../notebooks/evaluation.ipynb"


rule evaluate_downstream:
    """Downstream accuracy (OLMES-style Core 9 and MMLU, offline) of one checkpoint under one policy."""
    input:
        result_path("train", "main", "{recipe}", "seed{seed}", "final.json"),
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
        "../envs/cpu.yaml"
    threads: 1
    params:
        source=source_hash("ue5m3.evaluation.olmes"),
        run_dir=subpath(input[0], parent=True),
        tasks_dir=downstream_tasks_dir(),
        tasks=EVALUATION["downstream_tasks"],
        examples=downstream_examples_arg(),
    shell:
        "OMP_NUM_THREADS={threads} ue5m3 evaluate-downstream --run-dir {params.run_dir} --step {wildcards.step} --policy {wildcards.policy} --tasks-dir {params.tasks_dir} --tasks {params.tasks} --examples {params.examples} --out {output} > {log} 2>&1"


rule downstream_figures:
    """The downstream figure and its comparison with the paper's aggregates."""
    input:
        downstream_results(),
    output:
        figure=figure_path("downstream.pdf"),
        table=figure_path("downstream_vs_paper.csv"),
    log:
        notebook=log_path("notebooks", "downstream.ipynb"),
    conda:
        "../envs/cpu.yaml"
    notebook:
        "../../notebooks/downstream.ipynb"
