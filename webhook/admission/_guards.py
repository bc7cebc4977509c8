"""The guards uvicorn lacks, on public asyncio API: one `Connection` in front of each of
uvicorn's own h11 protocol objects (stock, configured through `uvicorn.Config`).

uvicorn bounds what it buffers (h11's incomplete-event limit covers a request's head and
a chunked body's trailers; bodies pause reading past 64 KiB until the app reads), but
not time: a connection may take as long as it likes to finish its TLS handshake or its
request's head, and an answer its client never reads is held until the kernel gives up.
Nor does it bound how many connections are open. Each guard below names the attack it
stops; a guard that fires aborts the connection and counts it in
`initshift_connections_closed_total{reason}`.

`Front` is what uvicorn is given as its `http` protocol: a callable that makes one
`Connection` around one `H11Protocol`, forwarding the asyncio protocol calls. A listening
socket is a `Door` (its TLS context or none, its connection cap, its deadlines), found by
the port a connection arrived on. The app tells a connection when a request starts and
when its answer is done (`Front.started`/`Connection.answered`), found by the addresses
in the ASGI scope.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from .. import metrics

__all__ = ["Door", "Front", "Connection"]

EARLY_BYTES = 64 * 1024  # what a client may send before the server's TLS starts (a ClientHello is < 16 KiB)


@dataclass(eq=False)
class Door:
    """One listening socket's policy and the connections it holds."""

    name: str
    ssl: ssl.SSLContext | None
    max_connections: int
    header_timeout: float  # the handshake and each request's head
    write_timeout: float
    shutdown_timeout: float = 2.0  # a TLS close waiting for the client's close_notify
    open: dict["Connection", None] = field(default_factory=dict)
    idle: dict["Connection", None] = field(default_factory=dict)  # waiting for a request, oldest first

    def admit(self, conn: "Connection") -> bool:
        """Guard: a flood of connections, idle or slow, holding every place. At the cap the
        oldest connection still waiting for its request goes, never one inside a request:
        a client that sends its request at once always gets a place."""
        if len(self.open) >= self.max_connections:
            victim = next(iter(self.idle), None)
            if victim is None:
                return False
            victim.kill("over-limit")
            self.leave(victim)
        self.open[conn] = None
        return True

    def leave(self, conn: "Connection") -> None:
        self.open.pop(conn, None)
        self.idle.pop(conn, None)


