"""Judge objects against a CRD the way the API server does, without an API server.

Structural schema -> JSON Schema (unknown fields rejected, as kubectl's strict
field validation does), schema defaults applied first, then every
``x-kubernetes-validations`` rule evaluated with cel-python. The e2e tier checks
the same rules against the real API server; this catches a wrong rule in
seconds.
"""

from __future__ import annotations

import copy
import re
from functools import cache
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import yaml

ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = ROOT / "crds"


def load_crd(name: str) -> dict[str, Any]:
    return yaml.safe_load((CRD_DIR / name).read_text())


def served_schema(crd: dict[str, Any], version: str = "v1alpha1") -> dict[str, Any]:
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            return v["schema"]["openAPIV3Schema"]
    raise KeyError(version)


def to_jsonschema(schema: dict[str, Any], *, strict: bool = True) -> dict[str, Any]:
    """Translate a structural schema; ``strict`` rejects unknown fields like kubectl does."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key.startswith("x-kubernetes-") or key == "default":
            continue
        if key == "properties":
            out[key] = {k: to_jsonschema(v, strict=strict) for k, v in value.items()}
        elif key == "items" or (key == "additionalProperties" and isinstance(value, dict)):
            out[key] = to_jsonschema(value, strict=strict)
        elif key == "anyOf":
            out[key] = [to_jsonschema(v, strict=strict) for v in value]
        else:
            out[key] = value
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if schema.get("x-kubernetes-preserve-unknown-fields") or schema.get(
        "x-kubernetes-embedded-resource"
    ):
        return out
    if strict and out.get("type") == "object" and "properties" in out:
        out.setdefault("additionalProperties", False)
    return out


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting: fill absent properties that have a default, recursively."""
    if isinstance(value, dict):
        value = dict(value)
        for name, sub in (schema.get("properties") or {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = apply_defaults(sub, value[name])
    elif isinstance(value, list) and "items" in schema:
        value = [apply_defaults(schema["items"], v) for v in value]
    return value


_ENV = celpy.Environment()


#: Kubernetes CEL escapes property names that are CEL reserved words as ``__word__``
#: (apiextensions "Escaping"; ``self.namespace`` is refused by the API server).
_RESERVED_ESCAPE = re.compile(
    r"__(namespace|in|as|break|const|continue|else|for|function|if|import|let|loop"
    r"|package|return|var|void|while)__"
)


@cache
def _program(rule: str) -> Any:
    """The rule compiled for cel-python, which knows no escaping: ``__namespace__`` is
    read as the property ``namespace``."""
    return _ENV.program(_ENV.compile(_RESERVED_ESCAPE.sub(r"\1", rule)))


@cache
def _schema(crd_file: str) -> dict[str, Any]:
    return served_schema(load_crd(crd_file))


@cache
def _validator(crd_file: str) -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(to_jsonschema(_schema(crd_file)))


def _walk_rules(schema: dict[str, Any], value: Any, old: Any, path: str, out: list[str]) -> None:
    for rule in schema.get("x-kubernetes-validations") or []:
        uses_old = "oldSelf" in rule["rule"]
        if uses_old and old is None:
            continue  # transition rules run on update only
        activation = {"self": celpy.json_to_cel(value)}
        if uses_old:
            activation["oldSelf"] = celpy.json_to_cel(old)
        result = _program(rule["rule"]).evaluate(activation)
        if result is not True and not (isinstance(result, celpy.celtypes.BoolType) and result):
            out.append(" ".join(rule["message"].split()))
    if isinstance(value, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if name in value:
                old_sub = old.get(name) if isinstance(old, dict) else None
                _walk_rules(sub, value[name], old_sub, f"{path}.{name}", out)
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            _walk_rules(schema["items"], item, None, f"{path}[{i}]", out)


def validate(crd_file: str, obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """Every message the API server would give for ``obj`` (empty list: accepted)."""
    schema = _schema(crd_file)
    obj = apply_defaults(schema, obj)
    errors = [
        f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}"
        for e in _validator(crd_file).iter_errors(obj)
    ]
    if errors:
        return errors  # the API server reports schema errors before running CEL
    messages: list[str] = []
    old_defaulted = apply_defaults(schema, old) if old is not None else None
    _walk_rules(schema, obj, old_defaulted, "", messages)
    return messages


def rules_at(crd_file: str, *path: str) -> list[dict[str, Any]]:
    """The x-kubernetes-validations of the schema node at ``path`` (property names)."""
    node = _schema(crd_file)
    for name in path:
        node = node["properties"][name]
    return list(node.get("x-kubernetes-validations") or [])


def failing_rules(rules: list[dict[str, Any]], value: Any) -> list[str]:
    """Messages of the (non-transition) rules that reject ``value``; fast path for grids."""
    activation = {"self": celpy.json_to_cel(value)}
    return [
        rule["message"]
        for rule in rules
        if "oldSelf" not in rule["rule"] and not bool(_program(rule["rule"]).evaluate(activation))
    ]
