"""``--memtrace`` on a stand-in process: the sitecustomize dumps a snapshot per SIGUSR2,
and the report charges what grew between the first and last to the frame that allocated
it, per cluster."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

from bench.memtrace import MemTrace, memtrace_env, owner_frame

# a stand-in for the operator: grows a list of 20,000 KiB-sized strings after one line
# of stdin, in a function of a file named like the operator's records module
HOLDER = """
def grow(store):
    for i in range(20000):
        store.append("x" * 1024 + str(i))
"""
CHILD = """
import sys, importlib.util
spec = importlib.util.spec_from_file_location("records", sys.argv[1])
records = importlib.util.module_from_spec(spec); spec.loader.exec_module(records)
store = []
print("ready", flush=True)
sys.stdin.readline()
records.grow(store)
print("grown", flush=True)
sys.stdin.readline()
"""


def test_the_growth_between_two_snapshots_is_charged_to_the_operator_frame(
    tmp_path: Path,
) -> None:
    holder = tmp_path / "tpuslice" / "model" / "records.py"
    holder.parent.mkdir(parents=True)
    holder.write_text(HOLDER)
    folder = tmp_path / "memtrace"
    env = {**os.environ, **memtrace_env(folder)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(holder)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        assert child.stdout.readline().strip() == "ready"
        traced = MemTrace(child.pid, folder)
        traced.snap(timeout_s=30)
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "grown"
        traced.snap(timeout_s=30)
        figures = traced.report(clusters=10)
    finally:
        child.kill()
        child.wait()
    # 20,000 strings of ~1 KiB: ~20 MiB in all, ~2 MiB per "cluster", in grow()
    assert 18 * 2**20 < figures["growth_bytes"] < 30 * 2**20
    top, kib = next(iter(figures["by_owner_kib_per_cluster"].items()))
    assert top == "tpuslice/model/records.py:4"
    assert 1800 < kib < 3000
    assert "tpuslice/model/records.py:4" in (folder / "memtrace-operator.txt").read_text()


def test_a_block_is_charged_to_the_innermost_operator_frame_before_any_library() -> None:
    def frame(name: str, line: int) -> tracemalloc.Frame:
        return tracemalloc.Frame((name, line))

    innermost_first = [
        frame("/usr/lib/python3.11/json/decoder.py", 353),
        frame("/venv/site-packages/kopf/_core/reactor/queueing.py", 200),
        frame("/repo/operator/tpuslice/runtime/informers.py", 240),
        frame("/repo/operator/tpuslice/controller/handlers.py", 300),
    ]
    assert owner_frame(innermost_first) == "tpuslice/runtime/informers.py:240"
    assert owner_frame(innermost_first[:2]) == "kopf/_core/reactor/queueing.py:200"
    assert owner_frame(innermost_first[:1]) == "/usr/lib/python3.11/json/decoder.py:353"
