"""decide(): a table of pod states (container statuses) -> the actions expected."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from tests.support.kubedouble import merge_patch, running, terminated, waiting
from waiter import protocol as p
from webhook.rewrite._command import run_command
from webhook.watcher._decide import RECORD, URGENT, decide, format_time, slim_pod
from webhook.watcher._podstate import clip, layout, read_runs
from webhook.settings import WatcherSettings

NOW = datetime(2024, 5, 1, 12, 0, 0, tzinfo=timezone.utc)
W = WatcherSettings(grace_seconds=10.0, sidecar_ready_timeout_seconds=600.0)


def ago(seconds: float) -> str:
    return format_time(NOW - timedelta(seconds=seconds))


def record(name: str, code: int = 0, reason: str = p.REASON_COMPLETED, end: float = 20) -> str:
    """A waiter termination message (the child ran 10 s)."""
    return json.dumps({"name": name, "exitCode": code, "reason": reason, "startedAt": ago(end + 10),
                       "finishedAt": ago(end), "message": "" if code == 0 else f"{name} exited {code}"})


def done(name: str, code: int = 0, reason: str = p.REASON_COMPLETED, end: float = 20) -> dict:
    return terminated(name, code, "Completed" if code == 0 else "Error", message=record(name, code, reason, end=end),
                      started_at=ago(end + 5), finished_at=ago(end))


def waiter_container(name: str, *, gated: bool, probes: tuple[str, ...] = ()) -> dict:
    """A container as the rewrite wraps it; `gated`: it waits for the ready gate (step 0, or
    the mains of a pod without steps), whose ready file it reads, and `probes` it checks."""
    args = run_command(name=name, post=p.completion_path(0), argv=["make", name],
                       ready_file=p.READY_FILE if gated else None, probes=probes if gated else ())
    return {"name": name, "image": "x", "command": [p.WAITER_PATH], "args": args}


def make_pod(statuses: list[dict], *, phase: str = "Running", steps=("fetch", "build"), mains=("completion",),
             sidecars=("istio-proxy",), native=(), init_statuses=(), annotations=None, start: float = 60,
             deadline=None, mains_annotation: bool = True, reason: str | None = None,
             probes: tuple[str, ...] = ()) -> dict:
    """`probes`: the loopback probes step 0 checks itself (then it does not read the ready
    annotation); without, its gate is the annotation alone, as for a sidecar without a probe."""
    ann = {p.ANNOTATION_STEPS: json.dumps(list(steps))}
    if mains_annotation:
        ann[p.ANNOTATION_MAINS] = json.dumps(list(mains))
    ann.update(annotations or {})
    gated = set(steps[:1] or mains) if sidecars or native else set()
    spec: dict = {
        "restartPolicy": "Never",
        "initContainers": [{"name": p.INIT_CONTAINER_NAME, "image": "initshift"}] +
                          [{"name": n, "image": "proxy", "restartPolicy": "Always"} for n in native],
        "containers": [waiter_container(n, gated=n in gated, probes=probes) for n in list(steps) + list(mains)] +
                      [{"name": n, "image": "proxy"} for n in sidecars],
    }
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    status = {"phase": phase, "startTime": ago(start), "containerStatuses": statuses,
              "initContainerStatuses": list(init_statuses)}
    if reason:
        status["reason"] = reason
    return {"metadata": {"name": "build-1", "namespace": "ci", "resourceVersion": "42", "annotations": ann,
                         "labels": {p.LABEL_MANAGED: p.MODE_WAITER}},
            "spec": spec, "status": status}


READY = {p.ANNOTATION_READY: p.READY_TRUE}
OUTCOME = {p.ANNOTATION_OUTCOME: json.dumps({"result": "Succeeded", "sidecarsStoppedBy": "deadline",
                                              "decidedAt": "2024-05-01T11:59:00Z"})}
ALL_DONE = [done("fetch", end=40), done("build", end=30), done("completion", end=20)]

PROBE = ("http://127.0.0.1:15021/healthz/ready",)

# (id, pod, expected action kinds, expected outcome fields or None); "outcome+end": the
# outcome and activeDeadlineSeconds in one merge patch.
CASES = [
    ("pending-sidecar-not-ready", make_pod([waiting("istio-proxy"), waiting("fetch")], phase="Pending"), [], None),
    ("sidecar-ready-opens-gate", make_pod([running("istio-proxy"), running("fetch", ready=False)]), ["ready"], None),
    ("sidecar-ready-probe-gated", make_pod([running("istio-proxy"), running("fetch")], probes=PROBE), [], None),
    ("sidecar-running-not-ready", make_pod([running("istio-proxy", ready=False)]), [], None),
    ("no-sidecars-no-gate", make_pod([], phase="Pending", sidecars=()), [], None),
    ("native-sidecar-ready", make_pod([running("fetch")], sidecars=(), native=("istio-proxy",),
                                      init_statuses=[running("istio-proxy")]), ["ready"], None),
    ("native-sidecar-not-ready", make_pod([running("fetch")], sidecars=(), native=("istio-proxy",),
                                          init_statuses=[running("istio-proxy", ready=False)]), [], None),
    ("gate-open-steps-running", make_pod([running("istio-proxy"), running("fetch")], annotations=READY), [], None),
    ("sidecar-ready-timeout", make_pod([running("istio-proxy", ready=False)], start=601),
     ["outcome+end"], {"result": "Failed", "failed": "istio-proxy", "sidecarsStoppedBy": "deadline"}),
    ("sidecar-ready-timeout-probe-gated", make_pod([running("istio-proxy", ready=False)], start=601, probes=PROBE),
     ["outcome+end"], {"result": "Failed", "failed": "istio-proxy", "sidecarsStoppedBy": "deadline"}),
    ("all-done-sidecars-quit", make_pod(ALL_DONE + [terminated("istio-proxy", 0)], annotations=READY),
     ["outcome"], {"result": "Succeeded", "failed": None, "sidecarsStoppedBy": "quit"}),
    ("all-done-sidecar-in-grace", make_pod([done("fetch"), done("build"), done("completion", end=3),
                                            running("istio-proxy")], annotations=READY), [], None),
    ("all-done-sidecar-after-grace", make_pod(ALL_DONE + [running("istio-proxy")], annotations=READY),
     ["outcome+end"], {"result": "Succeeded", "sidecarsStoppedBy": "deadline"}),
    ("all-done-probe-gated-sidecar-after-grace", make_pod(ALL_DONE + [running("istio-proxy")], probes=PROBE),
     ["outcome+end"], {"result": "Succeeded", "sidecarsStoppedBy": "deadline"}),
    ("step-oomkilled-later-waiting", make_pod([terminated("fetch", 137, "OOMKilled"), running("build"),
                                               running("completion"), running("istio-proxy")], annotations=READY),
     ["outcome+end"], {"result": "Failed", "failed": "fetch", "sidecarsStoppedBy": "deadline"}),
    ("step-cannot-run-no-sidecars", make_pod([terminated("fetch", 128, "ContainerCannotRun"), running("build"),
                                              running("completion")], sidecars=(), annotations=READY),
     ["outcome+end"], {"result": "Failed", "failed": "fetch", "sidecarsStoppedBy": "none"}),
    ("step-failed-rest-skipped", make_pod([done("fetch"), done("build", 2, p.REASON_ERROR),
                                           done("completion", 2, p.REASON_SKIPPED), terminated("istio-proxy", 0)],
                                          annotations=READY),
     ["outcome"], {"result": "Failed", "failed": "build", "sidecarsStoppedBy": "quit"}),
    # The ones after a container that cannot start wait for its record for ever.
    ("step-failed-later-step-cannot-start", make_pod([done("fetch", 2, p.REASON_ERROR), waiting("build", "ImagePullBackOff"),
                                                      running("completion"), running("istio-proxy")],
                                                     annotations=READY),
     ["outcome+end"], {"result": "Failed", "failed": "fetch", "sidecarsStoppedBy": "deadline"}),
    ("step-failed-later-main-cannot-start", make_pod([done("fetch", 2, p.REASON_ERROR), done("build", 2, p.REASON_SKIPPED),
                                                      waiting("completion", "CreateContainerConfigError"),
                                                      terminated("istio-proxy", 0)], annotations=READY),
     ["outcome+end"], {"result": "Failed", "failed": "fetch"}),
    # Not yet: one between the failure and it still to run (it will, and skip); a step that
    # cannot start before any failure waits as the kubelet's init container would.
    ("step-failed-one-still-to-skip", make_pod([done("fetch", 2, p.REASON_ERROR), waiting("build"),
                                                waiting("test", "ImagePullBackOff"), running("completion"),
                                                running("istio-proxy")], steps=("fetch", "build", "test"),
                                               annotations=READY), [], None),
    ("step-cannot-start-before-a-failure", make_pod([done("fetch"), waiting("build", "ImagePullBackOff"),
                                                     running("completion"), running("istio-proxy")], annotations=READY),
     [], None),
    ("outcome-present-sidecar-after-grace", make_pod(ALL_DONE + [running("istio-proxy")],
                                                     annotations={**READY, **OUTCOME}), ["end"], None),
    ("outcome-present-sidecar-in-grace", make_pod([done("fetch"), done("build"), done("completion", end=2),
                                                   running("istio-proxy")], annotations={**READY, **OUTCOME}), [], None),
    ("outcome-present-pod-ended", make_pod(ALL_DONE + [terminated("istio-proxy", 137)], phase="Failed",
                                           annotations={**READY, **OUTCOME}, reason="DeadlineExceeded"), [], None),
    ("outcome-present-deadline-set", make_pod(ALL_DONE + [running("istio-proxy")], deadline=1,
                                              annotations={**READY, **OUTCOME}), [], None),
    ("evicted-mid-build", make_pod([done("fetch"), terminated("build", 137, "Error"), terminated("completion", 137),
                                    terminated("istio-proxy", 137)], phase="Failed", reason="Evicted",
                                   annotations=READY),
     ["outcome"], {"result": "Failed", "failed": "build"}),
    ("evicted-before-start", make_pod([waiting("fetch"), waiting("build"), waiting("completion")], phase="Failed",
                                      reason="Evicted", sidecars=()),
     ["outcome"], {"result": "Failed", "failed": "fetch", "sidecarsStoppedBy": "none"}),
    ("no-sidecars-all-done", make_pod(ALL_DONE, sidecars=(), annotations=READY),
     ["outcome"], {"result": "Succeeded", "sidecarsStoppedBy": "none"}),
    ("only-native-sidecars-all-done", make_pod(ALL_DONE, sidecars=(), native=("istio-proxy",),
                                               init_statuses=[running("istio-proxy")], annotations=READY),
     ["outcome"], {"result": "Succeeded", "sidecarsStoppedBy": "native"}),
    ("main-oomkilled-other-main-running", make_pod([done("fetch"), done("build"),
                                                    terminated("completion", 137, "OOMKilled"), running("report"),
                                                    running("istio-proxy")], mains=("completion", "report"),
                                                   annotations=READY), [], None),
    ("exit-0-without-record-is-success", make_pod([terminated("fetch", 0, finished_at=ago(40)),
                                                   terminated("build", 0, finished_at=ago(30)),
                                                   terminated("completion", 0, finished_at=ago(20)),
                                                   terminated("istio-proxy", 0)], annotations=READY),
     ["outcome"], {"result": "Succeeded"}),
]


def kinds_of(decision) -> list[str]:
    return [a.kind + ("+end" if a.kind == "outcome" and a.ends else "") for a in decision.actions]


@pytest.mark.parametrize("pod,kinds,fields", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decision_table(pod: dict, kinds: list[str], fields: dict | None) -> None:
    decision = decide(pod, NOW, W)
    assert kinds_of(decision) == kinds
    outcome = next((a.outcome for a in decision.actions if a.kind == "outcome"), None)
    if fields is not None:
        assert outcome is not None
        assert {k: outcome[k] for k in fields} == fields
        written = json.loads(next(a for a in decision.actions if a.kind == "outcome")
                             .patch["metadata"]["annotations"][p.ANNOTATION_OUTCOME])
        assert written == outcome
    for action in decision.actions:
        if action.kind == "end":
            assert action.patch == {"spec": {"activeDeadlineSeconds": 1}}
        if action.kind == "ready":
            assert action.patch == {"metadata": {"annotations": {p.ANNOTATION_READY: p.READY_TRUE}}}
        if action.kind == "outcome":
            assert action.patch.get("spec") == ({"activeDeadlineSeconds": 1} if action.ends else None)
        # What ends a pod or opens a gate goes first; an outcome that ends nothing after it.
        assert action.priority == (RECORD if action.kind == "outcome" and not action.ends else URGENT)


def test_waits_report_when_to_look_again() -> None:
    in_grace = make_pod([done("fetch"), done("build"), done("completion", end=3), running("istio-proxy")],
                        annotations=READY)
    assert decide(in_grace, NOW, W).requeue_after == pytest.approx(7.0)
    not_ready = make_pod([running("istio-proxy", ready=False)], start=100)
    assert decide(not_ready, NOW, W).requeue_after == pytest.approx(500.0)


def test_outcome_records_each_step_from_the_waiter_message() -> None:
    pod = make_pod(ALL_DONE[:1] + [done("build", 3, p.REASON_ERROR, end=30), done("completion", 3, p.REASON_SKIPPED),
                                   terminated("istio-proxy", 0)], annotations=READY)
    outcome = decide(pod, NOW, W).actions[0].outcome
    # Times come from the waiter's message (the child's run), not the container's.
    assert outcome["steps"] == [
        {"name": "fetch", "exitCode": 0, "reason": "Completed", "startedAt": ago(50), "finishedAt": ago(40)},
        {"name": "build", "exitCode": 3, "reason": "Error", "startedAt": ago(40), "finishedAt": ago(30),
         "message": "build exited 3"},
    ]
    assert outcome["mains"][0]["reason"] == p.REASON_SKIPPED
    assert outcome["message"].startswith("build failed: Error (exit 3)")
    assert outcome["decidedAt"] == format_time(NOW)


@pytest.mark.parametrize("code", [3, 0])  # --skip-fails (kpack's pod) or not
def test_a_skipped_main_without_a_record_of_its_own_is_read_as_skipped(code) -> None:
    """kpack's `completion` sets its own terminationMessagePath, so the waiter writes it no
    record: after a failed step it can only have been skipped, and the outcome says so with
    the waiter's words (not an `Error` of its own, nor a `Completed` that never ran)."""
    message = "skipped: step 'build' failed with exit code 3"
    pod = make_pod(ALL_DONE[:1] + [done("build", 3, p.REASON_ERROR, end=30), terminated("completion", code),
                                   terminated("istio-proxy", 0)], annotations=READY)
    outcome = decide(pod, NOW, W).actions[0].outcome
    assert (outcome["failed"], outcome["mains"][0]["reason"], outcome["mains"][0]["exitCode"]) == \
        ("build", p.REASON_SKIPPED, code)
    assert outcome["mains"][0]["message"] == message
    # Through a chain: a step the waiter recorded as skipped, then the main without a record.
    pod = make_pod([done("fetch", 3, p.REASON_ERROR), terminated("build", code, message=json.dumps({
        "name": "build", "exitCode": code, "reason": p.REASON_SKIPPED, "message": "skipped: step 'fetch' failed with "
        "exit code 3"})), terminated("completion", code), terminated("istio-proxy", 0)], annotations=READY)
    mains = decide(pod, NOW, W).actions[0].outcome["mains"]
    assert (mains[0]["reason"], mains[0]["message"]) == (p.REASON_SKIPPED, "skipped: step 'fetch' failed with exit code 3")


