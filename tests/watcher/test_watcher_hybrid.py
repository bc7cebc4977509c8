"""The watcher on hybrid pods (native proxy, waiter-run steps), as the real rewrite writes
them, against the API double: the outcome is recorded like a waiter pod's, the kubelet
stops the native proxy so no deadline is ever set on the happy path, and a step that died
without its waiter's record still ends the pod."""

from __future__ import annotations

import json

from tests.support.clock import ManualClock
from tests.support.fixtures.pods import catalogue
from tests.support.kubedouble import NEVER_STARTED, KubeDouble, running, start_error, terminated, waiting
from tests.watcher.test_watcher import (NS, annotation, deadline_patches, eventually, outcome, settings, settled,
                                        step_done, watcher)
from tests.watcher.test_watcher_decide import NOW, W, ago, make_pod, record
from waiter import protocol as p
from webhook.rewrite import rewrite
from webhook.settings import Settings
from webhook.watcher._decide import decide, layout


def hybrid_pod(name: str) -> dict:
    pod = rewrite(catalogue()["job-istio"], Settings(feature_gate=True), native_supported=True).pod
    assert pod["metadata"]["labels"][p.LABEL_MANAGED] == p.MODE_HYBRID
    pod["metadata"].pop("generateName", None)
    pod["metadata"].update(name=name, namespace=NS)
    return pod


def test_layout_of_a_hybrid_pod():
    lay = layout(hybrid_pod("h0"))
    assert (lay.steps, lay.mains, lay.sidecars, lay.native) == (["git-clone"], ["build"], [], ["istio-proxy"])
    assert lay.inits == ["istio-init", p.COPY_CONTAINER_NAME], "the copier runs first, and is no sidecar"
    assert not lay.reads_ready, "step 0 probes Istio's proxy on loopback itself"


def test_done_with_the_proxy_still_running_records_the_outcome_and_never_a_deadline():
    pod = hybrid_pod("h0")
    pod["metadata"]["annotations"][p.ANNOTATION_READY] = p.READY_TRUE
    pod["status"] = {"phase": "Running", "startTime": ago(600),
                     "initContainerStatuses": [terminated("istio-init", 0), running("istio-proxy")],
                     "containerStatuses": [terminated(p.COPY_CONTAINER_NAME, 0),
                                           terminated("git-clone", 0, message=record("git-clone", end=100)),
                                           terminated("build", 0, message=record("build", end=1))]}
    d = decide(pod, NOW, W)
    assert [a.kind for a in d.actions] == ["outcome"] and d.requeue_after is None
    assert d.actions[0].outcome["sidecarsStoppedBy"] == "native"
    pod["metadata"]["annotations"][p.ANNOTATION_OUTCOME] = "{}"
    assert decide(pod, NOW, W).actions == [], "the kubelet stops the native proxy: nothing to end"


async def test_hybrid_pod_from_pending_to_outcome_without_a_deadline(kube: KubeDouble) -> None:
    kube.put_pod(hybrid_pod("h1"))
    clock = ManualClock()
    async with watcher(kube, settings(grace_seconds=0.3), clock=clock) as c:
        kube.set_container_statuses(NS, "h1", [terminated(p.COPY_CONTAINER_NAME, 0), running("git-clone"),
                                               running("build")],
                                    init=[terminated("istio-init", 0), running("istio-proxy")], phase="Running")
        await settled(kube, c)
        assert kube.patches(NS, "h1") == [], "step 0 opens its own gate: no ready annotation to write"
        kube.set_container_statuses(NS, "h1", [step_done("git-clone", at=clock.stamp())])
        kube.set_container_statuses(NS, "h1", [step_done("build", at=clock.stamp())])
        got = await eventually(lambda: outcome(kube, "h1"), "the outcome")
        assert got["result"] == "Succeeded" and got["sidecarsStoppedBy"] == "native"
        clock.advance(5.0)  # past the grace period: the proxy is still running
        await settled(kube, c)
        kube.set_container_statuses(NS, "h1", init=[terminated("istio-proxy", 0)], phase="Succeeded")
        await settled(kube, c)
    assert deadline_patches(kube, "h1") == [], "the kubelet stops native sidecars"
    assert len(kube.patches(NS, "h1")) == 1 and annotation(kube, "h1", p.ANNOTATION_READY) is None
    assert [e["reason"] for e in kube.events_for(NS, "h1")] == ["StepsSucceeded"]


async def test_a_step_killed_with_its_waiter_ends_the_hybrid_pod(kube: KubeDouble) -> None:
    kube.put_pod(hybrid_pod("h2"))
    async with watcher(kube, settings(grace_seconds=30.0)):
        kube.set_container_statuses(NS, "h2", [running("git-clone"), running("build")],
                                    init=[running("istio-proxy")], phase="Running")
        # A cgroup-wide OOM kill took the waiter with the step: no record, and `build` waits forever.
        kube.set_container_statuses(NS, "h2", [terminated("git-clone", 137, "OOMKilled")])
        await eventually(lambda: kube.pod(NS, "h2")["spec"].get("activeDeadlineSeconds") == 1, "the deadline")
    got = outcome(kube, "h2")
    assert got["result"] == "Failed" and got["failed"] == "git-clone" and "OOMKilled" in got["message"]
    assert [m["reason"] for m in got["mains"]] == ["NotRun"]


