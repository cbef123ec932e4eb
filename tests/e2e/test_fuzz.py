"""Fuzz through the front door: random TPUSliceClusters applied with `kubectl apply`.

Each spec is a valid base with 0-3 faults a careless or hostile user would make
(tests/support/fuzz.py, seeded). Every one must end, within a bound, as one of:

- refused: `kubectl apply` fails and its message names a field (spec.*, metadata.*);
- reconciled: the operator wrote conditions for the object's generation, not Stalled;
- stalled: Stalled=True with a known reason and a message.

Anything else is bad: no status in time, a ReconcileError (a pass raised), a
refusal naming no field, an unknown stall reason, or the operator process gone.
The counts go to ``<run dir>/fuzz-<seed>-<count>.json`` (docs/reliability.md).

CI runs a fixed seed and count; for a larger run:
``TPUSLICE_FUZZ_SEED=7 TPUSLICE_FUZZ_COUNT=1000 .venv/bin/python -m pytest tests/e2e -k fuzz``.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import yaml

from tests.e2e.helpers import E2ECluster
from tests.e2e.operator_support import REPO, OperatorProcess, condition, kubectl
from tests.support.fuzz import SpecFaults
from tests.support.kuberay import raycluster_crd
from tpusim import kube

SEED = int(os.environ.get("TPUSLICE_FUZZ_SEED", "12"))
COUNT = int(os.environ.get("TPUSLICE_FUZZ_COUNT", "300"))
#: Specs applied and judged together; each batch is deleted before the next, so the
#: pods of reconciled specs never pile up on the shared nodes.
BATCH = 30
#: How long an accepted object may go without a status for its generation.
STATUS_BOUND_S = 90.0
STALL_REASONS = {
    "InvalidSpec",
    "RayClusterRejected",
    "KubeRayNotInstalled",
    "MultiHostIndexingDisabled",
    "NotEnoughPools",  # more slices than pools of the shape exist: honest, and named
}
_FIELD = re.compile(r"\b(?:spec|metadata)(?:\.[A-Za-z0-9_/-]+|\[[^\]]*\])*")


def _template_fields() -> dict[str, list[str]]:
    versions = raycluster_crd()["spec"]["versions"]
    v1 = next(v for v in versions if v["name"] == "v1")["schema"]["openAPIV3Schema"]
    worker = v1["properties"]["spec"]["properties"]["workerGroupSpecs"]["items"]
    pod = worker["properties"]["template"]["properties"]["spec"]
    container = pod["properties"]["containers"]["items"]
    return {"spec": sorted(pod["properties"]), "container": sorted(container["properties"])}


def _field_of(stderr: str) -> str | None:
    """The first field a refusal names, indexes dropped (spec.tpu.topology)."""
    match = _FIELD.search(stderr)
    return re.sub(r"\[[^\]]*\]", "", match.group(0)) if match else None


def _stall_field(obj: dict[str, Any]) -> str:
    """The first field a Stalled message names, cut to four steps (spec.worker.template.spec)."""
    field = _field_of(condition(obj, "Stalled").get("message", "")) or "(none)"
    return ".".join(field.split(".")[:4])


def _judge(obj: dict[str, Any]) -> tuple[str, str] | None:
    """(outcome, reason) once the object has conditions for its generation, else None."""
    generation = obj["metadata"].get("generation")
    ready, stalled = condition(obj, "Ready"), condition(obj, "Stalled")
    if not ready or ready.get("observedGeneration") != generation:
        return None
    if stalled.get("status") == "True":
        ok = stalled.get("reason") in STALL_REASONS and stalled.get("message")
        return ("stalled" if ok else "bad", str(stalled.get("reason")))
    if ready.get("reason") == "ReconcileError" or not ready.get("reason"):
        return "bad", f"{ready.get('reason')}: {ready.get('message')}"
    return "reconciled", str(ready["reason"])


def test_random_specs_are_refused_reconciled_or_stalled_never_silent(
    cluster: E2ECluster, namespace: str, operator: OperatorProcess
) -> None:
    faults = SpecFaults(SEED, _template_fields())
    outcomes: dict[str, Counter[str]] = {k: Counter() for k in ("refused", "reconciled", "stalled")}
    bad: list[dict[str, Any]] = []
    stall_fields: Counter[str] = Counter()
    began = time.monotonic()
    specs = [faults.spec(f"fz-{i:04d}") for i in range(COUNT)]
    for start in range(0, COUNT, BATCH):
        batch = specs[start : start + BATCH]

        def apply_one(body: dict[str, Any]) -> tuple[dict[str, Any], Any]:
            done = kubectl(
                cluster,
                "apply",
                "-n",
                namespace,
                "-f",
                "-",
                stdin=yaml.safe_dump(body),
                check=False,
            )
            return body, done

        with ThreadPoolExecutor(4) as pool:
            applied = list(pool.map(apply_one, (body for body, _ in batch)))
        waiting: dict[str, list[str]] = {}
        for (body, done), (_, injected) in zip(applied, batch, strict=True):
            name = body["metadata"]["name"]
            if done.returncode != 0:
                field = _field_of(done.stderr)
                if field is None:
                    bad.append({"name": name, "faults": injected, "refused": done.stderr[-500:]})
                else:
                    outcomes["refused"][field] += 1
            else:
                waiting[name] = injected
        deadline = time.monotonic() + STATUS_BOUND_S
        while waiting and time.monotonic() < deadline:
            items = cluster.custom.list_namespaced_custom_object(
                "tpuslice.dev", "v1alpha1", namespace, "tpusliceclusters"
            )["items"]
            for obj in items:
                name = obj["metadata"]["name"]
                if name not in waiting:
                    continue
                judged = _judge(obj)
                if judged is None:
                    continue
                outcome, reason = judged
                if outcome == "bad":
                    bad.append({"name": name, "faults": waiting[name], "status": reason})
                else:
                    outcomes[outcome][reason] += 1
                    if outcome == "stalled":
                        stall_fields[_stall_field(obj)] += 1
                del waiting[name]
            if waiting:
                time.sleep(0.5)
        for name, injected in waiting.items():
            obj = cluster.custom.get_namespaced_custom_object(
                "tpuslice.dev", "v1alpha1", namespace, "tpusliceclusters", name
            )
            bad.append({"name": name, "faults": injected, "no status": obj.get("status")})
        assert operator.proc is not None and operator.proc.poll() is None, "operator exited"
        kubectl(cluster, "delete", "tsc", "--all", "-n", namespace, "--wait=true", "--timeout=180s")
        kube.wait_for(
            lambda: not cluster.core.list_namespaced_pod(namespace).items,
            timeout_s=180,
            what="pods of the batch gone",
        )
    seconds = time.monotonic() - began
    record: dict[str, Any] = {
        "seed": SEED,
        "count": COUNT,
        "seconds": round(seconds, 1),
        "refused": sum(outcomes["refused"].values()),
        "reconciled": sum(outcomes["reconciled"].values()),
        "stalled": sum(outcomes["stalled"].values()),
        "bad": len(bad),
        "by_reason": {k: dict(v.most_common()) for k, v in outcomes.items()},
        "stalled_by_field": dict(stall_fields.most_common()),
        "bad_cases": bad,
        "failed_passes_logged": _failed_passes(cluster, namespace),
    }
    out_dir = cluster.run_dir or REPO / ".e2e-runs" / "existing"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"fuzz-{SEED}-{COUNT}.json").write_text(json.dumps(record, indent=2) + "\n")
    assert bad == [], json.dumps(bad[:10], indent=2)
    assert record["refused"] + record["reconciled"] + record["stalled"] == COUNT
    assert record["failed_passes_logged"] == 0
    # every outcome class is reached, or the generator lost its teeth
    assert record["refused"] and record["reconciled"] and record["stalled"], record


def _failed_passes(cluster: E2ECluster, namespace: str) -> int:
    """Lines of the operator's log saying a pass of one of this run's objects raised."""
    log = (cluster.run_dir or REPO / ".e2e-runs" / "existing") / "logs" / "operator.log"
    if not log.exists():
        return 0
    needle = f"reconcile of {namespace}/"
    return sum(1 for line in log.read_text(errors="replace").splitlines() if needle in line)
