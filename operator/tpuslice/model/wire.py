"""The API server's list pages and watch events, decoded without what no record reads.

Every object the API server sends carries ``metadata.managedFields``: server-side
apply's record of which manager set which field, about as many small JSON objects as
the object's spec and status together. Our watches convert each object to a record
that keeps none of it (``model.convert``), except a RayCluster's, whose record asks
whether our own manager set ``spec.suspend``. Decoding the whole object and then
dropping that part spends most of the decoding on it: a page of pods allocates every
one of those small dicts before the converter reads a dozen fields. At start-up the
operator lists every followed object before its first pass, so this is the start-up's
largest cost after the API server's own.

msgspec decodes an object's top-level fields and its metadata's fields as raw spans
first (``msgspec.Raw``: a scan, no allocation), so ``managedFields`` is stepped over,
never built. What comes out is what ``json.loads`` gives for the same bytes, with
``metadata.managedFields`` left out unless asked for (a unit test checks both over
arbitrary JSON objects); an ``ERROR`` event's object (a Status) is decoded whole.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec

_ANY: msgspec.json.Decoder[Any] = msgspec.json.Decoder()
_FIELDS: msgspec.json.Decoder[dict[str, msgspec.Raw] | None] = msgspec.json.Decoder(
    dict[str, msgspec.Raw] | None
)

#: The part of ObjectMeta that no record keeps (``Followed.managed_fields`` keeps it).
MANAGED_FIELDS = "managedFields"


class _Page(msgspec.Struct):
    items: list[dict[str, msgspec.Raw]] | None = None
    metadata: dict[str, Any] | None = None


class _Event(msgspec.Struct):
    type: str = ""
    object: msgspec.Raw = msgspec.Raw(b"null")


_PAGE = msgspec.json.Decoder(_Page)
_EVENT = msgspec.json.Decoder(_Event)

#: What a malformed answer raises (a ValueError, as json.loads's JSONDecodeError is).
DecodeError = msgspec.DecodeError


class Page(NamedTuple):
    """One answer to a list request: its objects, and its ``metadata`` (the list's
    ``resourceVersion`` and ``continue`` token)."""

    items: list[dict[str, Any]]
    metadata: dict[str, Any]


def decode_object(fields: dict[str, msgspec.Raw], managed_fields: bool) -> dict[str, Any]:
    """One object from its top-level fields, undecoded."""
    out: dict[str, Any] = {}
    for key, raw in fields.items():
        if key == "metadata" and not managed_fields:
            meta = _FIELDS.decode(raw)
            out[key] = (
                None
                if meta is None
                else {k: _ANY.decode(v) for k, v in meta.items() if k != MANAGED_FIELDS}
            )
        else:
            out[key] = _ANY.decode(raw)
    return out


def decode_page(data: bytes, *, managed_fields: bool = False) -> Page:
    """A list answer (``{"items": [...], "metadata": {...}}``); empty bytes are an empty
    page."""
    if not data:
        return Page([], {})
    page = _PAGE.decode(data)
    items = [decode_object(fields, managed_fields) for fields in page.items or ()]
    return Page(items, page.metadata or {})


def decode_event(line: bytes, *, managed_fields: bool = False) -> tuple[str, dict[str, Any]]:
    """One watch event: its type and its object (a Status, whole, for ``ERROR``)."""
    event = _EVENT.decode(line)
    if event.type == "ERROR":
        status = _ANY.decode(event.object)
        return event.type, status if isinstance(status, dict) else {}
    fields = _FIELDS.decode(event.object)
    return event.type, {} if fields is None else decode_object(fields, managed_fields)