def unpulled_copy(pod: dict, reason: str = "ImagePullBackOff") -> dict:
    """initshift-copy's image cannot be pulled (a node without the registry's credentials):
    the kubelet starts the steps and mains anyway, and each fails to start without its waiter
    (StartError, exit 128, the Unix epoch as its start, as v1.34.9 reports it); the native
    proxy runs, and the pod stays Pending while the copier waits."""
    pod["status"] = {"phase": "Pending", "startTime": ago(60),
                     "initContainerStatuses": [terminated("istio-init", 0), running("istio-proxy")],
                     "containerStatuses": [waiting(p.COPY_CONTAINER_NAME, reason),
                                           start_error("git-clone", finished_at=ago(40)),
                                           start_error("build", finished_at=ago(39))]}
    return pod


def test_steps_that_ran_without_their_copied_waiter_end_the_pod_at_once():
    d = decide(unpulled_copy(hybrid_pod("h3")), NOW, W)
    [action] = d.actions
    assert action.ends and action.patch["spec"] == {"activeDeadlineSeconds": 1}, "outcome and end in one patch"
    got = action.outcome
    assert got["result"] == "Failed" and got["failed"] == "git-clone"
    assert got["message"].startswith("git-clone failed: StartError (exit 128): failed to create containerd task")
    assert got["message"].endswith(": no such file or directory: unknown; "
                                   f"{p.COPY_CONTAINER_NAME} cannot start (ImagePullBackOff)"), \
        "the runtime's why, at the end of its message, is kept"
    assert got["sidecarsStoppedBy"] == "deadline", "the proxy runs until the watcher ends the pod"
    assert [(s["reason"], s["startedAt"]) for s in got["steps"] + got["mains"]] == [("StartError", None)] * 2, \
        "the kubelet's zero time is no start"


def test_a_hybrid_pod_whose_outcome_is_written_is_ended_while_its_copier_cannot_start():
    # As an earlier watcher left it: the outcome written (stopped by "native"), nothing ended.
    pod = unpulled_copy(hybrid_pod("h4"), "ErrImagePull")
    pod["metadata"]["annotations"][p.ANNOTATION_OUTCOME] = "{}"
    [action] = decide(pod, NOW, W).actions
    assert action.kind == "end" and action.patch == {"spec": {"activeDeadlineSeconds": 1}}
    assert action.message.startswith(f"{p.COPY_CONTAINER_NAME} cannot start (ErrImagePull)")


def test_a_copier_that_runs_late_is_waited_for_as_a_sidecar_is():
    pod = unpulled_copy(hybrid_pod("h5"))
    pod["status"]["containerStatuses"][0] = running(p.COPY_CONTAINER_NAME)
    pod["status"]["containerStatuses"][1:] = [start_error("git-clone", finished_at=ago(2)),
                                              start_error("build", finished_at=ago(1))]
    d = decide(pod, NOW, W)
    assert d.actions == [] and d.requeue_after == 9.0, "the grace period, as for a running sidecar"
    [action] = decide(pod, NOW.replace(second=9), W).actions
    assert action.ends and action.outcome["sidecarsStoppedBy"] == "deadline"


def test_under_on_failure_the_steps_are_restarted_once_the_copier_runs():
    pod = unpulled_copy(hybrid_pod("h6"))
    pod["spec"]["restartPolicy"] = "OnFailure"
    assert decide(pod, NOW, W).actions == [], "the kubelet restarts them: nothing is final"


def test_a_waiter_pod_held_at_an_init_container_that_cannot_start_says_so_at_the_timeout():
    pod = make_pod([waiting("fetch", "PodInitializing"), waiting("build", "PodInitializing"),
                    waiting("completion", "PodInitializing"), waiting("istio-proxy", "PodInitializing")],
                   phase="Pending", start=601, init_statuses=[waiting(p.INIT_CONTAINER_NAME, "ImagePullBackOff")])
    [action] = decide(pod, NOW, W).actions
    assert action.outcome["failed"] == "istio-proxy" and action.ends
    assert action.outcome["message"] == \
        f"sidecar istio-proxy not Ready after 600s: {p.INIT_CONTAINER_NAME} cannot start (ImagePullBackOff)"


async def test_a_hybrid_pod_whose_copier_cannot_be_pulled_ends(kube: KubeDouble) -> None:
    kube.put_pod(hybrid_pod("h7"))
    async with watcher(kube, settings(grace_seconds=30.0)):
        kube.set_container_statuses(NS, "h7", [waiting(p.COPY_CONTAINER_NAME, "ErrImagePull"),
                                               start_error("git-clone"), start_error("build")],
                                    init=[terminated("istio-init", 0), running("istio-proxy")], phase="Pending")
        await eventually(lambda: kube.pod(NS, "h7")["spec"].get("activeDeadlineSeconds") == 1, "the deadline")
    got = outcome(kube, "h7")
    assert got["failed"] == "git-clone" and got["sidecarsStoppedBy"] == "deadline"
    assert got["steps"][0]["startedAt"] is None and NEVER_STARTED not in json.dumps(got)
