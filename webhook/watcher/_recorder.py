"""The Event recorder: the watcher's Events, sent off the critical path with a budget of
their own, as client-go's EventRecorder sends a controller's.

- What is due comes from the pod's state (`notices()`: one Event for the outcome, which
  tells how the sidecars stopped, while it is news), so any replica can tell an Event is
  due and send it with the same words, and an action done twice is reported once.
- Correlation: an Event's name is fixed by the pod's uid and the action it reports
  (`event_name`), so a second create is `409 AlreadyExists`, never a second Event; the
  Event informer (`observe`) tells every replica which exist, and what is pending or in
  flight is not recorded twice.
- Budget: a token bucket for all Events (`EVENT_QPS`, `EVENT_BURST`), client-go's spam
  filter per object (`OBJECT_BURST` at once, then one per `1/OBJECT_QPS` s; what is over
  is dropped), and at most `SENDERS` in flight.
- Never ahead of the work: an Event is sent only while the work queue is idle (`gate`: no
  write waits or is being made), so a slow apiserver serves the writes that end pods and
  open gates first.
- Failed sends are retried with backoff, beside the other pods' Events; one refused for
  good (a 4xx other than 408/429) is logged and given up.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import deque
from dataclasses import dataclass
from typing import Awaitable, Callable

from waiter import protocol as p

from ..kube import Backoff, KubeApi, KubeError
from ._decide import Notice, format_time, notices
from ._clock import Clock
from ._metrics import API_ERRORS
from ._ratelimit import TokenBucket
from ._store import Key, key_of, rv_of, uid_of

log = logging.getLogger("initshift.watcher")

COMPONENT = "initshift-watcher"  # the Events' source.component (the Event informer's field selector)
EVENT_QPS = 20.0  # Events a second at most, all pods together
EVENT_BURST = 100
OBJECT_BURST = 25  # client-go's spam filter: per object, 25 at once, then one per 5 minutes
OBJECT_QPS = 1 / 300
SENDERS = 4  # Events in flight at once


def event_name(pod_name: str, uid: str, kind: str) -> str:
    """One fixed name per (pod, action): creating it twice is a 409, never a second Event."""
    suffix = "." + hashlib.sha256(f"{uid}/{kind}".encode()).hexdigest()[:12]
    return pod_name[: 253 - len(suffix)].rstrip(".-") + suffix


@dataclass
class _Pending:
    key: Key
    uid: str
    resource_version: str
    notices: list[Notice]
    failures: int = 0


class EventRecorder:
    def __init__(self, api: KubeApi, identity: str, clock: Clock, *, gate: Callable[[], Awaitable[None]],
                 on_sent: Callable[[Key], None], backoff_initial: float = 0.2, qps: float = EVENT_QPS,
                 burst: int = EVENT_BURST, senders: int = SENDERS) -> None:
        self.api, self.identity, self._clock = api, identity, clock
        self._gate, self._on_sent = gate, on_sent
        self.backoff_initial, self.senders = backoff_initial, senders
        self.sent: dict[str, set[str]] = {}  # pod uid -> kinds whose Event exists (or was given up)
        self._pending: dict[str, _Pending] = {}  # pod uid -> what is still to send, oldest first
        self._ready: deque[str] = deque()  # uids to send now, in order
        self._has_ready = asyncio.Event()
        self._in_flight: set[str] = set()
        self._retries: dict[str, asyncio.TimerHandle] = {}
        self._budget = TokenBucket(qps, burst, clock.monotonic)
        self._objects: dict[str, TokenBucket] = {}

    # --- what exists, what is due --------------------------------------------------------
    def observe(self, kind: str, event: dict, ignore: Callable[[Key, str], bool] = lambda key, uid: False
                ) -> Key | None:
        """One of the watcher's Events (the informer): the action it reports has its Event.
        Returns the involved pod's key; an Event about a pod `ignore(key, uid)` says needs
        nothing more is not remembered."""
        involved = event.get("involvedObject") or {}
        uid, action = str(involved.get("uid") or ""), event.get("action")
        key = str(involved.get("namespace") or ""), str(involved.get("name") or "")
        if kind == "DELETED" or not uid or not isinstance(action, str) or ignore(key, uid):
            return None  # an Event that expired reports an action long done
        self.sent.setdefault(uid, set()).add(action)
        return key

    def replace(self, namespace: str | None, events: list[dict],
                ignore: Callable[[Key, str], bool] = lambda key, uid: False) -> list[Key]:
        return [k for k in (self.observe("ADDED", e, ignore) for e in events) if k is not None]

    def _known(self, uid: str, kind: str) -> bool:
        entry = self._pending.get(uid)
        return kind in self.sent.get(uid, ()) or (entry is not None and any(n.kind == kind for n in entry.notices))

    def missing(self, pod: dict) -> list[Notice]:
        """The Events the pod's state calls for that are neither sent nor on their way."""
        uid = uid_of(pod)
        return [n for n in notices(pod, self._clock.now()) if not self._known(uid, n.kind)]

    def unsent(self, pod: dict) -> bool:
        """Some Event the pod's state calls for does not exist yet (pending or not)."""
        uid = uid_of(pod)
        return any(n.kind not in self.sent.get(uid, ()) for n in notices(pod, self._clock.now()))

    def record(self, pod: dict, due: list[Notice]) -> None:
        """Send `due` (from `missing()`) for `pod`, after what is already pending for it."""
        if not due:
            return
        uid = uid_of(pod)
        entry = self._pending.get(uid)
        if entry is None:
            entry = self._pending[uid] = _Pending(key_of(pod), uid, rv_of(pod), [])
            self._ready.append(uid)
            self._has_ready.set()
        entry.notices.extend(n for n in due if not any(m.kind == n.kind for m in entry.notices))

    def forget(self, uid: str) -> None:
        """The pod is gone: nothing more to send or remember for it."""
        self.sent.pop(uid, None)
        self._pending.pop(uid, None)
        self._objects.pop(uid, None)
        timer = self._retries.pop(uid, None)
        if timer is not None:
            timer.cancel()

    def prune(self, keep: set[str]) -> None:
        """Forget the Events of pods that are neither in flight nor pending."""
        for uid in [u for u in self.sent if u not in keep and u not in self._pending]:
            del self.sent[uid]

    @property
    def idle(self) -> bool:
        """Nothing pending, nothing in flight."""
        return not self._pending and not self._in_flight

    # --- sending -------------------------------------------------------------------------
    async def run(self) -> None:
        senders = [asyncio.ensure_future(self._sender()) for _ in range(max(1, self.senders))]
        try:
            await asyncio.gather(*senders)
        finally:
            for task in senders:
                task.cancel()
            await asyncio.gather(*senders, return_exceptions=True)
            for timer in self._retries.values():
                timer.cancel()
            self._retries.clear()

    async def _next(self) -> str:
        while not self._ready:
            self._has_ready.clear()
            await self._has_ready.wait()
        return self._ready.popleft()

    async def _sender(self) -> None:
        while True:
            uid = await self._next()
            while not self._budget.take():
                await asyncio.sleep(self._budget.wait())
            await self._gate()  # no write waits or is being made: the work goes first
            entry = self._pending.get(uid)
            if entry is None:
                continue  # forgotten meanwhile
            self._in_flight.add(uid)
            try:
                await self._send(entry)
            except Exception:  # a bug must not stop the other Events
                log.exception("event for %s/%s crashed", *entry.key)
                self._pending.pop(uid, None)
            finally:
                self._in_flight.discard(uid)

    async def _send(self, entry: _Pending) -> None:
        """The pod's pending Events in order; a failure retries the rest later."""
        while entry.notices:
            notice = entry.notices[0]
            if self._allowed(entry.uid):
                try:
                    await self.api.create_event(entry.key[0] or "default", self._event(entry, notice))
                except KubeError as e:
                    if not e.conflict:  # AlreadyExists: another replica (or an earlier try) sent it
                        API_ERRORS.labels("create_event", str(e.status)).inc()
                        if not 400 <= e.status < 500 or e.status in (408, 429):
                            self._retry_later(entry)
                            return
                        log.warning("event not written: %s", e, extra={"pod": entry.key[1], "action": notice.kind})
            else:
                log.info("event dropped: over the per-object limit", extra={"pod": entry.key[1],
                                                                             "action": notice.kind})
            entry.notices.pop(0)
            if self._pending.get(entry.uid) is entry:
                self.sent.setdefault(entry.uid, set()).add(notice.kind)
        if self._pending.get(entry.uid) is entry:
            del self._pending[entry.uid]
            self._on_sent(entry.key)

    def _allowed(self, uid: str) -> bool:
        bucket = self._objects.get(uid)
        if bucket is None:
            bucket = self._objects[uid] = TokenBucket(OBJECT_QPS, OBJECT_BURST, self._clock.monotonic)
        return bucket.take()

    def _retry_later(self, entry: _Pending) -> None:
        backoff = Backoff(self.backoff_initial)
        backoff.failures = entry.failures
        entry.failures += 1

        def again() -> None:
            self._retries.pop(entry.uid, None)
            if self._pending.get(entry.uid) is entry:
                self._ready.append(entry.uid)
                self._has_ready.set()
        self._retries[entry.uid] = asyncio.get_running_loop().call_later(backoff.next(), again)

    def _event(self, entry: _Pending, notice: Notice) -> dict:
        namespace, name = entry.key
        now = format_time(self._clock.now())
        return {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": event_name(name, entry.uid, notice.kind), "namespace": namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name,
                               "uid": entry.uid, "resourceVersion": entry.resource_version},
            "reason": notice.reason, "message": notice.message[:1024],
            "type": "Warning" if notice.warning else "Normal",
            "source": {"component": COMPONENT}, "reportingComponent": f"{p.GROUP}/watcher",
            "reportingInstance": self.identity, "action": notice.kind,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
