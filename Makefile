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
$(STAMP): pyproject.toml hack/tpusim/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]' -e hack/tpusim
	touch $@

.PHONY: install dev
install: $(STAMP) ## Create .venv with the operator and its test tools
dev: install ## Same as install

# ---------------------------------------------------------------- checks
.PHONY: test test-static test-unit test-harness test-chart test-contract lint lint-imports verify verify-crds verify-manifests sync-crds manifests image-check chart-lint
test: test-static test-unit test-harness image-check test-contract test-chart test-e2e test-realnode ## Every tier, fastest first: static checks, unit, the harness's own tests, image install check, Ray contract, chart (helm), e2e on the local cluster, real node

test-static: lint verify-crds ## Static stage (a minute, no Go tools): ruff, strict mypy, the import contracts, the CRD copies

test-unit: $(STAMP) ## Unit tests (no cluster and no Go tools)
	$(PY) -m pytest tests/unit -q -n 2

test-chart: tools $(STAMP) verify-manifests ## The chart rendered by helm (the helm that `make tools` builds), manifests/ in step with it
	$(PY) -m pytest tests/chart -q

# The harness (tpusim, the benchmark) is not the product: its tests are a tier of
# their own, next to its code, and like that code they never import the operator.
test-harness: tools $(STAMP) ## Unit tests of the test harness: tpusim and the benchmark (seconds; KWOK's stages from `make tools`)
	$(PY) -m pytest hack/tpusim/tests hack/bench/tests -q

test-contract: $(STAMP) ## Ray contract tier: our TPU identity through real Ray (local Ray processes, ~1 min) and Ray autoscaler v2 patches vs the harness autoscaler
	$(PY) -m pytest tests/contract -q

lint: $(STAMP) lint-imports ## ruff over the whole tree and strict mypy (the product, tpusim, the benchmark, the real-node and e2e tiers, and the unit tests' fake against kube.ClusterApi and their builders)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy tests/support/fake_kube.py tests/support/builders.py
	$(VENV)/bin/mypy hack/bench
	$(VENV)/bin/mypy tests/realnode tests/e2e

lint-imports: $(STAMP) ## The layering rules of docs/architecture.md ([tool.importlinter] in pyproject.toml)
	PYTHONPATH=operator $(VENV)/bin/lint-imports

sync-crds: ## Copy crds/ (the one source) into the chart and manifests/
	$(PYTHON) hack/sync_crds.py

manifests: sync-crds ## Render manifests/ (plain YAML + kustomization.yaml) from the chart's default values
	$(PYTHON) hack/render_manifests.py

image-check: $(STAMP) ## Lint the Dockerfile (hadolint) and run its install steps in a fresh venv (no Docker needed)
	bash hack/image_check.sh

chart-lint: ## helm lint --strict the chart (default values and the cert-manager variant)
	H=$$(bash hack/tools-dir.sh)/bin/helm; $$H lint --strict charts/tpuslice-operator && \
	  $$H lint --strict charts/tpuslice-operator --set webhook.certManager.enabled=true --set metrics.serviceMonitor.enabled=true

verify: verify-crds verify-manifests ## Regenerate every generated file (CRD copies, manifests/) and fail if anything changed

verify-crds: $(STAMP) ## The CRD copies in the chart and manifests/ equal crds/ (no Go tools)
	$(PY) hack/sync_crds.py
	$(PY) hack/sync_crds.py --check
	git diff --exit-code -- charts/tpuslice-operator/crds manifests/crds
	@test -z "$$(git status --porcelain -- charts manifests)" || \
	  { git status --short -- charts manifests; echo "untracked generated files: commit them"; exit 1; }

verify-manifests: tools $(STAMP) ## manifests/ equals the chart rendered by helm
	$(PY) hack/render_manifests.py
	$(PY) hack/render_manifests.py --check
	git diff --exit-code -- charts manifests
	@test -z "$$(git status --porcelain -- charts manifests)" || \
	  { git status --short -- charts manifests; echo "untracked generated files: commit them"; exit 1; }

# ---------------------------------------------------------------- local simulated GKE cluster
# Binaries are built from Go modules into a cache keyed by hack/versions.env
# (hack/tools-dir.sh prints it); a second `make tools` is a no-op.
DEV_CLUSTER := .dev-cluster

.PHONY: tools dev-cluster dev-cluster-real realnode-cleanup dev-cluster-down dev-cluster-status test-e2e
tools: ## Build kube-*, etcd, kwok, ray-operator, helm and Kueue once (cold: minutes on 2 cores)
	bash hack/build-tools.sh

dev-cluster: tools $(STAMP) ## Start the local cluster with default TPU pools in the background
	$(PY) -m tpusim --dir $(DEV_CLUSTER) up

dev-cluster-real: tools $(STAMP) realnode-deps ## Dev cluster plus one real kubelet node (root; see docs/local-cluster.md)
	$(PY) -m tpusim --dir $(DEV_CLUSTER) up --real-node

realnode-cleanup: $(STAMP) ## Undo a crashed real node's host changes from its recorded state
	$(PY) -m tpusim --dir $(DEV_CLUSTER) cleanup-host

dev-cluster-down: $(STAMP) ## Stop the cluster started by dev-cluster
	$(PY) -m tpusim --dir $(DEV_CLUSTER) down

dev-cluster-status: $(STAMP) ## Components and node pools of the dev cluster
	$(PY) -m tpusim --dir $(DEV_CLUSTER) status

test-e2e: tools $(STAMP) ## e2e tier on a fresh local cluster (or TPUSLICE_E2E_KUBECONFIG)
	$(PY) -m pytest tests/e2e -q -n 2 --dist loadfile --durations=25

