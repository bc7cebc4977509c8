"""The controller's clock: what time it is, and timers on it.

Every decision the controller makes about time (a grace period or a timeout running out,
a follower's takeover delay, a retry's backoff, the Events' budget) reads this clock and
waits on it, so a test can drive it by hand and know that "nothing happened" because the
time has not come, not because the controller was slow. Reconnecting (the informers'
backoff after a broken watch) and the Lease run on the event loop's own time.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from typing import Callable, Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (intervals, timers)."""
        ...

    def now(self) -> datetime:
        """The wall-clock time, UTC (compared with the kubelet's timestamps)."""
        ...

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        """Run `callback` once `monotonic()` reaches `when`."""
        ...


class RealClock:
    """time.monotonic and the system's wall clock; timers on the running event loop."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        return asyncio.get_running_loop().call_later(max(0.0, when - time.monotonic()), callback)
