"""The companion watcher: list/watch managed pods and apply `decide()`'s actions.

Shape of a client-go controller (informer + work queue), sized for thousands of pods:

- Informers: one list-then-watch loop per namespace (or one for all) for the managed pods,
  and one for the watcher's own Events. Lists are paged; watches ask for bookmarks and
  resume from the last resourceVersion they saw, so a watch that ends or breaks costs no
  list: a re-list happens only on 410 Gone (or when INITSHIFT_RESYNC_SECONDS asks for it).
- Store: only pods still in flight, and of each only the fields the decisions read
  (`slim_pod`). A pod with its outcome written, its Events sent and nothing left to do is
  dropped and remembered as done (name and uid) until it is deleted.
- Work queue: `concurrency` workers; a pod is never worked on by two at once, and a worker
  always takes its newest state (events that arrive meanwhile coalesce).
- Writes: every patch is conditional on the resourceVersion the decision was made from. A
  409 means the pod changed: the newer pod comes through the watch (a GET only when it does
  not come), and the decision is made again.
- Events: named after the pod's uid and the action they report, sent after their patch by
  their own task with its own retries, never holding the pod's next action back. The Event
  watch tells every replica which exist, so an Event whose sender died is sent by whoever
  acts next, and none is sent twice (the name makes a second create a 409).
- Replicas: the Lease holder acts at once; the others keep the same store warm and act on a
  pod only when its action or Event has been due for `takeover_seconds`, i.e. when the
  holder died or hangs. The conditional writes make exactly one replica win each action.

Level-triggered throughout: every event, timer (grace period, ready timeout) and retry just
re-runs the same pure decision on the newest pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import random
import socket
import time
import uuid
from datetime import datetime, timezone
from typing import Any, Callable

from waiter import protocol as p

from .. import __version__
from ..kube import KubeApi, KubeError
from ..rewrite import managed_as
from ..settings import Settings
from ._decide import Action, decide, format_time, notices, slim_pod
from ._podstate import WAITER_RUN, parse_time, pod_ended
from ._leader import LeaderElector
from ._metrics import (API_ERRORS, DEADLINES, IN_FLIGHT, LEADER, OLDEST_ENDING, OUTCOMES, REACTION, READY_LATENCY,
                       TRACKED)

log = logging.getLogger("initshift.watcher")

_LABEL_SELECTOR = f"{p.LABEL_MANAGED} in ({p.MODE_WAITER},{p.MODE_HYBRID},{p.MANAGED_START_ORDER})"
COMPONENT = "initshift-watcher"
_EVENT_SELECTOR = f"source={COMPONENT}"  # the apiserver's field label for source.component
_WATCH_SECONDS = (300, 600)  # a watch asks the server to end it after a random time in this range
_BACKOFF_CAP = 5.0  # seconds: a retry after an outage must not wait much longer than the outage
_CONFLICT_REREAD_SECONDS = 0.5  # after a 409, how long the watch may take to bring the newer pod
_GAUGE_SECONDS = 5.0  # how often the in-flight gauges are recomputed from the store

Key = tuple[str, str]  # (namespace, name)


class _Backoff:
    """Capped exponential backoff with jitter: initial, x2 each failure, up to cap."""

    def __init__(self, initial: float = 0.2, cap: float = _BACKOFF_CAP) -> None:
        self.initial, self.cap, self.failures = initial, cap, 0

    def next(self) -> float:
        delay = min(self.cap, self.initial * (2 ** self.failures))
        self.failures += 1
        return delay * random.uniform(0.8, 1.0)

    def reset(self) -> None:
        self.failures = 0


def _key(obj: dict) -> Key:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


def _rv(obj: dict | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("resourceVersion") or "")


def _uid(obj: dict | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("uid") or "")


def _newer(candidate: dict, current: dict | None) -> bool:
    """Whether `candidate` is at least as new as `current` (resourceVersions are opaque,
    but numeric in every apiserver; compare them as numbers only when both are)."""
    if current is None:
        return True
    a, b = _rv(candidate), _rv(current)
    return not (a.isdigit() and b.isdigit()) or int(a) >= int(b)


def _conditional(patch: dict, resource_version: str) -> dict:
    """The merge patch, made conditional on `resource_version` (409 if the pod changed since)."""
    meta = dict(patch.get("metadata") or {})
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {**patch, "metadata": meta}


def event_name(pod_name: str, uid: str, kind: str) -> str:
    """One fixed name per (pod, action): creating it twice is a 409, never a second Event."""
    suffix = "." + hashlib.sha256(f"{uid}/{kind}".encode()).hexdigest()[:12]
    return pod_name[: 253 - len(suffix)].rstrip(".-") + suffix


def _finished(pod: dict) -> bool:
    """Nothing will be asked of this pod again (given no action and no timer is due)."""
    if managed_as(pod) == p.MANAGED_START_ORDER:
        return pod_ended(pod)
    return p.ANNOTATION_OUTCOME in ((pod.get("metadata") or {}).get("annotations") or {})


class Controller:
    """One replica's informers, store and workers. `leading` says whether it acts at once
    (the Lease holder, or no leader election) or only on work left overdue."""

    def __init__(self, api: KubeApi, settings: Settings, identity: str, *, leading: bool = True,
                 backoff: _Backoff | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.api, self.settings, self.identity = api, settings, identity
        self.backoff_initial = (backoff or _Backoff()).initial
        self._clock = clock
        self.leading = leading
        self.store: dict[Key, dict] = {}
        self.done: dict[Key, str] = {}  # pods that need nothing more: key -> uid, until deleted
        self.sent: dict[str, set[str]] = {}  # pod uid -> kinds of the Events that exist
        self.ending: dict[Key, float] = {}  # dropped pods with an outcome the kubelet has not ended: decidedAt
        self._sending: set[tuple[str, str]] = set()  # (uid, kind) this replica is sending
        self._event_tasks: set[asyncio.Task] = set()
        self._event_last: dict[str, asyncio.Task] = {}  # pod uid -> its latest Event task
        # As many Events in flight as patches at most: a burst of Events must not take the
        # client's connections from the patches they report.
        self._event_slots = asyncio.Semaphore(max(1, settings.watcher.concurrency))
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._dirty: set[Key] = set()
        self._processing: set[Key] = set()
        self._timers: dict[Key, asyncio.TimerHandle] = {}
        self._failures: dict[Key, int] = {}
        self._due: dict[Key, tuple[tuple, float]] = {}  # a follower: what was due, since when
        self._stale: dict[Key, str] = {}  # a 409 on this resourceVersion: wait for a newer one
        self._changed: dict[Key, float] = {}  # the first change not yet answered (reaction time)
        self._synced = asyncio.Event()
        self._unsynced = 0

    # --- leadership ------------------------------------------------------------------------
    def set_leading(self, value: bool) -> None:
        """Gaining the Lease: everything due is done now, not after the takeover delay."""
        self.leading = value
        if value:
            for key in list(self.store):
                self.enqueue(key)

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
        """A pod from a list or the watch."""
        key = _key(pod)
        if kind == "DELETED":
            self.forget(key)
            return
        uid = _uid(pod)
        if self.done.get(key) == uid:
            if pod_ended(pod):
                self.ending.pop(key, None)
            return
        self.done.pop(key, None)  # (a new pod of the same name)
        self.ending.pop(key, None)
        slim = slim_pod(pod)
        if _newer(slim, self.store.get(key)):
            self.store[key] = slim
            self._changed.setdefault(key, self._clock())
            if self._stale.get(key) not in (None, _rv(slim)):
                del self._stale[key]
        TRACKED.set(len(self.store))
        self.enqueue(key)

    def observe_event(self, kind: str, event: dict) -> None:
        """One of the watcher's Events: the action it reports has its Event."""
        involved = event.get("involvedObject") or {}
        uid, action = str(involved.get("uid") or ""), event.get("action")
        if kind == "DELETED" or not uid or not isinstance(action, str):
            return  # an Event that expired reports an action long done
        key = (str(involved.get("namespace") or ""), str(involved.get("name") or ""))
        if self.done.get(key) == uid:
            return
        self.sent.setdefault(uid, set()).add(action)
        if key in self.store:
            self.enqueue(key)  # it may be all that kept the pod in the store

    def forget(self, key: Key) -> None:
        """The pod is gone (deleted, or no longer listed)."""
        pod = self.store.pop(key, None)
        uid = _uid(pod) or self.done.get(key, "")
        self.done.pop(key, None)
        self.ending.pop(key, None)
        self.sent.pop(uid, None)
        self._untrack(key)

    def _drop(self, key: Key) -> None:
        """The pod needs nothing more: keep only its name and uid, to ignore its next changes."""
        pod = self.store.pop(key, None)
        if pod is None:
            return
        self.done[key] = _uid(pod)
        self.sent.pop(_uid(pod), None)
        decided = _ending_since(pod)
        if decided is not None:  # outcome written, the kubelet has yet to end it: still in flight
            self.ending[key] = decided
        self._untrack(key)

    def _untrack(self, key: Key) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        for table in (self._failures, self._due, self._stale, self._changed):
            table.pop(key, None)  # type: ignore[attr-defined]
        TRACKED.set(len(self.store))

    def _replace(self, namespace: str | None, pods: list[dict]) -> None:
        """A fresh list: forget pods it no longer has (their DELETED event was missed)."""
        listed = {_key(pod) for pod in pods}
        for table in (self.store, self.done):
            for key in [k for k in table if (namespace is None or k[0] == namespace) and k not in listed]:
                self.forget(key)
        for pod in pods:
            self.observe("ADDED", pod)
        # Events of pods that are neither in flight nor done need no memory.
        uids = {_uid(pod) for pod in self.store.values()}
        for uid in [u for u in self.sent if u not in uids]:
            del self.sent[uid]

    def _replace_events(self, namespace: str | None, events: list[dict]) -> None:
        for event in events:
            self.observe_event("ADDED", event)

    # --- running ---------------------------------------------------------------------------
    async def run(self) -> None:
        """List/watch and reconcile until cancelled."""
        namespaces: list[str | None] = list(self.settings.watcher.namespaces) or [None]
        # Events first: once the pods are listed, what is due is known.
        informers = [self._list_watch("events", ns, None, _EVENT_SELECTOR, self._replace_events,
                                      self.observe_event) for ns in namespaces]
        informers += [self._list_watch("pods", ns, _LABEL_SELECTOR, None, self._replace, self.observe)
                      for ns in namespaces]
        self._unsynced = len(informers)
        tasks = [asyncio.ensure_future(i) for i in informers]
        tasks += [asyncio.ensure_future(self._worker()) for _ in range(max(1, self.settings.watcher.concurrency))]
        tasks.append(asyncio.ensure_future(self._export_gauges()))
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks + list(self._event_tasks):
                task.cancel()
            await asyncio.gather(*tasks, *self._event_tasks, return_exceptions=True)
            for timer in self._timers.values():
                timer.cancel()
            self._timers.clear()
            TRACKED.set(0)
            export_in_flight([])

    async def _export_gauges(self) -> None:
        """The in-flight gauges, recomputed from the store; the leader's only (the followers'
        stores hold the same pods, and a sum over replicas must not count them twice)."""
        while True:
            export_in_flight(self.store.values(), self.ending.values()) if self.leading else export_in_flight([])
            await asyncio.sleep(_GAUGE_SECONDS)

    async def _list(self, plural: str, namespace: str | None, label_selector: str | None,
                    field_selector: str | None) -> tuple[list[dict], str]:
        """A paged list, each page cut down to what is kept before the next one comes."""
        items: list[dict] = []
        rv = ""
        async for page, rv in self.api.list_pages(plural, namespace, label_selector=label_selector,
                                                  field_selector=field_selector,
                                                  limit=self.settings.watcher.list_page_size):
            if plural == "pods":
                items.extend(slim_pod(pod) for pod in page)
            else:
                items.extend({"involvedObject": e.get("involvedObject") or {}, "action": e.get("action")}
                             for e in page)
        return items, rv

    async def _list_watch(self, plural: str, namespace: str | None, label_selector: str | None,
                          field_selector: str | None, replace: Callable[[str | None, list[dict]], None],
                          observe: Callable[[str, dict], None]) -> None:
        backoff = _Backoff(self.backoff_initial)
        resync = self.settings.watcher.resync_seconds
        where = {"namespace": namespace or "*", "resource": plural}
        rv: str | None = None
        next_list = float("inf")
        while True:
            try:
                if rv is None or self._clock() >= next_list:
                    items, rv = await self._list(plural, namespace, label_selector, field_selector)
                    next_list = self._clock() + resync if resync > 0 else float("inf")
                    replace(namespace, items)
                    self._mark_synced()
                    backoff.reset()
                seconds = random.randint(*_WATCH_SECONDS)
                if next_list != float("inf"):
                    seconds = max(1, min(seconds, int(next_list - self._clock()) + 1))
                opened = self._clock()
                async for kind, obj in self.api.watch(plural, namespace, label_selector=label_selector,
                                                      field_selector=field_selector, resource_version=rv,
                                                      timeout_seconds=seconds):
                    rv = _rv(obj) or rv
                    if kind != "BOOKMARK":
                        observe(kind, obj)
                    backoff.reset()
                if self._clock() - opened < 1.0:
                    await asyncio.sleep(backoff.next())  # a stream that ends at once: don't spin
            except KubeError as e:
                API_ERRORS.labels(f"watch_{plural}", str(e.status)).inc()
                if e.gone:
                    log.info("watch expired (410), re-listing", extra=where)
                    rv = None
                    continue
                delay = backoff.next()
                log.warning("watch failed, retrying in %.1fs: %s", delay, e, extra=where)
                await asyncio.sleep(delay)
            except Exception:  # a bug or an unexpected payload: keep watching, after a pause
                delay = backoff.next()
                log.exception("watch loop error, retrying in %.1fs", delay, extra=where)
                await asyncio.sleep(delay)

    def _mark_synced(self) -> None:
        if not self._synced.is_set():
            self._unsynced -= 1
            if self._unsynced <= 0:
                self._synced.set()

    async def _worker(self) -> None:
        await self._synced.wait()  # what is due is known only once everything is listed
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
                delay = min(_BACKOFF_CAP, self.backoff_initial * 2 ** n)
                API_ERRORS.labels("reconcile", str(e.status)).inc()
                log.warning("reconcile %s/%s failed, retrying in %.1fs: %s", *key, delay, e)
                if key in self.store:
                    self._enqueue_after(key, delay)
            except Exception:  # a bug must not stop the other pods' work
                log.exception("reconcile %s/%s crashed", *key)
            finally:
                self._processing.discard(key)
                if key in self._dirty:
                    self._queue.put_nowait(key)

    async def reconcile(self, key: Key) -> None:
        """Decide on the newest pod and apply the actions in order; send the Events due."""
        pod = self.store.get(key)
        if pod is None:
            return
        if self._stale.get(key) == _rv(pod):  # a 409 and the watch did not bring the newer pod
            pod = await self._get(key)
            if pod is None:
                return
        decision = decide(pod, datetime.now(timezone.utc), self.settings.watcher)
        uid = _uid(pod)
        unsent = [n for n in notices(pod) if n.kind not in self.sent.get(uid, ())]
        due = [n for n in unsent if (uid, n.kind) not in self._sending]
        if not decision.actions and not due:
            self._due.pop(key, None)
            self._changed.pop(key, None)
            if decision.requeue_after is not None:
                self._enqueue_after(key, decision.requeue_after)
            elif not unsent and _finished(pod):
                self._drop(key)
            return
        if not self.leading and not self._overdue(key, decision.actions, due, decision.requeue_after):
            return
        self._due.pop(key, None)
        for n in due:
            self._send_event(pod, n.kind, n.reason, n.message, n.warning)
        for action in decision.actions:
            before = _rv(pod)
            try:
                pod = await self._apply(key, pod, action)
            except KubeError as e:
                API_ERRORS.labels("patch_pod", str(e.status)).inc()
                if e.not_found:
                    self.forget(key)
                    return
                if not e.conflict:
                    raise
                # The pod changed since the decision: decide again on the newer one, which
                # the watch brings (or has brought already); a GET only if it does not come.
                self._stale[key] = before
                if _rv(self.store.get(key)) != before:
                    self.enqueue(key)
                else:
                    self._enqueue_after(key, _CONFLICT_REREAD_SECONDS)
                return
            if action.kind == "ready" and decision.ready_latency is not None:
                READY_LATENCY.observe(decision.ready_latency)
            changed = self._changed.pop(key, None)
            if changed is not None:
                REACTION.observe(self._clock() - changed)
        if decision.requeue_after is not None:
            self._enqueue_after(key, decision.requeue_after)

    def _overdue(self, key: Key, actions: list[Action], due: list, requeue_after: float | None) -> bool:
        """A follower acts only on what has been due for `takeover_seconds` (the holder would
        have done it by then); until then it looks again when that time is up."""
        now = self._clock()
        what = (tuple(a.kind for a in actions), tuple(n.kind for n in due))
        seen = self._due.get(key)
        if seen is None or seen[0] != what:
            seen = self._due[key] = (what, now)
        wait = self.settings.watcher.takeover_seconds - (now - seen[1])
        if wait > 0:
            self._enqueue_after(key, wait if requeue_after is None else min(wait, requeue_after))
            return False
        log.info("acting for a silent leader on %s/%s", *key, extra={"due": what})
        return True

    async def _get(self, key: Key) -> dict | None:
        try:
            pod = await self.api.get_pod(*key)
        except KubeError as e:
            API_ERRORS.labels("get_pod", str(e.status)).inc()
            if e.not_found:
                self.forget(key)
                return None
            raise
        self._stale.pop(key, None)
        slim = slim_pod(pod)
        if _newer(slim, self.store.get(key)):
            self.store[key] = slim
        return self.store.get(key)

    async def _apply(self, key: Key, pod: dict, action: Action) -> dict:
        result = slim_pod(await self.api.patch_pod(*key, _conditional(action.patch, _rv(pod))))
        if _newer(result, self.store.get(key)):
            self.store[key] = result
        if action.kind == "outcome" and action.outcome:
            OUTCOMES.labels(action.outcome["result"], action.outcome["sidecarsStoppedBy"]).inc()
        elif action.kind == "end":
            DEADLINES.inc()
        if action.reason:
            log.info(action.message, extra={"namespace": key[0], "pod": key[1], "action": action.kind})
            self._send_event(result, action.kind, action.reason, action.message, action.warning)
        return result

    # --- events --------------------------------------------------------------------------
    def _send_event(self, pod: dict, kind: str, reason: str, message: str, warning: bool) -> None:
        """Send the Event for `kind` beside the work (its own task and retries), once."""
        uid = _uid(pod)
        if (uid, kind) in self._sending or kind in self.sent.get(uid, ()):
            return
        self._sending.add((uid, kind))
        # A pod's Events go out in the order of its actions (each after the one before it,
        # which the next action never waits for): `kubectl describe` reads as it happened.
        task = asyncio.ensure_future(self._event(pod, kind, reason, message, warning, self._event_last.get(uid)))
        self._event_last[uid] = task
        self._event_tasks.add(task)
        task.add_done_callback(self._event_tasks.discard)
        task.add_done_callback(lambda t: self._event_last.pop(uid, None) if self._event_last.get(uid) is t else None)

    async def _event(self, pod: dict, kind: str, reason: str, message: str, warning: bool,
                     after: asyncio.Task | None = None) -> None:
        if after is not None:
            await asyncio.wait([after])
        meta = pod.get("metadata") or {}
        key, uid = _key(pod), _uid(pod)
        now = format_time(datetime.now(timezone.utc))
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": event_name(key[1], uid, kind), "namespace": key[0]},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": key[0], "name": key[1],
                               "uid": uid, "resourceVersion": meta.get("resourceVersion")},
            "reason": reason, "message": message[:1024], "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT}, "reportingComponent": f"{p.GROUP}/watcher",
            "reportingInstance": self.identity, "action": kind,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        backoff = _Backoff(self.backoff_initial)
        try:
            while True:
                try:
                    async with self._event_slots:
                        await self.api.create_event(key[0] or "default", event)
                    break
                except KubeError as e:
                    if e.conflict:  # AlreadyExists: another replica (or an earlier try) sent it
                        break
                    API_ERRORS.labels("create_event", str(e.status)).inc()
                    if 400 <= e.status < 500 and e.status not in (408, 429):
                        log.warning("event not written: %s", e, extra={"pod": key[1], "action": kind})
                        return
                    if key not in self.store:
                        return  # the pod is gone; nobody will read it
                    await asyncio.sleep(backoff.next())
            if self.store.get(key) is not None and _uid(self.store[key]) == uid:
                self.sent.setdefault(uid, set()).add(kind)
                self.enqueue(key)
        finally:
            self._sending.discard((uid, kind))


