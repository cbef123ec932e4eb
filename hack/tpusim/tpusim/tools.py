"""Where `make tools` (hack/build-tools.sh) put the binaries, CRDs and stages.

Mirrors hack/tools-dir.sh: the cache directory is keyed by the hash of
hack/versions.env so each set of pins has its own build. Kueue, optional in the
cluster, is pinned apart in hack/versions-kueue.env and built into its own
``kueue-<version>`` directory inside that cache, so moving its pin rebuilds
Kueue alone and never the control plane.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BINARIES", "ToolPaths", "find_repo_root", "read_versions"]

BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "ray-operator",
    "helm",
)
#: The KWOK stages the cluster runs: node init + lease heartbeat, pod lifecycle.
KWOK_STAGES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-complete.yaml",
    "pod/fast/pod-delete.yaml",
)


def read_versions(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of hack/versions.env (comments and blanks ignored)."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def find_repo_root(start: Path | None = None) -> Path:
    """The checkout containing hack/versions.env, searched upward from ``start``.

    Falls back to the source tree this package lives in (editable install).
    """
    candidates = [start or Path.cwd()]
    candidates.append(Path(__file__).resolve().parents[3])
    for base in candidates:
        for directory in (base, *base.parents):
            if (directory / "hack" / "versions.env").is_file():
                return directory
    raise FileNotFoundError("no hack/versions.env above the current directory")


@dataclass(frozen=True)
class ToolPaths:
    """The built tool tree for one versions.env."""

    root: Path
    versions: Mapping[str, str]

    @classmethod
    def for_repo(cls, repo: Path, env: Mapping[str, str] | None = None) -> ToolPaths:
        """Locate the cache the same way hack/tools-dir.sh does."""
        env = os.environ if env is None else env
        versions_file = repo / "hack" / "versions.env"
        digest = hashlib.sha256(versions_file.read_bytes()).hexdigest()[:16]
        base = env.get("TPUSLICE_TOOLS_DIR") or str(
            Path(env.get("XDG_CACHE_HOME") or Path(env.get("HOME", "~")) / ".cache")
            / "tpuslice-tools"
        )
        versions = read_versions(versions_file)
        kueue_file = repo / "hack" / "versions-kueue.env"
        if kueue_file.is_file():
            versions = {**versions, **read_versions(kueue_file)}
        return cls(Path(base).expanduser() / digest, versions)

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def binary(self, name: str) -> Path:
        return self.bin / name

    @property
    def kuberay_crds(self) -> Path:
        return self.root / "kuberay-crds"

    @property
    def kwok_stages(self) -> tuple[Path, ...]:
        return tuple(self.root / "kwok-stages" / s for s in KWOK_STAGES)

    @property
    def kueue_root(self) -> Path:
        """Kueue's binary and manifests for the pinned ``KUEUE_VERSION``."""
        version = self.versions.get("KUEUE_VERSION")
        if not version:
            raise ValueError("KUEUE_VERSION is not pinned (hack/versions-kueue.env)")
        return self.root / f"kueue-{version}"

    @property
    def kueue_binary(self) -> Path:
        return self.kueue_root / "bin" / "kueue"

    @property
    def kueue_crds(self) -> Path:
        """Kueue's CRDs as shipped (config/components/crd/bases)."""
        return self.kueue_root / "crds"

    @property
    def kueue_webhooks(self) -> Path:
        """Kueue's shipped webhook configurations (config/components/webhook/manifests.yaml)."""
        return self.kueue_root / "webhook-manifests.yaml"

    def kueue_missing(self) -> list[str]:
        """What of Kueue is not built yet (empty when `make tools` has built it)."""
        gone = []
        if not os.access(self.kueue_binary, os.X_OK):
            gone.append(str(self.kueue_binary))
        if not list(self.kueue_crds.glob("*.yaml")):
            gone.append("Kueue CRDs")
        if not self.kueue_webhooks.is_file():
            gone.append(str(self.kueue_webhooks))
        return gone

    def missing(self) -> list[str]:
        """What is not built yet (empty when `make tools` has finished)."""
        gone = [b for b in BINARIES if not os.access(self.binary(b), os.X_OK)]
        if not (self.root / ".complete").exists():
            gone.append(".complete stamp")
        gone += [str(p) for p in self.kwok_stages if not p.exists()]
        if not list(self.kuberay_crds.glob("*.yaml")):
            gone.append("KubeRay CRDs")
        return gone
