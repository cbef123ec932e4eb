"""The process's malloc arenas, bounded before its threads start.

glibc gives a thread that allocates while the arenas are busy an arena of its own,
up to 8 per core (mallopt(3), ``M_ARENA_MAX``). The operator's request threads, its
informers and kopf's thread decode API responses and watch events in bursts, each
in whichever arena it holds, and an arena keeps the high-water mark of what was
decoded in it: the peak RSS grew with the burst, not with the state kept. With two
arenas the benchmark's medium scale (200 objects) peaked at 129 MiB instead of
154 MiB (docs/performance.md).

``MALLOC_ARENA_MAX`` in the environment wins: glibc read it at start-up.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

__all__ = ["DEFAULT_ARENAS", "limit_malloc_arenas"]

#: mallopt(3)'s parameter number of M_ARENA_MAX (glibc malloc.h).
_M_ARENA_MAX = -8
DEFAULT_ARENAS = 2


def limit_malloc_arenas(
    arenas: int = DEFAULT_ARENAS, environ: Mapping[str, str] | None = None
) -> bool:
    """Bound the process's malloc arenas to ``arenas``; True if glibc took it. False
    where the environment sets ``MALLOC_ARENA_MAX`` or the C library is not glibc."""
    env = os.environ if environ is None else environ
    if "MALLOC_ARENA_MAX" in env:
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, arenas))
