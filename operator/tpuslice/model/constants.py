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
KIND_JOB: Final = "TPUSliceJob"
PLURAL_JOB: Final = "tpuslicejobs"
KIND_SERVICE: Final = "TPUSliceService"
PLURAL_SERVICE: Final = "tpusliceservices"
#: Our kinds that own KubeRay objects, by kind: plural.
PLURALS: Final = {KIND_CLUSTER: PLURAL_CLUSTER, KIND_JOB: PLURAL_JOB, KIND_SERVICE: PLURAL_SERVICE}
KIND_RESERVATION: Final = "SliceReservation"
PLURAL_RESERVATION: Final = "slicereservations"
PLURAL_POLICY: Final = "tpuslicepolicies"

# --- what the operator puts on the RayCluster and its pods -------------------
LABEL_CLUSTER: Final = f"{GROUP}/cluster"
LABEL_ACCELERATOR_TYPE: Final = f"{GROUP}/accelerator-type"
LABEL_TOPOLOGY: Final = f"{GROUP}/topology"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
# On a RayJob / RayService (KubeRay copies them to every RayCluster it makes for
# it, so the clusters are found by label, not by name). Never tpuslice.dev/cluster
# there: that label means "the RayCluster of the TPUSliceCluster of this name".
LABEL_JOB: Final = f"{GROUP}/job"
LABEL_SERVICE: Final = f"{GROUP}/service"
# On worker pods of a TPUSliceJob's or TPUSliceService's clusters, next to
# tpuslice.dev/cluster=<owner name> (which the identity webhook selects on): the
# owner's kind, so a TPUSliceJob and a TPUSliceCluster of one name stay apart.
# Absent on a TPUSliceCluster's pods.
LABEL_OWNER_KIND: Final = f"{GROUP}/owner-kind"
MANAGED_BY: Final = "tpuslice-operator"
SCHEDULING_GATE: Final = f"{GROUP}/slice-reservation"
# On a single-host slice's pod, set by the release patch: when the operator released it
# (RFC 3339). The PodScheduled=False condition a pod gets while gated keeps its
# lastTransitionTime when the scheduler turns it into Unschedulable (the status stays
# False), so that time alone would count the wait in the queue as time unschedulable.
ANNOTATION_RELEASED_AT: Final = f"{GROUP}/released-at"
# On a SliceReservation (--pin-at-admission, planning/pinning.py): "true" while the
# identity webhook may pin a new pod of the holder's slice (object, group, replica
# index) to the held unit at admission; written only by the leader, only while the
# slice's unit (and its gang's) is held and healthy.
ANNOTATION_PIN: Final = f"{GROUP}/pin"
# On a SliceReservation: when the leader last removed ANNOTATION_PIN (RFC 3339). The
# fence: the unit is not let go (freed, handed to another index) until this time plus
# the webhook's timeout and a margin has passed and a live read finds no pod pinned to
# it; kept on the object so a restarted leader keeps the fence.
ANNOTATION_PIN_REMOVED_AT: Final = f"{GROUP}/pin-removed-at"
# The holder's replicaName of a reservation claimed for a replica index before KubeRay
# made any pod of it (--pin-at-admission): this prefix and the index. KubeRay names a
# replica "<group>-<5 random characters>", a label value
# (ray-operator/controllers/ray/utils/util.go GenerateRayWorkerReplicaGroupName), and
# "~" is never in a label value, so no replica KubeRay makes can carry this name. The
# replica of that index takes the reservation over (its replicaName) once it exists.
PLACEHOLDER_REPLICA_PREFIX: Final = "~index-"
# On a pod the identity webhook pinned at admission: the node pool it pinned it to (the
# pod was never gated, and no release patch follows).
ANNOTATION_PINNED: Final = f"{GROUP}/pinned-at-admission"
# Worker-template annotations: everything the TPU identity webhook needs beyond
# KubeRay's own labels, so it computes a pod's identity from the pod alone.
ANNOTATION_TPU_TYPE: Final = f"{GROUP}/tpu-type"
ANNOTATION_CHIPS_PER_HOST: Final = f"{GROUP}/chips-per-host"
ANNOTATION_SLICES: Final = f"{GROUP}/slices"
# "true" on the workers of an elastic slice set: their count moves, so the webhook
# writes no MEGASCALE_* of its own (docs/tpu-identity.md, "Elastic slice sets").
ANNOTATION_ELASTIC: Final = f"{GROUP}/elastic"
# "false" on the workers of a group of independent slices (spec.workerGroups[].tpu.multislice):
# the webhook writes no MEGASCALE_* at all, each slice is a job of its own.
ANNOTATION_MULTISLICE: Final = f"{GROUP}/multislice"
# "true" on the workers of a dynamic slice (spec.reservation.policy DynamicSlice): the
# webhook judges the topology by a GKE Slice's rules (4x4x12 is a Slice, never a pool).
ANNOTATION_DYNAMIC_SLICE: Final = f"{GROUP}/dynamic-slice"
# The Ray autoscaler v2's timeout for an instance allocated (its pod exists) to run
# Ray, after which it is terminated: spec.elastic.scaleUpTimeoutSeconds, sent as the
# autoscaler container's env (ray-project/ray 2.60
# python/ray/autoscaler/v2/instance_manager/config.py, default 3600 s).
ENV_AUTOSCALER_ALLOCATE_TIMEOUT: Final = "RAY_AUTOSCALER_RECONCILE_ALLOCATE_STATUS_TIMEOUT_S"
# Its default, when spec.elastic.scaleUpTimeoutSeconds is not set.
AUTOSCALER_ALLOCATE_TIMEOUT_DEFAULT_SECONDS: Final = 3600
# KubeRay's autoscalerOptions.version that runs the Ray autoscaler v2 (the only one
# whose KubeRay provider scales multi-host groups by whole replicas).
AUTOSCALER_VERSION: Final = "v2"
# On the RayCluster: digest of the last applied rendering, so a field we stop
# sending (suspend lifted, an override removed) triggers an apply that drops it.
ANNOTATION_APPLIED_HASH: Final = f"{GROUP}/applied-hash"
FIELD_MANAGER: Final = "tpuslice-operator"
WORKER_GROUP: Final = "tpu"
HEAD_CONTAINER: Final = "ray-head"
WORKER_CONTAINER: Final = "ray-worker"

