"""The server `initshift serve` runs: stock uvicorn, configured through its public options,
with the guards of _guards.py in front of each connection.

One uvicorn server listens on two sockets: the webhook's (TLS, admission and health only)
and the metrics port (plain HTTP, prometheus_client's own ASGI exposition, scraped without
the webhook's CA, like cert-manager's 9402 or controller-runtime's 8080). uvicorn's options
bound the rest: its h11 protocol buffers at most `h11_max_incomplete_event_size` of a head
(INITSHIFT_MAX_HEADER_BYTES, else HTTP 400; the guards refuse a larger one first); `ws="none"`
makes an `Upgrade` request an ordinary one; `timeout_keep_alive` is a backstop behind the
guards' idle deadline; `limit_concurrency` is a backstop the guards keep it from reaching (503);
`timeout_graceful_shutdown` is what SIGTERM waits for.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import signal
import socket
import threading
from typing import Any, Awaitable, Callable

import uvicorn
from prometheus_client import make_asgi_app

from . import _tls as tls
from ._app import MUTATE_PATH, create_app
from ._guards import Door, Front
from .. import metrics
from ..errors import InitshiftError, os_reason
from ..settings import Settings

# A Prometheus server or two scrape one connection each; a flood of idle ones is evicted.
METRICS_CONNECTIONS = 16
DRAIN_SIGNAL = signal.SIGUSR1  # sent by the Deployment's preStop hook
CLOSE = (b"connection", b"close")

log = logging.getLogger("initshift.server")


def _not_about_websockets(record: logging.LogRecord) -> bool:
    """uvicorn warns twice per `Upgrade` request that it has no WebSocket support; with
    `ws="none"` that is the design, and a flood of them must not flood the log."""
    return not str(record.msg).startswith(("Unsupported upgrade request", "No supported WebSocket library"))


class ListenError(InitshiftError):
    """A port cannot be listened on; the message names the setting."""


class CompanionStopped(InitshiftError):
    """A part running beside the server (the watcher, certificate renewal) was cancelled
    while the server was serving."""


class HttpsServer:
    """The webhook app and the metrics exposition behind uvicorn, TLS 1.2+, reloading its
    certificate."""

    def __init__(self, settings: Settings, *, sock: socket.socket | None = None, reload_interval: float = 1.0,
                 graceful_seconds: float = 10.0, metrics_port: int | None = None, **app_kwargs: Any) -> None:
        """`sock`: the webhook's listening socket (default: bound at `serve()`);
        `metrics_port`: None uses INITSHIFT_METRICS_PORT (0 there turns metrics off); a
        number overrides it, 0 picking a free port (tests)."""
        srv = settings.server
        self.settings, self.sock = settings, sock
        self.reloader = tls.CertReloader(srv.tls_cert, srv.tls_key, srv.client_ca, reload_interval)
        self.app = create_app(settings, ready=self.reloader.valid, **app_kwargs)
        self.metrics_app = make_asgi_app(registry=metrics.REGISTRY)
        self.metrics_sock: socket.socket | None = None
        # None: metrics off (INITSHIFT_METRICS_PORT=0 and no port asked for)
        self._metrics_wanted = metrics_port if metrics_port is not None else srv.metrics_port or None
        self.front = Front()
        limits = (srv.header_timeout_seconds, srv.body_timeout_seconds, srv.keepalive_timeout_seconds,
                  srv.write_timeout_seconds, srv.max_header_bytes)
        self.door = Door(lambda: self.reloader.ctx, srv.max_connections, *limits)
        self.metrics_door = Door(None, METRICS_CONNECTIONS, *limits)
        config = uvicorn.Config(
            self._dispatch, interface="asgi3", http=self.front, ws="none", lifespan="off",  # type: ignore[arg-type]
            h11_max_incomplete_event_size=srv.max_header_bytes,
            limit_concurrency=2 * (srv.max_connections + METRICS_CONNECTIONS),
            # uvicorn's keep-alive timer runs from an answer until the guards hand it the next
            # head: a backstop behind their idle and head deadlines, never before them.
            timeout_keep_alive=srv.keepalive_timeout_seconds + srv.header_timeout_seconds,  # type: ignore[arg-type]
            timeout_graceful_shutdown=graceful_seconds,  # type: ignore[arg-type]
            # log_config=None: uvicorn's own would replace initshift's JSON lines.
            log_config=None, access_log=False, server_header=False, proxy_headers=False,
        )
        self.uvicorn = uvicorn.Server(config)
        self.draining = False
        logging.getLogger("uvicorn.error").addFilter(_not_about_websockets)

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1] if self.sock is not None else self.settings.server.port

    @property
    def metrics_port(self) -> int | None:
        """The bound metrics port while serving, None when off."""
        return self.metrics_sock.getsockname()[1] if self.metrics_sock is not None else None

    def where(self) -> str:
        """Where it listens, by the bound sockets (a port 0 asked for is the one picked)."""
        def url(scheme: str, sock: socket.socket, path: str) -> str:
            host, port = sock.getsockname()[:2]
            return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}{path}"
        assert self.sock is not None, "listen() first"
        metrics = url("http", self.metrics_sock, "/metrics") if self.metrics_sock is not None else "off"
        return f"webhook on {url('https', self.sock, MUTATE_PATH)}, metrics {metrics}"

    async def _dispatch(self, scope: dict, receive: Any, send: Any) -> None:
        """TLS connections get the webhook, plain ones (the metrics port) the exposition."""
        if scope["type"] != "http":
            return
        conn = self.front.started(scope)
        if self.draining:
            send = _closing(send)
        try:
            if scope["scheme"] == "https":
                await self.app(scope, receive, send, conn)
            elif scope["path"] == "/metrics":
                if conn is not None:
                    conn.working()
                await self.metrics_app(scope, receive, send)
            else:
                await send({"type": "http.response.start", "status": 404,
                            "headers": [(b"content-type", b"text/plain"), (b"content-length", b"24")]})
                await send({"type": "http.response.body", "body": b"metrics are at /metrics\n"})
        finally:
            if conn is not None:
                conn.answered()

    def listen(self) -> None:
        """Bind what is not bound yet; ListenError names the setting."""
        srv = self.settings.server
        metrics_host = srv.metrics_host or srv.host
        # serve's --host/--port override INITSHIFT_HOST/INITSHIFT_PORT: name both forms.
        host_setting = "INITSHIFT_HOST or --host"
        metrics_host_setting = "INITSHIFT_METRICS_HOST" if srv.metrics_host else host_setting
        webhook_port = self.port if self.sock is not None else srv.port
        if (self.metrics_sock is None and self._metrics_wanted and self._metrics_wanted == webhook_port
                and _overlap(srv.host, metrics_host)):
            # Checked before binding: the kernel would only say "address already in use", as
            # if something else held the port.
            raise ListenError(f"cannot listen on port {webhook_port} for metrics (INITSHIFT_METRICS_PORT): it is the "
                              f"HTTPS server's port (INITSHIFT_PORT or --port) too; {_METRICS_PORT_HINT}")
        if self.sock is None:
            self.sock = _listen(srv.host, srv.port, host_setting, "INITSHIFT_PORT or --port")
        if self._metrics_wanted is not None and self.metrics_sock is None:
            self.metrics_sock = _listen(metrics_host, self._metrics_wanted, metrics_host_setting,
                                        "INITSHIFT_METRICS_PORT", port_hint=_METRICS_PORT_HINT)
        self.front.doors[self.port] = self.door
        if self.metrics_sock is not None:
            self.front.doors[self.metrics_sock.getsockname()[1]] = self.metrics_door

    async def serve(self, *companions: Callable[[asyncio.Event], Awaitable[None]]) -> None:
        """Serve until uvicorn exits (signal or `stop()`); companions get a stop event."""
        self.listen()
        stop = asyncio.Event()
        tasks = [asyncio.create_task(self.reloader.watch(stop), name="certificate reload")]
        tasks += [asyncio.create_task(c(stop), name=_name(c)) for c in companions]
        failed: list[BaseException] = []

        def ended(task: asyncio.Task) -> None:
            # A companion that fails while serving (the watcher: WatcherStopped), or is
            # cancelled by no one here (a library's stray cancellation), stops the server: the
            # process exits 1 and the kubelet restarts it, rather than serving on without it.
            if stop.is_set():
                return
            if task.cancelled():
                failed.append(CompanionStopped(f"{task.get_name()} was cancelled while the server was serving"))
                self.stop()
            elif task.exception() is not None:
                failed.append(task.exception())  # type: ignore[arg-type]
                self.stop()
        for task in tasks:
            task.add_done_callback(ended)
        sockets = [s for s in (self.sock, self.metrics_sock) if s is not None]
        loop = asyncio.get_running_loop()
        signals = threading.current_thread() is threading.main_thread()  # as uvicorn's own handlers
        if signals:
            loop.add_signal_handler(DRAIN_SIGNAL, self.drain)
        try:
            await self.uvicorn.serve(sockets=sockets)
        finally:
            if signals:
                loop.remove_signal_handler(DRAIN_SIGNAL)
            stop.set()
            done, pending = await asyncio.wait(tasks, timeout=5)
            for task in pending:
                task.cancel()
            if self.metrics_sock is not None:
                self.metrics_sock.close()
        errors = failed or [t.exception() for t in done if not t.cancelled() and t.exception() is not None]
        if errors:
            raise errors[0]  # type: ignore[misc]

    def run(self, *companions: Callable[[asyncio.Event], Awaitable[None]]) -> None:
        run_loop(self.serve(*companions))

    def stop(self) -> None:
        self.uvicorn.should_exit = True

    def drain(self) -> None:
        """From now on every answer closes its connection (`Connection: close`).

        A replica about to stop (the Deployment's preStop hook sends DRAIN_SIGNAL, then
        sleeps before the SIGTERM) would otherwise close the apiserver's kept-alive
        connections at its SIGTERM, and a review the apiserver writes to one in that instant
        fails: the apiserver does not resend a POST. Told by the answer instead, it opens a
        new connection for its next review, through the Service to a replica that stays."""
        if not self.draining:
            log.info("draining: every answer closes its connection (SIGTERM to follow)")
        self.draining = True


def _closing(send: Callable[[dict], Awaitable[None]]) -> Callable[[dict], Awaitable[None]]:
    """`send` with `Connection: close` on the answer's head: uvicorn's h11 protocol then
    closes the connection once the answer is written."""
    async def closing(message: dict) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), CLOSE]}
        await send(message)
    return closing


def _name(companion: Callable[..., Any]) -> str:
    """What a companion is called in an error: its function's name, without the scopes."""
    return getattr(companion, "__qualname__", repr(companion)).rsplit("<locals>.", 1)[-1]


