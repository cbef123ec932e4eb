#!/usr/bin/env bash
# Build the local simulated GKE cluster's binaries from source with the Go
# module proxy (no Docker, no release downloads needed), once per set of pins.
#
# Output: $(hack/tools-dir.sh)/{bin,kuberay-crds,kwok-stages,kueue-<version>,build.log,.complete}
# A second run with the same hack/versions.env is a no-op (checks .complete and
# that every binary, including the Kueue pinned in hack/versions-kueue.env, is there).
# Each tool is built in its own wrapper module so shared dependencies are never
# bumped across tools.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck disable=SC1091
source "$root/hack/versions.env"
# shellcheck disable=SC1091
source "$root/hack/versions-kueue.env"
out=$("$root/hack/tools-dir.sh")
bin=$out/bin
work=$out/work
binaries=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy etcd kwok ray-operator helm)
# Kueue lives in a directory of its own version: a Kueue bump rebuilds Kueue only.
kueue=$out/kueue-$KUEUE_VERSION

complete() {
  [[ -f $out/.complete ]] || return 1
  for b in "${binaries[@]}"; do [[ -x $bin/$b ]] || return 1; done
  [[ -d $out/kuberay-crds && -d $out/kwok-stages ]] || return 1
  [[ -x $kueue/bin/kueue && -d $kueue/crds && -f $kueue/webhook-manifests.yaml ]]
}

if complete; then
  echo "tools up to date in $out"
  exit 0
fi

GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
export GOFLAGS="${GOFLAGS:--p=2}"
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}
export CGO_ENABLED=0
mkdir -p "$bin" "$work"

# One build at a time per cache directory (make tools racing make test-e2e).
exec 9>"$out/.lock"
flock 9
if complete; then echo "tools up to date in $out"; exit 0; fi

start=$(date +%s)
log() { printf '[build-tools %(%H:%M:%S)T] %s\n' -1 "$*"; }

moddir() { # module@version -> directory of its download
  "$GO" mod download -json "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])'
}

# ---------------------------------------------------------------- kubernetes
build_kubernetes() {
  # kubelet and kube-proxy run the real node of the real-node tier (docs/local-cluster.md).
  local cmds=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
  local missing=0
  for c in "${cmds[@]}"; do [[ -x $bin/$c ]] || missing=1; done
  ((missing)) || { log "kubernetes binaries present"; return; }
  log "kubernetes $KUBERNETES_VERSION: generating wrapper module"
  local d=$work/kubernetes
  rm -rf "$d" && mkdir -p "$d" && cd "$d"
  local gomod
  gomod=$("$GO" mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  python3 "$root/hack/k8s_wrapper_gomod.py" "$gomod" "$KUBERNETES_VERSION" >go.mod
  local pkgs=()
  for c in "${cmds[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
  local getargs=()
  for p in "${pkgs[@]}"; do getargs+=("$p@$KUBERNETES_VERSION"); done
  # Resolve the module graph and go.sum for exactly these commands.
  "$GO" get "${getargs[@]}"
  local v=${KUBERNETES_VERSION#v} major minor
  major=${v%%.*}; minor=${v#*.}; minor=${minor%%.*}
  local ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=$KUBERNETES_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor"
    ld+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  log "kubernetes: go build ${cmds[*]}"
  "$GO" build -trimpath -ldflags="$ld" -o "$bin/" "${pkgs[@]}"
}

# ---------------------------------------------------------------- etcd
build_etcd() {
  [[ -x $bin/etcd ]] && { log "etcd present"; return; }
  log "etcd $ETCD_VERSION: wrapper module"
  local d=$work/etcd
  rm -rf "$d" && mkdir -p "$d" && cd "$d"
  "$GO" mod init tpuslice.dev/tools/etcd >/dev/null 2>&1
  "$GO" get "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  "$GO" build -trimpath -ldflags="-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3
}

# ---------------------------------------------------------------- plain installs
go_install() { # name package@version [extra ldflags]
  [[ -x $bin/$1 ]] && { log "$1 present"; return; }
  log "$1: go install $2"
  GOBIN=$bin "$GO" install -trimpath -ldflags="-s -w ${3:-}" "$2"
}

# ---------------------------------------------------------------- kueue
build_kueue() {
  # The manager alone (cmd/kueue), built from its own go.mod by `go install pkg@version`,
  # plus what the local cluster applies from the same module: CRDs and webhook configs.
  if [[ ! -x $kueue/bin/kueue ]]; then
    log "kueue: go install sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
    mkdir -p "$kueue/bin"
    GOBIN=$kueue/bin "$GO" install -trimpath -ldflags="-s -w" "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
  else
    log "kueue present"
  fi
  local dir
  dir=$(moddir "sigs.k8s.io/kueue@$KUEUE_VERSION")
  rm -rf "$kueue/crds" && mkdir -p "$kueue/crds"
  cp "$dir"/config/components/crd/bases/*.yaml "$kueue/crds/"
  cp "$dir"/config/components/webhook/manifests.yaml "$kueue/webhook-manifests.yaml"
  chmod -R u+w "$kueue/crds" "$kueue/webhook-manifests.yaml"
}

copy_assets() {
  local dir
  dir=$(moddir "github.com/ray-project/kuberay/ray-operator@$KUBERAY_VERSION")
  rm -rf "$out/kuberay-crds" && mkdir -p "$out/kuberay-crds"
  cp "$dir"/config/crd/bases/*.yaml "$out/kuberay-crds/"
  dir=$(moddir "sigs.k8s.io/kwok@$KWOK_VERSION")
  rm -rf "$out/kwok-stages" && mkdir -p "$out/kwok-stages"
  cp -r "$dir"/kustomize/stage/. "$out/kwok-stages/"
  chmod -R u+w "$out/kuberay-crds" "$out/kwok-stages"
}

build_kubernetes
build_etcd
go_install kwok "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
go_install ray-operator "github.com/ray-project/kuberay/ray-operator@$KUBERAY_VERSION"
# Stamped, or `helm version` says v3.22 and chart kubeVersion checks see less.
go_install helm "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" \
  "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
copy_assets
build_kueue

elapsed=$(($(date +%s) - start))
# Appended, so the first (cold) build's time survives partial rebuilds.
echo "$(date -u +%FT%TZ) build ${elapsed}s nproc=$(nproc) $("$GO" version | cut -d' ' -f3)" \
  "$(cat "$root/hack/versions.env" "$root/hack/versions-kueue.env" | grep -v '^#' | tr '\n' ' ')" >>"$out/build-history.txt"
touch "$out/.complete"
log "done in ${elapsed}s -> $bin"
