"""The watch loop against the in-process API double: a build pod from Pending to done."""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator, Callable


from tests.support.kubedouble import KubeDouble, now_rfc3339, running, terminated, waiting
from waiter import protocol as p
from webhook.metrics import REGISTRY
from webhook.settings import Settings, WatcherSettings
from webhook.watcher._controller import event_name, run_watcher

NS = "ci"
BOUND = 20.0  # no single wait in these tests may take longer: a bug fails instead of hanging


def settings(**watcher: object) -> Settings:
    base = dict(grace_seconds=0.5, sidecar_ready_timeout_seconds=60.0, leader_election=False, lease_seconds=1.5,
                renew_seconds=0.3, renew_deadline_seconds=1.0, takeover_seconds=0.4, request_timeout_seconds=2.0)
    base.update(watcher)
    return Settings(watcher=WatcherSettings(**base))  # type: ignore[arg-type]


def build_pod(name: str, namespace: str = NS, *, sidecars: tuple[str, ...] = ("istio-proxy",)) -> dict:
    """A pod as the webhook writes it: two steps, one main, the proxy."""
    cmd = [p.WAITER_PATH, p.CMD_RUN]
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": {p.LABEL_MANAGED: p.MODE_WAITER},
                     "annotations": {p.ANNOTATION_STEPS: json.dumps(["fetch", "build"]),
                                     p.ANNOTATION_MAINS: json.dumps(["completion"])}},
        "spec": {"restartPolicy": "Never",
                 "initContainers": [{"name": p.INIT_CONTAINER_NAME, "image": "initshift"}],
                 "containers": [{"name": n, "image": "tool", "command": cmd} for n in ("fetch", "build", "completion")]
                 + [{"name": s, "image": "proxy"} for s in sidecars]},
    }


def record(name: str, code: int = 0, reason: str = p.REASON_COMPLETED) -> str:
    now = now_rfc3339()
    return json.dumps({"name": name, "exitCode": code, "reason": reason, "startedAt": now, "finishedAt": now,
                       "message": ""})


def step_done(name: str, code: int = 0, reason: str = p.REASON_COMPLETED) -> dict:
    return terminated(name, code, message=record(name, code, reason))


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


@asynccontextmanager
async def watcher(kube: KubeDouble, s: Settings, *, user_agent: str = "watcher-a",
                  identity: str | None = None) -> AsyncIterator[asyncio.Task]:
    stop = asyncio.Event()
    api = kube.kube_api(user_agent)
    task = asyncio.ensure_future(run_watcher(s, stop, api=api, identity=identity or user_agent))
    try:
        yield task
    finally:
        stop.set()
        try:
            await asyncio.wait_for(task, BOUND)
        finally:
            await api.close()


async def walk_to_steps_done(kube: KubeDouble, name: str) -> None:
    """Pending -> sidecar Ready (gate opens) -> fetch -> build -> completion."""
    kube.set_container_statuses(NS, name, [waiting("istio-proxy"), waiting("fetch"), waiting("build"),
                                           waiting("completion")], phase="Pending")
    await asyncio.sleep(0.1)
    assert annotation(kube, name, p.ANNOTATION_READY) is None  # sidecar not Ready: the gate stays shut
    kube.set_container_statuses(NS, name, [running("istio-proxy", ready=False), running("fetch", ready=False),
                                           running("build"), running("completion")], phase="Running")
    await asyncio.sleep(0.1)
    assert annotation(kube, name, p.ANNOTATION_READY) is None
    kube.set_container_statuses(NS, name, [running("istio-proxy")])
    await eventually(lambda: annotation(kube, name, p.ANNOTATION_READY) == p.READY_TRUE, "the ready gate")
    kube.set_container_statuses(NS, name, [step_done("fetch")])
    kube.set_container_statuses(NS, name, [step_done("build")])
    kube.set_container_statuses(NS, name, [step_done("completion")])


