"""Two and three watcher replicas on the API double, through failures: the leader killed
without warning mid-build, network blips, a 410 on resume, the apiserver gone. Every pod gets
exactly one outcome and every Event is sent once; a silent death costs about
`takeover_seconds` of standstill, not a Lease duration.

Durations are scaled down ~6x from the production defaults (renew every 2 s, give up after
10 s, take over after 1.5 s): renew 0.3 s, deadline 1.6 s, takeover 0.4 s; blips of 0.5 s
and 1.3 s stand for 3 s and 8 s, an outage of 3.2 s for 20 s.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from contextlib import asynccontextmanager
from typing import AsyncIterator

import pytest

from tests.support.kubedouble import KubeDouble, running, terminated
from tests.watcher.test_watcher import BOUND, NS, build_pod, eventually, outcome, settings, settled, step_done
from waiter import protocol as p
from webhook.settings import Settings
from webhook.watcher import Controller, run_watcher

TAKEOVER = 0.4


def replica_settings(**watcher: object) -> Settings:
    base: dict = dict(leader_election=True, lease_seconds=30.0, renew_seconds=0.3, renew_deadline_seconds=1.6,
                      takeover_seconds=TAKEOVER, request_timeout_seconds=1.0, grace_seconds=0.3)
    base.update(watcher)
    return settings(**base)


class Fleet:
    """Watcher replicas `r0`, `r1`, ... (identity = user agent), each with its own client."""

    def __init__(self, kube: KubeDouble, s: Settings) -> None:
        self.kube, self.s = kube, s
        self.replicas: dict[str, tuple[asyncio.Event, asyncio.Task, object]] = {}
        self.controllers: dict[str, Controller] = {}

    def start(self, name: str) -> None:
        stop, api = asyncio.Event(), self.kube.kube_api(name)
        self.controllers[name] = c = Controller(api, self.s, name)
        self.replicas[name] = (stop, asyncio.ensure_future(run_watcher(self.s, stop, controller=c)), api)

    async def settled(self) -> None:
        """Every live replica has processed every change and has nothing left in hand."""
        await settled(self.kube, *self.controllers.values())

    def holder(self) -> str | None:
        lease = self.kube.get("leases", self.s.server.namespace, self.s.watcher.lease_name)
        return (lease or {}).get("spec", {}).get("holderIdentity") or None

    def lease(self) -> dict:
        return self.kube.get("leases", self.s.server.namespace, self.s.watcher.lease_name) or {}

    async def kill(self, name: str) -> None:
        """SIGKILL: from now on nothing this replica sends reaches the apiserver (what it
        already sent still lands), and it never releases the Lease."""
        self.kube.silence(name)
        stop, task, api = self.replicas.pop(name)
        del self.controllers[name]
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()  # type: ignore[attr-defined]

    async def stop_all(self) -> None:
        for stop, _, _ in self.replicas.values():
            stop.set()
        for name, (_, task, api) in list(self.replicas.items()):
            await asyncio.wait_for(task, BOUND)
            await api.close()  # type: ignore[attr-defined]
        self.replicas.clear()
        self.controllers.clear()


@asynccontextmanager
async def fleet(kube: KubeDouble, n: int, s: Settings | None = None) -> AsyncIterator[Fleet]:
    f = Fleet(kube, s or replica_settings())
    for i in range(n):
        f.start(f"r{i}")
    try:
        if f.s.watcher.leader_election:
            await eventually(f.holder, "a leader")
        yield f
    finally:
        await f.stop_all()


# --- driving pods as the kubelet would ---------------------------------------------------------
def start(kube: KubeDouble, name: str) -> None:
    kube.set_container_statuses(NS, name, [running("istio-proxy"), running("fetch"), running("build"),
                                           running("completion")], phase="Running")


def finish(kube: KubeDouble, name: str, *, quit: bool) -> None:
    """Every step and main done; the proxy quits (half the builds) or keeps running."""
    done = [step_done("fetch"), step_done("build"), step_done("completion")]
    if quit:
        kube.set_container_statuses(NS, name, done + [terminated("istio-proxy", 0)], phase="Succeeded")
    else:
        kube.set_container_statuses(NS, name, done)


def ready(kube: KubeDouble, name: str) -> bool:
    pod = kube.get("pods", NS, name) or {}
    return (pod.get("metadata", {}).get("annotations") or {}).get(p.ANNOTATION_READY) == p.READY_TRUE


def ended(kube: KubeDouble, name: str) -> bool:
    """The outcome is written and, for a proxy that kept running, the deadline set."""
    got = outcome(kube, name)
    if not got:
        return False
    return got["sidecarsStoppedBy"] == "quit" or kube.pod(NS, name)["spec"].get("activeDeadlineSeconds") == 1


def assert_exactly_once(kube: KubeDouble, names: list[str]) -> None:
    """One outcome written per pod (one successful outcome PATCH), each Event once."""
    for name in names:
        got = outcome(kube, name)
        assert got and got["result"] == "Succeeded", (name, got)
        written = [r for r in kube.patches(NS, name)
                   if r.status == 200 and p.ANNOTATION_OUTCOME in json.dumps(r.body)]
        assert len(written) == 1, (name, [r.user_agent for r in written])
        reasons = Counter(e["reason"] for e in kube.events_for(NS, name))
        assert reasons == {"StepsSucceeded": 1}, (name, reasons)  # the outcome's, which tells the deadline too
    created = Counter((r.body["involvedObject"]["name"], r.body["action"]) for r in kube.requests
                      if r.method == "POST" and r.path.endswith("/events") and r.status == 201)
    assert set(created.values()) == {1}, created


async def no_duplicate_can_come(f: Fleet) -> None:
    """Past the takeover delay (a follower acts on what has been due that long), and every
    replica has processed all it saw: a duplicate write would have been made by now."""
    await f.settled()
    await asyncio.sleep(TAKEOVER * 3)
    await f.settled()


async def build_through(kube: KubeDouble, f: Fleet, names: list[str], trouble, *,
                        finish_during: bool = True) -> None:
    """Pods started and gated, then `trouble()`; they finish during or after it."""
    for name in names:
        kube.put_pod(build_pod(name))
        start(kube, name)
    await eventually(lambda: all(ready(kube, n) for n in names), "every gate open")
    task = asyncio.ensure_future(trouble())
    if finish_during:
        await asyncio.sleep(0.05)
    else:
        await task
    for i, name in enumerate(names):
        finish(kube, name, quit=i % 2 == 0)
    await task
    await eventually(lambda: all(ended(kube, n) for n in names), "every build ended", timeout=BOUND)
    await no_duplicate_can_come(f)


# --- the scenarios ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("replicas", [2, 3])
async def test_leader_killed_mid_build_costs_about_the_takeover_delay(kube: KubeDouble, replicas: int) -> None:
    names = [f"k{i}" for i in range(6)]
    async with fleet(kube, replicas) as f:
        for name in names:
            kube.put_pod(build_pod(name))
            start(kube, name)
        await eventually(lambda: all(ready(kube, n) for n in names), "every gate open")
        leader = f.holder()
        # The leader's Events never arrive, then it dies: its patches landed, its Events did not.
        kube.silence(leader, "POST")
        finish(kube, "k0", quit=True)
        await eventually(lambda: outcome(kube, "k0"), "the leader's last outcome")
        await f.kill(leader)
        killed_at = time.monotonic()
        for i, name in enumerate(names[1:], 1):
            finish(kube, name, quit=i % 2 == 0)
        await eventually(lambda: all(ended(kube, n) for n in names), "every build ended by the survivors")
        standstill = time.monotonic() - killed_at
        await no_duplicate_can_come(f)
        # The Lease (30 s) still names the dead leader: the survivors did not wait for it.
        assert f.holder() == leader
    assert_exactly_once(kube, names)
    survivors = {r.user_agent for r in kube.patches() if r.status == 200 and r.started > killed_at}
    assert survivors and leader not in survivors
    assert {e["reportingInstance"] for e in kube.events_for(NS, "k0")} - {leader}  # its lost Event was sent
    # Bounded as designed: the takeover delay plus the work, far below the 30 s Lease.
    assert standstill < TAKEOVER + 5.0, standstill


@pytest.mark.parametrize("seconds", [0.5, 1.3])
async def test_network_blips_lose_nothing_and_a_short_one_keeps_the_leader(kube: KubeDouble, seconds: float) -> None:
    names = [f"b{i}" for i in range(6)]
    async with fleet(kube, 3) as f:
        leader, transitions = f.holder(), f.lease()["spec"].get("leaseTransitions", 0)
        await build_through(kube, f, names, lambda: blip(kube, seconds))
        if seconds + 0.3 < 1.6:  # blip + one renew period within the renew deadline: the holder renewed through it
            assert f.holder() == leader and f.lease()["spec"].get("leaseTransitions", 0) == transitions
    assert_exactly_once(kube, names)


async def blip(kube: KubeDouble, seconds: float) -> None:
    kube.outage(seconds, blip=True)
    await asyncio.sleep(seconds)


async def test_a_410_on_resume_relists_once_and_loses_nothing(kube: KubeDouble) -> None:
    names = [f"g{i}" for i in range(4)]

    async def expire() -> None:  # history compacted while the watches are down: resuming gets 410 Gone
        kube.put("configmaps", {"metadata": {"name": "unwatched", "namespace": NS}})  # past what they saw
        kube.compact()
        kube.drop_watches()
    async with fleet(kube, 2) as f:
        lists = lambda: [r for r in kube.requests if r.path == "/api/v1/pods" and "watch" not in r.query]  # noqa: E731
        assert len(lists()) == 2  # one initial list per replica
        await build_through(kube, f, names, expire)
        assert len(lists()) == 4  # one re-list each, on the 410
    assert_exactly_once(kube, names)


@pytest.mark.parametrize("replicas", [2, 3])
async def test_the_apiserver_gone_for_a_while(kube: KubeDouble, replicas: int) -> None:
    names = [f"o{i}" for i in range(6)]

    async def gone() -> None:
        kube.outage(3.2)
        await asyncio.sleep(3.2)
    async with fleet(kube, replicas) as f:
        await build_through(kube, f, names, gone)
        await eventually(f.holder, "a leader again")
    assert_exactly_once(kube, names)


async def test_bookmarks_keep_the_resume_point_fresh(kube: KubeDouble) -> None:
    """Between changes of its own pods, a watch still advances its resourceVersion through
    bookmarks: after the other objects' churn is compacted away, it resumes without a re-list.
    The Events' watch gets no bookmarks (no watch cache for Events): it gets 410 and resumes
    from now, without reading every Event again."""
    kube.bookmark_seconds = 0.2
    kube.put_pod(build_pod("m0"))
    async with fleet(kube, 1, replica_settings(leader_election=False)) as f:
        await eventually(lambda: kube.open_watches >= 2, "the watches")
        for i in range(20):  # churn the watch does not see (not a managed pod)
            kube.put("configmaps", {"metadata": {"name": f"c{i}", "namespace": NS}})
        pods = [i for c in f.controllers.values() for i in c.informers if i.plural == "pods"]
        await eventually(lambda: all(int(i.resource_version) >= kube.resource_version for i in pods), "a bookmark")
        (events,) = [i for c in f.controllers.values() for i in c.informers if i.plural == "events"]
        assert int(events.resource_version) < kube.resource_version  # no bookmark moved it
        kube.compact()
        compacted = kube.resource_version
        kube.drop_watches()
        start(kube, "m0")
        await eventually(lambda: ready(kube, "m0"), "the gate after the resume")
        await eventually(lambda: int(events.resource_version) >= compacted, "the Events' watch resumed from now")
    watches = [r for r in kube.requests if r.path == "/api/v1/pods" and r.query.get("watch") == "true"]
    assert all(r.query.get("allowWatchBookmarks") == "true" for r in watches)
    assert len([r for r in kube.requests if r.path == "/api/v1/pods" and "watch" not in r.query]) == 1
    lists = [r.query for r in kube.requests if r.path == "/api/v1/events" and "watch" not in r.query]
    assert [q.get("fieldSelector") for q in lists] == ["source=initshift-watcher", None], lists
    assert lists[1].get("limit") == "1"


async def test_finished_pods_leave_the_store(kube: KubeDouble) -> None:
    """Only pods in flight are kept, and only what the decisions read; a finished pod's later
    changes (the kubelet ending it) are ignored; its deletion forgets it."""
    from tests.watcher.test_watcher import settled
    from webhook.watcher._controller import Controller

    s = replica_settings(leader_election=False)
    api = kube.kube_api("solo")
    c = Controller(api, s, "solo")
    task = asyncio.ensure_future(c.run())
    try:
        big = build_pod("f0")
        big["spec"]["containers"][0]["env"] = [{"name": "X", "value": "y" * 10000}]
        kube.put_pod(big)
        kube.put_pod(build_pod("f1"))
        await eventually(lambda: len(c.store) == 2, "both pods")
        slim = c.store.get((NS, "f0"))
        assert "env" not in json.dumps(slim) and len(json.dumps(slim)) < 2000
        for name in ("f0", "f1"):
            start(kube, name)
        await eventually(lambda: ready(kube, "f0") and ready(kube, "f1"), "the gates")
        finish(kube, "f0", quit=True)
        await eventually(lambda: (NS, "f0") not in c.store, "f0 dropped once done")
        assert (NS, "f1") in c.store and c.store.done == {(NS, "f0"): kube.pod(NS, "f0")["metadata"]["uid"]}
        assert kube.pod(NS, "f0")["metadata"]["uid"] not in c.recorder.sent, "nor what its Events were"
        await settled(kube, c)
        requests = len(kube.requests)
        kube.kill_pod(NS, "f0")  # a change of a finished pod: nothing to do, nothing kept
        await settled(kube, c)
        assert (NS, "f0") not in c.store and [r.path for r in kube.requests[requests:]
                                             if "watch" not in r.query] == []
        kube.delete("pods", NS, "f0")
        await eventually(lambda: (NS, "f0") not in c.store.done, "f0 forgotten when deleted")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()
