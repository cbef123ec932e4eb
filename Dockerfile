# syntax=docker/dockerfile:1
# The tpuslice-operator image: `tpuslice run` as a non-root user on a slim,
# version-pinned Python. Two stages: the first collects the runtime dependencies
# exactly as requirements.lock pins them (each file checked against its sha256)
# and builds the operator's own wheel (no compilers or test tools reach the
# image), the second installs only those wheels, with no index. `make
# image-check` runs the same pip commands in a fresh virtual environment, and
# hadolint lints this file (no Docker engine is needed for either).
#
# Build:  docker build -t tpuslice-operator:0.1.0 .
#
# The base. A tag can be moved (the official images are rebuilt for Debian
# updates); a digest cannot. PYTHON_IMAGE_DIGEST pins the base by content: "@"
# and the digest of an image index, so both stages start FROM
# python:3.11.14-slim-trixie@sha256:<64 hex>: the digest decides, the tag only
# names it. The default below is the index that Docker Hub served for
# python:3.11-slim (= 3.11.14-slim-trixie) in late 2025, as recorded in public
# build logs and pinned Dockerfiles (it was not read from the registry here: none
# is reachable from the machine this was written on). To move to a rebuild, read
# the tag's current digest and pass it, or change the default:
#   docker buildx imagetools inspect python:3.11.14-slim-trixie   (or: crane digest ...)
#   docker build --build-arg PYTHON_IMAGE_DIGEST=@sha256:<64 hex> -t tpuslice-operator:0.1.0 .
# Empty (--build-arg PYTHON_IMAGE_DIGEST=): the tag as the registry serves it at
# build time. PYTHON_IMAGE names a mirror's copy instead (an exact copy keeps the
# digest); a builder that refuses a tag and a digest together takes the whole
# reference there (python@sha256:<64 hex>) with PYTHON_IMAGE_DIGEST left empty.
ARG PYTHON_IMAGE=python:3.11.14-slim-trixie
ARG PYTHON_IMAGE_DIGEST=@sha256:193fdd0bbcb3d2ae612bd6cc3548d2f7c78d65b549fcaa8af75624c47474444d

FROM ${PYTHON_IMAGE}${PYTHON_IMAGE_DIGEST} AS build
WORKDIR /src
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
# Every runtime dependency, and only the files the lock names: pip refuses an
# unpinned or unhashed requirement and a download whose sha256 differs, and takes
# wheels only, so no sdist's build code runs. `make lock` regenerates the lock from
# pyproject.toml. Copied before the source, this layer outlives code changes.
COPY requirements.lock ./
RUN pip wheel --wheel-dir /wheels --require-hashes --only-binary=:all: -r requirements.lock
COPY pyproject.toml README.md ./
COPY operator/ operator/
# The operator's own wheel; its dependencies are the ones above, and the [test]
# extra is not used. Not hash-checked: the build backend (setuptools, from
# pyproject's [build-system]) that pip's isolated build fetches for this step; it
# only packs our source and does not reach the image.
RUN pip wheel --wheel-dir /wheels --no-deps .

FROM ${PYTHON_IMAGE}${PYTHON_IMAGE_DIGEST}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="tpuslice-operator" \
      org.opencontainers.image.description="Kubernetes operator extending KubeRay for Google Cloud TPUs on GKE" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# --no-index: exactly the wheels collected above, nothing fetched at this stage; a
# dependency missing from the lock fails here.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels tpuslice-operator==${VERSION}
# 65532: a numeric non-root user, so runAsNonRoot can be verified by the kubelet.
USER 65532:65532
WORKDIR /tmp
# 8080 /healthz (kopf liveness), 8000 /metrics, 9443 the TPU identity webhook.
EXPOSE 8080 8000 9443
ENTRYPOINT ["tpuslice", "run"]