def _ending_since(pod: dict) -> float | None:
    """When the outcome of a waiter or hybrid pod that has not ended yet was decided (Unix time; 0 when
    unknown), or None for a pod that has no outcome yet, has ended, or is not a waiter pod
    (start-order pods are long-running by design and never get an outcome)."""
    meta = pod.get("metadata") or {}
    outcome = (meta.get("annotations") or {}).get(p.ANNOTATION_OUTCOME)
    if outcome is None or managed_as(pod) not in WAITER_RUN or \
            pod_ended(pod):
        return None
    try:
        decided = parse_time(json.loads(outcome).get("decidedAt"))
    except (ValueError, AttributeError):
        decided = None
    return decided.timestamp() if decided is not None else 0.0


def export_in_flight(pods: Any, dropped_ending: Any = ()) -> None:
    """Set the in-flight gauges from the pods in the store (slim or whole) and the decision
    times of pods dropped from it that have not ended yet."""
    steps, ending = 0, list(dropped_ending)
    for pod in pods:
        since = _ending_since(pod)
        if since is not None:
            ending.append(since)
        elif managed_as(pod) in WAITER_RUN and not pod_ended(pod):
            steps += 1
    IN_FLIGHT.labels("steps").set(steps)
    IN_FLIGHT.labels("ending").set(len(ending))
    OLDEST_ENDING.set(min((t for t in ending if t), default=0.0))