@pytest.mark.parametrize("change", ["ran", "on-failure", "signal", "other-code"])
def test_a_main_without_a_record_is_read_as_skipped_only_where_it_can_have_been(change) -> None:
    """Not after a step that succeeded, not under OnFailure (the waiter waits through a
    failure there), not with a signal or a code no skip exits with."""
    build = done("build", 0 if change == "ran" else 3, p.REASON_COMPLETED if change == "ran" else p.REASON_ERROR, end=30)
    completion = terminated("completion", 9 if change == "other-code" else 0 if change == "ran" else 3)
    if change == "signal":
        completion["state"]["terminated"]["signal"] = 15
    pod = make_pod(ALL_DONE[:1] + [build, completion, terminated("istio-proxy", 0)], annotations=READY)
    if change == "on-failure":
        pod["spec"]["restartPolicy"] = "OnFailure"
    assert read_runs(pod, layout(pod))["completion"].reason in ("Completed", "Error")


@pytest.mark.parametrize("own", [{"terminationMessagePath": "/tekton/termination"},
                                 {"terminationMessagePolicy": "FallbackToLogsOnError", "args": ["--termination-log"]}])
def test_a_step_that_leaves_no_record_by_design_fails_and_those_after_it_skip(own: dict) -> None:
    """A step whose termination message is not the waiter's record by design (its own path;
    FallbackToLogsOnError, whose record the waiter writes elsewhere) fails as a program does:
    the pod is not ended at once as one whose waiter never completed; those after it skip
    in milliseconds, and only if they have not after a grace is it ended."""
    def pod(finished_ago: float, later: dict) -> dict:
        obj = make_pod([terminated("fetch", 2, "Error", message="compile: error", finished_at=ago(finished_ago)),
                        later, running("completion"), running("istio-proxy")], annotations=READY)
        fetch = obj["spec"]["containers"][0]
        args = own.get("args")
        fetch.update({k: v for k, v in own.items() if k != "args"})
        if args:
            sep = fetch["args"].index(p.ARGV_SEPARATOR)
            fetch["args"][sep:sep] = [*args, "/initshift/run/0/termination-log"]
        return obj

    waiting_one = decide(pod(2, running("build")), NOW, W)
    assert waiting_one.actions == [] and 7.5 < waiting_one.requeue_after <= 8.0
    assert decide(slim_pod(pod(2, running("build"))), NOW, W) == waiting_one  # what the watcher keeps of it
    skipped = decide(pod(2, done("build", 2, p.REASON_SKIPPED)), NOW, W)
    assert kinds_of(skipped) == []  # the mains still to skip: the normal path
    (end,) = decide(pod(30, running("build")), NOW, W).actions
    assert end.ends and end.outcome["failed"] == "fetch"
    assert end.outcome["message"] == "fetch failed: Error (exit 2): compile: error; what follows it did not end within 10s"
    plain = make_pod([terminated("fetch", 2, "Error", finished_at=ago(2)), running("build"), running("completion"),
                      running("istio-proxy")], annotations=READY)  # its record expected: the waiter never completed
    assert decide(plain, NOW, W).actions[0].ends