async def test_build_walks_from_pending_to_outcome_and_deadline(kube: KubeDouble) -> None:
    kube.put_pod(build_pod("b1"))
    before = REGISTRY.get_sample_value("initshift_watcher_deadline_terminations_total") or 0.0
    async with watcher(kube, settings()):
        await walk_to_steps_done(kube, "b1")
        # The proxy ignores the quit: after the grace period the outcome, then the deadline.
        await eventually(lambda: kube.pod(NS, "b1")["spec"].get("activeDeadlineSeconds") == 1, "the deadline")
        got = outcome(kube, "b1")
        assert got["result"] == "Succeeded" and got["failed"] is None
        assert got["sidecarsStoppedBy"] == "deadline"
        assert [s["name"] for s in got["steps"]] == ["fetch", "build"]
        assert [m["name"] for m in got["mains"]] == ["completion"]
        assert all(s["exitCode"] == 0 and s["reason"] == "Completed" for s in got["steps"] + got["mains"])
        patches = kube.patches(NS, "b1")
        o, d = patches.index(outcome_patches(kube, "b1")[0]), patches.index(deadline_patches(kube, "b1")[0])
        assert o < d  # outcome written first
        assert all(r.content_type == "application/merge-patch+json" for r in patches)
        kube.kill_pod(NS, "b1")  # the kubelet ends it
        await eventually(lambda: len(kube.events_for(NS, "b1")) >= 3, "three events")
        await asyncio.sleep(0.3)
        assert len(outcome_patches(kube, "b1")) == 1 and len(deadline_patches(kube, "b1")) == 1
    reasons = [e["reason"] for e in kube.events_for(NS, "b1")]
    assert reasons == ["SidecarsReady", "StepsSucceeded", "SidecarsEnded"]
    ready_event = kube.events_for(NS, "b1")[0]
    assert ready_event["involvedObject"]["name"] == "b1" and "Ready after" in ready_event["message"]
    assert ready_event["type"] == "Normal" and kube.events_for(NS, "b1")[2]["type"] == "Warning"
    assert REGISTRY.get_sample_value("initshift_watcher_deadline_terminations_total") == before + 1
    assert REGISTRY.get_sample_value("initshift_watcher_outcomes_total",
                                     {"result": "Succeeded", "sidecars_stopped_by": "deadline"}) >= 1


async def test_sidecars_that_quit_need_no_deadline(kube: KubeDouble) -> None:
    kube.put_pod(build_pod("b2"))
    async with watcher(kube, settings(grace_seconds=5.0)):
        await walk_to_steps_done(kube, "b2")
        kube.set_container_statuses(NS, "b2", [terminated("istio-proxy", 0)], phase="Succeeded")
        got = await eventually(lambda: outcome(kube, "b2"), "the outcome")
        assert got["result"] == "Succeeded" and got["sidecarsStoppedBy"] == "quit"
        await eventually(lambda: len(kube.events_for(NS, "b2")) >= 2, "two events")
        await asyncio.sleep(0.3)
    assert deadline_patches(kube, "b2") == []
    assert [e["reason"] for e in kube.events_for(NS, "b2")] == ["SidecarsReady", "StepsSucceeded"]


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
    kube.fail_next(f"/api/v1/namespaces/{NS}/events", 500, times=1)  # a lost Event never blocks the work
    async with watcher(kube, settings()):
        kube.set_container_statuses(NS, "b5", [running("istio-proxy"), step_done("fetch"), step_done("build"),
                                               step_done("completion")], phase="Running")
        await eventually(lambda: kube.pod(NS, "b5")["spec"].get("activeDeadlineSeconds") == 1, "the deadline")
    assert outcome(kube, "b5")["sidecarsStoppedBy"] == "deadline"
    statuses = [r.status for r in kube.patches(NS, "b5")]
    assert statuses.count(409) == 2 and statuses.count(200) >= 2
    assert len([r for r in outcome_patches(kube, "b5") if r.status == 200]) == 1


async def test_stale_outcome_patch_is_refused_and_not_rewritten(kube: KubeDouble) -> None:
    """Another replica wrote the outcome first: the conditional patch gets 409, the watcher
    re-reads the pod and leaves that outcome alone."""
    pod = build_pod("b6")
    pod["metadata"]["annotations"][p.ANNOTATION_READY] = p.READY_TRUE
    kube.put_pod(pod)
    kube.set_container_statuses(NS, "b6", [step_done("fetch"), step_done("build"), step_done("completion"),
                                           terminated("istio-proxy", 0)], phase="Succeeded")
    theirs = json.dumps({"result": "Succeeded", "sidecarsStoppedBy": "quit", "by": "other-replica"})
    kube.delay(f"/api/v1/namespaces/{NS}/pods/b6", 0.3, times=1, method="PATCH")
    async with watcher(kube, settings()):
        await eventually(lambda: kube.patches(NS, "b6"), "a patch attempt")
        # While the watcher's patch is in flight, the other replica's lands first.
        current = kube.pod(NS, "b6")
        current["metadata"]["annotations"][p.ANNOTATION_OUTCOME] = theirs
        kube.put_pod(current)
        await eventually(lambda: any(r.status == 409 for r in kube.patches(NS, "b6")), "the conflict")
        await asyncio.sleep(0.3)
    assert annotation(kube, "b6", p.ANNOTATION_OUTCOME) == theirs


