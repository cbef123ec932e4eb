"""The TPU identity webhook's admission decision, AdmissionReview v1 in, AdmissionReview v1 out.

``admission_response(review)`` is the whole decision as a pure function:
``mutate_pod`` on a pod CREATE, its changes as an RFC 6902 JSON patch
(``json_patch``: only the fields we changed, so the API server's audit log shows
what we set), a refusal (403) with the reason on ``IdentityError``.
``timed_admission_response`` is the same, observed into ``Metrics``. Two bounds
keep one odd pod from costing the API server or this process much: a pod with
more TPU containers than its host has chips is refused before any peer list is
built (``read_identity``), and a patch over ``MAX_PATCH_BYTES`` is refused
instead of sent. Warnings and log lines repeat at most once a minute per cause
(``limiter.CauseLimiter``); a refusal's answer is never held back. The server
(``server.py``), its configuration (``configuration.py``) and the certificates
(``certificates.py``, ``pki.py``) are the package's other parts.

Why ``failurePolicy: Fail``: a TPU worker admitted without its identity hangs in
JAX initialisation; refusing it makes KubeRay retry until the webhook is back.
The objectSelector limits that to our pods, so no other pod in the cluster ever
depends on this webhook, and the short ``timeoutSeconds`` turns a hung webhook
into a quick refusal.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Callable, Mapping
from http import HTTPStatus
from typing import Any

from tpuslice.model import constants as c
from tpuslice.planning.pinning import pinned_pod
from tpuslice.render.identity import IdentityError, MutationResult, Note, mutate_pod
from tpuslice.runtime.metrics import Metrics
from tpuslice.webhook.limiter import CauseLimiter

__all__ = [
    "DEFAULT_TIMEOUT_SECONDS",
    "HANDLER_ID",
    "IDLE_TIMEOUT_SECONDS",
    "MAX_BODY_BYTES",
    "MAX_PATCH_BYTES",
    "REVIEW_API_VERSION",
    "WARNING_WINDOW_SECONDS",
    "WEBHOOK_ENTRY_NAME",
    "BadReview",
    "admission_outcome",
    "admission_response",
    "admission_warnings",
    "json_patch",
    "limited_warnings",
    "review_request",
    "timed_admission_response",
]

log = logging.getLogger(__name__)

#: The server answers ``POST /<HANDLER_ID>``; the configuration's URL or Service path ends in it.
HANDLER_ID = c.IDENTITY_WEBHOOK
#: ``webhooks[].name``: Kubernetes requires a qualified name of three or more segments.
WEBHOOK_ENTRY_NAME = f"identity.{c.GROUP}"
#: Kubernetes allows 1-30 s; a pure function answers in milliseconds, and a short
#: timeout turns a hung webhook into a quick refusal that KubeRay retries.
DEFAULT_TIMEOUT_SECONDS = 5
#: Larger request bodies get 413, answered from the headers (the body is never
#: read). The API server itself refuses request bodies over 3 MiB: twice etcd's
#: 1.5 MiB request limit, since a JSON body shrinks when stored as protobuf
#: (``MaxRequestBodyBytes`` in ``NewConfig``, kubernetes/kubernetes@019f335d
#: staging/src/k8s.io/apiserver/pkg/server/config.go; etcd "System limits",
#: https://etcd.io/docs/latest/dev-guide/limit/, ``--max-request-bytes``). A pod
#: it admits is therefore below this, and its AdmissionReview (the pod once, plus
#: a few hundred bytes of request metadata on CREATE) stays below it too.
MAX_BODY_BYTES = 3 * 1024 * 1024
#: A keep-alive connection with no request for this long is closed. The API
#: server's webhook client keeps idle connections 90 s (http.DefaultTransport's
#: IdleConnTimeout, which k8s.io/apimachinery/pkg/util/net/http.go
#: ``SetOldTransportDefaults`` copies), but an HTTP/1.1 client must expect a
#: server to close an idle connection first (RFC 9112 section 9.6): Go's transport
#: sees our FIN in its read loop, drops the connection from its pool and dials
#: a new one for the next call (a millisecond TLS handshake). Only a call sent in
#: the same instant fails, which with ``failurePolicy: Fail`` refuses one pod that
#: KubeRay creates again. Short, so idle connections give their worker back fast.
IDLE_TIMEOUT_SECONDS = 10.0
#: The TLS handshake, whole (CPython bounds the handshake by the socket timeout as
#: one deadline, not per read), and a turned-away connection's 503.
HANDSHAKE_TIMEOUT_SECONDS = 5.0
#: From a request's first byte: reading its headers and body, and deciding. Twice
#: the API server's own wait (``DEFAULT_TIMEOUT_SECONDS``): an answer later than
#: that reaches no one, and a request trickled in byte by byte is dropped here.
REQUEST_DEADLINE_SECONDS = 10.0
#: Connections served at once, each on its own thread. A connection beyond them
#: first takes the worker of the connection that has waited longest for its
#: client, if any: an idle keep-alive connection (the API server keeps dozens per
#: replica) or one whose request is still arriving after the others' (a valid
#: call arrives in milliseconds, so the longest wait is a stalled client's); that
#: connection is closed. Else it waits up to ``WORKER_WAIT_SECONDS`` for a worker,
#: then is answered 503 with ``Retry-After`` and closed (the API server counts a
#: 5xx as a failed call: the pod is refused and KubeRay creates it again). A
#: decision takes milliseconds, so 32 cover the API server's bursts.
MAX_CONNECTIONS = 32
#: Connections that wait for a worker, or are being answered 503, at once; beyond
#: those a connection is closed without an answer. Never an unbounded queue.
MAX_WAITING_CONNECTIONS = 16
#: How long a connection beyond ``MAX_CONNECTIONS`` waits for a worker: a burst
#: of calls is absorbed, a worker held by a stalled client is not waited out.
WORKER_WAIT_SECONDS = 1.0
#: Connections the kernel holds while the accept loop is busy (the stdlib's 5 drops
#: a burst of new connections); Linux caps it at ``net.core.somaxconn``.
LISTEN_BACKLOG = 128
#: Request bodies, all connections together, held in memory at once; a request
#: whose Content-Length does not fit gets 503 with ``Retry-After``.
MAX_BODY_BYTES_IN_FLIGHT = 4 * MAX_BODY_BYTES
#: ``Retry-After`` on a 503: the API server does not retry a webhook call itself,
#: but a person or tool reading the answer learns how soon to try again.
RETRY_AFTER_SECONDS = 1

#: The largest JSON patch we send; a larger one is refused (403) with the reason. The
#: API server stores a pod in etcd, whose default request limit is 1.5 MiB
#: (etcd --max-request-bytes, "etcd limits" in the etcd docs): a patch of a third of
#: that leaves the rest to the user's own spec and metadata, and a patch near the
#: limit fails in the API server with a message that names neither us nor the cause.
#: The largest patch a well-formed pod gets (one TPU container, the largest slice of
#: any generation, 53-character names) is about a quarter of this bound
#: (tests/unit/test_webhook_bounds.py checks it); a pod over it has several TPU
#: containers of a TPU7x slice, whose lists name every container of every host, and
#: its values near Linux's 128 KiB limit on one environment string (MAX_ARG_STRLEN,
#: execve(2)), past which its containers could not start anyway.
MAX_PATCH_BYTES = 512 * 1024
#: One warning or log line per cause (pod template and field) per window: a
#: RayCluster's pods share a template, so they share its warnings.
WARNING_WINDOW_SECONDS = 60.0

REVIEW_API_VERSION = "admission.k8s.io/v1"
#: The process's limiter of repeated warnings; a caller (a test) may pass its own.
_WARNINGS = CauseLimiter(window_seconds=WARNING_WINDOW_SECONDS)


# ---------------------------------------------------------------------- decision


class BadReview(ValueError):
    """The request body is not an AdmissionReview v1 request (the server answers 400)."""


def _kept_text(note: Note) -> str:
    return (
        f"{c.IDENTITY_WEBHOOK}: kept {note.name} as set in container {note.container!r}; "
        f"it differs from the value computed for this pod"
    )


def _replaced_text(note: Note) -> str:
    return (
        f"{c.IDENTITY_WEBHOOK}: replaced "
        + (f"{note.name} in container {note.container!r}" if note.container else note.name)
        + " (a placeholder or a value that peers could not resolve)"
    )


def admission_warnings(result: MutationResult) -> list[str]:
    """Admission warnings (shown to the client that created the pod) for kept/replaced values."""
    return [_kept_text(n) for n in result.kept] + [_replaced_text(n) for n in result.replaced]


def _template_of(pod: Mapping[str, Any]) -> tuple[str, str, str]:
    """(namespace, RayCluster, worker group): the pods that share a template share a cause."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    return (
        str(meta.get("namespace") or ""),
        str(labels.get(c.KUBERAY_LABEL_CLUSTER) or labels.get(c.LABEL_CLUSTER) or ""),
        str(labels.get(c.KUBERAY_LABEL_GROUP) or ""),
    )


