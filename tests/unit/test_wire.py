"""model.wire gives what json.loads gives, without metadata.managedFields unless asked."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tpuslice.model.wire import DecodeError, decode_event, decode_page

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)
METADATA = st.dictionaries(
    st.sampled_from(["name", "namespace", "labels", "managedFields", "resourceVersion", "x"]),
    VALUES,
    max_size=5,
)
OBJECTS = st.dictionaries(
    st.sampled_from(["apiVersion", "kind", "spec", "status", "template", "data"]),
    VALUES,
    max_size=4,
).flatmap(lambda top: st.one_of(st.just(top), METADATA.map(lambda meta: {**top, "metadata": meta})))


def without_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    if isinstance(out.get("metadata"), dict):
        out["metadata"].pop("managedFields", None)
    return out


@given(st.lists(OBJECTS, max_size=4), METADATA, st.booleans())
def test_a_page_is_what_json_gives_less_the_managed_fields(
    items: list[dict[str, Any]], meta: dict[str, Any], keep: bool
) -> None:
    data = json.dumps({"items": items, "metadata": meta}).encode()
    page = decode_page(data, managed_fields=keep)
    assert page.items == (items if keep else [without_managed_fields(i) for i in items])
    assert page.metadata == meta


@given(st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]), OBJECTS, st.booleans())
def test_an_event_is_what_json_gives_less_the_managed_fields(
    event_type: str, obj: dict[str, Any], keep: bool
) -> None:
    line = json.dumps({"type": event_type, "object": obj}).encode()
    assert decode_event(line, managed_fields=keep) == (
        event_type,
        obj if keep else without_managed_fields(obj),
    )


def test_an_error_event_keeps_its_status_whole_and_a_missing_object_is_empty() -> None:
    status = {"kind": "Status", "code": 410, "reason": "Expired", "metadata": {}}
    assert decode_event(json.dumps({"type": "ERROR", "object": status}).encode()) == (
        "ERROR",
        status,
    )
    assert decode_event(b'{"type":"ADDED"}') == ("ADDED", {})
    assert decode_event(b'{"type":"ADDED","object":null}') == ("ADDED", {})
    assert decode_page(b"") == ([], {})
    assert decode_page(b'{"items":null}') == ([], {})


def test_a_pod_keeps_every_field_but_its_managed_fields() -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "w-0",
            "namespace": "ml",
            "labels": {"tpuslice.dev/cluster": "llm"},
            "deletionTimestamp": "2026-12-06T00:00:00Z",
            "managedFields": [{"manager": "kuberay-operator", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {"nodeName": "n1", "schedulingGates": [{"name": "tpuslice.dev/slice"}]},
        "status": {"phase": "Running"},
    }
    data = json.dumps({"items": [pod], "metadata": {"resourceVersion": "9"}}).encode()
    (decoded,) = decode_page(data).items
    assert decoded == without_managed_fields(pod)
    assert "managedFields" not in decoded["metadata"]
    (kept,) = decode_page(data, managed_fields=True).items
    assert kept == pod


@pytest.mark.parametrize(
    "data", [b"{", b"[]", b'{"items": 3}', b'{"items": [1]}', b'{"items": [{"metadata": 3}]}']
)
def test_a_malformed_answer_is_a_value_error(data: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_page(data)
    assert issubclass(DecodeError, ValueError)
