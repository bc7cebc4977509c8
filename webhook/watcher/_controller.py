"""The companion watcher: list/watch managed pods and apply `decide()`'s actions.

A client-go controller, wired from parts that each live in a module of their own:

- informers (`_informer.py`): list-then-watch loops for the managed pods and for the
  watcher's own Events, paged, resumed from the last resourceVersion; the pods re-listed
  only on 410 Gone, the Events never (a 410 resumes them from now);
- the store (`_store.py`): the pods in flight, slimmed to what the decisions read;
- the work queue (`_queue.py`): the pods with a write due, the most urgent first (a write
  that ends a pod or opens a gate before one that only records), never one pod on two
  workers, failed writes retried with backoff;
- the Event recorder (`_recorder.py`): the Events, sent beside the work with their own
  budget and only while no write waits or is being made;
- the clock (`_clock.py`): every time-based decision (grace periods, timeouts, takeover,
  retries) reads it and waits on it.

Every pod change runs the pure decision (`_decide.py`) at once: a pod with a write due goes
to the queue with that write's priority, and a worker decides again on the newest pod
before it writes; a pod with nothing to write gets its Events, a timer for when to look
again, or is dropped from the store once it needs nothing more. Writes are conditional on
the resourceVersion the decision was made from; a 409 waits for the newer pod from the
watch (a GET only when it does not come) and decides again.

Replicas: the Lease holder acts at once; the others keep the same store warm and act on a
pod only when its write or Event has been due for `takeover_seconds`, i.e. when the holder
died or hangs. The conditional writes make exactly one replica win each action, and the
Events' fixed names make each Event single.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import uuid
from typing import Any

from waiter import protocol as p

from .. import __version__
from ..errors import InitshiftError
from ..kube import Informer, KubeApi, KubeError
from ..settings import Settings
from ._clock import Clock, RealClock, Timer
from ._decide import Action, Decision, decide, slim_pod
from ._leader import LeaderElector
from ._metrics import (API_ERRORS, DEADLINES, LEADER, OUTCOMES, REACTION, READY_LATENCY, TRACKED,
                       export_in_flight)
from ._queue import WorkQueue
from ._recorder import COMPONENT, EventRecorder
from ._store import Key, PodStore, finished, key_of, rv_of, uid_of

log = logging.getLogger("initshift.watcher")

_LABEL_SELECTOR = f"{p.LABEL_MANAGED} in ({p.MODE_WAITER},{p.MODE_HYBRID},{p.MANAGED_START_ORDER})"
_EVENT_SELECTOR = f"source={COMPONENT}"  # the apiserver's field label for source.component
_CONFLICT_REREAD_SECONDS = 0.5  # after a 409, how long the watch may take to bring the newer pod
_GAUGE_SECONDS = 5.0  # how often the in-flight gauges are recomputed from the store


def _conditional(patch: dict, resource_version: str) -> dict:
    """The merge patch, made conditional on `resource_version` (409 if the pod changed since)."""
    meta = dict(patch.get("metadata") or {})
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {**patch, "metadata": meta}


def _count(plural: str):
    """An informer's failed calls, counted as the watcher's API errors."""
    return lambda e: API_ERRORS.labels(f"watch_{plural}", str(e.status)).inc()


def _event_fields(event: dict) -> dict:
    """What the Event informer keeps of an Event."""
    return {"involvedObject": event.get("involvedObject") or {}, "action": event.get("action")}


class Controller:
    """One replica's informers, store, work queue, workers and Event recorder. `leading` says
    whether it acts at once (the Lease holder, or no leader election) or only on work left
    overdue."""

    def __init__(self, api: KubeApi, settings: Settings, identity: str, *, leading: bool = True,
                 clock: Clock | None = None, backoff_initial: float = 0.2) -> None:
        self.api, self.settings, self.identity = api, settings, identity
        self.clock: Clock = clock or RealClock()
        self.leading = leading
        self.backoff_initial = backoff_initial
        self.store = PodStore()
        self.queue: WorkQueue[Key] = WorkQueue(self.clock, backoff_initial=backoff_initial)
        self.recorder = EventRecorder(api, identity, self.clock, gate=self.queue.wait_idle, on_sent=self._triage,
                                      backoff_initial=backoff_initial)
        w = settings.watcher
        namespaces: list[str | None] = list(w.namespaces) or [None]
        # Events first: once the pods are listed, what is due is known. What the Event
        # informer shows is a hint (the Events' fixed names make a second create a 409), so
        # after a 410 it resumes from now rather than read every Event of the cluster again.
        self.informers = [Informer(api, "events", ns, field_selector=_EVENT_SELECTOR, on_list=self._list_events,
                                   on_event=self._observe_event, shrink=_event_fields, page_size=w.list_page_size,
                                   resync_seconds=w.resync_seconds, backoff_initial=backoff_initial,
                                   on_error=_count("events"), relist_on_gone=False)
                          for ns in namespaces]
        self.informers += [Informer(api, "pods", ns, label_selector=_LABEL_SELECTOR, on_list=self._list_pods,
                                    on_event=self._observe, shrink=slim_pod, page_size=w.list_page_size,
                                    resync_seconds=w.resync_seconds, backoff_initial=backoff_initial,
                                    on_error=_count("pods"))
                           for ns in namespaces]
        self._synced = asyncio.Event()
        self._timers: dict[Key, tuple[float, Timer]] = {}  # when to decide again, without any change
        self._due: dict[Key, tuple[tuple, float]] = {}  # a follower: what was due, since when

    @property
    def synced(self) -> bool:
        """Every informer has listed and every pod listed then was decided on."""
        return self._synced.is_set()

    # --- leadership ------------------------------------------------------------------------
    def set_leading(self, value: bool) -> None:
        """Gaining the Lease: everything due is done now, not after the takeover delay."""
        self.leading = value
        if value:
            for key in self.store.keys():
                self._triage(key)

    # --- what the informers bring ----------------------------------------------------------
    def _observe(self, kind: str, pod: dict) -> None:
        if kind == "DELETED":
            self._forget(key_of(pod))
            return
        current = self.store.get(key_of(pod))
        if current is not None and uid_of(current) != uid_of(pod):
            self._forget(key_of(pod))  # the name now belongs to another pod
        key = self.store.observe(kind, pod)
        TRACKED.set(len(self.store))
        if key is not None:
            self._triage(key)

    def _list_pods(self, namespace: str | None, pods: list[dict]) -> None:
        gone, due = self.store.replace(namespace, pods)
        for key in gone:
            self._forget(key)
        self.recorder.prune(self.store.uids())
        TRACKED.set(len(self.store))
        for key in due:
            self._triage(key)

    def _observe_event(self, kind: str, event: dict) -> None:
        key = self.recorder.observe(kind, event, self.store.is_done)
        if key is not None and key in self.store:
            self._triage(key)  # it may be all that kept the pod in the store

    def _list_events(self, namespace: str | None, events: list[dict]) -> None:
        for key in self.recorder.replace(namespace, events, self.store.is_done):
            if key in self.store:
                self._triage(key)

    def _forget(self, key: Key) -> None:
        """The pod is gone (deleted, or no longer listed)."""
        self.recorder.forget(self.store.forget(key))
        self._untrack(key)

    def _drop(self, key: Key) -> None:
        """The pod needs nothing more: the store keeps its name and uid only (its later
        changes are ignored, so what the recorder knows of it is not needed either)."""
        self.recorder.forget(uid_of(self.store.get(key)))
        self.store.drop(key)
        self._untrack(key)

    def _untrack(self, key: Key) -> None:
        self.queue.remove(key)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer[1].cancel()
        self._due.pop(key, None)
        TRACKED.set(len(self.store))

    def _after(self, key: Key, seconds: float) -> None:
        """Decide on `key` again in `seconds` (an earlier timer wins)."""
        when = self.clock.monotonic() + max(0.0, seconds)
        old = self._timers.get(key)
        if old is not None:
            if old[0] <= when:
                return
            old[1].cancel()
        self._timers[key] = (when, self.clock.call_at(when, lambda: self._fire(key)))

    def _fire(self, key: Key) -> None:
        self._timers.pop(key, None)
        self._triage(key)

    # --- deciding ----------------------------------------------------------------------------
    def _decide(self, key: Key, pod: dict) -> Decision:
        seen, now = key in self.store.gate_open, self.clock.now()
        decision = decide(pod, now, self.settings.watcher, gate_seen_open=seen,
                          watched_since=self.store.first_seen.setdefault(key, now),
                          deletion_seen=self.store.deletion.get(key))
        if decision.gate_open and not seen:
            self.store.gate_open.add(key)
            if decision.ready_latency is not None and self.leading:  # (the sum over replicas counts it once)
                READY_LATENCY.observe(decision.ready_latency)
        return decision

    def _triage(self, key: Key) -> None:
        """Decide on the stored pod: queue it when a write is due, else settle it here."""
        pod = self.store.get(key)
        if pod is None or not self._synced.is_set():
            return  # what is due is known only once everything is listed
        decision = self._decide(key, pod)
        if decision.actions:
            self.queue.add(key, decision.priority)  # type: ignore[arg-type]
        else:
            self._settle(key, pod, decision)

    def _settle(self, key: Key, pod: dict, decision: Decision) -> None:
        """Nothing to write: record the Events due, look again when a timer says, or drop
        the pod once it needs nothing more."""
        due = self.recorder.missing(pod)
        if due and self._may_act(key, (), due, decision.requeue_after):
            self.recorder.record(pod, due)
        elif not due:
            self._due.pop(key, None)
        if decision.requeue_after is not None:
            self._after(key, decision.requeue_after)
        elif not due and not self.recorder.unsent(pod) and finished(pod):
            self._drop(key)

    def _may_act(self, key: Key, actions: list[Action] | tuple, events: list, requeue_after: float | None) -> bool:
        """The holder acts at once; a follower only on what has been due for `takeover_seconds`
        (the holder would have done it by then), and looks again when that time is up."""
        if self.leading:
            return True
        now = self.clock.monotonic()
        what = (tuple(a.kind for a in actions), tuple(n.kind for n in events))
        seen = self._due.get(key)
        if seen is None or seen[0] != what:
            seen = self._due[key] = (what, now)
        wait = self.settings.watcher.takeover_seconds - (now - seen[1])
        if wait > 0:
            self._after(key, wait if requeue_after is None else min(wait, requeue_after))
            return False
        log.info("acting for a silent leader on %s/%s", *key, extra={"due": what})
        return True

    # --- working -----------------------------------------------------------------------------
    async def _worker(self) -> None:
        while True:
            key, since = await self.queue.get()
            try:
                await self._reconcile(key, since)
            except Exception:  # a bug must not stop the other pods' work
                log.exception("reconcile %s/%s crashed", *key)
            finally:
                self.queue.done(key)

    async def _reconcile(self, key: Key, since: float) -> None:
        """Decide on the newest pod and write what is due, in order."""
        pod = self.store.get(key)
        if pod is None:
            return
        decision = self._decide(key, pod)
        if decision.actions and self.store.is_stale(key) and \
                self._may_act(key, decision.actions, self.recorder.missing(pod), decision.requeue_after):
            try:  # a 409, and the watch did not bring the newer pod
                pod = await self._get(key)
            except KubeError as e:
                self._retry(key, decision, e, "get_pod")
                return
            if pod is None:
                return
            decision = self._decide(key, pod)
        if not decision.actions:
            self._settle(key, pod, decision)
            return
        if not self._may_act(key, decision.actions, self.recorder.missing(pod), decision.requeue_after):
            return
        self._due.pop(key, None)
        for action in decision.actions:
            before = rv_of(pod)
            try:
                pod = await self._apply(key, pod, action)
            except KubeError as e:
                if e.not_found:
                    self._forget(key)
                    return
                if not e.conflict:
                    self._retry(key, decision, e, "patch_pod")
                    return
                # The pod changed since the decision: decide again on the newer one, which
                # the watch brings (or has brought already); a GET only if it does not come.
                API_ERRORS.labels("patch_pod", "409").inc()
                self.store.mark_stale(key, before)
                if rv_of(self.store.get(key)) != before:
                    self._triage(key)
                else:
                    self._after(key, _CONFLICT_REREAD_SECONDS)
                return
            if since is not None:
                REACTION.observe(self.clock.monotonic() - since)
                since = None  # type: ignore[assignment]
            self.recorder.record(pod, self.recorder.missing(pod))
        self.queue.forget(key)
        if decision.requeue_after is not None:
            self._after(key, decision.requeue_after)

    def _retry(self, key: Key, decision: Decision, error: KubeError, call: str) -> None:
        API_ERRORS.labels(call, str(error.status)).inc()
        if key in self.store:
            delay = self.queue.add_rate_limited(key, decision.priority)  # type: ignore[arg-type]
            log.warning("reconcile %s/%s failed, retrying in %.1fs: %s", *key, delay, error)

    async def _get(self, key: Key) -> dict | None:
        try:
            pod = await self.api.get_pod(*key)
        except KubeError as e:
            if e.not_found:
                API_ERRORS.labels("get_pod", "404").inc()
                self._forget(key)
                return None
            raise
        self.store.update(key, slim_pod(pod))
        return self.store.get(key)

    async def _apply(self, key: Key, pod: dict, action: Action) -> dict:
        result = slim_pod(await self.api.patch_pod(*key, _conditional(action.patch, rv_of(pod))))
        self.store.update(key, result)
        if action.kind == "outcome" and action.outcome:
            OUTCOMES.labels(action.outcome["result"], action.outcome["sidecarsStoppedBy"]).inc()
        if action.ends:
            DEADLINES.inc()
        if action.kind != "container-ready":
            log.info(action.message, extra={"namespace": key[0], "pod": key[1], "action": action.kind})
        return result

    # --- running -----------------------------------------------------------------------------
    async def run(self) -> None:
        """List/watch and reconcile until cancelled."""
        tasks = [asyncio.ensure_future(i.run()) for i in self.informers]
        tasks.append(asyncio.ensure_future(self._start_when_synced()))
        tasks += [asyncio.ensure_future(self._worker()) for _ in range(max(1, self.settings.watcher.concurrency))]
        tasks.append(asyncio.ensure_future(self.recorder.run()))
        tasks.append(asyncio.ensure_future(self._export_gauges()))
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.queue.cancel_all()
            for _, timer in self._timers.values():
                timer.cancel()
            self._timers.clear()
            TRACKED.set(0)
            export_in_flight(0, [])

    async def _start_when_synced(self) -> None:
        """Once every informer has listed, decide on every pod."""
        await asyncio.gather(*(i.synced.wait() for i in self.informers))
        self._synced.set()
        for key in self.store.keys():
            self._triage(key)

    async def _export_gauges(self) -> None:
        """The in-flight gauges, recomputed from the store; the leader's only (the followers'
        stores hold the same pods, and a sum over replicas must not count them twice)."""
        while True:
            export_in_flight(*self.store.in_flight()) if self.leading else export_in_flight(0, [])
            await asyncio.sleep(_GAUGE_SECONDS)


class WatcherStopped(InitshiftError):
    """A part of the watcher ended while it was to run on. The watcher stops with this
    error rather than quietly: a process left serving reviews with a dead watcher would
    leave every pod's sidecars running. The kubelet restarts the container."""


