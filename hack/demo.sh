#!/usr/bin/env bash
# `make demo`: a local simulated GKE TPU cluster, the operator, and an example
# TPUSliceCluster with two v6e 4x4 slices becoming Ready. Leaves everything
# running for you to explore; `make demo-down` stops it.
set -euo pipefail
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

step "installing the TPUSliceCluster and SliceReservation CRDs from crds/"
k apply --server-side --force-conflicts -f crds/
k wait --for=condition=Established --timeout=60s $(printf -- "-f %s " crds/*.yaml) >/dev/null  # not -f crds/: wait reads crds/parts too

step "starting the operator (log: $state/operator.log)"
if [[ -f $state/operator.pid ]] && kill -0 "$(cat $state/operator.pid)" 2>/dev/null; then
  echo "already running (pid $(cat $state/operator.pid))"
else
  # the identity webhook listens on loopback, where the local API server can call it
  port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  nohup .venv/bin/tpuslice run --kubeconfig "$KUBECONFIG" --liveness-port 0 \
    --webhook-port "$port" --webhook-addr 127.0.0.1 --webhook-url "https://127.0.0.1:$port" \
    --webhook-cert-dir "$state/webhook" >"$state/operator.log" 2>&1 &
  echo $! >"$state/operator.pid"
  echo "pid $(cat $state/operator.pid)"
fi

step "applying examples/v6e-4x4-two-slices.yaml in namespace demo"
k create namespace demo --dry-run=client -o yaml | k apply -f - >/dev/null
k apply -n demo -f examples/v6e-4x4-two-slices.yaml
k wait -n demo --for=condition=Ready tsc/llm --timeout=180s

step "kubectl get tsc,slicereservations,pods -o wide"
k get -n demo tsc,slicereservations,pods -o wide

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
