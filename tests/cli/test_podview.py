"""Ordering and state derivation over real-shaped pod JSON (webhook/cli/_podview.py)."""

from __future__ import annotations

import copy
import json
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.podstatus import T0, at, done, init_done, native_pod, pod, record, run, wait, with_status
from tests.support.kubedouble import terminated
from waiter import protocol as p
from webhook.cli import _podview as pv
from webhook.watcher import NotManaged
from webhook.watcher._decide import decide
from webhook.settings import WatcherSettings

NOW = datetime(2024, 5, 1, 10, 5, 0, tzinfo=timezone.utc)  # T0 + 300 s
KPACK_STEPS = ["prepare", "analyze", "detect", "restore", "build", "export"]


def kpack_running() -> dict:
    """kpack under Istio, waiter strategy: prepare done, analyze running, the rest waiting."""
    return with_status(
        pod("kpack-istio"), annotations={p.ANNOTATION_READY: p.READY_TRUE},
        init=[init_done("istio-init", 0, 1), init_done("initshift-init", 1, 2)],
        containers=[done("prepare", 5, 9), run("analyze", 3), *[run(n, 3) for n in KPACK_STEPS[2:]],
                    run("completion", 3), run("istio-proxy", 3)])


def job_waiting_for_sidecars() -> dict:
    return with_status(
        pod("job-istio"),
        init=[init_done("istio-init", 0, 1), init_done("initshift-init", 1, 2)],
        containers=[run("git-clone", 3), run("build", 3), run("istio-proxy", 3, ready=False)])


def kpack_all_done() -> dict:
    """Every step and the main completed; the proxy still runs."""
    steps = [done(n, 5 + 10 * i, 14 + 10 * i) for i, n in enumerate(KPACK_STEPS)]
    return with_status(
        pod("kpack-istio"), annotations={p.ANNOTATION_READY: p.READY_TRUE},
        init=[init_done("istio-init", 0, 1), init_done("initshift-init", 1, 2)],
        containers=[*steps, done("completion", 65, 66), run("istio-proxy", 3)])


def kpack_deadline_after_success() -> dict:
    """The watcher recorded Succeeded (its real decide()), then ended the proxy with a deadline."""
    before = kpack_all_done()
    before["metadata"]["resourceVersion"] = "7"
    decision = decide(before, NOW, WatcherSettings(grace_seconds=1.0))
    outcome = next(a.outcome for a in decision.actions if a.kind == "outcome")
    assert outcome["sidecarsStoppedBy"] == "deadline"
    after = with_status(
        before, init=before["status"]["initContainerStatuses"],
        containers=[s for s in before["status"]["containerStatuses"] if s["name"] != "istio-proxy"]
        + [terminated("istio-proxy", 137, "Error", started_at=at(3), finished_at=at(301))],
        phase="Failed", reason="DeadlineExceeded", message="Pod was active on the node longer than the specified "
                                                           "deadline",
        annotations={p.ANNOTATION_OUTCOME: json.dumps(outcome)})
    return after


def tekton_skipped() -> dict:
    """place-scripts fails; the waiter skips the later steps and the main."""
    skipped = [done(n, 20, 20, 1, p.REASON_SKIPPED, "skipped: place-scripts failed", "place-scripts")
               for n in ("step-git-clone", "step-unit-test", "step-report")]
    return with_status(
        pod("tekton-istio"), annotations={p.ANNOTATION_READY: p.READY_TRUE},
        init=[init_done("istio-init", 0, 1), init_done("initshift-init", 1, 2)],
        containers=[done("prepare", 5, 10), done("place-scripts", 10, 20, 1, p.REASON_ERROR, "exit status 1"),
                    *skipped, run("istio-proxy", 3)])


def kpack_oomkilled() -> dict:
    """build is OOMKilled: no waiter record, so export and completion are stuck behind it."""
    steps = [done(n, 5 + 10 * i, 14 + 10 * i) for i, n in enumerate(KPACK_STEPS[:4])]
    return with_status(
        pod("kpack-istio"), annotations={p.ANNOTATION_READY: p.READY_TRUE},
        init=[init_done("istio-init", 0, 1), init_done("initshift-init", 1, 2)],
        containers=[*steps, terminated("build", 137, "OOMKilled", started_at=at(3), finished_at=at(60)),
                    run("export", 3), run("completion", 3), run("istio-proxy", 3)])


