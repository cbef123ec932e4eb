"""Read hack/versions.env, the one place the local cluster's versions are pinned."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pinned_versions() -> dict[str, str]:
    versions: dict[str, str] = {}
    for line in (ROOT / "hack" / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            versions[key.strip()] = value.strip()
    return versions
