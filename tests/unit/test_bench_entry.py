"""`make bench` starts: its imports resolve (regression: after the dev cluster moved to
hack/tpusim, `python hack/bench.py` imported the folder hack/tpusim as an empty namespace
package instead of the installed tpusim, and the benchmark failed before it began)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_make_bench_runs_the_script_without_its_folder_on_the_path() -> None:
    recipe = re.search(r"^bench:.*\n\t(.+)$", (REPO / "Makefile").read_text(), re.M)
    assert recipe is not None and "-P hack/bench.py" in recipe.group(1)


def test_the_bench_script_imports_and_answers_help() -> None:
    done = subprocess.run(
        [sys.executable, "-P", "hack/bench.py", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "--scale" in done.stdout
