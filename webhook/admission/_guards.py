"""The guards uvicorn lacks, on public asyncio API: a `Connection` in front of each of
uvicorn's own h11 protocol objects, which `Front` (uvicorn's `http` factory) makes.

uvicorn bounds what it buffers of a head still arriving, not time (a handshake or a head
may take forever, an unread answer is held until the kernel gives up), nor how many
connections are open, nor a head that arrives whole in one read. Each guard names the
attack it stops and counts in `initshift_connections_closed_total{reason}`. A listening
socket is a `Door` (TLS or not, its cap and deadlines); the app tells a connection, found
by the ASGI scope's addresses, when a request starts and when its answer is done.
"""

from __future__ import annotations

import asyncio
import collections
import fcntl
import socket
import ssl
import struct
import termios
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Callable

from uvicorn.protocols.http.h11_impl import H11Protocol

from .. import jsontext, metrics

__all__ = ["Connection", "Door", "Front"]

EARLY_BYTES = 64 * 1024  # what may arrive before the server's TLS starts (a ClientHello is < 16 KiB)
MAX_HEADER_FIELDS = 100  # header fields of one request (the apiserver sends ~10)
TLS_SHUTDOWN_SECONDS = 2.0  # a TLS close waiting for the client's close_notify
HANDSHAKES_PER_TURN = 4  # TLS handshakes started per turn of the event loop


@dataclass(eq=False)
class Door:
    """One listening socket's policy and the connections it holds."""

    tls: Callable[[], ssl.SSLContext] | None  # the context a new connection's TLS starts from
    max_connections: int
    header_timeout: float  # the handshake and each request's head
    body_timeout: float  # a request's body, from its head
    idle_timeout: float  # a kept-alive connection's wait for its next request's first byte
    write_timeout: float
    max_head_bytes: int
    open: dict["Connection", None] = field(default_factory=dict)
    # The connections not being answered, by when they last moved on (oldest first): those
    # waiting for a request (since accept or their last answer), and those whose request
    # the app has but is not working on yet (its body still coming, or waiting its turn).
    waiting: dict["Connection", None] = field(default_factory=dict)

    def admit(self, conn: "Connection") -> bool:
        """Guard: a flood of connections, idle, slow or stalled, holding every place. At the
        cap the one that has waited longest without moving on goes: first of those never
        answered, then of the client address holding the most connections. The apiserver's
        kept-alive connections (a review written to an evicted one fails) are answered ones
        from an address with few: a flood from many addresses that sends no request, or
        from a few that does, evicts its own. Never one being answered: a client that sends
        its request at once always gets a place."""
        if len(self.open) >= self.max_connections:
            held = collections.Counter(c.peer for c in self.open)
            victim = max(self.waiting, key=lambda c: (not c.served, held[c.peer]), default=None)  # the oldest of ties
            if victim is None:
                return False
            victim.kill("over-limit")  # and it leaves
        self.open[conn] = None
        return True

    def wait(self, conn: "Connection") -> None:
        """`conn` moved on, to a state where it waits: it goes last in line."""
        self.waiting.pop(conn, None)
        self.waiting[conn] = None

    def leave(self, conn: "Connection") -> None:
        self.open.pop(conn, None)
        self.waiting.pop(conn, None)