def test_a_step_that_cannot_start_after_a_failure_ends_the_pod_naming_both() -> None:
    """Without initshift the pod ends Failed at once; here the step that cannot be created
    would never run to skip, and the pod would run on with its proxy."""
    pod = make_pod([done("fetch", 2, p.REASON_ERROR), waiting("build", "ErrImagePull"), running("completion"),
                    running("istio-proxy")], annotations=READY)
    (action,) = decide(pod, NOW, W).actions
    assert action.patch["spec"] == {"activeDeadlineSeconds": 1}
    assert action.outcome["message"] == "fetch failed: Error (exit 2): fetch exited 2; build cannot start (ErrImagePull)"
    assert [s["reason"] for s in action.outcome["steps"]] == [p.REASON_ERROR, "NotRun"]
    assert [m["reason"] for m in action.outcome["mains"]] == ["NotRun"]
    retried = make_pod(pod["status"]["containerStatuses"], annotations=READY)
    retried["spec"]["restartPolicy"] = "OnFailure"  # the kubelet runs fetch again: not final
    assert decide(retried, NOW, W).actions == []


def test_oomkilled_outcome_names_the_step_and_marks_the_rest_not_run() -> None:
    pod = make_pod([terminated("fetch", 137, "OOMKilled"), running("build"), running("completion"),
                    running("istio-proxy")], annotations=READY)
    outcome = decide(pod, NOW, W).actions[0].outcome
    assert outcome["steps"][0]["reason"] == "OOMKilled" and outcome["steps"][0]["exitCode"] == 137
    assert outcome["steps"][1] == {"name": "build", "exitCode": None, "reason": "NotRun",
                                   "startedAt": outcome["steps"][1]["startedAt"], "finishedAt": None}
    assert "OOMKilled" in outcome["message"]


