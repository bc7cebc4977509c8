"""The watch loop against the in-process API double: a build pod from Pending to done.

Where a test says nothing happened, it says so after `settled()`: the controller has
processed every change the double made (its informers have passed the double's newest
resourceVersion, through a bookmark) and has nothing queued, in progress or unsent; and
time-based work (grace periods, takeover delays) runs on a `ManualClock` the test moves.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, AsyncIterator, Callable

import pytest

from tests.support.clock import ManualClock
from tests.support.kubedouble import KubeDouble, now_rfc3339, running, terminated, waiting
from waiter import protocol as p
from webhook.kube import KubeApi
from webhook.metrics import REGISTRY
from webhook.rewrite._command import run_command
from webhook.settings import Settings, WatcherSettings
from webhook.watcher import Controller, WatcherStopped, run_watcher
from webhook.watcher._decide import EVENT_NEWS_SECONDS
from webhook.watcher._recorder import COMPONENT, event_name

NS = "ci"
BOUND = 20.0  # no single wait in these tests may take longer: a bug fails instead of hanging
PROBE = "http://127.0.0.1:15021/healthz/ready"


def settings(**watcher: object) -> Settings:
    base = dict(grace_seconds=0.5, sidecar_ready_timeout_seconds=60.0, leader_election=False, lease_seconds=1.5,
                renew_seconds=0.3, renew_deadline_seconds=1.0, takeover_seconds=0.4, request_timeout_seconds=2.0)
    base.update(watcher)
    return Settings(watcher=WatcherSettings(**base))  # type: ignore[arg-type]


def build_pod(name: str, namespace: str = NS, *, sidecars: tuple[str, ...] = ("istio-proxy",),
              probed: bool = False) -> dict:
    """A pod as the webhook writes it: two steps, one main, the proxy. Step 0's gate is the
    ready annotation (a proxy without a loopback readiness probe) or, `probed`, the proxy's
    probe, which the waiter checks itself (then the annotation is never written)."""
    names = ("fetch", "build", "completion")

    def wrapped(i: int, n: str) -> dict:
        gated = i == 0 and bool(sidecars)
        args = run_command(name=n, post=p.completion_path(i), argv=["make", n],
                           wait=p.completion_path(i - 1) if i else None, ready_file=p.READY_FILE if gated else None,
                           probes=(PROBE,) if gated and probed else ())
        return {"name": n, "image": "tool", "command": [p.WAITER_PATH], "args": args}
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": {p.LABEL_MANAGED: p.MODE_WAITER},
                     "annotations": {p.ANNOTATION_STEPS: json.dumps(["fetch", "build"]),
                                     p.ANNOTATION_MAINS: json.dumps(["completion"])}},
        "spec": {"restartPolicy": "Never",
                 "initContainers": [{"name": p.INIT_CONTAINER_NAME, "image": "initshift"}],
                 "containers": [wrapped(i, n) for i, n in enumerate(names)]
                 + [{"name": s, "image": "proxy"} for s in sidecars]},
    }


def record(name: str, code: int = 0, reason: str = p.REASON_COMPLETED, at: str | None = None) -> str:
    now = at or now_rfc3339()
    return json.dumps({"name": name, "exitCode": code, "reason": reason, "startedAt": now, "finishedAt": now,
                       "message": ""})


def step_done(name: str, code: int = 0, reason: str = p.REASON_COMPLETED, at: str | None = None) -> dict:
    return terminated(name, code, message=record(name, code, reason, at), finished_at=at)


async def eventually(check: Callable[[], object], what: str, timeout: float = BOUND) -> object:
    """Poll `check` until it returns something truthy (bounded, so a bug fails)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        value = check()
        if value:
            return value
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def _caught_up(kube: KubeDouble, c: Controller, rv: int) -> bool:
    """The controller has decided on what it listed; the pod informers have passed `rv`; the Event informers (no bookmarks: the apiserver
    keeps no watch cache for Events) have seen the newest of the watcher's Events."""
    def seen(i: Any) -> int:
        if i.plural != "events":
            return rv
        return max((int(e["metadata"]["resourceVersion"]) for e in kube.items("events", i.namespace)
                    if (e.get("source") or {}).get("component") == COMPONENT), default=0)
    return c.synced and all(int(i.resource_version or 0) >= seen(i) for i in c.informers) and \
        not len(c.queue) and not c.queue.busy and c.recorder.idle


async def settled(kube: KubeDouble, *controllers: Controller) -> None:
    """Every controller has seen every change the double has made and acted on it: its
    informers have passed the newest resourceVersion (a bookmark brings it) and nothing is
    queued, in progress or unsent. Its own writes are changes too: until none comes."""
    loop = asyncio.get_running_loop()
    end = loop.time() + BOUND
    while True:
        rv = kube.resource_version
        while not all(_caught_up(kube, c, rv) for c in controllers):
            if loop.time() > end:
                state = [([i.resource_version for i in c.informers], len(c.queue), c.queue.busy, c.recorder.idle)
                         for c in controllers]
                raise AssertionError(f"the watcher did not catch up with {rv}: (informers, queued, busy, "
                                     f"Events idle) {state}")
            kube.send_bookmarks()  # (a watch that is only opening gets the next one)
            await asyncio.sleep(0.02)
        if kube.resource_version == rv:
            return


def annotation(kube: KubeDouble, name: str, key: str, namespace: str = NS) -> str | None:
    pod = kube.get("pods", namespace, name)
    return ((pod or {}).get("metadata", {}).get("annotations") or {}).get(key)


def outcome(kube: KubeDouble, name: str, namespace: str = NS) -> dict | None:
    raw = annotation(kube, name, p.ANNOTATION_OUTCOME, namespace)
    return json.loads(raw) if raw else None


def deadline_patches(kube: KubeDouble, name: str) -> list:
    return [r for r in kube.patches(NS, name) if "activeDeadlineSeconds" in json.dumps(r.body)]


def outcome_patches(kube: KubeDouble, name: str) -> list:
    return [r for r in kube.patches(NS, name) if p.ANNOTATION_OUTCOME in json.dumps(r.body)]


