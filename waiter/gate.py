"""The ready gate of step 0: sidecars are up when the downward-API ready file is non-empty,
or when every loopback probe the webhook copied from the sidecars has succeeded."""

from __future__ import annotations

import os
from collections.abc import Callable

from .loopback import Endpoint
from .wait import DirWatch, Wakeable

PROBE_INTERVAL = 0.15  # seconds between probe rounds
PROBE_TIMEOUT = 1.0  # seconds per probe attempt


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
        dirs = [os.path.dirname(self.ready_file) or "."] if self.ready_file else []
        with DirWatch(dirs) as watch:
            while True:
                if interrupted():
                    return False
                if self._open():
                    return True
                watch.wait(PROBE_INTERVAL if self.pending else None, wake)
