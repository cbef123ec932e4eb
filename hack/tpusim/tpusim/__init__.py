"""A local simulated GKE TPU cluster built from real Kubernetes components.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler, KWOK (fake
nodes and pod lifecycle) and the KubeRay operator run as local processes on
loopback ports; fake node pools carry GKE's TPU labels, taint and capacity.
Used by the e2e tests (a pytest fixture), `make dev-cluster` and
``python -m tpusim up|down|status``. With ``ClusterSettings(node_ip=...)`` a
real kubelet + containerd node can join (tpusim.realnode.RealNode; root, one
per machine); tpusim.hoststate records and takes back its host changes.
tpusim.provisioner plays GKE's side of the ProvisioningRequest API (a
simulation: the CRD, whole pools on demand, booking, revocation, faults).
"""

from .cluster import ClusterSettings, LocalCluster, StartupReport, primary_address
from .hoststate import HostLock, RealNodeBusy, cleanup_host, host_leftovers
from .nodepools import CPUPool, NodePool, TPUPool, default_pools, pool_nodes
from .processes import ComponentError
from .realnode import (
    PAUSE_IMAGE,
    REAL_NODE_LABEL,
    REAL_NODE_TOLERATION,
    RealNode,
    RealNodeSettings,
    host_python_pod,
)
from .tools import ToolPaths, find_repo_root

__all__ = [
    "PAUSE_IMAGE",
    "REAL_NODE_LABEL",
    "REAL_NODE_TOLERATION",
    "CPUPool",
    "ClusterSettings",
    "ComponentError",
    "HostLock",
    "LocalCluster",
    "NodePool",
    "RealNode",
    "RealNodeBusy",
    "RealNodeSettings",
    "StartupReport",
    "TPUPool",
    "ToolPaths",
    "cleanup_host",
    "default_pools",
    "find_repo_root",
    "host_leftovers",
    "host_python_pod",
    "pool_nodes",
    "primary_address",
]
