"""Whether a YAML string (spec.job.runtimeEnvYAML, spec.serve.serveConfigV2) is a map,
judged once per distinct string.

KubeRay parses these strings as YAML maps; the operator checks them first so a
mistake names the user's field instead of ending in a KubeRay event. The check runs
inside every pass (on the event loop), and PyYAML's pure-Python loader takes seconds
for a large document (1 MiB: about 4 s), so two things keep a pass from re-parsing:

- libyaml's loader (``yaml.CSafeLoader``, tens of times faster) is used when PyYAML
  was built with it, which the wheels on PyPI are; the pure-Python ``SafeLoader``
  (same results, slower) only where it is missing;
- the outcome is remembered by a digest of the string, not by (uid, generation): the
  answer depends on the text alone, so a pass over an unchanged object, another
  generation that kept the string, and several objects sharing one config all
  parse it once. The memory is bounded (``CACHE_ENTRIES`` digests and short
  answers, never the strings), and the strings themselves are bounded by the CRD
  and the parse step (``bounds.MAX_YAML_STRING``) before they get here.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final

import yaml

from tpuslice.spec.values import described

__all__ = ["CACHE_ENTRIES", "LOADER", "yaml_map_problem"]

#: libyaml's safe loader when PyYAML has it, else the pure-Python one.
LOADER: Final[type[Any]] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
#: Distinct strings whose outcome is remembered (each a 16-byte digest and a short
#: message); more than the YAML fields of the objects one operator serves at a time.
CACHE_ENTRIES: Final = 1024

_outcomes: OrderedDict[bytes, str | None] = OrderedDict()


def _parse(value: str) -> str | None:
    try:
        loaded = yaml.load(value, Loader=LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        return f"is not valid YAML{where}; write a YAML map"
    if loaded is not None and not isinstance(loaded, Mapping):
        return f"must be a YAML map, got {described(loaded)}"
    return None


def yaml_map_problem(value: str) -> str | None:
    """None when ``value`` is a YAML map (or empty), else what is wrong, worded to follow
    the field's path ("is not valid YAML (line 3); write a YAML map")."""
    digest = hashlib.blake2b(value.encode("utf-8"), digest_size=16).digest()
    if digest in _outcomes:
        _outcomes.move_to_end(digest)
        return _outcomes[digest]
    outcome = _parse(value)
    _outcomes[digest] = outcome
    if len(_outcomes) > CACHE_ENTRIES:
        _outcomes.popitem(last=False)
    return outcome


def cache_clear() -> None:
    """Forget every remembered outcome (for tests that count parses)."""
    _outcomes.clear()