async def test_oomkilled_step_fails_and_ends_the_pod(kube: KubeDouble) -> None:
    kube.put_pod(build_pod("b7"))
    async with watcher(kube, settings(grace_seconds=30.0)):
        kube.set_container_statuses(NS, "b7", [running("istio-proxy"), running("fetch"), running("build"),
                                               running("completion")], phase="Running")
        await eventually(lambda: annotation(kube, "b7", p.ANNOTATION_READY), "the ready gate")
        kube.set_container_statuses(NS, "b7", [terminated("fetch", 137, "OOMKilled")])
        await eventually(lambda: kube.pod(NS, "b7")["spec"].get("activeDeadlineSeconds") == 1, "the deadline")
        await eventually(lambda: len(kube.events_for(NS, "b7")) >= 3, "three events")
    got = outcome(kube, "b7")
    assert got["result"] == "Failed" and got["failed"] == "fetch" and "OOMKilled" in got["message"]
    assert [s["reason"] for s in got["steps"]] == ["OOMKilled", "NotRun"]
    assert [e["reason"] for e in kube.events_for(NS, "b7")] == ["SidecarsReady", "StepsFailed", "SidecarsEnded"]


async def test_sidecar_never_ready_times_out(kube: KubeDouble) -> None:
    kube.put_pod(build_pod("b8"))
    async with watcher(kube, settings(sidecar_ready_timeout_seconds=1.0)):
        kube.set_container_statuses(NS, "b8", [running("istio-proxy", ready=False), running("fetch")],
                                    phase="Running")
        # No further event arrives: the watcher's own timer must fire.
        await eventually(lambda: kube.pod(NS, "b8")["spec"].get("activeDeadlineSeconds") == 1, "the deadline")
    got = outcome(kube, "b8")
    assert got["result"] == "Failed" and got["failed"] == "istio-proxy" and "not Ready" in got["message"]
    assert annotation(kube, "b8", p.ANNOTATION_READY) is None


async def test_only_configured_namespaces_and_managed_pods(kube: KubeDouble) -> None:
    kube.put_pod(build_pod("in-scope", "team-a", sidecars=()))
    kube.put_pod(build_pod("other-ns", "team-b", sidecars=()))
    unmanaged = build_pod("unmanaged", "team-a", sidecars=())
    unmanaged["metadata"]["labels"] = {}
    kube.put_pod(unmanaged)
    async with watcher(kube, settings(namespaces=("team-a",))):
        await eventually(lambda: annotation(kube, "in-scope", p.ANNOTATION_READY, "team-a"), "the gate (no sidecars)")
        await asyncio.sleep(0.3)
    assert annotation(kube, "other-ns", p.ANNOTATION_READY, "team-b") is None
    assert annotation(kube, "unmanaged", p.ANNOTATION_READY, "team-a") is None


async def test_two_watchers_one_lease_never_both_act(kube: KubeDouble) -> None:
    s = settings(leader_election=True, lease_seconds=1.5)
    lease = lambda: kube.get("leases", s.server.namespace, s.watcher.lease_name)  # noqa: E731
    kube.put_pod(build_pod("c1"))
    async with watcher(kube, s, user_agent="replica-a"):
        await eventually(lease, "the lease")
        async with watcher(kube, s, user_agent="replica-b"):
            await walk_to_steps_done(kube, "c1")
            await eventually(lambda: outcome(kube, "c1"), "the outcome")
            await eventually(lambda: kube.pod(NS, "c1")["spec"].get("activeDeadlineSeconds") == 1, "the deadline")
            await asyncio.sleep(1.0)  # several renewals: the follower must stay passive
            agents = {r.user_agent for r in kube.patches()}
            assert agents == {"replica-a"}
            assert lease()["spec"]["holderIdentity"] == "replica-a"
            instances = {e["reportingInstance"] for e in kube.events_for(NS, "c1")}
            assert instances == {"replica-a"}
        # (the follower stopped; the leader still acts alone)
    # The leader released the Lease when it stopped.
    assert lease()["spec"]["holderIdentity"] == ""