def watcher_writes(kube: KubeDouble, name: str) -> list:
    """The watcher's writes about one pod: its patches and its Events' creates."""
    events = [r for r in kube.requests if r.method == "POST" and r.path == f"/api/v1/namespaces/{NS}/events"
              and r.body["involvedObject"]["name"] == name]
    return sorted(kube.patches(NS, name) + events, key=lambda r: r.started)


@asynccontextmanager
async def watcher(kube: KubeDouble, s: Settings, *, user_agent: str = "watcher-a", identity: str | None = None,
                  clock: ManualClock | None = None) -> AsyncIterator[Controller]:
    stop = asyncio.Event()
    api = kube.kube_api(user_agent)
    controller = Controller(api, s, identity or user_agent, clock=clock)
    task = asyncio.ensure_future(run_watcher(s, stop, controller=controller))
    try:
        yield controller
    finally:
        stop.set()
        try:
            await asyncio.wait_for(task, BOUND)
        finally:
            await api.close()


async def walk_to_steps_done(kube: KubeDouble, c: Controller, name: str, at: str | None = None) -> None:
    """Pending -> sidecar Ready (gate opens) -> fetch -> build -> completion."""
    kube.set_container_statuses(NS, name, [waiting("istio-proxy"), waiting("fetch"), waiting("build"),
                                           waiting("completion")], phase="Pending", start_time=at)
    await settled(kube, c)
    assert annotation(kube, name, p.ANNOTATION_READY) is None  # sidecar not Ready: the gate stays shut
    kube.set_container_statuses(NS, name, [running("istio-proxy", ready=False), running("fetch", ready=False),
                                           running("build"), running("completion")], phase="Running")
    await settled(kube, c)
    assert annotation(kube, name, p.ANNOTATION_READY) is None
    kube.set_container_statuses(NS, name, [running("istio-proxy")])
    await eventually(lambda: annotation(kube, name, p.ANNOTATION_READY) == p.READY_TRUE, "the ready gate")
    for step in ("fetch", "build", "completion"):
        kube.set_container_statuses(NS, name, [step_done(step, at=at)])


async def test_build_walks_from_pending_to_outcome_and_deadline(kube: KubeDouble) -> None:
    kube.put_pod(build_pod("b1"))
    before = REGISTRY.get_sample_value("initshift_watcher_deadline_terminations_total") or 0.0
    clock = ManualClock()
    async with watcher(kube, settings(grace_seconds=5.0), clock=clock) as c:
        await walk_to_steps_done(kube, c, "b1", at=clock.stamp())
        await settled(kube, c)
        assert outcome(kube, "b1") is None, "the proxy may still quit within the grace period"
        clock.advance(3.0)
        await settled(kube, c)
        assert outcome(kube, "b1") is None
        # The proxy ignores the quit: once the grace period is over, the outcome and the
        # deadline in one patch.
        clock.advance(3.0)
        await eventually(lambda: kube.pod(NS, "b1")["spec"].get("activeDeadlineSeconds") == 1, "the deadline")
        got = outcome(kube, "b1")
        assert got["result"] == "Succeeded" and got["failed"] is None
        assert got["sidecarsStoppedBy"] == "deadline"
        assert [s["name"] for s in got["steps"]] == ["fetch", "build"]
        assert [m["name"] for m in got["mains"]] == ["completion"]
        assert all(s["exitCode"] == 0 and s["reason"] == "Completed" for s in got["steps"] + got["mains"])
        assert outcome_patches(kube, "b1") == deadline_patches(kube, "b1")  # one patch holds both
        kube.kill_pod(NS, "b1")  # the kubelet ends it
        await settled(kube, c)
        assert (NS, "b1") not in c.store, "nothing left to do: dropped"
    patches = kube.patches(NS, "b1")
    assert all(r.content_type == "application/merge-patch+json" and r.status == 200 for r in patches)
    # The write budget of a pod whose gate is the annotation: the gate, the outcome, one Event.
    writes = watcher_writes(kube, "b1")
    assert [("event" if r.path.endswith("/events") else "patch") for r in writes] == ["patch", "patch", "event"]
    (event,) = kube.events_for(NS, "b1")
    assert event["reason"] == "StepsSucceeded" and event["type"] == "Normal" and event["action"] == "outcome"
    assert event["message"] == "Succeeded: 2 steps and 1 main succeeded; sidecars stopped by deadline"
    assert event["involvedObject"]["name"] == "b1" and event["source"]["component"] == "initshift-watcher"
    assert REGISTRY.get_sample_value("initshift_watcher_deadline_terminations_total") == before + 1
    assert REGISTRY.get_sample_value("initshift_watcher_outcomes_total",
                                     {"result": "Succeeded", "sidecars_stopped_by": "deadline"}) >= 1


async def test_a_probe_gated_build_costs_one_patch_and_one_event(kube: KubeDouble) -> None:
    """Step 0 checks the proxy's loopback probe itself: no ready annotation, so the whole
    build costs the outcome's patch (with the deadline in it) and its Event."""
    kube.put_pod(build_pod("p1", probed=True))
    async with watcher(kube, settings(grace_seconds=0.0)) as c:
        kube.set_container_statuses(NS, "p1", [running("istio-proxy"), running("fetch"), running("build"),
                                               running("completion")], phase="Running")
        await settled(kube, c)
        assert watcher_writes(kube, "p1") == [] and annotation(kube, "p1", p.ANNOTATION_READY) is None
        for step in ("fetch", "build", "completion"):
            kube.set_container_statuses(NS, "p1", [step_done(step)])
        await eventually(lambda: kube.events_for(NS, "p1"), "the Event")
        await settled(kube, c)
    (patch, event) = watcher_writes(kube, "p1")
    assert patch.body["spec"] == {"activeDeadlineSeconds": 1} and p.ANNOTATION_OUTCOME in patch.body["metadata"][
        "annotations"] and event.method == "POST"


