"""Kueue's topology-aware scheduling at the node-pool level, adopted as the pool choice. Pure.

With a TPU worker template annotated ``kueue.x-k8s.io/podset-slice-required-topology:
cloud.google.com/gke-nodepool`` (and ``podset-slice-size`` the slice's hosts), or
``podset-required-topology`` at that level for a one-slice group (``spec.parts
._kueue_pool_level``), Kueue chooses a node pool for every slice's worth of pods when it
admits the object: its Workload's ``status.admission.podSetAssignments[].topologyAssignment``
(kubernetes-sigs/kueue v0.17.0 apis/kueue/v1beta2/workload_types.go, ``TopologyAssignment``:
``levels`` and per-domain pod counts) says how many pods go to which pool, and Kueue's
TopologyUngater (pkg/controller/tas/topology_ungater.go, ``Reconcile``) lifts its
``kueue.x-k8s.io/topology`` gate from each pod, adding the assigned domain's labels, from
the requested level down to the Topology's lowest (pkg/cache/scheduler/
tas_flavor_snapshot.go, ``buildTopologyAssignmentForLevels``), to the pod's nodeSelector:
``cloud.google.com/gke-nodepool: <pool>`` when the Topology ends at the node-pool level.

What is read: the pods' nodeSelector, not the Workload's topologyAssignment. The
nodeSelector is what the scheduler will obey, and a gated pod's nodeSelector can be added
to but never changed, so it is the one choice the operator can still pin the pod to; the
assignment only gives counts per pool, and which pod goes to which pool is the
ungater's own (by rank when the pod set names a pod index label, which Kueue's RayCluster
integration does not, else greedily in list order), so the assignment cannot say which
slice Kueue put where. The pods also arrive through the watch the pass already has; the
Workload is one more read.

The pass leaves out every slice any of whose pods still carries a Kueue gate
(``controller.cluster.admitted_snapshot``), so a slice comes here once Kueue has placed
all its pods. Its only candidate is the pool they name (``kueue_choice``): claimed
through the normal path when free and eligible (the queue's grant still applies); when
its pods name several pools, none, or a pool the operator cannot give it (another
object holds it, it is not of the shape, it is disrupted, the queue sets it aside for an
earlier request), the slice waits and says why (``adopt``): the operator never claims
another pool, which the pods could not run on.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from tpuslice.model.records import Holder, PodInfo

__all__ = ["KueueChoice", "adopt", "chosen_pools", "kueue_choice"]


@dataclass(frozen=True)
class KueueChoice:
    """Where Kueue's nodeSelector puts one slice's live pods."""

    #: each pool its pods name, with how many name it (sorted by pool)
    pools: tuple[tuple[str, int], ...]
    #: live pods that name none (Kueue has not placed them, or a Topology without the
    #: node-pool level)
    unplaced: int = 0

    @property
    def pool(self) -> str | None:
        """The one pool every pod names; None when they disagree or some name none."""
        if len(self.pools) == 1 and not self.unplaced:
            return self.pools[0][0]
        return None

    def describe(self) -> str:
        named = ", ".join(f"{pool} ({count} pods)" for pool, count in self.pools)
        if self.unplaced:
            named = f"{named}, none ({self.unplaced} pods)" if named else "none"
        return named


def kueue_choice(pods: Iterable[PodInfo]) -> KueueChoice:
    """The pools a slice's live pods are pinned to while they still carry the operator's
    gate: with the node-pool level adopted (the worker template's pool selector is the
    operator's alone, ``render.kuberay``), such a pin is Kueue's. Pods already released
    carry the operator's own pin, which is the pool it adopted."""
    counts: dict[str, int] = {}
    unplaced = 0
    for pod in pods:
        if pod.deleting:
            continue
        if pod.pinned_pool:
            counts[pod.pinned_pool] = counts.get(pod.pinned_pool, 0) + 1
        else:
            unplaced += 1
    return KueueChoice(tuple(sorted(counts.items())), unplaced)


def chosen_pools(slices: Iterable[Sequence[PodInfo]]) -> tuple[str, ...]:
    """The pools Kueue chose for the slices given (those that agree), for the shape's
    queue to set aside first (``PoolRequest.previous``)."""
    chosen = {kueue_choice(pods).pool for pods in slices}
    return tuple(sorted(p for p in chosen if p))


def adopt(
    slices: Sequence[tuple[str, Sequence[PodInfo]]],
    free: Collection[str],
    *,
    matching: Collection[str],
    held_by_others: Mapping[str, Holder],
    held_by_ours: Mapping[str, Holder],
    problem: Callable[[str], str | None],
    granted: Collection[str] | None,
    queue_message: str = "",
    noun: str = "node pool",
) -> tuple[dict[str, str], dict[str, str]]:
    """The pool to claim for each slice (by replica name) among ``free`` (the free,
    eligible pools the queue grants, ``granted`` None: no queue), each only the pool
    Kueue chose; and for every other slice why it waits, naming the pools its pods name
    and why the operator cannot hold them."""
    claims: dict[str, str] = {}
    waits: dict[str, str] = {}
    left = set(free)
    for name, pods in slices:
        choice = kueue_choice(pods)
        pool = choice.pool
        if pool is not None and pool in left:
            claims[name] = pool
            left.discard(pool)
            continue
        if pool is None and choice.pools and not any(p in matching for p, _ in choice.pools):
            why = (
                f"none of them is a {noun} of this slice's shape (a Topology level below "
                "the node pool, such as kubernetes.io/hostname, pins each pod to a node; "
                "Kueue's Topology must end at the node-pool level)"
            )
        elif pool is None:
            why = (
                f"its pods name several {noun}s (Kueue placed them apart)"
                if len(choice.pools) > 1
                else f"not every pod names a {noun} (Kueue's Topology must end at the "
                "node-pool level)"
            )
        elif pool in claims.values():
            why = f"Kueue named {pool} for another slice of this object too"
        elif pool in held_by_others:
            why = f"{noun} {pool} is held by {held_by_others[pool].describe()}"
        elif pool in held_by_ours:
            why = f"{noun} {pool} is held by this object's {held_by_ours[pool].replica_name}"
        elif pool not in matching:
            why = f"{noun} {pool} has no nodes of this slice's shape"
        elif (trouble := problem(pool)) is not None:
            why = f"{noun} {pool} {trouble}"
        elif granted is not None and pool not in granted:
            why = f"the queue does not grant {pool} now: {queue_message or 'waiting'}"
        else:
            why = f"{noun} {pool} is not free"
        waits[name] = (
            f"Kueue and the operator disagree: Kueue placed this slice's pods on "
            f"{choice.describe()}; {why}. The operator claims no other pool (the pods "
            f"can only run where Kueue pinned them); it waits until that pool is free, or "
            f"Kueue evicts and re-admits the object"
        )
    return claims, waits
