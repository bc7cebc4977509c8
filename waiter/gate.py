"""The ready gate of step 0: sidecars are up when the downward-API ready file is non-empty,
or when every loopback probe the webhook copied from the sidecars has succeeded."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from . import protocol as p
from .loopback import Endpoint
from .wait import KUBELET_DATA_LINK, DirWatch, Wakeable

PROBE_TIMEOUT = 1.0  # seconds per probe attempt


def poll_interval(rounds: int, waited: float) -> float:
    """Seconds until the next poll, after `rounds` polls and `waited` seconds (the schedule
    of protocol.GATE_POLL_*): a backoff from a few ms to GATE_POLL_MAX, then a share of the
    time already waited."""
    fast = min(p.GATE_POLL_FIRST * p.GATE_POLL_GROWTH ** min(rounds, 64), p.GATE_POLL_MAX)
    return min(max(fast, waited * p.GATE_POLL_SHARE), p.GATE_POLL_CEILING)


def ready_file_set(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return bool(f.read(64).strip())
    except OSError:
        return False


class Gate:
    def __init__(self, ready_file: str | None, probes: list[Endpoint]) -> None:
        self.ready_file = ready_file
        self.probes = list(probes)
        self.pending = list(probes)  # a probe that passed once stays passed: sidecars stay up

    @property
    def needed(self) -> bool:
        return bool(self.ready_file or self.probes)

    def _open(self) -> bool:
        if self.ready_file and ready_file_set(self.ready_file):
            return True
        if not self.probes:
            return False
        self.pending = [probe for probe in self.pending if not probe.healthy(PROBE_TIMEOUT)]
        return not self.pending

    def wait(self, interrupted: Callable[[], bool], wake: Wakeable | None = None) -> bool:
        """Block until the gate opens (True) or `interrupted()` says stop (False)."""
        if not self.needed:
            return True
        # A missing directory makes DirWatch poll, so a late mount is still seen.
        dirs, names = [], []
        if self.ready_file:
            dirs = [os.path.dirname(self.ready_file) or "."]
            names = [os.path.basename(self.ready_file), KUBELET_DATA_LINK]
        start = time.monotonic()
        rounds = 0
        with DirWatch(dirs, names) as watch:
            while True:
                if interrupted():
                    return False
                if self._open():
                    return True
                # Probes (and a ready file without inotify) are polled; inotify alone waits.
                polled = bool(self.pending) or watch.fd is None
                watch.wait(poll_interval(rounds, time.monotonic() - start) if polled else None, wake)
                rounds += 1