async def test_a_watcher_started_after_the_event_expired_does_not_write_it_again(kube: KubeDouble) -> None:
    """The apiserver deletes Events after its TTL (1 h by default); a watcher started later
    (an upgrade, a rescheduled replica) finds the finished pod without its Event. The
    outcome is old news then: no second Event. Within the news window it is sent."""
    kube.put_pod(build_pod("p1", probed=True))
    clock = ManualClock()
    async with watcher(kube, settings(grace_seconds=0.0), clock=clock) as c:
        kube.set_container_statuses(NS, "p1", [running("istio-proxy"), running("fetch"), running("build"),
                                               running("completion")], phase="Running")
        for step in ("fetch", "build", "completion"):
            kube.set_container_statuses(NS, "p1", [step_done(step, at=clock.stamp())])
        await eventually(lambda: kube.events_for(NS, "p1"), "the Event")
        await settled(kube, c)
    (first,) = kube.events_for(NS, "p1")
    kube.delete("events", NS, first["metadata"]["name"])  # expired
    clock.advance(EVENT_NEWS_SECONDS - 60)
    async with watcher(kube, settings(grace_seconds=0.0), user_agent="watcher-b", clock=clock) as c:
        await eventually(lambda: kube.events_for(NS, "p1"), "the Event, still news, sent again")
        await settled(kube, c)
    (again,) = kube.events_for(NS, "p1")
    kube.delete("events", NS, again["metadata"]["name"])
    clock.advance(120)
    async with watcher(kube, settings(grace_seconds=0.0), user_agent="watcher-c", clock=clock) as c:
        await settled(kube, c)
        assert "p1" not in {name for _, name in c.store.keys()}, "old news: the pod needs nothing more"
    assert kube.events_for(NS, "p1") == []


async def test_sidecars_that_quit_need_no_deadline(kube: KubeDouble) -> None:
    kube.put_pod(build_pod("b2"))
    clock = ManualClock()
    async with watcher(kube, settings(grace_seconds=5.0), clock=clock) as c:
        await walk_to_steps_done(kube, c, "b2", at=clock.stamp())
        kube.set_container_statuses(NS, "b2", [terminated("istio-proxy", 0)], phase="Succeeded")
        got = await eventually(lambda: outcome(kube, "b2"), "the outcome")
        assert got["result"] == "Succeeded" and got["sidecarsStoppedBy"] == "quit"
        await settled(kube, c)
        assert clock.pending == [], "nothing left to wait for"
    assert deadline_patches(kube, "b2") == []
    assert [e["reason"] for e in kube.events_for(NS, "b2")] == ["StepsSucceeded"]


async def test_dropped_watch_mid_build_still_finishes(kube: KubeDouble) -> None:
    kube.put_pod(build_pod("b3"))
    async with watcher(kube, settings()):
        kube.set_container_statuses(NS, "b3", [running("istio-proxy"), running("fetch")], phase="Running")
        await eventually(lambda: annotation(kube, "b3", p.ANNOTATION_READY), "the ready gate")
        await eventually(lambda: kube.open_watches == 2, "the pods' and the Events' watches")
        assert kube.drop_watches() == 2
        kube.set_container_statuses(NS, "b3", [step_done("fetch"), step_done("build"), step_done("completion"),
                                               terminated("istio-proxy", 0)], phase="Succeeded")
        got = await eventually(lambda: outcome(kube, "b3"), "the outcome after the drop")
        assert got["result"] == "Succeeded" and got["sidecarsStoppedBy"] == "quit"
    watches = [r for r in kube.requests if r.query.get("watch") == "true" and r.path == "/api/v1/pods"]
    assert len(watches) >= 2 and watches[1].query.get("resourceVersion")  # resumed, not restarted
    assert len([r for r in kube.requests if r.path == "/api/v1/pods" and "watch" not in r.query]) == 1


async def test_expired_resource_version_relists(kube: KubeDouble) -> None:
    kube.put_pod(build_pod("b4"))
    async with watcher(kube, settings()):
        await eventually(lambda: kube.open_watches, "a watch")
        lists_before = len([r for r in kube.requests if r.path == "/api/v1/pods" and "watch" not in r.query])
        # History is compacted while the watch is down: resuming gets 410 Gone, so the watcher re-lists.
        kube.compact()
        kube.fail_next("/api/v1/pods", 410, watch=True)
        kube.drop_watches()
        kube.set_container_statuses(NS, "b4", [step_done("fetch"), step_done("build"), step_done("completion"),
                                               terminated("istio-proxy", 0)], phase="Succeeded")
        await eventually(lambda: outcome(kube, "b4"), "the outcome after a re-list")
    lists = [r for r in kube.requests if r.path == "/api/v1/pods" and "watch" not in r.query]
    assert len(lists) > lists_before


async def test_conflicts_and_server_errors_are_retried(kube: KubeDouble) -> None:
    kube.put_pod(build_pod("b5"))
    kube.fail_next("/api/v1/pods", 500, times=2, watch=False)  # the first lists fail: back off, retry
    kube.fail_next(f"/api/v1/namespaces/{NS}/pods/b5", 409, times=2, method="PATCH")
    kube.fail_next(f"/api/v1/namespaces/{NS}/pods/b5", 500, times=1, method="PATCH")
    kube.fail_next(f"/api/v1/namespaces/{NS}/events", 500, times=1)  # a lost Event never blocks the work
    async with watcher(kube, settings()) as c:
        kube.set_container_statuses(NS, "b5", [running("istio-proxy"), step_done("fetch"), step_done("build"),
                                               step_done("completion")], phase="Running")
        await eventually(lambda: kube.pod(NS, "b5")["spec"].get("activeDeadlineSeconds") == 1, "the deadline")
        await eventually(lambda: kube.events_for(NS, "b5"), "the Event, on its second try")
        await settled(kube, c)
    assert outcome(kube, "b5")["sidecarsStoppedBy"] == "deadline"
    statuses = [r.status for r in kube.patches(NS, "b5")]
    assert statuses == [409, 409, 500, 200]
    assert [e["reason"] for e in kube.events_for(NS, "b5")] == ["StepsSucceeded"]


