"""The harness is independent of the operator it tests: a fake GKE that took its labels
from the operator's tables would mirror a wrong label there, and every e2e scenario
would still pass."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_dev_cluster_never_imports_operator_tables() -> None:
    """The fake GKE takes its labels from its own table; only the PKI helper is shared."""
    sim = ROOT / "hack" / "tpusim" / "tpusim"
    imported: set[str] = set()
    for source in sim.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
    assert {m for m in imported if m.split(".")[0] == "tpuslice"} <= {"tpuslice"}
    pki_only = [
        alias.name
        for source in sim.glob("*.py")
        for node in ast.walk(ast.parse(source.read_text()))
        if isinstance(node, ast.ImportFrom) and node.module == "tpuslice"
        for alias in node.names
    ]
    assert set(pki_only) <= {"pki"}, pki_only
