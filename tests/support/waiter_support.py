"""Helpers for the waiter tests: run real waiter processes (from source or frozen) and
read what they leave behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from waiter import protocol as p
from waiter.signals import TERMINATING

ROOT = Path(__file__).resolve().parents[2]
DIST = ROOT / "dist" / p.WAITER_DIR_NAME
SOURCE_WAITER = [sys.executable, "-m", "waiter"]
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def waiter_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def run_args(post: Path, *flags: str, argv: list[str] | list[bytes] | None = None) -> list:
    return [p.CMD_RUN, p.FLAG_POST, str(post), *flags, p.ARGV_SEPARATOR, *(argv or [])]


def start(post: Path, *flags: str, argv=None, env=None, **kw) -> subprocess.Popen:
    """A source waiter as a real process."""
    return subprocess.Popen([*SOURCE_WAITER, *run_args(post, *flags, argv=argv)],
                            env=env or waiter_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT, **kw)


def run(post: Path, *flags: str, argv=None, env=None, timeout: float = 60) -> subprocess.CompletedProcess:
    proc = start(post, *flags, argv=argv, env=env)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def record(path: Path) -> dict:
    data = path.read_bytes()
    assert len(data) < p.TERMINATION_MESSAGE_LIMIT
    return json.loads(data)


def wait_for(predicate, what: str, limit: float = 20.0) -> None:
    """Wait for a condition a real process brings about; the limit only stops a hung test."""
    end = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.02)


# The waiter's signal mask between the start of its code and its handlers.
HELD = sum(1 << (sig - 1) for sig in TERMINATING)


def parse_status(text: str) -> dict[str, str]:
    """The fields of a /proc/PID/status text (read here, or through `kubectl exec`)."""
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def proc_status(pid: int) -> dict[str, str]:
    """/proc/PID/status as fields; empty once the process is gone."""
    try:
        return parse_status(Path(f"/proc/{pid}/status").read_text())
    except OSError:
        return {}


def has_signal(status: dict[str, str], field: str, sig: int) -> bool:
    """sig is in a mask field of a status (SigCgt, SigBlk, ShdPnd...)."""
    return bool(int(status.get(field, "0"), 16) & (1 << (sig - 1)))


def holding(status: dict[str, str]) -> bool:
    """The process blocks exactly the waiter's start set (libc blocks every signal for a
    moment around a spawn: that is not it)."""
    return int(status.get("SigBlk", "0"), 16) == HELD


def catches(pid: int, sig: int) -> bool:
    """The process has a handler for sig (SigCgt in /proc): the waiter is past its start-up."""
    return has_signal(proc_status(pid), "SigCgt", sig)


def step_dirs(tmp: Path, n: int) -> list[Path]:
    dirs = [tmp / f"run{i}" for i in range(n)]
    for d in dirs:
        d.mkdir()
    return dirs


def _stale(exe: Path) -> bool:
    if not exe.exists():
        return True
    built = exe.stat().st_mtime
    return any(src.stat().st_mtime > built for src in (ROOT / "waiter").glob("*.py"))


def ensure_bundle() -> Path:
    """dist/waiter, built now when missing or older than the sources (as `make waiter` would)."""
    if _stale(DIST / p.WAITER_EXE_NAME):
        from waiter import build

        try:
            build.build(str(DIST))
        except build.BuildError as exc:
            raise AssertionError(f"dist/waiter is missing and could not be built: {exc}") from None
    return DIST
