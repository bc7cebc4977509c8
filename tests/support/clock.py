"""A clock the test moves by hand, for the watcher's controller (webhook/watcher/_clock.py).

Time stands still until `advance()`: a grace period, a timeout or a follower's takeover
delay runs out exactly when the test says, never because the machine was slow; and
"nothing happened yet" is a fact, not a race.
"""

from __future__ import annotations

import heapq
import itertools
from datetime import datetime, timedelta, timezone
from typing import Callable


class _Timer:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    def __init__(self, start: datetime | None = None) -> None:
        self._mono = 1000.0
        self._wall = (start or datetime.now(timezone.utc)).astimezone(timezone.utc)
        self._timers: list[tuple[float, int, Callable[[], None], _Timer]] = []
        self._order = itertools.count()

    def monotonic(self) -> float:
        return self._mono

    def now(self) -> datetime:
        return self._wall

    def stamp(self, offset: float = 0.0) -> str:
        """The clock's wall time as the kubelet writes timestamps (RFC 3339, seconds)."""
        return (self._wall + timedelta(seconds=offset)).strftime("%Y-%m-%dT%H:%M:%SZ")

    def call_at(self, when: float, callback: Callable[[], None]) -> _Timer:
        timer = _Timer()
        heapq.heappush(self._timers, (when, next(self._order), callback, timer))
        return timer

    @property
    def pending(self) -> list[float]:
        """When the live timers are due (seconds from now)."""
        return sorted(w - self._mono for w, _, _, t in self._timers if not t.cancelled)

    def advance(self, seconds: float) -> None:
        """Move time on by `seconds`, running each timer that comes due, in order."""
        end = self._mono + seconds
        while self._timers and self._timers[0][0] <= end:
            when, _, callback, timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            self._wall += timedelta(seconds=max(0.0, when - self._mono))
            self._mono = max(self._mono, when)
            callback()
        self._wall += timedelta(seconds=end - self._mono)
        self._mono = end
