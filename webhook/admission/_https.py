"""uvicorn over TLS with certificate reload: what `initshift serve`, `dev-server` and the
tests run.

The SSLContext is ours (uvicorn's `ssl_context_factory` hands it over), so the reloader
holds the very object the listening socket uses. The guards uvicorn lacks are added here:
a deadline for the TLS handshake (the event loop's `create_server`), a deadline for each
request's headers and a cap on open connections (the HTTP protocol class), so a slow or
idle client cannot hold a connection for long and many of them cannot exhaust the process.

Metrics are not on the TLS port: like cert-manager (9402) or controller-runtime (8080),
`/metrics` is plain HTTP on its own port (INITSHIFT_METRICS_PORT, 0: off), which a
ServiceMonitor scrapes without the webhook's CA. prometheus_client serves it from a
thread of its own, so a slow scrape never delays an admission review.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from typing import Any, Awaitable, Callable

import uvicorn
from prometheus_client import start_http_server
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from . import _tls as tls
from ._app import create_app
from .. import metrics
from ..settings import ServerSettings, Settings


class _GuardedProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol with a connection cap and a deadline for each request's
    headers: it runs from the moment a connection is ready (and again after each answer on
    a kept-alive one) until the headers are complete, however slowly bytes trickle in."""

    max_connections = 512
    header_timeout = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            metrics.CONNECTIONS_CLOSED.labels("over-limit").inc()
            transport.abort()
            return
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()

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
    return type("InitshiftProtocol", (_GuardedProtocol,), {"max_connections": srv.max_connections,
                                                          "header_timeout": srv.header_timeout_seconds})


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
        self._metrics_server: Any = None
        self.metrics_port: int | None = None  # the bound port while serving, None when off

    @property
    def port(self) -> int:
        if self.sock is not None:
            return self.sock.getsockname()[1]
        return self.settings.server.port

    async def serve(self, *companions: Callable[[asyncio.Event], Awaitable[None]]) -> None:
        """Serve until uvicorn exits (signal or `stop()`); companions get a stop event."""
        stop = asyncio.Event()
        self._start_metrics()
        tasks = [asyncio.create_task(self.reloader.watch(stop))]
        tasks += [asyncio.create_task(c(stop)) for c in companions]
        try:
            await self.uvicorn.serve(sockets=[self.sock] if self.sock is not None else None)
        finally:
            stop.set()
            for t in tasks:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(t, 5)
            self._stop_metrics()

    def _start_metrics(self) -> None:
        if not self._metrics_on or self._metrics_server is not None:
            return
        server, _thread = start_http_server(self._metrics_wanted, self.settings.server.host,
                                            registry=metrics.serving_registry())
        self._metrics_server = server
        self.metrics_port = server.server_port

    def _stop_metrics(self) -> None:
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
            self._metrics_server, self.metrics_port = None, None

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
