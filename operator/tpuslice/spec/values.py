"""How a refused value is shown in an error message: short, and never the whole value
(a field may hold hundreds of KiB)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["described"]


def described(value: Any) -> str:
    """``'abc'``, ``'abcdefgh...'`` (at most 40 characters), ``an object``, ``a list``,
    or the value's repr."""
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:37] + "...")
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return repr(value)
