#!/usr/bin/env bash
# Install the Debian packages the real-node tier needs (tpusim.realnode), only
# those missing: a second run does nothing and prints one line. Root, apt-get.
#
#   containerd, runc                   the node's container runtime (started by hand:
#                                      no systemd needed)
#   containernetworking-plugins        bridge, host-local, portmap, loopback in /usr/lib/cni
#   iptables, conntrack                kube-proxy, the kubelet and the CNI plugins
#   dnsmasq-base                       kubernetes.default.svc for pods (kopf dials the name)
#   buildah                            the pause and operator images, no daemon
#   debootstrap                        the operator image's stand-in Python base
#   gcc, libc6-dev                     the static pause binary (libc.a)
#   iproute2                           ip link (the bridge, at cleanup)
set -euo pipefail

packages=(containerd runc containernetworking-plugins iptables conntrack dnsmasq-base
  buildah debootstrap gcc libc6-dev iproute2)

start=$(date +%s%N)
missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [[ $status == installed ]] || missing+=("$p")
done

if ((${#missing[@]})); then
  if ((EUID != 0)); then
    echo "realnode-deps: missing ${missing[*]}; run as root to install them" >&2
    exit 1
  fi
  echo "realnode-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # A fresh machine has no package lists yet; refresh them only when the
  # install cannot find a package.
  if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi
ms=$((($(date +%s%N) - start) / 1000000))
printf 'realnode-deps: %d packages present (%d installed now) in %d.%01ds\n' \
  "${#packages[@]}" "${#missing[@]}" $((ms / 1000)) $((ms % 1000 / 100))