def _held_suffix(held: int) -> str:
    if not held:
        return ""
    return f" ({held} more like this held back in the last {WARNING_WINDOW_SECONDS:.0f} s)"


def limited_warnings(
    pod: Mapping[str, Any], result: MutationResult, limiter: CauseLimiter
) -> list[str]:
    """``admission_warnings`` less those said for the same template and field within the
    limiter's window; each is logged once as it is returned."""
    template = _template_of(pod)
    causes = [(("kept", n.container, n.name), _kept_text(n)) for n in result.kept]
    causes += [(("replaced", n.container, n.name), _replaced_text(n)) for n in result.replaced]
    warnings = []
    for cause, text in causes:
        held = limiter.admit((*template, *cause))
        if held is None:
            continue
        warnings.append(text + _held_suffix(held))
        log.warning("pod %s: %s", _pod_ref(pod), warnings[-1])
    return warnings


def _log_refusal(pod: Mapping[str, Any], message: str, limiter: CauseLimiter) -> None:
    held = limiter.admit((*_template_of(pod), "refused"))
    if held is not None:
        log.warning("refused pod %s: %s%s", _pod_ref(pod), message, _held_suffix(held))


def _patch_too_large(pod: Mapping[str, Any], result: MutationResult, size: int) -> str:
    identity = result.identity
    hosts = identity.shape.hosts if identity is not None else 0
    return (
        f"pod {_pod_ref(pod)}: its TPU identity would be a {size}-byte JSON patch, over the "
        f"webhook's limit of {MAX_PATCH_BYTES} bytes; the peer lists (TPU_WORKER_HOSTNAMES, "
        f"TPU_PROCESS_ADDRESSES) of {hosts} hosts are repeated in every TPU container. Use one "
        f"TPU container per pod requesting all of the host's chips, or shorter RayCluster and "
        f"worker group names"
    )


