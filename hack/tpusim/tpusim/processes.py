"""Start, probe and stop the control-plane processes.

Each component runs in its own session (its own process group) so it can be
stopped as a group and so a Ctrl-C in the terminal reaches the harness, which
then stops components in order, instead of killing them all mid-write. When the
harness owns the cluster (tests), children also get PR_SET_PDEATHSIG so even a
SIGKILLed harness leaves nothing behind; `make dev-cluster` turns that off
because its cluster must outlive the command.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ComponentError",
    "Process",
    "cpu_seconds",
    "exit_on_signals",
    "free_port",
    "http_ok",
    "kill_recorded",
    "log_excerpt",
    "start",
    "tail",
    "wait_until",
]

_PR_SET_PDEATHSIG = 1


def log_excerpt(log: Path | None, lines: int) -> str:
    """``; log: PATH`` and its last ``lines`` lines, for an error message ("" without a log)."""
    if log is None:
        return ""
    last = tail(log, lines)
    return f"; log: {log}" + (f"\n--- last lines of {log} ---\n{last}" if last else "")


class ComponentError(RuntimeError):
    """A component failed to start or become ready; names it and its log."""

    def __init__(self, component: str, log: Path | None, reason: str) -> None:
        super().__init__(f"{component}: {reason}{log_excerpt(log, 15)}")
        self.component = component
        self.log = log


@dataclass
class Process:
    """A running component: its name, process and log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    argv: tuple[str, ...]

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL it after ``grace_s``."""
        _signal_group(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=5)
        # Any stray children left in the group.
        _signal_group(self.popen.pid, signal.SIGKILL)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def start(
    name: str,
    argv: Sequence[str],
    log_dir: Path,
    *,
    env: Mapping[str, str] | None = None,
    die_with_parent: bool = True,
) -> Process:
    """Start ``argv`` in a new session with stdout+stderr appended to ``<log_dir>/<name>.log``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    with log.open("ab") as out:
        out.write(f"# {' '.join(argv)}\n".encode())
        out.flush()
        try:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=full_env,
                start_new_session=True,
                preexec_fn=_die_with_parent if die_with_parent else None,
            )
        except OSError as exc:
            raise ComponentError(name, log, f"cannot execute {argv[0]}: {exc}") from exc
    return Process(name, popen, log, tuple(argv))


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of one process (fields 14 and 15 of ``/proc/<pid>/stat``, proc(5)),
    None once it has exited."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    """A loopback TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


#: Where Linux takes the local ports of outgoing connections (its default low end);
#: Documentation/networking/ip-sysctl.rst, ip_local_port_range.
EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_LOW = 32768


def kept_port() -> int:
    """A loopback TCP port free now, below the range the kernel takes outgoing
    connections' local ports from: for a port a process binds again after a restart
    (the webhook's, which its configuration names). A port the OS picks (``free_port``)
    lies in that range, and while the process is down any outgoing connection on the
    machine may take it, so the restarted process cannot bind it."""
    try:
        low = int(EPHEMERAL_PORTS.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = DEFAULT_EPHEMERAL_LOW
    candidates = list(range(max(1024, low - 8192), low))
    random.shuffle(candidates)
    for port in candidates[:256]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return free_port()


def http_ok(url: str, context: ssl.SSLContext | None = None, timeout_s: float = 3.0) -> bool:
    """True when GET ``url`` answers 200 (connection errors are just 'not yet')."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s, context=context) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False


def wait_until(
    check: Callable[[], bool],
    *,
    timeout_s: float,
    what: str,
    process: Process | None = None,
    interval_s: float = 0.25,
) -> float:
    """Poll ``check`` until it is true; return seconds waited.

    Fails fast with the component's log if its process exits, and with the
    component named when the timeout passes.
    """
    began = time.monotonic()
    name = process.name if process else what
    log = process.log if process else None
    while True:
        if process is not None and not process.alive():
            code = process.popen.returncode
            raise ComponentError(name, log, f"exited with code {code} while waiting for {what}")
        if check():
            return time.monotonic() - began
        if time.monotonic() - began > timeout_s:
            raise ComponentError(name, log, f"{what} not reached within {timeout_s:.0f}s")
        time.sleep(interval_s)


def tail(path: Path | None, lines: int) -> str:
    """The last ``lines`` lines of a log file (empty if it does not exist)."""
    if path is None or not path.exists():
        return ""
    with path.open("rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - 64 * 1024))
        data = fh.read().decode(errors="replace")
    return "\n".join(data.splitlines()[-lines:])


def kill_recorded(pid: int, exe: str, grace_s: float = 10.0) -> bool:
    """Stop a process recorded by an earlier run, if ``pid`` still runs ``exe``.

    Checks /proc/<pid>/cmdline first so a recycled pid is never killed.
    Returns True if something was stopped.
    """
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return False
    if cmdline != exe:
        return False
    _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists() or _is_zombie(pid):
            break
        time.sleep(0.1)
    else:
        _signal_group(pid, signal.SIGKILL)
    _signal_group(pid, signal.SIGKILL)
    return True


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def exit_on_signals(signals: Sequence[int] = (signal.SIGTERM, signal.SIGHUP)) -> None:
    """Make SIGTERM/SIGHUP behave like Ctrl-C, so `finally` blocks and atexit stop the cluster.

    KeyboardInterrupt rather than SystemExit because pytest treats it as "stop
    the session" (running fixture teardown) instead of failing one test and
    going on. Only replaces default handlers, and only in the main thread.
    """
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def _interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in signals:
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, _interrupt)
