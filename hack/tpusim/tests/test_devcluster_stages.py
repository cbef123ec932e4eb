"""The local cluster's KWOK stages: KWOK's own, except that a dead kubelet finishes nothing."""

from __future__ import annotations

from pathlib import Path

import yaml

from tpusim.stages import DEAD_KUBELET_ANNOTATION, hold_deletion_on_dead_nodes, write_stages
from tpusim.tools import ToolPaths

REPO = Path(__file__).resolve().parents[3]
TERM = {"key": f'.metadata.annotations["{DEAD_KUBELET_ANNOTATION}"]', "operator": "DoesNotExist"}


def test_kwoks_own_pod_delete_stage_skips_pods_of_dead_nodes(tmp_path: Path) -> None:
    tools = ToolPaths.for_repo(REPO)
    assert not tools.missing(), "make tools first (make test-harness does)"
    written = write_stages(tools.kwok_stages, tmp_path)
    changed = [p for p in written if p.parent == tmp_path]
    assert [p.name for p in changed] == ["pod-delete.yaml"]
    original = yaml.safe_load((tools.root / "kwok-stages/pod/fast/pod-delete.yaml").read_text())
    (stage,) = yaml.safe_load_all(changed[0].read_text())
    expressions = stage["spec"]["selector"]["matchExpressions"]
    assert expressions == [*original["spec"]["selector"]["matchExpressions"], TERM]
    assert stage["spec"]["next"] == original["spec"]["next"]  # still empties finalizers, deletes
    unchanged = [p for p in written if p.parent != tmp_path]
    assert len(unchanged) == len(written) - 1
    assert all(p in tools.kwok_stages for p in unchanged)


def test_only_stages_that_delete_pods_change() -> None:
    ready = {
        "kind": "Stage",
        "spec": {"resourceRef": {"kind": "Pod"}, "next": {"statusTemplate": "phase: Running"}},
    }
    assert hold_deletion_on_dead_nodes(ready) == ready
    node = {"kind": "Stage", "spec": {"resourceRef": {"kind": "Node"}, "next": {"delete": True}}}
    assert hold_deletion_on_dead_nodes(node) == node
    bare = {"kind": "Stage", "spec": {"resourceRef": {"kind": "Pod"}, "next": {"delete": True}}}
    assert hold_deletion_on_dead_nodes(bare)["spec"]["selector"] == {"matchExpressions": [TERM]}
    assert "selector" not in bare["spec"]  # the input is not changed
