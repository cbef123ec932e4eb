#!/usr/bin/env bash
# `make demo-slices`: TPU7x dynamic slicing on the local simulated GKE cluster: four
# sub-block pools of one topology block (presets tpu7x-4x4x4-block1-a to -d), the
# simulated GKE slice controller (tpusim.slicectl, a simulation) in the background, a
# 4x4x8 Slice made by hand over a and b becoming ACTIVE with its 32 nodes labelled, then
# the operator forming examples/tpu7x-4x4x8-dynamic-slice.yaml's slice over c and d
# (reserved, Slice created, pods pinned). Leaves everything running; `make demo-down`
# stops it. docs/local-cluster.md ("TPU7x dynamic slicing") says how to fail, degrade or
# delete it.
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

for pool in tpu7x-4x4x4-block1-a tpu7x-4x4x4-block1-b tpu7x-4x4x4-block1-c tpu7x-4x4x4-block1-d; do
  if ! "$py" -m tpusim --dir "$state" status | grep "^  pool $pool:" >/dev/null; then
    step "adding the TPU7x sub-block pool $pool (16 nodes, PROVISION_ONLY)"
    "$py" -m tpusim --dir "$state" add-pool "$pool"
  fi
done

step "installing the Slice CRD and starting the simulated slice controller (log: $state/slicectl.log)"
"$py" -m tpusim --dir "$state" slicectl --install-only
if [[ -f $state/slicectl.pid ]] && kill -0 "$(cat $state/slicectl.pid)" 2>/dev/null; then
  echo "already running (pid $(cat $state/slicectl.pid))"
else
  nohup "$py" -m tpusim --dir "$state" slicectl --activation 3 >"$state/slicectl.log" 2>&1 &
  echo $! >"$state/slicectl.pid"
  echo "pid $(cat $state/slicectl.pid)"
fi

name=demo-4x4x8
if ! k get slice "$name" >/dev/null 2>&1; then
  step "creating Slice $name over partitions tpusim-block1-a and tpusim-block1-b"
  "$py" -m tpusim --dir "$state" slice-create "$name" 4x4x8 tpusim-block1-a tpusim-block1-b
fi
k wait --for=condition=Ready "slice/$name" --timeout=60s

step "kubectl get slices; the nodes the slice controller labelled"
k get slices
k get nodes -l "cloud.google.com/gke-tpu-slice=$name" \
  -L cloud.google.com/gke-tpu-slice,cloud.google.com/gke-tpu-topology,cloud.google.com/gke-tpu-partition-4x4x4-id

# shellcheck source=hack/demo-operator.sh
source hack/demo-operator.sh
start_operator

example=examples/tpu7x-4x4x8-dynamic-slice.yaml tsc=ironwood-dynamic
step "applying $example in namespace demo: the operator forms its slice on the two free partitions"
k create namespace demo --dry-run=client -o yaml | k apply -f - >/dev/null
k apply -n demo -f "$example"
k wait -n demo --for=condition=Ready "tsc/$tsc" --timeout=300s

step "kubectl get tsc,slicereservations,slices; where the pods are pinned"
k get -n demo tsc "$tsc"
k get slicereservations
k get slices
k get pods -n demo -l "tpuslice.dev/cluster=$tsc" \
  -o 'custom-columns=POD:.metadata.name,SLICE:.spec.nodeSelector.cloud\.google\.com/gke-tpu-slice,NODE:.spec.nodeName' \
  | sed -n '1,5p'  # not head: under pipefail, kubectl writing on after head exits fails the demo

cat <<MSG

Slice $name (made by hand) is ACTIVE over partitions a and b of one topology block, and
the operator formed TPUSliceCluster $tsc's slice over c and d, reserved both and pinned
its 32 pods to it. Explore:
  kubectl get tsc -n demo $tsc -o yaml                         # status.slices[].message
  $py -m tpusim slice-fault $name fail          # FAILED (or degrade | never | none)
  $py -m tpusim partition-state pool:tpu7x-4x4x4-block1-b --state UNHEALTHY
  KUBECONFIG=$KUBECONFIG kubectl delete slice $name   # labels off, finalizer released
  KUBECONFIG=$KUBECONFIG kubectl delete tsc -n demo $tsc   # its Slice and reservations go
  tail -f $state/slicectl.log
make demo-down stops it all.
MSG
