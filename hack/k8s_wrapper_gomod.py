#!/usr/bin/env python3
"""Write the go.mod of a wrapper module that can build k8s.io/kubernetes commands.

`go install k8s.io/kubernetes/cmd/...@vX` is refused because upstream's go.mod
points its ~31 staging modules at ./staging with replace lines. A wrapper module
that requires k8s.io/kubernetes and replaces each staging module with its
published v0.Y.Z tag builds the same code. The replace list is derived from the
upstream go.mod (passed as argv[1]) rather than typed, so a version bump needs no
edits here.

usage: k8s_wrapper_gomod.py UPSTREAM_GO_MOD KUBERNETES_VERSION > go.mod
"""

from __future__ import annotations

import re
import sys

_STAGING = re.compile(r"^\s*(\S+)\s*=>\s*\./staging/\S+\s*$")


def wrapper_gomod(upstream: str, k8s_version: str) -> str:
    """Return the wrapper go.mod text for `k8s_version` given upstream's go.mod."""
    major_minor_patch = k8s_version.lstrip("v").split(".")
    staging_version = "v0." + ".".join(major_minor_patch[1:])
    go_line = ""
    godebug: list[str] = []
    replaces: list[str] = []
    in_godebug = False
    for line in upstream.splitlines():
        stripped = line.strip()
        if stripped.startswith("go ") and not go_line:
            go_line = stripped
        if stripped.startswith("godebug ("):
            in_godebug = True
            godebug.append(stripped)
            continue
        if in_godebug:
            godebug.append(stripped)
            if stripped == ")":
                in_godebug = False
            continue
        if stripped.startswith("godebug "):
            godebug.append(stripped)
            continue
        match = _STAGING.match(line)
        if match:
            replaces.append(f"\t{match.group(1)} => {match.group(1)} {staging_version}")
    if not replaces:
        raise SystemExit("no ./staging replace lines found in upstream go.mod")
    out = ["module tpuslice.dev/tools/kubernetes", "", go_line or "go 1.24", ""]
    if godebug:
        out += [*godebug, ""]
    out += [f"require k8s.io/kubernetes {k8s_version}", "", "replace ("]
    out += [*replaces, ")", ""]
    return "\n".join(out)


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as fh:
        sys.stdout.write(wrapper_gomod(fh.read(), sys.argv[2]))
