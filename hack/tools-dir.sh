#!/usr/bin/env bash
# Print the version-keyed directory that hack/build-tools.sh fills.
# Keyed by the hash of hack/versions.env so a version bump builds into a fresh
# directory and every older cache stays valid for its own pins.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
base=${TPUSLICE_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tpuslice-tools}
hash=$(sha256sum "$root/hack/versions.env" | cut -c1-16)
echo "$base/$hash"
