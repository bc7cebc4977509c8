"""uvicorn over TLS with certificate reload: what `initshift serve`, `dev-server` and the
tests run.

The SSLContext is ours (uvicorn's `ssl_context_factory` hands it over), so the reloader
holds the very object the listening socket uses.

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

from . import _tls as tls
from ._app import create_app
from .. import metrics
from ..settings import Settings


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
                                            registry=metrics.REGISTRY)
        self._metrics_server = server
        self.metrics_port = server.server_port

    def _stop_metrics(self) -> None:
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
            self._metrics_server, self.metrics_port = None, None

    def run(self, *companions: Callable[[asyncio.Event], Awaitable[None]]) -> None:
        run_loop(self.serve(*companions), self.uvicorn.config)

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


def run_loop(main: Awaitable[None], config: uvicorn.Config | None = None) -> None:
    """Run `main` on the event loop uvicorn would pick (uvloop when installed), with the
    standard library's Runner rather than uvicorn's private helper."""
    factory = (config or uvicorn.Config(app=None)).get_loop_factory()
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main)  # type: ignore[arg-type]


def bind(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening socket; port 0 picks a free one with no race between choice and bind."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock
