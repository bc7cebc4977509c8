"""Hostile clients of the admission server, shared by the attack tests
(tests/admission/test_server_attacks.py) and `make bench-hostile`: each drives one way a
client could starve, hold or grow the server, over real sockets, and returns what it saw
and the connections it opened (never asserts: callers decide). `Legit` is the apiserver
meanwhile: a review at a time on one kept-alive TLS connection."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import select
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import httpx

from tests.support import https_helpers as h

JSON_CT = {"content-type": "application/json"}
CONNECT_RETRY_SECONDS = 0.2  # an attack client's pause after a refused connection


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


def steps_by_mains(n: int) -> bytes:
    """A review of a pod with `n` steps and `n` mains (and Istio): the shape whose rewrite was
    once quadratic (8,000 x 8,000 took 28 s)."""
    pod = h.kpack_istio()
    mesh = [c for c in pod["spec"]["initContainers"] if c["name"] == "istio-init"]
    pod["spec"]["initContainers"] = mesh + [{"name": f"s{i}", "image": "busybox", "command": ["true"]}
                                            for i in range(n)]
    sidecars = [c for c in pod["spec"]["containers"] if c["name"] == "istio-proxy"]
    pod["spec"]["containers"] = sidecars + [{"name": f"m{i}", "image": "busybox", "command": ["true"]}
                                            for i in range(n)]
    return json.dumps(h.review(pod, namespace="builds")).encode()


def largest_body(limit: int) -> bytes:
    """The largest review `large_body` makes under `limit` bytes (the body limit)."""
    body = large_body(limit - 200_000)
    return body if len(body) <= limit else large_body(limit - 400_000)


# --- the legitimate client ------------------------------------------------------------------
def _legit(url: str, ca: str, body: bytes, pause: float, stop: Any, out: Any) -> None:
    with httpx.Client(verify=h.client_context(ca), timeout=60) as c:
        while not stop.is_set():
            start = time.perf_counter()
            try:
                status = c.post(f"{url}/mutate", content=body, headers=JSON_CT).status_code
            except httpx.HTTPError:
                status = 0
            out.send((status, time.perf_counter() - start))
            stop.wait(pause)
    out.close()


@dataclass
class Legit:
    """Reviews one at a time on one kept-alive TLS connection, as the apiserver sends them,
    every `pause` seconds, while the block runs: (status, seconds) each, 0 for no answer.
    The client is a process of its own: the attacker's work in this one must not slow it."""

    url: str
    ca: str
    body: bytes = field(default_factory=small_body)
    pause: float = 0.02
    samples: list[tuple[int, float]] = field(default_factory=list)

    @contextlib.contextmanager
    def running(self, at_least: int = 5) -> Iterator["Legit"]:
        """Sends until the block ends and `at_least` reviews were answered meanwhile."""
        import multiprocessing

        mp = multiprocessing.get_context("fork")
        stop = mp.Event()
        recv, send = mp.Pipe(duplex=False)
        proc = mp.Process(target=_legit, args=(self.url, self.ca, self.body, self.pause, stop, send), daemon=True)
        proc.start()
        send.close()

        def drain() -> None:
            # Read while the block runs: the pipe holds about 2,000 samples, and a client
            # whose pipe is full stops sending (it blocks in `send`).
            while True:  # until the client's end closes (it exited)
                try:
                    self.samples.append(recv.recv())
                except (EOFError, OSError):
                    return

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        start = len(self.samples)
        try:
            yield self
            deadline = time.monotonic() + 300
            while len(self.samples) - start < at_least and reader.is_alive() and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            stop.set()
            proc.join(120)
            if proc.is_alive():
                proc.terminate()
            reader.join(30)


# --- connections ---------------------------------------------------------------------------------
def tls_socket(port: int, ctx: ssl.SSLContext, timeout: float = 30) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    return ctx.wrap_socket(raw, server_hostname="localhost")


