# syntax=docker/dockerfile:1
# The tpuslice-operator image: `tpuslice run` as a non-root user on a slim,
# version-pinned Python. Two stages: the first builds wheels of the operator and
# its runtime dependencies (no compilers or test tools reach the image), the
# second installs only those wheels. `make image-check` runs the same two pip
# commands in a fresh virtual environment, and hadolint lints this file (no
# Docker engine is needed for either).
#
# Build:  docker build -t tpuslice-operator:0.1.0 .
# Pin the base by digest in your own registry mirror for fully reproducible builds.

ARG PYTHON_IMAGE=python:3.11.14-slim-trixie

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
COPY pyproject.toml README.md ./
COPY operator/ operator/
# The operator and every runtime dependency as wheels; the [test] extra is not used.
RUN pip wheel --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="tpuslice-operator" \
      org.opencontainers.image.description="Kubernetes operator extending KubeRay for Google Cloud TPUs on GKE" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# --no-index: exactly the wheels built above, nothing fetched at this stage.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels tpuslice-operator==${VERSION}
# 65532: a numeric non-root user, so runAsNonRoot can be verified by the kubelet.
USER 65532:65532
WORKDIR /tmp
# 8080 /healthz (kopf liveness), 8000 /metrics, 9443 the TPU identity webhook.
EXPOSE 8080 8000 9443
ENTRYPOINT ["tpuslice", "run"]
