"""`initshift watch`: run the companion watcher until SIGINT/SIGTERM.

Settings come from the environment (the settings table in docs/admission-server.md,
INITSHIFT_WATCH_* and friends); the flags override the ones handy on a command line.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import math
import signal
import sys

from .. import __version__, k8snames, logs
from ..errors import InitshiftError
from ..kube import KubeApi, KubeError
from ..settings import Settings, SettingsError, name_problem, settings_warnings
from ._common import EXIT_ERROR, EXIT_OK, EXIT_USAGE, Parser, add_kubeconfig_args, fatal, load_settings

_PROG = "initshift watch"


def namespace(text: str) -> str:
    """argparse's type for -n: INITSHIFT_WATCH_NAMESPACES's rule (an RFC 1123 label), so
    `-n ''` is not "every namespace" and `-n a,b` not a namespace named "a,b"."""
    problem = name_problem(text, k8snames.DNS_LABEL)
    if problem:
        several = "; one namespace per -n" if "," in text else ""
        raise argparse.ArgumentTypeError(f"{problem}{several}")
    return text


def parser() -> argparse.ArgumentParser:
    ap = Parser(prog=_PROG, description="Watch managed pods: open the ready gate, record the "
                                 "outcome, end sidecars. Finds the API server as kubectl does.",
                epilog="Exit codes: 0 stopped by SIGINT or SIGTERM, 1 no configuration to reach the API server "
                       "with (an unreachable server is retried, not fatal) or a part of the watcher failed, "
                       "2 usage or a bad INITSHIFT_* setting.")
    add_kubeconfig_args(ap)
    ap.add_argument("-n", "--namespace", action="append", dest="namespaces", metavar="NS", type=namespace,
                    help="watch this namespace (repeatable; default: INITSHIFT_WATCH_NAMESPACES, else all)")
    ap.add_argument("--no-leader-election", action="store_true", help="act without holding the Lease "
                    "(one replica only)")
    ap.add_argument("--grace-seconds", type=float, help="override INITSHIFT_GRACE_SECONDS")
    return ap


def with_flags(settings: Settings, args: argparse.Namespace) -> Settings:
    changes: dict = {}
    if args.namespaces:
        changes["namespaces"] = tuple(args.namespaces)
    if args.no_leader_election:
        changes["leader_election"] = False
    if args.grace_seconds is not None:
        if not 0 <= args.grace_seconds < math.inf:  # nan and inf read as floats too: never, or forever
            raise SettingsError(f"--grace-seconds must be a number of seconds, 0 or more, got {args.grace_seconds}")
        changes["grace_seconds"] = args.grace_seconds
    return settings.replace(watcher=dataclasses.replace(settings.watcher, **changes)) if changes else settings


async def watch(settings: Settings, kubeconfig: str | None, context: str | None) -> None:
    """Connect (a failure is a plain line, as in every command), then log JSON and watch."""
    from ..watcher import COMPONENT, run_watcher

    try:
        api = await KubeApi.from_config(kubeconfig, context)
    except KubeError as e:
        raise _NotConnected(e) from None
    logs.configure(settings.server.log_level)  # from here on every stderr line is JSON
    for line in settings_warnings():
        logging.getLogger("initshift.cli").warning(line)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    api.user_agent = f"{COMPONENT}/{__version__}"
    try:
        await run_watcher(settings, stop, api=api)
    finally:
        await api.close()


class _NotConnected(InitshiftError):
    """No configuration to reach the API server with (before logging starts)."""


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    settings = load_settings(_PROG, lambda s: with_flags(s, args))
    if settings is None:
        return EXIT_USAGE
    try:
        asyncio.run(watch(settings, args.kubeconfig, args.context))
    except _NotConnected as e:
        print(f"{_PROG}: {e}", file=sys.stderr)
        return EXIT_ERROR
    except InitshiftError as e:  # the API refused the watcher (KubeError), or it stopped (WatcherStopped)
        return fatal(_PROG, e)
    except KeyboardInterrupt:
        return EXIT_OK
    return EXIT_OK