def review_request(review: Any) -> Mapping[str, Any]:
    """The ``request`` of an AdmissionReview v1; ``BadReview`` for any other body."""
    if not isinstance(review, Mapping):
        raise BadReview("the body is not a JSON object")
    if review.get("apiVersion") != REVIEW_API_VERSION or review.get("kind") != "AdmissionReview":
        raise BadReview(
            f"expected an AdmissionReview of {REVIEW_API_VERSION}, got "
            f"{review.get('kind')!r} of {review.get('apiVersion')!r}"
        )
    request = review.get("request")
    if not isinstance(request, Mapping) or not isinstance(request.get("uid"), str):
        raise BadReview("the AdmissionReview has no request with a uid")
    return request


def _is_pod_create(request: Mapping[str, Any]) -> bool:
    """A CREATE of a pod itself: not of a subresource (pods/binding, pods/eviction are
    CREATEs too), which our configuration's rules never send but a hand-made one might."""
    resource = request.get("resource")
    return (
        isinstance(resource, Mapping)
        and request.get("operation") == "CREATE"
        and resource.get("group", "") == ""
        and resource.get("resource") == "pods"
        and not request.get("subResource")
    )


def _pod_ref(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    name = meta.get("name") or f"{meta.get('generateName') or ''}*"
    return f"{meta.get('namespace') or '?'}/{name}"


#: Pin at admission: the node pool a pod goes to (``webhook.pinning.PinLookup.pool_for``)
Pin = Callable[[Mapping[str, Any], str], str | None]


def admission_response(
    review: Mapping[str, Any], *, limiter: CauseLimiter | None = None, pin: Pin | None = None
) -> dict[str, Any]:
    """The AdmissionReview answering ``review``: admit a pod with its TPU identity, or refuse it.

    Only a CREATE of a pod labelled ``tpuslice.dev/cluster`` is looked at (the
    label repeats the configuration's objectSelector); anything else is allowed
    unchanged. An already mutated pod (reinvocation) gets no patch, because
    ``mutate_pod`` is idempotent. Raises ``BadReview`` for a body that is not an
    AdmissionReview v1 request. ``limiter``: which warnings are repeated (default:
    the process's, one per cause a minute). ``pin`` (``--pin-at-admission``): the node
    pool a TPU pod's slice already holds and the leader marked, if any; the pod is
    then admitted pinned there, without our gate (``planning.pinning.pinned_pod``), and
    says so in ``tpuslice.dev/pinned-at-admission``.
    """
    limiter = _WARNINGS if limiter is None else limiter
    request = review_request(review)
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    answer = {"apiVersion": REVIEW_API_VERSION, "kind": "AdmissionReview", "response": response}
    pod = request.get("object")
    if not _is_pod_create(request):
        return answer
    if not isinstance(pod, Mapping):
        raise BadReview("a pod CREATE without the pod as request.object")
    if c.LABEL_CLUSTER not in ((pod.get("metadata") or {}).get("labels") or {}):
        return answer
    try:
        result = mutate_pod(pod)
    except IdentityError as err:
        return _refuse(answer, pod, str(err), limiter)
    if result.identity is None:
        return answer
    mutated = result.pod
    pool = pin(pod, str(request.get("namespace") or "")) if pin is not None else None
    if pool is not None:
        mutated = pinned_pod(mutated, pool)
        meta = dict(mutated.get("metadata") or {})
        meta["annotations"] = {**(meta.get("annotations") or {}), c.ANNOTATION_PINNED: pool}
        mutated = {**mutated, "metadata": meta}
    ops = json_patch(pod, mutated)
    patch = json.dumps(ops).encode() if ops else b""
    if len(patch) > MAX_PATCH_BYTES:
        return _refuse(answer, pod, _patch_too_large(pod, result, len(patch)), limiter)
    warnings = limited_warnings(pod, result, limiter)
    if warnings:
        response["warnings"] = warnings
    if not ops:
        return answer
    response["patchType"] = "JSONPatch"
    response["patch"] = base64.b64encode(patch).decode("ascii")
    return answer


def _refuse(
    answer: dict[str, Any], pod: Mapping[str, Any], message: str, limiter: CauseLimiter
) -> dict[str, Any]:
    response = answer["response"]
    response["allowed"] = False
    response["status"] = {"code": HTTPStatus.FORBIDDEN.value, "message": message}
    _log_refusal(pod, message, limiter)
    return answer


def json_patch(old: Any, new: Any, path: str = "") -> list[dict[str, Any]]:
    """RFC 6902 operations that turn ``old`` into ``new``: objects key by key, arrays of
    the same length item by item, any other difference replaced whole (an env list that
    grew is one ``replace`` of the list).

    Exact by construction and cheap: an equal subtree costs one C-level comparison, so
    a pod's patch costs about as much as comparing it once. ``jsonpatch.make_patch``
    (used before) searches for list moves and was the webhook's largest CPU cost under
    a pod burst (docs/performance.md); its patches were smaller, not more correct."""
    if old == new:
        return []
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        ops: list[dict[str, Any]] = [
            {"op": "remove", "path": f"{path}/{_pointer_token(key)}"}
            for key in old
            if key not in new
        ]
        for key, value in new.items():
            at = f"{path}/{_pointer_token(key)}"
            if key in old:
                ops += json_patch(old[key], value, at)
            else:
                ops.append({"op": "add", "path": at, "value": value})
        return ops
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [
            op
            for i, (a, b) in enumerate(zip(old, new, strict=True))
            for op in json_patch(a, b, f"{path}/{i}")
        ]
    return [{"op": "replace", "path": path, "value": new}]


def _pointer_token(key: Any) -> str:
    """A JSON Pointer reference token (RFC 6901: ``~`` as ``~0``, ``/`` as ``~1``)."""
    return str(key).replace("~", "~0").replace("/", "~1")


def admission_outcome(answer: Mapping[str, Any]) -> str:
    """The metric label of an ``admission_response`` answer: mutated, unchanged or refused."""
    response = answer["response"]
    if not response["allowed"]:
        return "refused"
    return "mutated" if "patch" in response else "unchanged"


def timed_admission_response(
    review: Mapping[str, Any], metrics: Metrics, pin: Pin | None = None
) -> dict[str, Any]:
    """``admission_response`` observed into ``metrics``: latency by mutated/unchanged/refused,
    or ``error`` (also counted in ``tpuslice_errors_total{kind="webhook"}``) when it raises.

    A body that is not an AdmissionReview (``BadReview``) is not an admission and
    is not observed.
    """
    began = time.perf_counter()
    result = "error"
    try:
        answer = admission_response(review, pin=pin)
        result = admission_outcome(answer)
        return answer
    except BadReview:
        result = ""
        raise
    finally:
        if result:
            metrics.admission(time.perf_counter() - began, result)