def kpack_oomkilled_ended() -> dict:
    """After the watcher: outcome Failed (export and completion NotRun), pod ended by the deadline."""
    before = kpack_oomkilled()
    before["metadata"]["resourceVersion"] = "9"
    decision = decide(before, NOW, WatcherSettings(grace_seconds=1.0))
    outcome = next(a.outcome for a in decision.actions if a.kind == "outcome")
    kept = [s for s in before["status"]["containerStatuses"] if "terminated" in s["state"]]
    killed = [terminated(n, 137, "Error", started_at=at(3), finished_at=at(301))
              for n in ("export", "completion", "istio-proxy")]
    return with_status(before, init=before["status"]["initContainerStatuses"], containers=kept + killed,
                       phase="Failed", reason="DeadlineExceeded",
                       annotations={p.ANNOTATION_OUTCOME: json.dumps(outcome)})


def kpack_deleted() -> dict:
    """Deleted while build ran: the kubelet's SIGTERM killed build, export was still waiting
    for it (the waiter's Stopped record), completion read that record first (Skipped)."""
    steps = [done(n, 5 + 10 * i, 14 + 10 * i) for i, n in enumerate(KPACK_STEPS[:4])]
    stopped = "stopped by SIGTERM before the command started"
    return with_status(
        pod("kpack-istio"), annotations={p.ANNOTATION_READY: p.READY_TRUE},
        init=[init_done("istio-init", 0, 1), init_done("initshift-init", 1, 2)],
        containers=[*steps, done("build", 45, 50, 143, p.REASON_ERROR, "killed by SIGTERM"),
                    done("export", 50, 50, 143, p.REASON_STOPPED, stopped),
                    done("completion", 50, 50, 143, p.REASON_SKIPPED, f"skipped: step 'export' was {stopped}", "export"),
                    run("istio-proxy", 3)], phase="Running")


def tekton_plain_running() -> dict:
    """Never rewritten: init containers run in order; the kubelet says PodInitializing."""
    return with_status(
        pod("tekton", rewritten=False),
        init=[init_done("prepare", 0, 2), run("place-scripts", 2), wait("step-git-clone"), wait("step-unit-test")],
        containers=[wait("step-report")], phase="Pending")


def job_plain_failed() -> dict:
    return with_status(
        pod("job", rewritten=False), init=[init_done("git-clone", 0, 4, 128)],
        containers=[wait("build")], phase="Failed")


def native_waiting_for_proxy() -> dict:
    started = run("istio-proxy", 2, ready=False)
    started["started"] = False
    return with_status(
        native_pod(), init=[init_done("istio-init", 0, 1), started, *[wait(n) for n in KPACK_STEPS]],
        containers=[wait("completion")], phase="Pending")


def native_running() -> dict:
    return with_status(
        native_pod(), init=[init_done("istio-init", 0, 1), run("istio-proxy", 2), init_done("prepare", 4, 9),
                            run("analyze", 9), *[wait(n) for n in KPACK_STEPS[2:]]],
        containers=[wait("completion")], phase="Pending")


def cronjob_waiting_for_sidecars() -> dict:
    """A Job's pod (no init container) under the waiter: both mains held by the gate."""
    return with_status(
        pod("cronjob-on-failure-istio"), init=[init_done("istio-init", 0, 1), init_done("initshift-init", 1, 2)],
        containers=[run("report", 3), run("upload", 3), run("istio-proxy", 3, ready=False)])


def cronjob_one_main_done() -> dict:
    return with_status(
        pod("cronjob-on-failure-istio"), annotations={p.ANNOTATION_READY: p.READY_TRUE},
        init=[init_done("istio-init", 0, 1), init_done("initshift-init", 1, 2)],
        containers=[done("report", 5, 9), run("upload", 3), run("istio-proxy", 3)])


def cronjob_native_waiting_for_proxy() -> dict:
    started = run("istio-proxy", 2, ready=False)
    started["started"] = False
    return with_status(native_pod("cronjob-istio"), init=[init_done("istio-init", 0, 1), started],
                       containers=[wait("report")], phase="Pending")


