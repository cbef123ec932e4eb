"""requirements.lock against pyproject.toml, offline.

The image installs the lock's files (pip --require-hashes) while the wheel declares
pyproject's ranges, so the two must agree: a dependency added to pyproject.toml
without `make lock`, or a range moved past the locked release, fails here in
seconds. That the lock also holds every transitive dependency, and nothing the
wheel does not need, is proven by `make image-check`, which installs from it.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements.lock"
PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


def _lock_header_option(name: str) -> str:
    header = "".join(line for line in LOCK.read_text().splitlines(True) if line.startswith("#"))
    (value,) = re.findall(rf"{re.escape(name)} (\S+)", header)
    return str(value)


def _locked() -> dict[str, tuple[Version, list[str]]]:
    """Canonical name -> (pinned version, hash options) of each requirement in the lock."""
    pins: dict[str, tuple[Version, list[str]]] = {}
    joined = LOCK.read_text().replace("\\\n", " ")
    for line in joined.splitlines():
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        match = PIN.fullmatch(words[0])
        assert match, f"not a name==version pin: {line.strip()}"
        name = canonicalize_name(match[1])
        assert name not in pins, f"{name} pinned twice"
        pins[name] = (Version(match[2]), words[1:])
    return pins


def _target_environment() -> dict[str, str]:
    """Marker values of the image (the lock's target), not of this interpreter."""
    minor = _lock_header_option("--python-version")
    return {
        "python_version": minor,
        "python_full_version": f"{minor}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }


def test_every_pin_is_exact_and_hashed() -> None:
    pins = _locked()
    assert len(pins) > 10  # the whole closure, not only the direct dependencies
    for name, (_version, options) in pins.items():
        assert options, f"{name} has no --hash: pip --require-hashes would refuse the lock"
        bad = [o for o in options if not HASH.fullmatch(o)]
        assert not bad, f"{name}: {bad}"


def test_every_runtime_dependency_is_locked_within_its_range() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = _locked()
    env = _target_environment()
    checked = 0
    for text in project["dependencies"]:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is in pyproject.toml but not in the lock: make lock"
        version = pins[name][0]
        assert req.specifier.contains(version), (
            f"the lock pins {req.name}=={version}, outside pyproject's {req.specifier}: make lock"
        )
        checked += 1
    assert checked  # not every dependency skipped by a marker


def test_lock_is_for_the_python_of_the_image() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    (base,) = re.findall(r"^ARG PYTHON_IMAGE=python:(\d+\.\d+)\.", dockerfile, flags=re.MULTILINE)
    assert _lock_header_option("--python-version") == base
    assert _lock_header_option("--python-platform").startswith("x86_64-manylinux_")
