"""The KWOK stages the local cluster runs, derived at start from KWOK's own files.

KWOK plays the kubelet of every fake node: its pod-delete stage finishes every
pod deletion, and it kept doing so on a node the harness had made NotReady
(75 ms after an eviction there), so "a dead kubelet leaves its pods
Terminating" never happened. A real dead kubelet finishes nothing: deleting a
pod on its node hangs until the node comes back, or is deleted and the pod
garbage collector removes the orphan.

So ``kube.set_node_not_ready`` marks every pod bound to the node with
``DEAD_KUBELET_ANNOTATION`` (``restore_node`` removes the mark), and the
pod-delete stage the cluster runs is KWOK's own with one more selector term:
the mark does not exist. KWOK's file is read from the tools cache at start and
changed there, never copied into this repository.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

__all__ = ["DEAD_KUBELET_ANNOTATION", "hold_deletion_on_dead_nodes", "write_stages"]

#: On a pod: the kubelet of its node is dead (value: the node), so KWOK leaves it alone.
DEAD_KUBELET_ANNOTATION = "tpusim.dev/kubelet-stopped"


def _is_pod_delete(stage: Mapping[str, Any]) -> bool:
    spec = stage.get("spec") or {}
    ref = spec.get("resourceRef") or {}
    return bool(
        stage.get("kind") == "Stage"
        and ref.get("kind") == "Pod"
        and (spec.get("next") or {}).get("delete") is True
    )


def hold_deletion_on_dead_nodes(stage: Mapping[str, Any]) -> dict[str, Any]:
    """``stage`` unchanged, or (a stage that deletes pods) also requiring that the pod is
    not marked with DEAD_KUBELET_ANNOTATION."""
    out = copy.deepcopy(dict(stage))
    if not _is_pod_delete(out):
        return out
    selector = out["spec"].setdefault("selector", {}) or {}
    out["spec"]["selector"] = selector
    selector.setdefault("matchExpressions", []).append(
        {"key": f'.metadata.annotations["{DEAD_KUBELET_ANNOTATION}"]', "operator": "DoesNotExist"}
    )
    return out


def write_stages(sources: Iterable[Path], out_dir: Path) -> list[Path]:
    """The stage files to give KWOK: each source as is, except that stages which delete
    pods are written to ``out_dir`` with the dead-kubelet term added."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for source in sources:
        docs = [d for d in yaml.safe_load_all(source.read_text()) if d is not None]
        if not any(_is_pod_delete(d) for d in docs):
            paths.append(source)
            continue
        target = out_dir / source.name
        target.write_text(yaml.safe_dump_all([hold_deletion_on_dead_nodes(d) for d in docs]))
        paths.append(target)
    return paths
