# Sourced by the demos (hack/demo.sh, hack/demo-slices.sh): install the CRDs from crds/
# and start the operator on the dev cluster in the background, once. Expects root, state,
# py, KUBECONFIG, k and step from the caller.

start_operator() {
  step "installing the TPUSlice and SliceReservation CRDs from crds/"
  k apply --server-side --force-conflicts -f crds/
  k wait --for=condition=Established --timeout=60s $(printf -- "-f %s " crds/*.yaml) >/dev/null  # not -f crds/: wait reads crds/parts too

  step "starting the operator (log: $state/operator.log)"
  if [[ -f $state/operator.pid ]] && kill -0 "$(cat $state/operator.pid)" 2>/dev/null; then
    echo "already running (pid $(cat $state/operator.pid))"
  else
    local port
    port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    # The admission webhooks in a process of their own, as the chart runs them.
    nohup .venv/bin/tpuslice webhook --kubeconfig "$KUBECONFIG" --liveness-port 0 --metrics-port 0 \
      --webhook-port "$port" --webhook-addr 127.0.0.1 --webhook-url "https://127.0.0.1:$port" \
      --webhook-cert-dir "$state/webhook" >"$state/webhook.log" 2>&1 &
    echo $! >"$state/webhook.pid"
    nohup .venv/bin/tpuslice run --kubeconfig "$KUBECONFIG" --liveness-port 0 \
      --webhook-port 0 >"$state/operator.log" 2>&1 &
    echo $! >"$state/operator.pid"
    echo "pid $(cat $state/operator.pid), webhook pid $(cat $state/webhook.pid) (log: $state/webhook.log)"
  fi
}
