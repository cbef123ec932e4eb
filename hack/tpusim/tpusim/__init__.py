"""A local simulated GKE TPU cluster built from real Kubernetes components.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler, KWOK (fake
nodes and pod lifecycle) and the KubeRay operator run as local processes on
loopback ports; fake node pools carry GKE's TPU labels, taint and capacity.
Used by the e2e tests (a pytest fixture), `make dev-cluster` and
``python -m tpusim up|down|status``.
"""

from .cluster import ClusterSettings, LocalCluster, StartupReport
from .nodepools import CPUPool, NodePool, TPUPool, default_pools, pool_nodes
from .processes import ComponentError
from .tools import ToolPaths, find_repo_root

__all__ = [
    "CPUPool",
    "ClusterSettings",
    "ComponentError",
    "LocalCluster",
    "NodePool",
    "StartupReport",
    "TPUPool",
    "ToolPaths",
    "default_pools",
    "find_repo_root",
    "pool_nodes",
]
