"""A token bucket, as client-go's workqueue has it: a steady rate with a burst (its other
rate limiter, the capped exponential backoff, is webhook.kube's `Backoff`)."""

from __future__ import annotations

import time
from typing import Callable


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