def test_a_pod_its_own_deadline_ended_says_so_in_the_outcome() -> None:
    """The kubelet stops every container at the pod's activeDeadlineSeconds: each waiter
    records only the SIGTERM (as seen on a real kubelet). The outcome adds the pod's reason,
    else "killed by SIGTERM" would be all a user reads."""
    pod = make_pod([done("fetch", 143, p.REASON_ERROR), done("build", 143, p.REASON_ERROR),
                    done("completion", 143, p.REASON_SKIPPED), terminated("istio-proxy", 0)],
                   phase="Failed", reason="DeadlineExceeded", annotations=READY)
    pod["status"]["message"] = "Pod was active on the node longer than the specified deadline"
    outcome = decide(pod, NOW, W).actions[0].outcome
    assert (outcome["result"], outcome["failed"], outcome["sidecarsStoppedBy"]) == ("Failed", "fetch", "deadline")
    assert outcome["message"] == ("fetch failed: Error (exit 143): fetch exited 143 (the pod ended: DeadlineExceeded: "
                                  "Pod was active on the node longer than the specified deadline)")
    del pod["status"]["reason"], pod["status"]["message"]  # failed on its own: nothing to add
    assert decide(pod, NOW, W).actions[0].outcome["message"] == "fetch failed: Error (exit 143): fetch exited 143"


EVICTED = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
           "message": "Eviction API: evicting", "lastTransitionTime": "2024-05-01T11:59:50Z"}


@pytest.mark.parametrize("phase", ["Failed", "Running"])
def test_an_evicted_pod_says_so_in_the_outcome(phase: str) -> None:
    """A pod evicted (`kubectl drain`, the Eviction API) has no reason of its own: the
    apiserver's DisruptionTarget condition says why the kubelet stopped every container (seen
    on v1.34.9: the waiters' records said only "killed by SIGTERM"). Its containers can all
    be reported ended while its phase is still Running."""
    pod = make_pod([done("fetch", 143, p.REASON_ERROR), done("build", 143, p.REASON_STOPPED),
                    done("completion", 143, p.REASON_STOPPED), terminated("istio-proxy", 0)],
                   phase=phase, annotations=READY)
    pod["status"]["conditions"] = [EVICTED, {"type": "Ready", "status": "False", "reason": "PodCompleted",
                                             "lastTransitionTime": "2024-05-01T11:59:51Z"}]
    outcome = decide(slim_pod(pod), NOW, W).actions[0].outcome  # from what the watcher keeps of it
    assert (outcome["result"], outcome["failed"]) == ("Failed", "fetch")
    assert outcome["message"] == ("fetch failed: Error (exit 143): fetch exited 143 (the pod ended: "
                                  "EvictionByEvictionAPI: Eviction API: evicting)")
    pod["status"]["conditions"] = [{**EVICTED, "status": "False"}]  # not (or no longer) disrupted
    assert decide(pod, NOW, W).actions[0].outcome["message"] == "fetch failed: Error (exit 143): fetch exited 143"


def test_an_evicted_pod_ended_before_its_steps_ran_names_the_eviction() -> None:
    """Ended before every step ran (build never started): the eviction is why, not "pod Failed"."""
    pod = make_pod([done("fetch", 143, p.REASON_ERROR, end=10), waiting("build"),
                    done("completion", 143, p.REASON_STOPPED, end=10), terminated("istio-proxy", 137)],
                   phase="Failed", annotations=READY)
    pod["status"]["conditions"] = [EVICTED]
    assert decide(slim_pod(pod), NOW, W).actions[0].outcome["message"] == \
        "pod ended before fetch finished (EvictionByEvictionAPI: Eviction API: evicting)"


def deleting(pod: dict, asked: float, grace: int = 30) -> dict:
    """`pod` with its deletion asked for `asked` seconds ago with `grace` seconds to stop, as
    the apiserver records it (an eviction is one)."""
    pod["metadata"].update(deletionTimestamp=format_time(NOW - timedelta(seconds=asked - grace)),
                           deletionGracePeriodSeconds=grace)
    return pod


@pytest.mark.parametrize("phase", ["Running", "Failed"])
def test_a_deleted_pod_says_so_and_that_its_deletion_stopped_the_sidecars(phase: str) -> None:
    """A build deleted mid-step (`kubectl delete`, a cancelled CI run): the kubelet's SIGTERM
    stops every container, the proxy too, and the waiters record only the signal (as seen
    on v1.34.9). The outcome says when the pod was deleted and that the deletion, not the
    last main's quit, stopped the sidecars."""
    pod = deleting(make_pod([done("fetch", 143, p.REASON_ERROR, end=11), done("build", 143, p.REASON_STOPPED, end=11),
                             done("completion", 143, p.REASON_STOPPED, end=11),
                             terminated("istio-proxy", 0, finished_at=ago(11))], phase=phase, annotations=READY),
                   asked=12)
    decision = decide(slim_pod(pod), NOW, W)  # from what the watcher keeps of it
    assert [a.kind for a in decision.actions] == ["outcome"] and not decision.actions[0].ends
    outcome = decision.actions[0].outcome
    assert (outcome["result"], outcome["failed"], outcome["sidecarsStoppedBy"]) == ("Failed", "fetch", "deletion")
    assert outcome["message"] == "fetch failed: Error (exit 143): fetch exited 143 (the pod was deleted at " \
                                 "2024-05-01T11:59:48Z)"
    # Evicted: deleted too, the condition says why.
    pod["status"]["conditions"] = [EVICTED]
    outcome = decide(slim_pod(pod), NOW, W).actions[0].outcome
    assert outcome["sidecarsStoppedBy"] == "deletion" and outcome["message"].endswith(
        "(the pod ended: EvictionByEvictionAPI: Eviction API: evicting)")
    # Hybrid's native proxy: the kubelet stops it after the regular containers, as ever.
    native = deleting(make_pod([done("fetch", 143, p.REASON_ERROR, end=11), done("build", 143, p.REASON_STOPPED),
                                done("completion", 143, p.REASON_STOPPED)], sidecars=(), native=("istio-proxy",),
                               init_statuses=[terminated("istio-proxy", 0, finished_at=ago(10))], phase=phase,
                               annotations=READY), asked=12)
    assert decide(native, NOW, W).actions[0].outcome["sidecarsStoppedBy"] == "native"


