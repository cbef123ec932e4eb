"""A fake GKE provisioner: ProvisioningRequests on the local cluster (a simulation).

``FakeProvisioner`` installs the ProvisioningRequest CRD (``tpusim/crds/``), then
polls the cluster: requests, their PodTemplates, nodes and pods. For each request
``tpusim.provreq.decide`` says what GKE would do next, and this module does it:
status conditions and details, a whole KWOK node pool with GKE's labels and taints
(``tpusim.nodepools``), pools deleted on revocation or once empty after the booking
or after their request is gone. The docstring of ``tpusim.provreq`` names the
upstream source of each rule; docs/local-cluster.md says how to drive it.

Driving it from a test::

    with FakeProvisioner(api, ProvisionerSettings(timings=Timings(booking_s=20))) as fake:
        fake.configure(faults=[FaultRule(Fault("fail", reason="QuotaExceeded"), times=1)])
        ...                                    # the operator creates requests
        fake.revoke("ns", "my-request")        # CapacityRevoked now, nodes deleted
        fake.wait_idle()                        # optional: one whole pass has run since

Single-host pools that exist with autoscaling (GKE's usual single-host TPU pools, 0
nodes until a slice needs one) are declared, not created::

    fake.configure(autoscaled_pools=[AutoscaledPool("v6e-single", "v6e", "2x2", max_nodes=4)])

A single-host request whose template fits one with room grows it by its count
(``provreq.grow_target``); the nodes added carry ``tpusim.dev/node-group`` so
revocation and scale-down remove that request's nodes only.

Faults, timings and declared pools can also be set without Python: the ConfigMap
``kube-system/tpusim-provisioner`` (keys ``faults``, ``settings`` and
``autoscaledPools``, YAML) is read every pass, and a request's own annotations
``tpusim.dev/fault`` and ``tpusim.dev/revoke`` act on that request alone
(``kubectl annotate``).
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
from .nodepools import KWOK_ANNOTATION, TPU_RESOURCE, pool_nodes
from .provreq import (
    CAPACITY_REVOKED,
    CLASSES,
    CONSUME_ANNOTATION,
    CRD_NAME,
    FAULT_ANNOTATION,
    GROUP,
    GROUP_ANNOTATION,
    NODE_OWNER_ANNOTATION,
    NODEPOOL_LABEL,
    PLURAL,
    PROVISIONING_REQUEST_LABEL,
    REVOKE_ANNOTATION,
    VERSION,
    AutoscaledPool,
    Condition,
    Decision,
    Fault,
    FaultRule,
    GrowablePool,
    NodeView,
    PoolPlan,
    PoolView,
    Request,
    Timings,
    choose_fault,
    decide,
    free_nodes,
    fresh_node_indexes,
    orphan_pools_to_remove,
    parse_autoscaled_pools,
    parse_fault,
    parse_request,
    parse_rules,
    template_shape,
)

__all__ = [
    "CONFIG_MAP",
    "AutoscaledPool",
    "FakeProvisioner",
    "Fault",
    "FaultRule",
    "ProvisionerSettings",
    "Timings",
    "install_crd",
    "load_crd",
    "uninstall_crd",
    "write_config",
]

log = logging.getLogger("tpusim.provisioner")

#: (namespace, name) of the ConfigMap read every pass: ``faults`` (a YAML list of
#: rules, ``provreq.parse_rules``), ``settings`` (``Timings`` overrides) and
#: ``autoscaledPools`` (``provreq.parse_autoscaled_pools``; replaces the settings' list).
CONFIG_MAP = ("kube-system", "tpusim-provisioner")
NOT_READY_TAINT = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}


@dataclass(frozen=True)
class ProvisionerSettings:
    timings: Timings = field(default_factory=Timings)
    #: Seconds between passes.
    interval_s: float = 0.5
    cluster: str = "tpusim"
    zone: str = "us-east5-b"
    #: Single-host pools that exist with autoscaling (0 to ``max_nodes`` nodes).
    autoscaled_pools: tuple[AutoscaledPool, ...] = ()

    def __post_init__(self) -> None:
        parse_autoscaled_pools([p.to_dict() for p in self.autoscaled_pools])  # duplicates


def load_crd() -> dict[str, Any]:
    """The ProvisioningRequest CRD this package ships (see the file's header)."""
    text = (
        resources.files("tpusim")
        .joinpath("crds/provisioningrequests.autoscaling.x-k8s.io.yaml")
        .read_text()
    )
    crd: dict[str, Any] = yaml.safe_load(text)
    return crd


def install_crd(api: Any, timeout_s: float = 60.0) -> None:
    """Create (or replace) the CRD and wait until it is Established."""
    kube.install_crd(api, load_crd(), timeout_s)


def uninstall_crd(api: Any, timeout_s: float = 60.0) -> None:
    """Delete the CRD (and so every request) and wait until it is gone, for tests of an
    operator on a cluster without the API."""
    kube.uninstall_crd(api, CRD_NAME, timeout_s)


def write_config(
    api: Any,
    faults: Iterable[FaultRule] | None = None,
    settings: Mapping[str, float] | None = None,
    autoscaled_pools: Iterable[AutoscaledPool] | None = None,
) -> None:
    """Write the ConfigMap every provisioner reads each pass (None: that key unset)."""
    namespace, name = CONFIG_MAP
    data: dict[str, str] = {}
    if faults is not None:
        data["faults"] = yaml.safe_dump([r.to_dict() for r in faults], sort_keys=False)
    if settings is not None:
        data["settings"] = yaml.safe_dump(dict(settings))
    if autoscaled_pools is not None:
        raw = [p.to_dict() for p in autoscaled_pools]
        parse_autoscaled_pools(raw)  # refuse what every provisioner would refuse
        data["autoscaledPools"] = yaml.safe_dump(raw, sort_keys=False)
    body = {"metadata": {"name": name, "namespace": namespace}, "data": data}
    core = kube.core_v1(api)
    try:
        core.replace_namespaced_config_map(name, namespace, body)
    except ApiException as exc:
        if exc.status != 404:
            raise
        core.create_namespaced_config_map(namespace, body)


def _finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _tpu_request(pod: Mapping[str, Any]) -> int:
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        res = container.get("resources") or {}
        value = (res.get("requests") or {}).get(TPU_RESOURCE) or (res.get("limits") or {}).get(
            TPU_RESOURCE
        )
        total += int(str(value)) if value is not None else 0
    return total


def _ready(node: Mapping[str, Any]) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


class FakeProvisioner:
    """GKE's provisioning side for the local cluster; a thread, or ``reconcile_once``."""

    def __init__(self, api: Any, settings: ProvisionerSettings | None = None) -> None:
        self.api = api
        self.settings = settings or ProvisionerSettings()
        self.core = kube.core_v1(api)
        self.custom: Any = client.CustomObjectsApi(api)  # plain dicts in and out
        self._serializer: Any = client.ApiClient()
        self._empty_since: dict[str, float] = {}
        self._rule_uses: Counter[str] = Counter()
        self._logged: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._passes = 0
        self._passes_cond = threading.Condition()
        #: Exceptions raised by passes of the thread (the last 20); tests assert it empty.
        self.errors: list[BaseException] = []
        #: What each pass did, oldest first (the last 500 lines).
        self.events: list[str] = []

    # ------------------------------------------------------------ lifecycle
    def __enter__(self) -> FakeProvisioner:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop(remove_pools=True)

    def start(self) -> None:
        """Install the CRD and reconcile every ``interval_s`` on a thread of its own."""
        install_crd(self.api)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="tpusim-provisioner", daemon=True)
        self._thread.start()

    def stop(self, remove_pools: bool = False) -> None:
        """Stop the thread; with ``remove_pools`` delete every node it ever made."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        if remove_pools:
            for node in self._owned_nodes():
                kube.delete_node(self.api, node["metadata"]["name"])

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.reconcile_once()
            except Exception as exc:  # keep going: the next pass may succeed
                log.exception("provisioner pass failed")
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
                raise kube.WaitTimeout(f"provisioner did not finish {passes} passes")

    # ------------------------------------------------------------ the test's API
    def configure(
        self,
        faults: Iterable[FaultRule] | None = None,
        autoscaled_pools: Iterable[AutoscaledPool] | None = None,
        **timings: float,
    ) -> None:
        """Replace the global fault rules, timing overrides and, if given, the declared
        autoscaled pools (the ConfigMap; without ``autoscaled_pools`` the settings'
        list applies)."""
        pools = None if autoscaled_pools is None else list(autoscaled_pools)
        write_config(self.api, list(faults or []), timings, pools)

    def revoke(self, namespace: str, name: str) -> None:
        """Revoke a request's capacity now (CapacityRevoked, its nodes deleted)."""
        self._annotate(namespace, name, {REVOKE_ANNOTATION: "true"})

    def set_fault(self, namespace: str, name: str, fault: Fault) -> None:
        """Give one request a fault (best before its first pass; see ``provreq.Fault``)."""
        self._annotate(namespace, name, {FAULT_ANNOTATION: fault.to_json()})

    def pools(self) -> dict[str, str]:
        """Pool name (or ``pool/group`` of nodes added to a declared pool) -> owning
        request (``namespace/name/uid``) of every pool or group it made."""
        out: dict[str, str] = {}
        for node in self._owned_nodes():
            owner = node["metadata"]["annotations"][NODE_OWNER_ANNOTATION]
            out[_unit_of(node)] = owner
        return out

    # ------------------------------------------------------------ one pass
    def reconcile_once(self, now: float | None = None) -> list[str]:
        """One pass over every request; returns what it did (also in ``events``)."""
        now = time.time() if now is None else now
        timings, rules, declared = self._read_config()
        try:
            listed = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        except ApiException as exc:
            if exc.status == 404:
                self._log_once("the ProvisioningRequest CRD is not installed")
                return []
            raise
        requests = [parse_request(obj) for obj in listed.get("items") or []]
        templates = {
            (t["metadata"]["namespace"], t["metadata"]["name"]): t
            for t in self._dicts(self.core.list_pod_template_for_all_namespaces().items)
        }
        # [oss-client]: one request without its template fails the listing of all.
        for req in requests:
            for template, _ in req.pod_sets:
                if (req.namespace, template) not in templates:
                    self._log_once(
                        f"while fetching pod templates for List Provisioning Request "
                        f"{req.namespace}/{req.name} got error: podtemplates "
                        f'"{template}" not found (no request handled this pass)'
                    )
                    return []
        nodes = self._dicts(self.core.list_node().items)
        pods = self._dicts(self.core.list_pod_for_all_namespaces().items)
        done: list[str] = []
        state = _ClusterState(nodes, pods, self._empty_since, now)
        for req in requests:
            if req.class_name not in CLASSES:
                continue
            fault = self._fault_for(req, rules)
            shapes = [template_shape(templates[(req.namespace, t)]) for t, _ in req.pod_sets]
            own = state.pools_of(req.owner)
            decision = decide(
                req,
                now=now,
                timings=timings,
                fault=fault,
                shapes=shapes,
                pools=own,
                taken_pools=(state.pool_names | {p.name for p in declared}) - {p.name for p in own},
                consumed=state.consumed.get((req.namespace, req.name), 0),
                free=[
                    free_nodes(s, state.node_views) if not isinstance(s, str) else 0 for s in shapes
                ],
                zone=self.settings.zone,
                cluster=self.settings.cluster,
                growable=state.growable(declared),
            )
            if decision:
                done += self._apply(req, decision)
                state.grew(decision.create)
        live = {r.owner for r in requests if not r.true(CAPACITY_REVOKED)}
        for name in orphan_pools_to_remove(state.owned, live, now=now, timings=timings):
            self._delete_pool(name)
            done.append(f"pool {name} removed (its request is gone, no pods)")
        self.events = [*self.events, *done][-500:]
        for line in done:
            log.info("%s", line)
        return done

    # ------------------------------------------------------------ helpers
    def _dicts(self, items: Iterable[Any]) -> list[dict[str, Any]]:
        return [self._serializer.sanitize_for_serialization(i) for i in items]

    def _log_once(self, message: str) -> None:
        if message not in self._logged:
            self._logged.add(message)
            log.error("%s", message)
            self.events = [*self.events, message][-500:]

    def _read_config(self) -> tuple[Timings, list[FaultRule], list[AutoscaledPool]]:
        timings, rules = self.settings.timings, list[FaultRule]()
        declared = list(self.settings.autoscaled_pools)
        namespace, name = CONFIG_MAP
        try:
            cm = self.core.read_namespaced_config_map(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return timings, rules, declared
            raise
        data = cm.data or {}
        try:
            timings = timings.with_overrides(yaml.safe_load(data.get("settings") or "{}") or {})
            rules = parse_rules(yaml.safe_load(data.get("faults") or "[]"))
            if "autoscaledPools" in data:
                declared = parse_autoscaled_pools(yaml.safe_load(data["autoscaledPools"] or "[]"))
        except (ValueError, TypeError, yaml.YAMLError) as exc:
            self._log_once(f"ConfigMap {namespace}/{name} ignored: {exc}")
            return self.settings.timings, [], list(self.settings.autoscaled_pools)
        return timings, rules, declared

    def _fault_for(self, req: Request, rules: list[FaultRule]) -> Fault:
        raw = req.annotations.get(FAULT_ANNOTATION)
        if raw is not None:
            try:
                return parse_fault(raw)
            except ValueError as exc:
                self._log_once(f"{req.namespace}/{req.name}: bad {FAULT_ANNOTATION}: {exc}")
                return Fault()
        if req.conditions:
            return Fault()  # rules apply to new requests only
        rule = choose_fault(rules, self._rule_uses, req.namespace, req.name, req.class_name)
        if rule is None:
            return Fault()
        self._rule_uses[rule.key] += 1
        self._annotate(req.namespace, req.name, {FAULT_ANNOTATION: rule.fault.to_json()})
        self.events.append(f"{req.namespace}/{req.name}: fault {rule.fault.to_json()}")
        return rule.fault

    def _annotate(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        try:
            self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, {"metadata": {"annotations": annotations}}
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            # deleted since this pass listed it (its owner gave it up): nothing to do
            self.events.append(f"{namespace}/{name}: gone before it could be annotated")

    def _apply(self, req: Request, d: Decision) -> list[str]:
        where = f"{req.namespace}/{req.name}"
        if d.annotations:
            self._annotate(req.namespace, req.name, d.annotations)
        # The status before the nodes, as on GKE: Provisioned=True is written when the
        # scale-up is requested (OSS best-effort-atomic) or its Resize Request succeeds
        # (queued), before any Node registers (provreq's sources [gke-state], [gke-finalizer]).
        if d.conditions or d.details is not None:
            try:
                self._write_status(req, d.conditions, d.details)
            except ApiException as exc:
                if exc.status not in (404, 409):
                    raise
                return [f"{where}: status not written ({exc.status}), next pass"]
        for plan in d.create:
            self._create_pool(req, plan)
        for name in d.delete:
            self._delete_pool(name)
        return [f"{where}: {line}" for line in d.log]

    def _write_status(
        self, req: Request, conditions: list[Condition], details: dict[str, str] | None
    ) -> None:
        obj = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, req.namespace, PLURAL, req.name
        )
        if obj["metadata"].get("uid") != req.uid:
            return
        status = obj.get("status") or {}
        current = list(status.get("conditions") or [])
        for cond in conditions:
            raw = cond.to_api(req.generation)
            current = [c for c in current if c.get("type") != cond.type]
            current.append(raw)
        body: dict[str, Any] = {
            "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
            "status": {"conditions": current},
        }
        if details is not None:
            body["status"]["provisioningClassDetails"] = {
                **(status.get("provisioningClassDetails") or {}),
                **details,
            }
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, req.namespace, PLURAL, req.name, body
        )

    def _create_pool(self, req: Request, plan: PoolPlan) -> None:
        for i, node in enumerate(self._new_nodes(plan)):
            meta = node["metadata"]
            meta["labels"].update(plan.labels)
            meta["annotations"][NODE_OWNER_ANNOTATION] = req.owner
            if plan.group is not None:
                meta["annotations"][GROUP_ANNOTATION] = plan.group
            node["spec"]["taints"] = [*node["spec"].get("taints", []), *map(dict, plan.taints)]
            not_ready = i == plan.not_ready_node
            if not_ready:  # KWOK leaves it alone: a VM whose kubelet never comes up
                meta["annotations"].pop(KWOK_ANNOTATION[0], None)
                node["spec"]["taints"].append(dict(NOT_READY_TAINT))
            try:
                self.core.create_node(body=node)
            except ApiException as exc:
                if exc.status != 409:  # made by an earlier pass that did not finish
                    raise
            if not_ready:
                kube.set_node_not_ready(self.api, meta["name"], reason="KubeletNotReady")

    def _new_nodes(self, plan: PoolPlan) -> list[dict[str, Any]]:
        """A whole pool's nodes; or, for a group added to an existing pool, the group's
        nodes not there yet, named apart from every node of the pool."""
        cluster = self.settings.cluster
        if plan.group is None:
            return pool_nodes(plan.pool, cluster)
        members = [
            n
            for n in self._dicts(self.core.list_node().items)
            if (n["metadata"].get("labels") or {}).get(NODEPOOL_LABEL) == plan.pool.name
        ]
        have = sum(1 for n in members if _unit_of(n) == plan.group)
        missing = max(0, plan.pool.nodes - have)
        taken = [n["metadata"]["name"] for n in members]
        indexes = fresh_node_indexes(plan.pool.name, missing, taken, plan.avoid_hosts, cluster)
        return pool_nodes(replace(plan.pool, nodes=missing), cluster, indexes)

    def _delete_pool(self, name: str) -> None:
        """Delete the nodes this fake made of pool ``name`` (never the groups it added
        to a declared pool), or of group ``name`` only."""
        for node in self._owned_nodes():
            if _unit_of(node) == name:
                kube.delete_node(self.api, node["metadata"]["name"])
        self._empty_since.pop(name, None)

    def _owned_nodes(self) -> list[dict[str, Any]]:
        nodes = self._dicts(self.core.list_node().items)
        return [
            n for n in nodes if NODE_OWNER_ANNOTATION in (n["metadata"].get("annotations") or {})
        ]


