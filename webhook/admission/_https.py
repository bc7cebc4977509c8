"""uvicorn over TLS with certificate reload: what `initshift serve`, `dev-server` and the
tests run.

The SSLContext is ours (uvicorn's `ssl_context_factory` hands it over), so the reloader
holds the very object the listening socket uses. The guards uvicorn lacks are added here:
a deadline for the TLS handshake (the event loop's `create_server`), and in the HTTP
protocol class a deadline for each request's headers, limits on their size and number, a
cap on open connections, on pipelined requests and on the time an unread answer is held,
so a slow, idle or oversized client cannot hold a connection for long or grow the process,
and many of them cannot exhaust it.

Metrics are not on the TLS port: like cert-manager (9402) or controller-runtime (8080),
`/metrics` is plain HTTP on its own port (INITSHIFT_METRICS_PORT, 0: off), which a
ServiceMonitor scrapes without the webhook's CA. It is served from the same event loop,
bounded (_metrics_port.py), and rendered on a thread of its own, so a slow scrape never
delays an admission review.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from typing import Any, Awaitable, Callable

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, httptools  # uvicorn's parser, its errors

from . import _tls as tls
from ._app import create_app
from ._metrics_port import MetricsPort
from .. import jsontext, metrics
from ..settings import ServerSettings, Settings


class _OneWrite:
    """The transport as one request's response sees it: what the response writes in one
    turn of the event loop goes out in one write. uvicorn writes an answer's head and body
    separately, which over TLS is two records, two system calls and two TCP segments, and
    the client wakes up for a head without its body; joined they are one of each."""

    __slots__ = ("_transport", "_loop", "_pending")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop = transport, loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _HeadRefused(Exception):
    """Raised from a parser callback to stop parsing a request the server refuses."""


class _GuardedProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol with the guards it lacks:

    - a connection cap, and a deadline for each request's headers: it runs from the moment
      a connection is ready (and again after each answer on a kept-alive one) until the
      headers are complete, however slowly bytes trickle in;
    - limits on the request's head (request line and headers: total bytes, one line's
      bytes, the number of fields), checked before the parser keeps the bytes: the parser
      itself grows a header by concatenation with no bound. A refused head is answered
      431 and the connection closed;
    - a bound on pipelined requests queued on one connection (no apiserver pipelines;
      a client that does so past the bound loses the connection);
    - a deadline for an answer its client does not read (writing paused, the send buffer
      full), after which the connection is dropped.
    """

    max_connections = 512
    header_timeout = 10.0
    write_timeout = 10.0
    max_headers = 100
    max_head_bytes = 32 * 1024
    max_line_bytes = 8 * 1024
    max_pipelined = 16

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._in_head = True  # the parser is inside a request's head (or before one)
        self._head_bytes = 0  # bytes fed to the parser since the current head began
        self._fields = 0
        self._refusal: str | None = None  # why the head was refused (431), "" to just drop

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            metrics.CONNECTIONS_CLOSED.labels("over-limit").inc()
            transport.abort()
            return
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._write_paused_end()
        super().connection_lost(exc)

    # --- the request head's limits ------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        """Feed the parser no more of a head than its limit: the part beyond it is never
        handed over. A body is fed whole; a pipelined head that starts inside the same read
        is bounded by the field limits below and by the size of one read."""
        self._unset_keepalive_if_required()
        while data and not self.transport.is_closing():
            if self._in_head:
                room = self.max_head_bytes - self._head_bytes
                if room <= 0:
                    self._refuse(f"request head over {self.max_head_bytes} bytes (INITSHIFT_MAX_HEADER_BYTES)")
                    return
                chunk, data = data[:room], data[room:]
                self._head_bytes += len(chunk)
            else:
                chunk, data = data, b""
            try:
                self.parser.feed_data(chunk)
            except _HeadRefused:
                self._refuse(self._refusal or "")
                return
            except httptools.HttpParserUpgrade:
                self._unsupported_upgrade_warning()  # no WebSockets here: as uvicorn does
                return
            except httptools.HttpParserError:
                if self._refusal is not None:  # raised in a callback, wrapped by the parser
                    self._refuse(self._refusal)
                else:
                    self.send_400_response("Invalid HTTP request received.")
                return

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._fields = 0

    def on_message_complete(self) -> None:
        super().on_message_complete()
        # What follows a request is the next one's head, counted from here.
        self._in_head, self._head_bytes = True, 0

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > self.max_line_bytes:
            self._stop(f"request line over {self.max_line_bytes} bytes (INITSHIFT_MAX_HEADER_LINE_BYTES)")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields += 1
        if self._fields > self.max_headers:
            self._stop(f"more than {self.max_headers} header fields (INITSHIFT_MAX_HEADERS)")
        if len(name) + len(value) > self.max_line_bytes:
            self._stop(f"a header field over {self.max_line_bytes} bytes (INITSHIFT_MAX_HEADER_LINE_BYTES)")
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm()
        super().on_headers_complete()
        if self.cycle is not None:  # the request's response, written in one piece (see _OneWrite)
            self.cycle.transport = _OneWrite(self.transport, self.loop)  # type: ignore[assignment]
        if len(self.pipeline) > self.max_pipelined:
            self._stop("")

    def _stop(self, why: str) -> None:
        self._refusal = why
        raise _HeadRefused(why)

    def _refuse(self, why: str) -> None:
        """431 with `why` and close; when an answer is still due on this connection (or
        `why` is empty: too many pipelined requests) drop the connection instead."""
        metrics.CONNECTIONS_CLOSED.labels("header-limit" if why else "pipelined").inc()
        busy = self.cycle is not None and not self.cycle.response_complete
        if not why or busy:
            self.transport.abort()
            return
        body = jsontext.dumps({"error": f"initshift: {why}"})
        self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))
        self.transport.pause_reading()
        self.transport.close()
        # A TLS close waits for the client's close_notify, reading (and dropping) what it
        # still sends meanwhile: a second for it to read the answer, then the socket goes.
        self.loop.call_later(1.0, self.transport.abort)

    # --- deadlines ------------------------------------------------------------------------------
    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.write_timeout, self._write_late)

    def resume_writing(self) -> None:
        self._write_paused_end()
        super().resume_writing()

    def _write_paused_end(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_late(self) -> None:
        self._write_timer = None
        metrics.CONNECTIONS_CLOSED.labels("write-timeout").inc()
        self.transport.abort()

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout, self._headers_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        idle = self.cycle is None or self.cycle.response_complete
        if idle and not self.transport.is_closing():
            metrics.CONNECTIONS_CLOSED.labels("header-timeout").inc()
            self.transport.abort()


def _protocol_for(srv: ServerSettings) -> type[_GuardedProtocol]:
    return type("InitshiftProtocol", (_GuardedProtocol,), {
        "max_connections": srv.max_connections, "header_timeout": srv.header_timeout_seconds,
        "write_timeout": srv.write_timeout_seconds, "max_headers": srv.max_headers,
        "max_head_bytes": srv.max_header_bytes, "max_line_bytes": srv.max_header_line_bytes})


def loop_factory(handshake_timeout: float) -> Callable[[], asyncio.AbstractEventLoop]:
    """The event loop uvicorn would pick (uvloop when installed), whose TLS servers give up
    on a handshake after `handshake_timeout` seconds instead of asyncio's 60."""
    # log_config=None: the default would re-apply uvicorn's own logging over initshift's JSON lines.
    factory = uvicorn.Config(app=None, log_config=None).get_loop_factory() or asyncio.new_event_loop
    probe = factory()
    base: type = type(probe)
    probe.close()

    class Loop(base):  # type: ignore[misc, valid-type]
        async def create_server(self, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("ssl") is not None:
                kwargs.setdefault("ssl_handshake_timeout", handshake_timeout)
            return await super().create_server(*args, **kwargs)

    return Loop


class HttpsServer:
    """The webhook app behind uvicorn, TLS 1.2+, reloading its certificate."""

    def __init__(self, settings: Settings, *, sock: socket.socket | None = None, reload_interval: float = 1.0,
                 graceful_seconds: float = 10.0, metrics_port: int | None = None, **app_kwargs: Any) -> None:
        """`metrics_port`: None uses INITSHIFT_METRICS_PORT (0 there turns metrics off); a
        number overrides it, 0 picking a free port (tests)."""
        srv = settings.server
        self.settings = settings
        self.ctx = tls.make_context(srv.tls_cert, srv.tls_key, srv.client_ca)
        self.reloader = tls.CertReloader(self.ctx, srv.tls_cert, srv.tls_key, srv.client_ca, reload_interval)
        self.app = create_app(settings, ready=self.reloader.valid, **app_kwargs)
        self.sock = sock
        config = uvicorn.Config(
            self.app, host=srv.host, port=srv.port, ssl_context_factory=lambda _cfg, _default: self.ctx,
            log_config=None, access_log=False, lifespan="off", server_header=False,
            timeout_graceful_shutdown=graceful_seconds, proxy_headers=False,
            http=_protocol_for(srv), timeout_keep_alive=srv.keepalive_timeout_seconds,  # type: ignore[arg-type]
        )
        self.uvicorn = uvicorn.Server(config)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._metrics_wanted = srv.metrics_port if metrics_port is None else metrics_port
        self._metrics_on = metrics_port is not None or srv.metrics_port != 0
        self._metrics: MetricsPort | None = None

    @property
    def metrics_port(self) -> int | None:
        """The bound metrics port while serving, None when off."""
        return self._metrics.port if self._metrics is not None else None

    @property
    def port(self) -> int:
        if self.sock is not None:
            return self.sock.getsockname()[1]
        return self.settings.server.port

    async def serve(self, *companions: Callable[[asyncio.Event], Awaitable[None]]) -> None:
        """Serve until uvicorn exits (signal or `stop()`); companions get a stop event."""
        stop = asyncio.Event()
        await self._start_metrics()
        tasks = [asyncio.create_task(self.reloader.watch(stop))]
        tasks += [asyncio.create_task(c(stop)) for c in companions]
        try:
            await self.uvicorn.serve(sockets=[self.sock] if self.sock is not None else None)
        finally:
            stop.set()
            for t in tasks:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(t, 5)
            await self._stop_metrics()

    async def _start_metrics(self) -> None:
        if not self._metrics_on or self._metrics is not None:
            return
        srv = self.settings.server
        self._metrics = MetricsPort(srv.metrics_host or srv.host, self._metrics_wanted)
        await self._metrics.start()

    async def _stop_metrics(self) -> None:
        if self._metrics is not None:
            await self._metrics.stop()
            self._metrics = None

    def run(self, *companions: Callable[[asyncio.Event], Awaitable[None]]) -> None:
        run_loop(self.serve(*companions), self.settings.server.header_timeout_seconds)

    # --- in a thread, for tests and benchmarks ------------------------------------------
    def start_in_thread(self, timeout: float = 20.0) -> "HttpsServer":
        def target() -> None:
            try:
                self.run()
            except BaseException as e:  # noqa: BLE001 - surfaced by start/stop
                self._error = e

        self._thread = threading.Thread(target=target, name="initshift-https", daemon=True)
        self._thread.start()
        deadline = threading.Event()
        for _ in range(int(timeout / 0.02)):
            if self.uvicorn.started or self._error or not self._thread.is_alive():
                break
            deadline.wait(0.02)
        if not self.uvicorn.started:
            raise RuntimeError(f"server did not start: {self._error!r}")
        return self

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(30)


def run_loop(main: Awaitable[None], handshake_timeout: float = 10.0) -> None:
    """Run `main` on the guarded event loop (`loop_factory`) with the standard library's
    Runner rather than uvicorn's private helper."""
    with asyncio.Runner(loop_factory=loop_factory(handshake_timeout)) as runner:
        runner.run(main)  # type: ignore[arg-type]


def bind(host: str = "127.0.0.1", port: int = 0, *, reuse_port: bool = False) -> socket.socket:
    """A listening socket; port 0 picks a free one with no race between choice and bind.
    `reuse_port`: one of several processes' sockets on the port (SO_REUSEPORT: the kernel
    spreads new connections evenly over them)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(1024)  # a burst of new connections waits in the kernel, not refused
    sock.set_inheritable(True)
    return sock
