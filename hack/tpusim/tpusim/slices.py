"""GKE's slice controller for TPU7x dynamic slicing, as pure decisions (a simulation).

``tpusim.slicectl`` reads the cluster (Slices and nodes), asks ``decide`` what GKE's
slice controller does next with each Slice, and does it. Nothing here talks to a
cluster, so every rule has a unit test (hack/tpusim/tests/test_slices.py).

What GKE documents, and where each rule comes from:

- The Slice API (``accelerator.gke.io/v1beta1``, cluster-scoped, spec ``type``,
  ``topology``, ``partitionIds``; annotation ``slice.gke.io/retry-on-failure``; a
  validating webhook that rejects an invalid spec): GKE's "Slice" custom resource
  reference, https://cloud.google.com/kubernetes-engine/docs/reference/crds/slice.
  Its topology rules: ``AxBxC``, each dimension a multiple of 4, ``A <= B <= C``, at most
  9,216 chips, one partition per 64 chips; a name of at most 49 characters matching
  ``^[a-z]([-a-z0-9]*[a-z0-9])?$`` (one revision of that page says 54; the stricter is
  kept).
- The Ready condition's reasons (SliceNotCreated, SliceCreationFailed, ACTIVATING,
  ACTIVE, ACTIVE_DEGRADED, FAILED, DEACTIVATING, INCOMPLETE), the finalizer
  ``accelerator.gke.io/slice-finalizer``, the partition states (HEALTHY and DEGRADED
  usable; UNHEALTHY, UNSET, INCOMPLETE not) and the labels an ACTIVE Slice's nodes get
  (``cloud.google.com/gke-tpu-slice=<Slice>`` and ``gke-tpu-topology=<topology>``,
  "added by slice controller"): "Use dynamic slicing with a custom scheduler",
  https://cloud.google.com/kubernetes-engine/docs/how-to/create-dynamic-slices.
- A sub-block is one 4x4x4 partition of 16 TPU VMs, one node pool each: "Configure TPUs
  with GKE dynamic slicing",
  https://cloud.google.com/kubernetes-engine/docs/how-to/use-gke-dynamic-slicing.

Where the docs are silent, this simulation chooses, and says so:

- GKE rejects an invalid spec at admission; here there is no webhook, so the same
  checks run in ``spec_errors`` and the Slice gets Ready=False SliceCreationFailed.
- A partition that is missing, not tpu7x, not usable, not whole (16 nodes), or held by
  another Slice fails the Slice the same way (SliceCreationFailed, the message naming
  the partition). All partitions of a Slice must share one
  ``cloud.google.com/gce-topology-block`` when their nodes carry one (ICI links stay
  inside a block; 9,216 chips is one TPU7x pod): an assumption.
- A Slice holds its partitions from ACTIVATING until it is deleted, FAILED included,
  so a failed Slice's partitions are free only once its owner deletes it.
- Partitions going UNHEALTHY (or UNSET, INCOMPLETE, fewer nodes) turn an ACTIVATING or
  ACTIVE Slice FAILED; DEGRADED ones make it ACTIVE_DEGRADED, and back to ACTIVE once
  all are HEALTHY again. A FAILED Slice stays FAILED unless it carries
  ``slice.gke.io/retry-on-failure: "true"``; then it activates again once its
  partitions are usable (SliceCreationFailed likewise).
- The node labels stay until the Slice is deleted, FAILED included; deleting removes
  them and the finalizer in one pass (no DEACTIVATING delay).
- Sub-slices (below 4x4x4, GKE 1.36+) are refused as not simulated.

Faults on demand (a simulation's, not GKE's): ``tpusim.dev/slice-fault`` on a Slice,
``fail`` (FAILED), ``degrade`` (ACTIVE_DEGRADED while set), ``never`` (stays ACTIVATING)
or ``none``; ``FaultRule`` puts one on Slices whose name matches, as the ConfigMap
``kube-system/tpusim-slicectl`` key ``faults`` says.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .nodepools import (
    PARTITION_ID_LABEL,
    PARTITION_STATE_LABEL,
    SLICE_LABEL,
    TOPOLOGY_BLOCK_LABEL,
    TOPOLOGY_LABEL,
)
from .provreq import format_time, parse_time

GROUP = "accelerator.gke.io"
VERSION = "v1beta1"
PLURAL = "slices"
KIND = "Slice"
CRD_NAME = f"{PLURAL}.{GROUP}"
FINALIZER = "accelerator.gke.io/slice-finalizer"
RETRY_ANNOTATION = "slice.gke.io/retry-on-failure"
FAULT_ANNOTATION = "tpusim.dev/slice-fault"
ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TPU7X_ACCELERATOR = "tpu7x"
SLICE_TYPE = "tpu7x"

READY = "Ready"
SLICE_NOT_CREATED = "SliceNotCreated"
SLICE_CREATION_FAILED = "SliceCreationFailed"
ACTIVATING = "ACTIVATING"
ACTIVE = "ACTIVE"
ACTIVE_DEGRADED = "ACTIVE_DEGRADED"
FAILED = "FAILED"
DEACTIVATING = "DEACTIVATING"
INCOMPLETE = "INCOMPLETE"
#: Every reason GKE's doc lists for the Ready condition.
REASONS = (
    SLICE_NOT_CREATED,
    SLICE_CREATION_FAILED,
    ACTIVATING,
    ACTIVE,
    ACTIVE_DEGRADED,
    FAILED,
    DEACTIVATING,
    INCOMPLETE,
)
#: Reasons under which a Slice holds its partitions (no other Slice may take them).
HOLDING = frozenset({ACTIVATING, ACTIVE, ACTIVE_DEGRADED, FAILED, DEACTIVATING})

HEALTHY = "HEALTHY"
DEGRADED = "DEGRADED"
USABLE_STATES = frozenset({HEALTHY, DEGRADED})
#: Worst first: the state of a partition whose nodes disagree is the worst of theirs.
_STATE_ORDER = ("UNHEALTHY", "INCOMPLETE", "UNSET", DEGRADED, HEALTHY)

CHIPS_PER_PARTITION = 64
PARTITION_NODES = 16
MAX_CHIPS = 9216
MAX_NAME = 49
_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
SIMULATED = " (simulated by tpusim)"

FAULTS = ("none", "fail", "degrade", "never")
MAX_FAULT_RULES = 100


@dataclass(frozen=True)
class Timings:
    """How long the simulated controller takes; ``activation_s``: ACTIVATING -> ACTIVE."""

    activation_s: float = 3.0

    def __post_init__(self) -> None:
        if not 0 <= self.activation_s <= 3600:
            raise ValueError(f"activationS {self.activation_s} must be between 0 and 3600 seconds")

    @classmethod
    def from_mapping(cls, raw: Any, base: Timings | None = None) -> Timings:
        """Overrides from the ConfigMap key ``settings`` (``activationS``)."""
        base = base or cls()
        if raw is None:
            return base
        if not isinstance(raw, Mapping):
            raise ValueError(f"settings must be a mapping like {{activationS: 3}}, not {raw!r}")
        unknown = set(raw) - {"activationS"}
        if unknown:
            raise ValueError(f"settings: unknown keys {sorted(unknown)} (known: activationS)")
        value = raw.get("activationS", base.activation_s)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"settings.activationS must be a number of seconds, not {value!r}")
        return cls(activation_s=float(value))


@dataclass(frozen=True)
class FaultRule:
    """Put ``fault`` on the first ``times`` Slices (None: every one) whose name matches
    the glob ``match``, when the controller first sees each."""

    match: str
    fault: str
    times: int | None = None

    def __post_init__(self) -> None:
        if not self.match or len(self.match) > 253:
            raise ValueError(f"fault rule match {self.match!r} must be a name glob of 1-253 chars")
        if self.fault not in FAULTS:
            raise ValueError(f"fault rule fault {self.fault!r} must be one of {', '.join(FAULTS)}")
        if self.times is not None and not 1 <= self.times <= 10_000:
            raise ValueError(f"fault rule times {self.times} must be 1-10000 or unset (every one)")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"match": self.match, "fault": self.fault}
        if self.times is not None:
            out["times"] = self.times
        return out


def parse_rules(raw: Any) -> list[FaultRule]:
    """The ConfigMap's ``faults``: a list of ``{match, fault, times?}``."""
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > MAX_FAULT_RULES:
        raise ValueError(
            f"faults must be a list of at most {MAX_FAULT_RULES} rules "
            f"like [{{match: 'demo-*', fault: fail, times: 1}}]"
        )
    rules = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping) or set(item) - {"match", "fault", "times"}:
            raise ValueError(f"faults[{i}] must be a mapping of match, fault and times")
        times = item.get("times")
        if times is not None and (isinstance(times, bool) or not isinstance(times, int)):
            raise ValueError(f"faults[{i}].times must be an integer, not {times!r}")
        try:
            rules.append(FaultRule(str(item.get("match", "")), str(item.get("fault", "")), times))
        except ValueError as exc:
            raise ValueError(f"faults[{i}]: {exc}") from None
    return rules


