"""Generated copies must match their source (`make sync-crds` regenerates them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def test_crd_copies_match_crds_dir() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "sync_crds.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def _sync_crds_module() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("sync_crds", ROOT / "hack" / "sync_crds.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_include_markers_take_the_part_at_their_indent() -> None:
    sync = _sync_crds_module()
    text = "a:\n  properties:\n    #@include conditions\n"
    out = sync.assemble(text)
    assert "#@include" not in out
    assert "\n    x-kubernetes-list-type: map\n" in out
    assert not out.splitlines()[2].startswith("#")  # the part's own comments are dropped


def test_unknown_part_is_an_error_naming_the_parts() -> None:
    import pytest

    sync = _sync_crds_module()
    with pytest.raises(sync.PartError, match=r"no part 'nope'.*cluster-spec"):
        sync.assemble("  #@include nope\n")


def test_assembled_crds_parse_and_have_no_markers_left() -> None:
    import yaml

    for path in sorted((ROOT / "crds").glob("*.yaml")):
        text = path.read_text()
        assert "#@include" not in text, path.name
        assert yaml.safe_load(text)["kind"] == "CustomResourceDefinition"


def test_a_part_may_use_another_but_never_itself(tmp_path: Path, monkeypatch: Any) -> None:
    import pytest

    sync = _sync_crds_module()
    (tmp_path / "outer.yaml").write_text("# doc\nx:\n  #@include inner\n")
    (tmp_path / "inner.yaml").write_text("# doc\ny: 1\n")
    (tmp_path / "loop.yaml").write_text("z:\n  #@include loop\n")
    monkeypatch.setattr(sync, "PARTS", tmp_path)
    assert sync.assemble("a:\n  #@include outer\n") == "a:\n  x:\n    y: 1\n"
    with pytest.raises(sync.PartError, match=r"loop\.yaml includes itself \(loop -> loop\)"):
        sync.assemble("#@include loop\n")
