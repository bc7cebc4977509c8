"""Step 0's ready gate (downward-API file, loopback probes) and the quit endpoints, against
real servers on 127.0.0.1 and real waiter processes."""

from __future__ import annotations

import http.server
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from waiter import protocol as p
from tests.support.waiter_support import catches, record, run, start, wait_for

DONE = p.COMPLETION_FILE_NAME


class Server:
    """HTTP on 127.0.0.1: GET answers `status` (each GET is logged with its monotonic time
    and the status it got); POSTs are counted."""

    def __init__(self) -> None:
        self.status = 503
        self.posts: list[str] = []
        self.gets: list[tuple[float, int]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.gets.append((time.monotonic(), outer.status))
                self.send_response(outer.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                outer.posts.append(self.path)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture
def server():
    s = Server()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


def kubelet_update(volume: Path, name: str, content: str, generation: int) -> None:
    """Write a downward-API file the way kubelet does: a new timestamped dir, a `..data`
    symlink swapped atomically, and `name` -> `..data/name`."""
    gen = volume / f"..gen{generation}"
    gen.mkdir()
    (gen / name).write_text(content)
    tmp = volume / "..data_tmp"
    tmp.symlink_to(gen.name)
    os.rename(tmp, volume / "..data")
    if not (volume / name).is_symlink():
        (volume / name).symlink_to(f"..data/{name}")


def test_ready_file_gate_opens_on_kubelet_swap(tmp_path: Path) -> None:
    volume = tmp_path / "ready"
    volume.mkdir()
    kubelet_update(volume, p.READY_FILE_NAME, "", 1)  # annotation absent: empty file
    marker = tmp_path / "ran"
    proc = start(tmp_path / DONE, p.FLAG_READY_FILE, str(volume / p.READY_FILE_NAME),
                 argv=["touch", str(marker)])
    wait_for(lambda: catches(proc.pid, signal.SIGTERM), "waiter start")
    assert proc.poll() is None and not marker.exists()
    kubelet_update(volume, p.READY_FILE_NAME, p.READY_TRUE, 2)
    assert proc.wait(timeout=30) == 0
    assert marker.exists()
    proc.stdout.close()
    proc.stderr.close()


def test_probes_gate_opens_when_every_probe_passes(tmp_path: Path, server: Server) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    tcp = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
    marker = tmp_path / "ran"
    proc = start(tmp_path / DONE, p.FLAG_READY_FILE, str(tmp_path / "absent" / "ready"),
                 p.FLAG_PROBE, server.url("/healthz/ready"), p.FLAG_PROBE, tcp,
                 argv=["touch", str(marker)])
    wait_for(lambda: catches(proc.pid, signal.SIGTERM), "waiter start")
    assert proc.poll() is None and not marker.exists()
    server.status = 200
    assert proc.wait(timeout=30) == 0
    assert marker.exists()
    listener.close()
    proc.stdout.close()
    proc.stderr.close()


def test_a_sigterm_during_the_passing_probe_does_not_start_the_command(tmp_path: Path) -> None:
    """The pod is stopped while step 0's probe that passes is in flight: the SIGTERM was
    queued, the gate opened, and the command started only to be sent it at once (recorded
    as the step's own failure, `killed by SIGTERM`, or it ran). It is `Stopped` instead."""
    from tests.support.waiter_support import has_signal, proc_status

    listener = socket.create_server(("127.0.0.1", 0))
    marker = tmp_path / "ran"
    proc = start(tmp_path / DONE, p.FLAG_PROBE, f"http://127.0.0.1:{listener.getsockname()[1]}/ready",
                 argv=["touch", str(marker)])
    conn, _ = listener.accept()
    conn.recv(4096)  # the probe's request: the waiter now waits for the answer
    os.kill(proc.pid, signal.SIGTERM)
    wait_for(lambda: not any(has_signal(proc_status(proc.pid), field, signal.SIGTERM)
                             for field in ("SigPnd", "ShdPnd")), "the SIGTERM to be delivered")
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    conn.close()
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert record(tmp_path / DONE)[p.RECORD_REASON] == p.REASON_STOPPED
    assert not marker.exists()
    listener.close()
    proc.stdout.close()
    proc.stderr.close()


def test_the_gate_opens_on_the_first_probe_that_passes(tmp_path: Path, server: Server) -> None:
    """The probe turning ready is seen by the next probe, which opens the gate: the step
    starts after exactly one successful probe, and no probe follows."""
    marker = tmp_path / "ran"
    proc = start(tmp_path / DONE, p.FLAG_PROBE, server.url("/ready"), argv=["touch", str(marker)])
    wait_for(lambda: len(server.gets) >= 3, "a few failing probes")
    assert not marker.exists()
    server.status = 200
    assert proc.wait(timeout=30) == 0
    assert marker.exists()
    assert [status for _, status in server.gets].count(200) == 1 and server.gets[-1][1] == 200
    proc.stdout.close()
    proc.stderr.close()


def polls_allowed(seconds: float) -> int:
    """How many polls the gate's schedule fits in `seconds` if probes took no time at all:
    an upper bound for a real waiter, whose probes and wake-ups only add to each interval."""
    from waiter.gate import poll_interval

    rounds, elapsed = 0, 0.0
    while elapsed <= seconds:
        elapsed += poll_interval(rounds, elapsed)
        rounds += 1
    return rounds + 1  # the first probe comes before any interval


def test_probe_polling_backs_off_while_the_sidecar_is_not_ready(tmp_path: Path, server: Server) -> None:
    """A sidecar that stays unready is probed on the backoff schedule: never more often than
    it allows (and far less often than the first, few-ms interval would), until stopped."""
    proc = start(tmp_path / DONE, p.FLAG_PROBE, server.url("/ready"), argv=["true"])
    wait_for(lambda: len(server.gets) >= 10, "the waiter probing")
    wait_for(lambda: server.gets[-1][0] - server.gets[0][0] >= 0.5, "half a second of probing")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) != 0
    times = [t for t, _ in server.gets]
    span = times[-1] - times[0]
    assert len(times) <= polls_allowed(span)
    assert len(times) < span / p.GATE_POLL_FIRST / 2  # it did back off from the first interval
    assert not (tmp_path / "ran").exists()
    proc.stdout.close()
    proc.stderr.close()


def test_unreachable_probe_keeps_the_gate_closed_until_the_ready_file(tmp_path: Path) -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    volume = tmp_path / "ready"
    volume.mkdir()
    proc = start(tmp_path / DONE, p.FLAG_READY_FILE, str(volume / "ready"),
                 p.FLAG_PROBE, f"http://127.0.0.1:{port}/", argv=["true"])
    wait_for(lambda: catches(proc.pid, signal.SIGTERM), "waiter start")
    assert proc.poll() is None
    kubelet_update(volume, "ready", "true", 1)
    assert proc.wait(timeout=30) == 0
    proc.stdout.close()
    proc.stderr.close()


def mains_flags(mains: Path, name: str, count: int, quit_url: str) -> list[str]:
    return [p.FLAG_NAME, name, p.FLAG_QUIT, quit_url, p.FLAG_MAINS_DIR, str(mains), p.FLAG_MAINS, str(count)]


def test_last_main_quits_the_sidecars(tmp_path: Path, server: Server) -> None:
    mains, a, b = tmp_path / "mains", tmp_path / "a", tmp_path / "b"
    for d in (mains, a, b):
        d.mkdir()
    quit_url = server.url("/quitquitquit")
    res = run(a / DONE, *mains_flags(mains, "main-a", 2, quit_url), argv=["true"])
    assert res.returncode == 0 and server.posts == []  # the other main still runs
    assert "leaving the sidecars" in res.stderr.decode()
    assert sorted(os.listdir(mains)) == ["main-a"]  # its record, under its own name
    # The other main finishes last (failing): it finds both records and quits.
    res = run(b / DONE, *mains_flags(mains, "main-b", 2, quit_url), argv=["sh", "-c", "exit 3"])
    assert res.returncode == 3
    assert server.posts == ["/quitquitquit"]
    assert record(mains / "main-b")[p.RECORD_EXIT_CODE] == 3


def test_many_mains_finishing_at_once_quit_the_sidecars(tmp_path: Path, server: Server) -> None:
    """Every main writes before it counts, so whatever the interleaving the last to count
    sees them all: the sidecars are quit (one POST or a few, never none)."""
    mains = tmp_path / "mains"
    mains.mkdir()
    (mains / ".main-0.1.tmp").write_text("{}")  # a record being written: not counted
    n = 12
    procs = []
    for i in range(n):
        d = tmp_path / f"m{i}"
        d.mkdir()
        procs.append(start(d / DONE, *mains_flags(mains, f"main-{i}", n, server.url("/quitquitquit")),
                           argv=["true"]))
    for proc in procs:
        assert proc.wait(timeout=60) == 0
        proc.stdout.close()
        proc.stderr.close()
    assert 1 <= len(server.posts) <= n and set(server.posts) == {"/quitquitquit"}


def test_mains_flags_go_together(tmp_path: Path) -> None:
    res = run(tmp_path / DONE, p.FLAG_NAME, "m", p.FLAG_MAINS, "2", argv=["true"])
    assert res.returncode == p.EXIT_USAGE and "go together" in res.stderr.decode()


def test_retry_does_not_quit_while_a_failed_main_will_be_restarted(tmp_path: Path, server: Server) -> None:
    """restartPolicy OnFailure: a main that failed is restarted by the kubelet and needs the
    sidecars, so its failed record does not count as finished for the other main."""
    mains, a, b = tmp_path / "mains", tmp_path / "a", tmp_path / "b"
    for d in (mains, a, b):
        d.mkdir()
    quit_url = server.url("/quitquitquit")
    assert run(a / DONE, p.FLAG_RETRY, *mains_flags(mains, "a", 2, quit_url), argv=["false"]).returncode == 1
    assert not (mains / "a").exists()  # a failure to be retried is not final: not recorded there
    res = run(b / DONE, p.FLAG_RETRY, *mains_flags(mains, "b", 2, quit_url), argv=["true"])
    assert res.returncode == 0
    assert server.posts == [], "quit while the failed main is still to be restarted"
    # The kubelet restarts the failed main; it succeeds and, now last, quits.
    assert run(a / DONE, p.FLAG_RETRY, *mains_flags(mains, "a", 2, quit_url), argv=["true"]).returncode == 0
    assert server.posts == ["/quitquitquit"]


def test_quit_errors_are_logged_not_fatal(tmp_path: Path) -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    res = run(tmp_path / DONE, p.FLAG_QUIT, f"http://127.0.0.1:{port}/quitquitquit", argv=["true"])
    assert res.returncode == 0
    assert f"quit http://127.0.0.1:{port}/quitquitquit:" in res.stderr.decode()
    assert record(tmp_path / DONE)[p.RECORD_REASON] == p.REASON_COMPLETED


def test_an_unsendable_quit_url_is_logged_not_fatal(tmp_path: Path, server: Server) -> None:
    """A quit URL the request line cannot carry (not latin-1) must not turn a completed step
    into a waiter error after its record was posted."""
    url = server.url("/quit\u20ac")
    res = run(tmp_path / DONE, p.FLAG_QUIT, url, argv=["true"])
    assert res.returncode == 0, res.stderr
    assert f"quit {url}:" in res.stderr.decode()
    assert record(tmp_path / DONE)[p.RECORD_REASON] == p.REASON_COMPLETED
