"""The TPUSlicePolicy webhook's decision: a CREATE or UPDATE of a TPUSliceCluster,
TPUSliceJob or TPUSliceService is refused at ``kubectl apply`` when a policy refuses
it, with the same refusals (policy, field, limit) the operator's pass would set.

``policy_admission_response(review, read)`` is the whole decision as a function of
the review and of ``read(namespace)``: the cluster's policies and the namespace's
labels, or None when they could not be read. It is the admission half of the
policy; the pass (``controller.reconciler.policy_stall``) stays the enforcement,
so what admission cannot judge is left to it, never refused here:

- a DELETE, a subresource, or any other kind: never reviewed (allowed);
- an UPDATE that leaves ``spec`` as it was (metadata, finalizers, the operator's
  own writes): allowed, so a policy added later never blocks an object's deletion
  or the operator's bookkeeping on objects admitted before it;
- a spec that does not parse: allowed, left to the CRD's schema and the pass,
  whose status names every field that is wrong;
- policies or namespace unreadable: allowed with a warning, the pass decides;
- namespace usage (``slicesPerNamespace``, ``chipsPerNamespace``): depends on the
  other objects, so only the pass judges it (the object waits, it is not wrong).

A priority the governing policies clamp is admitted with a warning saying so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from tpuslice.model import constants as c
from tpuslice.policy.rules import ObjectFacts, Refusal, check_object, effective_priority, facts_of
from tpuslice.policy.selection import governing
from tpuslice.runtime.policy_cache import PolicyView
from tpuslice.spec.cluster import parse_cluster
from tpuslice.spec.job import parse_job
from tpuslice.spec.parts import SpecError
from tpuslice.spec.service import parse_service
from tpuslice.webhook.admission import REVIEW_API_VERSION, review_request

__all__ = [
    "MAX_MESSAGE_CHARS",
    "MAX_REFUSALS_SHOWN",
    "POLICY_HANDLER_ID",
    "POLICY_WEBHOOK",
    "POLICY_WEBHOOK_ENTRY_NAME",
    "PolicyView",
    "Reviewed",
    "policy_admission_response",
    "reviewed_object",
]

log = logging.getLogger(__name__)

#: The ValidatingWebhookConfiguration's name, and the path the server answers it on.
POLICY_WEBHOOK = "tpuslice-policy"
POLICY_HANDLER_ID = POLICY_WEBHOOK
#: ``webhooks[].name``: a qualified name of three or more segments.
POLICY_WEBHOOK_ENTRY_NAME = f"policy.{c.GROUP}"
#: A refusal's message names at most this many refusals (the rest are counted), as
#: the pass's Stalled condition does.
MAX_REFUSALS_SHOWN = 3
#: The refusal message is cut here: kubectl prints it on one line, and the API
#: server keeps it in its audit log.
MAX_MESSAGE_CHARS = 4096

_PARSERS: Mapping[str, Callable[[Mapping[str, Any]], Any]] = {
    c.PLURAL_CLUSTER: parse_cluster,
    c.PLURAL_JOB: parse_job,
    c.PLURAL_SERVICE: parse_service,
}
_KINDS = {plural: kind for kind, plural in c.PLURALS.items()}
_REVIEWED_OPERATIONS = ("CREATE", "UPDATE")


@dataclass(frozen=True)
class Reviewed:
    """An object admission judges: a spec that parsed, and where it lives."""

    kind: str
    namespace: str
    name: str
    facts: ObjectFacts


def reviewed_object(request: Mapping[str, Any]) -> Reviewed | None:
    """The object of an admission request that policies judge, or None when admission
    leaves it alone (see the module's list: not ours, a DELETE, an UPDATE with the same
    spec, a spec that does not parse)."""
    resource = request.get("resource")
    if not isinstance(resource, Mapping) or resource.get("group") != c.GROUP:
        return None
    parse = _PARSERS.get(str(resource.get("resource")))
    if parse is None or request.get("subResource"):
        return None
    operation = request.get("operation")
    if operation not in _REVIEWED_OPERATIONS:
        return None
    obj = request.get("object")
    if not isinstance(obj, Mapping) or not isinstance(obj.get("spec"), Mapping):
        return None
    if operation == "UPDATE":
        old = request.get("oldObject")
        if isinstance(old, Mapping) and old.get("spec") == obj.get("spec"):
            return None
    try:
        facts = facts_of(parse(obj))
    except SpecError:
        return None
    raw_meta = obj.get("metadata")
    meta: Mapping[str, Any] = raw_meta if isinstance(raw_meta, Mapping) else {}
    namespace = request.get("namespace") or meta.get("namespace") or ""
    name = request.get("name") or meta.get("name") or f"{meta.get('generateName') or ''}*"
    return Reviewed(
        kind=_KINDS[str(resource.get("resource"))],
        namespace=str(namespace),
        name=str(name),
        facts=facts,
    )


def _refusal_message(reviewed: Reviewed, refusals: Sequence[Refusal]) -> str:
    shown = "; ".join(str(r) for r in refusals[:MAX_REFUSALS_SHOWN])
    if len(refusals) > MAX_REFUSALS_SHOWN:
        shown += f"; and {len(refusals) - MAX_REFUSALS_SHOWN} more"
    text = f"{reviewed.kind} {reviewed.namespace}/{reviewed.name}: {refusals[0].reason}: {shown}"
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[: MAX_MESSAGE_CHARS - 3] + "..."
    return text


def policy_admission_response(
    review: Any, read: Callable[[str], PolicyView | None]
) -> dict[str, Any]:
    """The AdmissionReview answering ``review``: allowed, or refused (403) with every
    refusal the governing TPUSlicePolicies make, each naming the policy, the field and
    the limit. ``read`` is called only for an object admission judges. Raises
    ``BadReview`` for a body that is not an AdmissionReview v1 request."""
    request = review_request(review)
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    answer = {"apiVersion": REVIEW_API_VERSION, "kind": "AdmissionReview", "response": response}
    reviewed = reviewed_object(request)
    if reviewed is None:
        return answer
    view = read(reviewed.namespace)
    if view is None:
        response["warnings"] = [
            f"{POLICY_WEBHOOK}: TPUSlicePolicies could not be read; the operator checks "
            f"this {reviewed.kind} against them when it acts on it"
        ]
        return answer
    refusals = check_object(view.policies, view.namespace_labels, reviewed.facts)
    if refusals:
        message = _refusal_message(reviewed, refusals)
        response["allowed"] = False
        response["status"] = {
            "code": HTTPStatus.FORBIDDEN.value,
            "reason": "Forbidden",
            "message": message,
        }
        log.info("refused %s", message)
        return answer
    governed = governing(view.policies, view.namespace_labels)
    priority = effective_priority(governed, reviewed.facts.priority)
    if priority.message:
        response["warnings"] = [f"{POLICY_WEBHOOK}: {priority.message}"]
    return answer
