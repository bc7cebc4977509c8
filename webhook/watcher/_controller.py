"""The companion watcher: list/watch managed pods and apply `decide()`'s actions.

Shape of a small controller: one list-then-watch loop per namespace (or one for all)
feeds a store of the latest pod dicts and a de-duplicating work queue; workers run
`reconcile()` for one pod at a time. Level-triggered: every event, a periodic re-list
and the timers `decide()` asks for (grace period, ready timeout) all just re-run the
same pure decision on the latest pod, so a missed event is repaired by the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import time
import uuid
from datetime import datetime, timezone

from waiter import protocol as p

from .. import __version__
from ._decide import Action, decide, format_time
from ..kube import KubeApi, KubeError
from ._leader import LeaderElector
from ..settings import Settings
from ._metrics import API_ERRORS, DEADLINES, OUTCOMES, READY_LATENCY, TRACKED

log = logging.getLogger("initshift.watcher")

LABEL_SELECTOR = f"{p.LABEL_MANAGED} in ({p.MODE_WAITER},{p.MODE_HYBRID},{p.MANAGED_START_ORDER})"
COMPONENT = "initshift-watcher"
WORKERS = 2
_CONFLICT_RETRIES = 5
_WATCH_MAX_SECONDS = 300  # a watch is re-opened at least this often

Key = tuple[str, str]  # (namespace, name)


class Backoff:
    """Capped exponential backoff with jitter: initial, x2 each failure, up to cap."""

    def __init__(self, initial: float = 0.2, cap: float = 30.0) -> None:
        self.initial, self.cap, self.failures = initial, cap, 0

    def next(self) -> float:
        delay = min(self.cap, self.initial * (2 ** self.failures))
        self.failures += 1
        return delay * random.uniform(0.8, 1.0)

    def reset(self) -> None:
        self.failures = 0


def _key(pod: dict) -> Key:
    meta = pod.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


def _newer(candidate: dict, current: dict | None) -> bool:
    """Whether `candidate` is at least as new as `current` (resourceVersions are opaque,
    but numeric in every apiserver; compare them as numbers only when both are)."""
    if current is None:
        return True
    a = (candidate.get("metadata") or {}).get("resourceVersion") or ""
    b = (current.get("metadata") or {}).get("resourceVersion") or ""
    return not (a.isdigit() and b.isdigit()) or int(a) >= int(b)


class Controller:
    """One leader's work. Build a fresh one each time leadership is gained."""

    def __init__(self, api: KubeApi, settings: Settings, identity: str,
                 backoff: Backoff | None = None) -> None:
        self.api, self.settings, self.identity = api, settings, identity
        self.backoff_initial = (backoff or Backoff()).initial
        self.store: dict[Key, dict] = {}
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._dirty: set[Key] = set()
        self._processing: set[Key] = set()
        self._timers: dict[Key, asyncio.TimerHandle] = {}
        self._failures: dict[Key, int] = {}

    # --- store and queue -----------------------------------------------------------------
    def enqueue(self, key: Key) -> None:
        if key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.put_nowait(key)

    def _enqueue_after(self, key: Key, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        when = loop.time() + max(0.0, seconds)
        old = self._timers.get(key)
        if old is not None and old.when() <= when and not old.cancelled():
            return
        if old is not None:
            old.cancel()
        self._timers[key] = loop.call_at(when, self._fire, key)

    def _fire(self, key: Key) -> None:
        self._timers.pop(key, None)
        self.enqueue(key)

    def observe(self, kind: str, pod: dict) -> None:
        key = _key(pod)
        if kind == "DELETED":
            self.forget(key)
            return
        if _newer(pod, self.store.get(key)):
            self.store[key] = pod
        TRACKED.set(len(self.store))
        self.enqueue(key)

    def forget(self, key: Key) -> None:
        self.store.pop(key, None)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._failures.pop(key, None)
        TRACKED.set(len(self.store))

    def _replace(self, namespace: str | None, pods: list[dict]) -> None:
        """A fresh list: forget pods it no longer has (their DELETED event was missed)."""
        listed = {_key(pod) for pod in pods}
        for key in [k for k in self.store if (namespace is None or k[0] == namespace) and k not in listed]:
            self.forget(key)
        for pod in pods:
            self.observe("ADDED", pod)

    # --- running ---------------------------------------------------------------------------
    async def run(self) -> None:
        """List/watch and reconcile until cancelled."""
        namespaces: list[str | None] = list(self.settings.watcher.namespaces) or [None]
        tasks = [asyncio.ensure_future(self._list_watch(ns)) for ns in namespaces]
        tasks += [asyncio.ensure_future(self._worker()) for _ in range(WORKERS)]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for timer in self._timers.values():
                timer.cancel()
            self._timers.clear()
            TRACKED.set(0)

    async def _list_watch(self, namespace: str | None) -> None:
        backoff = Backoff(self.backoff_initial)
        resync = self.settings.watcher.resync_seconds
        rv: str | None = None
        next_list = 0.0
        while True:
            try:
                if rv is None or time.monotonic() >= next_list:
                    pods, rv = await self.api.list_pods(namespace, label_selector=LABEL_SELECTOR)
                    next_list = time.monotonic() + resync
                    self._replace(namespace, pods)
                    backoff.reset()
                left = max(1, min(_WATCH_MAX_SECONDS, int(next_list - time.monotonic()) + 1))
                seen = 0
                async for kind, obj in self.api.watch_pods(namespace, label_selector=LABEL_SELECTOR,
                                                           resource_version=rv, timeout_seconds=left):
                    seen += 1
                    rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                    if kind != "BOOKMARK":
                        self.observe(kind, obj)
                    backoff.reset()
                if not seen and time.monotonic() < next_list:
                    await asyncio.sleep(backoff.next())  # an empty stream ended early: don't spin
            except KubeError as e:
                API_ERRORS.labels("watch_pods", str(e.status)).inc()
                if e.gone:
                    log.info("watch expired (410), re-listing", extra={"namespace": namespace or "*"})
                    rv = None
                    continue
                delay = backoff.next()
                log.warning("watch failed, retrying in %.1fs: %s", delay, e, extra={"namespace": namespace or "*"})
                await asyncio.sleep(delay)
            except Exception:  # a bug or an unexpected payload: keep watching, after a pause
                delay = backoff.next()
                log.exception("watch loop error, retrying in %.1fs", delay, extra={"namespace": namespace or "*"})
                await asyncio.sleep(delay)

    async def _worker(self) -> None:
        while True:
            key = await self._queue.get()
            self._dirty.discard(key)
            self._processing.add(key)
            try:
                await self.reconcile(key)
                self._failures.pop(key, None)
            except KubeError as e:
                n = self._failures.get(key, 0)
                self._failures[key] = n + 1
                delay = min(30.0, self.backoff_initial * 2 ** n)
                log.warning("reconcile %s/%s failed, retrying in %.1fs: %s", *key, delay, e)
                self._enqueue_after(key, delay)
            except Exception:  # a bug must not stop the other pods' work
                log.exception("reconcile %s/%s crashed", *key)
            finally:
                self._processing.discard(key)
                if key in self._dirty:
                    self._queue.put_nowait(key)

    async def reconcile(self, key: Key) -> None:
        """Decide on the latest pod and apply the actions in order. A 409 (the pod changed
        under a conditional patch) re-reads the pod and decides again."""
        pod = self.store.get(key)
        if pod is None:
            return
        for _ in range(_CONFLICT_RETRIES):
            decision = decide(pod, datetime.now(timezone.utc), self.settings.watcher)
            try:
                for action in decision.actions:
                    pod = await self._apply(key, action)
                    if action.kind == "ready" and decision.ready_latency is not None:
                        READY_LATENCY.observe(decision.ready_latency)
            except KubeError as e:
                if e.not_found:
                    self.forget(key)
                    return
                if not e.conflict:
                    raise
                pod = await self._get(key)
                if pod is None:
                    return
                continue
            if decision.requeue_after is not None:
                self._enqueue_after(key, decision.requeue_after)
            return
        raise KubeError(409, f"pod {key[0]}/{key[1]} kept changing; retrying later", "Conflict")

    async def _get(self, key: Key) -> dict | None:
        try:
            pod = await self.api.get_pod(*key)
        except KubeError as e:
            API_ERRORS.labels("get_pod", str(e.status)).inc()
            if e.not_found:
                self.forget(key)
                return None
            raise
        self.store[key] = pod
        return pod

    async def _apply(self, key: Key, action: Action) -> dict:
        try:
            pod = await self.api.patch_pod(*key, action.patch)
        except KubeError as e:
            API_ERRORS.labels("patch_pod", str(e.status)).inc()
            raise
        if _newer(pod, self.store.get(key)):
            self.store[key] = pod
        if action.kind == "outcome" and action.outcome:
            OUTCOMES.labels(action.outcome["result"], action.outcome["sidecarsStoppedBy"]).inc()
        elif action.kind == "end":
            DEADLINES.inc()
        if action.reason:
            log.info(action.message, extra={"namespace": key[0], "pod": key[1], "action": action.kind})
            await self._event(pod, action)
        return pod

    async def _event(self, pod: dict, action: Action) -> None:
        """A core/v1 Event on the pod; failing to write one never blocks the work."""
        meta = pod.get("metadata") or {}
        now = format_time(datetime.now(timezone.utc))
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name')}.", "namespace": meta.get("namespace")},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": meta.get("namespace"),
                               "name": meta.get("name"), "uid": meta.get("uid")},
            "reason": action.reason, "message": action.message[:1024],
            "type": "Warning" if action.warning else "Normal",
            "source": {"component": COMPONENT}, "reportingComponent": f"{p.GROUP}/watcher",
            "reportingInstance": self.identity, "action": action.kind,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            await self.api.create_event(meta.get("namespace") or "default", event)
        except KubeError as e:
            API_ERRORS.labels("create_event", str(e.status)).inc()
            log.warning("event not written: %s", e, extra={"pod": meta.get("name")})


def default_identity() -> str:
    return f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"


async def run_watcher(settings: Settings, stop: asyncio.Event | None = None, *, api: KubeApi | None = None,
                      identity: str | None = None) -> None:
    """Run the watcher until `stop` is set (forever when None). Without `api`, connects
    with in-cluster config or the default kubeconfig (and closes it at the end)."""
    own = api is None
    if api is None:
        api = await KubeApi.from_config()
        api.user_agent = f"{COMPONENT}/{__version__}"
    identity = identity or default_identity()
    stop = stop or asyncio.Event()

    async def lead() -> None:
        await Controller(api, settings, identity).run()

    try:
        if settings.watcher.leader_election:
            elector = LeaderElector(api, settings.server.namespace, settings.watcher.lease_name, identity,
                                    settings.watcher.lease_seconds)
            await elector.run(lead, stop)
        else:
            task = asyncio.ensure_future(lead())
            waiter = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
            finally:
                for t in (task, waiter):
                    t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    finally:
        if own:
            await api.close()