async def test_follower_takes_over_when_the_leader_stops(kube: KubeDouble) -> None:
    s = settings(leader_election=True, lease_seconds=1.5)
    kube.put_pod(build_pod("c2", sidecars=()))
    async with watcher(kube, s, user_agent="replica-b"):
        async with watcher(kube, s, user_agent="replica-a"):
            await eventually(lambda: annotation(kube, "c2", p.ANNOTATION_READY), "the gate from the first leader")
            first = kube.get("leases", s.server.namespace, s.watcher.lease_name)["spec"]["holderIdentity"]
        # One replica stopped; whichever remains must hold the lease and do the rest.
        kube.set_container_statuses(NS, "c2", [step_done("fetch"), step_done("build"), step_done("completion")],
                                    phase="Succeeded")
        await eventually(lambda: outcome(kube, "c2"), "the outcome from the remaining replica")
        holder = kube.get("leases", s.server.namespace, s.watcher.lease_name)["spec"]["holderIdentity"]
        assert holder == "replica-b"
    outcome_agents = {r.user_agent for r in outcome_patches(kube, "c2") if r.status == 200}
    assert outcome_agents == {"replica-b"}
    assert first in ("replica-a", "replica-b")


async def test_a_follower_leaves_work_to_a_live_holder_and_takes_over_what_it_leaves(kube: KubeDouble) -> None:
    """Another identity holds a fresh Lease and does the work (patch and Event): this replica
    never writes. Work that holder leaves undone is done by this replica, but only once it
    has been due for INITSHIFT_WATCHER_TAKEOVER_SECONDS."""
    s = settings(leader_election=True, lease_seconds=1.5, takeover_seconds=0.8)
    kube.put("leases", {"metadata": {"name": s.watcher.lease_name, "namespace": s.server.namespace},
                        "spec": {"holderIdentity": "someone-else", "leaseDurationSeconds": 60,
                                 "renewTime": now_rfc3339()}})
    kube.put_pod(build_pod("c3", sidecars=()))

    async def live_holder() -> None:  # renews, and opens c3's gate (with its Event) as the watcher would
        while True:
            lease = kube.get("leases", s.server.namespace, s.watcher.lease_name)
            lease["spec"]["renewTime"] = now_rfc3339()
            kube.put("leases", lease)
            pod = kube.pod(NS, "c3")
            if annotation(kube, "c3", p.ANNOTATION_READY) is None:
                pod["metadata"]["annotations"][p.ANNOTATION_READY] = p.READY_TRUE
                kube.put_pod(pod)
                uid = pod["metadata"]["uid"]
                kube.put("events", {"metadata": {"name": event_name("c3", uid, "ready"), "namespace": NS},
                                    "involvedObject": {"kind": "Pod", "namespace": NS, "name": "c3", "uid": uid},
                                    "reason": "SidecarsReady", "action": "ready",
                                    "source": {"component": "initshift-watcher"}})
            await asyncio.sleep(0.1)
    holder = asyncio.ensure_future(live_holder())
    try:
        async with watcher(kube, s, user_agent="replica-c"):
            await asyncio.sleep(1.5)  # more than the takeover delay
            assert kube.patches() == [] and len(kube.events_for(NS, "c3")) == 1
            kube.put_pod(build_pod("c4", sidecars=()))  # the holder leaves this one alone
            put_at = time.monotonic()
            await eventually(lambda: annotation(kube, "c4", p.ANNOTATION_READY), "the follower takes over")
            await eventually(lambda: kube.events_for(NS, "c4"), "the follower's Event")
    finally:
        holder.cancel()
    patches = kube.patches()
    assert [r.path.rsplit("/", 1)[1] for r in patches] == ["c4"] and patches[0].started - put_at >= 0.8
    assert kube.get("leases", s.server.namespace, s.watcher.lease_name)["spec"]["holderIdentity"] == "someone-else"
    assert [e["reason"] for e in kube.events_for(NS, "c3")] == ["SidecarsReady"]


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