def closed(sock: socket.socket) -> bool:
    """Whether the server closed `sock` (its FIN or reset arrived), without waiting and
    without reading: a read would take the answers a client that never reads leaves, and
    the server may rightly keep a connection whose answer was taken."""
    if sock.fileno() < 0:  # closed here
        return True
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLRDHUP)  # POLLERR and POLLHUP always count
    return bool(poller.poll(0))


def wait_closed(socks: list[socket.socket], seconds: float) -> list[socket.socket]:
    """Waits until the server closed every socket or `seconds` passed; those still open."""
    deadline = time.monotonic() + seconds
    left = list(socks)
    while left and time.monotonic() < deadline:
        left = [s for s in left if not closed(s)]
        if left:
            time.sleep(0.1)
    return left


def close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.close()


# --- the attacks -----------------------------------------------------------------------------------
@dataclass
class Cut:
    """How the server ended a flood: its answer's status line (empty if none), when it
    answered or closed in seconds from the flood's first byte (None: it never did), and
    whether it then closed the connection."""

    answer: str = ""
    after: float | None = None
    closed: bool = False


async def _aflood(port: int, ctx: ssl.SSLContext, head: bytes, chunk: bytes, total: int) -> Cut:
    # asyncio, not two threads on one SSLSocket: OpenSSL's objects are not thread-safe.
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="localhost")
    cut = Cut()
    start = time.monotonic()

    async def read() -> None:
        try:
            first = await reader.read(65536)
            cut.answer = first.split(b"\r\n", 1)[0].decode("latin-1")
            cut.after = time.monotonic() - start
            while await reader.read(65536):
                pass
        except (OSError, ssl.SSLError):
            if cut.after is None:
                cut.after = time.monotonic() - start
        cut.closed = True

    answered = asyncio.create_task(read())
    sent = 0
    try:
        writer.write(head)
        while sent < total and cut.after is None:
            writer.write(chunk)
            sent += len(chunk)
            await asyncio.wait_for(writer.drain(), 30)
    except (OSError, ssl.SSLError, asyncio.TimeoutError):
        pass
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(answered, 120)
    writer.transport.abort()
    return cut


def _flood(port: int, ctx: ssl.SSLContext, head: bytes, chunk: bytes, total: int) -> Cut:
    """`head`, then `chunk` until `total` bytes or the server answers or closes."""
    return asyncio.run(_aflood(port, ctx, head, chunk, total))


