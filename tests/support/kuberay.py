"""The real KubeRay CRDs (RayCluster, RayJob, RayService), from the KubeRay release
pinned in hack/versions.env.

Taken from the Go module download (the same source `make tools` builds
ray-operator from), so rendered RayClusters are checked against the schema the
operator will really meet. No network after the first download (Go's module
cache).
"""

from __future__ import annotations

import json
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from tpusim.tools import read_versions

MODULE = "github.com/ray-project/kuberay/ray-operator"


@cache
def kuberay_module_dir() -> Path:
    root = Path(__file__).resolve().parents[2]
    version = read_versions(root / "hack" / "versions.env")["KUBERAY_VERSION"]
    result = subprocess.run(
        ["go", "mod", "download", "-json", f"{MODULE}@{version}"],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return Path(json.loads(result.stdout)["Dir"])


@cache
def kuberay_crd(plural: str) -> dict[str, Any]:
    """``ray.io_<plural>.yaml`` of the pinned KubeRay (rayclusters, rayjobs, rayservices)."""
    path = kuberay_module_dir() / "config" / "crd" / "bases" / f"ray.io_{plural}.yaml"
    # The C loader when PyYAML has it: the CRDs are 0.9-1.3 MB and the pure-Python
    # loader takes seconds of every unit run.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd: dict[str, Any] = yaml.load(path.read_text(), Loader=loader)
    return crd


def raycluster_crd() -> dict[str, Any]:
    return kuberay_crd("rayclusters")