async def test_stale_outcome_patch_is_refused_and_not_rewritten(kube: KubeDouble) -> None:
    """Another replica wrote the outcome first: the conditional patch gets 409, the watcher
    re-reads the pod and leaves that outcome alone."""
    pod = build_pod("b6")
    pod["metadata"]["annotations"][p.ANNOTATION_READY] = p.READY_TRUE
    kube.put_pod(pod)
    kube.set_container_statuses(NS, "b6", [step_done("fetch"), step_done("build"), step_done("completion"),
                                           terminated("istio-proxy", 0)], phase="Succeeded")
    theirs = json.dumps({"result": "Succeeded", "message": "theirs", "sidecarsStoppedBy": "quit",
                         "by": "other-replica"})
    kube.delay(f"/api/v1/namespaces/{NS}/pods/b6", 0.3, times=1, method="PATCH")
    async with watcher(kube, settings()) as c:
        await eventually(lambda: kube.patches(NS, "b6"), "a patch attempt")
        # While the watcher's patch is in flight, the other replica's lands first.
        current = kube.pod(NS, "b6")
        current["metadata"]["annotations"][p.ANNOTATION_OUTCOME] = theirs
        kube.put_pod(current)
        await eventually(lambda: any(r.status == 409 for r in kube.patches(NS, "b6")), "the conflict")
        await settled(kube, c)
    assert annotation(kube, "b6", p.ANNOTATION_OUTCOME) == theirs
    assert [r.status for r in kube.patches(NS, "b6")] == [409]


async def test_oomkilled_step_fails_and_ends_the_pod(kube: KubeDouble) -> None:
    kube.put_pod(build_pod("b7"))
    async with watcher(kube, settings(grace_seconds=30.0)):
        kube.set_container_statuses(NS, "b7", [running("istio-proxy"), running("fetch"), running("build"),
                                               running("completion")], phase="Running")
        await eventually(lambda: annotation(kube, "b7", p.ANNOTATION_READY), "the ready gate")
        kube.set_container_statuses(NS, "b7", [terminated("fetch", 137, "OOMKilled")])
        await eventually(lambda: kube.pod(NS, "b7")["spec"].get("activeDeadlineSeconds") == 1, "the deadline")
        await eventually(lambda: kube.events_for(NS, "b7"), "the Event")
    got = outcome(kube, "b7")
    assert got["result"] == "Failed" and got["failed"] == "fetch" and "OOMKilled" in got["message"]
    assert [s["reason"] for s in got["steps"]] == ["OOMKilled", "NotRun"]
    (event,) = kube.events_for(NS, "b7")
    assert event["reason"] == "StepsFailed" and event["type"] == "Warning"


async def test_an_ended_pod_gets_its_outcome_from_the_kubelets_last_word(kube: KubeDouble) -> None:
    """A pod's own deadline, as a real kubelet (v1.34.9) can report it: first the phase
    Failed with the steps still shown running, then their ends. The outcome waits for the
    ends (`build` Stopped, not NotRun); where they never come, it is written after the
    pod's grace period (30 s, the apiserver's default) and five seconds."""
    clock = ManualClock()
    for name in ("d1", "d2"):
        kube.put_pod(build_pod(name))
    async with watcher(kube, settings(), clock=clock) as c:
        for name in ("d1", "d2"):
            kube.set_container_statuses(NS, name, [running("istio-proxy"), running("fetch"), running("build"),
                                                   running("completion")], phase="Running", start_time=clock.stamp())
            await eventually(lambda: annotation(kube, name, p.ANNOTATION_READY), "the ready gate")
            kube.end_pod(NS, name)
        await settled(kube, c)
        assert outcome(kube, "d1") is None and outcome(kube, "d2") is None, "their ends are still to come"
        kube.set_container_statuses(NS, "d1", [
            step_done("fetch", 143, p.REASON_ERROR, at=clock.stamp()),
            step_done("build", 143, p.REASON_STOPPED, at=clock.stamp()),
            step_done("completion", 143, p.REASON_STOPPED, at=clock.stamp()), terminated("istio-proxy", 0)])
        got = await eventually(lambda: outcome(kube, "d1"), "d1's outcome")
        assert [s["reason"] for s in got["steps"] + got["mains"]] == ["Error", "Stopped", "Stopped"]
        assert got["failed"] == "fetch" and "DeadlineExceeded" in got["message"]
        await settled(kube, c)
        assert outcome(kube, "d2") is None
        clock.advance(36.0)
        got = await eventually(lambda: outcome(kube, "d2"), "d2's outcome, the wait over")
        assert [s["reason"] for s in got["steps"]] == ["NotRun", "NotRun"] and got["failed"] == "fetch"


@pytest.mark.parametrize("kube", ["v1.34.9"], indirect=True)
async def test_a_build_deleted_mid_step_is_dated_by_the_first_delete_a_finalizer_outlives(kube: KubeDouble) -> None:
    """A cancelled build whose pod a finalizer holds (a Job's `job-tracking`): the kubelet
    stops every container on the deletion, then deletes the pod again with no grace, which
    moves its `deletionTimestamp` to that moment (kubernetes#122646: the double as v1.34.9).
    A watcher that decides only after that (here its first outcome write is refused) still
    says the deletion stopped the build, dated by the first delete it saw."""
    body = build_pod("x1")
    body["metadata"]["finalizers"] = ["batch.kubernetes.io/job-tracking"]
    body["spec"].update(nodeName="node-a", terminationGracePeriodSeconds=20)
    kube.put_pod(body)
    clock = ManualClock()
    async with watcher(kube, settings(), clock=clock) as c:
        kube.set_container_statuses(NS, "x1", [running("istio-proxy"), running("fetch"), running("build"),
                                               running("completion")], phase="Running", start_time=clock.stamp())
        await eventually(lambda: annotation(kube, "x1", p.ANNOTATION_READY), "the ready gate")
        asked = clock.now()
        kube.delete_pod(NS, "x1", at=asked)
        await settled(kube, c)
        kube.fail_next(f"/api/v1/namespaces/{NS}/pods/x1", 409, method="PATCH")
        refused = len([r for r in kube.requests if r.status == 409])
        kube.set_container_statuses(NS, "x1", [
            step_done("fetch", 143, p.REASON_ERROR, at=clock.stamp(2)),
            step_done("build", 143, p.REASON_STOPPED, at=clock.stamp(2)),
            step_done("completion", 143, p.REASON_STOPPED, at=clock.stamp(2)),
            terminated("istio-proxy", 0, finished_at=clock.stamp(2))])
        await eventually(lambda: len([r for r in kube.requests if r.status == 409]) > refused, "the refused write")
        kube.delete_pod(NS, "x1", 0, at=asked + timedelta(seconds=4))  # the kubelet's last delete
        assert kube.pod(NS, "x1")["metadata"]["deletionGracePeriodSeconds"] == 0
        got = await eventually(lambda: outcome(kube, "x1"), "the outcome")
        assert (got["failed"], got["sidecarsStoppedBy"]) == ("fetch", "deletion"), got
        assert got["message"].endswith(f"(the pod was deleted at {asked.strftime('%Y-%m-%dT%H:%M:%SZ')})"), got