def _unit_of(node: Mapping[str, Any]) -> str:
    """What a node of ours belongs to as a unit: its group in a declared pool, else its
    pool (whole pools are made per request)."""
    meta = node["metadata"]
    group = (meta.get("annotations") or {}).get(GROUP_ANNOTATION)
    return str(group) if group else str((meta.get("labels") or {}).get(NODEPOOL_LABEL, ""))


class _ClusterState:
    """Nodes and pods of one pass, indexed for the decisions."""

    def __init__(
        self,
        nodes: list[dict[str, Any]],
        pods: list[dict[str, Any]],
        empty_since: dict[str, float],
        now: float,
    ) -> None:
        pool_of: dict[str, str] = {}
        owner_of: dict[str, str] = {}
        size: Counter[str] = Counter()
        self.pool_names: set[str] = set()
        #: Every node of each pool (ours or not), and the Resize Requests they carry.
        self.pool_sizes: Counter[str] = Counter()
        self.pool_resize: dict[str, set[str]] = {}
        for node in nodes:
            meta = node["metadata"]
            labels = meta.get("labels") or {}
            pool = labels.get(NODEPOOL_LABEL)
            if pool:
                self.pool_names.add(pool)
                self.pool_sizes[pool] += 1
                if labels.get(PROVISIONING_REQUEST_LABEL):
                    self.pool_resize.setdefault(pool, set()).add(labels[PROVISIONING_REQUEST_LABEL])
            owner = (meta.get("annotations") or {}).get(NODE_OWNER_ANNOTATION)
            if pool and owner:
                unit = _unit_of(node)
                pool_of[meta["name"]] = unit
                owner_of[unit] = owner
                size[unit] += 1
        busy: Counter[str] = Counter()
        used_chips: Counter[str] = Counter()
        self.consumed: Counter[tuple[str, str]] = Counter()
        for pod in pods:
            node_name = (pod.get("spec") or {}).get("nodeName")
            if not node_name or _finished(pod):
                continue
            used_chips[node_name] += _tpu_request(pod)
            if node_name in pool_of:
                busy[pool_of[node_name]] += 1
            consumes = (pod["metadata"].get("annotations") or {}).get(CONSUME_ANNOTATION)
            if consumes:
                self.consumed[(pod["metadata"]["namespace"], consumes)] += 1
        for pool in owner_of:
            if busy[pool]:
                empty_since.pop(pool, None)
            else:
                empty_since.setdefault(pool, now)
        for gone in set(empty_since) - set(owner_of):
            empty_since.pop(gone, None)
        self.owned: dict[str, tuple[str, PoolView]] = {
            pool: (owner, PoolView(pool, size[pool], busy[pool], empty_since.get(pool)))
            for pool, owner in owner_of.items()
        }
        self.node_views = [
            NodeView(
                name=n["metadata"]["name"],
                labels=n["metadata"].get("labels") or {},
                taints=tuple((n.get("spec") or {}).get("taints") or []),
                ready=_ready(n),
                schedulable=not (n.get("spec") or {}).get("unschedulable", False),
                free_chips=int(
                    str(((n.get("status") or {}).get("allocatable") or {}).get(TPU_RESOURCE, 0))
                )
                - used_chips[n["metadata"]["name"]],
            )
            for n in nodes
        ]

    def pools_of(self, owner: str) -> list[PoolView]:
        return [view for o, view in self.owned.values() if o == owner]

    def growable(self, declared: Iterable[AutoscaledPool]) -> list[GrowablePool]:
        return [
            GrowablePool(p, self.pool_sizes[p.name], frozenset(self.pool_resize.get(p.name, ())))
            for p in declared
        ]

    def grew(self, plans: Iterable[PoolPlan]) -> None:
        """Count nodes just planned into a declared pool, so a later request of the same
        pass sees the room they took."""
        for plan in plans:
            if plan.group is None:
                continue
            self.pool_sizes[plan.pool.name] += plan.pool.nodes
            resize = plan.labels.get(PROVISIONING_REQUEST_LABEL)
            if resize:
                self.pool_resize.setdefault(plan.pool.name, set()).add(resize)
