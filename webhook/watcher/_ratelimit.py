"""Rate limiters, as client-go's workqueue has them: a capped exponential backoff (each
failure of the same item waits twice as long) and a token bucket (a steady rate with a
burst)."""

from __future__ import annotations

import random
import time
from typing import Callable

BACKOFF_CAP = 5.0  # seconds: a retry after an outage must not wait much longer than the outage


class Backoff:
    """Capped exponential backoff with jitter: initial, x2 each failure, up to cap."""

    def __init__(self, initial: float = 0.2, cap: float = BACKOFF_CAP) -> None:
        self.initial, self.cap, self.failures = initial, cap, 0

    def next(self) -> float:
        delay = min(self.cap, self.initial * (2 ** self.failures))
        self.failures += 1
        return delay * random.uniform(0.8, 1.0)

    def reset(self) -> None:
        self.failures = 0


class TokenBucket:
    """`rate` tokens a second, at most `burst` saved up; `take()` spends one."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens, self._at = float(burst), clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate)
        self._at = now

    def take(self) -> bool:
        """Spend a token if there is one."""
        self._refill()
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    def wait(self) -> float:
        """Seconds until a token is there (0: now)."""
        self._refill()
        return 0.0 if self._tokens >= 1.0 else (1.0 - self._tokens) / self.rate