def test_a_deletion_is_dated_by_its_first_ask_when_a_finalizer_holds_the_pod() -> None:
    """A pod a finalizer holds (a Job's), deleted mid-step: once every container has stopped,
    the kubelet deletes it again with no grace, and the apiserver moves `deletionTimestamp`
    to that moment (grace 0, seen on v1.34.9), after the steps' ends. The watcher that saw
    the first deletion dates it so (`deletion_seen`); the pod alone no longer can."""
    ends = [done("fetch", 143, p.REASON_ERROR, end=11), done("build", 143, p.REASON_STOPPED, end=11),
            done("completion", 143, p.REASON_STOPPED, end=11), terminated("istio-proxy", 0, finished_at=ago(11))]
    pod = deleting(make_pod(ends, phase="Failed", annotations=READY), asked=9, grace=0)  # the kubelet's delete
    first = NOW - timedelta(seconds=12)
    outcome = decide(slim_pod(pod), NOW, W, deletion_seen=first).actions[0].outcome
    assert (outcome["sidecarsStoppedBy"], outcome["message"]) == (
        "deletion", "fetch failed: Error (exit 143): fetch exited 143 (the pod was deleted at 2024-05-01T11:59:48Z)")
    # The earlier of the two is the ask: a sighting later than the pod's own does not move it.
    later = decide(slim_pod(deleting(make_pod(ends, phase="Failed", annotations=READY), asked=12)), NOW, W,
                   deletion_seen=NOW - timedelta(seconds=5)).actions[0].outcome
    assert later["message"].endswith("(the pod was deleted at 2024-05-01T11:59:48Z)")
    # Unseen (a watcher started after the kubelet's delete): told as the pod shows it.
    alone = decide(slim_pod(pod), NOW, W).actions[0].outcome
    assert (alone["sidecarsStoppedBy"], alone["message"]) == ("quit", "fetch failed: Error (exit 143): fetch exited 143")


def test_a_build_that_ended_before_its_pod_was_deleted_is_told_as_it_ended() -> None:
    """The steps failed and the proxy quit on their own, then the pod was deleted before the
    outcome was written (a watcher catching up): neither is the deletion's doing."""
    pod = deleting(make_pod([done("fetch", 2, p.REASON_ERROR, end=20), done("build", 0, p.REASON_SKIPPED, end=20),
                             done("completion", 0, p.REASON_SKIPPED, end=19),
                             terminated("istio-proxy", 0, finished_at=ago(19))], annotations=READY), asked=12)
    outcome = decide(pod, NOW, W).actions[0].outcome
    assert (outcome["sidecarsStoppedBy"], outcome["message"]) == ("quit", "fetch failed: Error (exit 2): fetch exited 2")


def test_a_pod_being_deleted_is_never_given_a_deadline() -> None:
    """The kubelet is ending a pod being deleted within its grace period: a deadline would add
    nothing but a wrong `sidecarsStoppedBy: deadline` (a proxy draining on its SIGTERM)."""
    draining = [done("fetch", 143, p.REASON_ERROR, end=15), done("build", 143, p.REASON_STOPPED, end=15),
                done("completion", 143, p.REASON_STOPPED, end=15), running("istio-proxy", started_at=ago(50))]
    decision = decide(deleting(make_pod(draining, annotations=READY), asked=16), NOW, W)  # past the grace
    assert [(a.kind, a.ends) for a in decision.actions] == [("outcome", False)]
    assert decision.actions[0].outcome["sidecarsStoppedBy"] == "deletion"
    # Not deleted: the watcher ends it.
    assert decide(make_pod(draining, annotations=READY), NOW, W).actions[0].ends
    # The outcome written before: nothing more.
    assert decide(deleting(make_pod(draining, annotations=OUTCOME), asked=16), NOW, W).actions == []
    # A sidecar never Ready when the deletion came: failed at its timeout, the pod left to the kubelet.
    unready = [running("fetch", started_at=ago(50)), waiting("build"), waiting("completion"),
               running("istio-proxy", ready=False, started_at=ago(50))]
    late = decide(deleting(make_pod(unready, start=700), asked=5), NOW, W)
    assert [(a.kind, a.ends) for a in late.actions] == [("outcome", False)]
    assert late.actions[0].outcome["sidecarsStoppedBy"] == "deletion"


def test_a_deleted_pod_ended_before_its_steps_ran_names_the_deletion() -> None:
    pod = deleting(make_pod([done("fetch", 143, p.REASON_ERROR, end=10), waiting("build"),
                             done("completion", 143, p.REASON_STOPPED, end=10), terminated("istio-proxy", 0)],
                            phase="Failed", annotations=READY), asked=12)
    outcome = decide(slim_pod(pod), NOW, W).actions[0].outcome
    assert outcome["message"] == "pod ended before fetch finished (the pod was deleted at 2024-05-01T11:59:48Z)"


def test_an_ended_pod_still_showing_a_step_running_waits_for_its_end() -> None:
    """The kubelet can publish a pod's terminal phase before the ends of the containers it
    then stops (seen on v1.34.9): the outcome waits for them, up to the pod's grace period
    and `_REPORT_SECONDS` after its last reported change, rather than call them NotRun."""
    first_word = [done("fetch", 143, p.REASON_ERROR, end=4), running("build", started_at=ago(30)),
                  running("completion", started_at=ago(30)), terminated("istio-proxy", 0, finished_at=ago(4))]
    pod = make_pod(first_word, phase="Failed", reason="DeadlineExceeded", annotations=READY)
    pod["spec"]["terminationGracePeriodSeconds"] = 20
    waits = decide(pod, NOW, W)
    assert waits.actions == [] and waits.requeue_after == pytest.approx(20 + 5 - 4)
    pod["status"]["conditions"] = [{"type": "Ready", "status": "False", "lastTransitionTime": ago(1)}]
    assert decide(pod, NOW, W).requeue_after == pytest.approx(20 + 5 - 1), "counted from the last change"
    del pod["spec"]["terminationGracePeriodSeconds"]
    assert decide(pod, NOW, W).requeue_after == pytest.approx(30 + 5 - 1), "the apiserver's default grace"
    # The ends come: the outcome has them.
    ended = make_pod(first_word[:1] + [done("build", 143, p.REASON_STOPPED, end=3),
                                       done("completion", 143, p.REASON_STOPPED, end=3)] + first_word[3:],
                     phase="Failed", reason="DeadlineExceeded", annotations=READY)
    outcome = decide(ended, NOW, W).actions[0].outcome
    assert [r["reason"] for r in outcome["steps"] + outcome["mains"]] == ["Error", "Stopped", "Stopped"]
    # They never come (a lost node): written once the wait is over, the rest NotRun.
    late = decide(pod, NOW + timedelta(seconds=35), W)
    assert late.requeue_after is None and late.actions[0].kind == "outcome"
    assert [r["reason"] for r in late.actions[0].outcome["steps"]] == ["Error", "NotRun"]
    # Containers that never started (waiting) have no end to come: written at once.
    never = make_pod([done("fetch", 143, p.REASON_ERROR, end=4), waiting("build"), waiting("completion")],
                     phase="Failed", reason="DeadlineExceeded", annotations=READY)
    assert [a.kind for a in decide(never, NOW, W).actions] == ["outcome"]


