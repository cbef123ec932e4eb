#!/usr/bin/env bash
# `make image`: build the operator image from the unchanged Dockerfile with
# whatever builder this machine has.
#
#   - a Docker daemon that answers: `docker build`, tagged tpuslice-operator:<version>
#     (the official python base is pulled as usual);
#   - otherwise buildah, with no daemon and no registry: `python -m tpusim images`
#     makes a local stand-in for the Dockerfile's FROM image (debootstrap, cached in
#     the tools cache), builds with `buildah bud --layers` and exports a
#     docker-archive tar for `ctr images import` (path printed at the end).
#
# BUILDER=docker|buildah forces one; IMAGE=name overrides the docker tag's name;
# PYTHON_IMAGE_DIGEST=@sha256:... pins the docker build's base by digest (see the
# Dockerfile). The buildah build is always on the stand-in, which has no digest of
# the official image.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n1)
builder=${BUILDER:-}
if [[ -z $builder ]]; then
  if command -v docker >/dev/null 2>&1 && timeout 10 docker info >/dev/null 2>&1; then
    builder=docker
  elif command -v buildah >/dev/null 2>&1; then
    builder=buildah
  else
    echo "no builder: neither a Docker daemon nor buildah is available" >&2
    exit 1
  fi
fi
case $builder in
  docker)
    args=()
    if [[ -n ${PYTHON_IMAGE_DIGEST:-} ]]; then
      args+=(--build-arg "PYTHON_IMAGE_DIGEST=$PYTHON_IMAGE_DIGEST")
    fi
    exec docker build "${args[@]}" -t "${IMAGE:-tpuslice-operator}:$version" .
    ;;
  buildah)
    # Needs root (debootstrap, chroot, buildah's storage) and the project's .venv.
    exec "${PY:-$root/.venv/bin/python}" -m tpusim images "$@"
    ;;
  *)
    echo "BUILDER must be docker or buildah, not '$builder'" >&2
    exit 2
    ;;
esac
