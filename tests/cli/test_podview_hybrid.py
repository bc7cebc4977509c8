"""`initshift status`/`logs` read hybrid pods (native proxy, waiter-run steps) like waiter
pods: rows in execution order, the first step held for the sidecars, the outcome."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from tests.support.podstatus import done, hybrid_pod, init_done, run, wait, with_status
from tests.cli.test_podview import KPACK_STEPS
from waiter import protocol as p
from webhook.cli._status import _finished, render
from webhook.cli import _podview as pv
from webhook.watcher import _podstate as ps

NOW = datetime(2024, 5, 1, 10, 5, 0, tzinfo=timezone.utc)  # T0 + 300 s
INITS = [init_done("istio-init", 0, 1)]


def test_rows_in_execution_order_like_a_waiter_pod():
    pod = with_status(hybrid_pod(), annotations={p.ANNOTATION_READY: p.READY_TRUE},
                      init=[*INITS, run("istio-proxy", 1)],
                      containers=[done(p.COPY_CONTAINER_NAME, 1, 2), done("prepare", 5, 9), *[run(n, 3) for n in KPACK_STEPS[1:]], run("completion", 3)])
    view = pv.pod_view(pod, NOW)
    assert view.strategy == p.MODE_HYBRID and view.ready is True
    assert [(r.name, r.kind) for r in view.rows] == [
        ("istio-init", ps.INIT), (p.COPY_CONTAINER_NAME, ps.INIT), *[(n, ps.STEP) for n in KPACK_STEPS],
        ("completion", ps.MAIN), ("istio-proxy", ps.SIDECAR)]
    states = {r.name: r.state for r in view.rows}
    assert states["prepare"] == pv.State.COMPLETED and states["analyze"] == pv.State.RUNNING
    assert states["detect"] == pv.State.WAITING_STEP and states["istio-proxy"] == pv.State.RUNNING
    plan = pv.log_plan(pod)
    assert plan.sequential == [*KPACK_STEPS, "completion"] and plan.waiter_run == frozenset([*KPACK_STEPS,
                                                                                             "completion"])


def test_first_step_held_for_the_native_proxy():
    # The kubelet has not started the regular containers yet (the proxy's startup is pending).
    pod = with_status(hybrid_pod(), phase="Pending", init=[*INITS, run("istio-proxy", 1, ready=False)],
                      containers=[wait(n) for n in [p.COPY_CONTAINER_NAME, *KPACK_STEPS, "completion"]])
    row = pv.pod_view(pod, NOW).row("prepare")
    assert row.state == pv.State.WAITING_STEP and row.waiting_for == p.COPY_CONTAINER_NAME
    # Started beside a proxy that is not Ready yet: the waiter's loopback gate holds step 0.
    pod = with_status(hybrid_pod(), init=[*INITS, run("istio-proxy", 1, ready=False)],
                      containers=[done(p.COPY_CONTAINER_NAME, 1, 2), *[run(n, 3) for n in [*KPACK_STEPS, "completion"]]])
    assert pv.pod_view(pod, NOW).row("prepare").state == pv.State.WAITING_SIDECARS


def test_outcome_is_read_and_status_waits_for_it():
    steps = [done(n, 5 + 10 * i, 14 + 10 * i) for i, n in enumerate(KPACK_STEPS)]
    ended = with_status(hybrid_pod(), phase="Succeeded",
                        init=[*INITS, init_done("istio-proxy", 1, 70)],
                        containers=[done(p.COPY_CONTAINER_NAME, 1, 2), *steps, done("completion", 65, 66)])
    view = pv.pod_view(ended, NOW)
    assert not _finished(view, outcome_wait_over=False), "a hybrid pod's outcome is awaited like a waiter pod's"
    outcome = {"result": "Succeeded", "failed": None, "message": "6 steps and 1 main succeeded",
               "sidecarsStoppedBy": "native", "steps": [], "mains": []}
    ended["metadata"]["annotations"][p.ANNOTATION_OUTCOME] = json.dumps(outcome)
    view = pv.pod_view(ended, NOW)
    assert _finished(view, outcome_wait_over=False) and view.sidecars_stopped_by == "native"
    assert view.row("istio-proxy").state == pv.State.STOPPED and "stopped by native" in view.row("istio-proxy").message


def test_status_says_which_startup_probe_initshift_removed():
    pod = with_status(hybrid_pod(), init=[*INITS, run("istio-proxy", 1)],
                      containers=[done(p.COPY_CONTAINER_NAME, 1, 2), *[run(n, 3) for n in [*KPACK_STEPS, "completion"]]])
    view = pv.pod_view(pod, NOW)
    assert view.startup_probes_removed == ("istio-proxy",)
    assert view.to_json()["startupProbesRemoved"] == ["istio-proxy"]
    table = render(view, "table")
    assert f"Start:   no startupProbe on istio-proxy: step 0 waits for its readiness itself " \
           f"({p.ANNOTATION_STARTUP_PROBES_REMOVED})" in table.splitlines()
    del pod["metadata"]["annotations"][p.ANNOTATION_STARTUP_PROBES_REMOVED]
    assert pv.pod_view(pod, NOW).startup_probes_removed == () and "Start:" not in render(pv.pod_view(pod, NOW), "table")
    pod["metadata"]["annotations"][p.ANNOTATION_POST_START_REMOVED] = json.dumps(
        {"istio-proxy": {"exec": {"command": ["pilot-agent", "wait"]}}})
    view = pv.pod_view(pod, NOW)
    assert view.post_start_removed == ("istio-proxy",) and view.to_json()["postStartRemoved"] == ["istio-proxy"]
    assert f"Start:   no postStart wait on istio-proxy: step 0 waits for its readiness itself " \
           f"({p.ANNOTATION_POST_START_REMOVED})" in render(view, "table").splitlines()


def test_a_start_order_pod_with_initshift_init_is_shown_as_managed_not_as_left_alone():
    from tests.rewrite.test_start_order import ON, web_pod
    from webhook.rewrite._rewrite import rewrite

    pod = rewrite(web_pod("istio-proxy,cache;app"), ON, native_supported=False).pod
    assert pod["metadata"]["labels"][p.LABEL_MANAGED] == p.MANAGED_START_ORDER
    assert p.INIT_CONTAINER_NAME in [c["name"] for c in pod["spec"]["initContainers"]]
    pod["metadata"]["name"] = "web-1"
    header = render(pv.pod_view(pod, NOW), "table").splitlines()[0]
    assert header.endswith(f"managed by initshift ({p.MANAGED_START_ORDER})"), header


def test_a_step_that_never_started_shows_no_start_and_no_duration():
    # initshift-copy's image could not be pulled: the kubelet started the steps without the
    # waiter (StartError), reporting the zero time (the Unix epoch) as their start.
    from tests.support.kubedouble import start_error
    pod = with_status(hybrid_pod(), phase="Pending", init=[*INITS, run("istio-proxy", 1)],
                      containers=[wait(p.COPY_CONTAINER_NAME, "ImagePullBackOff"),
                                  *[start_error(n, finished_at="2024-05-01T10:00:03Z") for n in KPACK_STEPS],
                                  start_error("completion", finished_at="2024-05-01T10:00:04Z")])
    view = pv.pod_view(pod, NOW)
    rows = {r.name: r for r in view.rows}
    assert rows[p.COPY_CONTAINER_NAME].state == pv.State.PENDING
    assert rows[p.COPY_CONTAINER_NAME].reason == "ImagePullBackOff"
    for name in [*KPACK_STEPS, "completion"]:
        assert (rows[name].reason, rows[name].exit_code) == ("StartError", 128)
        assert (rows[name].started_at, rows[name].duration) == (None, None), rows[name]
    text = render(view, "table")
    assert "00:00:00Z" not in text and "498913h" not in text, text
    assert json.loads(render(view, "json"))["containers"][2]["startedAt"] is None


def test_the_zero_time_is_no_start():
    assert ps.ran_at("1970-01-01T00:00:00Z") is None and ps.ran_at("0001-01-01T00:00:00Z") is None
    assert ps.ran_at(None) is None and ps.ran_at("garbage") is None
    assert ps.ran_at("2024-05-01T10:00:03Z") == "2024-05-01T10:00:03Z"
