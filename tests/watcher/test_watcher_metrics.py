"""The watcher's operational series: reaction latency (watch event -> patch), managed pods
in flight by stage, and the oldest pod whose outcome is recorded but that still runs."""

from __future__ import annotations

import itertools
import json

from tests.support.kubedouble import KubeDouble, running
from tests.watcher.test_watcher import NS, annotation, build_pod, eventually, outcome, settings, step_done, watcher
from waiter import protocol as p
from webhook.metrics import REGISTRY
from webhook.watcher import _controller
from webhook.watcher._metrics import export_in_flight
from webhook.watcher._store import PodStore


def value(name: str, labels: dict | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


_NUMBERS = itertools.count()


def pod(phase: str, outcome_at: str | None = None, managed: str = p.MODE_WAITER) -> dict:
    n = next(_NUMBERS)
    meta: dict = {"name": f"p{n}", "namespace": NS, "uid": f"u{n}", "labels": {p.LABEL_MANAGED: managed},
                  "annotations": {}}
    if outcome_at:
        meta["annotations"][p.ANNOTATION_OUTCOME] = json.dumps({"result": "Succeeded", "decidedAt": outcome_at})
    return {"metadata": meta, "status": {"phase": phase}}


def test_in_flight_stages_from_the_pods():
    store = PodStore()
    for kept in [
        pod("Running"), pod("Pending"),  # steps
        pod("Running", "2026-01-01T00:00:10Z"),  # ending
        pod("Succeeded", "2026-01-01T00:00:01Z"), pod("Failed"),  # ended: not in flight
        pod("Running", managed=p.MANAGED_START_ORDER),  # long-running by design: not counted
    ]:
        store.observe("ADDED", kept)
    dropped = pod("Running", "2026-01-01T00:00:05Z")  # ending, dropped from the store: still counted
    store.drop(store.observe("ADDED", dropped))  # type: ignore[arg-type]
    export_in_flight(*store.in_flight())
    assert value("initshift_watcher_pods_in_flight", {"stage": "steps"}) == 2
    assert value("initshift_watcher_pods_in_flight", {"stage": "ending"}) == 2
    assert value("initshift_watcher_oldest_ending_timestamp_seconds") == 1767225605.0  # the older decidedAt
    export_in_flight(0, [])
    assert value("initshift_watcher_pods_in_flight", {"stage": "ending"}) == 0
    assert value("initshift_watcher_oldest_ending_timestamp_seconds") == 0


async def test_reaction_latency_and_in_flight_while_running(kube: KubeDouble, monkeypatch) -> None:
    monkeypatch.setattr(_controller, "_GAUGE_SECONDS", 0.05)
    count = "initshift_watcher_reaction_seconds_count"
    before = value(count)
    kube.put_pod(build_pod("m1"))
    async with watcher(kube, settings(grace_seconds=0.2)):
        kube.set_container_statuses(NS, "m1", [running("istio-proxy"), running("fetch")], phase="Running")
        await eventually(lambda: annotation(kube, "m1", p.ANNOTATION_READY), "the ready gate")
        await eventually(lambda: value(count) > before, "a reaction observed")
        assert value("initshift_watcher_leader") == 1  # no election: this replica acts
        await eventually(lambda: value("initshift_watcher_pods_in_flight", {"stage": "steps"}) == 1, "steps: 1")
        kube.set_container_statuses(NS, "m1", [step_done("fetch"), step_done("build"), step_done("completion")])
        await eventually(lambda: outcome(kube, "m1"), "the outcome")
        # the proxy keeps running: the pod is ending until the kubelet acts on the deadline
        await eventually(lambda: value("initshift_watcher_pods_in_flight", {"stage": "ending"}) == 1, "ending: 1")
        assert value("initshift_watcher_pods_in_flight", {"stage": "steps"}) == 0
        from webhook.watcher._podstate import parse_time

        decided = parse_time(outcome(kube, "m1")["decidedAt"]).timestamp()
        assert value("initshift_watcher_oldest_ending_timestamp_seconds") == decided
    # the leader stopped: its gauges say nothing any more
    assert value("initshift_watcher_pods_in_flight", {"stage": "steps"}) == 0
    assert value("initshift_watcher_leader") == 0
    assert value("initshift_watcher_reaction_seconds_sum") > 0
