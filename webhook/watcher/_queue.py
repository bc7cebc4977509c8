"""The work queue: client-go's rate-limiting, delaying work queue, with priorities.

- Dedup: a key is queued at most once; added again while queued, it keeps its place (and
  moves up if the new add is more urgent); added while a worker processes it, it is queued
  again once that worker is done, so no key is ever processed by two workers at once.
- Priorities: `get()` hands out the most urgent key first (lower number), the oldest first
  among equals, so under a slow apiserver the writes that end pods and open gates are
  not held behind the ones that only record.
- Delays and retries: `add_after()` queues a key later (on the controller's clock);
  `add_rate_limited()` does so with a per-key exponential backoff that `forget()` resets.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from typing import Generic, Hashable, TypeVar

from ._clock import Clock, Timer
from ..kube import BACKOFF_CAP

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self, clock: Clock, *, backoff_initial: float = 0.2, backoff_cap: float = BACKOFF_CAP) -> None:
        self._clock = clock
        self.backoff_initial, self.backoff_cap = backoff_initial, backoff_cap
        self._heap: list[tuple[int, int, K]] = []  # (priority, order, key); stale entries are skipped
        self._queued: dict[K, tuple[int, int]] = {}  # key -> its live heap entry's (priority, order)
        self._since: dict[K, float] = {}  # key -> when it was added first since it was last handed out
        self._processing: set[K] = set()
        self._dirty: dict[K, int] = {}  # added while being processed: key -> priority
        self._delayed: dict[K, tuple[float, int, Timer]] = {}  # key -> (when, priority, timer)
        self._failures: dict[K, int] = {}
        self._order = itertools.count()
        self._nonempty = asyncio.Event()
        self._idle = asyncio.Event()  # nothing waits for a worker and no worker is on a key
        self._idle.set()

    def __len__(self) -> int:
        """Keys waiting for a worker (not those being processed, nor delayed ones)."""
        return len(self._queued)

    @property
    def busy(self) -> int:
        """Keys being processed now."""
        return len(self._processing)

    def add(self, key: K, priority: int) -> None:
        self._since.setdefault(key, self._clock.monotonic())
        if key in self._processing:
            self._dirty[key] = min(priority, self._dirty.get(key, priority))
            return
        current = self._queued.get(key)
        if current is not None and current[0] <= priority:
            return
        entry = (priority, next(self._order))
        self._queued[key] = entry
        heapq.heappush(self._heap, (*entry, key))
        self._nonempty.set()
        self._idle.clear()

    def add_after(self, key: K, seconds: float, priority: int) -> None:
        """Queue `key` in `seconds` (an earlier delayed add of the same key wins)."""
        when = self._clock.monotonic() + max(0.0, seconds)
        old = self._delayed.get(key)
        if old is not None:
            if old[0] <= when:
                return
            old[2].cancel()
        self._delayed[key] = (when, priority, self._clock.call_at(when, lambda: self._fire(key)))

    def _fire(self, key: K) -> None:
        entry = self._delayed.pop(key, None)
        if entry is not None:
            self.add(key, entry[1])

    def add_rate_limited(self, key: K, priority: int) -> float:
        """Queue `key` again after its backoff (doubling with each failure); returns the delay."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        delay = min(self.backoff_cap, self.backoff_initial * 2 ** failures)
        self.add_after(key, delay, priority)
        return delay

    def forget(self, key: K) -> None:
        """The key succeeded: its next failure starts the backoff again."""
        self._failures.pop(key, None)

    def remove(self, key: K) -> None:
        """Nothing is left to do for `key`: drop it wherever it waits (a worker on it finishes)."""
        self._queued.pop(key, None)
        self._since.pop(key, None)
        self._dirty.pop(key, None)
        self._failures.pop(key, None)
        delayed = self._delayed.pop(key, None)
        if delayed is not None:
            delayed[2].cancel()
        self._update_events()

    async def get(self) -> tuple[K, float]:
        """The most urgent key (and when it was first added); the caller calls `done()`."""
        while True:
            while self._heap:
                priority, order, key = heapq.heappop(self._heap)
                if self._queued.get(key) != (priority, order):
                    continue  # moved up, removed or handed out already
                del self._queued[key]
                self._processing.add(key)
                self._update_events()
                return key, self._since.pop(key, self._clock.monotonic())
            self._nonempty.clear()
            await self._nonempty.wait()

    def done(self, key: K) -> None:
        self._processing.discard(key)
        priority = self._dirty.pop(key, None)
        if priority is not None:
            self.add(key, priority)
        self._update_events()

    async def wait_idle(self) -> None:
        """Until no key waits for a worker and no worker is on one (delayed keys may remain)."""
        await self._idle.wait()

    def _update_events(self) -> None:
        if not self._queued:
            self._nonempty.clear()
        if self._queued or self._processing:
            self._idle.clear()
        else:
            self._idle.set()

    def cancel_all(self) -> None:
        """Cancel every delayed add (the controller is stopping)."""
        for _, _, timer in self._delayed.values():
            timer.cancel()
        self._delayed.clear()
