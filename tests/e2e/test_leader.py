"""Several operator instances at once: one Lease, one actor, every replica a webhook.

- Two instances of one deployment: only the Lease holder writes (counted per
  process from its own /metrics); SIGKILL it and the standby takes over within
  the lease duration plus one pass, nothing claimed twice.
- A namespace-scoped instance next to the cluster-wide one never deletes the
  other's reservations.
- Two webhook servers behind one configuration (a loopback balancer standing in
  for the chart's Service): stop one in the middle of a burst of pod creations
  and KubeRay is refused none.

The session's ``operator`` is the cluster-wide instance; each test leaves it
running and leading again.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import E2ECluster
from tests.e2e.operator_support import (
    REPO,
    InvariantWatch,
    OperatorProcess,
    apply,
    describe,
    event_reasons,
    held_by,
    kubectl,
    record,
    reservations,
    slice_pods,
    tsc,
    wait_condition,
)
from tpusim import kube
from tpusim.balancer import Backend, Balancer
from tpusim.processes import free_port

LEASE_SECONDS = 15.0  # client-go's default, tpuslice run's
RETRY_SECONDS = 2.0
#: What the leader alone may write (reconciles, claims, releases, status, events, sweep).
ACTING = {
    "slicereservations",
    "slicereservations/status",
    "pods",
    "rayclusters",
    "tpusliceclusters/status",
    "events",
}


def acting_writes(proc: OperatorProcess) -> float:
    return sum(
        n
        for (verb, resource), n in proc.api_requests().items()
        if verb in ("POST", "PUT", "PATCH", "DELETE") and resource in ACTING
    )


def leading(proc: OperatorProcess) -> bool:
    try:
        return proc.leading()
    except OSError:
        return False


def logs_dir(cluster: E2ECluster) -> Path:
    return (cluster.run_dir or REPO / ".e2e-runs" / "existing") / "logs"


def wait_leading(proc: OperatorProcess, timeout_s: float = 30) -> None:
    kube.wait_for(
        lambda: leading(proc) and proc.healthy(),
        timeout_s=timeout_s,
        interval_s=0.1,
        what=f"{proc.log_path.stem} leading and ready",
        describe=proc.tail,
    )


def test_only_the_leader_acts_and_the_standby_takes_over_a_killed_leader(
    cluster: E2ECluster, namespace: str, operator: OperatorProcess
) -> None:
    wait_leading(operator)
    standby = OperatorProcess(
        cluster.kubeconfig,
        logs_dir(cluster) / "standby.log",
        extra_args=("--resync-seconds=10",),
        cwd=REPO,
    )
    # The standby applies the webhook configuration with its own URL and CA at start
    # (every replica applies it): from now on its webhook admits the pods, while it
    # acts on nothing.
    standby.start()
    try:
        assert not standby.leading() and operator.leading()
        assert "standby: the Lease default/tpuslice-operator is held by e2e-operator" in (
            standby.log_path.read_text()
        )
        quiet_before = acting_writes(standby)
        with InvariantWatch(cluster, namespace) as watch:
            apply(cluster, namespace, tsc("handover", slices=2))
            kube.wait_for(
                lambda: held_by(cluster, namespace, "handover"),
                timeout_s=60,
                interval_s=0.05,
                what="first reservation",
            )
            assert acting_writes(standby) == quiet_before == 0  # the standby wrote nothing
            assert acting_writes(operator) > 0
            assert standby.admissions() > 0  # but it answered the webhook calls
            operator.kill()
            killed = time.monotonic()
            kube.wait_for(
                lambda: leading(standby),
                timeout_s=LEASE_SECONDS + 3 * RETRY_SECONDS,
                interval_s=0.1,
                what="the standby leading",
                describe=standby.tail,
            )
            took_over = time.monotonic() - killed
            record("leader SIGKILLed -> standby leads", took_over)
            wait_condition(cluster, namespace, "handover", "Ready", "True", timeout_s=120)
            record("leader SIGKILLed -> Ready", time.monotonic() - killed)
        assert took_over <= LEASE_SECONDS + RETRY_SECONDS * 1.2 + 1.0
        watch.check()
        held = held_by(cluster, namespace, "handover")
        assert len(held) == 2 and len(set(held.values())) == 2
        mine = [r for r in reservations(cluster) if r["spec"]["holder"]["name"] == "handover"]
        assert len(mine) == 2  # nothing claimed twice
        assert acting_writes(standby) > 0  # it acts now
        kubectl(cluster, "delete", "tsc", "-n", namespace, "handover", "--timeout=90s")
    finally:
        # The session operator comes back as a standby (the Lease names the other),
        # re-applies its own webhook configuration, and leads once the other stops
        # and releases the Lease.
        operator.start()
        standby.stop()
        wait_leading(operator)


@pytest.fixture
def other_namespace(cluster: E2ECluster) -> Iterator[str]:
    name = f"e2e-scoped-{uuid.uuid4().hex[:5]}"
    cluster.core.create_namespace({"metadata": {"name": name}})
    yield name
    cluster.core.delete_namespace(name)


def test_a_namespace_scoped_instance_never_deletes_other_namespaces_reservations(
    cluster: E2ECluster, namespace: str, other_namespace: str, operator: OperatorProcess
) -> None:
    """The scoped instance sees no cluster and no pods in ``namespace``: to its sweep
    the reservation there looks orphaned, and before the fix it deleted it within a
    second of starting (its timer fires at once for every reservation)."""
    wait_leading(operator)
    apply(cluster, namespace, tsc("kept", type_="v4", topology="2x2x2"))
    wait_condition(cluster, namespace, "kept", "Ready", "True")
    (before,) = [r for r in reservations(cluster) if r["spec"]["holder"]["name"] == "kept"]
    scoped = OperatorProcess(
        cluster.kubeconfig,
        logs_dir(cluster) / "scoped.log",
        extra_args=(
            f"--namespace={other_namespace}",
            "--leader-elect-lease-name=tpuslice-scoped",  # another deployment, another Lease
            "--sweep-seconds=1",
        ),
        webhook=False,  # the session's webhook stays the one configured
        cwd=REPO,
    )
    scoped.start()
    try:
        wait_leading(scoped)

        def sees_the_reservation() -> bool:
            gauge = scoped.samples("tpuslice_reservations")
            return sum(gauge.values()) >= 1

        kube.wait_for(sees_the_reservation, timeout_s=30, what="the scoped instance's index")
        time.sleep(4)  # four sweep intervals
        (after,) = [r for r in reservations(cluster) if r["spec"]["holder"]["name"] == "kept"]
        assert after["metadata"]["uid"] == before["metadata"]["uid"]
        deletes = scoped.api_requests().get(("DELETE", "slicereservations"), 0)
        assert deletes == 0, scoped.tail()
        assert acting_writes(scoped) == 0
    finally:
        scoped.stop()
        kubectl(cluster, "delete", "lease", "-n", "default", "tpuslice-scoped", check=False)
    wait_condition(cluster, namespace, "kept", "Ready", "True")


def env_names(pod: Any) -> set[str]:
    return {e.name for c in pod.spec.containers for e in c.env or []}


def test_stopping_one_of_two_webhook_replicas_mid_burst_refuses_no_pod(
    cluster: E2ECluster, namespace: str, operator: OperatorProcess
) -> None:
    """Two instances share one CA through a Secret (as the chart's replicas do) and sit
    behind one URL, a balancer that routes as a Service does. The leader gets SIGTERM
    while KubeRay creates 40 worker pods: it turns not ready, drains, releases the
    Lease; the other answers and takes over. KubeRay must not be refused once."""
    kubectl(cluster, "create", "secret", "generic", "certs", "-n", namespace)
    lb_port = free_port()
    url = f"https://127.0.0.1:{lb_port}"
    first, second = (
        OperatorProcess(
            cluster.kubeconfig,
            logs_dir(cluster) / f"replica-{n}.log",
            extra_args=("--resync-seconds=10",),
            webhook_args=("--webhook-secret=certs", f"--webhook-namespace={namespace}"),
            webhook_url=url,
            cwd=REPO,
        )
        for n in (1, 2)
    )
    operator.stop()  # releases the Lease: the first replica takes it at once
    balancer: Balancer | None = None
    try:
        first.start()
        second.start()
        wait_leading(first)
        assert not second.leading()
        certs = [(p.cert_dir / "ca.crt").read_bytes() for p in (first, second)]
        assert certs[0] == certs[1]  # one CA, whichever replica applied the configuration
        balancer = Balancer(
            [
                Backend(p.webhook_port, f"http://127.0.0.1:{p.webhook_health_port}/readyz")
                for p in (first, second)
            ],
            port=lb_port,
        )
        balancer.start()
        names = [f"burst-{i}" for i in range(5)]
        stopper: threading.Thread | None = None
        stopped_at, admitted_by_second = 0.0, 0.0
        for i, name in enumerate(names):
            apply(cluster, namespace, tsc(name, slices=2))
            if i == 1:
                kube.wait_for(
                    lambda: first.admissions() > 0,
                    timeout_s=60,
                    what="the first replica answering",
                )
                stopper = threading.Thread(target=first.stop)
                stopped_at = time.monotonic()
                stopper.start()
                admitted_by_second = second.admissions()
            time.sleep(1)
        assert stopper is not None
        kube.wait_for(
            lambda: leading(second),
            timeout_s=LEASE_SECONDS,
            interval_s=0.1,
            what="the second replica leading",
        )
        record("leader SIGTERM -> other leads", time.monotonic() - stopped_at)

        def all_admitted() -> bool:
            pods = [p for n in names for p in slice_pods(cluster, namespace, n)]
            workers = [p for p in pods if "TPU_WORKER_ID" in env_names(p)]
            return len(workers) == 40

        kube.wait_for(
            all_admitted,
            timeout_s=180,
            what="40 worker pods created through the webhook",
            describe=lambda: [describe(cluster, namespace, n)["pods"] for n in names],
        )
        stopper.join(30)
        refused = sorted(r for r in event_reasons(cluster, namespace) if "FailedToCreate" in r)
        assert refused == [], kubectl(cluster, "get", "events", "-n", namespace).stdout
        assert second.admissions() > admitted_by_second  # it answered after the stop
        assert balancer.backends[0].connections > 0 and balancer.backends[1].connections > 0
    finally:
        for proc in (first, second):
            proc.stop()
        if balancer is not None:
            balancer.stop()
        operator.start()  # re-applies the session's own webhook configuration
        wait_leading(operator)
