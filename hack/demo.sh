#!/usr/bin/env bash
# `make demo`: a local simulated GKE TPU cluster, the operator, and an example
# TPUSliceCluster with two v6e 4x4 slices becoming Ready. Leaves everything
# running for you to explore; `make demo-down` stops it.
#
# `hack/demo.sh capacity` (`make demo-capacity`): the same cluster with no TPU node at
# all and the fake GKE provisioner (tpusim.provisioner, a simulation) running; a
# TPUSliceCluster with spec.reservation.provisioning asks for one node pool per slice
# (examples/v6e-4x4-queued-provisioning.yaml) and becomes Ready on them.
set -euo pipefail
variant=${1:-}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
state=.dev-cluster
py=.venv/bin/python
bin="$(bash hack/tools-dir.sh)/bin"
export KUBECONFIG="$root/$state/kubeconfig"
k() { "$bin/kubectl" "$@"; }

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

if "$py" -m tpusim --dir "$state" status >/dev/null 2>&1 && k get --raw /readyz >/dev/null 2>&1; then
  step "local cluster already running ($state)"
else
  step "starting the local simulated GKE TPU cluster"
  "$py" -m tpusim --dir "$state" up
fi

if [[ $variant == capacity ]]; then
  step "removing every TPU node pool: the slices' capacity is asked for"
  "$py" -m tpusim --dir "$state" remove-pool v6e-4x4-a v6e-4x4-b v5e-2x4 v4-2x2x2 || true
  step "installing the ProvisioningRequest CRD and starting the fake GKE provisioner (log: $state/provisioner.log)"
  "$py" -m tpusim --dir "$state" provisioner --install-only
  if [[ -f $state/provisioner.pid ]] && kill -0 "$(cat $state/provisioner.pid)" 2>/dev/null; then
    echo "already running (pid $(cat $state/provisioner.pid))"
  else
    nohup "$py" -m tpusim --dir "$state" provisioner --provision-delay 5 --remove-pools \
      >"$state/provisioner.log" 2>&1 &
    echo $! >"$state/provisioner.pid"
    echo "pid $(cat $state/provisioner.pid)"
  fi
fi

# shellcheck source=hack/demo-operator.sh
source hack/demo-operator.sh
start_operator

if [[ $variant == capacity ]]; then
  example=examples/v6e-4x4-queued-provisioning.yaml name=llm-dws
else
  example=examples/v6e-4x4-two-slices.yaml name=llm
fi
step "applying $example in namespace demo"
k create namespace demo --dry-run=client -o yaml | k apply -f - >/dev/null
k apply -n demo -f "$example"
k wait -n demo --for=condition=Ready "tsc/$name" --timeout=300s

step "kubectl get tsc,slicereservations,pods -o wide"
k get -n demo tsc,slicereservations,pods -o wide
if [[ $variant == capacity ]]; then
  step "kubectl get provisioningrequests,podtemplates; the pools GKE (the simulation) made"
  k get -n demo provisioningrequests.autoscaling.x-k8s.io,podtemplates
  k get nodes -l cloud.google.com/gke-tpu-accelerator -L cloud.google.com/gke-nodepool
  cat <<MSG

Each slice asked for its own node pool (ProvisioningRequest $name-s<index>-1) and runs on
the pool the request's status names. Explore:
  export KUBECONFIG=$KUBECONFIG
  kubectl get tsc -n demo $name -o yaml            # status.slices[].provisioning
  kubectl describe provreq -n demo $name-s0-1      # the (simulated) autoscaler's conditions
  kubectl get events -n demo                       # ProvisioningRequested, SliceReserved, ...
  kubectl annotate provreq -n demo $name-s0-1 tpusim.dev/revoke=true
                                                   # CapacityRevoked: the slice is replaced and asks again
  tail -f $state/operator.log $state/provisioner.log
Stop everything: make demo-down
MSG
  exit 0
fi

cat <<MSG

The TPUSliceCluster is Ready: each slice holds a whole node pool and runs on it.
Explore:
  export KUBECONFIG=$KUBECONFIG
  alias kubectl=$bin/kubectl
  kubectl get tsc -n demo llm -o yaml            # status: slices, conditions
  kubectl get raycluster -n demo llm -o yaml     # what the operator rendered
  kubectl get events -n demo                     # SliceReserved, SliceScheduled, SliceReady
  kubectl get pod -n demo -l tpuslice.dev/cluster=llm -o yaml | grep -A1 TPU_WORKER_ID
                                                 # each host's identity, set by the webhook
  kubectl patch tsc -n demo llm --type merge -p '{"spec":{"tpu":{"slices":3}}}'
                                                 # only 2 free v6e 4x4 pools: WaitingForCapacity
  tail -f $state/operator.log
Stop everything: make demo-down
MSG