def image_pull_backoff() -> dict:
    return with_status(
        pod("job-istio"),
        init=[init_done("istio-init", 0, 1), wait("initshift-init", "ImagePullBackOff")],
        containers=[wait("git-clone"), wait("build"), wait("istio-proxy")], phase="Pending")


# (id, pod builder, [(name, kind, state text, exit code, reason)])
CASES = [
    ("waiter-running", kpack_running, [
        ("istio-init", "init", "completed", 0, "Completed"),
        ("initshift-init", "init", "completed", 0, "Completed"),
        ("prepare", "step", "completed", 0, "Completed"),
        ("analyze", "step", "running", None, ""),
        ("detect", "step", "waiting for step 2", None, ""),
        ("restore", "step", "waiting for step 3", None, ""),
        ("build", "step", "waiting for step 4", None, ""),
        ("export", "step", "waiting for step 5", None, ""),
        ("completion", "main", "waiting for step 6", None, ""),
        ("istio-proxy", "sidecar", "running", None, "Ready"),
    ]),
    ("waiter-waiting-for-sidecars", job_waiting_for_sidecars, [
        ("istio-init", "init", "completed", 0, "Completed"),
        ("initshift-init", "init", "completed", 0, "Completed"),
        ("git-clone", "step", "waiting for sidecars", None, ""),
        ("build", "main", "waiting for step 1", None, ""),
        ("istio-proxy", "sidecar", "running", None, "NotReady"),
    ]),
    ("deadline-exceeded-after-success", kpack_deadline_after_success, [
        ("istio-init", "init", "completed", 0, "Completed"),
        ("initshift-init", "init", "completed", 0, "Completed"),
        *[(n, "step", "completed", 0, "Completed") for n in KPACK_STEPS],
        ("completion", "main", "completed", 0, "Completed"),
        ("istio-proxy", "sidecar", "stopped", 137, "Error"),
    ]),
    ("skipped-steps", tekton_skipped, [
        ("istio-init", "init", "completed", 0, "Completed"),
        ("initshift-init", "init", "completed", 0, "Completed"),
        ("prepare", "step", "completed", 0, "Completed"),
        ("place-scripts", "step", "failed", 1, "Error"),
        ("step-git-clone", "step", "skipped", 1, "Skipped"),
        ("step-unit-test", "step", "skipped", 1, "Skipped"),
        ("step-report", "main", "skipped", 1, "Skipped"),
        ("istio-proxy", "sidecar", "running", None, "Ready"),
    ]),
    ("oomkilled-step", kpack_oomkilled, [
        ("istio-init", "init", "completed", 0, "Completed"),
        ("initshift-init", "init", "completed", 0, "Completed"),
        *[(n, "step", "completed", 0, "Completed") for n in KPACK_STEPS[:4]],
        ("build", "step", "failed", 137, "OOMKilled"),
        ("export", "step", "waiting for step 5", None, ""),
        ("completion", "main", "waiting for step 6", None, ""),
        ("istio-proxy", "sidecar", "running", None, "Ready"),
    ]),
    ("oomkilled-step-ended", kpack_oomkilled_ended, [
        ("istio-init", "init", "completed", 0, "Completed"),
        ("initshift-init", "init", "completed", 0, "Completed"),
        *[(n, "step", "completed", 0, "Completed") for n in KPACK_STEPS[:4]],
        ("build", "step", "failed", 137, "OOMKilled"),
        ("export", "step", "not run", None, "NotRun"),
        ("completion", "main", "not run", None, "NotRun"),
        ("istio-proxy", "sidecar", "stopped", 137, "Error"),
    ]),
    ("deleted-while-a-step-ran", kpack_deleted, [
        ("istio-init", "init", "completed", 0, "Completed"),
        ("initshift-init", "init", "completed", 0, "Completed"),
        *[(n, "step", "completed", 0, "Completed") for n in KPACK_STEPS[:4]],
        ("build", "step", "failed", 143, "Error"),
        ("export", "step", "not run", 143, "Stopped"),
        ("completion", "main", "skipped", 143, "Skipped"),
        ("istio-proxy", "sidecar", "running", None, "Ready"),
    ]),
    ("never-rewritten-running", tekton_plain_running, [
        ("prepare", "step", "completed", 0, "Completed"),
        ("place-scripts", "step", "running", None, ""),
        ("step-git-clone", "step", "waiting for step 2", None, ""),
        ("step-unit-test", "step", "waiting for step 3", None, ""),
        ("step-report", "main", "waiting for step 4", None, ""),
    ]),
    ("never-rewritten-failed", job_plain_failed, [
        ("git-clone", "step", "failed", 128, "Error"),
        ("build", "main", "not run", None, "NotRun"),
    ]),
    ("native-waiting-for-proxy", native_waiting_for_proxy, [
        ("istio-init", "init", "completed", 0, "Completed"),
        ("prepare", "step", "waiting for sidecars", None, ""),
        ("analyze", "step", "waiting for step 1", None, ""),
        ("detect", "step", "waiting for step 2", None, ""),
        ("restore", "step", "waiting for step 3", None, ""),
        ("build", "step", "waiting for step 4", None, ""),
        ("export", "step", "waiting for step 5", None, ""),
        ("completion", "main", "waiting for step 6", None, ""),
        ("istio-proxy", "sidecar", "running", None, "NotReady"),
    ]),
    ("native-running", native_running, [
        ("istio-init", "init", "completed", 0, "Completed"),
        ("prepare", "step", "completed", 0, "Completed"),
        ("analyze", "step", "running", None, ""),
        ("detect", "step", "waiting for step 2", None, ""),
        ("restore", "step", "waiting for step 3", None, ""),
        ("build", "step", "waiting for step 4", None, ""),
        ("export", "step", "waiting for step 5", None, ""),
        ("completion", "main", "waiting for step 6", None, ""),
        ("istio-proxy", "sidecar", "running", None, "Ready"),
    ]),
    ("cronjob-waiting-for-sidecars", cronjob_waiting_for_sidecars, [
        ("istio-init", "init", "completed", 0, "Completed"),
        ("initshift-init", "init", "completed", 0, "Completed"),
        ("report", "main", "waiting for sidecars", None, ""),
        ("upload", "main", "waiting for sidecars", None, ""),
        ("istio-proxy", "sidecar", "running", None, "NotReady"),
    ]),
    ("cronjob-one-main-done", cronjob_one_main_done, [
        ("istio-init", "init", "completed", 0, "Completed"),
        ("initshift-init", "init", "completed", 0, "Completed"),
        ("report", "main", "completed", 0, "Completed"),
        ("upload", "main", "running", None, ""),
        ("istio-proxy", "sidecar", "running", None, "Ready"),
    ]),
    ("cronjob-native-waiting-for-proxy", cronjob_native_waiting_for_proxy, [
        ("istio-init", "init", "completed", 0, "Completed"),
        ("report", "main", "waiting for sidecars", None, ""),
        ("istio-proxy", "sidecar", "running", None, "NotReady"),
    ]),
    ("image-pull-backoff", image_pull_backoff, [
        ("istio-init", "init", "completed", 0, "Completed"),
        ("initshift-init", "init", "pending", None, "ImagePullBackOff"),
        ("git-clone", "step", "waiting for initshift-init", None, ""),
        ("build", "main", "waiting for step 1", None, ""),
        ("istio-proxy", "sidecar", "pending", None, "PodInitializing"),
    ]),
]