def header_flood(port: int, ctx: ssl.SSLContext, total: int = 32 * 1024 * 1024) -> Cut:
    """One request whose head is `total` bytes of small headers."""
    line = b"X-Flood: " + b"f" * 80 + b"\r\n"
    return _flood(port, ctx, b"POST /mutate HTTP/1.1\r\nHost: localhost\r\n", line * (64 * 1024 // len(line)), total)


def trailer_flood(port: int, ctx: ssl.SSLContext, total: int = 256 * 1024 * 1024) -> Cut:
    """A chunked review whose last chunk is followed by a trailer that never ends (no line end)."""
    head = (b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nX-Trailer: ")
    return _flood(port, ctx, head, b"t" * 65536, total)


def upgrade_flood(port: int, ctx: ssl.SSLContext, count: int = 1100) -> list[socket.socket]:
    """`count` connections each asking for a WebSocket upgrade, never reading."""
    out = []
    for i in range(count):
        try:
            s = tls_socket(port, ctx)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                      b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
            out.append(s)
        except (OSError, ssl.SSLError):
            pass  # over the connection cap: closed at once
    return out


def idle_connections(port: int, ctx: ssl.SSLContext | None, count: int) -> list[socket.socket]:
    """`count` connections that never send a request (after the handshake, when `ctx`)."""
    out = []
    for _ in range(count):
        try:
            raw = socket.create_connection(("127.0.0.1", port), timeout=30)
            out.append(ctx.wrap_socket(raw, server_hostname="localhost") if ctx else raw)
        except (OSError, ssl.SSLError):
            pass
    return out


def silent_tcp(port: int, count: int) -> list[socket.socket]:
    """`count` TCP connections to the TLS port that never send a ClientHello."""
    return idle_connections(port, None, count)


def connect_and_close(port: int, count: int, first: bytes = b"") -> None:
    """`count` TCP connections closed as soon as they are open (TCP health checks, a port
    scan), one after another; each sends `first` before it closes (`client_hello`: a
    client that leaves during its handshake)."""
    for _ in range(count):
        with contextlib.suppress(OSError):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                if first:
                    s.sendall(first)


def accept_queue(listener: socket.socket) -> int:
    """Connections the kernel holds for `listener` that the server has not accepted yet
    (Linux: TCP_INFO's tcpi_unacked of a listening socket). A client's connect and close
    are done long before a loaded server accepts them: till then it cannot have seen them."""
    info = listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    return struct.unpack_from("=8B5I", info)[-1]


def client_hello(ctx: ssl.SSLContext) -> bytes:
    """The first flight of a TLS client with `ctx`: its ClientHello."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with contextlib.suppress(ssl.SSLWantReadError):
        client.do_handshake()
    return outgoing.read()


def slowloris(port: int, ctx: ssl.SSLContext, count: int) -> list[socket.socket]:
    """`count` connections each sending the first bytes of a request's head, more to follow
    (the caller trickles them with `trickle`)."""
    out = []
    for _ in range(count):
        try:
            s = tls_socket(port, ctx)
            s.sendall(b"POST /mutate HTTP/1.1\r\n")
            out.append(s)
        except (OSError, ssl.SSLError):
            pass  # closed at once: past the connection cap
    return out


def trickle(socks: list[socket.socket], seconds: float, every: float = 0.5,
            silent: list[socket.socket] = ()) -> float:  # type: ignore[assignment]
    """A header byte on each of `socks` every `every` seconds until the server closed them
    and the `silent` ones, or `seconds` passed; how long it took."""
    start = time.monotonic()
    left, quiet = list(socks), list(silent)
    while (left or quiet) and time.monotonic() - start < seconds:
        for s in left:
            with contextlib.suppress(OSError, ssl.SSLError, ValueError):
                s.sendall(b"X")
        time.sleep(every)
        left = [s for s in left if not closed(s)]
        quiet = [s for s in quiet if not closed(s)]
    return time.monotonic() - start


def slow_bodies(port: int, ctx: ssl.SSLContext, clients: int) -> list[socket.socket]:
    """Clients that declare a 100-byte body and send 10 bytes of it."""
    out = []
    for _ in range(clients):
        try:
            s = tls_socket(port, ctx)
            s.sendall(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n" + b"{" * 10)
            out.append(s)
        except (OSError, ssl.SSLError):
            pass  # closed at once: past the connection cap
    return out


def unread_answers(port: int, ctx: ssl.SSLContext, body: bytes, count: int = 1, pause: float = 0.5) -> socket.socket:
    """A client with a tiny receive window that sends `count` reviews, one every `pause`
    seconds (each after the server had time to answer the last: not pipelined), and never
    reads an answer."""
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.settimeout(30)
    raw.connect(("127.0.0.1", port))
    s = ctx.wrap_socket(raw, server_hostname="localhost")
    request = (f"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    for i in range(count):
        if i:
            time.sleep(pause)
        try:
            s.sendall(request)
        except (OSError, ssl.SSLError):
            break
    return s


def unread_bodies(port: int, ctx: ssl.SSLContext, body: bytes, count: int) -> list[socket.socket]:
    """`count` connections each sending a large review's head and as much of its body as
    the server's buffers take (it reads a large body only in its turn), then nothing."""
    head = (f"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    out = []
    for _ in range(count):
        try:
            s = tls_socket(port, ctx)
            s.sendall(head)
            s.setblocking(False)
            for i in range(0, min(len(body), 2 << 20), 65536):
                s.send(body[i:i + 65536])
        except (BlockingIOError, ssl.SSLWantWriteError):
            pass
        except (OSError, ssl.SSLError):
            continue  # closed: past the cap
        out.append(s)
    return out


async def _apipelined(port: int, ctx: ssl.SSLContext, count: int) -> tuple[int, bool]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="localhost")
    got, tail, closed = 0, b"", False

    async def read() -> None:
        nonlocal got, tail, closed
        try:
            while chunk := await reader.read(65536):
                data = tail + chunk
                got += data.count(b"HTTP/1.1 200")
                tail = data[-16:]
        except (OSError, ssl.SSLError):
            pass
        closed = True

    answers = asyncio.create_task(read())
    request = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
    try:
        for i in range(0, count, 1000):
            writer.write(request * min(1000, count - i))
            await asyncio.wait_for(writer.drain(), 30)
    except (OSError, ssl.SSLError, asyncio.TimeoutError):
        pass
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(answers, 300)
    writer.transport.abort()
    return got, closed


def pipelined(port: int, ctx: ssl.SSLContext, count: int) -> tuple[int, bool]:
    """`count` pipelined `GET /healthz` sent at once on one connection, the answers read:
    how many came back, and whether the server closed the connection."""
    return asyncio.run(_apipelined(port, ctx, count))


def metrics_flood(port: int, connections: int) -> list[socket.socket]:
    """`connections` plain connections each sending an unfinished `GET /metrics`."""
    out = []
    for _ in range(connections):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            out.append(s)
        except OSError:
            pass
    return out


def idle_metrics_and_scrapes(port: int, idle: int = 16, every: float = 5.0, scrapes: int = 15,
                             pause: float = 1.0) -> list[int]:
    """`idle` connections to the metrics port that never send, reopened every `every`
    seconds, while `scrapes` scrapes run one a `pause`: each scrape's status (0: none,
    twice)."""
    stop = threading.Event()

    def hold() -> None:
        while not stop.is_set():
            socks = idle_connections(port, None, idle)
            stop.wait(every)
            close_all(socks)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    time.sleep(0.5)
    statuses = []
    try:
        for _ in range(scrapes):
            for attempt in range(2):  # one arriving in the very instant the idle ones reopen may lose
                try:                  # its place to them; Prometheus scrapes again, so does this
                    statuses.append(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).status_code)
                    break
                except httpx.HTTPError:
                    if attempt:
                        statuses.append(0)
            time.sleep(pause)
    finally:
        stop.set()
        holder.join(30)
    return statuses


def _post_forever(url: str, ca: str, body: bytes, statuses: Any) -> None:
    ctx = h.client_context(ca)
    with httpx.Client(verify=ctx, timeout=120) as c:
        while True:
            try:
                status = c.post(f"{url}/mutate", content=body, headers=JSON_CT).status_code
            except httpx.ConnectError:
                # No server listening (a restart's gap): retried after a pause. An attacker
                # elsewhere retrying at once costs this machine nothing; here it would take
                # the CPU from the server starting up.
                status = 0
                time.sleep(CONNECT_RETRY_SECONDS)
            except httpx.HTTPError:
                status = 0
            statuses.put(status)


@contextlib.contextmanager
def posting(url: str, ca: str, body: bytes, clients: int) -> Iterator[Any]:
    """`clients` processes (not threads: a client's own CPU work must not slow the
    measuring one) posting `body` back to back while the block runs. Yields a function
    returning the statuses so far."""
    import multiprocessing

    mp = multiprocessing.get_context("fork")
    queue = mp.SimpleQueue()
    procs = [mp.Process(target=_post_forever, args=(url, ca, body, queue), daemon=True) for _ in range(clients)]
    for p in procs:
        p.start()
    statuses: list[int] = []

    def seen() -> list[int]:
        while not queue.empty():
            statuses.append(queue.get())
        return statuses

    try:
        yield seen
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.join(30)
        seen()


# --- the server's process ----------------------------------------------------------------------
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


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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

    def reset_peak(self) -> None:
        """Start the peak over (v1 only; v2's memory.peak cannot be reset before 6.12)."""
        if not self.v2:
            with contextlib.suppress(OSError):
                (self.path / "memory.max_usage_in_bytes").write_text("0")

    def remove(self) -> None:
        for _ in range(100):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)  # its processes are still exiting
