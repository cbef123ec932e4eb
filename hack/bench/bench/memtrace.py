"""``--memtrace``: where the operator's memory per cluster is held.

The operator runs with tracemalloc on (PYTHONTRACEMALLOC, 25 frames) and
``hack/bench/memtrace_site/sitecustomize.py``, which dumps a snapshot on SIGUSR2. The
benchmark takes one before the first create and one at the end of the steady window;
the difference, divided by the clusters, is what each cluster leaves held, split by
the code that allocated it (Python's own tracemalloc, read with ``Snapshot.compare_to``).
Each block is charged to the innermost frame of the operator (``tpuslice/``), else of
kopf, else of the Kubernetes client or aiohttp, else its innermost frame: that names
the store that keeps it (a record built in informers.py, kopf's index, a decoded body).
tracemalloc's own overhead makes the run slower and its RSS larger: its timings and
RSS are not comparable with a run without it."""

from __future__ import annotations

import os
import signal
import time
import tracemalloc
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["MemTrace", "memtrace_env"]

SITE_DIR = Path(__file__).resolve().parent.parent / "memtrace_site"
FRAMES = 25
#: Frames are charged to the first of these (innermost first) found in a traceback.
OWNERS = ("/tpuslice/", "/kopf/", "/kubernetes/", "/aiohttp/")


def memtrace_env(folder: Path) -> dict[str, str]:
    """The operator's environment for a traced run, snapshots into ``folder``."""
    path = os.environ.get("PYTHONPATH", "")
    return {
        "PYTHONPATH": f"{SITE_DIR}{os.pathsep}{path}" if path else str(SITE_DIR),
        "PYTHONTRACEMALLOC": str(FRAMES),
        "TPUSLICE_BENCH_MEMTRACE_DIR": str(folder),
    }


def owner_frame(frames: list[tracemalloc.Frame]) -> str:
    """``file:line`` of the frame a block is charged to (``frames`` innermost first)."""
    for marker in OWNERS:
        for frame in frames:
            if marker in frame.filename:
                short = frame.filename.split(marker, 1)[1]
                return f"{marker.strip('/')}/{short}:{frame.lineno}"
    return f"{frames[0].filename}:{frames[0].lineno}" if frames else "?"


@dataclass
class MemTrace:
    pid: int
    folder: Path
    taken: list[Path] = field(default_factory=list)

    def snap(self, timeout_s: float = 120.0) -> Path:
        """Ask the operator for a snapshot and wait until its file is whole."""
        path = self.folder / f"snap-{len(self.taken)}.pickle"
        os.kill(self.pid, signal.SIGUSR2)
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no tracemalloc snapshot at {path}")
            time.sleep(0.2)
        self.taken.append(path)
        return path

    def report(self, clusters: int, top: int = 25) -> dict[str, Any]:
        """The growth between the first and the last snapshot: in all, per cluster, and by
        owner frame; the text also into ``memtrace-operator.txt`` beside the snapshots."""
        before = tracemalloc.Snapshot.load(str(self.taken[0]))
        after = tracemalloc.Snapshot.load(str(self.taken[-1]))
        by_owner: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for stat in after.compare_to(before, "traceback"):
            # a Traceback lists the oldest frame first (Python >= 3.7): innermost first here
            frames = list(reversed(stat.traceback))
            entry = by_owner[owner_frame(frames)]
            entry[0] += stat.size_diff
            entry[1] += stat.count_diff
        grown = sum(size for size, _ in by_owner.values())
        ranked = sorted(by_owner.items(), key=lambda kv: -kv[1][0])[:top]
        per = max(clusters, 1)
        lines = [
            f"heap growth {grown / 2**20:.1f} MiB over {clusters} clusters: "
            f"{grown / per / 1024:.1f} KiB per cluster (tracemalloc, Python allocations)",
            f"{'KiB/cluster':>12} {'blocks/cluster':>15}  owner frame",
        ]
        lines += [
            f"{size / per / 1024:12.1f} {count / per:15.1f}  {owner}"
            for owner, (size, count) in ranked
        ]
        (self.folder / "memtrace-operator.txt").write_text("\n".join(lines) + "\n")
        return {
            "growth_bytes": grown,
            "per_cluster_kib": round(grown / per / 1024, 1),
            "by_owner_kib_per_cluster": {o: round(s / per / 1024, 2) for o, (s, _) in ranked},
        }
