"""`tpuslice run` as a separate process next to a cluster, for e2e tests and benchmarks.

A real process, not an in-thread runner: tests SIGKILL it mid-flight, the
benchmark reads its RSS and CPU from /proc, and both run it against any cluster
a kubeconfig names. Its identity webhook listens on loopback and its
configuration points there by URL (or at ``webhook_url``, a balancer in front
of several), which a local API server can reach.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tpusim.kube import wait_for
from tpusim.processes import free_port

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

    def start(self, timeout_s: float = 120) -> None:
        self.health_port = free_port()
        self.webhook_port = self.webhook_port or free_port()
        self.metrics_port = free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        identity = self.identity or f"e2e-{self.log_path.stem}"
        url = self.webhook_url or f"https://127.0.0.1:{self.webhook_port}"
        env = {**os.environ, "POD_NAME": identity, **self.env}
        env.pop("POD_NAMESPACE", None)  # the Lease's namespace comes from flags or kubeconfig
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== start {self.starts} =====\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [
                    str(tpuslice_command()),
                    "run",
                    f"--kubeconfig={self.kubeconfig}",
                    f"--liveness-port={self.health_port}",
                    f"--metrics-port={self.metrics_port}",
                    "--metrics-addr=127.0.0.1",
                    f"--webhook-port={self.webhook_port}",
                    "--webhook-addr=127.0.0.1",
                    f"--webhook-url={url}",
                    f"--webhook-cert-dir={self.cert_dir}",
                    *self.extra_args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.cwd,
                env=env,
            )
        self.starts += 1
        wait_for(
            self._healthy,
            timeout_s=timeout_s,
            what="operator /readyz",
            describe=lambda: self.tail(),
        )

    @property
    def cert_dir(self) -> Path:
        """This instance's own webhook certificates (two instances never share files)."""
        return self.log_path.parent / f"{self.log_path.stem}-webhook-certs"

    def _healthy(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"operator exited; log {self.log_path}:\n{self.tail()}")
        try:
            url = f"http://127.0.0.1:{self.health_port}/readyz"
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: no cleanup, no finalizers run, exactly like an OOM kill."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 30) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def metrics_text(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            return str(response.read().decode())

    def samples(self, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        """Every sample of metric ``name`` (e.g. ``tpuslice_api_requests_total``), by labels."""
        out: dict[tuple[tuple[str, str], ...], float] = {}
        for family in text_string_to_metric_families(self.metrics_text()):
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
        return sum(self.samples("tpuslice_webhook_admission_duration_seconds_count").values())

    def proc_stats(self) -> dict[str, float]:
        """Peak and current RSS (MiB) and user+system CPU seconds, from /proc."""
        assert self.proc is not None
        pid = self.proc.pid
        status = Path(f"/proc/{pid}/status").read_text()
        kib = {
            line.split(":")[0]: int(line.split()[1])
            for line in status.splitlines()
            if line.startswith(("VmHWM", "VmRSS"))
        }
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return {
            "peak_rss_mib": round(kib["VmHWM"] / 1024, 1),
            "rss_mib": round(kib["VmRSS"] / 1024, 1),
            "cpu_seconds": round((int(fields[11]) + int(fields[12])) / ticks, 2),
        }
