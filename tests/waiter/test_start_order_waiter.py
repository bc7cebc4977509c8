"""`waiter start-after` as real processes: ordering on HTTP and TCP readiness, markers
whose lock lives as long as the user's process, the ready-file fallback, exec replacement."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.support.waiter_support import PYTHON, ROOT, SOURCE_WAITER, wait_for, waiter_env
from waiter import protocol as p
from waiter.startafter import marker_alive, write_marker

# Records its PID, opens a TCP port if asked, and exits 7 with a note on SIGTERM.
APP = textwrap.dedent("""
    import os, signal, socket, sys, time
    out, port = sys.argv[1], int(sys.argv[2])
    def term(sig, frame):
        open(out + ".term", "w").write("TERM")
        sys.exit(7)
    signal.signal(signal.SIGTERM, term)
    if port:
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port)); s.listen()
    open(out + ".tmp", "w").write(str(os.getpid())); os.rename(out + ".tmp", out)
    while True:
        time.sleep(1)
""")

# Answers 503 until the file argv[2] exists, then 200.
READINESS_SERVER = textwrap.dedent("""
    import http.server, os, sys
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if os.path.exists(sys.argv[2]) else 503); self.end_headers()
        def log_message(self, *a): pass
    srv = http.server.HTTPServer(("127.0.0.1", 0), H)
    open(sys.argv[1] + ".tmp", "w").write(str(srv.server_address[1])); os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    srv.serve_forever()
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_after(*flags: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([*SOURCE_WAITER, p.CMD_START_AFTER, *flags, p.ARGV_SEPARATOR, *argv],
                            env=env or waiter_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)


def app(out: Path, port: int = 0) -> list[str]:
    return [PYTHON, "-c", APP, str(out), str(port)]


class StderrLines:
    """Reads a process's stderr lines as they come, without blocking the test on EOF."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.lines, self._buf = proc, [], b""
        os.set_blocking(proc.stderr.fileno(), False)

    def text(self) -> str:
        try:
            while chunk := os.read(self.proc.stderr.fileno(), 65536):
                self._buf += chunk
        except BlockingIOError:
            pass
        return self._buf.decode()


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for f in (proc.stdout, proc.stderr):
            if f:
                f.close()


def test_three_containers_start_in_declared_order(tmp_path: Path, procs) -> None:
    ready_flag, port_file = tmp_path / "a-ready", tmp_path / "a-port"
    server = subprocess.Popen([PYTHON, "-c", READINESS_SERVER, str(port_file), str(ready_flag)])
    procs.append(server)
    wait_for(port_file.exists, "the first container's readiness endpoint")
    a_port, b_port = int(port_file.read_text()), free_port()
    b_out, c_out = tmp_path / "b.pid", tmp_path / "c.pid"
    b = start_after(p.FLAG_NAME, "b", p.FLAG_PROBE, f"http://127.0.0.1:{a_port}/healthz", argv=app(b_out, b_port))
    c = start_after(p.FLAG_NAME, "c", p.FLAG_PROBE, f"tcp://127.0.0.1:{b_port}", argv=app(c_out))
    procs += [b, c]
    b_err, c_err = StderrLines(b), StderrLines(c)
    wait_for(lambda: "waiting for" in b_err.text(), "b to say it waits")
    wait_for(lambda: "waiting for" in c_err.text(), "c to say it waits")
    assert not b_out.exists() and not c_out.exists()  # both wait while the first answers 503

    ready_flag.touch()
    wait_for(b_out.exists, "b to start once the first answers 200")
    wait_for(c_out.exists, "c to start once b's port opens")
    # exec replacement: the user's process is the waiter's process
    assert int(b_out.read_text()) == b.pid
    assert int(c_out.read_text()) == c.pid
    assert "waiter[c]" in c_err.text() and f"tcp://127.0.0.1:{b_port}" in c_err.text()

    # signals arrive directly at the user's process, and its exit code is the container's
    c.send_signal(signal.SIGTERM)
    assert c.wait(timeout=20) == 7
    assert (tmp_path / "c.pid.term").read_text() == "TERM"


def test_program_starts_with_default_signal_dispositions(tmp_path: Path) -> None:
    proc = start_after(argv=["cat", "/proc/self/status"])
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    status = dict(line.split(":", 1) for line in out.decode().splitlines() if ":" in line)
    # glibc reserves signals 32 and 33 (no Python API can reset them); a parent such as make
    # may hand them down ignored. Every signal the waiter can reach must be at its default.
    reachable = sum(1 << (int(s) - 1) for s in signal.valid_signals())
    for field in ("SigIgn", "SigCgt", "SigBlk"):
        assert int(status[field].strip(), 16) & reachable == 0, (field, status[field])


def test_marker_lives_as_long_as_the_users_process(tmp_path: Path, procs) -> None:
    marker, out = tmp_path / "cache", tmp_path / "cache.pid"
    cache = start_after(p.FLAG_NAME, "cache", p.FLAG_MARKER, str(marker), argv=app(out))
    procs.append(cache)
    wait_for(out.exists, "the probe-less container to start")
    assert marker_alive(str(marker))
    assert json.loads(marker.read_text())[p.RECORD_NAME] == "cache"

    # A restarted dependent starts at once: what it depends on is running.
    first = start_after(p.FLAG_AFTER_MARKER, str(marker), argv=["true"])
    assert first.wait(timeout=30) == 0
    assert b"waiting for" not in first.stderr.read()
    first.stderr.close()
    first.stdout.close()

    cache.kill()
    cache.wait()
    assert marker.exists() and not marker_alive(str(marker))  # left over, but not running
    again = start_after(p.FLAG_AFTER_MARKER, str(marker), p.FLAG_MAX_WAIT, "0.5", argv=["true"])
    _, err = again.communicate(timeout=30)
    assert again.returncode == p.EXIT_TIMED_OUT
    assert "container 'cache' started" in err.decode()


def test_marker_written_by_a_restarted_container_replaces_the_stale_one(tmp_path: Path) -> None:
    marker = tmp_path / "m"
    fd = write_marker(str(marker), "m")
    os.close(fd)  # the "process" ended
    assert not marker_alive(str(marker))
    fd = write_marker(str(marker), "m")
    try:
        assert marker_alive(str(marker))
    finally:
        os.close(fd)


def test_waiter_waits_for_a_marker_that_appears_later(tmp_path: Path, procs) -> None:
    marker, out = tmp_path / "db", tmp_path / "app.pid"
    dependent = start_after(p.FLAG_AFTER_MARKER, str(marker), argv=app(out))
    procs.append(dependent)
    err = StderrLines(dependent)
    wait_for(lambda: "waiting for" in err.text(), "the dependent to wait")
    db = start_after(p.FLAG_MARKER, str(marker), argv=app(tmp_path / "db.pid"))
    procs.append(db)
    wait_for(out.exists, "the dependent to start after the marker")
    assert int(out.read_text()) == dependent.pid


def test_ready_file_fallback_needs_true(tmp_path: Path, procs) -> None:
    ready = tmp_path / "proxy"
    ready.write_text("false")
    out = tmp_path / "app.pid"
    proc = start_after(p.FLAG_AFTER_READY_FILE, str(ready), argv=app(out))
    procs.append(proc)
    err = StderrLines(proc)
    wait_for(lambda: "waiting for" in err.text(), "the container to wait")
    assert not out.exists()
    (tmp_path / "tmp").write_text("true")
    os.rename(tmp_path / "tmp", ready)
    wait_for(out.exists, "the container to start once the annotation says true")


def test_still_waiting_lines_and_max_wait(tmp_path: Path) -> None:
    proc = start_after(p.FLAG_NAME, "app", p.FLAG_PROBE, f"tcp://127.0.0.1:{free_port()}",
                       p.FLAG_MAX_WAIT, "1.5", p.FLAG_LOG_INTERVAL, "0.2", argv=["true"])
    _, err = proc.communicate(timeout=30)
    text = err.decode()
    assert proc.returncode == p.EXIT_TIMED_OUT
    assert "waiter[app]: still waiting after" in text
    assert "gave up after 1.5s (--max-wait) still waiting for: readiness probe tcp://" in text
    assert "Traceback" not in text


def test_sigterm_while_waiting_stops_without_running(tmp_path: Path) -> None:
    out = tmp_path / "never"
    proc = start_after(p.FLAG_PROBE, f"tcp://127.0.0.1:{free_port()}", argv=app(out))
    err = StderrLines(proc)
    wait_for(lambda: "waiting for" in err.text(), "the wait")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == p.EXIT_SIGNAL_BASE + signal.SIGTERM
    wait_for(lambda: "SIGTERM while waiting" in err.text(), "the message")
    proc.stdout.close()
    proc.stderr.close()
    assert not out.exists()


def test_command_from_the_containers_path_and_exec_errors(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "mytool"
    tool.write_text("#!/bin/sh\necho from-path \"$@\"\n")
    tool.chmod(0o755)
    env = waiter_env(PATH=f"{bin_dir}:/usr/bin:/bin")
    ok = subprocess.run([*SOURCE_WAITER, p.CMD_START_AFTER, "--", "mytool", "a b"], env=env, capture_output=True,
                        cwd=ROOT, timeout=30)
    assert ok.returncode == 0 and ok.stdout == b"from-path a b\n"
    missing = subprocess.run([*SOURCE_WAITER, p.CMD_START_AFTER, "--", "no-such-tool"], env=env,
                             capture_output=True, cwd=ROOT, timeout=30)
    assert missing.returncode == p.EXIT_NOT_FOUND
    assert missing.stderr.decode().strip() == "waiter: no-such-tool: command not found in PATH"
    tool.chmod(0o644)
    denied = subprocess.run([*SOURCE_WAITER, p.CMD_START_AFTER, "--", str(tool)], env=env, capture_output=True,
                            cwd=ROOT, timeout=30)
    assert denied.returncode == p.EXIT_CANNOT_EXEC  # no x bit at all: even root gets EACCES
    assert "cannot execute: permission denied" in denied.stderr.decode()


@pytest.mark.parametrize("flags, message", [
    (["--bogus", "x"], "unknown flag '--bogus'"),
    ([p.FLAG_MAX_WAIT, "soon"], "--max-wait 'soon' is not a number of seconds"),
    ([p.FLAG_MAX_WAIT, "-1"], "--max-wait must be a positive number of seconds"),
    ([p.FLAG_PROBE, "ftp://127.0.0.1:1/"], "--probe 'ftp://127.0.0.1:1/': scheme must be one of"),
    ([p.FLAG_NAME, "a", p.FLAG_NAME, "b"], "--name given twice"),
    ([p.FLAG_MARKER], "--marker needs a value"),
])
def test_bad_flags_are_one_line(flags: list[str], message: str) -> None:
    proc = subprocess.run([*SOURCE_WAITER, p.CMD_START_AFTER, *flags, "--", "true"], env=waiter_env(),
                          capture_output=True, cwd=ROOT, timeout=30)
    err = proc.stderr.decode()
    assert proc.returncode == p.EXIT_USAGE
    assert message in err and len(err.strip().splitlines()) == 1


def test_missing_separator_and_command() -> None:
    for args in ([p.FLAG_NAME, "x"], [p.FLAG_NAME, "x", "--"]):
        proc = subprocess.run([*SOURCE_WAITER, p.CMD_START_AFTER, *args], env=waiter_env(), capture_output=True,
                              cwd=ROOT, timeout=30)
        assert proc.returncode == p.EXIT_USAGE and len(proc.stderr.splitlines()) == 1


def test_argv_map_picks_this_platform(tmp_path: Path) -> None:
    from waiter.argvmap import platform_keys

    table = {platform_keys()[-1]: ["echo", "right"], "plan9/mips": ["echo", "wrong"]}
    proc = subprocess.run([*SOURCE_WAITER, p.CMD_START_AFTER, p.FLAG_ARGV_MAP, json.dumps(table), "--"],
                          env=waiter_env(), capture_output=True, cwd=ROOT, timeout=30)
    assert proc.returncode == 0 and proc.stdout == b"right\n", proc.stderr


def test_help_lists_start_after() -> None:
    out = subprocess.run([*SOURCE_WAITER, "--help"], env=waiter_env(), capture_output=True, cwd=ROOT, timeout=30)
    assert p.CMD_START_AFTER in out.stdout.decode()
