# Reproduces "UE5M3 FP4 Block Scaling for Stable Language Model Pretraining".
#   CPU scale:   snakemake --cores 2                 (or `make reproduce`)
#   paper scale: snakemake --profile cluster --configfile config/paper.yaml
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/range_analysis.smk"
include: "workflow/rules/accumulation.smk"
include: "workflow/rules/training.smk"
include: "workflow/rules/evaluation.smk"
include: "workflow/rules/identification.smk"


rule all:
    default_target: True
    input:
        all_figures(),