async def test_sidecar_never_ready_times_out(kube: KubeDouble) -> None:
    kube.put_pod(build_pod("b8", probed=True))
    clock = ManualClock()
    async with watcher(kube, settings(sidecar_ready_timeout_seconds=30.0), clock=clock) as c:
        kube.set_container_statuses(NS, "b8", [running("istio-proxy", ready=False), running("fetch")],
                                    phase="Running", start_time=clock.stamp())
        await settled(kube, c)
        clock.advance(25.0)
        await settled(kube, c)
        assert kube.patches(NS, "b8") == []
        # No further event arrives: the watcher's own timer fires.
        clock.advance(10.0)
        await eventually(lambda: kube.pod(NS, "b8")["spec"].get("activeDeadlineSeconds") == 1, "the deadline")
    got = outcome(kube, "b8")
    assert got["result"] == "Failed" and got["failed"] == "istio-proxy" and "not Ready" in got["message"]
    assert annotation(kube, "b8", p.ANNOTATION_READY) is None


async def test_a_watcher_started_while_step_0_runs_gives_the_sidecars_the_timeout_from_then(kube: KubeDouble) -> None:
    """A restart (a rollout) while a probe-gated build's step 0 runs and its proxy is not
    Ready, past the timeout from the pod's start: nothing on the pod says whether the gate
    opened, so the build is not failed for it at once; a gate that never opens is failed a
    whole timeout later."""
    kube.put_pod(build_pod("b10", probed=True))
    clock = ManualClock()
    kube.set_container_statuses(NS, "b10", [running("istio-proxy", ready=False), running("fetch")], phase="Running",
                                start_time=clock.stamp(-45.0))
    async with watcher(kube, settings(sidecar_ready_timeout_seconds=30.0), clock=clock) as c:
        await settled(kube, c)
        assert kube.patches(NS, "b10") == [], "failed on the watcher's first sight"
        clock.advance(25.0)
        await settled(kube, c)
        assert kube.patches(NS, "b10") == []
        clock.advance(10.0)
        await eventually(lambda: kube.pod(NS, "b10")["spec"].get("activeDeadlineSeconds") == 1, "the deadline")
    got = outcome(kube, "b10")
    assert got["result"] == "Failed" and got["failed"] == "istio-proxy" and "not Ready after 30s" in got["message"]


async def test_a_probe_gated_pod_whose_proxy_turns_unready_later_is_not_failed(kube: KubeDouble) -> None:
    """Once the watcher has seen every sidecar Ready, a sidecar not Ready past the timeout
    is a hiccup of a running build, not a gate that never opened."""
    kube.put_pod(build_pod("b9", probed=True))
    clock = ManualClock()
    async with watcher(kube, settings(sidecar_ready_timeout_seconds=30.0), clock=clock) as c:
        kube.set_container_statuses(NS, "b9", [running("istio-proxy"), running("fetch")], phase="Running",
                                    start_time=clock.stamp())
        await settled(kube, c)
        kube.set_container_statuses(NS, "b9", [running("istio-proxy", ready=False)])
        await settled(kube, c)
        clock.advance(60.0)
        await settled(kube, c)
    assert kube.patches(NS, "b9") == []


async def test_only_configured_namespaces_and_managed_pods(kube: KubeDouble) -> None:
    kube.put_pod(build_pod("in-scope", "team-a"))
    kube.put_pod(build_pod("other-ns", "team-b"))
    unmanaged = build_pod("unmanaged", "team-a")
    unmanaged["metadata"]["labels"] = {}
    kube.put_pod(unmanaged)
    async with watcher(kube, settings(namespaces=("team-a",))) as c:
        for ns, name in (("team-a", "in-scope"), ("team-b", "other-ns"), ("team-a", "unmanaged")):
            kube.set_container_statuses(ns, name, [running("istio-proxy"), running("fetch")], phase="Running")
        await eventually(lambda: annotation(kube, "in-scope", p.ANNOTATION_READY, "team-a"), "the gate")
        await settled(kube, c)
    assert annotation(kube, "other-ns", p.ANNOTATION_READY, "team-b") is None
    assert annotation(kube, "unmanaged", p.ANNOTATION_READY, "team-a") is None


