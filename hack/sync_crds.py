#!/usr/bin/env python3
"""Assemble each CRD from its one source in crds/src/ and the parts in crds/parts/,
then copy it to the Helm chart and to manifests/.

The three TPUSlice kinds (TPUSliceCluster, TPUSliceJob, TPUSliceService) share
their cluster parts (``spec.tpu``, ``elastic``, ``ray``, ``head``, ``worker``,
``reservation``) and their slice status; those are written once, in
crds/parts/, and each source names them with a line ``#@include <part>`` where
they belong. The part's lines replace the marker, indented to the marker's
column, so the assembled CRD reads as if written by hand (comments, flow style
and folded messages kept) and the kinds cannot drift apart. See crds/README.md.

Outputs, all committed:

- crds/<name>: the assembled CRD (what ``kubectl apply -f crds/`` and the tests read);
- charts/tpuslice-operator/crds/<name> and manifests/crds/<name>: copies of it.

`make sync-crds` writes them; ``--check`` (used by `make verify` and by a unit
test) exits 1 and names every output that drifted, so a CRD or part edited in
one place only never ships.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CRDS = ROOT / "crds"
SOURCES = CRDS / "src"
PARTS = CRDS / "parts"
TARGETS = (ROOT / "charts" / "tpuslice-operator" / "crds", ROOT / "manifests" / "crds")
ASSEMBLED_HEADER = (
    "# GENERATED from crds/src/{name} and crds/parts/ by `make sync-crds`; edit those,\n"
    "# not this file (see crds/README.md).\n"
)
COPY_HEADER = "# GENERATED from crds/{name} by `make sync-crds`; edit the source, not this copy.\n"
INCLUDE = re.compile(r"^(?P<indent> *)#@include (?P<part>[a-z0-9-]+) *$")


class PartError(Exception):
    """A source names a part that does not exist, or a part includes itself."""


def _part_lines(name: str, chain: tuple[str, ...] = ()) -> list[str]:
    """A part's lines without its leading comment block (the part's own documentation),
    its own ``#@include`` markers replaced in turn: a part may use another (the elastic
    range is spec.elastic's and every TPU group's), never itself, directly or not."""
    if name in chain:
        raise PartError(f"crds/parts/{name}.yaml includes itself ({' -> '.join((*chain, name))})")
    path = PARTS / f"{name}.yaml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in PARTS.glob("*.yaml")))
        raise PartError(f"no part {name!r} in crds/parts/ (there are: {known})")
    lines = path.read_text().splitlines(keepends=True)
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    return _expand(lines, (*chain, name))


def _expand(lines: list[str], chain: tuple[str, ...]) -> list[str]:
    """``lines`` with every ``#@include`` replaced by its part, re-indented."""
    out: list[str] = []
    for line in lines:
        match = INCLUDE.match(line)
        if match is None:
            out.append(line)
            continue
        indent = match["indent"]
        out += [
            indent + part if part.strip() else part for part in _part_lines(match["part"], chain)
        ]
    return out


def assemble(source: str) -> str:
    """The source's text with every ``#@include`` replaced by its part, re-indented."""
    return "".join(_expand(source.splitlines(keepends=True), ()))


def _body(text: str) -> str:
    """The YAML without its leading comment lines (each output writes its own header)."""
    lines = text.splitlines(keepends=True)
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    return "".join(lines)


def expected_outputs() -> dict[Path, str]:
    outputs: dict[Path, str] = {}
    for source in sorted(SOURCES.glob("*.yaml")):
        body = _body(assemble(source.read_text()))
        outputs[CRDS / source.name] = ASSEMBLED_HEADER.format(name=source.name) + body
        for target in TARGETS:
            outputs[target / source.name] = COPY_HEADER.format(name=source.name) + body
    return outputs


def _output_dirs() -> tuple[Path, ...]:
    return (CRDS, *TARGETS)


def drifted() -> list[str]:
    outputs = expected_outputs()
    problems = [
        f"{path.relative_to(ROOT)} differs from what crds/src/{path.name} and crds/parts/ give"
        for path, text in outputs.items()
        if not path.exists() or path.read_text() != text
    ]
    for directory in _output_dirs():
        for stray in sorted(directory.glob("*.yaml")):
            if stray not in outputs:
                problems.append(f"{stray.relative_to(ROOT)} has no source in crds/src/")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail on drift, write nothing")
    args = parser.parse_args()
    try:
        if args.check:
            problems = drifted()
            for problem in problems:
                print(f"drift: {problem}; run `make sync-crds`", file=sys.stderr)
            return 1 if problems else 0
        outputs = expected_outputs()
    except PartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for directory in _output_dirs():
        directory.mkdir(parents=True, exist_ok=True)
        for stray in directory.glob("*.yaml"):
            if stray not in outputs:
                stray.unlink()
    for path, text in outputs.items():
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