# The real-node tier: a real kubelet + containerd node joins the local cluster and
# runs the operator from the chart, with the image built here by buildah (root;
# installs Debian's containerd, runc, CNI plugins, buildah, debootstrap, dnsmasq).
.PHONY: test-realnode realnode-deps image
realnode-deps: ## Install the real node's Debian packages (root, apt-get; only what is missing)
	bash hack/realnode-deps.sh

test-realnode: tools $(STAMP) realnode-deps ## Real-node tier: the chart's operator in a real pod on a real kubelet (root)
	$(PY) -m pytest tests/realnode -q --durations=15

image: $(STAMP) ## Build the operator image (docker if a daemon answers, else buildah on a local base)
	bash hack/image.sh

# The image's dependencies: requirements.lock pins every runtime dependency of the
# wheel with hashes; the Dockerfile installs only those files. Not run by `make test`
# (needs PyPI); tests/unit/test_lock.py checks the lock against pyproject.toml.
LOCK_ARGS ?=
.PHONY: lock
lock: ## Regenerate requirements.lock from pyproject.toml (uv in a throwaway venv; LOCK_ARGS=--upgrade for the newest releases)
	bash hack/lock.sh $(LOCK_ARGS)

# ---------------------------------------------------------------- benchmark
# Not part of `make test`: starts its own local cluster, minutes (small) to an hour (large).
SCALE ?= small
BENCH_ARGS ?=
BENCH_PLOT ?= docs/bench-scaling.svg

.PHONY: bench bench-plot
bench: tools $(STAMP) ## Operator vs KubeRay on the local cluster (SCALE=small|medium|large, BENCH_ARGS=--profile); .bench/results-$(SCALE).json
	$(PY) hack/bench --scale $(SCALE) $(BENCH_ARGS)

bench-plot: $(STAMP) ## Plot the figures against scale from the .bench/results-*.json present into $(BENCH_PLOT)
	$(PY) hack/bench --plot $(BENCH_PLOT)

# ---------------------------------------------------------------- demo
# DEMO_SINGLE_HOST=1 (the default): `make demo` then also adds the single-host pool
# v6e-2x2-single (three ct6e-standard-4t nodes, each its own v6e 2x2 slice), applies
# examples/single-host-service.yaml (a TPUSliceService of two such slices) and shows the
# two nodes its slices hold. DEMO_SINGLE_HOST=0 leaves it out.
DEMO_SINGLE_HOST ?= 1
.PHONY: demo demo-capacity demo-slices demo-down
demo: tools $(STAMP) ## Local GKE TPU cluster + operator + a 2-slice TPUSliceCluster becoming Ready, and a TPUSliceService on two nodes of a single-host pool (DEMO_SINGLE_HOST=0: without it)
	bash hack/demo.sh
ifeq ($(DEMO_SINGLE_HOST),1)
	$(PY) -m tpusim --dir $(DEV_CLUSTER) status | grep '^  pool v6e-2x2-single:' >/dev/null || \
	  $(PY) -m tpusim --dir $(DEV_CLUSTER) add-pool v6e-2x2-single
	KUBECONFIG=$(CURDIR)/$(DEV_CLUSTER)/kubeconfig "$$(bash hack/tools-dir.sh)/bin/kubectl" \
	  apply -n demo -f examples/single-host-service.yaml
	K="$$(bash hack/tools-dir.sh)/bin/kubectl --kubeconfig=$(CURDIR)/$(DEV_CLUSTER)/kubeconfig"; \
	for _ in $$(seq 120); do \
	  [ "$$($$K get tsr -o jsonpath='{range .items[*]}{.spec.node}{"\n"}{end}' | grep -c .)" -ge 2 ] && break; \
	  sleep 1; \
	done; \
	$$K get tsr
endif

demo-capacity: tools $(STAMP) ## The same from zero TPU nodes: the fake GKE provisioner makes a pool per slice
	bash hack/demo.sh capacity

demo-slices: tools $(STAMP) ## TPU7x dynamic slicing: four sub-block pools of one block, the simulated GKE slice controller, a 4x4x8 Slice by hand, then the operator forming a 4x4x8 TPUSliceCluster slice
	bash hack/demo-slices.sh

demo-down: $(STAMP) ## Stop the demo's operator and local cluster
	-@test -f $(DEV_CLUSTER)/operator.pid && kill "$$(cat $(DEV_CLUSTER)/operator.pid)" 2>/dev/null; rm -f $(DEV_CLUSTER)/operator.pid
	-@test -f $(DEV_CLUSTER)/webhook.pid && kill "$$(cat $(DEV_CLUSTER)/webhook.pid)" 2>/dev/null; rm -f $(DEV_CLUSTER)/webhook.pid
	-@test -f $(DEV_CLUSTER)/provisioner.pid && kill "$$(cat $(DEV_CLUSTER)/provisioner.pid)" 2>/dev/null; rm -f $(DEV_CLUSTER)/provisioner.pid
	-@test -f $(DEV_CLUSTER)/slicectl.pid && kill "$$(cat $(DEV_CLUSTER)/slicectl.pid)" 2>/dev/null; rm -f $(DEV_CLUSTER)/slicectl.pid
	$(PY) -m tpusim --dir $(DEV_CLUSTER) down

# ---------------------------------------------------------------- kind on a laptop (needs Docker; not run in CI)
.PHONY: kind-up kind-down
kind-up: $(STAMP) ## kind cluster + KubeRay + KWOK + fake TPU node pools + this chart (see README "Install")
	bash hack/kind-up.sh

kind-down: ## Delete the cluster made by kind-up
	$${KIND:-$$(command -v kind || echo .kind/bin/kind)} delete cluster --name $${KIND_CLUSTER:-tpuslice}