def run_loop(main: Awaitable[None]) -> None:
    """Run `main` on the event loop uvicorn would pick (uvloop when installed)."""
    factory = uvicorn.Config(app=None, log_config=None).get_loop_factory()
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main)  # type: ignore[arg-type]


def bind(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening socket; port 0 picks a free one with no race between choice and bind.
    An IPv6 address works, bracketed or not; `::` listens on IPv6 and IPv4 both, and so does
    an empty host, on IPv4 alone where the node has no IPv6."""
    host = unbracketed(host)
    if not host:
        try:
            return bind("::", port)
        except OSError as e:
            if e.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                raise
            return bind("0.0.0.0", port)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if host == "::":
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # dual stack
        sock.bind((host, port))
        sock.listen(1024)  # a burst of new connections waits in the kernel, not refused
    except BaseException:
        sock.close()
        raise
    return sock


def unbracketed(host: str) -> str:
    """`[::1]` as `::1`. Kubernetes' bind-address flags take a bare IP, but brackets are how
    an IPv6 address is written next to a port (`[::1]:8443`, a URL), and a user who writes
    them means the address: accepted rather than refused, as Go's listeners accept them."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") and ":" in host else host


def _overlap(a: str, b: str) -> bool:
    """Whether listening on `a` and `b` (same port) would clash: the same address, or a
    wildcard covering the other (an empty host and `::` are dual stack)."""
    a, b = unbracketed(a), unbracketed(b)
    if a == b or {a, b} & {"", "::"}:
        return True
    return "0.0.0.0" in (a, b) and ":" not in a + b


# What bind() says when the address is the problem, not the port (besides gaierror, a name
# that does not resolve): an address no interface of this machine has, an IPv6 one where the
# node has no IPv6, one it cannot bind at all (a link-local one without its %interface).
_HOST_ERRORS = {errno.EADDRNOTAVAIL: "no interface of this machine has that address",
                errno.EAFNOSUPPORT: "this machine has no IPv6",
                errno.EINVAL: "not an address this machine can listen on"}
_PORT_ERRORS = {errno.EADDRINUSE, errno.EACCES}
_METRICS_PORT_HINT = "give the metrics another port, or 0 to turn them off"


def _listen(host: str, port: int, host_setting: str, port_setting: str, port_hint: str = "") -> socket.socket:
    """`bind`, or a ListenError naming the setting to change; `port_hint`: what to do about a
    port in use or denied (said after the reason)."""
    try:
        return bind(host, port)
    except OSError as e:
        shown = unbracketed(host)
        where = f"[{shown}]:{port}" if ":" in shown else f"{shown}:{port}" if shown else f"port {port}"
        if isinstance(e, socket.gaierror):
            setting, why = host_setting, f"not an IP address, nor a name that resolves ({os_reason(e)})"
        elif e.errno in _HOST_ERRORS:
            setting, why = host_setting, _HOST_ERRORS[e.errno]
        elif e.errno in _PORT_ERRORS:
            # EACCES: a port below 1024 without CAP_NET_BIND_SERVICE.
            setting, why = port_setting, os_reason(e) + (" (a port below 1024 needs privileges)"
                                                         if e.errno == errno.EACCES and 0 < port < 1024 else "")
            why += f"; {port_hint}" if port_hint else ""
        else:
            setting, why = f"{host_setting}; {port_setting}", os_reason(e)
        raise ListenError(f"cannot listen on {where} ({setting}): {why}") from None