class Connection(asyncio.Protocol):
    """One client connection around uvicorn's protocol `inner`, which gets one request at a
    time: its head once complete and within limits, then its Content-Length bytes; a
    pipelined next request waits here for the answer, then passes the same limits.

    Guard: connections that never send a byte (TCP health checks, port scans, a connect
    flood). Nothing is built for them but this object and its deadline: TLS starts with
    the first bytes (a TLS client speaks first) and uvicorn's protocol once the connection
    is ready for it."""

    def __init__(self, front: "Front", make_inner: Callable[[], asyncio.Protocol]) -> None:
        self.front, self._make_inner = front, make_inner
        self.inner: asyncio.Protocol | None = None
        self.door: Door | None = None
        self.raw: Any = None  # the socket's transport (uvloop's are not asyncio's classes)
        self.transport: Any = None  # what uvicorn writes to: the TLS transport, or the raw one
        self.key: tuple | None = None
        self.closed = asyncio.Event()  # the client is gone (the app stops waiting for it)
        self._early: list[bytes] | None = None  # bytes read before TLS took over the connection
        self._head: bytearray | None = bytearray()  # the head so far; None once complete
        self._body = 0  # body bytes of the current request still to pass on
        self._body_due = 0.0  # when they must all be in (the loop's clock)
        self._answered = False
        self.served = False  # an answer was sent on it (the apiserver's kept-alive connections)
        self._held = bytearray()  # what came after the current request, before its answer
        self._deadline: asyncio.TimerHandle | None = None
        self._idle = False  # answered, the next request's first byte still to come
        self._write_deadline: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.raw = transport
        local, peer = transport.get_extra_info("sockname"), transport.get_extra_info("peername")
        self.door = door = self.front.doors[local[1]]
        self.key = _key(local, peer)
        if not door.admit(self):
            self.kill("over-limit")
            return
        self.front.by_key[self.key] = self
        self._wait_for_request()
        if door.tls is None:
            self._made(transport)
            return
        self._early = []  # TLS starts with the first of them (data_received)

    async def start_tls(self) -> None:
        assert self.door is not None and self.door.tls is not None
        if self.gone():  # no TLS state built for it
            return
        context = self.door.tls()
        loop = asyncio.get_running_loop()
        # start_tls puts its TLS protocol on the transport at once and starts it on the
        # loop's next turn; bytes that reached this connection before (the ClientHello,
        # when the loop read it first) go to that protocol ahead of everything else.
        loop.call_soon(self._hand_over_early)
        try:
            # Guard: a client that connects and never finishes its handshake (silent TCP,
            # a ClientHello byte by byte). asyncio's own default would wait 60 s.
            tls = await loop.start_tls(
                self.raw, self, context, server_side=True, ssl_handshake_timeout=self.door.header_timeout,
                ssl_shutdown_timeout=TLS_SHUTDOWN_SECONDS)
        except BaseException as e:  # handshake refused or timed out, or the client left
            self._release()
            self.raw.abort()
            if not isinstance(e, Exception):
                raise
            return
        if tls is None or tls.is_closing() or self.closed.is_set():
            # Guard: a client gone during its handshake (a ClientHello, then a close).
            # start_tls then returns None (asyncio, CPython gh-105993) or, under uvloop, a
            # closed transport (its TLS protocol told of the loss, this one not); uvicorn,
            # handed that, would count it against limit_concurrency for good. Its place is
            # given back either way.
            self._release()
            (tls or self.raw).abort()
            return
        self._made(tls)

    @property
    def peer(self) -> str | None:
        """The client's address (its host, not its port)."""
        return self.key[1] if self.key is not None else None

    def gone(self) -> bool:
        """The client left, or is leaving (its close read, connection_lost still to come).
        TLS built on a closing transport would live on until the handshake deadline, ~50 KB
        a connection."""
        return self.closed.is_set() or self.raw is None or self.raw.is_closing()

    def _made(self, transport: Any) -> None:
        self.transport = transport
        self.inner = self._make_inner()
        self.inner.connection_made(transport)

    def _hand_over_early(self) -> None:
        early, self._early = b"".join(self._early or ()), None
        tls = self.raw.get_protocol()  # a BufferedProtocol: asyncio's and uvloop's TLS protocols are
        while early and not self.raw.is_closing():
            buf = tls.get_buffer(len(early))
            n = min(len(buf), len(early))
            buf[:n] = early[:n]
            tls.buffer_updated(n)
            early = early[n:]

    def data_received(self, data: bytes) -> None:
        if self._early is not None:  # before TLS
            if sum(map(len, self._early)) + len(data) > EARLY_BYTES:
                self.kill("header-limit")  # not a TLS client
                return
            if not self._early:
                self.front.handshake(self)
            self._early.append(data)
            return
        while self.transport is not None and not self.transport.is_closing():
            if self._head is None and not self._body and self._answered:
                # The next request starts with what was held.
                data, self._held, self._head = bytes(self._held) + data, bytearray(), bytearray()
                self._wait_for_request(idle=not data)
            if not data:
                return
            if self._idle:  # the next request's first byte: its head is timed from here
                self._wait_for_request()
            if self._head is not None:
                data = self._read_head(data)
            elif self._body:
                part, data = data[:self._body], data[self._body:]
                self._body -= len(part)
                self.inner.data_received(part)
            else:
                # Guard: pipelined requests (no apiserver pipelines). The next request
                # waits here, bounded, for the current answer; then it is read like any.
                self._held += data
                if len(self._held) > self.door.max_head_bytes:  # type: ignore[union-attr]
                    self.kill("pipelined")
                return

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None  # None: close

    def connection_lost(self, exc: Exception | None) -> None:
        self._release()
        if self.inner is not None:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        # Guard: an answer its client never reads (a full receive window, requests sent
        # without reading): the write buffer stays full, the connection goes after
        # INITSHIFT_WRITE_TIMEOUT_SECONDS instead of when the kernel gives up.
        if self._write_deadline is None and self.door is not None:
            self._write_deadline = asyncio.get_running_loop().call_later(
                self.door.write_timeout, self.kill, "write-timeout")
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None
        if self.inner is not None:
            self.inner.resume_writing()

    # --- one request at a time ------------------------------------------------------------------
    def _read_head(self, data: bytes) -> bytes:
        """Take `data` into the head; pass the head on once complete; the rest returned.

        Guard: a head too large or of too many fields, sent slowly or whole in one read
        (h11 would parse it all: 256 KiB of small headers grew a process by 6 MB, per
        connection): HTTP 431 and the connection closed.

        Guard: a body of unknown length (chunked), whose trailers h11 would buffer and whose
        end only h11 would see. No apiserver sends one (its webhook client sends the review
        with its Content-Length): HTTP 411 and the connection closed, so every request
        passed on has a known length, which ends it."""
        assert self._head is not None and self.door is not None
        start = len(self._head)
        self._head += data
        if not start:  # empty lines before a request line are allowed (RFC 9112)
            del self._head[:len(self._head) - len(self._head.lstrip(b"\r\n"))]
        end = self._head.find(b"\r\n\r\n", max(0, start - 3))
        head = self._head if end < 0 else self._head[:end + 4]
        if len(head) > self.door.max_head_bytes:
            return self._refuse(431, f"request head over {self.door.max_head_bytes} bytes (INITSHIFT_MAX_HEADER_BYTES)")
        if head.count(b"\n") > MAX_HEADER_FIELDS + 2:  # beside the request line and the blank line
            return self._refuse(431, f"more than {MAX_HEADER_FIELDS} header fields")
        if end < 0:
            return b""
        rest = bytes(self._head[end + 4:])
        self._head = None
        length = _body_length(head)
        if length is None:
            return self._refuse(411, "a request body needs a Content-Length (chunked bodies are not taken)")
        self._body, self._answered = length, False
        self._body_due = asyncio.get_running_loop().time() + self.door.body_timeout
        self.inner.data_received(bytes(head))
        return rest

    def _refuse(self, status: int, why: str) -> bytes:
        metrics.CONNECTIONS_CLOSED.labels("header-limit" if status == 431 else "no-length").inc()
        body = jsontext.dumps({"error": f"initshift: {why}"})
        self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                             b"connection: close\r\n\r\n%s" % (status, HTTPStatus(status).phrase.encode(),
                                                                 len(body), body))
        self.transport.close()
        return b""

    def _wait_for_request(self, idle: bool = False) -> None:
        """From accept, after an answer (`idle`), and at the next request's first byte.

        Guard: a request's head sent slowly or never (slowloris, silent connections, a byte
        now and then to keep uvicorn's keep-alive timer from firing): the handshake, the
        head, and the app's start on it within INITSHIFT_HEADER_TIMEOUT_SECONDS, from accept
        or from the head's first byte (Go's ReadHeaderTimeout).

        Between requests a connection waits INITSHIFT_KEEPALIVE_TIMEOUT_SECONDS for that
        byte, longer than the apiserver keeps an idle connection (90 s): a server that
        closes first can close one the apiserver is writing a review to, and the apiserver
        does not resend a POST, so the review fails. Idle connections are the first to go
        at the cap (`Door.admit`)."""
        assert self.door is not None
        self._cancel()
        self.door.wait(self)
        self._idle = idle
        loop = asyncio.get_running_loop()
        if idle:
            self._deadline = loop.call_later(min(self.door.write_timeout, self.door.idle_timeout), self._still_idle)
        else:
            self._deadline = loop.call_later(self.door.header_timeout, self.kill, "header-timeout")

    def _still_idle(self) -> None:
        """INITSHIFT_WRITE_TIMEOUT_SECONDS after an answer, its connection idle since.

        Guard: an answer its client never reads, small enough for the kernel's buffers (a
        few MB a connection, which the write buffer's guard never sees fill): still not
        taken by the client's side, the connection goes; otherwise it waits out the idle
        deadline."""
        assert self.door is not None
        if _unacknowledged(self.raw):
            self.kill("write-timeout")
            return
        self._deadline = asyncio.get_running_loop().call_later(
            max(0.0, self.door.idle_timeout - self.door.write_timeout), self.kill, "idle-timeout")

    @property
    def between_requests(self) -> bool:
        """Waiting for a request's head (after accept, or after an answer)."""
        return self._head is not None

    def started(self) -> None:
        """The app has the request; its body has a deadline of its own there."""
        self._cancel()
        if self.door is not None:
            self.door.wait(self)

    def working(self) -> None:
        """The app works on the request (its body is in): the connection is not evicted."""
        if self.door is not None:
            self.door.waiting.pop(self, None)

    def answered(self) -> None:
        """The app is done with the request: the next one may come (once the body is in).

        Guard: a body the app answered without reading (a `GET /healthz` that declares one)
        and that never comes: the connection waits for it until the body's deadline, in
        line for eviction like one whose request is not in yet."""
        self._answered = self.served = True
        if self._body and self.door is not None:
            self._cancel()
            self.door.wait(self)
            self._deadline = asyncio.get_running_loop().call_at(self._body_due, self.kill, "body-timeout")
        if self.transport is not None:
            self.data_received(b"")

    def kill(self, reason: str) -> None:
        metrics.CONNECTIONS_CLOSED.labels(reason).inc()
        # Released here, not only on connection_lost: the TLS layer tells its app of a lost
        # connection only once the handshake is done, and a handshake that ends after the
        # kill must not hand uvicorn a dead connection it would count forever.
        self._release()
        if self.raw is not None:
            _reset_on_close(self.raw)
            self.raw.abort()

    def _cancel(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _release(self) -> None:
        self._cancel()
        if self._write_deadline is not None:
            self._write_deadline.cancel()
        if self.door is not None:
            self.door.leave(self)
        if self.key is not None and self.front.by_key.get(self.key) is self:
            del self.front.by_key[self.key]
        self.closed.set()


def _reset_on_close(transport: Any) -> None:
    """The connection's close a reset (SO_LINGER 0): a plain close queues its FIN behind what
    the client has not taken, and the kernel keeps the socket and those bytes (up to a few MB)
    for minutes, trying to deliver them to a client that reads nothing."""
    sock = transport.get_extra_info("socket")
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except (AttributeError, OSError, ValueError):  # no socket (gone; uvloop's: a closed descriptor), not TCP
        pass


def _unacknowledged(transport: Any) -> int:
    """Bytes written to the connection's socket that its peer has not acknowledged (Linux's
    SIOCOUTQ: a client that reads nothing leaves them queued once its window is full); 0
    where the kernel cannot say."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
    except (AttributeError, OSError, ValueError):
        return 0


def _body_length(head: bytes | bytearray) -> int | None:
    """The body's length by the head's Content-Length (0 without one, or one h11 refuses
    with HTTP 400 and a close); None with a Transfer-Encoding (a chunked body)."""
    length = 0
    for line in bytes(head).split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"transfer-encoding":
            return None
        if name == b"content-length" and value.strip().isdigit():
            length = int(value)
    return length


def _key(local: Any, peer: Any) -> tuple:
    """A connection's addresses as the ASGI scope gives them (`server` port, `client`)."""
    return (int(local[1]), str(peer[0]), int(peer[1]))


class Front:
    """uvicorn's `http` protocol factory: each connection it makes is guarded."""

    def __init__(self) -> None:
        self.doors: dict[int, Door] = {}  # by local port
        self.by_key: dict[tuple, Connection] = {}
        self._handshakes: collections.deque[Connection] = collections.deque()
        self._starter: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()  # the loop keeps only weak references to tasks

    def handshake(self, conn: Connection) -> None:
        """Guard: a burst of new TLS connections (thousands of ClientHellos at once, or
        ones that leave right after). Each handshake costs ~1 ms of the event loop's CPU;
        started all at once, they would run in one turn of the loop while a review on a
        kept-alive connection waits for it. They start HANDSHAKES_PER_TURN per turn of the
        loop instead, in arrival order, and one whose client left meanwhile costs nothing."""
        self._handshakes.append(conn)
        if self._starter is None:
            self._starter = asyncio.get_running_loop().create_task(self._start_handshakes())

    async def _start_handshakes(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._handshakes:
                for _ in range(min(HANDSHAKES_PER_TURN, len(self._handshakes))):
                    conn = self._handshakes.popleft()
                    if not conn.gone():
                        task = loop.create_task(conn.start_tls())
                        self._tasks.add(task)
                        task.add_done_callback(self._tasks.discard)
                await asyncio.sleep(0)  # the loop's next turn: I/O first
        finally:
            self._starter = None

    def __call__(self, *args: Any, **kwargs: Any) -> Connection:
        return Connection(self, lambda: H11Protocol(*args, **kwargs))

    def started(self, scope: dict) -> Connection | None:
        """The connection a request arrived on, told that the app has it."""
        server, client = scope.get("server"), scope.get("client")
        conn = self.by_key.get(_key(server, client)) if server and client else None
        if conn is not None:
            conn.started()
        return conn
