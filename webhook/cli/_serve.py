"""`initshift serve`: the admission server over HTTPS, optionally with the watcher.

Settings come from the environment (the settings table in docs/admission-server.md); flags
override the few that are handy on a command line.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import os
import socket
from typing import TYPE_CHECKING, Awaitable, Callable

from .. import logs
from ..settings import Settings
from ._common import EXIT_OK, EXIT_USAGE, Parser, add_kubeconfig_args, describe, fatal, load_settings
from ..admission import TLSError

if TYPE_CHECKING:
    from ..admission import HttpsServer

_Companion = Callable[[asyncio.Event], Awaitable[None]]


def parser(prog: str = "initshift serve") -> argparse.ArgumentParser:
    ap = Parser(prog=prog, description="Run the mutating admission webhook over HTTPS.")
    ap.add_argument("--host", help="bind address (default: INITSHIFT_HOST)")
    ap.add_argument("--port", type=int, help="port (default: INITSHIFT_PORT)")
    ap.add_argument("--watch", action="store_true", help="also run the watcher (in the first server process)")
    add_kubeconfig_args(ap)
    # A worker started by the supervisor (webhook/admission/_workers.py): not for people.
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    return ap


def with_flags(settings: Settings, args: argparse.Namespace) -> Settings:
    srv = settings.server
    changes = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    return settings.replace(server=dataclasses.replace(srv, **changes)) if changes else settings


async def serve(settings: Settings, *, watch: bool = False, on_started: Callable[[], None] | None = None,
                sock: socket.socket | None = None, worker: int = 0) -> None:
    """Self-managed certificates first (if on, in worker 0 only), then uvicorn with its
    companions, on `sock` when the supervisor passed one."""
    from ..admission import HttpsServer

    if worker > 0:  # the metrics port is worker 0's: it serves every worker's values
        settings = settings.replace(server=dataclasses.replace(settings.server, metrics_port=0))
    companions: list[_Companion] = []
    api = None
    if settings.server.self_managed_certs and worker == 0:
        from ..admission import ensure_certificates, keep_certificates_fresh
        from ..kube import KubeApi

        api = await KubeApi.from_config()
        await ensure_certificates(settings, api)
        companions.append(lambda stop: keep_certificates_fresh(settings, api, stop))
    resolver = None
    if settings.registry.lookup:
        from ..registry import make_resolver

        resolver = make_resolver(settings)
    if watch:
        from ..watcher import run_watcher

        companions.append(lambda stop: run_watcher(settings, stop))
    from ..admission import detect_native_support as detect_native

    native = await detect_native(settings, api)  # auto: apiserver and kubelet versions
    companions.append(native.run)
    server = HttpsServer(settings, sock=sock, resolver=resolver, native_supported=native.current,
                         strategy=native.strategy)
    if on_started is not None:
        companions.append(_when_started(server, on_started))
    # What start-up allocated (modules, FastAPI's models: about 60,000 objects) lives as long
    # as the process: out of the collector's sight, a full collection costs microseconds
    # instead of about 16 ms in the middle of some review.
    gc.freeze()
    try:
        await server.serve(*companions)
    finally:
        await native.close()
        if api is not None:
            await api.close()


def _when_started(server: "HttpsServer", callback: Callable[[], None]) -> _Companion:
    async def wait(stop: asyncio.Event) -> None:
        while not server.uvicorn.started:
            if stop.is_set():
                return
            await asyncio.sleep(0.02)
        callback()
    return wait


def _kube_flags(kube: tuple[str | None, str | None]) -> list[str]:
    """--kubeconfig/--context again, for the worker processes."""
    return [a for flag, value in zip(("--kubeconfig", "--context"), kube) if value for a in (flag, value)]


def run(settings: Settings, *, watch: bool = False, on_started: Callable[[], None] | None = None,
        kube: tuple[str | None, str | None] = (None, None), prog: str = "initshift serve") -> int:
    """`initshift serve`: one process, or a supervisor and INITSHIFT_WORKERS of them.
    `kube`: --kubeconfig/--context for every API client of the serving processes (the
    supervisor makes no API call: it never imports the kube package, ~48 MB of
    kubernetes-asyncio). From here on every stderr line is JSON, a start-up failure
    included (one `error` line)."""
    from ..admission import Supervisor, bind, worker_count

    logs.configure(settings.server.log_level)
    count = worker_count(settings.server.workers)
    if count == 1:
        return _run_one(settings, prog, watch=watch, on_started=on_started, kube=kube)
    srv = settings.server
    try:  # fail here, once, when the port is taken (the workers bind it with SO_REUSEPORT)
        bind(srv.host, srv.port).close()
    except OSError as e:
        return fatal(prog, f"cannot listen on {srv.host}:{srv.port}: {describe(e)}")
    return Supervisor(settings, count, watch=watch, worker_args=_kube_flags(kube)).run(on_started)


def _run_one(settings: Settings, prog: str, *, watch: bool = False, on_started: Callable[[], None] | None = None,
             sock: socket.socket | None = None, worker: int = 0,
             kube: tuple[str | None, str | None] = (None, None)) -> int:
    from certs.pki import PKIError

    from ..admission import run_loop
    from ..kube import KubeError, use_config

    use_config(*kube)

    try:
        run_loop(serve(settings, watch=watch, on_started=on_started, sock=sock, worker=worker),
                 settings.server.header_timeout_seconds)
    except (TLSError, OSError, KubeError, PKIError) as e:  # start-up failures (files, API, certificates)
        return fatal(prog, e)
    except KeyboardInterrupt:
        return EXIT_OK
    return EXIT_OK


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    settings = load_settings("initshift serve", lambda s: with_flags(s, args))
    if settings is None:
        return EXIT_USAGE
    kube = (args.kubeconfig, args.context)
    if args.worker is None:
        return run(settings, watch=args.watch, kube=kube)
    from ..admission import bind, die_with_parent

    die_with_parent()
    logs.configure(settings.server.log_level)
    ready_fd = args.ready_fd

    def started() -> None:
        if ready_fd is not None:
            os.write(ready_fd, f"{args.worker}\n".encode())

    srv = settings.server
    try:
        sock = bind(srv.host, srv.port, reuse_port=True)
    except OSError as e:
        return fatal("initshift serve", f"cannot listen on {srv.host}:{srv.port}: {describe(e)}")
    return _run_one(settings, "initshift serve", watch=args.watch, on_started=started, sock=sock, worker=args.worker,
                    kube=kube)
