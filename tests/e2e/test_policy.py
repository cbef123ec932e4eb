"""TPUSlicePolicy enforced by the operator on the local cluster.

Two teams, each a namespace labelled with its team and a TPUSlicePolicy taking only
its own node pool (the harness's v6e-4x4-a and v6e-4x4-b, labelled here with
``kubectl label node``): each team's TPUSliceCluster gets its own pool and never the
other's; a second cluster over team a's namespace limit waits, its slice naming the
policy and the limit; a privileged worker template in team b's namespace (Pod Security
``baseline``) is Stalled with PolicyViolation naming the field; a namespace no policy
selects is denied. Those two are the pass's refusals, so they are applied with the
policy webhook's configuration removed (as while no replica answers: its
failurePolicy is Ignore); with it, a privileged worker template is refused at
``kubectl apply``, the error naming the policy and the field.

Every policy is deleted at the end, and the node labels removed: a policy left behind
would deny the namespace of every later test.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.e2e.helpers import E2ECluster
from tests.e2e.operator_support import (
    OperatorProcess,
    apply,
    delete_tsc,
    describe,
    get_tsc,
    held_by,
    kubectl,
    tsc,
    wait_condition,
)
from tpusim import kube

TEAM_LABEL = "tpuslice.dev/e2e-team"
POOLS = {"a": "v6e-4x4-a", "b": "v6e-4x4-b"}
READY_S = 180
POLICY_WEBHOOK = "tpuslice-policy"
PRIVILEGED = {"containers": [{"name": "ray-worker", "securityContext": {"privileged": True}}]}


def _admitted_again(cluster: E2ECluster) -> None:
    """Once the test's policies are deleted, wait until admission judges without them
    (the policy webhook keeps what it read for a few seconds): a policy still seen would
    deny the namespaces of every later test. The probe goes to ``default``, which no
    policy here selects, so it is admitted only once no policy is seen at all."""
    probe = tsc("probe")
    kube.wait_for(
        lambda: _server_dry_run(cluster, "default", probe).returncode == 0,
        timeout_s=60,
        what="admission without this test's TPUSlicePolicies",
    )


def _server_dry_run(cluster: E2ECluster, namespace: str, body: dict[str, Any]) -> Any:
    """``kubectl apply --dry-run=server``: the API server runs admission, webhooks too."""
    return kubectl(
        cluster,
        "apply",
        "--dry-run=server",
        "-n",
        namespace,
        "-f",
        "-",
        stdin=yaml.safe_dump(body),
        check=False,
    )


@contextlib.contextmanager
def without_policy_admission(
    cluster: E2ECluster, namespace: str, body: dict[str, Any]
) -> Iterator[None]:
    """The policy webhook's configuration removed for the block, until the API server
    admits ``body`` (the pass alone judges it then), and put back as it was."""
    got = kubectl(cluster, "get", "validatingwebhookconfiguration", POLICY_WEBHOOK, "-o", "json")
    live = json.loads(got.stdout)
    meta = live["metadata"]
    live["metadata"] = {k: meta[k] for k in ("name", "labels", "annotations") if k in meta}
    kubectl(cluster, "delete", "validatingwebhookconfiguration", POLICY_WEBHOOK)
    try:
        kube.wait_for(
            lambda: _server_dry_run(cluster, namespace, body).returncode == 0,
            timeout_s=30,
            what="the API server admitting without the policy webhook",
        )
        yield
    finally:
        kubectl(cluster, "create", "-f", "-", stdin=json.dumps(live))


def _pool_nodes(cluster: E2ECluster, pool: str) -> list[str]:
    nodes = cluster.core.list_node(label_selector=f"cloud.google.com/gke-nodepool={pool}").items
    return [n.metadata.name for n in nodes]


def _policy(team: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tpuslice.dev/v1alpha1",
        "kind": "TPUSlicePolicy",
        "metadata": {"name": f"e2e-team-{team}"},
        "spec": {
            "namespaceSelector": {"matchLabels": {TEAM_LABEL: team}},
            "pools": {"nodeSelector": {TEAM_LABEL: team}},
            **spec,
        },
    }


@pytest.fixture
def teams(cluster: E2ECluster, namespace: str) -> Iterator[dict[str, str]]:
    """team -> namespace (``namespace`` is team a's, one more is made for team b), their
    pools labelled and the two policies applied; all undone afterwards."""
    other = f"{namespace[:50]}-b-{uuid.uuid4().hex[:4]}"
    cluster.core.create_namespace(
        {"metadata": {"name": other, "labels": {"tpuslice.dev/e2e": "true"}}}
    )
    spaces = {"a": namespace, "b": other}
    policies = [
        _policy("a", limits={"slicesPerNamespace": 1}),
        _policy("b", podTemplate={"podSecurity": "baseline"}),
    ]
    try:
        for team, pool in POOLS.items():
            for name in _pool_nodes(cluster, pool):
                kubectl(cluster, "label", "node", name, f"{TEAM_LABEL}={team}", "--overwrite")
            kubectl(
                cluster, "label", "namespace", spaces[team], f"{TEAM_LABEL}={team}", "--overwrite"
            )
        kubectl(cluster, "apply", "-f", "-", stdin=yaml.safe_dump_all(policies))
        yield spaces
    finally:
        for body in policies:
            kubectl(cluster, "delete", "tsp", body["metadata"]["name"], "--ignore-not-found")
        for pool in POOLS.values():
            for name in _pool_nodes(cluster, pool):
                kubectl(cluster, "label", "node", name, f"{TEAM_LABEL}-", check=False)
        kubectl(cluster, "label", "namespace", namespace, f"{TEAM_LABEL}-", check=False)
        _admitted_again(cluster)
        cluster.core.delete_namespace(other)
        kube.wait_for(
            lambda: not cluster.core.list_namespaced_pod(other).items,
            timeout_s=120,
            what=f"pods of namespace {other} deleted",
        )


def _slice_message(cluster: E2ECluster, namespace: str, name: str, text: str) -> str | None:
    slices = (get_tsc(cluster, namespace, name).get("status") or {}).get("slices") or []
    found = [s.get("message", "") for s in slices if text in s.get("message", "")]
    return found[0] if found else None


def test_two_teams_each_on_their_own_pool_with_limits_and_pod_security(
    cluster: E2ECluster,
    teams: dict[str, str],
    operator: OperatorProcess,
) -> None:
    a, b = teams["a"], teams["b"]
    apply(cluster, a, tsc("first"))
    apply(cluster, b, tsc("second"))
    wait_condition(cluster, a, "first", "Ready", "True", timeout_s=READY_S)
    wait_condition(cluster, b, "second", "Ready", "True", timeout_s=READY_S)
    assert set(held_by(cluster, a, "first").values()) == {POOLS["a"]}
    assert set(held_by(cluster, b, "second").values()) == {POOLS["b"]}

    # team a holds its one slice: a second cluster waits, naming the policy and limit
    apply(cluster, a, tsc("over"))
    message = kube.wait_for(
        lambda: _slice_message(cluster, a, "over", "spec.limits.slicesPerNamespace 1"),
        timeout_s=60,
        what=f"{a}/over waiting on its namespace's limit",
        describe=lambda: describe(cluster, a, "over"),
    )
    assert "TPUSlicePolicy e2e-team-a" in message
    assert held_by(cluster, a, "over") == {}

    # a privileged worker in team b's namespace (baseline) is refused, naming the field
    bad = tsc("privileged")
    bad["spec"]["worker"]["template"] = {"spec": PRIVILEGED}
    with without_policy_admission(cluster, b, bad):
        apply(cluster, b, bad)
    refused = wait_condition(cluster, b, "privileged", "Stalled", "True", "PolicyViolation")
    stalled = next(x for x in refused["status"]["conditions"] if x["type"] == "Stalled")
    assert "securityContext.privileged" in stalled["message"]
    assert "e2e-team-b" in stalled["message"]
    assert held_by(cluster, b, "privileged") == {}

    # once team a's first cluster is gone, the waiting one gets team a's pool
    delete_tsc(cluster, a, "first")
    wait_condition(cluster, a, "over", "Ready", "True", timeout_s=READY_S)
    assert set(held_by(cluster, a, "over").values()) == {POOLS["a"]}
    for ns, name in ((a, "over"), (b, "second"), (b, "privileged")):
        delete_tsc(cluster, ns, name)


def test_a_namespace_no_policy_selects_is_denied(
    cluster: E2ECluster,
    teams: dict[str, str],
    operator: OperatorProcess,
) -> None:
    unlabelled = f"{teams['a'][:50]}-x-{uuid.uuid4().hex[:4]}"
    cluster.core.create_namespace({"metadata": {"name": unlabelled}})
    try:
        with without_policy_admission(cluster, unlabelled, tsc("denied")):
            apply(cluster, unlabelled, tsc("denied"))
        obj = wait_condition(cluster, unlabelled, "denied", "Stalled", "True", "PolicyDenied")
        stalled = next(x for x in obj["status"]["conditions"] if x["type"] == "Stalled")
        assert "e2e-team-a" in stalled["message"] and "e2e-team-b" in stalled["message"]
        assert held_by(cluster, unlabelled, "denied") == {}
        delete_tsc(cluster, unlabelled, "denied")
    finally:
        cluster.core.delete_namespace(unlabelled)


def test_a_privileged_worker_is_refused_at_kubectl_apply_naming_policy_and_field(
    cluster: E2ECluster,
    namespace: str,
    operator: OperatorProcess,
) -> None:
    """The policy webhook: ``kubectl apply`` fails at once with the pass's refusal text,
    and nothing is created. The webhook reads policies at most a few seconds old, so
    the refusal is awaited with server-side dry runs first."""
    body = _policy("admission", podTemplate={"podSecurity": "baseline"})
    del body["spec"]["pools"]
    kubectl(cluster, "label", "namespace", namespace, f"{TEAM_LABEL}=admission", "--overwrite")
    kubectl(cluster, "apply", "-f", "-", stdin=yaml.safe_dump(body))
    bad = tsc("privileged")
    bad["spec"]["worker"]["template"] = {"spec": PRIVILEGED}
    try:
        kube.wait_for(
            lambda: _server_dry_run(cluster, namespace, bad).returncode != 0,
            timeout_s=30,
            what="the policy webhook refusing a privileged worker template",
        )
        refused = kubectl(
            cluster, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(bad), check=False
        )
        assert refused.returncode != 0
        error = refused.stderr
        assert 'admission webhook "policy.tpuslice.dev" denied the request' in error, error
        assert "TPUSlicePolicy e2e-team-admission" in error, error
        assert "spec.worker.template.spec.containers[0].securityContext.privileged" in error
        assert "podSecurity baseline" in error, error
        gone = kubectl(cluster, "get", "tsc", "-n", namespace, "privileged", check=False)
        assert gone.returncode != 0 and "NotFound" in gone.stderr, gone.stdout
    finally:
        kubectl(cluster, "delete", "tsp", body["metadata"]["name"], "--ignore-not-found")
        kubectl(cluster, "label", "namespace", namespace, f"{TEAM_LABEL}-", check=False)
        _admitted_again(cluster)
