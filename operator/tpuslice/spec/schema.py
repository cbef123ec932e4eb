"""Judge a value against a structural schema (the OpenAPI subset CRDs use), naming the field.

The pod-template overrides of a TPUSliceCluster are free-form in our CRD (it
cannot carry the whole pod schema), so unchecked, a wrong type there would reach
the API server inside the rendered RayCluster, where server-side apply answers
500 and nothing names the user's field. The operator therefore reads the
template schema from the KubeRay RayCluster CRD installed in the cluster
(``template_schema``) and judges each template before applying it, the way
the API server would, but stricter where the API server is silent: unknown
fields and nulls (which it drops without a word) are errors too, and integers
must fit their int32/int64 format (KubeRay could not read them back).

Pure: plain dicts in, ``(path, message)`` pairs out. A path is a tuple of map
keys, list indexes, and ``("name", value)`` steps for list items that carry a
``name`` (``containers[name=ray-worker]``).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

__all__ = ["Path", "SchemaError", "compact", "describe", "schema_errors", "template_schema"]

PathStep = str | int | tuple[str, str]
Path = tuple[PathStep, ...]
SchemaError = tuple[Path, str]

#: Errors reported for one value; the rest are not looked for (the message stays short).
MAX_ERRORS = 10

#: The schema keywords this module reads; ``compact`` drops every other one
#: (descriptions are most of the bytes of KubeRay's CRD).
_KEPT = frozenset(
    {
        "type",
        "properties",
        "additionalProperties",
        "items",
        "required",
        "enum",
        "anyOf",
        "pattern",
        "format",
        "maxLength",
        "minLength",
        "maximum",
        "minimum",
        "maxItems",
        "minItems",
        "maxProperties",
        "nullable",
        "default",
        "x-kubernetes-int-or-string",
        "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-embedded-resource",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
    }
)
_INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
_KINDS = {
    "object": "an object",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
}


def compact(schema: Any) -> Any:
    """``schema`` with only the keywords validation reads (a fraction of the memory)."""
    if isinstance(schema, Mapping):
        out: dict[str, Any] = {}
        for key, value in schema.items():
            if key not in _KEPT:
                continue
            if key == "properties":
                out[key] = {name: compact(sub) for name, sub in value.items()}
            elif key in ("items", "additionalProperties") and isinstance(value, Mapping):
                out[key] = compact(value)
            elif key == "anyOf":
                out[key] = [compact(v) for v in value]
            else:
                out[key] = value
        return out
    return schema


def template_schema(crd: Mapping[str, Any], version: str = "v1") -> dict[str, Any] | None:
    """The pod-template schema of KubeRay's RayCluster CRD (worker groups; the head's is
    the same type), compacted; None when this CRD has no such path."""
    try:
        versions = crd["spec"]["versions"]
        served = next(v for v in versions if v.get("name") == version)
        spec = served["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        template = spec["workerGroupSpecs"]["items"]["properties"]["template"]
    except (KeyError, TypeError, StopIteration):
        return None
    return compact(template) if isinstance(template, Mapping) else None


def describe(value: Any) -> str:
    """A value as a message shows it: its kind, and the value when short."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        text = value if len(value) <= 40 else value[:37] + "..."
        return f"the string {text!r}"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


def _type_ok(kind: str | None, value: Any) -> bool:
    if kind is None:
        return True
    if kind == "object":
        return isinstance(value, Mapping)
    if kind == "array":
        return isinstance(value, list)
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return False


@cache
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _item_step(item: Any, index: int) -> PathStep:
    if isinstance(item, Mapping) and isinstance(item.get("name"), str):
        return ("name", item["name"])
    return index


