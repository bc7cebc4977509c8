"""The controller's parts on their own: the work queue (dedup, priorities, delays, backoff),
the token bucket, and the Event recorder's correlation, budget and per-object limit."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.support.clock import ManualClock
from tests.support.kubedouble import now_rfc3339
from tests.watcher.test_watcher import BOUND, build_pod
from waiter import protocol as p
from webhook.kube import KubeError
from webhook.watcher._decide import RECORD, URGENT
from webhook.watcher._queue import WorkQueue
from webhook.watcher._ratelimit import TokenBucket
from webhook.watcher._recorder import OBJECT_BURST, EventRecorder, event_name


async def take(q: WorkQueue) -> str:
    key, _ = await asyncio.wait_for(q.get(), BOUND)
    return key


# --- the work queue -----------------------------------------------------------------------------
async def test_the_most_urgent_first_then_the_oldest() -> None:
    q: WorkQueue[str] = WorkQueue(ManualClock())
    for key, priority in [("r1", RECORD), ("u1", URGENT), ("r2", RECORD), ("u2", URGENT)]:
        q.add(key, priority)
    q.add("r2", URGENT)  # more urgent now: it moves up, behind the older urgent ones
    q.add("u1", RECORD)  # less urgent: it keeps its place
    assert len(q) == 4
    assert [await take(q) for _ in range(4)] == ["u1", "u2", "r2", "r1"]
    assert len(q) == 0 and q.busy == 4


async def test_a_key_is_never_on_two_workers_and_is_queued_again_when_done() -> None:
    clock = ManualClock()
    q: WorkQueue[str] = WorkQueue(clock)
    q.add("a", RECORD)
    key, since = await q.get()
    assert (key, since) == ("a", clock.monotonic())
    clock.advance(2.0)
    q.add("a", URGENT)  # changed while a worker has it
    assert len(q) == 0, "not handed to a second worker"
    q.done("a")
    assert len(q) == 1
    key, since = await q.get()
    assert key == "a" and since == clock.monotonic(), "when it was added, not when the first add was"


async def test_delays_and_backoff_run_on_the_clock() -> None:
    clock = ManualClock()
    q: WorkQueue[str] = WorkQueue(clock, backoff_initial=0.5, backoff_cap=2.0)
    q.add_after("a", 3.0, RECORD)
    q.add_after("a", 1.0, URGENT)  # an earlier one wins
    q.add_after("a", 5.0, RECORD)
    clock.advance(0.9)
    assert len(q) == 0
    clock.advance(0.2)
    assert len(q) == 1 and await take(q) == "a"
    q.done("a")
    assert [q.add_rate_limited("b", URGENT) for _ in range(4)] == [0.5, 1.0, 2.0, 2.0]  # doubling, capped
    q.forget("b")
    assert q.add_rate_limited("b", URGENT) == 0.5
    q.remove("b")  # nothing left to do for it: its timers go too
    clock.advance(10.0)
    assert len(q) == 0


async def test_idle_means_nothing_waits_and_nothing_is_in_hand() -> None:
    clock = ManualClock()
    q: WorkQueue[str] = WorkQueue(clock)
    q.add("a", URGENT)
    waiter = asyncio.ensure_future(q.wait_idle())
    await asyncio.sleep(0)
    assert not waiter.done()
    await take(q)
    await asyncio.sleep(0)
    assert not waiter.done(), "a worker is on it"
    q.add_after("b", 5.0, URGENT)
    q.done("a")
    await asyncio.wait_for(waiter, BOUND)  # a delayed key is not work yet
    clock.advance(5.0)
    assert len(q) == 1


def test_the_token_bucket() -> None:
    now = [0.0]
    bucket = TokenBucket(2.0, 3, clock=lambda: now[0])
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    assert bucket.wait() == pytest.approx(0.5)
    now[0] = 0.5
    assert bucket.take() and not bucket.take()
    now[0] = 100.0
    assert sum(bucket.take() for _ in range(10)) == 3, "at most the burst is saved up"


# --- the Event recorder -------------------------------------------------------------------------
class EventSink:
    """Just `create_event`: records the Events; `fail` answers the next calls with a status."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.fail: list[int] = []

    async def create_event(self, namespace: str, event: dict) -> dict:
        if self.fail:
            raise KubeError(self.fail.pop(0), "injected")
        if any(e["metadata"]["name"] == event["metadata"]["name"] for e in self.events):
            raise KubeError(409, "already exists", "AlreadyExists")
        self.events.append(event)
        return event


def finished_pod(name: str, uid: str) -> dict:
    pod = build_pod(name)
    pod["metadata"].update(uid=uid, resourceVersion="7")
    pod["metadata"]["annotations"][p.ANNOTATION_OUTCOME] = json.dumps(
        {"result": "Failed", "message": "build failed", "sidecarsStoppedBy": "quit", "decidedAt": now_rfc3339()})
    pod["spec"]["activeDeadlineSeconds"] = 1  # set apart from the outcome: an Event of its own
    return pod


