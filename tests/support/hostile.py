"""Hostile clients of the admission server (issue 24), shared by the memory-cap test and
`make bench-hostile`: each drives one way a single client could starve or grow the server,
over real sockets, and returns what it saw (never asserts: callers decide)."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import socket
import ssl
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx

from tests.support import https_helpers as h

JSON_CT = {"content-type": "application/json"}


def small_body() -> bytes:
    return json.dumps(h.review(h.kpack_istio(), namespace="builds")).encode()


def large_body(size: int) -> bytes:
    """A review of at least `size` bytes: a build pod with many steps, each with env, the
    shape that costs the rewrite most per byte."""
    pod = h.kpack_istio()
    template = pod["spec"]["initContainers"][0]
    steps = pod["spec"]["initContainers"]
    n = 0
    while True:
        for _ in range(50):
            step = copy.deepcopy(template)
            step["name"] = f"step-{n}"
            step["command"] = ["/cnb/lifecycle/restorer"]  # rewritable: no registry lookup needed
            step["env"] = [{"name": f"V{j}", "value": "x" * 20} for j in range(40)]
            steps.append(step)
            n += 1
        body = json.dumps(h.review(pod, namespace="builds")).encode()
        if len(body) >= size:
            return body


def tls_socket(port: int, ctx: ssl.SSLContext, timeout: float = 30) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    return ctx.wrap_socket(raw, server_hostname="localhost")


def header_flood(port: int, ctx: ssl.SSLContext, total: int = 32 * 1024 * 1024) -> int:
    """One request whose head is `total` bytes of small headers; the bytes the server took
    before it answered or closed."""
    s = tls_socket(port, ctx)
    line = b"X-Flood: " + b"f" * 80 + b"\r\n"
    chunk = line * (64 * 1024 // len(line))
    sent = 0
    try:
        s.sendall(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\n")
        while sent < total:
            s.sendall(chunk)
            sent += len(chunk)
        s.sendall(b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
        s.settimeout(30)
        s.recv(1024)
    except (OSError, ssl.SSLError):
        pass
    finally:
        s.close()
    return sent


def metrics_flood(port: int, connections: int) -> list[socket.socket]:
    """`connections` plain connections each sending an unfinished `GET /metrics`."""
    out = []
    for _ in range(connections):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            out.append(s)
        except OSError:
            break
    return out


def slow_bodies(port: int, ctx: ssl.SSLContext, clients: int) -> list[ssl.SSLSocket]:
    """Clients that declare a 100-byte body and send 10 bytes of it."""
    out = []
    for _ in range(clients):
        s = tls_socket(port, ctx)
        s.sendall(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n" + b"{" * 10)
        out.append(s)
    return out


def pipelined(port: int, ctx: ssl.SSLContext, count: int) -> int:
    """`count` pipelined `GET /healthz` on one connection; the answers that came back."""
    s = tls_socket(port, ctx, timeout=10)
    got = b""
    try:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n" * count)
        while chunk := s.recv(65536):
            got += chunk
    except (OSError, ssl.SSLError):
        pass
    finally:
        s.close()
    return got.count(b"HTTP/1.1 200")


def _post_forever(url: str, ca: str, body: bytes, statuses: Any) -> None:
    ctx = h.client_context(ca)
    with httpx.Client(verify=ctx, timeout=60) as c:
        while True:
            try:
                status = c.post(f"{url}/mutate", content=body, headers=JSON_CT).status_code
            except httpx.HTTPError:
                status = 0
            statuses.put(status)


@contextlib.contextmanager
def posting(url: str, ca: str, body: bytes, clients: int) -> Iterator[list[int]]:
    """`clients` processes (not threads: a client's own CPU work must not slow the
    measuring one) posting `body` back to back while the block runs; the statuses."""
    import multiprocessing

    mp = multiprocessing.get_context("fork")
    queue = mp.SimpleQueue()
    procs = [mp.Process(target=_post_forever, args=(url, ca, body, queue), daemon=True) for _ in range(clients)]
    for p in procs:
        p.start()
    statuses: list[int] = []
    try:
        yield statuses
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.join(30)
        while not queue.empty():
            statuses.append(queue.get())


def latencies(url: str, ctx: ssl.SSLContext, body: bytes, count: int, pause: float = 0.02) -> list[tuple[int, float]]:
    """`count` reviews on one kept-alive connection, one at a time: (status, seconds)."""
    out = []
    with httpx.Client(verify=ctx, timeout=60) as c:
        for _ in range(count):
            start = time.perf_counter()
            try:
                status = c.post(f"{url}/mutate", content=body, headers=JSON_CT).status_code
            except httpx.HTTPError:
                status = 0
            out.append((status, time.perf_counter() - start))
            time.sleep(pause)
    return out


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return sorted(out)


def memory_kb(pid: int, field: str = "VmRSS") -> int:
    """A /proc/<pid>/status figure in kB (VmRSS now, VmHWM the peak)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class MemoryCgroup:
    """A child of this process's own memory cgroup (v2 memory.max or v1 memory.limit_in_bytes)
    with `limit` bytes, for a server started with `preexec_fn=cgroup.enter`; None from
    `create` where cgroups are not writable here."""

    def __init__(self, path: Path, v2: bool) -> None:
        self.path, self.v2 = path, v2

    @classmethod
    def create(cls, limit: int, name: str) -> "MemoryCgroup | None":
        try:
            lines = [line.strip().split(":", 2) for line in Path("/proc/self/cgroup").read_text().splitlines()]
        except OSError:
            return None
        for hid, ctrls, own in lines:
            v2 = hid == "0" and Path("/sys/fs/cgroup/cgroup.controllers").exists()
            if not v2 and "memory" not in ctrls.split(","):
                continue
            base = Path("/sys/fs/cgroup") if v2 else Path("/sys/fs/cgroup/memory")
            path = base / own.lstrip("/") / name
            try:
                path.mkdir()
                (path / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(str(limit))
                if not v2:  # no swap to hide in: the limit is the memory it has
                    with contextlib.suppress(OSError):
                        (path / "memory.memsw.limit_in_bytes").write_text(str(limit))
            except OSError:
                with contextlib.suppress(OSError):
                    path.rmdir()
                continue
            return cls(path, v2)
        return None

    def enter(self) -> None:
        """In the child before exec: move this process into the cgroup."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def oom_kills(self) -> int:
        text = (self.path / ("memory.events" if self.v2 else "memory.oom_control")).read_text()
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def peak_bytes(self) -> int:
        name = "memory.peak" if self.v2 else "memory.max_usage_in_bytes"
        try:
            return int((self.path / name).read_text())
        except OSError:
            return 0

    def remove(self) -> None:
        for _ in range(100):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)  # its processes are still exiting


def run_all(port: int, metrics_port: int, ca: str, *, large: bytes,
            note: Callable[[str, Any], None] = lambda _k, _v: None) -> None:
    """Every heavy case in turn, against one server: what the memory-cap test drives."""
    ctx = h.client_context(ca)
    note("header flood bytes taken", header_flood(port, ctx))
    flood = metrics_flood(metrics_port, 300)
    note("metrics flood connections", len(flood))
    slow = slow_bodies(port, ctx, 50)
    with posting(f"https://127.0.0.1:{port}", ca, large, 4) as statuses:
        note("small reviews during the large flood", latencies(f"https://127.0.0.1:{port}", ctx, small_body(), 30))
    note("large reviews answered", statuses)
    note("pipelined answers", pipelined(port, ctx, 20000))
    for s in [*flood, *slow]:
        s.close()