def _ended(work: asyncio.Future, ended: asyncio.Future) -> None:
    """Raise what ended the watcher early: an API error of the controller as it is (the
    commands report those), anything else (an exception, a cancellation no one asked for,
    such as aiohttp before 3.10.6 let through from a dropped connection) as WatcherStopped."""
    part = "controller" if ended is work else "leader election"
    if ended.cancelled():
        raise WatcherStopped(f"the watcher's {part} was cancelled while it was to run")
    error = ended.exception()
    if isinstance(error, KubeError):
        raise error
    if error is None:
        raise WatcherStopped(f"the watcher's {part} ended while it was to run")
    raise WatcherStopped(f"the watcher's {part} failed: {type(error).__name__}: {error}") from error


def _default_identity() -> str:
    return f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"


async def _say_missing_namespaces(api: KubeApi, names: tuple[str, ...]) -> None:
    """Warn, once at start-up, of each namespace watched that does not exist: a typo in
    INITSHIFT_WATCH_NAMESPACES or -n would watch nothing, silently (the apiserver answers a
    watch of a namespace that does not exist, empty). Any error says nothing: a user's own
    RBAC may not list namespaces, and the watcher's informers report an API that is not there."""
    for name in names:
        try:
            pages = api.list_pages("namespaces", field_selector=f"metadata.name={name}", limit=1)
            async with contextlib.aclosing(pages):
                items, _ = await anext(pages)
        except KubeError:
            return
        if not items:
            log.warning(f'watched namespace "{name}" does not exist: its pods are seen once it is made '
                        f"(INITSHIFT_WATCH_NAMESPACES, or initshift watch -n)")


