"""The identity webhook's bounds: what one odd pod may cost the webhook and the API server.

Work is counted, never timed: calls to ``PodIdentity.host_address`` (one peer list
entry each) and the size of the patch. A pod of 40 TPU containers on a
512-host TPU7x slice cost 3.6 s of CPU and a 77 MiB patch when each container
built its own lists; it is now refused before any list is built.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.unit.test_identity import _tpu_containers, kuberay_pod, render_worker_template
from tpuslice.model import constants as c
from tpuslice.model.topology import slice_shape
from tpuslice.render import identity
from tpuslice.webhook import admission
from tpuslice.webhook.limiter import CauseLimiter

LONGEST_NAME = "a" * c.MAX_NAME_LENGTH


@pytest.fixture
def host_addresses(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts peer-list entries built: one ``host_address`` call each."""
    calls: list[int] = []
    original = identity.PodIdentity.host_address

    def counted(self: identity.PodIdentity, host: int, replica: int | None = None) -> str:
        calls.append(host)
        return original(self, host, replica)

    monkeypatch.setattr(identity.PodIdentity, "host_address", counted)
    yield calls


def _review(pod: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u1",
            "operation": "CREATE",
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "object": pod,
        },
    }


def _pod(tpu_type: str, topology: str, tpu_containers: int, *, name: str = "llm") -> dict[str, Any]:
    template, hosts = render_worker_template(tpu_type, topology, name=name)
    pod = kuberay_pod(template, hosts, 0, hosts - 1, cluster=name)
    pod["spec"]["containers"] = _tpu_containers(template, tpu_containers)
    return pod


def _patch_bytes(answer: dict[str, Any]) -> int:
    return len(base64.b64decode(answer["response"].get("patch", "")))


def test_forty_tpu_containers_on_a_large_slice_are_refused_before_any_peer_list(
    host_addresses: list[int],
) -> None:
    pod = _pod("tpu7x", "8x16x16", 40, name=LONGEST_NAME)
    assert slice_shape("tpu7x", "8x16x16").hosts == 512
    answer = admission.admission_response(_review(pod), limiter=CauseLimiter())
    response = answer["response"]
    assert response["allowed"] is False and response["status"]["code"] == 403
    message = response["status"]["message"]
    assert f"pod ml/{LONGEST_NAME}-tpu-worker-*" in message
    assert "has 40 containers requesting google.com/tpu" in message
    assert "at most 4 TPU containers" in message
    assert host_addresses == [], "no peer list is built for a refused pod"
    assert "patch" not in response


def test_peer_lists_are_built_once_per_pod(host_addresses: list[int]) -> None:
    """TPU7x, 4 containers on 16 hosts: one hostname list (16), one process-address list
    (16 x 4), one coordinator; per container it was four times that."""
    pod = _pod("tpu7x", "4x4x4", 4)
    result = identity.mutate_pod(pod)
    hosts = result.identity.shape.hosts if result.identity else 0
    assert hosts == 16
    assert len(host_addresses) == hosts + hosts * 4 + 1
    lists = [
        {e["name"]: e["value"] for e in ctr["env"] if "value" in e}
        for ctr in result.pod["spec"]["containers"]
    ]
    first = lists[0]["TPU_PROCESS_ADDRESSES"]
    assert len(first.split(",")) == hosts * 4
    # one string shared by every container, not four equal copies
    assert all(env["TPU_PROCESS_ADDRESSES"] is first for env in lists)


def test_a_patch_over_the_bound_is_refused_after_one_pass(host_addresses: list[int]) -> None:
    """Four one-chip containers on the largest TPU7x slice with the longest name: every
    container's TPU_PROCESS_ADDRESSES names all 2048 processes (~160 KB each)."""
    pod = _pod("tpu7x", "8x16x16", 4, name=LONGEST_NAME)
    hosts = 512
    unbounded = len(json.dumps(admission.json_patch(pod, identity.mutate_pod(pod).pod)))
    assert unbounded > admission.MAX_PATCH_BYTES
    host_addresses.clear()
    answer = admission.admission_response(_review(pod), limiter=CauseLimiter())
    response = answer["response"]
    assert response["allowed"] is False and "patch" not in response
    message = response["status"]["message"]
    assert f"{unbounded}-byte JSON patch" in message
    assert f"limit of {admission.MAX_PATCH_BYTES} bytes" in message
    assert "one TPU container per pod" in message and f"{hosts} hosts" in message
    assert len(host_addresses) == hosts + hosts * 4 + 1, "one pass over the peers"


# The largest slice of every generation (tpu-facts.md section 1; model/topology.py).
LARGEST = [("v4", "12x12x16"), ("v5e", "16x16"), ("v5p", "16x16x24"), ("v6e", "16x16")]
LARGEST += [("tpu7x", "8x16x16")]


@pytest.mark.parametrize(("tpu_type", "topology"), LARGEST)
def test_a_well_formed_pod_of_the_largest_slice_is_well_under_the_bound(
    tpu_type: str, topology: str
) -> None:
    """One TPU container with all the host's chips, the longest RayCluster name, the
    last host of the slice: the bound leaves at least three times this patch."""
    template, hosts = render_worker_template(tpu_type, topology, name=LONGEST_NAME)
    pod = kuberay_pod(template, hosts, 0, hosts - 1, cluster=LONGEST_NAME)
    answer = admission.admission_response(_review(pod), limiter=CauseLimiter())
    assert answer["response"]["allowed"] is True
    assert 0 < _patch_bytes(answer) * 3 < admission.MAX_PATCH_BYTES


def test_a_copy_of_the_refused_pod_is_not_changed() -> None:
    pod = _pod("tpu7x", "8x16x16", 40)
    before = copy.deepcopy(pod)
    admission.admission_response(_review(pod), limiter=CauseLimiter())
    assert pod == before
