"""Names the operator shares with users, KubeRay, GKE and itself: one place, no literals elsewhere.

Labels, gates and resource names are part of the public contract (users select
on them, dashboards group by them), so they are spelled once here.
"""

from __future__ import annotations

from typing import Final

# --- our API -----------------------------------------------------------------
GROUP: Final = "tpuslice.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND_CLUSTER: Final = "TPUSliceCluster"
PLURAL_CLUSTER: Final = "tpusliceclusters"
KIND_RESERVATION: Final = "SliceReservation"
PLURAL_RESERVATION: Final = "slicereservations"

# --- what the operator puts on the RayCluster and its pods -------------------
LABEL_CLUSTER: Final = f"{GROUP}/cluster"
LABEL_ACCELERATOR_TYPE: Final = f"{GROUP}/accelerator-type"
LABEL_TOPOLOGY: Final = f"{GROUP}/topology"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "tpuslice-operator"
SCHEDULING_GATE: Final = f"{GROUP}/slice-reservation"
# Worker-template annotations: everything the TPU identity webhook needs beyond
# KubeRay's own labels, so it computes a pod's identity from the pod alone.
ANNOTATION_TPU_TYPE: Final = f"{GROUP}/tpu-type"
ANNOTATION_CHIPS_PER_HOST: Final = f"{GROUP}/chips-per-host"
ANNOTATION_SLICES: Final = f"{GROUP}/slices"
FIELD_MANAGER: Final = "tpuslice-operator"
WORKER_GROUP: Final = "tpu"
HEAD_CONTAINER: Final = "ray-head"
WORKER_CONTAINER: Final = "ray-worker"

# Ray and KubeRay floors (see README "Support floors").
MIN_RAY_VERSION: Final = (2, 54, 0)
# KubeRay refuses longer RayCluster names (63 minus its longest service suffix).
MAX_NAME_LENGTH: Final = 53

# --- GKE ---------------------------------------------------------------------
TPU_RESOURCE: Final = "google.com/tpu"
NODE_LABEL_ACCELERATOR: Final = "cloud.google.com/gke-tpu-accelerator"
NODE_LABEL_TOPOLOGY: Final = "cloud.google.com/gke-tpu-topology"
NODE_LABEL_NODEPOOL: Final = "cloud.google.com/gke-nodepool"
TPU_TAINT_KEY: Final = "google.com/tpu"

# --- KubeRay -----------------------------------------------------------------
RAY_GROUP: Final = "ray.io"
RAY_VERSION: Final = "v1"
RAY_API_VERSION: Final = f"{RAY_GROUP}/{RAY_VERSION}"
RAY_KIND_CLUSTER: Final = "RayCluster"
RAY_PLURAL_CLUSTER: Final = "rayclusters"
KUBERAY_LABEL_CLUSTER: Final = "ray.io/cluster"
KUBERAY_LABEL_GROUP: Final = "ray.io/group"
KUBERAY_LABEL_NODE_TYPE: Final = "ray.io/node-type"
KUBERAY_LABEL_REPLICA_INDEX: Final = "ray.io/worker-group-replica-index"
KUBERAY_LABEL_REPLICA_NAME: Final = "ray.io/worker-group-replica-name"
KUBERAY_LABEL_HOST_INDEX: Final = "ray.io/replica-host-index"