# Ray and KubeRay floors (see README "Support floors").
MIN_RAY_VERSION: Final = (2, 54, 0)
# Most slices of one TPUSliceCluster (the CRD's maximum of spec.tpu.slices).
MAX_SLICES: Final = 4096
#: The longest ``--status-batch-seconds``: progress five minutes behind the slices is as
#: late as a status may be and still say where each slice stands.
MAX_STATUS_BATCH_SECONDS: Final = 300
# KubeRay refuses longer RayCluster names (63 minus its longest service suffix).
MAX_NAME_LENGTH: Final = 53
# KubeRay names a RayJob's or RayService's clusters "<name>-<5 random characters>"
# and refuses longer RayJob and RayService names (MaxRayJobNameLength).
MAX_JOB_NAME_LENGTH: Final = MAX_NAME_LENGTH - 6

# --- GKE ---------------------------------------------------------------------
TPU_RESOURCE: Final = "google.com/tpu"
NODE_LABEL_ACCELERATOR: Final = "cloud.google.com/gke-tpu-accelerator"
NODE_LABEL_TOPOLOGY: Final = "cloud.google.com/gke-tpu-topology"
NODE_LABEL_NODEPOOL: Final = "cloud.google.com/gke-nodepool"
#: A node's own name as a label (Kubernetes' well-known labels): a single-host slice's
#: pods are pinned to the node it holds with it.
NODE_LABEL_HOSTNAME: Final = "kubernetes.io/hostname"
TPU_TAINT_KEY: Final = "google.com/tpu"
# How a node's VM was provisioned (its capacity type; see convert.capacity_type), and
# where it sits in the data centre (GKE's topology labels, used by Kueue TAS and by
# GKE's kuberay-tpu-webhook). Documentation each was checked against:
#   reservation-name: https://cloud.google.com/kubernetes-engine/docs/how-to/consuming-reservations
#   gke-spot: https://cloud.google.com/kubernetes-engine/docs/how-to/spot-vms and
#     https://cloud.google.com/kubernetes-engine/docs/how-to/autopilot-spot-pods
#   gke-flex-start: https://cloud.google.com/kubernetes-engine/docs/how-to/dws-flex-start-training-tpu
#     and https://cloud.google.com/kubernetes-engine/docs/concepts/dws
#   gce-topology-*: https://cloud.google.com/ai-hypercomputer/docs/workloads/schedule-gke-workloads-tas
NODE_LABEL_RESERVATION_NAME: Final = "cloud.google.com/reservation-name"
NODE_LABEL_SPOT: Final = "cloud.google.com/gke-spot"
NODE_LABEL_PREEMPTIBLE: Final = "cloud.google.com/gke-preemptible"
NODE_LABEL_FLEX_START: Final = "cloud.google.com/gke-flex-start"
NODE_LABEL_PROVISIONING: Final = "cloud.google.com/gke-provisioning"
NODE_LABEL_TOPOLOGY_BLOCK: Final = "cloud.google.com/gce-topology-block"
NODE_LABEL_TOPOLOGY_SUBBLOCK: Final = "cloud.google.com/gce-topology-subblock"
# TPU7x dynamic slicing (GKE "Use dynamic slicing with a custom scheduler",
# https://docs.cloud.google.com/kubernetes-engine/docs/how-to/create-dynamic-slices, and
# "Configure TPUs with GKE dynamic slicing",
# https://docs.cloud.google.com/kubernetes-engine/docs/how-to/use-gke-dynamic-slicing):
# a sub-block pool's nodes carry the topology mode PROVISION_ONLY and a partition id label
# per partition shape (cloud.google.com/gke-tpu-partition-4x4x4-id); their ICI is not
# active until GKE's slice controller forms a Slice on them, and it then labels each node
# of the Slice with the Slice's name.
NODE_LABEL_ACCELERATOR_TOPOLOGY_MODE: Final = "cloud.google.com/gke-accelerator-topology-mode"
TOPOLOGY_MODE_PROVISION_ONLY: Final = "PROVISION_ONLY"
NODE_LABEL_TPU_PARTITION_PREFIX: Final = "cloud.google.com/gke-tpu-partition-"
NODE_LABEL_TPU_PARTITION_ID_SUFFIX: Final = "-id"
NODE_LABEL_TPU_SLICE: Final = "cloud.google.com/gke-tpu-slice"
NODE_LABEL_TPU_PARTITION_ID: Final = "cloud.google.com/gke-tpu-partition-4x4x4-id"
NODE_LABEL_TPU_PARTITION_STATE: Final = "cloud.google.com/gke-tpu-partition-4x4x4-state"
# The GKE Slice (same pages, and the Slice reference,
# https://cloud.google.com/kubernetes-engine/docs/reference/crds/slice): cluster-scoped,
# spec type, topology, partitionIds; status condition Ready; GKE's finalizer, which its
# slice controller removes once the partitions are unlinked. The operator creates one per
# dynamic slice (spec.reservation.policy DynamicSlice) and marks it with the annotations
# below, naming the TPUSlice object and the slice: a Slice without them is not ours.
SLICE_GROUP: Final = "accelerator.gke.io"
SLICE_VERSION: Final = "v1beta1"
SLICE_PLURAL: Final = "slices"
SLICE_KIND: Final = "Slice"
SLICE_TYPE_TPU7X: Final = "tpu7x"
SLICE_FINALIZER: Final = "accelerator.gke.io/slice-finalizer"
SLICE_MAX_NAME: Final = 49
ANNOTATION_SLICE_OWNER_KIND: Final = f"{GROUP}/owner-kind"
ANNOTATION_SLICE_OWNER_NAMESPACE: Final = f"{GROUP}/owner-namespace"
ANNOTATION_SLICE_OWNER_NAME: Final = f"{GROUP}/owner-name"
ANNOTATION_SLICE_OWNER_UID: Final = f"{GROUP}/owner-uid"
ANNOTATION_SLICE_REPLICA: Final = f"{GROUP}/slice"
ANNOTATION_SLICE_INDEX: Final = f"{GROUP}/slice-index"
# A worker-template annotation asking GKE's webhooks for a sub-slice of the pool's
# topology (sub-slicing; Ray's guide, ray-project/ray PR #65404 tpu-subslicing.md).
ANNOTATION_GKE_SLICE_TOPOLOGY: Final = "cloud.google.com/gke-tpu-slice-topology"