class _Walk:
    def __init__(self, partial: bool) -> None:
        self.partial = partial
        self.errors: list[SchemaError] = []

    def add(self, path: Path, message: str) -> None:
        if len(self.errors) < MAX_ERRORS:
            self.errors.append((path, message))

    def full(self) -> bool:
        return len(self.errors) >= MAX_ERRORS

    def value(self, schema: Mapping[str, Any], value: Any, path: Path) -> None:
        if self.full():
            return
        if value is None:
            if not schema.get("nullable"):
                self.add(path, "must not be null; remove the key to leave it unset")
            return
        if schema.get("x-kubernetes-int-or-string"):
            if not (_type_ok("integer", value) or _type_ok("string", value)):
                self.add(path, f"must be a number or a string, got {describe(value)}")
                return
        elif not _type_ok(schema.get("type"), value):
            kind = _KINDS.get(str(schema.get("type")), str(schema.get("type")))
            self.add(path, f"must be {kind}, got {describe(value)}")
            return
        self.scalar(schema, value, path)
        if isinstance(value, Mapping):
            self.mapping(schema, value, path)
        elif isinstance(value, list):
            self.sequence(schema, value, path)

    def scalar(self, schema: Mapping[str, Any], value: Any, path: Path) -> None:
        enum = schema.get("enum")
        if enum is not None and value not in enum:
            self.add(path, f"must be one of {', '.join(map(str, enum))}, got {describe(value)}")
        if isinstance(value, str):
            pattern = schema.get("pattern")
            if pattern and not _regex(pattern).search(value):
                if schema.get("x-kubernetes-int-or-string"):
                    self.add(path, f"{value!r} is not a quantity (e.g. 8, 500m, 32Gi)")
                else:
                    self.add(path, f"{value!r} does not match {pattern}")
            if "maxLength" in schema and len(value) > schema["maxLength"]:
                self.add(path, f"is longer than {schema['maxLength']} characters")
            if "minLength" in schema and len(value) < schema["minLength"]:
                self.add(path, f"must have at least {schema['minLength']} characters")
        if _type_ok("number", value):
            low, high = _INT_RANGES.get(str(schema.get("format")), (None, None))
            fits = low is None or high is None or low <= value <= high
            if isinstance(value, int) and not fits:
                self.add(path, f"{value} does not fit in {schema['format']}")
            if "maximum" in schema and value > schema["maximum"]:
                self.add(path, f"must be at most {schema['maximum']}, got {value}")
            if "minimum" in schema and value < schema["minimum"]:
                self.add(path, f"must be at least {schema['minimum']}, got {value}")

    def mapping(self, schema: Mapping[str, Any], value: Mapping[str, Any], path: Path) -> None:
        properties: Mapping[str, Any] = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        open_ = schema.get("x-kubernetes-preserve-unknown-fields") or extra is True
        if not self.partial:
            for name in schema.get("required") or ():
                if name not in value:
                    self.add(path, f"needs {name}")
        for key, sub in value.items():
            if not isinstance(key, str):
                self.add(path, f"has a key {key!r} that is not a string")
                continue
            if key in properties:
                self.value(properties[key], sub, (*path, key))
            elif isinstance(extra, Mapping):
                self.value(extra, sub, (*path, key))
            elif not open_:
                close = difflib.get_close_matches(key, list(properties), n=1)
                hint = f"; did you mean {close[0]}?" if close else ""
                self.add((*path, key), f"is not a field here{hint}")

    def sequence(self, schema: Mapping[str, Any], value: list[Any], path: Path) -> None:
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            self.add(path, f"has more than {schema['maxItems']} items")
        items = schema.get("items")
        if isinstance(items, Mapping):
            for index, item in enumerate(value):
                self.value(items, item, (*path, index if self.partial else _item_step(item, index)))
        self.unique(schema, value, path)

    def unique(self, schema: Mapping[str, Any], value: list[Any], path: Path) -> None:
        list_type = schema.get("x-kubernetes-list-type")
        if list_type == "set":
            seen: list[Any] = []
            for item in value:
                if item in seen:
                    self.add(path, f"has {describe(item)} twice; items must be unique")
                    return
                seen.append(item)
        elif list_type == "map":
            keys: Sequence[str] = schema.get("x-kubernetes-list-map-keys") or ()
            props = (schema.get("items") or {}).get("properties") or {}
            found: set[str] = set()
            for item in value:
                if not isinstance(item, Mapping):
                    continue
                ident = tuple(item.get(k, (props.get(k) or {}).get("default")) for k in keys)
                text = ", ".join(f"{k}={v}" for k, v in zip(keys, ident, strict=True))
                if repr(ident) in found:
                    self.add(path, f"has two items with {text}; each must be unique")
                    return
                found.add(repr(ident))


def schema_errors(schema: Mapping[str, Any], value: Any, *, partial: bool) -> list[SchemaError]:
    """Where ``value`` breaks ``schema`` (at most MAX_ERRORS). ``partial`` judges an
    override that will be merged onto a base: required fields are not asked for and list
    items are named by their index, as the user wrote them."""
    walk = _Walk(partial)
    walk.value(schema, value, ())
    return walk.errors