def test_a_run_stopped_before_it_started_is_not_the_failure() -> None:
    """A waiter's `Stopped` record (a signal before its command started: the pod was going
    away) fails no more for its own reason than a `Skipped` one: the outcome names the run
    that did fail, wherever it comes in the order."""
    pod = make_pod([done("fetch"), done("lint", 143, p.REASON_STOPPED), done("test", 2, p.REASON_ERROR),
                    terminated("istio-proxy", 0)], steps=("fetch",), mains=("lint", "test"), annotations=READY)
    outcome = decide(pod, NOW, W).actions[0].outcome
    assert (outcome["result"], outcome["failed"]) == ("Failed", "test")
    assert [m["reason"] for m in outcome["mains"]] == [p.REASON_STOPPED, p.REASON_ERROR]


def test_outcome_patch_is_conditional_on_the_resource_version() -> None:
    pod = make_pod(ALL_DONE + [terminated("istio-proxy", 0)], annotations=READY)
    assert decide(pod, NOW, W).actions[0].patch["metadata"]["resourceVersion"] == "42"


def test_legacy_pod_without_mains_annotation() -> None:
    pod = make_pod(ALL_DONE + [running("istio-proxy")], annotations=READY, mains_annotation=False)
    lay = layout(pod)
    assert (lay.steps, lay.mains, lay.sidecars) == (["fetch", "build"], ["completion"], ["istio-proxy"])
    assert kinds_of(decide(pod, NOW, W)) == ["outcome+end"]


def test_the_gate_seen_open_is_not_failed_by_a_sidecar_that_turns_unready_later() -> None:
    """A gate of loopback probes leaves nothing on the pod: the caller tells decide() it saw
    every sidecar Ready, and a sidecar not Ready after the timeout then fails nothing."""
    later = make_pod([running("istio-proxy", ready=False), running("fetch")], start=601, probes=PROBE)
    assert kinds_of(decide(later, NOW, W)) == ["outcome+end"]
    assert decide(later, NOW, W, gate_seen_open=True).actions == []
    ready = make_pod([running("istio-proxy"), running("fetch")], start=30, probes=PROBE)
    assert decide(ready, NOW, W).gate_open and not decide(later, NOW, W).gate_open
    # A pod that reads the annotation is not opened by what the caller saw: it waits for it.
    gated = make_pod([running("istio-proxy"), running("fetch")], start=30)
    assert kinds_of(decide(gated, NOW, W, gate_seen_open=True)) == ["ready"]


def test_a_command_the_waiter_started_shows_the_gate_opened_to_a_watcher_that_did_not_see_it() -> None:
    """A watcher that restarted while a probe-gated pod's sidecar was not Ready: a step whose
    command the waiter started (it succeeded, failed or timed out) passed the gate, so the
    pod is not failed for its sidecar; a step that started none (skipped, stopped, the
    waiter's own error) says nothing."""
    for fetch in (done("fetch", end=400), done("fetch", 1, p.REASON_ERROR, end=400),
                  done("fetch", 124, p.REASON_TIMED_OUT, end=400)):
        pod = make_pod([running("istio-proxy", ready=False), fetch, running("build"), running("completion")],
                       start=601, probes=PROBE)
        first = decide(pod, NOW, W)
        assert first.gate_open and "outcome+end" not in kinds_of(first), fetch
    for fetch in (running("fetch"), done("fetch", 2, p.REASON_WAITER_ERROR, end=400),
                  done("fetch", 143, p.REASON_STOPPED, end=400)):
        unknown = make_pod([running("istio-proxy", ready=False), fetch, running("build"), running("completion")],
                           start=601, probes=PROBE)
        assert not decide(unknown, NOW, W).gate_open
        assert kinds_of(decide(unknown, NOW, W)) == ["outcome+end"]
    # A pod that reads the annotation waits for it, whatever its steps say.
    gated = make_pod([running("istio-proxy"), done("fetch", end=400), running("build"), running("completion")],
                     start=30)
    assert kinds_of(decide(gated, NOW, W)) == ["ready"]


def test_a_watcher_that_came_while_step_0_ran_counts_the_sidecar_timeout_from_then() -> None:
    """A probe-gated pod's gate leaves no mark while step 0 runs: a watcher that first saw
    the pod after step 0 started (a restart, a rollout) gives the sidecars the whole timeout
    from then, so a build whose proxy is not Ready at that moment is not failed for it; one
    that saw the pod from its start, or whose step 0 has not started, counts from the start."""
    pod = make_pod([running("istio-proxy", ready=False), running("fetch")], start=601, probes=PROBE)
    later = decide(pod, NOW, W, watched_since=NOW - timedelta(seconds=10))
    assert later.actions == [] and later.requeue_after == pytest.approx(590)
    assert kinds_of(decide(pod, NOW + timedelta(seconds=590), W, watched_since=NOW - timedelta(seconds=10))) == \
        ["outcome+end"], "a gate that never opened is failed a timeout after the watcher came"
    for since in (None, NOW - timedelta(seconds=601), NOW - timedelta(seconds=700)):
        assert kinds_of(decide(pod, NOW, W, watched_since=since)) == ["outcome+end"], since
    not_started = make_pod([running("istio-proxy", ready=False), waiting("fetch")], start=601, probes=PROBE)
    assert kinds_of(decide(not_started, NOW, W, watched_since=NOW)) == ["outcome+end"], "no gate opened yet"
    # The ready annotation is the mark of a gate that reads it: its absence is news.
    gated = make_pod([running("istio-proxy", ready=False), running("fetch")], start=601)
    assert kinds_of(decide(gated, NOW, W, watched_since=NOW)) == ["outcome+end"]


