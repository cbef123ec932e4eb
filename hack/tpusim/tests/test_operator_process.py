"""OperatorProcess starts the operator by its console script, as users do, with the
flags that point it at a local cluster; a stand-in script answers for the operator."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from tpusim.operator_process import OperatorProcess, tpuslice_command
from tpusim.processes import EPHEMERAL_PORTS, kept_port

# Records its command line (a file per command), then answers /readyz on
# --liveness-port like the operator.
STAND_IN = """\
#!{python}
import http.server, json, os, sys
args = sys.argv[1:]
with open(os.environ["ARGV_FILE"] + "." + args[0], "w") as f:
    json.dump(args, f)
port = int(next(a.split("=", 1)[1] for a in args if a.startswith("--liveness-port=")))
class Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Ready).serve_forever()
"""


def _venv_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A bin directory that sys.executable points into (the python itself need not exist)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    return bin_dir


def test_the_command_is_the_console_script_beside_the_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = _venv_bin(tmp_path, monkeypatch)
    with pytest.raises(FileNotFoundError, match="make install"):
        tpuslice_command()
    (bin_dir / "tpuslice").write_text("")
    assert tpuslice_command() == bin_dir / "tpuslice"


def test_start_runs_tpuslice_run_and_its_webhook_against_the_kubeconfig(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python = sys.executable
    script = _venv_bin(tmp_path, monkeypatch) / "tpuslice"
    script.write_text(STAND_IN.format(python=python))
    script.chmod(0o755)
    argv_file = tmp_path / "argv.json"
    operator = OperatorProcess(
        tmp_path / "kubeconfig",
        tmp_path / "logs" / "op.log",
        extra_args=("--log-level=WARNING",),
        webhook_args=("--webhook-secret=certs",),
        env={"ARGV_FILE": str(argv_file)},
        cwd=tmp_path,
    )
    try:
        operator.start(timeout_s=30)
    finally:
        operator.stop()
    args = json.loads((tmp_path / "argv.json.run").read_text())
    assert args[0] == "run"
    assert f"--kubeconfig={tmp_path / 'kubeconfig'}" in args
    assert f"--liveness-port={operator.health_port}" in args
    assert "--webhook-port=0" in args  # the webhook runs apart
    assert args[-1] == "--log-level=WARNING"
    hook = json.loads((tmp_path / "argv.json.webhook").read_text())
    assert hook[0] == "webhook"
    assert f"--kubeconfig={tmp_path / 'kubeconfig'}" in hook
    assert f"--liveness-port={operator.webhook_health_port}" in hook
    assert f"--webhook-port={operator.webhook_port}" in hook
    assert f"--webhook-url=https://127.0.0.1:{operator.webhook_port}" in hook
    assert f"--webhook-cert-dir={tmp_path / 'logs' / 'op-webhook-certs'}" in hook
    assert hook[-1] == "--webhook-secret=certs"
    assert (tmp_path / "logs" / "op-webhook.log").exists()


def test_without_the_webhook_the_operator_starts_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python = sys.executable
    script = _venv_bin(tmp_path, monkeypatch) / "tpuslice"
    script.write_text(STAND_IN.format(python=python))
    script.chmod(0o755)
    operator = OperatorProcess(
        tmp_path / "kubeconfig",
        tmp_path / "logs" / "op.log",
        env={"ARGV_FILE": str(tmp_path / "argv.json")},
        webhook=False,
        cwd=tmp_path,
    )
    try:
        operator.start(timeout_s=30)
    finally:
        operator.stop()
    assert (tmp_path / "argv.json.run").exists()
    assert not (tmp_path / "argv.json.webhook").exists()


def test_the_webhooks_port_kept_across_restarts_lies_below_the_ephemeral_range() -> None:
    """No outgoing connection can take it while the webhook process restarts."""
    low = int(EPHEMERAL_PORTS.read_text().split()[0])
    port = kept_port()
    assert 1024 <= port < low
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))  # free when returned
