"""`initshift serve`: the admission server over HTTPS, optionally with the watcher.

One process per pod: the Deployment scales by replicas. Settings come from the environment
(the settings table in docs/admission-server.md); flags override the few that are handy
on a command line.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Awaitable, Callable

from .. import logs
from ..errors import InitshiftError
from ..settings import Settings, SettingsError, port_number, settings_warnings
from ._common import EXIT_OK, EXIT_USAGE, CliError, Parser, add_kubeconfig_args, fatal, load_settings

if TYPE_CHECKING:
    from ..admission import HttpsServer
    from ..kube import KubeApi

_Companion = Callable[[asyncio.Event], Awaitable[None]]
SWITCH_INTERVAL = 0.0005  # seconds
EXIT_CODES = ("SIGUSR1 drains the server (every answer then closes its connection), as the Deployment's preStop "
              "hook does before SIGTERM. Exit codes: 0 stopped (SIGTERM), 1 the certificate, a port, the cluster or a "
              "companion (the watcher) failed, 2 usage or settings.")


def port(text: str) -> int:
    """argparse's type for a port flag: one clear line for a bad one."""
    try:
        return port_number(text)
    except SettingsError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("port: ")) from None


def parser(prog: str = "initshift serve") -> argparse.ArgumentParser:
    ap = Parser(prog=prog, description="Run the mutating admission webhook over HTTPS.", epilog=EXIT_CODES)
    ap.add_argument("--host", help="bind address (default: INITSHIFT_HOST)")
    ap.add_argument("--port", type=port, help="port (default: INITSHIFT_PORT)")
    ap.add_argument("--watch", action="store_true", help="also run the watcher")
    add_kubeconfig_args(ap)
    return ap


def with_flags(settings: Settings, args: argparse.Namespace) -> Settings:
    srv = settings.server
    changes = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    return settings.replace(server=dataclasses.replace(srv, **changes)) if changes else settings


async def serve(settings: Settings, *, watch: bool = False, on_started: Callable[["HttpsServer"], None] | None = None,
                named: bool = False) -> None:
    """Self-managed certificates first (if on), then uvicorn with its companions. `named`:
    the user named a kubeconfig or context (flags, $KUBECONFIG), so it must work."""
    from ..admission import HttpsServer, detect_native_support, ensure_certificates, keep_certificates_fresh

    companions: list[_Companion] = []
    native = None
    # Every client made here is closed on every path, a failed start-up's included
    # (else aiohttp logs "Unclosed client session" after the one error line).
    api, no_api = await _connect(settings, watch=watch, named=named)
    try:
        if settings.server.self_managed_certs:
            await ensure_certificates(settings, api)

            async def certificate_renewal(stop: asyncio.Event) -> None:
                await keep_certificates_fresh(settings, api, stop)
            companions.append(certificate_renewal)
        resolver = None
        if settings.registry.lookup:
            from ..registry import make_resolver

            resolver = make_resolver(settings)
        if watch:
            from ..watcher import run_watcher

            async def watcher(stop: asyncio.Event) -> None:
                await run_watcher(settings, stop)
            companions.append(watcher)
        from ..kube import LimitRanges, Namespaces, ResourceQuotas

        limit_ranges = LimitRanges(api) if api is not None else None
        quotas = ResourceQuotas(api) if api is not None else None
        namespaces = Namespaces(api) if api is not None else None
        for view in (limit_ranges, quotas, namespaces):
            if view is not None:
                companions.append(view.run)
        native = await detect_native_support(settings, api, no_api=no_api)  # auto: apiserver and kubelet versions
        companions.append(native.run)
        server = HttpsServer(settings, resolver=resolver, native_supported=native.current, strategy=native.strategy,
                             limit_ranges=limit_ranges, quotas=quotas, namespaces=namespaces)
        server.listen()  # a port in use fails here, in one line
        companions.append(_when_started(server, on_started))
        # What start-up allocated (modules, FastAPI's models: about 60,000 objects) lives as
        # long as the process: out of the collector's sight, a full collection costs
        # microseconds instead of about 16 ms in the middle of some review.
        gc.freeze()
        # A large review's thread is CPU work; the event loop, between two system calls of a
        # small review, waits for the GIL at most this long (Python's default: 5 ms, which
        # a small review pays at each of its dozen waits while a large one runs).
        sys.setswitchinterval(SWITCH_INTERVAL)
        await server.serve(*companions)
    finally:
        if native is not None:
            await native.close()
        if api is not None:
            await api.close()


