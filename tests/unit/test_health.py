"""Liveness and readiness verdicts on a fake clock, and the probe server over HTTP."""

from __future__ import annotations

import http.client
from pathlib import Path

import yaml

from tpuslice.main.cli import instance_identity
from tpuslice.runtime.health import Health, serve_health
from tpuslice.runtime.kube import credentials


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def started(clock: Clock, webhook: bool = False) -> Health:
    health = Health(clock=clock, webhook=webhook, loop_stall_s=30, watch_grace_s=15)
    health.beat()
    if webhook:
        health.webhook_listening()
    health.started()
    return health


def test_alive_during_startup_grace_then_not_if_the_loop_never_turned() -> None:
    clock = Clock()
    health = Health(clock=clock, startup_grace_s=300)
    assert health.liveness().ok
    clock.now += 301
    verdict = health.liveness()
    assert not verdict.ok and "has not started" in verdict.reasons[0]


def test_a_stalled_loop_fails_liveness_and_readiness() -> None:
    clock = Clock()
    health = started(clock)
    assert health.liveness().ok and health.readiness().ok
    clock.now += 31
    assert not health.liveness().ok
    assert "has not turned for 31s" in health.readiness().text()
    health.beat()
    assert health.liveness().ok and health.readiness().ok


def test_not_ready_until_started_and_webhook_listening() -> None:
    clock = Clock()
    health = Health(clock=clock, webhook=True)
    reasons = health.readiness().reasons
    assert any("not listed yet" in r for r in reasons)
    assert any("webhook is not listening" in r for r in reasons)
    assert any("has not turned yet" in r for r in reasons)
    assert health.liveness().ok  # starting is not dead
    health.beat()
    health.started()
    assert not health.readiness().ok
    health.webhook_listening()
    assert health.readiness().ok


def test_a_watch_failing_past_the_grace_makes_it_unready_and_recovery_clears_it() -> None:
    clock = Clock()
    health = started(clock)
    health.watch_failed("pods", "ConnectionRefusedError: [Errno 111]")
    clock.now += 10
    health.beat()
    health.watch_failed("pods", "ConnectionRefusedError: again")
    assert health.readiness().ok  # within the grace: a normal reconnect
    clock.now += 6
    health.beat()
    verdict = health.readiness()
    assert not verdict.ok
    assert verdict.reasons == ("watching pods has failed for 16s: ConnectionRefusedError: again",)
    assert health.liveness().ok  # an API outage never restarts the operator
    health.watch_ok("pods")
    assert health.readiness().ok


def test_probe_server_answers_both_paths() -> None:
    clock = Clock()
    health = Health(clock=clock)
    server = serve_health(health, 0, "127.0.0.1")
    try:
        port = server.server_address[1]

        def get(path: str) -> tuple[int, str]:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", path)
            response = conn.getresponse()
            body = response.read().decode()
            conn.close()
            return response.status, body

        assert get("/healthz") == (200, "ok\n")
        status, body = get("/readyz")
        assert status == 503 and "not listed yet" in body
        health.beat()
        health.started()
        assert get("/readyz") == (200, "ok\n")
        assert get("/metrics")[0] == 404
    finally:
        server.stop()


def test_instance_identity_prefers_the_pod_name() -> None:
    assert instance_identity({"POD_NAME": "tpuslice-operator-7d9f-abcde"}) == (
        "tpuslice-operator-7d9f-abcde"
    )
    own = instance_identity({})
    assert own.rsplit("-", 1)[1].isdigit()


def test_kopf_logs_in_with_the_kubeconfig_it_is_given(tmp_path: Path) -> None:
    """kopf and Kube resolve credentials alike; the kubeconfig named by --kubeconfig wins
    (kopf's login_via_client reads the $KUBECONFIG of import time instead)."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": "https://10.0.0.1:6443",
                            "insecure-skip-tls-verify": True,
                        },
                    }
                ],
                "users": [{"name": "u", "user": {"token": "abc.def"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    creds = credentials(str(path))
    assert creds.server == "https://10.0.0.1:6443"
    assert (creds.scheme, creds.token) == ("Bearer", "abc.def")
    assert creds.insecure is True and creds.certificate_path is None


def test_a_standby_is_ready_without_having_started_but_not_while_shutting_down() -> None:
    clock = Clock()
    health = Health(clock=clock, webhook=True)
    health.standby()
    health.beat()  # the start-up thread, trying for the Lease
    assert not health.readiness().ok  # the webhook is not listening yet
    health.webhook_listening()
    assert health.readiness().ok
    health.watch_failed("leases", "connection refused")
    clock.now += 16
    assert "watching leases has failed for 16s" in health.readiness().text()
    health.watch_ok("leases")
    assert health.readiness().ok
    health.standby(False)  # it leads now: ready once kopf has started
    assert "not listed yet" in health.readiness().text()
    health.started()
    assert health.readiness().ok
    health.shutting_down()
    assert health.readiness().reasons == ("shutting down",)
    assert health.liveness().ok


def test_a_watch_that_claims_to_be_open_but_delivers_nothing_fails_liveness() -> None:
    clock = Clock()
    health = Health(clock=clock, watch_stuck_s=900)
    health.beat()
    health.watch_ok("pods")
    health.watch_ok("nodes")
    clock.now += 600
    health.beat()
    health.watch_ok("nodes")  # an event or the end of a timed-out watch
    assert health.liveness().ok
    clock.now += 301
    health.beat()
    verdict = health.liveness()
    assert verdict.reasons == ("watching pods has delivered nothing for 901s",)
    assert health.watch_ages() == {"pods": 901.0, "nodes": 301.0}


def test_a_failing_watch_is_readiness_business_never_liveness() -> None:
    clock = Clock()
    health = Health(clock=clock, watch_stuck_s=900)
    health.beat()
    health.started()
    health.watch_ok("pods")
    health.watch_failed("pods", "ConnectionRefusedError")  # the API server is down
    clock.now += 2000
    health.beat()
    assert health.liveness().ok
    assert not health.readiness().ok


def test_watch_ages_are_exported_at_scrape_time() -> None:
    from prometheus_client import generate_latest

    from tpuslice.runtime.metrics import Metrics

    clock = Clock()
    health = Health(clock=clock)
    metrics = Metrics()
    metrics.watch_ages_from(health.watch_ages)
    health.watch_ok("rayclusters")
    clock.now += 12.5
    text = generate_latest(metrics.registry).decode()
    assert 'tpuslice_watch_last_delivery_age_seconds{kind="rayclusters"} 12.5' in text
