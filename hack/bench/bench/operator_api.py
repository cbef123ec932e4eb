"""The operator's public API as the benchmark meets it on the cluster.

These names mirror what the operator publishes, not its code: the CRDs' group,
version, kinds and plurals (crds/), the scheduling gate it puts on worker pods
(README) and the field manager it writes with (docs/architecture.md), the
MutatingWebhookConfiguration it applies for its identity webhook (the chart's
README), and the labels KubeRay and GKE put on pods. They are written out here
instead of imported from the operator, so the benchmark measures the operator
without depending on its code or its module layout; a renamed label shows up as a
benchmark that sees no pods, not as one that quietly follows the change.
"""

from __future__ import annotations

from typing import Final

GROUP: Final = "tpuslice.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND_CLUSTER: Final = "TPUSliceCluster"
PLURAL_CLUSTER: Final = "tpusliceclusters"
PLURAL_RESERVATION: Final = "slicereservations"

#: The gate on every worker pod of a reserved slice until its pool is claimed.
SCHEDULING_GATE: Final = f"{GROUP}/slice-reservation"
#: The operator's field manager, also the reportingComponent of its Events.
FIELD_MANAGER: Final = "tpuslice-operator"
#: The identity webhook's MutatingWebhookConfiguration (applied by the operator at start).
WEBHOOK_CONFIG: Final = "tpuslice-identity"

#: GKE's node pool label; the operator pins a released slice's pods to its pool by it.
NODE_LABEL_NODEPOOL: Final = "cloud.google.com/gke-nodepool"

#: KubeRay's pod labels.
KUBERAY_LABEL_CLUSTER: Final = "ray.io/cluster"
KUBERAY_LABEL_NODE_TYPE: Final = "ray.io/node-type"
KUBERAY_LABEL_REPLICA_NAME: Final = "ray.io/worker-group-replica-name"
