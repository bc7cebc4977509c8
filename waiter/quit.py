"""Quit the sidecars once the last main is done, so the pod can end without an API call."""

from __future__ import annotations

import os

from . import log
from .loopback import Endpoint

QUIT_TIMEOUT = 2.0  # seconds per endpoint


def peers_done(peers: list[str]) -> bool:
    return all(os.path.exists(peer) for peer in peers)


def quit_sidecars(endpoints: list[Endpoint], peers: list[str]) -> None:
    """POST every endpoint if every peer has finished. Failures are logged, never raised:
    the watcher ends the pod anyway if a sidecar does not quit."""
    if not endpoints:
        return
    if not peers_done(peers):
        log.say("other containers still running: leaving the sidecars to the last one")
        return
    for endpoint in endpoints:
        try:
            status = endpoint.request("POST", QUIT_TIMEOUT)
        except OSError as exc:
            log.say(f"quit {endpoint.url}: {exc.strerror or exc}")
            continue
        log.say(f"quit {endpoint.url}: HTTP {status}")