@pytest.mark.parametrize("build, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rows_in_execution_order_with_derived_states(build, expected) -> None:
    view = pv.pod_view(build(), NOW)
    got = [(r.name, r.kind, pv.state_text(r, view), r.exit_code, r.reason) for r in view.rows]
    assert got == expected


def test_statuses_arrive_alphabetical_but_rows_follow_the_steps_annotation() -> None:
    pod_ = kpack_running()
    assert [s["name"] for s in pod_["status"]["containerStatuses"]] == sorted(
        s["name"] for s in pod_["status"]["containerStatuses"])
    view = pv.pod_view(pod_, NOW)
    steps = [r for r in view.rows if r.kind == "step"]
    assert [r.name for r in steps] == json.loads(pod_["metadata"]["annotations"][p.ANNOTATION_STEPS])
    assert [r.number for r in steps] == [1, 2, 3, 4, 5, 6]


def test_deadline_exceeded_with_succeeded_outcome_reads_as_succeeded() -> None:
    view = pv.pod_view(kpack_deadline_after_success(), NOW)
    assert (view.phase, view.pod_reason, view.result) == ("Failed", "DeadlineExceeded", "Succeeded")
    assert view.failed is None and view.sidecars_stopped_by == "deadline"
    assert view.row("istio-proxy").message.startswith("stopped by deadline")
    assert view.to_json()["result"] == "Succeeded"


def test_waiter_times_come_from_its_record_not_the_kubelet() -> None:
    """The container started with the pod; the record's startedAt excludes the wait."""
    view = pv.pod_view(kpack_all_done(), NOW)
    build = view.row("build")
    assert build.started_at == "2024-05-01T10:00:45.000000Z" and build.duration == pytest.approx(9.0)


def test_oomkilled_step_started_when_its_predecessor_finished() -> None:
    build = pv.pod_view(kpack_oomkilled(), NOW).row("build")
    assert (build.started_at, build.duration) == ("2024-05-01T10:00:44.000000Z", pytest.approx(16.0))


def test_running_step_started_when_its_predecessor_finished() -> None:
    view = pv.pod_view(kpack_running(), NOW)
    analyze = view.row("analyze")
    assert analyze.started_at == "2024-05-01T10:00:09.000000Z"
    assert analyze.duration == pytest.approx((NOW - T0).total_seconds() - 9)


def test_failed_and_skipped_carry_their_messages_and_the_outcome_names_the_failure() -> None:
    pod_ = tekton_skipped()
    pod_["metadata"]["resourceVersion"] = "3"
    pod_["status"]["containerStatuses"] = [
        s if s["name"] != "istio-proxy" else terminated("istio-proxy", 0, started_at=at(3), finished_at=at(25))
        for s in pod_["status"]["containerStatuses"]]
    outcome = next(a.outcome for a in decide(pod_, NOW, WatcherSettings()).actions if a.kind == "outcome")
    pod_["metadata"]["annotations"][p.ANNOTATION_OUTCOME] = json.dumps(outcome)
    view = pv.pod_view(pod_, NOW)
    assert (view.result, view.failed, view.sidecars_stopped_by) == ("Failed", "place-scripts", "quit")
    assert view.row("place-scripts").message == "exit status 1"
    assert view.row("step-git-clone").message == "skipped: place-scripts failed"
    proxy = view.row("istio-proxy")
    assert (proxy.state, proxy.exit_code, proxy.message) == ("stopped", 0, "stopped by quit")


def test_a_skipped_main_with_no_record_of_its_own_shows_as_skipped() -> None:
    """kpack's completion (its own terminationMessagePath: no record of the waiter's) after a
    failed build step, exiting with the step's code (--skip-fails): skipped, not failed."""
    steps = [done(n, 5 + 10 * i, 14 + 10 * i) for i, n in enumerate(KPACK_STEPS[:4])]
    build = with_status(
        pod("kpack-istio"), annotations={p.ANNOTATION_READY: p.READY_TRUE},
        init=[init_done("istio-init", 0, 1), init_done("initshift-init", 1, 2)],
        containers=[*steps, done("build", 45, 54, 51, p.REASON_ERROR, "exited with code 51"),
                    done("export", 54, 54, 51, p.REASON_SKIPPED, "skipped: step 'build' failed with exit code 51",
                         "build"),
                    terminated("completion", 51, "Error", started_at=at(3), finished_at=at(55)),
                    run("istio-proxy", 3)])
    row = pv.pod_view(build, NOW).row("completion")
    assert (row.state, row.exit_code, row.message) == \
        (pv.State.SKIPPED, 51, "skipped: step 'build' failed with exit code 51")


def test_a_native_pod_without_an_outcome_names_its_failed_container() -> None:
    """The watcher writes no outcome for a native pod: the failed step or main is read from
    the kubelet's statuses (`status -n` lists it beside the result)."""
    job = with_status(native_pod("cronjob-istio"), init=[init_done("istio-init", 0, 1), run("istio-proxy", 2)],
                      containers=[init_done("report", 3, 5, 1, "Error")], phase="Failed")
    assert (pv.pod_view(job, NOW).result, pv.pod_view(job, NOW).failed) == ("Failed", "report")
    build = with_status(native_pod(), init=[init_done("istio-init", 0, 1), run("istio-proxy", 2),
                                            init_done("prepare", 4, 9), init_done("analyze", 9, 12, 2, "Error"),
                                            *[wait(n) for n in KPACK_STEPS[2:]]],
                        containers=[wait("completion")], phase="Failed")
    assert pv.pod_view(build, NOW).failed == "analyze"
    assert pv.pod_view(native_running(), NOW).failed is None


def test_json_rows_are_stable_and_complete() -> None:
    data = pv.pod_view(kpack_running(), NOW).to_json()
    assert (data["namespace"], data["name"], data["strategy"], data["ready"]) == ("builds", "build-1", "waiter", True)
    detect = next(c for c in data["containers"] if c["name"] == "detect")
    assert detect == {"name": "detect", "kind": "step", "step": 3, "state": "waiting-step", "waitingFor": "analyze",
                      "exitCode": None, "reason": "", "message": "", "startedAt": None, "finishedAt": None,
                      "durationSeconds": None, "restarts": 0, "ready": None}


def test_a_pod_that_is_neither_managed_nor_has_init_containers_is_refused() -> None:
    plain = with_status(pod("no-init-istio", rewritten=False), containers=[run("build"), run("istio-proxy")])
    with pytest.raises(NotManaged, match="not managed by initshift"):
        pv.pod_view(plain, NOW)


def test_log_plan_orders_steps_then_mains_and_sidecars_on_request() -> None:
    waiter = pod("kpack-istio")
    plan = pv.log_plan(waiter)
    assert plan.sequential == [*KPACK_STEPS, "completion"] and plan.concurrent == []
    assert plan.waiter_run == frozenset([*KPACK_STEPS, "completion"])
    full = pv.log_plan(waiter, sidecars=True)
    assert full.sequential == ["istio-init", "initshift-init", *KPACK_STEPS, "completion"]
    assert full.concurrent == ["istio-proxy"]
    native = pv.log_plan(native_pod(), sidecars=True)
    assert native.sequential == ["istio-init", *KPACK_STEPS, "completion"] and native.concurrent == ["istio-proxy"]
    assert native.waiter_run == frozenset()
    plain = pv.log_plan(pod("tekton", rewritten=False))
    assert plain.sequential == ["prepare", "place-scripts", "step-git-clone", "step-unit-test", "step-report"]


def test_log_plan_of_a_jobs_pod_is_its_mains() -> None:
    job = pod("cronjob-on-failure-istio")
    plan = pv.log_plan(job)
    assert plan.sequential == ["report", "upload"] and plan.waiter_run == frozenset(["report", "upload"])
    full = pv.log_plan(job, sidecars=True)
    assert full.sequential == ["istio-init", "initshift-init", "report", "upload"]
    assert full.concurrent == ["istio-proxy"]
    native = pv.log_plan(native_pod("cronjob-istio"), sidecars=True)
    assert native.sequential == ["istio-init", "report"] and native.concurrent == ["istio-proxy"]


@pytest.mark.parametrize("line, ours", [
    ("waiter[build]: already ran in this pod (Completed, exit code 0): not running it\n", True),
    ("waiter: cannot write completion file /initshift/run/1/done: Read-only file system\n", True),
    ("waiters: a word in the build output\n", False),
    ("building waiter[x]: not at the start\n", False),
    ("===> BUILDING\n", False),
])
def test_waiter_lines_are_recognised_by_the_protocol_prefix(line: str, ours: bool) -> None:
    assert pv.is_waiter_line(line) is ours


def test_record_helper_is_what_the_watcher_parses() -> None:
    """The fixtures' termination messages are real waiter records (decide reads them)."""
    from webhook.watcher._podstate import read_run
    r = read_run("x", done("x", 1, 2))
    assert r.recorded and r.reason == p.REASON_COMPLETED and json.loads(record("x"))["name"] == "x"


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=8)
STATE = st.one_of(JSON, st.fixed_dictionaries({}, optional={
    "running": st.fixed_dictionaries({}, optional={"startedAt": JSON}),
    "terminated": st.fixed_dictionaries({}, optional={"exitCode": JSON, "reason": JSON, "message": JSON | st.just(
        record("prepare")), "startedAt": JSON, "finishedAt": JSON}),
    "waiting": st.fixed_dictionaries({}, optional={"reason": JSON})}))


