"""What one server process holds at a time, and the lanes reviews are worked on in.

Bodies are counted by the bytes that have arrived (a client that declares a large body and
sends ten bytes holds ten bytes), and a small review takes a place in hand only once its
body is complete: slow or stalled bodies are bounded by the bytes limit, the body timeout
and the connection cap, and never make a complete review wait or be refused.

Reviews go to one of two lanes by declared size, each with its own thread: a review of a
normal pod (tens of KiB) never queues behind one of several MiB. Large ones (over
INITSHIFT_LARGE_REVIEW_BYTES, or chunked) are read and worked on INITSHIFT_MAX_LARGE_REVIEWS
(1) at a time per process, since each costs tens of times its size in memory; the next
waits with its body unread. Both threads share the GIL: while a large review runs, a small
one still gets its turn within the interpreter's switch interval (5 ms): the large body's
JSON parse is the pure-Python scanner, which gives the GIL up (_review.parse_review).

Only the event loop's thread touches the counters.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

T = TypeVar("T")


class Refused(Exception):
    """A request the server will not take now: HTTP `status` with a one-line message;
    `close`: the rest of the body may still arrive, so the connection cannot be reused."""

    def __init__(self, status: int, message: str, *, close: bool = False) -> None:
        super().__init__(message)
        self.status, self.close = status, close


class Lane:
    """Reviews of one size class: how many are in hand, and the one thread they run on (more
    threads would only interleave CPU work under the GIL)."""

    def __init__(self, name: str, max_reviews: int, setting: str) -> None:
        self.name, self.max_reviews, self.setting = name, max_reviews, setting
        self.reviews = 0
        self.turns = asyncio.Semaphore(max_reviews)  # the large lane's: taken before the body is read
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"initshift-review-{name}")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)


class Capacity:
    """Bytes of bodies held (arrived so far, or complete and in hand) and the two lanes."""

    def __init__(self, max_reviews: int, max_large_reviews: int, max_body_bytes: int, large_bytes: int) -> None:
        self.max_body_bytes, self.large_bytes = max_body_bytes, large_bytes
        self.small = Lane("small", max_reviews, "INITSHIFT_MAX_PENDING_REVIEWS")
        self.large = Lane("large", max_large_reviews, "INITSHIFT_MAX_LARGE_REVIEWS")
        self.body_bytes = 0

    @property
    def reviews(self) -> int:
        return self.small.reviews + self.large.reviews

    def hold(self) -> "Holding":
        return Holding(self)


class Holding:
    """One request's share of the capacity, given back in full by `release()`."""

    def __init__(self, capacity: Capacity) -> None:
        self.capacity = capacity
        self.bytes = 0
        self.lane: Lane | None = None
        self.turn: Lane | None = None  # the large lane's turn, taken before reading

    def add_bytes(self, n: int) -> None:
        """`n` more body bytes arrived; refused when the process holds too many already."""
        cap = self.capacity
        if cap.body_bytes + n > cap.max_body_bytes:
            raise Refused(503, f"initshift: busy: {cap.body_bytes} bytes of request bodies in hand in this server "
                               f"process (INITSHIFT_MAX_BODY_BYTES_IN_FLIGHT); retry", close=True)
        cap.body_bytes += n
        self.bytes += n

    async def wait_turn(self, declared: int | None, timeout: float | None) -> None:
        """A body over the large size (or of unknown size: chunked) waits, unread, for its
        lane to have room: the client's upload stalls in TCP instead of being read only
        to be refused, and a refused client retrying at once would cost the loop a full
        upload each time. Refused after `timeout` seconds of waiting."""
        cap = self.capacity
        if declared is not None and declared <= cap.large_bytes:
            return
        try:
            await asyncio.wait_for(cap.large.turns.acquire(), timeout)
        except asyncio.TimeoutError:
            raise Refused(503, f"initshift: busy: {cap.large.max_reviews} large reviews in hand in this server "
                               f"process for {timeout:g} s (INITSHIFT_MAX_LARGE_REVIEWS); retry", close=True) from None
        self.turn = cap.large

    def take_lane(self, size: int) -> Lane:
        """A place in hand for a complete review of `size` bytes, in its lane."""
        lane = self.turn or self.capacity.small
        if lane is not self.turn and lane.reviews >= lane.max_reviews:
            raise Refused(503, f"initshift: busy: {lane.reviews} {lane.name} reviews in hand in this server "
                               f"process ({lane.setting}); retry")
        lane.reviews += 1
        self.lane = lane
        return lane

    def release(self) -> None:
        self.capacity.body_bytes -= self.bytes
        self.bytes = 0
        if self.lane is not None:
            self.lane.reviews -= 1
            self.lane = None
        if self.turn is not None:
            self.turn.turns.release()
            self.turn = None
