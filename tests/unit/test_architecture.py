"""docs/architecture.md's table of in-memory stores is checked against the code.

Everything that must survive a crash lives in the API server; memory holds caches
and the record of our own unconfirmed writes. The table says, for each container a
long-lived object of the shell keeps, who owns it, its key, how fresh it is and
who prunes it. This test finds every such container in the shell packages (a
dataclass field or ``self.`` attribute made as a dict, set, list, deque or
defaultdict) and fails when one is missing from the table, or when the table
names one the code no longer has.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "tpuslice"
SHELL = ("controller", "runtime", "webhook", "main")
CONTAINERS = {"dict", "set", "list", "deque", "OrderedDict", "defaultdict"}
TABLE_HEADING = "## In-memory stores"


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _makes_container(node: ast.expr) -> bool:
    if isinstance(node, ast.Dict | ast.Set | ast.List | ast.DictComp | ast.SetComp):
        return True
    if isinstance(node, ast.ListComp):
        return True
    if not isinstance(node, ast.Call):
        return False
    if _name(node.func) in CONTAINERS:
        return True
    if _name(node.func) == "field":
        for keyword in node.keywords:
            if keyword.arg == "default_factory":
                factory = keyword.value
                if isinstance(factory, ast.Lambda):
                    return _makes_container(factory.body) or isinstance(factory.body, ast.Call)
                return _name(factory) in CONTAINERS
    return False


def stores_in_code() -> set[str]:
    found: set[str] = set()
    for package in SHELL:
        for source in sorted((PACKAGE / package).glob("*.py")):
            tree = ast.parse(source.read_text())
            for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
                if any(_name(b).endswith(("Error", "Exception")) for b in cls.bases):
                    continue  # an exception's fields are not a store
                where = f"{package}/{source.name} {cls.name}"
                for statement in cls.body:
                    if (
                        isinstance(statement, ast.AnnAssign)
                        and isinstance(statement.target, ast.Name)
                        and statement.value is not None
                        and _makes_container(statement.value)
                    ):
                        found.add(f"{where}.{statement.target.id}")
                for method in cls.body:
                    if not isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef):
                        continue
                    for node in ast.walk(method):
                        target: ast.expr | None = None
                        value: ast.expr | None = None
                        if isinstance(node, ast.Assign) and len(node.targets) == 1:
                            target, value = node.targets[0], node.value
                        elif isinstance(node, ast.AnnAssign):
                            target, value = node.target, node.value
                        if (
                            isinstance(target, ast.Attribute)
                            and isinstance(target.value, ast.Name)
                            and target.value.id == "self"
                            and value is not None
                            and _makes_container(value)
                        ):
                            found.add(f"{where}.{target.attr}")
    return found


def stores_in_table() -> dict[str, list[str]]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert TABLE_HEADING in text, f"docs/architecture.md has no '{TABLE_HEADING}' section"
    section = text.split(TABLE_HEADING, 1)[1].split("\n## ", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        match = re.fullmatch(r"`([\w/]+\.py) (\w+)\.(\w+)`", cells[0]) if cells else None
        if match:
            rows[f"{match[1]} {match[2]}.{match[3]}"] = cells[1:]
    return rows


def test_every_store_in_the_shell_is_in_the_table() -> None:
    missing = stores_in_code() - set(stores_in_table())
    assert not missing, f"add these to docs/architecture.md '{TABLE_HEADING}': {sorted(missing)}"


def test_every_store_in_the_table_exists() -> None:
    gone = set(stores_in_table()) - stores_in_code()
    assert not gone, f"docs/architecture.md '{TABLE_HEADING}' names stores the code lacks: {gone}"


def test_every_row_says_owner_key_freshness_and_pruning() -> None:
    for store, cells in stores_in_table().items():
        assert len(cells) == 4 and all(cells), f"{store}: owner, key, freshness, pruned by"


def test_the_finder_sees_each_way_a_store_is_made() -> None:
    source = (
        "from dataclasses import dataclass, field\n"
        "@dataclass\n"
        "class A:\n"
        "    a: dict[str, int] = field(default_factory=dict)\n"
        "    b: int = 0\n"
        "    c: list[int] = field(default_factory=lambda: [1])\n"
        "    def __post_init__(self) -> None:\n"
        "        self.d = set()\n"
        "        self.e: dict[str, int] = {}\n"
        "        self.f = 3\n"
    )
    tree = ast.parse(source)
    cls = tree.body[1]
    assert isinstance(cls, ast.ClassDef)
    made = {
        s.target.id
        for s in cls.body
        if isinstance(s, ast.AnnAssign)
        and isinstance(s.target, ast.Name)
        and s.value is not None
        and _makes_container(s.value)
    }
    assert made == {"a", "c"}