def choose_fault(name: str, rules: Sequence[FaultRule], uses: Mapping[int, int]) -> int | None:
    """The index of the first rule for a newly seen Slice ``name`` with uses left."""
    for i, rule in enumerate(rules):
        if fnmatch.fnmatchcase(name, rule.match) and (
            rule.times is None or uses.get(i, 0) < rule.times
        ):
            return i
    return None


@dataclass(frozen=True)
class Condition:
    status: str
    reason: str
    message: str
    since: float

    def to_dict(self) -> dict[str, str]:
        return {
            "type": READY,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
            "lastTransitionTime": format_time(self.since),
        }


@dataclass(frozen=True)
class SliceView:
    """What the controller needs of one Slice object."""

    name: str
    created: float
    type: str
    topology: str
    partition_ids: tuple[str, ...]
    deleting: bool = False
    finalizers: tuple[str, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    ready: Condition | None = None

    @property
    def reason(self) -> str | None:
        return self.ready.reason if self.ready else None

    @property
    def fault(self) -> str:
        value = self.annotations.get(FAULT_ANNOTATION, "none")
        return value if value in FAULTS else "none"

    @property
    def retries(self) -> bool:
        return self.annotations.get(RETRY_ANNOTATION) == "true"


def parse_slice(obj: Mapping[str, Any]) -> SliceView:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    ready = None
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == READY:
            ready = Condition(
                str(cond.get("status", "Unknown")),
                str(cond.get("reason", "")),
                str(cond.get("message", "")),
                parse_time(cond.get("lastTransitionTime")),
            )
    return SliceView(
        name=str(meta.get("name", "")),
        created=parse_time(meta.get("creationTimestamp")),
        type=str(spec.get("type", "")),
        topology=str(spec.get("topology", "")),
        partition_ids=tuple(str(p) for p in spec.get("partitionIds") or ()),
        deleting=bool(meta.get("deletionTimestamp")),
        finalizers=tuple(meta.get("finalizers") or ()),
        annotations=dict(meta.get("annotations") or {}),
        ready=ready,
    )


@dataclass(frozen=True)
class Partition:
    """One 4x4x4 partition as its nodes' labels describe it."""

    id: str
    nodes: tuple[str, ...]
    states: frozenset[str]
    blocks: frozenset[str]
    accelerators: frozenset[str]
    #: gke-tpu-slice values its nodes carry (a formed Slice's name).
    slices: frozenset[str]

    @property
    def state(self) -> str:
        for state in _STATE_ORDER:
            if state in self.states:
                return state
        return "UNSET"

    @property
    def whole(self) -> bool:
        return len(self.nodes) == PARTITION_NODES


def partitions_of(nodes: Iterable[Mapping[str, Any]]) -> dict[str, Partition]:
    """Partitions by id, from Node dicts carrying ``gke-tpu-partition-4x4x4-id``."""
    found: dict[str, list[Mapping[str, str]]] = {}
    names: dict[str, list[str]] = {}
    for node in nodes:
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        pid = labels.get(PARTITION_ID_LABEL)
        if pid:
            found.setdefault(pid, []).append(labels)
            names.setdefault(pid, []).append(str(meta.get("name", "")))
    return {
        pid: Partition(
            id=pid,
            nodes=tuple(sorted(names[pid])),
            states=frozenset(ls.get(PARTITION_STATE_LABEL, "UNSET") for ls in found[pid]),
            blocks=frozenset(
                ls[TOPOLOGY_BLOCK_LABEL] for ls in found[pid] if TOPOLOGY_BLOCK_LABEL in ls
            ),
            accelerators=frozenset(ls.get(ACCELERATOR_LABEL, "") for ls in found[pid]),
            slices=frozenset(ls[SLICE_LABEL] for ls in found[pid] if SLICE_LABEL in ls),
        )
        for pid in found
    }


def topology_dims(topology: str) -> tuple[int, ...] | None:
    parts = topology.split("x")
    if len(parts) != 3 or not all(p.isascii() and p.isdigit() and len(p) <= 5 for p in parts):
        return None
    return tuple(int(p) for p in parts)


def partitions_for(topology: str) -> int | None:
    """Partitions a valid topology takes (chips / 64); None if GKE would refuse it."""
    return None if topology_errors(topology) else math.prod(topology_dims(topology) or ()) // 64


def topology_errors(topology: str) -> list[str]:
    """Why GKE's webhook refuses ``spec.topology`` (none: allowed)."""
    dims = topology_dims(topology)
    if dims is None:
        return [f"spec.topology {topology!r} must be AxBxC, for example 4x4x8"]
    if any(d < 4 for d in dims) and all(d > 0 for d in dims) and math.prod(dims) < 64:
        return [
            f"spec.topology {topology}: a sub-slice of one 4x4x4 partition (GKE 1.36+) is "
            f"not simulated by tpusim; use whole partitions (4x4x4, 4x4x8, ...)"
        ]
    errors = []
    if any(d == 0 or d % 4 for d in dims):
        errors.append(f"spec.topology {topology}: each dimension must be a multiple of 4")
    if list(dims) != sorted(dims):
        fixed = "x".join(str(d) for d in sorted(dims))
        errors.append(f"spec.topology {topology}: dimensions must be non-decreasing ({fixed})")
    if math.prod(dims) > MAX_CHIPS:
        errors.append(f"spec.topology {topology}: {math.prod(dims)} chips is over {MAX_CHIPS}")
    return errors


def spec_errors(s: SliceView) -> list[str]:
    """What GKE's validating webhook would refuse in ``s`` (none: a valid Slice)."""
    errors = []
    if len(s.name) > MAX_NAME or not _NAME.fullmatch(s.name):
        errors.append(
            f"metadata.name {s.name!r} must be at most {MAX_NAME} lowercase letters, digits "
            f"and '-', starting with a letter and ending with a letter or digit"
        )
    if s.type != SLICE_TYPE:
        errors.append(f"spec.type {s.type!r} must be {SLICE_TYPE}")
    topo = topology_errors(s.topology)
    errors += topo
    if len(set(s.partition_ids)) != len(s.partition_ids):
        errors.append("spec.partitionIds must not repeat an id")
    if not topo:
        want = math.prod(topology_dims(s.topology) or ()) // CHIPS_PER_PARTITION
        if len(s.partition_ids) != want:
            errors.append(
                f"spec.partitionIds has {len(s.partition_ids)} ids; topology {s.topology} "
                f"takes {want} (one per {CHIPS_PER_PARTITION} chips)"
            )
    return errors


def partition_errors(
    s: SliceView, partitions: Mapping[str, Partition], held_by: Mapping[str, str]
) -> list[str]:
    """Why ``s``'s partitions cannot form a slice now (none: they can).

    ``held_by``: partition id -> the other Slice holding it.
    """
    errors = []
    blocks: set[str] = set()
    for pid in s.partition_ids:
        p = partitions.get(pid)
        if p is None:
            errors.append(
                f"partition {pid} does not exist (no node carries {PARTITION_ID_LABEL}={pid})"
            )
            continue
        if p.accelerators != {TPU7X_ACCELERATOR}:
            errors.append(
                f"partition {pid} is not {TPU7X_ACCELERATOR} ({', '.join(sorted(p.accelerators))})"
            )
        if not p.whole:
            errors.append(f"partition {pid} has {len(p.nodes)} of {PARTITION_NODES} nodes")
        if p.state not in USABLE_STATES:
            errors.append(f"partition {pid} is {p.state}")
        other = held_by.get(pid)
        foreign = p.slices - {s.name}
        if other is not None and other != s.name:
            errors.append(f"partition {pid} is in Slice {other}")
        elif foreign:
            errors.append(f"partition {pid} is in slice {', '.join(sorted(foreign))}")
        blocks |= p.blocks
    if len(blocks) > 1:
        errors.append(
            f"partitions span topology blocks {', '.join(sorted(blocks))}; a slice's must "
            f"share one {TOPOLOGY_BLOCK_LABEL}"
        )
    return errors


def _health_errors(s: SliceView, partitions: Mapping[str, Partition]) -> list[str]:
    """Why a formed (or forming) Slice can no longer work: a partition gone or unusable."""
    errors = []
    for pid in s.partition_ids:
        p = partitions.get(pid)
        if p is None:
            errors.append(f"partition {pid} is gone")
        elif not p.whole:
            errors.append(f"partition {pid} has {len(p.nodes)} of {PARTITION_NODES} nodes")
        elif p.state not in USABLE_STATES:
            errors.append(f"partition {pid} is {p.state}")
    return errors


@dataclass(frozen=True)
class Decision:
    """What the controller does with one Slice in one pass (empty: nothing)."""

    add_finalizer: bool = False
    remove_finalizer: bool = False
    condition: Condition | None = None
    #: Nodes to give ``gke-tpu-slice=<name>`` and ``gke-tpu-topology=<topology>``.
    label: tuple[str, ...] = ()
    #: Nodes to take both labels off.
    unlabel: tuple[str, ...] = ()
    #: Whether the Slice holds its partitions after this pass.
    holds: bool = False


def _cond(s: SliceView, status: str, reason: str, message: str, now: float) -> Condition | None:
    """The condition to write, or None when ``s`` already has it."""
    message += SIMULATED
    if s.ready and (s.ready.status, s.ready.reason, s.ready.message) == (status, reason, message):
        return None
    since = s.ready.since if s.ready and s.ready.reason == reason else now
    return Condition(status, reason, message, since)


def _to_label(
    s: SliceView, partitions: Mapping[str, Partition], labelled: Sequence[str]
) -> tuple[str, ...]:
    have = set(labelled)
    nodes = [n for pid in s.partition_ids if pid in partitions for n in partitions[pid].nodes]
    return tuple(n for n in nodes if n not in have)


def decide(
    s: SliceView,
    partitions: Mapping[str, Partition],
    held_by: Mapping[str, str],
    labelled: Sequence[str],
    now: float,
    timings: Timings,
) -> Decision:
    """GKE's slice controller's next step for ``s``.

    ``labelled``: the nodes carrying ``gke-tpu-slice=<s.name>`` now, with the right
    topology (a node whose topology label differs counts as not labelled).
    """
    if s.deleting:
        return Decision(remove_finalizer=FINALIZER in s.finalizers, unlabel=tuple(labelled))
    add = FINALIZER not in s.finalizers
    reason = s.reason
    if reason in (None, SLICE_NOT_CREATED) or (
        reason in (SLICE_CREATION_FAILED, FAILED) and s.retries
    ):
        errors = spec_errors(s) or partition_errors(s, partitions, held_by)
        if reason == FAILED and not errors:
            errors = ["the slice failed"] if s.fault == "fail" else []
        if errors:
            if reason == FAILED:  # a retrying FAILED Slice keeps its partitions
                return Decision(add_finalizer=add, holds=True)
            c = _cond(s, "False", SLICE_CREATION_FAILED, "; ".join(errors), now)
            return Decision(add_finalizer=add, condition=c)
        n = len(s.partition_ids)
        c = _cond(s, "False", ACTIVATING, f"linking {n} partition(s) into {s.topology}", now)
        return Decision(add_finalizer=add, condition=c, holds=True)
    if reason == SLICE_CREATION_FAILED:
        return Decision(add_finalizer=add)
    if reason == FAILED:
        return Decision(add_finalizer=add, holds=True)
    broken = _health_errors(s, partitions)
    if broken or s.fault == "fail":
        why = "; ".join(broken) or "failure injected by tpusim.dev/slice-fault"
        return Decision(
            add_finalizer=add, condition=_cond(s, "False", FAILED, why, now), holds=True
        )
    if reason == ACTIVATING:
        done = s.ready is not None and now - s.ready.since >= timings.activation_s
        if s.fault == "never" or not done:
            return Decision(add_finalizer=add, holds=True)
    label = _to_label(s, partitions, labelled)
    degraded = sorted(p for p in s.partition_ids if partitions[p].state == DEGRADED)
    if degraded or s.fault == "degrade":
        why = (
            f"partition(s) {', '.join(degraded)} DEGRADED"
            if degraded
            else "degraded by tpusim.dev/slice-fault"
        )
        c = _cond(s, "True", ACTIVE_DEGRADED, why, now)
    else:
        c = _cond(s, "True", ACTIVE, f"{len(s.partition_ids)} partition(s) linked", now)
    return Decision(add_finalizer=add, condition=c, label=label, holds=True)


def holders(slices: Iterable[SliceView]) -> dict[str, str]:
    """Partition id -> the Slice holding it, oldest Slice first on a clash."""
    out: dict[str, str] = {}
    for s in sorted(slices, key=lambda v: (v.created, v.name)):
        if s.reason in HOLDING:
            for pid in s.partition_ids:
                out.setdefault(pid, s.name)
    return out


def node_labels_for(s: SliceView) -> dict[str, str]:
    """The labels GKE's slice controller puts on an ACTIVE Slice's nodes."""
    return {SLICE_LABEL: s.name, TOPOLOGY_LABEL: s.topology}
