"""The harness finds the tools exactly where hack/build-tools.sh puts them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tpusim.tools import ToolPaths, find_repo_root, read_versions

REPO = Path(__file__).resolve().parents[3]


def test_python_and_shell_agree_on_the_tools_dir(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    shell = subprocess.run(
        ["bash", str(REPO / "hack" / "tools-dir.sh")], env=env, capture_output=True, text=True
    )
    assert shell.returncode == 0, shell.stderr
    assert Path(shell.stdout.strip()) == ToolPaths.for_repo(REPO, env).root
    override = {**env, "TPUSLICE_TOOLS_DIR": str(tmp_path / "t")}
    assert ToolPaths.for_repo(REPO, override).root.parent == tmp_path / "t"


def test_versions_are_pinned_and_nothing_is_built_in_an_empty_dir(tmp_path: Path) -> None:
    versions = read_versions(REPO / "hack" / "versions.env")
    assert versions["KUBERNETES_VERSION"].startswith("v1.34.")
    assert find_repo_root(REPO / "operator") == REPO
    tools = ToolPaths.for_repo(REPO, {"TPUSLICE_TOOLS_DIR": str(tmp_path)})
    assert "kube-apiserver" in tools.missing()


def test_k8s_wrapper_gomod_replaces_every_staging_module() -> None:
    sys.path.insert(0, str(REPO / "hack"))
    try:
        from k8s_wrapper_gomod import wrapper_gomod
    finally:
        sys.path.pop(0)
    upstream = "\n".join(
        [
            "module k8s.io/kubernetes",
            "go 1.24.0",
            "godebug default=go1.23",
            "replace (",
            "\tk8s.io/api => ./staging/src/k8s.io/api",
            "\tk8s.io/client-go => ./staging/src/k8s.io/client-go",
            ")",
        ]
    )
    out = wrapper_gomod(upstream, "v1.34.4")
    assert "require k8s.io/kubernetes v1.34.4" in out
    assert "\tk8s.io/api => k8s.io/api v0.34.4" in out
    assert "\tk8s.io/client-go => k8s.io/client-go v0.34.4" in out
    assert "go 1.24.0" in out and "godebug default=go1.23" in out
