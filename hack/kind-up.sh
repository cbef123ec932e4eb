#!/usr/bin/env bash
# `make kind-up`: a kind cluster on a laptop with KubeRay, KWOK, fake GKE TPU node
# pools, and this operator installed from the Helm chart (image built locally and
# loaded into kind). Needs Docker, Go (to install kind), kubectl and helm.
# Not run by CI (no Docker there); `make kind-down` deletes the cluster.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

name=${KIND_CLUSTER:-tpuslice}
kind_version=${KIND_VERSION:-v0.30.0}
node_image=${KIND_NODE_IMAGE:-kindest/node:v1.34.0}
kwok_version=${KWOK_VERSION:-v0.7.0}
kuberay_version=${KUBERAY_VERSION:-1.5.0}
image=tpuslice-operator:$(sed -n 's/^ARG VERSION=//p' Dockerfile)
kubeconfig=${KIND_KUBECONFIG:-$root/.kind/kubeconfig}
kind=${KIND:-$(command -v kind || true)}
helm=${HELM:-$(command -v helm || echo "$(bash hack/tools-dir.sh)/bin/helm")}
kubectl=${KUBECTL:-$(command -v kubectl || echo "$(bash hack/tools-dir.sh)/bin/kubectl")}

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

if [[ -z $kind ]]; then
  step "installing kind $kind_version (go install)"
  GOBIN="$root/.kind/bin" go install "sigs.k8s.io/kind@$kind_version"
  kind="$root/.kind/bin/kind"
fi
mkdir -p "$(dirname "$kubeconfig")"
export KUBECONFIG=$kubeconfig

step "kind cluster $name"
if ! "$kind" get clusters | grep -qx "$name"; then
  "$kind" create cluster --name "$name" --image "$node_image" --kubeconfig "$kubeconfig"
fi

step "KWOK $kwok_version (manages the fake nodes, annotated kwok.x-k8s.io/node=fake)"
"$kubectl" apply --server-side -f "https://github.com/kubernetes-sigs/kwok/releases/download/$kwok_version/kwok.yaml"
"$kubectl" apply --server-side -f "https://github.com/kubernetes-sigs/kwok/releases/download/$kwok_version/stage-fast.yaml"
"$kubectl" -n kube-system rollout status deployment/kwok-controller --timeout=180s

step "KubeRay $kuberay_version with RayMultiHostIndexing"
"$helm" upgrade --install kuberay-operator kuberay-operator \
  --repo https://ray-project.github.io/kuberay-helm/ --version "$kuberay_version" \
  --namespace kuberay-system --create-namespace --wait \
  --set-json 'featureGates=[{"name":"RayClusterStatusConditions","enabled":true},{"name":"RayMultiHostIndexing","enabled":true}]'

step "fake GKE TPU node pools (the e2e tier's defaults)"
.venv/bin/python - "$kubeconfig" <<'PY'
import sys
from pathlib import Path
from tpusim import default_pools, kube

api = kube.api_client(Path(sys.argv[1]))
for pool in default_pools():
    kube.wait_nodes_ready(api, kube.create_pool(api, pool))
    print(f"node pool {pool.name} ready")
PY

step "operator image $image (docker build, kind load)"
docker build -t "$image" .
"$kind" load docker-image "$image" --name "$name"

step "the chart (operator pinned to the kind node, never a fake one)"
"$helm" upgrade --install tpuslice-operator charts/tpuslice-operator \
  --namespace tpuslice-system --create-namespace --wait --timeout 3m \
  --set image.pullPolicy=Never \
  --set-string "nodeSelector.kubernetes\.io/hostname=$name-control-plane"

cat <<MSG

Ready. Try:
  export KUBECONFIG=$kubeconfig
  kubectl create namespace demo
  kubectl apply -n demo -f examples/v6e-4x4-two-slices.yaml
  kubectl wait -n demo --for=condition=Ready tsc/llm --timeout=5m
Delete everything: make kind-down
MSG
