"""A simulated GKE slice controller: TPU7x ``Slice`` objects on the local cluster.

``SliceController`` installs GKE's Slice CRD (``tpusim/crds/``), then polls the
cluster: Slices and nodes. For each Slice ``tpusim.slices.decide`` says what GKE's
slice controller would do next, and this module does it: the finalizer, the Ready
condition (ACTIVATING, then ACTIVE after ``Timings.activation_s``), the labels of the
partitions' nodes, and their removal when the Slice is deleted. The docstring of
``tpusim.slices`` names the upstream page of each rule and where this is simpler than
GKE; docs/local-cluster.md says how to drive it.

Driving it from a test::

    with SliceController(api, SliceControllerSettings(timings=Timings(activation_s=1))) as ctl:
        ...                                          # the operator creates Slices
        ctl.set_partition_state("p0123", "UNHEALTHY")  # its Slice goes FAILED
        ctl.fail("my-slice")                          # or FAILED on demand
        ctl.wait_idle()

Without Python: the ConfigMap ``kube-system/tpusim-slicectl`` (keys ``faults`` and
``settings``, YAML) is read every pass; a Slice's annotation ``tpusim.dev/slice-fault``
acts on that Slice alone; a partition's state is its nodes' label
``cloud.google.com/gke-tpu-partition-4x4x4-state`` (``python -m tpusim
partition-state``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from types import TracebackType
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client import ApiException

from . import kube
from .nodepools import (
    PARTITION_ID_LABEL,
    PARTITION_STATE_LABEL,
    PARTITION_STATES,
    SLICE_LABEL,
    TOPOLOGY_LABEL,
)
from .slices import (
    CRD_NAME,
    FAULT_ANNOTATION,
    FAULTS,
    FINALIZER,
    GROUP,
    PLURAL,
    VERSION,
    Decision,
    FaultRule,
    SliceView,
    Timings,
    choose_fault,
    decide,
    holders,
    node_labels_for,
    parse_rules,
    parse_slice,
    partitions_of,
)

__all__ = [
    "CONFIG_MAP",
    "SliceController",
    "SliceControllerSettings",
    "install_crd",
    "load_crd",
    "set_partition_state",
    "uninstall_crd",
    "write_config",
]

log = logging.getLogger("tpusim.slicectl")

#: (namespace, name) of the ConfigMap read every pass: ``faults`` (``slices.parse_rules``)
#: and ``settings`` (``{activationS: N}``).
CONFIG_MAP = ("kube-system", "tpusim-slicectl")


@dataclass(frozen=True)
class SliceControllerSettings:
    timings: Timings = field(default_factory=Timings)
    #: Seconds between passes.
    interval_s: float = 0.5

    def __post_init__(self) -> None:
        if not 0.05 <= self.interval_s <= 60:
            raise ValueError(f"interval_s {self.interval_s} must be between 0.05 and 60 seconds")


def load_crd() -> dict[str, Any]:
    """The Slice CRD this package ships (see the file's header)."""
    text = resources.files("tpusim").joinpath(f"crds/{CRD_NAME}.yaml").read_text()
    crd: dict[str, Any] = yaml.safe_load(text)
    return crd


def install_crd(api: Any, timeout_s: float = 60.0) -> None:
    """Create (or replace) the Slice CRD and wait until it is Established."""
    kube.install_crd(api, load_crd(), timeout_s)


def uninstall_crd(api: Any, timeout_s: float = 60.0) -> None:
    """Delete the CRD and wait until it is gone (a cluster without dynamic slicing).

    Slices still holding the finalizer keep the deletion waiting: stop the controller
    only after it has let them go.
    """
    kube.uninstall_crd(api, CRD_NAME, timeout_s)


def write_config(
    api: Any,
    faults: Iterable[FaultRule] | None = None,
    settings: Mapping[str, float] | None = None,
) -> None:
    """Write the ConfigMap every slice controller reads each pass (None: that key unset)."""
    namespace, name = CONFIG_MAP
    data: dict[str, str] = {}
    if faults is not None:
        data["faults"] = yaml.safe_dump([r.to_dict() for r in faults], sort_keys=False)
    if settings is not None:
        Timings.from_mapping(dict(settings))  # refuse what every controller would refuse
        data["settings"] = yaml.safe_dump(dict(settings))
    body = {"metadata": {"name": name, "namespace": namespace}, "data": data}
    core = kube.core_v1(api)
    try:
        core.replace_namespaced_config_map(name, namespace, body)
    except ApiException as exc:
        if exc.status != 404:
            raise
        core.create_namespaced_config_map(namespace, body)


def set_partition_state(core: Any, partition_id: str, state: str) -> list[str]:
    """Label every node of ``partition_id`` with ``state``, as GKE reports a partition's
    health; ``core``: a CoreV1Api (``kube.core_v1(api)``).

    Returns the nodes changed; refuses a state GKE does not list or an unknown partition.
    """
    if state not in PARTITION_STATES:
        raise ValueError(f"partition state {state!r} must be one of {', '.join(PARTITION_STATES)}")
    nodes = core.list_node(label_selector=f"{PARTITION_ID_LABEL}={partition_id}").items
    if not nodes:
        raise ValueError(f"no node carries {PARTITION_ID_LABEL}={partition_id}")
    for node in nodes:
        core.patch_node(
            node.metadata.name, {"metadata": {"labels": {PARTITION_STATE_LABEL: state}}}
        )
    return sorted(n.metadata.name for n in nodes)


class SliceController:
    """GKE's slice controller for the local cluster; a thread, or ``reconcile_once``."""

    def __init__(self, api: Any, settings: SliceControllerSettings | None = None) -> None:
        self.api = api
        self.settings = settings or SliceControllerSettings()
        self.core = kube.core_v1(api)
        self.custom: Any = client.CustomObjectsApi(api)  # plain dicts in and out
        self._serializer: Any = client.ApiClient()
        self._rule_uses: Counter[int] = Counter()
        self._seen: set[str] = set()
        self._logged: set[str] = set()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._passes = 0
        self._passes_cond = threading.Condition()
        #: What it did, newest last (bounded), for tests and ``--verbose`` runs.
        self.events: list[str] = []
        self.errors: list[Exception] = []

    # ------------------------------------------------------------ lifecycle
    def __enter__(self) -> SliceController:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Install the CRD and reconcile every ``interval_s`` on a thread of its own."""
        install_crd(self.api)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="tpusim-slicectl", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread. Slices and their labels stay, as they would on GKE."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.reconcile_once()
            except Exception as exc:  # keep going: the next pass may succeed
                log.exception("slice controller pass failed")
                self.errors = [*self.errors[-19:], exc]
            with self._passes_cond:
                self._passes += 1
                self._passes_cond.notify_all()
            self._stop.wait(self.settings.interval_s)

    def wait_idle(self, passes: int = 2, timeout_s: float = 30.0) -> None:
        """Block until ``passes`` more passes have finished (so a change was seen)."""
        with self._passes_cond:
            target = self._passes + passes
            if not self._passes_cond.wait_for(lambda: self._passes >= target, timeout_s):
                raise kube.WaitTimeout(f"slice controller did not finish {passes} passes")

    # ------------------------------------------------------------ the test's API
    def fail(self, name: str) -> None:
        """Turn Slice ``name`` FAILED (now if formed, else when it would activate)."""
        self.set_fault(name, "fail")

    def degrade(self, name: str) -> None:
        """Turn Slice ``name`` ACTIVE_DEGRADED while the fault stays (``clear`` undoes it)."""
        self.set_fault(name, "degrade")

    def clear(self, name: str) -> None:
        """Take any fault off Slice ``name`` (a FAILED Slice stays FAILED)."""
        self.set_fault(name, "none")

    def set_partition_state(self, partition_id: str, state: str) -> list[str]:
        """Set the state label of every node of ``partition_id`` (see the function)."""
        return set_partition_state(self.core, partition_id, state)

    def set_fault(self, name: str, fault: str) -> None:
        """Write ``tpusim.dev/slice-fault: fault`` on Slice ``name`` (one of ``FAULTS``)."""
        if fault not in FAULTS:
            raise ValueError(f"fault {fault!r} must be one of {', '.join(FAULTS)}")
        self.custom.patch_cluster_custom_object(
            GROUP, VERSION, PLURAL, name, {"metadata": {"annotations": {FAULT_ANNOTATION: fault}}}
        )

    # ------------------------------------------------------------ one pass
    def reconcile_once(self, now: float | None = None) -> list[str]:
        """One pass over every Slice; returns what it did (also kept in ``events``)."""
        now = time.time() if now is None else now
        timings, rules = self._read_config()
        nodes = self._dicts(self.core.list_node().items)
        partitions = partitions_of(nodes)
        objects = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL).get("items", [])
        views = sorted((parse_slice(o) for o in objects), key=lambda v: (v.created, v.name))
        held = holders(views)
        self._seen &= {v.name for v in views}  # bounded by the Slices that exist
        done: list[str] = []
        for view in views:
            view = self._with_rule_fault(view, rules)
            # held by others: the view's own partitions are not in its way
            others = {pid: who for pid, who in held.items() if who != view.name}
            labelled = [
                n["metadata"]["name"]
                for n in nodes
                if (n["metadata"].get("labels") or {}).get(SLICE_LABEL) == view.name
                and (view.deleting or n["metadata"]["labels"].get(TOPOLOGY_LABEL) == view.topology)
            ]
            decision = decide(view, partitions, others, labelled, now, timings)
            done += self._apply(view, decision)
            if decision.holds:
                for pid in view.partition_ids:
                    held.setdefault(pid, view.name)
            else:
                held = {pid: who for pid, who in held.items() if who != view.name}
        self.events = [*self.events, *done][-500:]
        for line in done:
            log.info("%s", line)
        return done

    def _with_rule_fault(self, view: SliceView, rules: list[FaultRule]) -> SliceView:
        """A Slice seen for the first time may get a fault from the ConfigMap's rules;
        it is written on the Slice, so a restarted controller keeps it."""
        if view.name in self._seen or view.deleting:
            return view
        self._seen.add(view.name)
        if FAULT_ANNOTATION in view.annotations or view.ready is not None:
            return view
        index = choose_fault(view.name, rules, self._rule_uses)
        if index is None:
            return view
        self._rule_uses[index] += 1
        fault = rules[index].fault
        self._patch(view.name, {"metadata": {"annotations": {FAULT_ANNOTATION: fault}}})
        return replace(view, annotations={**view.annotations, FAULT_ANNOTATION: fault})

    def _apply(self, view: SliceView, d: Decision) -> list[str]:
        done = []
        if d.add_finalizer:
            self._patch(view.name, {"metadata": {"finalizers": [*view.finalizers, FINALIZER]}})
            done.append(f"{view.name}: finalizer added")
        if d.condition is not None:
            body = {"status": {"conditions": [d.condition.to_dict()]}}
            try:
                self.custom.patch_cluster_custom_object_status(
                    GROUP, VERSION, PLURAL, view.name, body
                )
            except ApiException as exc:
                if exc.status != 404:
                    raise
            done.append(f"{view.name}: {d.condition.reason}: {d.condition.message}")
        labels = node_labels_for(view)
        for node in d.label:
            self._label(node, labels)
        if d.label:
            done.append(f"{view.name}: labelled {len(d.label)} node(s)")
        for node in d.unlabel:
            self._label(node, {key: None for key in labels})
        if d.unlabel:
            done.append(f"{view.name}: unlabelled {len(d.unlabel)} node(s)")
        if d.remove_finalizer:
            rest = [f for f in view.finalizers if f != FINALIZER]
            self._patch(view.name, {"metadata": {"finalizers": rest or None}})
            done.append(f"{view.name}: finalizer removed")
            self._seen.discard(view.name)
        return done

    # ------------------------------------------------------------ plumbing
    def _patch(self, name: str, body: Mapping[str, Any]) -> None:
        try:
            self.custom.patch_cluster_custom_object(GROUP, VERSION, PLURAL, name, body)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.events.append(f"{name}: gone before it could be patched")

    def _label(self, node: str, labels: Mapping[str, str | None]) -> None:
        try:
            self.core.patch_node(node, {"metadata": {"labels": dict(labels)}})
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _dicts(self, items: Iterable[Any]) -> list[dict[str, Any]]:
        return [self._serializer.sanitize_for_serialization(i) for i in items]

    def _log_once(self, message: str) -> None:
        if message not in self._logged:
            self._logged.add(message)
            log.error("%s", message)
            self.events = [*self.events, message][-500:]

    def _read_config(self) -> tuple[Timings, list[FaultRule]]:
        timings, rules = self.settings.timings, list[FaultRule]()
        namespace, name = CONFIG_MAP
        try:
            cm = self.core.read_namespaced_config_map(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return timings, rules
            raise
        data = cm.data or {}
        try:
            timings = Timings.from_mapping(
                yaml.safe_load(data.get("settings") or "{}") or {}, timings
            )
            rules = parse_rules(yaml.safe_load(data.get("faults") or "[]"))
        except (ValueError, TypeError, yaml.YAMLError) as exc:
            self._log_once(f"ConfigMap {namespace}/{name} ignored: {exc}")
            return self.settings.timings, []
        return timings, rules
