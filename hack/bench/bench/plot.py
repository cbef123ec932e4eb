"""The figures against scale (small, medium, large) drawn from the results present
(tpusim.benchstats.write_plot); `make bench-plot` draws docs/bench-scaling.svg."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from tpusim import benchstats


def plot(results_dir: Path, path: Path) -> int:
    """`make bench-plot` (--plot PATH): draw every scale's results into ``path``."""
    results = benchstats.load_results(results_dir)
    if not results:
        print(f"no results-<scale>.json in {results_dir}: run make bench first", file=sys.stderr)
        return 1
    benchstats.write_plot(results, path)
    scales = ", ".join(f"{r.get('scale')} ({r['clusters']})" for r in results)
    print(f"{path}: {scales}")
    return 0


def redraw(results_dir: Path) -> None:
    """After a run: redraw results_dir/bench-scaling.svg from every scale's results there.
    Without matplotlib (or with results it cannot draw) the printed table is enough."""
    path = results_dir / "bench-scaling.svg"
    with contextlib.suppress(Exception):
        benchstats.write_plot(benchstats.load_results(results_dir), path)
        print(f"plot of every scale's results: {path}")
