"""The malloc arena bound the operator and webhook processes set at start."""

from __future__ import annotations

import subprocess
import sys

from tpuslice.runtime.memory import limit_malloc_arenas


def test_the_environments_setting_wins() -> None:
    assert limit_malloc_arenas(environ={"MALLOC_ARENA_MAX": "4"}) is False


def test_glibc_takes_the_bound_in_a_fresh_process() -> None:
    """In a process of its own: the bound stays for the process's life."""
    code = (
        "from tpuslice.runtime.memory import limit_malloc_arenas;"
        "print(limit_malloc_arenas(environ={}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "True"  # the image and CI run on glibc (Debian)
