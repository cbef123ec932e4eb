"""The policy webhook's reader (runtime.policy_cache.PolicyCache): one LIST of policies
and one GET per namespace per TTL, failures remembered as long, every count bounded.
The clock is injected: no test sleeps."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

import pytest

from tpuslice.runtime import policy_cache as pc


def policy_obj(name: str, **spec: Any) -> dict[str, Any]:
    spec.setdefault("namespaceSelector", {"matchLabels": {"team": name}})
    return {"kind": "TPUSlicePolicy", "metadata": {"name": name}, "spec": spec}


class Api:
    """The two reads, answered from fields a test changes; counts the calls."""

    def __init__(self) -> None:
        self.policies: list[dict[str, Any]] = [policy_obj("research")]
        self.namespaces: dict[str, dict[str, str]] = {"ml": {"team": "research"}}
        self.more = ""
        self.fail: Exception | None = None
        self.lists: list[int] = []
        self.gets: list[str] = []

    def list_policies(self, limit: int) -> Mapping[str, Any]:
        self.lists.append(limit)
        if self.fail:
            raise self.fail
        return {"items": list(self.policies), "metadata": {"continue": self.more}}

    def get_namespace(self, name: str) -> Mapping[str, Any] | None:
        self.gets.append(name)
        if self.fail:
            raise self.fail
        labels = self.namespaces.get(name)
        return None if labels is None else {"metadata": {"name": name, "labels": labels}}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def cache(api: Api, clock: Clock, **kwargs: Any) -> pc.PolicyCache:
    return pc.PolicyCache(api.list_policies, api.get_namespace, clock=clock, **kwargs)


def names(view: pc.PolicyView | None) -> list[str]:
    assert view is not None
    return [p.name for p in view.policies]


def test_reads_once_per_ttl_then_again() -> None:
    api, clock = Api(), Clock()
    reader = cache(api, clock, ttl=5.0)
    view = reader.view("ml")
    assert names(view) == ["research"]
    assert view is not None and view.namespace_labels == {"team": "research"}
    api.policies.append(policy_obj("serving"))
    api.namespaces["ml"] = {"team": "serving"}
    clock.now += 4.9
    assert names(reader.view("ml")) == ["research"]  # still the first read
    assert (len(api.lists), api.gets) == (1, ["ml"])
    clock.now += 0.1
    view = reader.view("ml")
    assert names(view) == ["research", "serving"]
    assert view is not None and view.namespace_labels == {"team": "serving"}
    assert (len(api.lists), api.gets) == (2, ["ml", "ml"])


def test_the_list_asks_for_one_more_than_the_bound_and_more_is_unreadable() -> None:
    api, clock = Api(), Clock()
    assert cache(api, clock).view("ml") is not None
    assert api.lists == [pc.MAX_POLICIES + 1]
    api.more = "token"  # the API server has another page
    clock.now += 10
    assert cache(api, clock).view("ml") is None
    api.more = ""
    api.policies = [policy_obj(f"p{i}") for i in range(pc.MAX_POLICIES + 1)]
    assert cache(api, clock).view("ml") is None


def test_a_failed_read_is_none_remembered_for_the_ttl_and_warned_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api, clock = Api(), Clock()
    reader = cache(api, clock, ttl=5.0)
    api.fail = TimeoutError("read timed out")
    with caplog.at_level(logging.WARNING, logger=pc.__name__):
        assert reader.view("ml") is None
        assert reader.view("ml") is None
    assert len(api.lists) == 1, "the failure is kept for the TTL: one timeout, not one per call"
    assert [r.message for r in caplog.records if "read timed out" in r.message] != []
    assert len(caplog.records) == 1
    api.fail = None
    clock.now += 5
    assert names(reader.view("ml")) == ["research"]


def test_a_namespace_that_does_not_exist_is_unreadable() -> None:
    api, clock = Api(), Clock()
    assert cache(api, clock).view("gone") is None


def test_a_policy_with_a_bad_field_fails_closed_and_one_without_a_selector_is_ignored() -> None:
    api, clock = Api(), Clock()
    api.policies = [
        policy_obj("typo", limits={"slicesPerObject": "two"}),
        {"kind": "TPUSlicePolicy", "metadata": {"name": "nobody"}, "spec": {}},
    ]
    view = cache(api, clock).view("ml")
    assert view is not None
    (typo,) = view.policies
    assert typo.name == "typo" and "slicesPerObject" in typo.invalid


def test_namespaces_kept_are_bounded_oldest_first() -> None:
    api, clock = Api(), Clock()
    api.namespaces = {f"ns{i}": {} for i in range(4)}
    reader = cache(api, clock, max_namespaces=2)
    for ns in ("ns0", "ns1", "ns2"):
        assert reader.view(ns) is not None
    assert api.gets == ["ns0", "ns1", "ns2"]
    reader.view("ns2")
    reader.view("ns1")
    assert api.gets == ["ns0", "ns1", "ns2"]  # both still kept
    reader.view("ns0")  # dropped for ns2: read again
    assert api.gets == ["ns0", "ns1", "ns2", "ns0"]


def test_threads_arriving_during_a_read_use_its_result() -> None:
    api, clock = Api(), Clock()
    started, release = threading.Event(), threading.Event()
    original = api.list_policies

    def slow_list(limit: int) -> Mapping[str, Any]:
        started.set()
        assert release.wait(10)
        return original(limit)

    reader = pc.PolicyCache(slow_list, api.get_namespace, clock=clock)
    views: list[pc.PolicyView | None] = []
    threads = [threading.Thread(target=lambda: views.append(reader.view("ml"))) for _ in range(4)]
    for t in threads:
        t.start()
    assert started.wait(10)
    release.set()
    for t in threads:
        t.join(10)
    assert [names(v) for v in views] == [["research"]] * 4
    assert len(api.lists) == 1


@pytest.mark.parametrize(("field", "value"), [("ttl", 0), ("ttl", 301), ("max_namespaces", 0)])
def test_bounds_out_of_range_are_refused_naming_the_field(field: str, value: Any) -> None:
    api = Api()
    with pytest.raises(ValueError, match=field):
        pc.PolicyCache(api.list_policies, api.get_namespace, **{field: value})
