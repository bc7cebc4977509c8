"""The watcher on a Job's pod (no init container) as the rewrite emits it, on the API double:
the gate opened once the proxy is Ready (by the watcher where the mains read the ready
annotation; by the mains' own loopback probes where the proxy has one), the outcome once
the mains have ended (the proxy quit, or the deadline when it ignores the quit), and under
OnFailure a failed main that the kubelet restarts is not an outcome."""

from __future__ import annotations

import copy

from tests.support.clock import ManualClock
from tests.support.fixtures import pods
from tests.support.kubedouble import KubeDouble, running, terminated, waiting
from tests.watcher.test_watcher import (NS, annotation, deadline_patches, eventually, outcome, outcome_patches,
                                        settings, settled, step_done, watcher)
from webhook.watcher import Controller, layout
from waiter import protocol as p
from webhook.rewrite import rewrite
from webhook.settings import Settings


def job_pod(name: str, fixture: str = "cronjob-istio", *, probed: bool = True) -> dict:
    """The catalogue's CronJob pod rewritten by the waiter strategy, named and placed in NS;
    not `probed`: its proxy has no readiness probe, so the mains read the ready annotation."""
    source = copy.deepcopy(pods.catalogue()[fixture])
    if not probed:
        for c in source["spec"]["containers"]:
            c.pop("readinessProbe", None)
    result = rewrite(source, Settings(feature_gate=True))
    assert result.changed and result.strategy == p.MODE_WAITER
    pod = copy.deepcopy(result.pod)
    pod["metadata"].pop("generateName", None)
    pod["metadata"].update(name=name, namespace=NS)
    return pod


async def gate_opens(kube: KubeDouble, c: Controller, name: str, mains: list[str]) -> None:
    kube.set_container_statuses(NS, name, [waiting("istio-proxy"), *map(waiting, mains)], phase="Pending")
    await settled(kube, c)
    kube.set_container_statuses(NS, name, [running("istio-proxy", ready=False),
                                           *(running(m, ready=False) for m in mains)], phase="Running")
    await settled(kube, c)
    assert annotation(kube, name, p.ANNOTATION_READY) is None, "the proxy is not Ready: the gate stays shut"
    kube.set_container_statuses(NS, name, [running("istio-proxy")])
    if layout(kube.pod(NS, name)).reads_ready:
        await eventually(lambda: annotation(kube, name, p.ANNOTATION_READY) == p.READY_TRUE, "the ready gate")
    else:
        await settled(kube, c)
        assert annotation(kube, name, p.ANNOTATION_READY) is None, "the mains probe the proxy themselves"


async def test_job_pod_outcome_when_the_main_quits_the_proxy(kube: KubeDouble) -> None:
    kube.put_pod(job_pod("j1", probed=False))
    async with watcher(kube, settings(grace_seconds=5.0), clock=ManualClock()) as c:
        await gate_opens(kube, c, "j1", ["report"])
        kube.set_container_statuses(NS, "j1", [step_done("report")])
        kube.set_container_statuses(NS, "j1", [terminated("istio-proxy", 0)], phase="Succeeded")
        got = await eventually(lambda: outcome(kube, "j1"), "the outcome")
        await settled(kube, c)
    assert got["result"] == "Succeeded" and got["message"] == "1 main succeeded"
    assert got["steps"] == [] and [m["name"] for m in got["mains"]] == ["report"]
    assert got["sidecarsStoppedBy"] == "quit" and deadline_patches(kube, "j1") == []
    events = kube.events_for(NS, "j1")
    assert [(e["reason"], e["message"]) for e in events] == [
        ("StepsSucceeded", "Succeeded: 1 main succeeded; sidecars stopped by quit")]


async def test_job_pod_whose_proxy_ignores_the_quit_is_ended_by_the_deadline(kube: KubeDouble) -> None:
    kube.put_pod(job_pod("j2"))
    async with watcher(kube, settings()) as c:
        await gate_opens(kube, c, "j2", ["report"])
        kube.set_container_statuses(NS, "j2", [step_done("report", 3, p.REASON_ERROR)])
        await eventually(lambda: kube.pod(NS, "j2")["spec"].get("activeDeadlineSeconds") == 1, "the deadline")
        got = outcome(kube, "j2")
    assert got["result"] == "Failed" and got["failed"] == "report" and got["sidecarsStoppedBy"] == "deadline"
    assert got["mains"][0]["exitCode"] == 3, "the main's own exit code"


async def test_on_failure_a_restarted_main_is_no_outcome(kube: KubeDouble) -> None:
    kube.put_pod(job_pod("j3", "cronjob-on-failure-istio"))
    clock = ManualClock()
    async with watcher(kube, settings(grace_seconds=0.3), clock=clock) as c:
        await gate_opens(kube, c, "j3", ["report", "upload"])
        kube.set_container_statuses(NS, "j3", [step_done("upload", at=clock.stamp()),
                                               step_done("report", 1, p.REASON_ERROR, at=clock.stamp())])
        await settled(kube, c)
        clock.advance(10.0)  # well past the grace period: the kubelet will restart report
        await settled(kube, c)
        assert outcome_patches(kube, "j3") == [] and deadline_patches(kube, "j3") == []
        kube.set_container_statuses(NS, "j3", [running("report")])  # restarted
        await settled(kube, c)
        kube.set_container_statuses(NS, "j3", [step_done("report")])
        kube.set_container_statuses(NS, "j3", [terminated("istio-proxy", 0)], phase="Succeeded")
        got = await eventually(lambda: outcome(kube, "j3"), "the outcome")
    assert got["result"] == "Succeeded" and got["message"] == "2 mains succeeded"
    assert got["sidecarsStoppedBy"] == "quit" and deadline_patches(kube, "j3") == []