def test_the_ready_annotation_only_where_the_gate_reads_it() -> None:
    """The rule is read from the pod itself: step 0's (or, without steps, the mains') waiter
    command line, as the rewrite wrote it."""
    statuses = [running("istio-proxy"), running("fetch"), running("build"), running("completion")]
    assert layout(make_pod(statuses)).ready_readers == {"fetch"}
    assert layout(make_pod(statuses, probes=PROBE)).ready_readers == frozenset()
    jobs = make_pod([running("istio-proxy"), running("a"), running("b")], steps=(), mains=("a", "b"))
    assert layout(jobs).ready_readers == {"a", "b"} and kinds_of(decide(jobs, NOW, W)) == ["ready"]
    assert layout(make_pod(statuses, sidecars=())).ready_readers == frozenset()


def test_extra_sidecar_injected_after_the_webhook_is_a_sidecar() -> None:
    pod = make_pod([running("istio-proxy"), running("vault-agent", ready=False)], sidecars=("istio-proxy", "vault-agent"))
    assert decide(pod, NOW, W).actions == []


def test_garbage_annotations_do_not_crash() -> None:
    statuses = [running(n) for n in ("fetch", "build", "completion", "istio-proxy")]
    pod = make_pod(statuses, annotations={p.ANNOTATION_STEPS: "{not json", p.ANNOTATION_MAINS: "7"})
    # Every container is then a sidecar: only the ready gate applies, never an outcome.
    assert [a.kind for a in decide(pod, NOW, W).actions] == ["ready"]


# --- property: applying a decision's patches never leads to a second outcome ------------
_STATE = st.sampled_from(["waiting", "running", "ok", "fail", "skipped", "oom", "plain0"])


def _status(name: str, state: str, end: float) -> dict:
    return {"waiting": lambda: waiting(name), "running": lambda: running(name),
            "ok": lambda: done(name, end=end), "fail": lambda: done(name, 1, p.REASON_ERROR, end=end),
            "skipped": lambda: done(name, 1, p.REASON_SKIPPED, end=end),
            "oom": lambda: terminated(name, 137, "OOMKilled", finished_at=ago(end)),
            "plain0": lambda: terminated(name, 0, finished_at=ago(end))}[state]()


@hsettings(max_examples=150, deadline=None)
@given(states=st.lists(_STATE, min_size=4, max_size=4), sidecar=st.sampled_from(["ready", "unready", "gone", "none"]),
       phase=st.sampled_from(["Pending", "Running", "Failed", "Succeeded"]),
       end=st.floats(min_value=0, max_value=30), start=st.floats(min_value=0, max_value=700),
       ready=st.booleans(), probes=st.booleans(), seen=st.booleans(), deleted=st.booleans())
def test_decisions_are_idempotent(states, sidecar, phase, end, start, ready, probes, seen, deleted) -> None:
    names = ["a", "b", "c", "m"]
    statuses = [_status(n, s, end) for n, s in zip(names, states)]
    sidecars = () if sidecar == "none" else ("istio-proxy",)
    if sidecar != "none":
        statuses.append({"ready": running("istio-proxy"), "unready": running("istio-proxy", ready=False),
                         "gone": terminated("istio-proxy", 0)}[sidecar])
    pod = make_pod(statuses, phase=phase, steps=names[:3], mains=("m",), sidecars=sidecars, start=start,
                   annotations=READY if ready else None, probes=PROBE if probes else ())
    if deleted:
        deleting(pod, asked=end + 1)
    first = decide(pod, NOW, W, gate_seen_open=seen)
    kinds = [a.kind for a in first.actions]
    assert not (deleted and any(a.ends for a in first.actions)), "a pod being deleted given a deadline"
    # At most one patch per kind, and never more than the gate and the outcome (the deadline
    # comes inside the outcome's patch).
    assert len(kinds) == len(set(kinds)) and "end" not in kinds and len(kinds) <= 2
    assert "ready" not in kinds or layout(pod).reads_ready
    after = pod
    for action in first.actions:
        after = merge_patch(after, {k: v for k, v in action.patch.items()})
        after["metadata"]["resourceVersion"] = "43"
    again = decide(after, NOW, W, gate_seen_open=seen or first.gate_open)
    assert [a.kind for a in again.actions if a.kind in ("outcome", "ready", "end")] == []


# --- start-order pods: per-container ready annotations ----------------------------------------
def start_order_pod(statuses: list[dict], annotations: dict | None = None) -> dict:
    return {"metadata": {"name": "app", "namespace": "web", "labels": {p.LABEL_MANAGED: p.MANAGED_START_ORDER},
                         "annotations": {p.ANNOTATION_START_ORDER: "cache;app", **(annotations or {})}},
            "spec": {"containers": [{"name": "cache"}, {"name": "app"}],
                     "volumes": [{"name": p.CONTAINER_READY_VOLUME, "downwardAPI": {"items": [
                         {"path": "cache",
                          "fieldRef": {"fieldPath": f"metadata.annotations['{p.ANNOTATION_READY_PREFIX}cache']"}}]}}]},
            "status": {"phase": "Running", "containerStatuses": statuses}}


@pytest.mark.parametrize("statuses,annotations,expected", [
    ([running("cache")], {}, {"cache": "true"}),
    ([running("cache", ready=False)], {}, {"cache": "false"}),
    ([running("cache")], {f"{p.ANNOTATION_READY_PREFIX}cache": "true"}, None),
    ([running("cache", ready=False)], {f"{p.ANNOTATION_READY_PREFIX}cache": "true"}, {"cache": "false"}),
])
def test_start_order_ready_annotations_follow_the_kubelet(statuses, annotations, expected) -> None:
    decision = decide(start_order_pod(statuses, annotations), NOW, W)
    if expected is None:
        assert decision.actions == []
        return
    (action,) = decision.actions
    assert action.kind == "container-ready" and action.priority == URGENT  # it opens a gate
    assert action.patch == {"metadata": {"annotations": {f"{p.ANNOTATION_READY_PREFIX}{k}": v
                                                         for k, v in expected.items()}}}


def killed_with_record(name: str, kubelet_reason: str, *, signal: int | None = None, end: float = 30) -> dict:
    """The waiter survived its child and recorded how it died; the kubelet reports the container."""
    record = json.dumps({"name": name, "exitCode": 137, "reason": p.REASON_ERROR, "startedAt": ago(end + 10),
                         "finishedAt": ago(end), "message": "killed by SIGKILL"})
    status = terminated(name, 137, kubelet_reason, message=record, started_at=ago(end + 11), finished_at=ago(end))
    if signal is not None:
        status["state"]["terminated"]["signal"] = signal
    return status


