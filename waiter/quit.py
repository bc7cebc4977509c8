"""Quit the sidecars once the last main is done, so the pod can end without an API call."""

from __future__ import annotations

import os

from . import log
from .loopback import Endpoint
from .record import read_record

QUIT_TIMEOUT = 2.0  # seconds per endpoint


def _finished(peer: str, retry: bool) -> bool:
    if not retry:
        return os.path.exists(peer)
    # Under --retry (restartPolicy OnFailure) a failed peer will be restarted and needs the
    # sidecars: only a successful record is final.
    try:
        rec = read_record(peer)
    except ValueError:
        return False
    return rec is not None and rec.ok


def peers_done(peers: list[str], retry: bool = False) -> bool:
    return all(_finished(peer, retry) for peer in peers)


def quit_sidecars(endpoints: list[Endpoint], peers: list[str], retry: bool = False) -> None:
    """POST every endpoint if every peer has finished. Failures are logged, never raised:
    the watcher ends the pod anyway if a sidecar does not quit."""
    if not endpoints:
        return
    if not peers_done(peers, retry):
        log.say("other containers still running: leaving the sidecars to the last one")
        return
    for endpoint in endpoints:
        try:
            status = endpoint.request("POST", QUIT_TIMEOUT)
        except (OSError, ValueError) as exc:  # ValueError: a URL the request line cannot carry
            log.say(f"quit {endpoint.url}: {getattr(exc, 'strerror', None) or exc}")
            continue
        log.say(f"quit {endpoint.url}: HTTP {status}")
