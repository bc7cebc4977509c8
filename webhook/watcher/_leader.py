"""Leader election with a coordination.k8s.io/v1 Lease, as client-go does it.

One replica holds the Lease and renews it every `retry_seconds` (2 s by default); the
others poll as often. A holder's Lease is taken over only after it has not changed for a
full lease duration, measured on the local monotonic clock (not by comparing the holder's
timestamps with ours, so clock skew between nodes cannot hand the Lease to two replicas).
Every write is a conditional PUT (resourceVersion), so two candidates racing for it cannot
both win. The holder renews with that PUT alone, from the Lease its last write returned
(client-go's optimistic renewal, kubernetes#122069): one request per renewal, not a GET and
a PUT; only a PUT that fails (409: someone else wrote the Lease) makes it read the Lease
first. Each renewal attempt gets at most `retry_seconds` (a hung request is abandoned and
the next one tried at once), and a failed one is retried soon, so the holder keeps leading
through API blips shorter than `renew_deadline`; one that cannot renew for `renew_deadline`
stops leading, before anyone else may start. On a clean stop the Lease is released so a
successor takes over at once. The watcher does not wait for the Lease to act on work a
dead holder left (see `_controller`): the Lease only says who acts first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from datetime import datetime, timezone
from typing import Awaitable, Callable

from ..kube import KubeApi, KubeError
from ..logs import Repeats
from ._metrics import API_ERRORS, LEADER

log = logging.getLogger("initshift.leader")

# A Lease's create is 404 (NotFound) only when its namespace does not exist: `initshift watch` run
# by hand against a cluster without initshift's namespace, or with another INITSHIFT_NAMESPACE.
NO_NAMESPACE = ("the Lease is kept in initshift's namespace (INITSHIFT_NAMESPACE): create it or name the right one, "
                "or run one watcher alone without a Lease (--no-leader-election, INITSHIFT_LEADER_ELECTION=false)")


def _micro_time() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(self, api: KubeApi, namespace: str, name: str, identity: str, lease_seconds: float,
                 clock: Callable[[], float] = time.monotonic, *, retry_seconds: float | None = None,
                 renew_deadline: float | None = None) -> None:
        self.api, self.namespace, self.name, self.identity = api, namespace, name, identity
        self.lease_seconds = lease_seconds
        self.retry_seconds = retry_seconds or lease_seconds / 3
        # Strictly below the lease: the holder stops before a candidate may take over.
        self.renew_deadline = min(renew_deadline or lease_seconds * 2 / 3, lease_seconds * 0.9)
        self._clock = clock
        self._observed: tuple | None = None
        self._observed_at = 0.0
        self._held: tuple[dict, float] | None = None  # the Lease as our last write left it, and when
        self._warnings = Repeats(clock=clock)  # a lasting failure: once a minute (API_ERRORS counts each)
        self.leading = False

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this replica holds the Lease afterwards."""
        if self._held is not None and self._clock() - self._held[1] < self.lease_seconds:
            lease = self._held[0]
            try:  # the fast path: nobody may have written a Lease we hold, so it is as we left it
                return self._hold(await self.api.replace_lease(self.namespace, self.name,
                                                               self._lease(lease, lease.get("spec") or {})))
            except KubeError:  # changed after all, or an API blip: read it, as every other replica does
                self._held = None
        creating = False
        try:
            lease = await self.api.get_lease(self.namespace, self.name)
            if lease is None:
                creating = True
                return self._hold(await self.api.create_lease(self.namespace, self._lease(None, {})))
            spec = lease.get("spec") or {}
            holder = spec.get("holderIdentity") or ""
            seen = (holder, spec.get("renewTime"), (lease.get("metadata") or {}).get("resourceVersion"))
            if seen != self._observed:
                self._observed, self._observed_at = seen, self._clock()
            duration = max(float(spec.get("leaseDurationSeconds") or 0), self.lease_seconds)
            if holder and holder != self.identity and self._clock() - self._observed_at < duration:
                return False
            return self._hold(await self.api.replace_lease(self.namespace, self.name, self._lease(lease, spec)))
        except KubeError as e:
            if not e.conflict:  # a conflict is another candidate winning the race: not an error
                API_ERRORS.labels("lease", str(e.status)).inc()
                advice = f": {NO_NAMESPACE}" if creating and e.not_found else ""
                text = f"lease {self.namespace}/{self.name}: {e}{advice}"
                if self._warnings.new(text):
                    log.warning(text)
            return False

    def _hold(self, written: dict) -> bool:
        self._held = (written, self._clock())
        return True

    def _lease(self, current: dict | None, spec: dict) -> dict:
        now = _micro_time()
        mine = spec.get("holderIdentity") == self.identity
        meta = {"name": self.name, "namespace": self.namespace}
        if current is not None:
            meta["resourceVersion"] = (current.get("metadata") or {}).get("resourceVersion")
        return {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": max(1, math.ceil(self.lease_seconds)),
                "acquireTime": spec.get("acquireTime") if mine and spec.get("acquireTime") else now,
                "renewTime": now,
                "leaseTransitions": int(spec.get("leaseTransitions") or 0) + (0 if mine or current is None else 1),
            },
        }

    async def release(self) -> None:
        """Give the Lease up (only if still ours) so a successor need not wait it out."""
        with contextlib.suppress(KubeError):
            lease = await self.api.get_lease(self.namespace, self.name)
            if lease and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = ""
                lease["spec"]["renewTime"] = _micro_time()
                await self.api.replace_lease(self.namespace, self.name, lease)

    async def run(self, lead: Callable[[], Awaitable[None]], stop: asyncio.Event) -> None:
        """Run `lead()` while this replica is the leader; cancel it when leadership is lost
        or `stop` is set. Returns when `stop` is set."""
        try:
            while not stop.is_set():
                if not await self._renew_within(self.retry_seconds):
                    await _wait(stop, None, self.retry_seconds)
                    continue
                await self._lead(lead, stop)
        finally:
            await self.release()
            self._set_leading(False)

    async def _lead(self, lead: Callable[[], Awaitable[None]], stop: asyncio.Event) -> None:
        self._set_leading(True)
        log.info("leading", extra={"identity": self.identity, "lease": self.name})
        task = asyncio.ensure_future(lead())
        renewed = self._clock()
        pause = self.retry_seconds
        try:
            while not stop.is_set() and not task.done():
                await _wait(stop, task, pause)
                if stop.is_set() or task.done():
                    break
                left = self.renew_deadline - (self._clock() - renewed)
                if await self._renew_within(min(self.retry_seconds, left)):
                    renewed, pause = self._clock(), self.retry_seconds
                elif self._clock() - renewed >= self.renew_deadline:
                    log.warning("lost the lease", extra={"identity": self.identity, "lease": self.name})
                    break
                else:  # a blip: try again soon, the deadline is what counts
                    pause = min(self.retry_seconds, max(0.05, self.retry_seconds / 4))
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                try:
                    await task
                except Exception:  # the work failed: logged, then restarted while we lead
                    log.exception("leader work failed")
            self._set_leading(False)
        if not stop.is_set():
            await _wait(stop, None, self.retry_seconds)

    async def _renew_within(self, seconds: float) -> bool:
        """A renewal bounded by what is left of the renew deadline (client-go does the
        same): a hung request must not keep us acting once another replica may lead."""
        if seconds <= 0:
            return False
        try:
            return await asyncio.wait_for(self.try_acquire_or_renew(), seconds)
        except asyncio.TimeoutError:
            log.warning("lease renewal timed out", extra={"identity": self.identity, "lease": self.name})
            return False

    def _set_leading(self, value: bool) -> None:
        self.leading = value
        if not value:
            self._held = None  # a replica that stopped leading reads the Lease before it writes again
        LEADER.set(1 if value else 0)


async def _wait(stop: asyncio.Event, task: asyncio.Future | None, timeout: float) -> None:
    """Sleep `timeout` seconds, less if `stop` is set or `task` finishes."""
    waiter = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([waiter] + ([task] if task else []), timeout=timeout,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