async def test_two_watchers_one_lease_never_both_act(kube: KubeDouble) -> None:
    s = settings(leader_election=True, lease_seconds=1.5)
    lease = lambda: kube.get("leases", s.server.namespace, s.watcher.lease_name)  # noqa: E731
    kube.put_pod(build_pod("c1"))
    follower_clock = ManualClock()
    async with watcher(kube, s, user_agent="replica-a") as a:
        await eventually(lease, "the lease")
        async with watcher(kube, s, user_agent="replica-b", clock=follower_clock) as b:
            await walk_to_steps_done(kube, a, "c1")
            await eventually(lambda: outcome(kube, "c1"), "the outcome")
            await eventually(lambda: kube.pod(NS, "c1")["spec"].get("activeDeadlineSeconds") == 1, "the deadline")
            await settled(kube, a, b)
            # Past the takeover delay on the follower's clock: it finds nothing left undone.
            follower_clock.advance(s.watcher.takeover_seconds + 1.0)
            await settled(kube, a, b)
            assert {r.user_agent for r in kube.patches()} == {"replica-a"}
            assert lease()["spec"]["holderIdentity"] == "replica-a"
            assert {e["reportingInstance"] for e in kube.events_for(NS, "c1")} == {"replica-a"}
        # (the follower stopped; the leader still acts alone)
    # The leader released the Lease when it stopped.
    assert lease()["spec"]["holderIdentity"] == ""


async def test_follower_takes_over_when_the_leader_stops(kube: KubeDouble) -> None:
    s = settings(leader_election=True, lease_seconds=1.5)
    kube.put_pod(build_pod("c2"))
    kube.set_container_statuses(NS, "c2", [running("istio-proxy"), running("fetch")], phase="Running")
    async with watcher(kube, s, user_agent="replica-b"):
        async with watcher(kube, s, user_agent="replica-a"):
            await eventually(lambda: annotation(kube, "c2", p.ANNOTATION_READY), "the gate from the first leader")
            first = kube.get("leases", s.server.namespace, s.watcher.lease_name)["spec"]["holderIdentity"]
        # One replica stopped; whichever remains must hold the lease and do the rest.
        kube.set_container_statuses(NS, "c2", [step_done("fetch"), step_done("build"), step_done("completion"),
                                               terminated("istio-proxy", 0)], phase="Succeeded")
        await eventually(lambda: outcome(kube, "c2"), "the outcome from the remaining replica")
        holder = kube.get("leases", s.server.namespace, s.watcher.lease_name)["spec"]["holderIdentity"]
        assert holder == "replica-b"
    outcome_agents = {r.user_agent for r in outcome_patches(kube, "c2") if r.status == 200}
    assert outcome_agents == {"replica-b"}
    assert first in ("replica-a", "replica-b")


async def test_a_follower_leaves_work_to_a_live_holder_and_takes_over_what_it_leaves(kube: KubeDouble) -> None:
    """Another identity holds a fresh Lease and does the work (patch and Event): this replica
    never writes. Work that holder leaves undone is done by this replica, but only once it
    has been due for INITSHIFT_WATCHER_TAKEOVER_SECONDS on its clock."""
    s = settings(leader_election=True, lease_seconds=1.5, takeover_seconds=0.8)
    kube.put("leases", {"metadata": {"name": s.watcher.lease_name, "namespace": s.server.namespace},
                        "spec": {"holderIdentity": "someone-else", "leaseDurationSeconds": 60,
                                 "renewTime": now_rfc3339()}})
    kube.put_pod(build_pod("c3"))
    kube.set_container_statuses(NS, "c3", [step_done("fetch"), step_done("build"), step_done("completion"),
                                           terminated("istio-proxy", 0)], phase="Succeeded")

    async def live_holder() -> None:  # renews, and records c3's outcome (with its Event) as the watcher would
        while True:
            lease = kube.get("leases", s.server.namespace, s.watcher.lease_name)
            lease["spec"]["renewTime"] = now_rfc3339()
            kube.put("leases", lease)
            pod = kube.pod(NS, "c3")
            if annotation(kube, "c3", p.ANNOTATION_OUTCOME) is None:
                pod["metadata"]["annotations"][p.ANNOTATION_OUTCOME] = json.dumps(
                    {"result": "Succeeded", "message": "by the holder", "sidecarsStoppedBy": "quit"})
                kube.put_pod(pod)
                uid = pod["metadata"]["uid"]
                kube.put("events", {"metadata": {"name": event_name("c3", uid, "outcome"), "namespace": NS},
                                    "involvedObject": {"kind": "Pod", "namespace": NS, "name": "c3", "uid": uid},
                                    "reason": "StepsSucceeded", "action": "outcome",
                                    "source": {"component": "initshift-watcher"}})
            await asyncio.sleep(0.1)
    holder = asyncio.ensure_future(live_holder())
    clock = ManualClock()
    try:
        async with watcher(kube, s, user_agent="replica-c", clock=clock) as c:
            await eventually(lambda: kube.events_for(NS, "c3"), "the holder's Event")
            await settled(kube, c)
            clock.advance(1.5)  # more than the takeover delay
            await settled(kube, c)
            assert kube.patches() == [] and len(kube.events_for(NS, "c3")) == 1
            kube.put_pod(build_pod("c4"))  # the holder leaves this one alone
            kube.set_container_statuses(NS, "c4", [running("istio-proxy"), running("fetch")], phase="Running")
            await settled(kube, c)
            clock.advance(0.7)  # not yet due for takeover_seconds
            await settled(kube, c)
            assert kube.patches() == []
            clock.advance(0.2)
            await eventually(lambda: annotation(kube, "c4", p.ANNOTATION_READY), "the follower takes over")
            await settled(kube, c)
    finally:
        holder.cancel()
    assert [r.path.rsplit("/", 1)[1] for r in kube.patches()] == ["c4"]
    assert kube.get("leases", s.server.namespace, s.watcher.lease_name)["spec"]["holderIdentity"] == "someone-else"
    assert [e["reason"] for e in kube.events_for(NS, "c3")] == ["StepsSucceeded"]


class HangingLeaseApi:
    """Just the Lease calls; a PUT never answers while `hang` is set (a stuck apiserver)."""

    def __init__(self) -> None:
        self.lease: dict | None = None
        self.hang = False

    async def get_lease(self, namespace: str, name: str) -> dict | None:
        return self.lease

    async def create_lease(self, namespace: str, lease: dict) -> dict:
        self.lease = {**lease, "metadata": {**lease["metadata"], "resourceVersion": "1"}}
        return self.lease

    async def replace_lease(self, namespace: str, name: str, lease: dict) -> dict:
        while self.hang:
            await asyncio.sleep(0.05)
        self.lease = lease
        return lease


