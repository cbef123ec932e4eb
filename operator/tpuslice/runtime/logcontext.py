"""Which object a log line is about: every line logged during a pass carries
``kind/namespace/name``, so a person can follow one object's passes after the fact.

The pass sets ``current_object`` for its asyncio task (each pass runs in a task of its
own, so concurrent passes never see each other's); ``ObjectPrefix`` on the process's log
handlers puts it in front of the message.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar

__all__ = ["ObjectPrefix", "current_object"]

#: ``kind/namespace/name`` of the object the running pass is for; "" outside a pass.
current_object: ContextVar[str] = ContextVar("tpuslice_current_object", default="")

_MARK = "tpuslice_object"


class ObjectPrefix(logging.Filter):
    """Prefix a record logged inside a pass with ``[kind/namespace/name]`` (once, however
    many handlers pass it on)."""

    def filter(self, record: logging.LogRecord) -> bool:
        obj = current_object.get()
        if obj and not getattr(record, _MARK, False):
            record.msg = f"[{obj}] {record.msg}"
            setattr(record, _MARK, True)
        return True
