"""`tpuslice run` as a separate process next to a cluster, for e2e tests and benchmarks,
with the admission webhooks in a process of their own (`tpuslice webhook`), as the
chart runs them.

Real processes, not in-thread runners: tests SIGKILL the operator mid-flight, the
benchmark reads RSS and CPU from /proc, and both run them against any cluster a
kubeconfig names. The webhook process listens on loopback and its configuration
points there by URL (or at ``webhook_url``, a balancer in front of several),
which a local API server can reach; the operator runs with ``--webhook-port=0``.
``start``, ``stop`` and ``kill`` act on both, as on a pod; ``webhook=False`` starts
the operator alone (another instance's webhook stays the one configured).

It is started as users start it, by the ``tpuslice`` console script of this
interpreter's environment, never by a module path inside the operator: the
harness does not import the operator or depend on how its modules are laid out.

Leader election is on, as in ``tpuslice run``. Each OperatorProcess has an
identity (``POD_NAME``) that it keeps across restarts, as a pod keeps its name
when the kubelet restarts its container: a killed and restarted process leads
again at once instead of waiting out its own Lease, and two OperatorProcesses
are two instances, one of which waits as a standby.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tpusim.kube import wait_for
from tpusim.processes import cpu_seconds, free_port, kept_port

__all__ = ["OperatorProcess", "tpuslice_command"]


def tpuslice_command() -> Path:
    """The ``tpuslice`` console script installed next to this interpreter (``make install``
    puts it in .venv/bin); found by name, not resolved, so a venv's symlinked python
    still finds its own bin directory."""
    path = Path(sys.executable).with_name("tpuslice")
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing: the operator is not installed next to {sys.executable} "
            "(make install)"
        )
    return path


@dataclass
class OperatorProcess:
    kubeconfig: Path
    log_path: Path
    extra_args: Sequence[str] = ()
    #: POD_NAME, the Lease holder's name; default: from the log file's name.
    identity: str = ""
    #: The base URL the webhook configuration names; default: this process's own port.
    webhook_url: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    health_port: int = 0
    webhook_port: int = 0  # kept across restarts: the webhook configuration points at it
    metrics_port: int = 0
    starts: int = 0
    cwd: Path = field(default_factory=Path.cwd)
    #: Start `tpuslice webhook` next to the operator (False: the operator alone).
    webhook: bool = True
    #: Flags for `tpuslice webhook` only (e.g. --webhook-secret).
    webhook_args: Sequence[str] = ()
    #: The webhook process's kubeconfig (its own ServiceAccount's); default: ``kubeconfig``.
    webhook_kubeconfig: Path | None = None
    webhook_proc: subprocess.Popen[bytes] | None = None
    webhook_health_port: int = 0
    webhook_metrics_port: int = 0

    def start(self, timeout_s: float = 120, on_spawn: Callable[[int], None] | None = None) -> None:
        """Start the webhook process (when ``webhook``), then the operator, and wait until
        each is ready. ``on_spawn`` is called with the operator's pid as soon as it runs
        (a profiler that must see its start-up)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        identity = self.identity or f"e2e-{self.log_path.stem}"
        env = {**os.environ, "POD_NAME": identity, **self.env}
        env.pop("POD_NAMESPACE", None)  # the Lease's namespace comes from flags or kubeconfig
        if self.webhook:
            self._start_webhook(env, timeout_s)
        self.health_port = free_port()
        self.metrics_port = free_port()
        self.proc = self._spawn(
            self.log_path,
            [
                "run",
                *self._process_flags(self.health_port, self.metrics_port, self.kubeconfig),
                "--webhook-port=0",  # served by the webhook process
                *self.extra_args,
            ],
            env,
        )
        self.starts += 1
        if on_spawn is not None:
            on_spawn(self.proc.pid)
        wait_for(
            lambda: self._ready(self.proc, self.health_port, self.log_path),
            timeout_s=timeout_s,
            what="operator /readyz",
            describe=lambda: self.tail(),
        )

    def _start_webhook(self, env: Mapping[str, str], timeout_s: float) -> None:
        self.webhook_port = self.webhook_port or kept_port()
        self.webhook_health_port = free_port()
        self.webhook_metrics_port = free_port()
        url = self.webhook_url or f"https://127.0.0.1:{self.webhook_port}"
        self.webhook_proc = self._spawn(
            self.webhook_log_path,
            [
                "webhook",
                *self._process_flags(
                    self.webhook_health_port,
                    self.webhook_metrics_port,
                    self.webhook_kubeconfig or self.kubeconfig,
                ),
                f"--webhook-port={self.webhook_port}",
                "--webhook-addr=127.0.0.1",
                f"--webhook-url={url}",
                f"--webhook-cert-dir={self.cert_dir}",
                *self.webhook_args,
            ],
            {**env, "POD_NAME": f"{env['POD_NAME']}-webhook"},
        )
        wait_for(
            lambda: self._ready(self.webhook_proc, self.webhook_health_port, self.webhook_log_path),
            timeout_s=timeout_s,
            what="webhook /readyz",
            describe=lambda: self.tail(path=self.webhook_log_path),
        )

    @staticmethod
    def _process_flags(health_port: int, metrics_port: int, kubeconfig: Path) -> list[str]:
        return [
            f"--kubeconfig={kubeconfig}",
            f"--liveness-port={health_port}",
            f"--metrics-port={metrics_port}",
            "--metrics-addr=127.0.0.1",
        ]

    def _spawn(
        self, log_path: Path, args: Sequence[str], env: Mapping[str, str]
    ) -> subprocess.Popen[bytes]:
        with open(log_path, "ab") as log:
            log.write(f"\n===== start {self.starts} =====\n".encode())
            log.flush()
            return subprocess.Popen(
                [str(tpuslice_command()), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.cwd,
                env=dict(env),
            )

    @property
    def webhook_log_path(self) -> Path:
        return self.log_path.with_name(f"{self.log_path.stem}-webhook.log")

    @property
    def cert_dir(self) -> Path:
        """This instance's own webhook certificates (two instances never share files)."""
        return self.log_path.parent / f"{self.log_path.stem}-webhook-certs"

    def healthy(self) -> bool:
        """The operator answers /readyz with 200 (raises if it exited)."""
        return self._ready(self.proc, self.health_port, self.log_path)

    @staticmethod
    def _ready(proc: subprocess.Popen[bytes] | None, port: int, log: Path) -> bool:
        if proc is None or proc.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
            raise AssertionError(f"{log.stem} exited; log {log}:\n{tail}")
        try:
            url = f"http://127.0.0.1:{port}/readyz"
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def kill_operator(self) -> None:
        """SIGKILL the operator alone (the webhook process keeps answering)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop_operator(self, timeout_s: float = 30) -> None:
        """SIGTERM the operator alone (the webhook process keeps answering), as a rollout
        of the operator's Deployment does: the chart runs the webhook in its own."""
        _terminate(self.proc, timeout_s)

    def start_operator(
        self, timeout_s: float = 120, on_spawn: Callable[[int], None] | None = None
    ) -> None:
        """Start the operator alone again after ``kill_operator`` or ``stop_operator``."""
        webhook, self.webhook = self.webhook, False
        try:
            self.start(timeout_s, on_spawn)
        finally:
            self.webhook = webhook

    def restart_webhook(self, timeout_s: float = 120) -> None:
        """SIGKILL the webhook process and start it again on the same port."""
        if self.webhook_proc is not None and self.webhook_proc.poll() is None:
            os.killpg(self.webhook_proc.pid, signal.SIGKILL)
            self.webhook_proc.wait(timeout=10)
        identity = self.identity or f"e2e-{self.log_path.stem}"
        env = {**os.environ, "POD_NAME": identity, **self.env}
        env.pop("POD_NAMESPACE", None)
        self._start_webhook(env, timeout_s)

    def kill(self) -> None:
        """SIGKILL both: no cleanup, no finalizers run, exactly like an OOM kill."""
        for proc in (self.proc, self.webhook_proc):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def stop(self, timeout_s: float = 30) -> None:
        """SIGTERM the operator, then the webhook (it serves until the operator is gone)."""
        for proc in (self.proc, self.webhook_proc):
            _terminate(proc, timeout_s)

    def tail(self, lines: int = 30, path: Path | None = None) -> str:
        path = path or self.log_path
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def metrics_text(self, port: int | None = None) -> str:
        url = f"http://127.0.0.1:{port or self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            return str(response.read().decode())

    def samples(
        self, name: str, port: int | None = None
    ) -> dict[tuple[tuple[str, str], ...], float]:
        """Every sample of metric ``name`` (e.g. ``tpuslice_api_requests_total``), by labels,
        from the operator (or the process serving /metrics on ``port``)."""
        out: dict[tuple[tuple[str, str], ...], float] = {}
        for family in text_string_to_metric_families(self.metrics_text(port)):
            for sample in family.samples:
                if sample.name == name:
                    out[tuple(sorted(sample.labels.items()))] = sample.value
        return out

    def api_requests(self) -> dict[tuple[str, str], float]:
        """Requests this process sent, by (verb, resource) (docs/metrics.md)."""
        return {
            (dict(labels)["verb"], dict(labels)["resource"]): value
            for labels, value in self.samples("tpuslice_api_requests_total").items()
        }

    def leading(self) -> bool:
        """tpuslice_leader: this process holds the Lease (and acts)."""
        return self.samples("tpuslice_leader").get((), 0.0) == 1.0

    def admissions(self) -> float:
        """Admission calls its identity webhook answered (any result)."""
        name = "tpuslice_webhook_admission_duration_seconds_count"
        return sum(self.samples(name, self.webhook_metrics_port or None).values())

    def proc_stats(self, webhook: bool = False) -> dict[str, float]:
        """Peak and current RSS (MiB) and user+system CPU seconds, from /proc, of the
        operator (or of the webhook process)."""
        proc = self.webhook_proc if webhook else self.proc
        assert proc is not None
        pid = proc.pid
        status = Path(f"/proc/{pid}/status").read_text()
        kib = {
            line.split(":")[0]: int(line.split()[1])
            for line in status.splitlines()
            if line.startswith(("VmHWM", "VmRSS"))
        }
        return {
            "peak_rss_mib": round(kib["VmHWM"] / 1024, 1),
            "rss_mib": round(kib["VmRSS"] / 1024, 1),
            "cpu_seconds": round(cpu_seconds(pid) or 0.0, 2),
        }


def _terminate(proc: subprocess.Popen[bytes] | None, timeout_s: float) -> None:
    """SIGTERM a running process's group, and SIGKILL it if it has not ended in time."""
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