async def test_a_leader_whose_renewal_hangs_steps_down() -> None:
    """As client-go bounds each renewal by the renew deadline: a PUT that never returns
    must not keep this replica acting past the point where another may take the Lease."""
    from webhook.watcher._leader import LeaderElector

    api = HangingLeaseApi()
    elector = LeaderElector(api, NS, "lease", "me", lease_seconds=0.6)  # type: ignore[arg-type]
    led, lost = asyncio.Event(), asyncio.Event()

    async def lead() -> None:
        led.set()
        try:
            await asyncio.Event().wait()
        finally:
            lost.set()

    stop = asyncio.Event()
    runner = asyncio.ensure_future(elector.run(lead, stop))
    try:
        await asyncio.wait_for(led.wait(), BOUND)
        api.hang = True  # every renewal from now on hangs
        await asyncio.wait_for(lost.wait(), BOUND)
        assert not elector.leading
    finally:
        api.hang = False
        stop.set()
        await asyncio.wait_for(runner, BOUND)


class StrayCancelApi(KubeApi):
    """The double's API, but reading the Lease ends in a CancelledError no one asked for:
    what aiohttp before 3.10.6 let out of a response read when the apiserver dropped the
    connection (aio-libs/aiohttp#8175)."""

    async def get_lease(self, namespace: str, name: str) -> dict | None:
        raise asyncio.CancelledError()


async def test_a_watcher_whose_election_dies_stops_loudly(kube: KubeDouble) -> None:
    """The leader election ended while the watcher was to run on: run_watcher raises (the
    process exits 1 and is restarted) instead of returning as if stopped, which left a
    replica, or `serve --watch`'s webhook, running without a watcher."""
    s = settings(leader_election=True, renew_seconds=0.1)
    api = StrayCancelApi(kube.api_client("stray"))
    try:
        with pytest.raises(WatcherStopped, match="leader election was cancelled"):
            await asyncio.wait_for(run_watcher(s, asyncio.Event(), api=api), BOUND)
    finally:
        await api.close()


async def test_the_holder_renews_with_one_put_and_reads_a_lease_changed_under_it(kube: KubeDouble) -> None:
    """client-go's optimistic renewal: the holder PUTs the Lease its last write returned, no
    GET before each; a Lease someone else wrote meanwhile (the PUT's 409) is read again and,
    held by another, not taken."""
    from webhook.watcher._leader import LeaderElector

    kube.make_namespace(NS)
    api = kube.kube_api("elector")
    elector = LeaderElector(api, NS, "lease", "me", lease_seconds=3.0, retry_seconds=0.1)
    calls = lambda method: [r for r in kube.requests if r.method == method and "/leases" in r.path]  # noqa: E731
    led, stop = asyncio.Event(), asyncio.Event()

    async def lead() -> None:
        led.set()
        await asyncio.Event().wait()
    runner = asyncio.ensure_future(elector.run(lead, stop))
    try:
        await asyncio.wait_for(led.wait(), BOUND)
        gets = len(calls("GET"))
        await eventually(lambda: len(calls("PUT")) >= 5, "five renewals")
        assert len(calls("GET")) == gets and all(r.status == 200 for r in calls("PUT"))
        lease = kube.get("leases", NS, "lease")
        lease["spec"].update(holderIdentity="someone-else", renewTime=now_rfc3339())
        kube.put("leases", lease)
        await eventually(lambda: len(calls("GET")) > gets, "the Lease read after a renewal's 409")
        assert any(r.status == 409 for r in calls("PUT"))
        await asyncio.sleep(0.5)
        assert kube.get("leases", NS, "lease")["spec"]["holderIdentity"] == "someone-else"
    finally:
        stop.set()
        await asyncio.wait_for(runner, BOUND)
        await api.close()


async def test_a_lease_namespace_that_does_not_exist_is_named_with_the_fix_once_a_minute(
        kube: KubeDouble, caplog: pytest.LogCaptureFixture) -> None:
    """`initshift watch` run by hand where initshift's namespace is not: the apiserver's 404 on
    the Lease's create (e2e `double-namespaces`) says what to do; the same warning comes again
    only a minute later, not at every retry; once the namespace exists, the Lease is taken."""
    from webhook.logs import REPEAT_SECONDS
    from webhook.watcher._leader import LeaderElector

    clock = ManualClock()
    api = kube.kube_api("elector")
    elector = LeaderElector(api, "typo", "lease", "me", lease_seconds=3.0, clock=clock.monotonic)
    warnings = lambda: [r.getMessage() for r in caplog.records if r.name == "initshift.leader"]  # noqa: E731
    try:
        with caplog.at_level("WARNING", logger="initshift.leader"):
            for _ in range(3):
                assert not await elector.try_acquire_or_renew()
                clock.advance(1.0)
            assert warnings() == ['lease typo/lease: 404 NotFound: namespaces "typo" not found: the Lease is kept in '
                                  "initshift's namespace (INITSHIFT_NAMESPACE): create it or name the right one, or "
                                  "run one watcher alone without a Lease (--no-leader-election, "
                                  "INITSHIFT_LEADER_ELECTION=false)"]
            clock.advance(REPEAT_SECONDS)
            assert not await elector.try_acquire_or_renew()
            assert len(warnings()) == 2
            kube.make_namespace("typo")
            assert await elector.try_acquire_or_renew()
            assert kube.get("leases", "typo", "lease")["spec"]["holderIdentity"] == "me"
    finally:
        await api.close()


