"""Loaded by the operator's interpreter only in ``make bench ... --memtrace`` runs (this
folder first on its PYTHONPATH, with PYTHONTRACEMALLOC set): SIGUSR2 dumps a tracemalloc
snapshot into $TPUSLICE_BENCH_MEMTRACE_DIR as snap-<n>.pickle (n counts from 0), so the
benchmark can take the heap apart by the code that allocated what is still held.
Imports nothing of the operator (Python's site module imports this file by name)."""

import os
import signal
import tracemalloc

_DIR = os.environ.get("TPUSLICE_BENCH_MEMTRACE_DIR", "")
_taken = [0]


def _dump(_signum: int, _frame: object) -> None:
    os.makedirs(_DIR, exist_ok=True)
    path = os.path.join(_DIR, f"snap-{_taken[0]}.pickle")
    tracemalloc.take_snapshot().dump(path + ".part")
    os.replace(path + ".part", path)  # the benchmark waits for the whole file
    _taken[0] += 1


if _DIR and tracemalloc.is_tracing():
    signal.signal(signal.SIGUSR2, _dump)