async def recorder(sink: EventSink, gate=None, clock: ManualClock | None = None,
                   **kw) -> tuple[EventRecorder, asyncio.Task, list]:
    sent: list = []

    async def open_gate() -> None:
        return None
    r = EventRecorder(sink, "me", clock or ManualClock(), gate=gate or open_gate,  # type: ignore[arg-type]
                      on_sent=sent.append, backoff_initial=0.01, **kw)
    return r, asyncio.ensure_future(r.run()), sent


async def until(check, what: str) -> None:
    for _ in range(int(BOUND / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_each_event_once_in_order_with_fixed_names() -> None:
    sink = EventSink()
    r, task, sent = await recorder(sink)
    try:
        pod = finished_pod("b", "uid-1")
        due = r.missing(pod)
        assert [n.kind for n in due] == ["outcome", "end"]
        r.record(pod, due)
        r.record(pod, r.missing(pod))  # pending already: nothing more
        assert r.missing(pod) == [] and r.unsent(pod)
        await until(lambda: r.idle, "the Events sent")
        assert [(e["reason"], e["type"], e["action"]) for e in sink.events] == [
            ("StepsFailed", "Warning", "outcome"), ("SidecarsEnded", "Warning", "end")]
        assert [e["metadata"]["name"] for e in sink.events] == [event_name("b", "uid-1", k) for k in ("outcome", "end")]
        assert sink.events[0]["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "ci", "name": "b",
                                                    "uid": "uid-1", "resourceVersion": "7"}
        assert sent == [("ci", "b")] and not r.unsent(pod) and r.missing(pod) == []
        # Another replica's Event (seen through the informer) counts as sent.
        other = finished_pod("c", "uid-2")
        assert r.observe("ADDED", {"involvedObject": {"uid": "uid-2", "namespace": "ci", "name": "c"},
                                   "action": "outcome"}) == ("ci", "c")
        assert [n.kind for n in r.missing(other)] == ["end"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_events_wait_for_the_work_and_retry_on_errors() -> None:
    sink, gate_open = EventSink(), asyncio.Event()
    sink.fail = [500, 429, 409]  # two failures, then "AlreadyExists": an earlier try made it
    r, task, sent = await recorder(sink, gate=gate_open.wait)
    try:
        pod = finished_pod("b", "uid-1")
        r.record(pod, r.missing(pod))
        await asyncio.sleep(0.05)
        assert sink.events == [] and not r.idle, "writes are waiting: no Event goes ahead of them"
        gate_open.set()
        await until(lambda: r.idle, "the Events sent")
        assert [e["action"] for e in sink.events] == ["end"] and sent == [("ci", "b")]
        assert not r.unsent(pod)
        sink.fail = [422]  # refused for good: logged and given up, never retried
        other = finished_pod("c", "uid-2")
        r.record(other, r.missing(other))
        await until(lambda: r.idle, "the refused Event given up")
        assert not r.unsent(other) and [e["involvedObject"]["name"] for e in sink.events] == ["b", "c"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_per_object_limit_drops_what_is_over_it() -> None:
    """An object whose Events keep disappearing (deleted, or expired) is not re-sent
    without end: client-go's spam filter, OBJECT_BURST at once."""
    sink = EventSink()
    r, task, _ = await recorder(sink)
    try:
        pod = finished_pod("b", "uid-1")
        for _ in range(OBJECT_BURST):
            r.record(pod, r.missing(pod))
            await until(lambda: r.idle, "sent")
            sink.events.clear()
            r.prune(set())  # forgotten: due again
        assert r.missing(pod)
        r.record(pod, r.missing(pod))
        await until(lambda: r.idle, "dropped")
        assert sink.events == [] and not r.unsent(pod)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_budget_spreads_a_burst() -> None:
    """A token bucket on the controller's clock: the burst goes at once, the rest one per
    token; with the clock standing still no token comes, so none of the rest can go."""
    sink, clock = EventSink(), ManualClock()
    r, task, _ = await recorder(sink, clock=clock, qps=1.0, burst=3)
    try:
        for i in range(5):
            pod = finished_pod(f"b{i}", f"uid-{i}")
            pod["spec"].pop("activeDeadlineSeconds")
            r.record(pod, r.missing(pod))
        await until(lambda: len(sink.events) == 3, "the burst")
        assert not r.idle
        clock.advance(1.0)
        await until(lambda: len(sink.events) == 4, "one more token")
        clock.advance(1.0)
        await until(lambda: r.idle, "the last token")
        assert [e["involvedObject"]["name"] for e in sink.events] == [f"b{i}" for i in range(5)]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
