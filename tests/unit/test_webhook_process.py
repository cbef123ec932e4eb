"""``tpuslice webhook``: the admission webhooks served by a process of their own, with
no kopf and no Lease, and ``tpuslice run --webhook-port=0`` serving none."""

from __future__ import annotations

import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tpuslice.main.cli import main
from tpuslice.runtime.config import OperatorConfig


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_webhook_process_never_imports_kopf() -> None:
    """An admission flood must not share a GIL with kopf's loop: not even imported."""
    code = (
        "import sys; import tpuslice.main.cli, tpuslice.main.webhook_process; "
        "sys.exit(1 if 'kopf' in sys.modules else 0)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_webhook_flags_reach_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    import tpuslice.main.webhook_process

    seen: list[OperatorConfig] = []
    monkeypatch.setattr(tpuslice.main.webhook_process, "run_webhook", seen.append)
    monkeypatch.setenv("POD_NAMESPACE", "ops")
    flags = ["--webhook-service=hook", "--webhook-secret=certs", "--metrics-port=9001"]
    assert main(["webhook", *flags, "--webhook-failure-policy=Ignore"]) == 0
    (config,) = seen
    assert config.leader_elect is False  # no Lease: every replica serves
    assert (config.webhook_service, config.webhook_namespace) == ("hook", "ops")
    assert config.webhook_secret == "certs" and config.webhook_port == 9443
    assert config.webhook_failure_policy == "Ignore" and config.metrics_port == 9001


def test_the_webhook_process_needs_a_port(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["webhook", "--webhook-port=0"]) == 2
    assert "--webhook-port" in capsys.readouterr().err


def test_run_serves_no_webhook_when_told_it_runs_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    import tpuslice.main.app

    seen: list[Any] = []
    monkeypatch.setattr(tpuslice.main.app, "run_operator", seen.append)
    assert main(["run", "--webhook-port=0"]) == 0
    assert seen[0].webhook_port is None


def test_the_process_serves_probes_and_webhooks_then_drains(tmp_path: Path) -> None:
    """Ready once the server listens (nothing to list first); not ready from the stop
    on, while it drains; then every server is closed."""
    from tpuslice.main.webhook_process import run_webhook

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    health, hook = _free_port(), _free_port()
    config = OperatorConfig(
        kubeconfig=str(kubeconfig),
        leader_elect=False,
        liveness_port=health,
        metrics_port=None,
        webhook_port=hook,
        webhook_addr="127.0.0.1",
        webhook_cert_dir=str(tmp_path / "certs"),
        shutdown_drain_seconds=0.3,
    )
    stopping = threading.Event()
    thread = threading.Thread(target=run_webhook, args=(config, stopping), daemon=True)
    thread.start()

    def ready() -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=2) as r:
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return 0

    import time

    deadline = time.monotonic() + 20
    while ready() != 200:
        assert time.monotonic() < deadline, "never ready"
        time.sleep(0.05)
    assert (tmp_path / "certs" / "ca.crt").exists()  # a CA of its own: no Secret named
    stopping.set()
    while ready() == 200:
        assert time.monotonic() < deadline + 5, "still ready after the stop"
        time.sleep(0.02)
    thread.join(10)
    assert not thread.is_alive()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=1)