# Capacity keys a slice may select on (spec.reservation.provisioning.nodeSelector): copied
# to the ProvisioningRequest's PodTemplate and to every worker pod. Only node labels GKE
# sets on TPU nodes of Standard pools, so the pods can land on a pool GKE made for them:
#   gke-spot, reservation-name, gke-flex-start: the capacity-type docs above;
#   compute-class: https://cloud.google.com/kubernetes-engine/docs/concepts/about-custom-compute-classes
NODE_LABEL_COMPUTE_CLASS: Final = "cloud.google.com/compute-class"
CAPACITY_SELECTOR_KEYS: Final = (
    NODE_LABEL_SPOT,
    NODE_LABEL_RESERVATION_NAME,
    NODE_LABEL_COMPUTE_CLASS,
    NODE_LABEL_FLEX_START,
)
# Keys whose only value GKE writes is "true".
CAPACITY_SELECTOR_TRUE_ONLY: Final = (NODE_LABEL_SPOT, NODE_LABEL_FLEX_START)

# --- ProvisioningRequest (the cluster autoscaler's API; capacity that does not exist yet)
# kubernetes/autoscaler cluster-autoscaler/apis/provisioningrequest/autoscaling.x-k8s.io/v1
# (types.go); GKE's queued class: GoogleCloudPlatform/cluster-autoscaler
# pkg/provisioningrequests/queuedwrapper/wrapper.go.
PROVREQ_GROUP: Final = "autoscaling.x-k8s.io"
PROVREQ_VERSION: Final = "v1"
PROVREQ_API_VERSION: Final = f"{PROVREQ_GROUP}/{PROVREQ_VERSION}"
PROVREQ_KIND: Final = "ProvisioningRequest"
PROVREQ_PLURAL: Final = "provisioningrequests"
PODTEMPLATE_KIND: Final = "PodTemplate"
PODTEMPLATE_PLURAL: Final = "podtemplates"
PROVREQ_CLASS_BEST_EFFORT_ATOMIC: Final = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
PROVREQ_CLASS_QUEUED: Final = "queued-provisioning.gke.io"
# Both on every pod of a slice whose capacity came from a request (added by the release
# patch): pods carrying them never trigger a normal scale-up.
ANNOTATION_CONSUME_PROVREQ: Final = "autoscaling.x-k8s.io/consume-provisioning-request"
ANNOTATION_PROVREQ_CLASS: Final = "autoscaling.x-k8s.io/provisioning-class-name"
# status.conditions[].type of a ProvisioningRequest.
PROVREQ_ACCEPTED: Final = "Accepted"
PROVREQ_PROVISIONED: Final = "Provisioned"
PROVREQ_FAILED: Final = "Failed"
PROVREQ_BOOKING_EXPIRED: Final = "BookingExpired"
PROVREQ_CAPACITY_REVOKED: Final = "CapacityRevoked"
# The status.provisioningClassDetails key naming the node pool GKE's queued class made.
PROVREQ_DETAIL_NODE_POOL: Final = "NodePoolName"
# GKE taints the nodes of a queued pool.
QUEUED_TAINT_KEY: Final = "cloud.google.com/gke-queued"
# Capacity is booked for this long after Provisioned=True (OSS processors/provreq
# defaultReservationTime, GKE provreqstate BookingDuration); both hard-coded.
PROVREQ_BOOKING_SECONDS: Final = 600
# On our PodTemplates and ProvisioningRequests: which slice, which attempt.
LABEL_RAYCLUSTER: Final = f"{GROUP}/raycluster"
LABEL_SLICE_INDEX: Final = f"{GROUP}/slice-index"
LABEL_PROVISIONING_ATTEMPT: Final = f"{GROUP}/provisioning-attempt"
# On our ProvisioningRequests: failures counted before this attempt (the retry limit's
# count survives restarts in the API server), and a digest of the immutable spec.
ANNOTATION_PROVISIONING_FAILURES: Final = f"{GROUP}/provisioning-failures"
ANNOTATION_PROVREQ_HASH: Final = f"{GROUP}/request-hash"
# On a CapacityRevoked request of ours whose slice was replaced: the node pool it ran on.
# The request is kept (and the pool kept from every object) until the pool has no nodes:
# GKE deletes the VMs after CapacityRevoked, so a slice that claimed the pool meanwhile
# would be pinned to nodes about to vanish.
ANNOTATION_REVOKED_POOL: Final = f"{GROUP}/revoked-node-pool"

