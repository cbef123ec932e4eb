"""The pure parts of tpusim.images: recipe hashes, cache keys, build context, argv.

The builds themselves (debootstrap, buildah) need root and minutes; the
real-node e2e tier runs them. These tests pin what decides whether a cached
image is reused and what the build commands promise.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tpusim import images
from tpusim.images import BaseRecipe, Buildah

ROOT = Path(__file__).resolve().parents[3]


def test_short_names_qualify_as_docker_does() -> None:
    assert images.qualify_ref("python:3.11.14-slim-trixie") == (
        "docker.io/library/python:3.11.14-slim-trixie"
    )
    assert images.qualify_ref("bitnami/redis:7") == "docker.io/bitnami/redis:7"
    assert images.qualify_ref("docker.io/python:3") == "docker.io/library/python:3"
    assert images.qualify_ref("localhost/pause:3.10") == "localhost/pause:3.10"
    assert images.qualify_ref("gcr.io/x/y:1") == "gcr.io/x/y:1"
    assert images.qualify_ref("registry:5000/y:1") == "registry:5000/y:1"


def test_base_ref_comes_from_the_dockerfile() -> None:
    """The stand-in is committed under the FROM name users build with."""
    arg = images.dockerfile_arg((ROOT / "Dockerfile").read_text(), "PYTHON_IMAGE")
    assert images.qualify_ref(arg) == f"docker.io/library/{arg}"
    with pytest.raises(ValueError):
        images.dockerfile_arg("FROM scratch\n", "PYTHON_IMAGE")


def test_debian_mirror_from_either_sources_format() -> None:
    deb822 = (
        "Types: deb\n# http://snapshot.debian.org/archive/debian/x\n"
        "URIs: http://deb.debian.org/debian\nSuites: bookworm\n\n"
        "Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\n"
    )
    assert images.debian_mirror([deb822]) == "http://deb.debian.org/debian"
    one_line = "deb [arch=amd64] https://mirror.example/debian/ bookworm main\n"
    third_party = "deb https://packages.cloud.google.com/apt cloud-sdk main\n"
    assert images.debian_mirror([third_party, one_line]) == "https://mirror.example/debian"
    assert images.debian_mirror([third_party]) is None


def test_base_recipe_key_is_stable_and_tracks_content() -> None:
    ref = "docker.io/library/python:3.11.14-slim-trixie"
    key = BaseRecipe(ref=ref).key()
    assert key == BaseRecipe(ref=ref).key() and len(key) == 64
    changed = {
        BaseRecipe(ref=ref, packages=(*images.BASE_PACKAGES, "curl")).key(),
        BaseRecipe(ref=ref, suite="trixie").key(),
        BaseRecipe(ref=ref, extra_cas=(("proxy.crt", "ab" * 32),)).key(),
        BaseRecipe(ref=ref.replace("3.11.14", "3.11.15")).key(),
        BaseRecipe(ref=ref, env=(("LANG", "C.UTF-8"),)).key(),
    }
    assert key not in changed and len(changed) == 5
    # Package order does not matter; it is a set for debootstrap.
    swapped = BaseRecipe(ref=ref, packages=tuple(reversed(images.BASE_PACKAGES)))
    assert swapped.key() == key


def test_base_has_what_kuberay_pods_and_pip_need() -> None:
    assert {"python3", "python3-venv", "ca-certificates", "wget"} <= set(images.BASE_PACKAGES)
    env = dict(images.BASE_ENV)
    assert env["PATH"].startswith(f"{images.VENV}/bin:") and env["LANG"] == "C.UTF-8"
    argv = images.debootstrap_argv(BaseRecipe(ref="r"), Path("/x/rootfs"), "http://m/debian")
    assert argv[:2] == ["debootstrap", "--variant=minbase"]
    assert "wget" in argv[2].removeprefix("--include=").split(",")
    assert argv[-3:] == ["bookworm", "/x/rootfs", "http://m/debian"]


def test_host_extra_cas_hash_only_crt_files(tmp_path: Path) -> None:
    assert images.host_extra_cas(tmp_path / "missing") == ()
    (tmp_path / "sub").mkdir()
    (tmp_path / "proxy.crt").write_text("A")
    (tmp_path / "sub" / "other.crt").write_text("B")
    (tmp_path / "README").write_text("not a cert")
    cas = images.host_extra_cas(tmp_path)
    assert [name for name, _ in cas] == ["proxy.crt", "sub/other.crt"]
    (tmp_path / "proxy.crt").write_text("A2")
    assert images.host_extra_cas(tmp_path) != cas


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_context_follows_the_project_dockerignore(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "pyproject.toml": "",
            "requirements.lock": "",
            "README.md": "",
            "Dockerfile": "",
            "operator/tpuslice/cli.py": "",
            "operator/tpuslice/__pycache__/cli.cpython-311.pyc": "",
            "operator/tpuslice/data/x.yaml": "",
            "tests/unit/test_x.py": "",
            ".venv/lib/site.py": "",
            "docs/README.md": "",
        },
    )
    rules = images.parse_dockerignore((ROOT / ".dockerignore").read_text())
    assert images.context_files(tmp_path, rules) == [
        "README.md",
        "operator/tpuslice/cli.py",
        "operator/tpuslice/data/x.yaml",
        "pyproject.toml",
        "requirements.lock",
    ]


def test_dockerignore_rules_last_match_wins() -> None:
    rules = images.parse_dockerignore("# c\n\n*.log\n!keep.log\nbuild/\n!build/out/**\n")
    assert images.is_ignored(rules, ("a.log",))
    assert not images.is_ignored(rules, ("keep.log",))
    assert images.is_ignored(rules, ("build", "tmp", "x"))
    assert not images.is_ignored(rules, ("build", "out", "x", "y"))
    assert not images.is_ignored(rules, ("src", "a.py"))


def test_context_files_of_this_repo_are_small() -> None:
    """Walks only what .dockerignore admits (not .git or .venv)."""
    rules = images.parse_dockerignore((ROOT / ".dockerignore").read_text())
    files = images.context_files(ROOT, rules)
    assert {"pyproject.toml", "requirements.lock", "operator/tpuslice/main/cli.py"} <= set(files)
    top = {"pyproject.toml", "requirements.lock", "README.md", "operator"}
    assert {f.split("/")[0] for f in files} <= top
    assert not [f for f in files if "__pycache__" in f]


def test_context_digest_tracks_content_mode_and_names(tmp_path: Path) -> None:
    _tree(tmp_path, {"a": "1", "b/c": "2"})
    files = ["a", "b/c"]
    first = images.context_digest(tmp_path, files)
    assert images.context_digest(tmp_path, files) == first
    (tmp_path / "a").chmod(0o755)
    moded = images.context_digest(tmp_path, files)
    (tmp_path / "b" / "c").write_text("3")
    edited = images.context_digest(tmp_path, files)
    assert len({first, moded, edited, images.context_digest(tmp_path, ["a"])}) == 4


def test_image_keys_depend_on_base_recipe_and_inputs() -> None:
    base = "0" * 64
    key = images.operator_key(base, b"FROM x", b"*", "ctx")
    assert key == images.operator_key(base, b"FROM x", b"*", "ctx")
    assert key != images.operator_key("1" * 64, b"FROM x", b"*", "ctx")
    assert key != images.operator_key(base, b"FROM y", b"*", "ctx")
    assert key != images.operator_key(base, b"FROM x", b"", "ctx")
    assert key != images.operator_key(base, b"FROM x", b"*", "ctx2")
    ray = images.ray_key(base, b"FROM x", "2.60.0")
    assert ray != images.ray_key(base, b"FROM x", "2.54.0")
    assert ray != images.ray_key("1" * 64, b"FROM x", "2.60.0")


def test_buildah_argv_uses_private_storage_host_network_and_no_pull() -> None:
    b = Buildah(Path("/c/root"), Path("/c/runroot"))
    argv = b.bud(
        dockerfile=Path("/repo/Dockerfile"),
        context=Path("/repo"),
        tags=("localhost/tpuslice-operator:0.1.0", "localhost/tpuslice-operator:ctx-abc"),
        iidfile=Path("/c/tmp/iid"),
        layers=False,
        build_args={"B": "2", "A": "1"},
    )
    assert argv[:7] == [
        "buildah",
        "--root",
        "/c/root",
        "--runroot",
        "/c/runroot",
        "--storage-driver",
        "overlay",
    ]
    rest = argv[7:]
    assert rest[0] == "bud" and "--layers=false" in rest and "--pull=never" in rest
    assert rest[rest.index("--network") + 1] == "host"
    assert rest[rest.index("-f") + 1] == "/repo/Dockerfile" and rest[-1] == "/repo"
    assert [rest[i + 1] for i, a in enumerate(rest) if a == "-t"] == [
        "localhost/tpuslice-operator:0.1.0",
        "localhost/tpuslice-operator:ctx-abc",
    ]
    assert [rest[i + 1] for i, a in enumerate(rest) if a == "--build-arg"] == ["A=1", "B=2"]
    push = b.push_archive("sha256:1", Path("/c/op.tar"), "localhost/tpuslice-operator:0.1.0")
    assert push[7:] == [
        "push",
        "sha256:1",
        "docker-archive:/c/op.tar:localhost/tpuslice-operator:0.1.0",
    ]


def test_layers_are_off_when_a_run_mounts_another_stage() -> None:
    """buildah 1.28 reuses such a RUN layer even after the mounted stage changed."""
    assert not images.layer_cache_safe((ROOT / "Dockerfile").read_text())
    assert images.layer_cache_safe((ROOT / images.RAY_DOCKERFILE).read_text())
    continued = "FROM a AS b\nFROM c\nRUN \\\n    --mount=type=bind,target=/w,from=b true\n"
    assert not images.layer_cache_safe(continued)
    assert images.layer_cache_safe("FROM c\nRUN --mount=type=cache,target=/root/.cache pip -V\n")
    b = Buildah(Path("/r"), Path("/rr"))
    argv = b.bud(
        dockerfile=Path("f"), context=Path("."), tags=("t",), iidfile=Path("i"), layers=True
    )
    assert "--layers=true" in argv


def test_image_label_from_buildah_inspect() -> None:
    out = json.dumps({"OCIv1": {"config": {"Labels": {images.RECIPE_LABEL: "k"}}}})
    assert images.image_label(out, images.RECIPE_LABEL) == "k"
    docker = json.dumps({"OCIv1": {"config": {}}, "Docker": {"config": {"Labels": {"x": "y"}}}})
    assert images.image_label(docker, "x") == "y"
    assert images.image_label(json.dumps({"OCIv1": {"config": {"Labels": None}}}), "x") is None


def test_ray_dockerfile_is_clean_and_pins_a_supported_ray() -> None:
    path = ROOT / images.RAY_DOCKERFILE
    hadolint = Path(sys.executable).parent / "hadolint"
    done = subprocess.run([str(hadolint), str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    text = path.read_text()
    major, minor, *_ = (int(p) for p in images.dockerfile_arg(text, "RAY_VERSION").split("."))
    assert (major, minor) >= (2, 54)  # the test extra's floor (v4/v5p core counts)
    assert images.dockerfile_arg(text, "BASE_IMAGE") == images.dockerfile_arg(
        (ROOT / "Dockerfile").read_text(), "PYTHON_IMAGE"
    )
    assert '"ray[default]==${RAY_VERSION}"' in text