class Connection(asyncio.Protocol):
    """One client connection: the deadlines around uvicorn's protocol object `inner`."""

    def __init__(self, front: "Front", inner: asyncio.Protocol) -> None:
        self.front, self.inner = front, inner
        self.door: Door | None = None
        self.raw: asyncio.Transport | None = None
        self.key: tuple | None = None
        self._early: list[bytes] | None = None  # bytes read before TLS took over the connection
        self.closed = asyncio.Event()  # the client is gone (the app stops waiting for it)
        self._deadline: asyncio.TimerHandle | None = None
        self._write_deadline: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.raw = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio's classes
        local, peer = transport.get_extra_info("sockname"), transport.get_extra_info("peername")
        self.door = door = self.front.doors[local[1]]
        self.key = _key(local, peer)
        if not door.admit(self):
            self.kill("over-limit")
            return
        self.front.by_key[self.key] = self
        self.waiting()
        if door.ssl is None:
            self.inner.connection_made(transport)
            return
        self._early = []
        asyncio.get_running_loop().create_task(self._start_tls(door))

    async def _start_tls(self, door: Door) -> None:
        assert self.raw is not None and door.ssl is not None
        loop = asyncio.get_running_loop()
        # start_tls puts its TLS protocol on the transport at once and starts it on the
        # loop's next turn; bytes that reached this connection before (the ClientHello,
        # when the loop read it first) go to that protocol ahead of everything else.
        loop.call_soon(self._hand_over_early)
        try:
            # Guard: a client that connects and never finishes its handshake (silent TCP,
            # a ClientHello byte by byte). asyncio's own default would wait 60 s.
            tls = await loop.start_tls(
                self.raw, self, door.ssl, server_side=True, ssl_handshake_timeout=door.header_timeout,
                ssl_shutdown_timeout=door.shutdown_timeout)
        except BaseException as e:  # handshake refused or timed out, or the client left
            self._release()
            self.raw.abort()
            if not isinstance(e, Exception):
                raise
            return
        self.inner.connection_made(tls)

    def data_received(self, data: bytes) -> None:
        if self._early is None:
            self.inner.data_received(data)
        elif sum(map(len, self._early)) + len(data) <= EARLY_BYTES:
            self._early.append(data)
        else:  # more than any ClientHello before TLS even started: not a TLS client
            self.kill("header-limit")

    def _hand_over_early(self) -> None:
        early, self._early = b"".join(self._early or ()), None
        if not early or self.raw is None or self.raw.is_closing():
            return
        tls = self.raw.get_protocol()
        if not hasattr(tls, "get_buffer"):
            tls.data_received(early)
            return
        while early:  # an asyncio.BufferedProtocol (asyncio's and uvloop's TLS protocols are)
            buf = tls.get_buffer(len(early))
            n = min(len(buf), len(early))
            buf[:n] = early[:n]
            tls.buffer_updated(n)
            early = early[n:]

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._release()
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        # Guard: an answer its client never reads (a full receive window, requests sent
        # without reading): the write buffer stays full, the connection goes after
        # INITSHIFT_WRITE_TIMEOUT_SECONDS instead of when the kernel gives up.
        if self._write_deadline is None and self.door is not None:
            self._write_deadline = asyncio.get_running_loop().call_later(
                self.door.write_timeout, self.kill, "write-timeout")
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None
        self.inner.resume_writing()

    # --- the request cycle, told by the app ----------------------------------------------------
    def waiting(self) -> None:
        """Waiting for a request: from accept, and again after each answer.

        Guard: a request's head sent slowly or never (slowloris, idle connections, a byte now
        and then to keep uvicorn's keep-alive timer from firing): the handshake and the head
        must arrive within INITSHIFT_HEADER_TIMEOUT_SECONDS."""
        assert self.door is not None
        self._cancel()
        self.door.idle[self] = None
        self._deadline = asyncio.get_running_loop().call_later(self.door.header_timeout, self.kill, "header-timeout")

    def started(self) -> None:
        """The app has the request (its head is complete); the body has its own deadline."""
        self._cancel()
        if self.door is not None:
            self.door.idle.pop(self, None)

    def answered(self) -> None:
        if self.raw is not None and not self.raw.is_closing():
            self.waiting()

    def kill(self, reason: str) -> None:
        metrics.CONNECTIONS_CLOSED.labels(reason).inc()
        self._cancel()
        if self.raw is not None:
            self.raw.abort()

    def _cancel(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _release(self) -> None:
        self._cancel()
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None
        if self.door is not None:
            self.door.leave(self)
        if self.key is not None and self.front.by_key.get(self.key) is self:
            del self.front.by_key[self.key]
        self.closed.set()


def _key(local: Any, peer: Any) -> tuple:
    """A connection's addresses as the ASGI scope gives them (`server` port, `client`)."""
    return (int(local[1]), str(peer[0]), int(peer[1]))


class Front:
    """uvicorn's `http` protocol factory: each connection it makes is guarded."""

    def __init__(self) -> None:
        self.doors: dict[int, Door] = {}  # by local port
        self.by_key: dict[tuple, Connection] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Connection:
        return Connection(self, H11Protocol(*args, **kwargs))

    def started(self, scope: dict) -> Connection | None:
        """The connection a request arrived on, told that its head is complete."""
        server, client = scope.get("server"), scope.get("client")
        conn = self.by_key.get(_key(server, client)) if server and client else None
        if conn is not None:
            conn.started()
        return conn