# --- KubeRay -----------------------------------------------------------------
RAY_GROUP: Final = "ray.io"
RAY_VERSION: Final = "v1"
RAY_API_VERSION: Final = f"{RAY_GROUP}/{RAY_VERSION}"
RAY_KIND_CLUSTER: Final = "RayCluster"
RAY_PLURAL_CLUSTER: Final = "rayclusters"
RAY_KIND_JOB: Final = "RayJob"
RAY_PLURAL_JOB: Final = "rayjobs"
RAY_KIND_SERVICE: Final = "RayService"
RAY_PLURAL_SERVICE: Final = "rayservices"
#: The KubeRay kind each of our kinds renders.
RAY_KIND_OF: Final = {
    KIND_CLUSTER: RAY_KIND_CLUSTER,
    KIND_JOB: RAY_KIND_JOB,
    KIND_SERVICE: RAY_KIND_SERVICE,
}
RAY_PLURALS: Final = {
    RAY_KIND_CLUSTER: RAY_PLURAL_CLUSTER,
    RAY_KIND_JOB: RAY_PLURAL_JOB,
    RAY_KIND_SERVICE: RAY_PLURAL_SERVICE,
}
# KubeRay labels every RayCluster (and submitter Job) it makes for a RayJob or a
# RayService with the owner's name and kind (RayJob / RayService).
KUBERAY_LABEL_CLUSTER: Final = "ray.io/cluster"
KUBERAY_LABEL_GROUP: Final = "ray.io/group"
KUBERAY_LABEL_NODE_TYPE: Final = "ray.io/node-type"
KUBERAY_LABEL_REPLICA_INDEX: Final = "ray.io/worker-group-replica-index"
KUBERAY_LABEL_REPLICA_NAME: Final = "ray.io/worker-group-replica-name"
KUBERAY_LABEL_HOST_INDEX: Final = "ray.io/replica-host-index"
KUBERAY_NODE_TYPE_WORKER: Final = "worker"
# KubeRay names the headless Service of multi-host workers "<raycluster>-headless"
# (never truncated: RayCluster names are at most 53 characters).
KUBERAY_HEADLESS_SUFFIX: Final = "-headless"
KUBERAY_MULTI_HOST_GATE: Final = "RayMultiHostIndexing"

