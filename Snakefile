# Reproduces "UE5M3 FP4 Block Scaling for Stable Language Model Pretraining".
#   CPU scale:   snakemake --cores 2                 (or `make reproduce`)
#   paper scale: snakemake --profile cluster --configfile config/paper.yaml
#   the report:  make report                          (snakemake --report report.html after a run)
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"


# the front page: workflow/report/workflow.rst and the claims table (common.smk)
report: report_front_page()


include: "workflow/rules/range_analysis.smk"
include: "workflow/rules/accumulation.smk"
include: "workflow/rules/plan.smk"
include: "workflow/rules/training.smk"
include: "workflow/rules/evaluation.smk"
include: "workflow/rules/identification.smk"
include: "workflow/rules/throughput.smk"
include: "workflow/rules/conformance.smk"
include: "workflow/rules/claims.smk"
include: "workflow/rules/format_study.smk"


# Run on the submitting machine, never sent to SLURM as jobs: the targets, the run configs, the summaries and
# the figure notebooks, which also write each figure's report view (seconds each).
localrules:
    all,
    plan,
    train_config,
    identify_parity_config,
    training_summary,
    range_figures,
    accumulation_figures,
    training_figures,
    evaluation_figures,
    downstream_figures,
    identification_figures,
    grid_control_figures,
    throughput_figures,
    conformance_figures,
    claims_figures,
    format_study,
    format_study_figures,


rule all:
    default_target: True
    input:
        all_figures(),
        report_views(),
