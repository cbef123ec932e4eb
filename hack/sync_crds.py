#!/usr/bin/env python3
"""Copy each CRD from crds/ (the one source) to the Helm chart and to manifests/.

`make sync-crds` writes the copies; `--check` (used by `make verify` and by a
unit test) exits 1 and names every copy that drifted, so a CRD edited only in
one place never ships.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "crds"
TARGETS = (ROOT / "charts" / "tpuslice-operator" / "crds", ROOT / "manifests" / "crds")
HEADER = "# GENERATED from crds/{name} by `make sync-crds`; edit the source, not this copy.\n"


def expected_copies() -> dict[Path, str]:
    copies: dict[Path, str] = {}
    for crd in sorted(SOURCE.glob("*.yaml")):
        body = "".join(
            line for line in crd.read_text().splitlines(keepends=True) if not line.startswith("#")
        )
        for target in TARGETS:
            copies[target / crd.name] = HEADER.format(name=crd.name) + body
    return copies


def drifted() -> list[str]:
    copies = expected_copies()
    problems = [
        f"{path.relative_to(ROOT)} differs from crds/{path.name}"
        for path, text in copies.items()
        if not path.exists() or path.read_text() != text
    ]
    for target in TARGETS:
        for stray in sorted(target.glob("*.yaml")):
            if stray not in copies:
                problems.append(f"{stray.relative_to(ROOT)} has no source in crds/")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail on drift, write nothing")
    args = parser.parse_args()
    if args.check:
        problems = drifted()
        for problem in problems:
            print(f"drift: {problem}; run `make sync-crds`", file=sys.stderr)
        return 1 if problems else 0
    copies = expected_copies()
    for target in TARGETS:
        target.mkdir(parents=True, exist_ok=True)
        for stray in target.glob("*.yaml"):
            if stray not in copies:
                stray.unlink()
    for path, text in copies.items():
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
