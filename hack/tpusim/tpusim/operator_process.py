"""`tpuslice run` as a separate process next to a cluster, for e2e tests and benchmarks.

A real process, not an in-thread runner: tests SIGKILL it mid-flight, the
benchmark reads its RSS and CPU from /proc, and both run it against any cluster
a kubeconfig names. Its identity webhook listens on loopback and its
configuration points there by URL, which a local API server can reach.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tpusim.kube import wait_for
from tpusim.processes import free_port

__all__ = ["OperatorProcess"]


@dataclass
class OperatorProcess:
    kubeconfig: Path
    log_path: Path
    extra_args: Sequence[str] = ()
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
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== start {self.starts} =====\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tpuslice.cli",
                    "run",
                    f"--kubeconfig={self.kubeconfig}",
                    f"--liveness-port={self.health_port}",
                    f"--metrics-port={self.metrics_port}",
                    "--metrics-addr=127.0.0.1",
                    f"--webhook-port={self.webhook_port}",
                    "--webhook-addr=127.0.0.1",
                    f"--webhook-url=https://127.0.0.1:{self.webhook_port}",
                    f"--webhook-cert-dir={self.log_path.parent / 'webhook-certs'}",
                    *self.extra_args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.cwd,
            )
        self.starts += 1
        wait_for(
            self._healthy,
            timeout_s=timeout_s,
            what="operator /readyz",
            describe=lambda: self.tail(),
        )

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