@pytest.mark.parametrize("kubelet_reason,signal,named", [
    ("OOMKilled", None, "OOMKilled"), ("Evicted", None, "Evicted"), ("Error", 9, "Error"),
])
def test_the_kubelets_reason_is_named_with_the_waiters_record_beside(kubelet_reason: str, signal: int | None,
                                                                     named: str) -> None:
    pod = make_pod([done("fetch", end=40), killed_with_record("build", kubelet_reason, signal=signal),
                    done("completion", 137, p.REASON_SKIPPED, end=29), terminated("istio-proxy", 0)],
                   annotations=READY)
    outcome = next(a.outcome for a in decide(pod, NOW, W).actions if a.kind == "outcome")
    build = outcome["steps"][1]
    assert outcome["failed"] == "build" and build["reason"] == named and build["exitCode"] == 137
    assert build["waiter"] == {"exitCode": 137, "reason": p.REASON_ERROR, "message": "killed by SIGKILL"}
    assert build.get("signal") == signal
    assert outcome["message"].startswith(f"build failed: {named} (exit 137")
    assert "the waiter recorded Error (exit 137): killed by SIGKILL" in outcome["message"]
    assert build["finishedAt"] == ago(30)  # the waiter's own times stay


def test_a_plain_kubelet_error_leaves_the_waiters_record_alone() -> None:
    pod = make_pod([done("fetch", end=40), killed_with_record("build", "Error"),
                    done("completion", 137, p.REASON_SKIPPED, end=29), terminated("istio-proxy", 0)],
                   annotations=READY)
    build = next(a.outcome for a in decide(pod, NOW, W).actions if a.kind == "outcome")["steps"][1]
    assert build["reason"] == p.REASON_ERROR and "waiter" not in build and build["message"] == "killed by SIGKILL"


@given(st.text(max_size=400), st.integers(2, 300))
def test_a_clipped_message_keeps_its_start_and_its_end(text: str, limit: int) -> None:
    got = clip(text, limit)
    assert len(got) <= limit
    if len(text) <= limit:
        assert got == text
    else:
        assert len(got) == limit
        assert any(got[i] == "…" and text.startswith(got[:i]) and text.endswith(got[i + 1:]) and i <= limit - 1 - i
                   for i in range(limit)), "the start, a mark, the end (the longer part)"


def test_a_success_record_wins_over_a_later_kill() -> None:
    """The child finished its work (the waiter recorded Completed) before the container was killed."""
    status = done("build", end=30)
    status["state"]["terminated"]["reason"] = "OOMKilled"
    pod = make_pod([done("fetch", end=40), status, done("completion", end=20), terminated("istio-proxy", 0)],
                   annotations=READY)
    outcome = next(a.outcome for a in decide(pod, NOW, W).actions if a.kind == "outcome")
    assert outcome["result"] == "Succeeded" and outcome["steps"][1]["reason"] == p.REASON_COMPLETED


def test_notices_follow_the_actions_done() -> None:
    """One Event per pod on the happy path: the outcome's, which says how the sidecars
    stopped; a deadline gets one of its own only when it was set apart from the outcome."""
    from webhook.watcher._decide import notices

    assert notices(make_pod([running("istio-proxy")]), NOW) == []
    assert notices(make_pod([], annotations=READY), NOW) == [], "the ready annotation is no news"
    with_deadline = make_pod([], annotations={**READY, **OUTCOME}, deadline=1)
    assert [(n.kind, n.reason, n.warning) for n in notices(with_deadline, NOW)] == [
        ("outcome", "StepsSucceeded", False)]
    quit_first = {p.ANNOTATION_OUTCOME: json.dumps({"result": "Failed", "message": "x", "sidecarsStoppedBy": "quit",
                                                    "decidedAt": "2024-05-01T11:59:00Z"})}
    ended_apart = make_pod([], annotations=quit_first, deadline=1)
    assert [(n.kind, n.reason, n.warning) for n in notices(ended_apart, NOW)] == [
        ("outcome", "StepsFailed", True), ("end", "SidecarsEnded", True)]
    pod = make_pod(ALL_DONE + [running("istio-proxy")], annotations=READY)
    (action,) = decide(pod, NOW, W).actions
    (notice,) = notices(merge_patch(pod, action.patch), NOW)
    assert notice.message == "Succeeded: 2 steps and 1 main succeeded; sidecars stopped by deadline"
    start_order = make_pod([], annotations={**READY, **OUTCOME})
    start_order["metadata"]["labels"][p.LABEL_MANAGED] = p.MANAGED_START_ORDER
    assert notices(start_order, NOW) == []


def test_an_outcome_is_news_for_a_few_minutes_only() -> None:
    """A watcher that starts long after an outcome (its Event expired, after the apiserver's
    Event TTL) does not write that Event again; one without `decidedAt` is not initshift's."""
    from webhook.watcher._decide import EVENT_NEWS_SECONDS, notices

    ended_apart = make_pod([], annotations=OUTCOME, deadline=1)
    decided = NOW - timedelta(minutes=1)
    assert [n.kind for n in notices(ended_apart, decided + timedelta(seconds=EVENT_NEWS_SECONDS))] == ["outcome"]
    assert notices(ended_apart, decided + timedelta(seconds=EVENT_NEWS_SECONDS + 1)) == []
    assert notices(ended_apart, NOW + timedelta(hours=2)) == []
    undated = {p.ANNOTATION_OUTCOME: json.dumps({"result": "Succeeded", "sidecarsStoppedBy": "deadline"})}
    assert notices(make_pod([], annotations=undated, deadline=1), NOW) == []


@given(st.sampled_from([c[1] for c in CASES]))
@hsettings(max_examples=40, deadline=None)
def test_the_slim_pod_decides_as_the_whole_pod(pod: dict) -> None:
    from webhook.watcher._decide import notices, slim_pod

    fat = json.loads(json.dumps(pod))
    fat["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = "x" * 5000
    for c in fat["spec"]["containers"]:
        c.update(env=[{"name": "A", "value": "b"}], resources={"limits": {"memory": "1Gi"}})
        c["args"] = [*c["args"], *["--verbose"] * 50] if "args" in c else ["-v"]  # the user's argv, long
    for s in fat["status"]["containerStatuses"]:
        s.update(imageID="sha256:" + "0" * 64, containerID="containerd://" + "1" * 64)
    slim = slim_pod(fat)
    assert decide(slim, NOW, W) == decide(fat, NOW, W) and notices(slim, NOW) == notices(fat, NOW)
    assert layout(slim).ready_readers == layout(fat).ready_readers
    assert len(json.dumps(slim)) < len(json.dumps(fat)) / 2
