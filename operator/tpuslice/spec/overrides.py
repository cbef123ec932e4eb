"""Merge a user's pod-template override onto the template the operator renders.

Rules (the README repeats them for users):

- Maps merge key by key, recursively; the user's value wins for keys the
  operator does not own.
- Lists of named items (``containers``, ``initContainers``, ``volumes``,
  ``env``, ``volumeMounts``, ``ports``,
  ``schedulingGates``, ``imagePullSecrets``) merge by ``name``: an item with a
  name the operator uses merges into it, other items are appended in order.
- ``tolerations`` are appended (an exact duplicate is kept once).
- Every other list is replaced whole by the user's list.
- A path the operator owns (TPU selectors, TPU chips, our labels, our gate)
  may be repeated with the same value; a different value is an error naming
  the field, never silently dropped or silently winning.

Before anything is merged the override is judged, every problem naming the
user's field: where the operator renders a map or a list the override must
give one too (a null or a string there would drop the TPU selectors or the
Ray container), items of a named list must be objects with a string ``name``
and unique names; with KubeRay's template schema (``schema.py``) every field
is type-checked and unknown fields are refused, and the merged template is
checked again for required fields.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from tpuslice.spec.parts import FieldError
from tpuslice.spec.schema import SchemaError, describe, schema_errors

__all__ = ["OwnedValue", "merge_template"]

_NAMED_LISTS = frozenset(
    {
        "containers",
        "initContainers",
        "volumes",
        "env",
        "volumeMounts",
        "ports",
        "schedulingGates",
        "imagePullSecrets",
    }
)
#: Named lists whose items cannot go without a name (ports and imagePullSecrets can).
_NAME_REQUIRED = _NAMED_LISTS - {"ports", "imagePullSecrets"}
_APPENDED_LISTS = frozenset({"tolerations"})

# A path through a template: map keys, or ("name", value) to pick a named list item.
PathStep = str | tuple[str, str]
OwnedValue = tuple[tuple[PathStep, ...], Any, str]  # (path, value, why the operator owns it)


def _merge_named(base: list[Any], override: list[Any]) -> list[Any]:
    merged = [copy.deepcopy(item) for item in base]
    index = {item.get("name"): i for i, item in enumerate(merged) if isinstance(item, Mapping)}
    for item in override:
        name = item.get("name") if isinstance(item, Mapping) else None
        if name is not None and name in index:
            merged[index[name]] = _merge(merged[index[name]], item)
        else:
            merged.append(copy.deepcopy(item))
    return merged


def _merge(base: Any, override: Any, key: str | None = None) -> Any:
    if isinstance(base, Mapping) and isinstance(override, Mapping):
        merged = {k: copy.deepcopy(v) for k, v in base.items()}
        for k, v in override.items():
            merged[k] = _merge(merged[k], v, k) if k in merged else copy.deepcopy(v)
        return merged
    if isinstance(base, list) and isinstance(override, list):
        if key in _NAMED_LISTS:
            return _merge_named(base, override)
        if key in _APPENDED_LISTS:
            return copy.deepcopy(base) + [copy.deepcopy(t) for t in override if t not in base]
    return copy.deepcopy(override)


def _join(path: str, step: PathStep | int) -> str:
    if isinstance(step, int):
        return f"{path}[{step}]"
    if isinstance(step, tuple):
        return f"{path}[{step[0]}={step[1]}]"
    if "/" in step or "." in step:
        return f'{path}["{step}"]'
    return f"{path}.{step}"


def _named_items(key: str, items: list[Any], path: str, errors: list[FieldError]) -> None:
    """Items of a list merged by name: objects, a string ``name`` (where one is needed),
    no name twice."""
    seen: set[str] = set()
    for index, item in enumerate(items):
        where = _join(path, index)
        if not isinstance(item, Mapping):
            errors.append(FieldError(where, f"must be an object, got {describe(item)}"))
            continue
        if "name" not in item:
            if key in _NAME_REQUIRED:
                errors.append(
                    FieldError(f"{where}.name", f"is required (items of {key} merge by name)")
                )
            continue
        name = item["name"]
        if not isinstance(name, str):
            errors.append(FieldError(f"{where}.name", f"must be a string, got {describe(name)}"))
        elif name in seen:
            errors.append(FieldError(f"{where}.name", f"{name!r} is given twice; names are unique"))
        else:
            seen.add(name)


def _shape_errors(base: Any, override: Any, path: str, errors: list[FieldError]) -> None:
    """Problems of ``override`` that the merge itself would trip over or hide."""
    if isinstance(override, Mapping):
        for key, value in override.items():
            if not isinstance(key, str):
                errors.append(FieldError(path, f"has a key {key!r} that is not a string"))
                continue
            sub = base.get(key) if isinstance(base, Mapping) else None
            where = _join(path, key)
            if isinstance(sub, Mapping) and not isinstance(value, Mapping):
                errors.append(
                    FieldError(
                        where,
                        f"must be an object (the operator renders one), got {describe(value)}",
                    )
                )
            elif isinstance(sub, list) and not isinstance(value, list):
                errors.append(
                    FieldError(
                        where, f"must be a list (the operator renders one), got {describe(value)}"
                    )
                )
            elif isinstance(value, list) and key in _NAMED_LISTS:
                _named_items(key, value, where, errors)
                named = {
                    i.get("name"): i
                    for i in (sub if isinstance(sub, list) else [])
                    if isinstance(i, Mapping) and isinstance(i.get("name"), str)
                }
                for index, item in enumerate(value):
                    if isinstance(item, Mapping) and isinstance(item.get("name"), str):
                        _shape_errors(named.get(item["name"]), item, _join(where, index), errors)
            elif isinstance(value, list):
                for index, item in enumerate(value):
                    _shape_errors(None, item, _join(where, index), errors)
            else:
                _shape_errors(sub, value, where, errors)
    elif isinstance(override, list):
        for index, item in enumerate(override):
            _shape_errors(None, item, _join(path, index), errors)


def _schema_field_errors(errors: list[SchemaError], prefix: str) -> list[FieldError]:
    out = []
    for path, message in errors:
        text = prefix
        for step in path:
            text = _join(text, step)
        out.append(FieldError(text, message))
    return out


def _lookup(tree: Any, path: Sequence[PathStep]) -> tuple[bool, Any]:
    node = tree
    for step in path:
        if isinstance(step, tuple):
            field, wanted = step
            items = node if isinstance(node, list) else []
            found = [i for i in items if isinstance(i, Mapping) and i.get(field) == wanted]
            if not found:
                return False, None
            node = found[0]
        elif isinstance(node, Mapping) and step in node:
            node = node[step]
        else:
            return False, None
    return True, node


def _render_path(prefix: str, path: Sequence[PathStep]) -> str:
    text = prefix
    for step in path:
        text = _join(text, step)
    return text


def merge_template(
    base: Mapping[str, Any],
    override: Mapping[str, Any],
    owned: Sequence[OwnedValue],
    path_prefix: str,
    schema: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], list[FieldError]]:
    """Return (merged template, problems); the caller refuses to render on problems.

    ``schema`` is KubeRay's pod-template schema (``schema.template_schema``); without it
    only the checks that need no schema are made."""
    problems: list[FieldError] = []
    _shape_errors(base, override, path_prefix, problems)
    if problems:
        return copy.deepcopy(dict(base)), problems
    if schema is not None:
        problems += _schema_field_errors(
            schema_errors(schema, dict(override), partial=True), path_prefix
        )
    conflicts = problems
    for path, value, why in owned:
        present, user_value = _lookup(override, path)
        if present and user_value != value:
            owner = f"{why}" if value is None else f"{why}: {value!r}"
            conflicts.append(
                FieldError(
                    _render_path(path_prefix, path),
                    f"is owned by the operator ({owner}); remove it from the override",
                )
            )
    merged = _merge(dict(base), dict(override))
    if schema is not None and not conflicts:
        conflicts += _schema_field_errors(schema_errors(schema, merged, partial=False), path_prefix)
    return merged, conflicts