# --- Ray node labels (ray._raylet RAY_NODE_*_KEY, Ray >= 2.49) ---------------
# Written in the TPU worker group's `labels` (KubeRay >= 1.5 passes them to
# `ray start --labels` and onto the pods), with the values Ray itself derives on
# a TPU host, so label selectors and the autoscaler see slices before any pod
# runs. The per-host ones (ray.io/tpu-slice-name, ray.io/tpu-worker-id) differ
# from pod to pod and are left to Ray.
RAY_LABEL_ACCELERATOR_TYPE: Final = "ray.io/accelerator-type"
RAY_LABEL_TPU_TOPOLOGY: Final = "ray.io/tpu-topology"
RAY_LABEL_TPU_POD_TYPE: Final = "ray.io/tpu-pod-type"

# --- TPU identity (what GKE's kuberay-tpu-webhook injects; see identity.py) ---
ENV_TPU_WORKER_ID: Final = "TPU_WORKER_ID"
ENV_TPU_NAME: Final = "TPU_NAME"
ENV_TPU_WORKER_HOSTNAMES: Final = "TPU_WORKER_HOSTNAMES"
ENV_TPU_PROCESS_ADDRESSES: Final = "TPU_PROCESS_ADDRESSES"
ENV_TPU_PROCESS_PORT: Final = "TPU_PROCESS_PORT"
ENV_TPU_DEVICE_PLUGIN_HOST_IP: Final = "TPU_DEVICE_PLUGIN_HOST_IP"
ENV_TPU_DEVICE_PLUGIN_ADDR: Final = "TPU_DEVICE_PLUGIN_ADDR"
ENV_MEGASCALE_NUM_SLICES: Final = "MEGASCALE_NUM_SLICES"
ENV_MEGASCALE_SLICE_ID: Final = "MEGASCALE_SLICE_ID"
ENV_MEGASCALE_COORDINATOR_ADDRESS: Final = "MEGASCALE_COORDINATOR_ADDRESS"
ENV_MEGASCALE_PORT: Final = "MEGASCALE_PORT"
# Set by GKE's TPU device plugin (not by any webhook); Ray reads both.
ENV_TPU_ACCELERATOR_TYPE: Final = "TPU_ACCELERATOR_TYPE"
ENV_TPU_TOPOLOGY: Final = "TPU_TOPOLOGY"
TPU_PROCESS_PORT_BASE: Final = 8471
MEGASCALE_PORT_BASE: Final = 8081
TPU_DEVICE_PLUGIN_PORT: Final = 2112
# Name of the mutating webhook (configuration and kopf handler id).
IDENTITY_WEBHOOK: Final = "tpuslice-identity"