_BASES: dict[tuple[str, bool], dict] = {}


def base_pod(fixture: str, rewritten: bool) -> dict:
    if (fixture, rewritten) not in _BASES:
        _BASES[fixture, rewritten] = pod(fixture, rewritten=rewritten)
    return copy.deepcopy(_BASES[fixture, rewritten])


@settings(max_examples=100, deadline=None)
@given(fixture=st.sampled_from(["kpack-istio", "tekton-istio", "job-linkerd"]), rewritten=st.booleans(),
       names=st.lists(st.sampled_from([*KPACK_STEPS, "completion", "istio-proxy", "git-clone", "nope", 3]),
                      max_size=6),
       states=st.lists(STATE, min_size=6, max_size=6), ready=JSON, phase=JSON, outcome=JSON | st.text(max_size=20),
       steps=JSON | st.just('["prepare","ghost"]'))
def test_any_status_gives_a_view_or_not_managed(fixture, rewritten, names, states, ready, phase, outcome,
                                                steps) -> None:
    """Statuses and annotations of any shape: a view or NotManaged, never another exception."""
    pod_ = base_pod(fixture, rewritten)
    ann = pod_["metadata"].setdefault("annotations", {})
    ann.update({p.ANNOTATION_OUTCOME: outcome if isinstance(outcome, str) else json.dumps(outcome),
                p.ANNOTATION_STEPS: steps if isinstance(steps, str) else json.dumps(steps)})
    if isinstance(ready, str):
        ann[p.ANNOTATION_READY] = ready
    entries = [{"name": n, "state": s, "ready": ready, "restartCount": 0} for n, s in zip(names, states)]
    pod_["status"] = {"phase": phase, "containerStatuses": entries, "initContainerStatuses": entries[::-1]}
    try:
        view = pv.pod_view(pod_, NOW)
    except NotManaged:
        return
    for row in view.rows:
        pv.state_text(row, view)
    json.dumps(view.to_json())


