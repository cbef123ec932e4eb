"""The TPUSlicePolicies and a namespace's labels for the policy webhook, read from the
API server and kept a few seconds, on the webhook's own threads.

Why not the operator's watches: they feed the pass on the asyncio loop (and a
standby replica, which serves the webhook too, follows nothing); the webhook
answers from threads of its own and must not wait for that loop. Why a short TTL:
a policy an admin just applied applies at admission within ``ttl`` seconds, and
the pass enforces it anyway; meanwhile a burst of applies costs one LIST and one
GET per namespace, not one per request.

Every input is bounded: at most ``MAX_POLICIES`` policies are read (more, and
admission leaves policies to the pass), at most ``max_namespaces`` namespaces are
kept, and each read has its own timeout, below the webhook's. A failed read is
remembered for ``ttl`` too, so an unreachable API server costs one timeout per
``ttl``, not one per request; meanwhile the reader returns None (admission then
allows, and the pass decides).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tpuslice.policy.records import Policy
from tpuslice.runtime.informers import policy_record

__all__ = [
    "DEFAULT_TTL_SECONDS",
    "MAX_NAMESPACES",
    "MAX_POLICIES",
    "PolicyCache",
    "PolicyView",
]

log = logging.getLogger(__name__)

#: How long a read of the policies, or of a namespace, is used.
DEFAULT_TTL_SECONDS = 5.0
#: The policies one LIST may bring (the LIST asks for one more, to see there are more).
#: Far above any real cluster: a policy governs whole namespaces.
MAX_POLICIES = 1000
#: Namespaces whose labels are kept at once; past it the oldest read goes first.
MAX_NAMESPACES = 1024
#: At most one warning line per this many seconds about failed reads.
_WARN_EVERY_SECONDS = 60.0


@dataclass(frozen=True)
class PolicyView:
    """What admission judges an object by: every policy in the cluster (as enforced,
    ``policy.records.read_policy``) and the labels of the object's namespace."""

    policies: Sequence[Policy]
    namespace_labels: Mapping[str, str]


class _Unreadable(Exception):
    """A read that failed, kept for its TTL like a good one."""


@dataclass(frozen=True)
class _Entry:
    expires: float
    value: Any  # the read, or an _Unreadable


class PolicyCache:
    """``view(namespace)``: the policies and the namespace's labels, each read at most
    once per ``ttl`` (seconds of ``clock``). Safe from any number of threads: a read
    runs under its kind's lock, so threads arriving meanwhile use its result.

    ``list_policies(limit)`` returns the TPUSlicePolicy LIST (a dict with ``items``
    and ``metadata.continue``); ``get_namespace(name)`` the Namespace, None when it
    does not exist. Both may raise; the error is logged and the view is None.
    """

    def __init__(
        self,
        list_policies: Callable[[int], Mapping[str, Any]],
        get_namespace: Callable[[str], Mapping[str, Any] | None],
        *,
        ttl: float = DEFAULT_TTL_SECONDS,
        max_namespaces: int = MAX_NAMESPACES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < ttl <= 300:
            raise ValueError(f"PolicyCache ttl: seconds above 0 and at most 300, got {ttl!r}")
        if not 1 <= max_namespaces <= 100_000:
            raise ValueError(
                f"PolicyCache max_namespaces: from 1 to 100000, got {max_namespaces!r}"
            )
        self._list_policies = list_policies
        self._get_namespace = get_namespace
        self._ttl = ttl
        self._max_namespaces = max_namespaces
        self._clock = clock
        self._policies: _Entry | None = None
        self._namespaces: dict[str, _Entry] = {}
        self._policies_lock = threading.Lock()
        self._namespaces_lock = threading.Lock()
        self._next_warning = float("-inf")

    def view(self, namespace: str) -> PolicyView | None:
        """The policies and ``namespace``'s labels; None when either cannot be read."""
        try:
            policies = self._policies_now()
            labels = self._labels_now(namespace)
        except _Unreadable:
            return None
        return PolicyView(policies, labels)

    def _fresh(self, entry: _Entry | None) -> bool:
        return entry is not None and self._clock() < entry.expires

    def _policies_now(self) -> tuple[Policy, ...]:
        with self._policies_lock:
            entry = self._policies
            if not self._fresh(entry):
                entry = _Entry(self._clock() + self._ttl, self._read(self._read_policies))
                self._policies = entry
        assert entry is not None
        if isinstance(entry.value, _Unreadable):
            raise entry.value
        return entry.value  # type: ignore[no-any-return]

    def _labels_now(self, namespace: str) -> Mapping[str, str]:
        with self._namespaces_lock:
            entry = self._namespaces.get(namespace)
            if not self._fresh(entry):
                entry = _Entry(
                    self._clock() + self._ttl,
                    self._read(lambda: self._read_labels(namespace)),
                )
                self._keep(namespace, entry)
        assert entry is not None
        if isinstance(entry.value, _Unreadable):
            raise entry.value
        return entry.value  # type: ignore[no-any-return]

    def _keep(self, namespace: str, entry: _Entry) -> None:
        """Store under the bound: expired entries go first, then the oldest read."""
        self._namespaces.pop(namespace, None)
        if len(self._namespaces) >= self._max_namespaces:
            now = self._clock()
            for key in [k for k, e in self._namespaces.items() if e.expires <= now]:
                del self._namespaces[key]
        while len(self._namespaces) >= self._max_namespaces:
            del self._namespaces[next(iter(self._namespaces))]
        self._namespaces[namespace] = entry

    def _read(self, read: Callable[[], Any]) -> Any:
        try:
            return read()
        except Exception as exc:
            self._warn(f"{type(exc).__name__}: {exc}")
            return _Unreadable(str(exc))

    def _read_policies(self) -> tuple[Policy, ...]:
        listed = self._list_policies(MAX_POLICIES + 1)
        items = listed.get("items") or []
        more = (listed.get("metadata") or {}).get("continue")
        if len(items) > MAX_POLICIES or more:
            raise ValueError(
                f"more than {MAX_POLICIES} TPUSlicePolicies; admission leaves them to the pass"
            )
        return tuple(p for p in (policy_record(item) for item in items) if p is not None)

    def _read_labels(self, namespace: str) -> Mapping[str, str]:
        found = self._get_namespace(namespace)
        if found is None:
            raise LookupError(f"namespace {namespace!r} does not exist")
        labels = (found.get("metadata") or {}).get("labels") or {}
        return {str(k): str(v) for k, v in labels.items()}

    def _warn(self, reason: str) -> None:
        now = self._clock()
        if now < self._next_warning:
            return
        self._next_warning = now + _WARN_EVERY_SECONDS
        log.warning(
            "policy webhook: could not read TPUSlicePolicies or a namespace (%s); objects "
            "are admitted and the operator's pass checks them",
            reason,
        )