def _default_identity() -> str:
    return f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"


async def run_watcher(settings: Settings, stop: asyncio.Event | None = None, *, api: KubeApi | None = None,
                      identity: str | None = None) -> None:
    """Run the watcher until `stop` is set (forever when None). Without `api`, connects
    with in-cluster config or the default kubeconfig (and closes it at the end)."""
    own = api is None
    if api is None:
        api = await KubeApi.from_config()
        api.user_agent = f"{COMPONENT}/{__version__}"
    api.request_timeout = settings.watcher.request_timeout_seconds
    identity = identity or _default_identity()
    stop = stop or asyncio.Event()
    w = settings.watcher
    controller = Controller(api, settings, identity, leading=not w.leader_election)
    work = asyncio.ensure_future(controller.run())
    tasks: list[asyncio.Future[Any]] = [work, asyncio.ensure_future(stop.wait())]
    if not w.leader_election:
        LEADER.set(1)  # without election this replica acts: it is the leader
    else:
        elector = LeaderElector(api, settings.server.namespace, w.lease_name, identity, w.lease_seconds,
                                retry_seconds=w.renew_seconds, renew_deadline=w.renew_deadline_seconds)

        async def lead() -> None:
            controller.set_leading(True)
            try:
                await asyncio.Event().wait()
            finally:
                controller.set_leading(False)
        tasks.append(asyncio.ensure_future(elector.run(lead, stop)))
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if work.done() and not work.cancelled() and work.exception() is not None:
            raise work.exception()  # type: ignore[misc]
    finally:
        stop.set()  # the elector releases the Lease on its way out
        for task in tasks:
            if task is not work and not task.done():
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.wait_for(asyncio.shield(task), w.renew_seconds + 1)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if not w.leader_election:
            LEADER.set(0)
        if own:
            await api.close()
