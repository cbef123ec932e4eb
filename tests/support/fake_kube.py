"""A recording fake of the API calls the reconcile parts make (``kube.ClusterApi``).

Unit tests drive ``Reconciler``, the finalizer and the sweep against it. It is
type-checked against the protocol (``make lint`` runs mypy on this file), so a
changed signature in kube.py fails the lint, not a test at run time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from tests.support.kuberay import raycluster_crd
from tpuslice.model.records import ReservationInfo
from tpuslice.runtime.kube import ApiError, ClusterApi

__all__ = ["FakeKube"]


class FakeKube:
    def __init__(
        self, apply_error: ApiError | None = None, taken: dict[str, ReservationInfo] | None = None
    ) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.applied: list[Any] = []
        self.apply_error = apply_error
        self.taken = taken or {}
        self.status: dict[str, Any] | None = None
        self.crd: Any = raycluster_crd()
        self.crd_reads = 0
        #: RayClusters that exist but are not in the watch's store (unlabelled ones).
        self.rayclusters: dict[tuple[str, str], Any] = {}
        self.raycluster_reads: list[tuple[str, str]] = []
        #: capacity on demand: what was created (by (namespace, name)), and the CRD
        self.podtemplates: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: dict[tuple[str, str], dict[str, Any]] = {}
        self.provreq_installed = True
        #: pod name -> the annotations its release patch added
        self.annotations: dict[str, dict[str, str]] = {}
        #: pod name -> the nodeSelector its release patch pinned it with
        self.selectors: dict[str, dict[str, str]] = {}
        #: pod name -> the grace period its deletion asked for
        self.pod_grace: dict[str, int] = {}
        #: reservation name -> the body a claim created
        self.claimed: dict[str, dict[str, Any]] = {}
        #: deletes refused for a stale uid (the API server's 409 Conflict)
        self.conflicts: list[tuple[str, str]] = []
        #: GKE Slices by name (what creates made, and what a test puts there)
        self.gke_slices: dict[str, dict[str, Any]] = {}
        #: Kueue's objects by (plural, namespace, name); None: Kueue is not installed
        self.kueue: dict[tuple[str, str, str], dict[str, Any]] | None = None
        #: what a live LIST of pods returns (pin at admission's fence reads it)
        self.live_pods: list[dict[str, Any]] = []

    async def get_ray(self, plural: str, namespace: str, name: str) -> Any:
        self.raycluster_reads.append((namespace, name))
        return self.rayclusters.get((namespace, name))

    async def get_crd(self, name: str) -> Any:
        assert name == "rayclusters.ray.io"
        self.crd_reads += 1
        if self.crd is None:
            raise ApiError(404, "NotFound", f"{name} not found")
        return self.crd

    async def read_kueue(
        self, plural: str, *, namespace: str = "", name: str = "", label_selector: str = ""
    ) -> Any:
        self.calls.append(("read-kueue", plural, name or label_selector))
        objects = self.kueue or {}
        if name:
            return objects.get((plural, namespace, name))
        key, _, value = label_selector.partition("=")
        return [
            obj
            for (kind, ns, _), obj in sorted(objects.items())
            if kind == plural
            and ns == namespace
            and (not key or (obj["metadata"].get("labels") or {}).get(key) == value)
        ]

    async def apply_ray(self, body: Mapping[str, Any]) -> Any:
        self.calls.append(("apply", body["metadata"]["name"]))
        self.applied.append(body)
        if self.apply_error:
            raise self.apply_error
        return body

    async def create_reservation(self, body: Mapping[str, Any]) -> Any:
        self.calls.append(("claim", body["metadata"]["name"]))
        if body["metadata"]["name"] in self.taken:
            raise ApiError(409, "AlreadyExists", "exists")
        self.claimed[body["metadata"]["name"]] = dict(body)
        return body

    async def get_reservation(self, name: str) -> Any:
        if name not in self.taken:
            raise ApiError(404, "NotFound", f"slicereservations {name} not found")
        info = self.taken[name]
        h = info.holder
        annotations = {}
        if info.pinned:
            annotations["tpuslice.dev/pin"] = "true"
        if info.unpinned_at:
            annotations["tpuslice.dev/pin-removed-at"] = info.unpinned_at
        holder: dict[str, Any] = {
            "namespace": h.namespace,
            "name": h.name,
            "uid": h.uid,
            "replicaName": h.replica_name,
        }
        if h.replica_index is not None:
            holder["replicaIndex"] = h.replica_index
        return {
            "metadata": {"name": name, "uid": info.uid, "annotations": annotations},
            "spec": {"nodePool": name, "holder": holder},
        }

    async def annotate_reservation(
        self, name: str, uid: str, annotations: Mapping[str, str | None]
    ) -> Any:
        self.calls.append(("annotate", name, dict(annotations)))
        current = self.taken.get(name)
        if current is None:
            raise ApiError(404, "NotFound", f"slicereservations {name} not found")
        if current.uid and uid and current.uid != uid:
            raise ApiError(409, "Conflict", "the object has been modified")
        pin = annotations.get("tpuslice.dev/pin", "keep")
        removed = annotations.get("tpuslice.dev/pin-removed-at", "keep")
        self.taken[name] = replace(
            current,
            pinned=current.pinned if pin == "keep" else pin == "true",
            unpinned_at=current.unpinned_at if removed == "keep" else (removed or ""),
        )
        return await self.get_reservation(name)

    async def list_pods(self, namespace: str, label_selector: str) -> list[Any]:
        self.calls.append(("list-pods", namespace, label_selector))
        return list(self.live_pods)

    async def delete_reservation(self, name: str, uid: str) -> bool:
        """Like the API server's delete with a uid precondition: a reservation of that
        name with another uid answers 409 Conflict (``Kube`` returns False) and stays."""
        self.calls.append(("free", name))
        current = self.taken.get(name)
        if current is not None and current.uid and current.uid != uid:
            self.conflicts.append(("free", name))
            return False
        self.taken.pop(name, None)
        return True

    async def set_reservation_phase(self, name: str, phase: str, message: str) -> None:
        self.calls.append(("phase", name, phase))

    async def release_pod(
        self,
        namespace: str,
        name: str,
        node_selector: Mapping[str, str],
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        self.calls.append(("release", name, *node_selector.values()))
        self.selectors[name] = dict(node_selector)
        if annotations:
            self.annotations[name] = dict(annotations)

    async def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None) -> bool:
        self.calls.append(("delete-pod", name))
        if grace_seconds is not None:
            self.pod_grace[name] = grace_seconds
        return True

    # ------------------------------------------------ capacity on demand
    async def create_podtemplate(self, body: Mapping[str, Any]) -> Any:
        name = body["metadata"]["name"]
        self.calls.append(("create-podtemplate", name))
        key = (body["metadata"]["namespace"], name)
        if key in self.podtemplates:
            raise ApiError(409, "AlreadyExists", f"podtemplates {name} already exists")
        self.podtemplates[key] = dict(body)
        return body

    async def patch_podtemplate(self, namespace: str, name: str, patch: Mapping[str, Any]) -> Any:
        self.calls.append(("patch-podtemplate", name))
        current = self.podtemplates.get((namespace, name))
        if current is None:
            raise ApiError(404, "NotFound", f"podtemplates {name} not found")
        for key, value in patch.items():
            if key == "metadata":
                current["metadata"] = {**current.get("metadata", {}), **value}
            else:
                current[key] = value
        return current

    async def delete_podtemplate(self, namespace: str, name: str) -> bool:
        self.calls.append(("delete-podtemplate", name))
        return self.podtemplates.pop((namespace, name), None) is not None

    async def create_provisioning_request(self, body: Mapping[str, Any]) -> Any:
        name = body["metadata"]["name"]
        self.calls.append(("create-request", name))
        if not self.provreq_installed:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        key = (body["metadata"]["namespace"], name)
        if key in self.requests:
            raise ApiError(409, "AlreadyExists", f"provisioningrequests {name} already exists")
        created = {**body, "metadata": {**body["metadata"], "uid": f"uid-{name}"}}
        self.requests[key] = created
        return created

    async def annotate_provisioning_request(
        self, namespace: str, name: str, annotations: Mapping[str, str]
    ) -> bool:
        self.calls.append(("annotate-request", name, dict(annotations)))
        current = self.requests.get((namespace, name))
        if current is None:
            return False
        meta = current.setdefault("metadata", {})
        meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
        return True

    async def delete_provisioning_request(
        self, namespace: str, name: str, uid: str | None = None
    ) -> bool:
        self.calls.append(("delete-request", name))
        return self.requests.pop((namespace, name), None) is not None

    async def hand_over_reservation(
        self, name: str, holder: Mapping[str, Any], resource_version: str
    ) -> Any:
        self.calls.append(("handover", name, holder.get("replicaName")))
        return {
            "metadata": {"name": name, "resourceVersion": resource_version + "1"},
            "spec": {"nodePool": name, "holder": dict(holder)},
        }

    async def patch_status(
        self, plural: str, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None:
        self.calls.append(("status",))
        self.status = dict(status)

    async def post_event(
        self, involved: Mapping[str, Any], kind: str, reason: str, message: str
    ) -> None:
        self.calls.append(("event", reason))

    async def list_gke_slices(self) -> list[Any]:
        return [dict(body) for body in self.gke_slices.values()]

    async def create_gke_slice(self, body: Mapping[str, Any]) -> Any:
        name = body["metadata"]["name"]
        self.calls.append(("create-slice", name))
        if name in self.gke_slices:
            raise ApiError(409, "AlreadyExists", f"slices {name} already exists")
        created = {**body, "metadata": {**body["metadata"], "uid": f"uid-{name}"}}
        self.gke_slices[name] = created
        return created

    async def delete_gke_slice(self, name: str, uid: str) -> bool:
        self.calls.append(("delete-slice", name))
        return self.gke_slices.pop(name, None) is not None

    async def delete_ray(self, plural: str, namespace: str, name: str, uid: str) -> None:
        self.calls.append(("delete-raycluster", name, uid))
        self.rayclusters.pop((namespace, name), None)


def _conforms() -> ClusterApi:
    return FakeKube()
