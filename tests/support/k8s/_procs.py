"""Processes the launcher starts: each in its own session (so a stop reaches its whole
group), output in a log file, stopped by pid; and waiting on conditions with a deadline."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence, TypeVar

from ._errors import ClusterError

T = TypeVar("T")
_TICKS = os.sysconf("SC_CLK_TCK")


def _ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for the local end of outgoing connections (and for bind to 0)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    return low, high


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, which the caller binds soon after. Drawn outside the
    kernel's ephemeral range: a port the kernel picks there can become the local end of
    some outgoing connection before the caller binds it (etcd once failed at start so,
    `bind: address already in use`); drawn at random, so callers at once rarely meet."""
    low, high = _ephemeral_ports()
    ports = range(10000, low) if low > 11000 else range(high + 1, 65536)
    for _ in range(100):
        port = random.choice(ports)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:  # in use: another draw
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # every draw taken: the kernel's pick
        s.bind((host, 0))
        return s.getsockname()[1]


class Process:
    """One started component: `stop()` ends its process group (SIGTERM, then SIGKILL)."""

    def __init__(self, name: str, argv: Sequence[str], log: Path, *,
                 env: Mapping[str, str] | None = None, cwd: Path | None = None) -> None:
        self.name, self.argv, self.log = name, list(argv), log
        with log.open("ab") as out:
            self.popen = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                          env=dict(env) if env is not None else None, cwd=cwd,
                                          start_new_session=True)
        self.pid = self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 25) -> str:
        try:
            data = self.log.read_bytes()[-16384:].decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(data.splitlines()[-lines:])

    def cpu_seconds(self) -> float:
        """User + system CPU time the process has used so far (/proc/PID/stat)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS

    def stop(self, timeout: float = 15.0) -> None:
        if self.popen.poll() is not None:
            return
        self._signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.popen.wait(10)
        # Whatever it left in its group (it was its session leader) goes too.
        self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def failure(self, what: str) -> ClusterError:
        state = f"exited {self.popen.returncode}" if not self.alive() else "still running"
        return ClusterError(f"{self.name} {what} ({state}); log {self.log}, last lines:\n{self.tail()}")


def wait_for(check: Callable[[], T | None], timeout: float, what: str, *,
              watch: Sequence[Process] = (), interval: float = 0.05) -> T:
    """Poll `check` until it returns a truthy value; fail early when a watched process dies."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        for proc in watch:
            if not proc.alive():
                raise proc.failure(f"exited while waiting for {what}")
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - a check that is not true yet
            last = exc
        if time.monotonic() > deadline:
            detail = f" (last error: {last})" if last else ""
            if watch:
                raise watch[-1].failure(f"not ready: {what} after {timeout:.0f} s{detail}")
            raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}{detail}")
        time.sleep(interval)