def test_a_container_waiting_to_restart_has_its_last_runs_log() -> None:
    """CrashLoopBackOff: waiting, not started, yet the kubelet serves its last run's log (as
    `kubectl logs` shows it; seen on v1.34.9): `initshift logs` printed nothing for it."""
    looping = wait("prepare", "CrashLoopBackOff")
    looping["lastState"] = terminated("prepare", 2)["state"]
    crashing = with_status(pod("tekton", rewritten=False), init=[looping], containers=[wait("step-report")],
                           phase="Pending")
    assert pv.has_log(crashing, "prepare") and not pv.has_started(crashing, "prepare")
    assert not pv.has_log(crashing, "step-report")  # never ran: no log (the kubelet's 400)
    assert pv.has_log(kpack_running(), "analyze") and pv.has_log(kpack_running(), "prepare")


@pytest.mark.parametrize("policy, container, code, ended, again", [
    ("Never", "main", 1, False, False),
    ("OnFailure", "main", 1, False, True),
    ("OnFailure", "main", 0, False, False),
    ("OnFailure", "main", 1, True, False),  # a Job's pod whose backoffLimit is spent
    ("Always", "main", 0, False, True),
    ("Always", "step", 0, False, False),  # an init container that succeeded is not run again
    ("Always", "step", 1, False, True),
    ("OnFailure", "step", 1, False, True),
    ("Never", "step", 1, False, False),
    ("Never", "proxy", 0, False, True),  # a native sidecar, whatever the pod's policy
    ("Never", "proxy", 0, True, False),
])
def test_runs_again_follows_the_kubelets_restart_rules(policy: str, container: str, code: int, ended: bool,
                                                      again: bool) -> None:
    """What `logs -f` keeps following: the kubelet's restart of a terminated container."""
    obj = {"spec": {"restartPolicy": policy, "initContainers": [{"name": "proxy", "restartPolicy": "Always"},
                                                                 {"name": "step"}], "containers": [{"name": "main"}]},
           "status": {"phase": "Failed" if ended else "Running",
                      "initContainerStatuses": [terminated(container, code)] if container != "main" else [],
                      "containerStatuses": [terminated(container, code)] if container == "main" else []}}
    assert pv.runs_again(obj, container) is again
