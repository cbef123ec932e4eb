# The Ray image of the local real-node tier: a real Ray head (and worker) pod that
# KubeRay starts on the real kubelet node. Test infrastructure only; users run
# rayproject/ray or their own image on GKE.
#
# Built by tpusim.images (python -m tpusim images --ray) on the same local stand-in
# base as the operator image, which already has what KubeRay's generated pod needs:
# bash (KubeRay runs `bash -lc "ulimit -n 65536; ray start --head ..."`), wget and
# grep (its head and worker readiness/liveness probes exec `wget ... | grep success`).
# RAY_VERSION is passed as the version installed in the project's .venv (the test
# extra's `ray>=2.54`), so the tests' Ray client side and this head agree exactly.
ARG BASE_IMAGE=python:3.11.14-slim-trixie
FROM ${BASE_IMAGE}
ARG RAY_VERSION=2.60.0
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
# [default]: the dashboard and its agent, which serve the endpoints KubeRay's probes
# poll (52365 /api/local_raylet_healthz, 8265 /api/gcs_healthz) and the Jobs API.
RUN pip install "ray[default]==${RAY_VERSION}" && ray --version
WORKDIR /tmp
CMD ["ray", "--version"]