async def run_watcher(settings: Settings, stop: asyncio.Event | None = None, *, api: KubeApi | None = None,
                      identity: str | None = None, controller: Controller | None = None) -> None:
    """Run the watcher until `stop` is set (forever when None). Without `api`, connects
    with in-cluster config or the default kubeconfig (and closes it at the end).
    `controller`: one built by the caller (on `api`, with its own clock)."""
    own = api is None and controller is None
    if controller is not None:
        api = controller.api
    if api is None:
        api = await KubeApi.from_config()
        api.user_agent = f"{COMPONENT}/{__version__}"
    api.request_timeout = settings.watcher.request_timeout_seconds
    identity = identity or (controller.identity if controller else _default_identity())
    stop = stop or asyncio.Event()
    w = settings.watcher
    controller = controller or Controller(api, settings, identity, leading=not w.leader_election)
    controller.leading = not w.leader_election
    work = asyncio.ensure_future(controller.run())
    stopped = asyncio.ensure_future(stop.wait())
    named = asyncio.ensure_future(_say_missing_namespaces(api, w.namespaces))
    tasks: list[asyncio.Future[Any]] = [work, stopped]
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
        if not stop.is_set():
            _ended(work, next(t for t in tasks if t.done() and t is not stopped))
    finally:
        named.cancel()
        stop.set()  # the elector releases the Lease on its way out
        for task in tasks:
            if task is not work and not task.done():
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.wait_for(asyncio.shield(task), w.renew_seconds + 1)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, named, return_exceptions=True)
        if not w.leader_election:
            LEADER.set(0)
        if own:
            await api.close()