# GKE's host maintenance and termination taints (GKE "Manage disruption to GKE nodes
# that don't live migrate", https://cloud.google.com/kubernetes-engine/docs/concepts/
# handle-disruption-gpu-tpu): the planner judges them itself (planning/disruption.py).
NODE_TAINT_IMPENDING_TERMINATION: Final = "cloud.google.com/impending-node-termination"
NODE_TAINT_MAINTENANCE_STARTED: Final = "cloud.google.com/maintenance-window-started"
DISRUPTION_TAINT_KEYS: Final = (NODE_TAINT_IMPENDING_TERMINATION, NODE_TAINT_MAINTENANCE_STARTED)

# Kueue (kubernetes-sigs/kueue v0.17.0): the labels a job names its LocalQueue and
# WorkloadPriorityClass with (pkg/constants: QueueLabel, WorkloadPriorityClassLabel), the
# prefix of its scheduling gates on pods (kueue.x-k8s.io/topology for TAS,
# kueue.x-k8s.io/elastic-job for workload slices; apis/kueue/v1beta2), and the
# topology-aware-scheduling annotations of a pod template (PodSetRequiredTopologyAnnotation,
# PodSetPreferredTopologyAnnotation, in apis/kueue/v1beta2/topology_types.go).
KUEUE_GROUP: Final = "kueue.x-k8s.io"
KUEUE_QUEUE_LABEL: Final = f"{KUEUE_GROUP}/queue-name"
KUEUE_PRIORITY_LABEL: Final = f"{KUEUE_GROUP}/priority-class"
KUEUE_GATE_PREFIX: Final = f"{KUEUE_GROUP}/"
KUEUE_REQUIRED_TOPOLOGY: Final = f"{KUEUE_GROUP}/podset-required-topology"
KUEUE_PREFERRED_TOPOLOGY: Final = f"{KUEUE_GROUP}/podset-preferred-topology"
KUEUE_TAS_PREFIX: Final = f"{KUEUE_GROUP}/podset-"
#: The slice form of a TAS request: every ``podset-slice-size`` pods of the pod set in one
#: domain of the ``podset-slice-required-topology`` level (PodSetSliceRequiredTopology-
#: Annotation, PodSetSliceSizeAnnotation), and the gate Kueue's TopologyUngater lifts
#: (TopologySchedulingGate) when it adds the assigned domain's labels to the pod's
#: nodeSelector (pkg/controller/tas/topology_ungater.go).
KUEUE_SLICE_REQUIRED_TOPOLOGY: Final = f"{KUEUE_GROUP}/podset-slice-required-topology"
KUEUE_SLICE_SIZE: Final = f"{KUEUE_GROUP}/podset-slice-size"
KUEUE_TOPOLOGY_GATE: Final = f"{KUEUE_GROUP}/topology"
#: Kueue's annotation holding a job's Workload from admission while it names any gate
#: (a comma-separated list; only at create, gates only removed later; feature gate
#: AdmissionGatedBy, alpha and off by default: pkg/constants/constants.go,
#: pkg/util/webhook/validation_admissiongatedby.go), and the operator's gate in it.
KUEUE_ADMISSION_GATED_BY: Final = f"{KUEUE_GROUP}/admission-gated-by"
POOLS_FREE_GATE: Final = "tpuslice.dev/pools-free"
#: Kueue's elastic jobs (workload slices; feature gate ElasticJobsViaWorkloadSlices,
#: alpha and off by default in v0.17): the annotation a job opts in with and the
#: scheduling gate Kueue's RayCluster webhook requires on the head and every worker
#: template, removed from a scale-up's pods once Kueue admits the new workload slice
#: (pkg/workloadslicing/workloadslicing.go, apis/kueue/v1beta2/constants.go,
#: pkg/controller/jobs/raycluster/raycluster_webhook.go).
KUEUE_ELASTIC_JOB: Final = f"{KUEUE_GROUP}/elastic-job"
#: spec.kueue.admissionGate's one value.
ADMISSION_GATE_POOLS_FREE: Final = "UntilPoolsFree"
#: The API versions of Kueue's objects the operator reads, newest first.
KUEUE_VERSIONS: Final = ("v1beta2", "v1beta1")
#: Kueue labels a job's Workload with the job's uid (pkg/controller/constants, JobUIDLabel).
KUEUE_JOB_UID_LABEL: Final = f"{KUEUE_GROUP}/job-uid"
#: The controllerName of Kueue's ProvisioningRequest admission check
#: (pkg/controller/admissionchecks/provisioning, ControllerName).
KUEUE_PROVREQ_CHECK: Final = f"{KUEUE_GROUP}/provisioning-request"