async def test_a_watched_namespace_that_does_not_exist_is_named_once(kube: KubeDouble,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """INITSHIFT_WATCH_NAMESPACES (or -n) naming a namespace that does not exist watches
    nothing there until it is made, which the watcher says at start-up, once per such name;
    one that cannot list namespaces (a user's own RBAC) says nothing."""
    from webhook.watcher._controller import _say_missing_namespaces

    kube.put_pod(build_pod("b1"))  # its namespace, NS, exists
    said = lambda: [r.getMessage() for r in caplog.records if r.name == "initshift.watcher"]  # noqa: E731
    with caplog.at_level("WARNING", logger="initshift.watcher"):
        async with watcher(kube, settings(namespaces=(NS, "buils"))) as c:
            await eventually(lambda: said(), "the warning")
            await settled(kube, c)
        assert said() == ['watched namespace "buils" does not exist: its pods are seen once it is made '
                          "(INITSHIFT_WATCH_NAMESPACES, or initshift watch -n)"]
        caplog.clear()
        api = kube.kube_api("no-namespaces")
        try:
            kube.fail_next("/api/v1/namespaces", 403, method="GET")
            await _say_missing_namespaces(api, ("buils",))
        finally:
            await api.close()
        assert said() == []


async def test_start_order_pods_get_per_container_ready_annotations(kube: KubeDouble) -> None:
    key = f"{p.ANNOTATION_READY_PREFIX}cache"
    kube.put_pod({"metadata": {"name": "app", "namespace": NS, "labels": {p.LABEL_MANAGED: p.MANAGED_START_ORDER},
                               "annotations": {p.ANNOTATION_START_ORDER: "cache;app"}},
                  "spec": {"containers": [{"name": "cache", "image": "redis"}, {"name": "app", "image": "app"}],
                           "volumes": [{"name": p.CONTAINER_READY_VOLUME, "downwardAPI": {"items": [
                               {"path": "cache", "fieldRef": {"fieldPath": f"metadata.annotations['{key}']"}}]}}]}})
    async with watcher(kube, settings()):
        kube.set_container_statuses(NS, "app", [running("cache", ready=False), running("app", ready=False)],
                                    phase="Running")
        await eventually(lambda: annotation(kube, "app", key) == "false", "ready-cache=false")
        kube.set_container_statuses(NS, "app", [running("cache")])
        await eventually(lambda: annotation(kube, "app", key) == "true", "ready-cache=true")
        kube.set_container_statuses(NS, "app", [running("cache", ready=False)])  # a restart: not ready again
        await eventually(lambda: annotation(kube, "app", key) == "false", "ready-cache=false again")
    assert kube.events_for(NS, "app") == []
    assert annotation(kube, "app", p.ANNOTATION_OUTCOME) is None


# --- the write budget, and the order of writes under a slow apiserver -----------------------------
def finish_statuses(proxy_quits: bool, at: str | None = None) -> list[dict]:
    done = [step_done(n, at=at) for n in ("fetch", "build", "completion")]
    return done + [terminated("istio-proxy", 0) if proxy_quits else running("istio-proxy")]


async def test_write_budget_per_pod(kube: KubeDouble) -> None:
    """A pod whose gate is a loopback probe costs two writes (the outcome's patch, with the
    deadline in it when the proxy keeps running, and the outcome's Event); one whose gate is
    the ready annotation one more (the annotation). Nothing else: no GET, no second patch."""
    kinds = {"probe-quit": (True, True), "probe-kept": (True, False), "gate-quit": (False, True),
             "gate-kept": (False, False)}
    for name, (probed, _) in kinds.items():
        kube.put_pod(build_pod(name, probed=probed))
    async with watcher(kube, settings(grace_seconds=0.0)) as c:
        for name in kinds:
            kube.set_container_statuses(NS, name, [running("istio-proxy"), running("fetch"), running("build"),
                                                   running("completion")], phase="Running")
        await eventually(lambda: all(annotation(kube, n, p.ANNOTATION_READY) for n in kinds if n.startswith("gate")),
                         "the gates that read the annotation")
        for name, (_, quits) in kinds.items():
            kube.set_container_statuses(NS, name, finish_statuses(quits), phase="Succeeded" if quits else None)
        await eventually(lambda: all(kube.events_for(NS, n) for n in kinds), "every Event")
        await settled(kube, c)
    for name, (probed, quits) in kinds.items():
        writes = [("event" if r.path.endswith("/events") else "patch") for r in watcher_writes(kube, name)]
        assert writes == ([] if probed else ["patch"]) + ["patch", "event"], (name, writes)
        assert (kube.pod(NS, name)["spec"].get("activeDeadlineSeconds") == 1) is not quits
    assert [r for r in kube.requests if r.method == "GET" and "/pods/" in r.path] == []


async def test_a_slow_apiserver_serves_what_ends_pods_and_opens_gates_first(kube: KubeDouble) -> None:
    """Twelve writes due at once, two workers, every write 100 ms: the six that end a pod
    (outcome and deadline) or open a gate (the ready annotation) go before the six outcomes
    of pods whose proxy has quit, although those came first; and no Event before any write."""
    records = [f"a-record-{i}" for i in range(6)]  # listed first: a FIFO queue would serve them first
    ends, gates = [f"b-end-{i}" for i in range(3)], [f"c-gate-{i}" for i in range(3)]
    for name in records + ends:
        kube.put_pod(build_pod(name, probed=True))
        kube.set_container_statuses(NS, name, finish_statuses(name in records),
                                    phase="Succeeded" if name in records else "Running")
    for name in gates:
        kube.put_pod(build_pod(name))
        kube.set_container_statuses(NS, name, [running("istio-proxy"), running("fetch")], phase="Running")
    kube.write_latency = (0.1, 0.1)
    async with watcher(kube, settings(grace_seconds=0.0, concurrency=2)) as c:
        await eventually(lambda: all(kube.events_for(NS, n) for n in records + ends), "every Event")
        await settled(kube, c)
    patches = [r for r in kube.patches() if r.method == "PATCH"]
    order = [r.path.rsplit("/", 1)[1] for r in sorted(patches, key=lambda r: r.started)]
    assert sorted(order[:6]) == sorted(ends + gates) and sorted(order[6:]) == records, order
    events = [r for r in kube.requests if r.method == "POST" and r.path.endswith("/events")]
    assert len(events) == 9 and min(e.started for e in events) > max(r.started for r in patches)
