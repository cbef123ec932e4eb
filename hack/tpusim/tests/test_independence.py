"""The harness (tpusim, the benchmark) is independent of the operator it tests: a fake GKE
that took its labels from the operator's tables would mirror a wrong label there, and
certificates made by the operator's own code would hide a bug in it; every e2e scenario
would still pass. Nor does it break when the operator moves a module."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _imports(folder: Path) -> dict[str, set[str]]:
    """Top-level package of every import, by file (relative imports left out)."""
    out: dict[str, set[str]] = {}
    for source in sorted(folder.rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
        out[str(source.relative_to(ROOT))] = names
    return out


def test_tpusim_never_imports_the_operator() -> None:
    found = _imports(ROOT / "hack" / "tpusim")
    assert "hack/tpusim/tpusim/certs.py" in found
    assert not [f for f, names in found.items() if "tpuslice" in names]


def test_the_benchmark_never_imports_the_operator() -> None:
    """It starts the operator and renders with the `tpuslice` command, and names the
    operator's API from bench.operator_api."""
    found = _imports(ROOT / "hack" / "bench")
    assert "hack/bench/bench/runs.py" in found
    assert not [f for f, names in found.items() if "tpuslice" in names]
