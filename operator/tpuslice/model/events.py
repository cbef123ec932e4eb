"""Kubernetes Event reasons, in one place: users alert on them, so they are API.

Events are posted on transitions only (a slice changing state, a reservation
made or released, the cluster stalling), never on every pass.
"""

from __future__ import annotations

from typing import Final

from tpuslice.model.records import SliceState

SLICE_RESERVED: Final = "SliceReserved"  # a node pool was claimed for a slice
SLICE_RELEASED: Final = "SliceReleased"  # a slice's reservation was deleted (pods gone)
SLICE_HANDED_OVER: Final = "SliceHandedOver"  # a job's retry got the pool its last attempt held
SLICE_SCHEDULED: Final = "SliceScheduled"  # every pod of a slice was released and pinned
SLICE_READY: Final = "SliceReady"
SLICE_TERMINATING: Final = "SliceTerminating"
WAITING_FOR_CAPACITY: Final = "WaitingForCapacity"
# a single-host slice left a node held by pods the operator did not place (planning/busy.py)
SLICE_MOVED: Final = "SliceMovedOffBusyNode"
# a node of a held unit is terminated, maintained, NotReady or UNHEALTHY: the whole slice
# is drained at once (planning/disruption.py)
SLICE_DISRUPTED: Final = "SliceDisrupted"
# a drained slice's pods stuck terminating on a host that is gone or tainted
# node.kubernetes.io/out-of-service were deleted with grace 0 (planning/disruption.py)
STUCK_PODS_DELETED: Final = "StuckPodsForceDeleted"
RESERVATION_LOST: Final = "ReservationConflict"  # the pool was claimed by someone else first
CLUSTER_READY: Final = "Ready"
# A pass failed (API error, bug); posted at most every few minutes per cluster while
# it keeps failing. Also the reason of Ready/Reconciling meanwhile.
RECONCILE_ERROR: Final = "ReconcileError"

# Stalled reasons (status conditions and events).
KUBERAY_NOT_INSTALLED: Final = "KubeRayNotInstalled"
MULTIHOST_INDEXING_DISABLED: Final = "MultiHostIndexingDisabled"
INVALID_SPEC: Final = "InvalidSpec"
APPLY_REJECTED: Final = "RayClusterRejected"
# A RayCluster of the TPUSliceCluster's name exists and is not controlled by it.
RAYCLUSTER_NAME_TAKEN: Final = "RayClusterNameTaken"
# A ProvisioningRequest admission check of Kueue on the object's ClusterQueue would ask for
# the TPU capacity the operator's per-slice requests ask for (status/kueue.py).
KUEUE_PROVISIONING_CHECK: Final = "KueueProvisioningCheck"
# Kueue evicted the object's RayCluster or RayJob (the message has Kueue's reason).
KUEUE_EVICTED: Final = "KueueEvicted"
# Kueue's webhook took the object's RayCluster or RayJob into the namespace's LocalQueue
# named default (the object names no queue): posted once, when Kueue first holds it.
KUEUE_DEFAULT_LOCAL_QUEUE: Final = "KueueDefaultLocalQueue"
# More slices than node pools of the shape exist (SlicePlan.stalled / Admission.stalled).
NOT_ENOUGH_POOLS: Final = "NotEnoughPools"
# reservation.policy None with a worker nodeSelector naming a unit a reservation holds.
PINNED_TO_HELD: Final = "PinnedToHeldCapacity"

# Capacity on demand (spec.reservation.provisioning; capacity/decide.py decides).
PROVISIONING_REQUESTED: Final = "ProvisioningRequested"  # a request was created for a slice
CAPACITY_PROVISIONED: Final = "CapacityProvisioned"  # Provisioned=True: claiming its pool
PROVISIONING_RETRY: Final = "ProvisioningRetry"  # a failed/expired attempt, retried after backoff
PROVISIONING_REQUEST_DELETED: Final = "ProvisioningRequestDeleted"  # not needed any more
BOOKING_EXPIRED: Final = "BookingExpired"  # booked capacity lapsed before the slice was bound
BOOKING_GIVEN_BACK: Final = "BookingGivenBack"  # not claimed within the claim window
CAPACITY_REVOKED: Final = "CapacityRevoked"  # GKE took the VMs back (maxRunDurationSeconds)
# A slice entered state Provisioning (its request waits for capacity). The Ready and
# Reconciling reason is then the state's name, Provisioning, as for every slice state.
PROVISIONING_CAPACITY: Final = "ProvisioningCapacity"
# Stalled reasons: the autoscaler refused the request as configured (or the retry limit
# is spent), and the ProvisioningRequest CRD is not installed.
PROVISIONING_FAILED: Final = "ProvisioningFailed"
PROVISIONING_NOT_INSTALLED: Final = "ProvisioningRequestNotInstalled"

# A slice above an elastic set's minimum that the autoscaler asked for waits for capacity.
SLICE_REQUESTED: Final = "SliceRequested"
# Such a slice waited past the autoscaler's allocate timeout (it gives the slice up);
# also the condition's type and reason.
SCALE_UP_TIMED_OUT: Final = "ScaleUpTimedOut"
# The autoscaler named a pod of a slice in workersToDelete (KubeRay deletes the slice).
SLICE_REMOVED_BY_AUTOSCALER: Final = "SliceRemovedByAutoscaler"

SLICE_STATE_REASONS: Final = {
    SliceState.RESERVED: SLICE_RESERVED,
    SliceState.SCHEDULED: SLICE_SCHEDULED,
    SliceState.READY: SLICE_READY,
    SliceState.WAITING_FOR_CAPACITY: WAITING_FOR_CAPACITY,
    SliceState.PROVISIONING: PROVISIONING_CAPACITY,
    SliceState.RELEASING: SLICE_TERMINATING,
    SliceState.REQUESTED: SLICE_REQUESTED,
}
