"""An in-memory copy of one kind's objects as small records, grouped for lookups. Pure.

Pods, nodes and RayClusters are the kinds with thousands of objects. They are
followed through our own list+watch (``kube.Kube.follow``) into these stores
instead of kopf indexes: kopf keeps a worker, a queue and per-object state for
every watched object, and its start-up waits for every indexed object with a
cost that grows with the square of their number (measured: minutes at 4,000
nodes). A store keeps one record per object and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["Change", "ObjectKey", "RecordStore"]

R = TypeVar("R")
ObjectKey = tuple[str, str]  # (namespace or "", name)


@dataclass(frozen=True)
class Change(Generic[R]):
    """One object's record before and after (None: absent); both None never happens."""

    key: ObjectKey
    old: R | None
    new: R | None

    @property
    def deleted(self) -> bool:
        return self.new is None

    @property
    def record(self) -> R:
        """The current record, or the last one of a deleted object."""
        record = self.new if self.new is not None else self.old
        assert record is not None
        return record


@dataclass
class RecordStore(Generic[R]):
    """Records by object key, and by the group key ``group_of`` gives each record."""

    group_of: Callable[[R], Hashable]
    _records: dict[ObjectKey, R] = field(default_factory=dict)
    _groups: dict[Hashable, dict[ObjectKey, R]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self._records)

    def get(self, key: ObjectKey) -> R | None:
        return self._records.get(key)

    def group(self, group: Hashable) -> list[R]:
        return list(self._groups.get(group, {}).values())

    def put(self, key: ObjectKey, record: R) -> Change[R]:
        old = self._records.get(key)
        if old is not None:
            self._ungroup(key, old)
        self._records[key] = record
        self._groups.setdefault(self.group_of(record), {})[key] = record
        return Change(key, old, record)

    def remove(self, key: ObjectKey) -> Change[R] | None:
        old = self._records.pop(key, None)
        if old is None:
            return None
        self._ungroup(key, old)
        return Change(key, old, None)

    def replace(self, records: Mapping[ObjectKey, R], namespace: str = "") -> list[Change[R]]:
        """Make the store equal to a fresh listing (of one ``namespace``, or of all when
        empty); the changes a watch would have shown.

        Objects gone from the listing come back as deletions, so a relist after a
        dropped watch (410 Gone) loses no DELETED event."""
        gone = [
            k for k in self._records if k not in records and (not namespace or k[0] == namespace)
        ]
        changes = [change for key in gone if (change := self.remove(key)) is not None]
        for key, record in records.items():
            if self._records.get(key) != record:
                changes.append(self.put(key, record))
        return changes

    def _ungroup(self, key: ObjectKey, record: R) -> None:
        group = self.group_of(record)
        members = self._groups.get(group)
        if members is not None:
            members.pop(key, None)
            if not members:
                del self._groups[group]
