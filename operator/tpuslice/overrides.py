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
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from tpuslice.spec import FieldError

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
        if isinstance(step, tuple):
            text += f"[{step[0]}={step[1]}]"
        elif "/" in step or "." in step:
            text += f'["{step}"]'
        else:
            text += f".{step}"
    return text


def merge_template(
    base: Mapping[str, Any],
    override: Mapping[str, Any],
    owned: Sequence[OwnedValue],
    path_prefix: str,
) -> tuple[dict[str, Any], list[FieldError]]:
    """Return (merged template, conflicts); the caller refuses to render on conflicts."""
    conflicts: list[FieldError] = []
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
    return merged, conflicts