async def _connect(settings: Settings, *, watch: bool, named: bool) -> tuple["KubeApi | None", str | None]:
    """The API client, before anything listens: (client, None), or (None, why) when nothing
    needs the cluster. Self-managed certificates, --watch and a kubeconfig or context the
    user named fail start-up without it; only the implicit case serves on without."""
    from ..kube import KubeApi, KubeError

    try:
        return await KubeApi.from_config(), None
    except KubeError as e:
        if settings.server.self_managed_certs:
            raise CliError(f"INITSHIFT_SELF_MANAGED_CERTS needs the cluster: {e}") from None
        if watch:  # the watcher builds its own client later, from the same configuration
            raise CliError(f"--watch needs the cluster: {e}") from None
        if named:
            raise CliError(str(e)) from None
        # `make run` on a laptop: the rewrite works without the cluster
        auto = "; native sidecars: auto falls back to waiter" if settings.rewrite.native_sidecars == "auto" else ""
        if settings.feature_gate:  # (without it no pod is rewritten: the start-up line says so)
            logging.getLogger("initshift.server").warning(
                "no API access (%s): LimitRanges, ResourceQuotas and namespaces are not read, so a namespace's "
                "LimitRange or quota may refuse a rewritten pod%s", e, auto)
        return None, str(e)


def _when_started(server: "HttpsServer", callback: Callable[["HttpsServer"], None] | None) -> _Companion:
    """Once uvicorn serves: one line saying where (a port 0 asked for is the port picked),
    then `callback` (dev-server's banner)."""
    async def started(stop: asyncio.Event) -> None:
        while not server.uvicorn.started:
            if stop.is_set():
                return
            await asyncio.sleep(0.02)
        logging.getLogger("initshift.server").info("serving: %s", server.where())
        if callback is not None:
            callback(server)
    return started


def run(settings: Settings, *, watch: bool = False, on_started: Callable[["HttpsServer"], None] | None = None,
        kube: tuple[str | None, str | None] = (None, None), prog: str = "initshift serve") -> int:
    """`initshift serve` (and `dev-server`). `kube`: --kubeconfig/--context for every API
    client. From here on every stderr line is JSON, a start-up failure included (one
    `error` line)."""
    from certs.pki import PKIError

    from ..admission import run_loop
    from ..kube import use_config

    logs.configure(settings.server.log_level)
    for line in settings_warnings():
        logging.getLogger("initshift.cli").warning(line)
    use_config(*kube)
    # A kubeconfig or context the user named (flags, $KUBECONFIG) must work; only the
    # implicit one (~/.kube/config, the service account) may be missing (`make run`).
    named = any(kube) or bool(os.environ.get("KUBECONFIG"))
    # While uvicorn serves it takes SIGTERM and SIGINT for a graceful stop, then raises the
    # signal again for the handler it found: this one, which ends the command with 0 after
    # the companions stopped (and stops start-up the same way).
    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        run_loop(serve(settings, watch=watch, on_started=on_started, named=named))
    except (InitshiftError, OSError, PKIError) as e:
        # Start-up failures (files, ports, the API: TLSError, ListenError, KubeError,
        # PKIError), or a companion that failed while serving (WatcherStopped).
        return fatal(prog, e)
    except SystemExit:
        return EXIT_OK
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return EXIT_OK


def _stop(_signum: int, _frame: object) -> None:
    raise SystemExit(EXIT_OK)


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    settings = load_settings("initshift serve", lambda s: with_flags(s, args))
    if settings is None:
        return EXIT_USAGE
    return run(settings, watch=args.watch, kube=(args.kubeconfig, args.context))
