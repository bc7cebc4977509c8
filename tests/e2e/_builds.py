"""Build pods: what users rely on when their steps run as init containers under a mesh."""

from __future__ import annotations

import json
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor

from waiter import protocol as p
from webhook.rewrite import rewrite
from webhook.rewrite._quota import exceeded
from webhook.settings import Settings
from tests.support.waiter_support import has_signal, parse_status

from ._check import check_build, proxy_instant, proxy_stop, record_times
from ._env import Env, Record, initshift, native_only, own_cluster, scenario, waiter_modes
from ._kube import KubeFailure, kubectl, wait_for
from ._mesh import ISTIO_TRAFFIC, LINKERD_TRAFFIC, NO_QUIT
from ._pods import annotations, container_names, first, log_lines, managed, ms, outcome, pod, statuses, step, \
    terminated, wait_end

KPACK = ["prepare", "analyze", "detect", "restore", "build", "export"]
ARGV = ["a b", "it's", "*", "", "--flag=1 2", "$HOME"]


def reviews_in(env: Env, ns: str) -> list[dict]:
    """The server's log lines of the reviews of namespace `ns`, in order."""
    return [json.loads(line) for line in env.install.server.log.read_text(errors="replace").splitlines()
            if '"initshift.review"' in line and f'"namespace":"{ns}"' in line]


def _build_pod(env: Env, name: str, steps: list[dict], *, main: str = "completion", **kw) -> dict:
    return pod(name, steps, [step(main, env.images.busybox, port=None)], **kw)


def check_default_logs(env: Env, ns: str, name: str, main: str = "completion") -> None:
    """`kubectl logs POD` without `-c` prints the main's lines: the pod names its default
    container (kubectl says on stderr which it took when it had to pick the first one)."""
    out = kubectl(env.admin, "logs", "-n", ns, name)
    assert "Defaulted container" not in out.stderr, out.stderr
    named = annotations(env.kube.get(f"/api/v1/namespaces/{ns}/pods/{name}")).get(p.DEFAULT_CONTAINER_ANNOTATION)
    # The waiter's own line about quitting the proxy (stderr) comes after the main's under the
    # waiter strategy, but the runtime reads stdout and stderr apart: the log may hold it first.
    mains = [line for line in out.stdout.splitlines() if not line.startswith(f"{p.WAITER_LOG_PREFIX}[")]
    assert mains[:2] == [f"{main} start", f"{main} end"], \
        f"`kubectl logs {name}` took {named!r}, not {main!r}: {out.stdout!r}"


@scenario("kpack-build")
def kpack_build(env: Env, rec: Record) -> None:
    """A kpack-shaped build under an Istio-like proxy: steps in order, each through the proxy, argv kept."""
    ns = env.namespace("kpack")
    rec.namespaces.append(ns)
    steps = [step(s, env.images.busybox, port=ISTIO_TRAFFIC) for s in KPACK]
    # argv kept: command + args as lists, with spaces, quotes, globs and an empty word
    steps[0] = {**steps[0], "command": ["sh", "-c"],
                "args": [steps[0]["command"][2] + '; printf "[%s]" "$@"; echo', "prepare", *ARGV]}
    env.kube.create(f"/api/v1/namespaces/{ns}/pods", _build_pod(env, "build", steps, annotations={
        "sidecar.istio.io/inject": "true"}))
    build = check_build(env, rec, ns, "build", steps=KPACK, proxy="istio-proxy", strategy=env.build_strategy)
    argv = "".join(f"[{a}]" for a in ARGV)
    assert first(build.steps["prepare"], "^" + re.escape(argv) + "$"), \
        f"prepare's argv changed: {[line.text for line in build.steps['prepare']]}"
    result = outcome(env.kube, ns, "build")
    assert result["result"] == "Succeeded", result
    assert [s["name"] for s in result["steps"]] == KPACK, result
    check_default_logs(env, ns, "build")
    rec.note(f"strategy {managed(build.obj)}; {len(KPACK)} steps in order through the proxy; argv kept; "
             f"proxy stopped by {proxy_stop(build, 'istio-proxy')}; `kubectl logs` shows completion's")
    rec.figure("ready -> step 0", build.ready_to_step0_ms or 0)
    rec.figure("step span", build.span_s or 0, "s")


@scenario("failing-step")
def failing_step(env: Env, rec: Record) -> None:
    """A failing middle step: the pod fails, later steps never run, the proxy ends."""
    ns = env.namespace("fail")
    rec.namespaces.append(ns)
    steps = [step("fetch", env.images.busybox, port=ISTIO_TRAFFIC),
             step("test", env.images.busybox, port=ISTIO_TRAFFIC, exit_code=3),
             step("publish", env.images.busybox, port=ISTIO_TRAFFIC)]
    env.kube.create(f"/api/v1/namespaces/{ns}/pods", _build_pod(env, "build", steps))
    obj = wait_end(env.kube, ns, "build")
    assert obj["status"]["phase"] == "Failed", obj["status"]["phase"]
    assert managed(obj) == env.build_strategy, managed(obj)
    test = log_lines(env.kube, ns, "build", "test")
    assert first(test, "^test fetched ") and first(test, "^test failing with 3$"), [x.text for x in test]
    publish = log_lines(env.kube, ns, "build", "publish")
    assert not first(publish, "^publish start$"), f"publish ran after a failed step: {[x.text for x in publish]}"
    result = outcome(env.kube, ns, "build")
    assert result["result"] == "Failed" and result.get("failed") == "test", result
    code = next(s["exitCode"] for s in result["steps"] if s["name"] == "test")
    assert code == 3, result
    skipped = next(s for s in result["steps"] if s["name"] == "publish")
    assert skipped["reason"] == p.REASON_SKIPPED and skipped["exitCode"] == 0, skipped  # as if never started
    proxy_end = wait_for(lambda: terminated(env.kube.pod(ns, "build") or {}, "istio-proxy"), 60,
                         "istio-proxy to end")
    rec.note(f"strategy {managed(obj)}; outcome Failed at 'test' (exit {code}); publish never ran (Skipped, "
             f"exit 0); istio-proxy exit {proxy_end.get('exitCode')}")


def _kpack_verdict(obj: dict) -> str:
    """What kpack's build controller makes of its ended build pod (conditionForPod and
    podCompletedWithActiveDeadline, pkg/reconciler/build/build.go): a pod that failed by a
    deadline while `completion` had exited 0 is a built image."""
    phase, done = obj["status"]["phase"], terminated(obj, "completion") or {}
    if phase == "Succeeded" or (phase == "Failed" and obj["status"].get("reason") == "DeadlineExceeded"
                                and done.get("exitCode") == 0):
        return "Succeeded"
    return "Failed" if phase == "Failed" else "Unknown"


@scenario("kpack-failed-build")
def kpack_failed_build(env: Env, rec: Record) -> None:
    """A kpack-shaped build owned by a controller (not a Job) whose `build` step fails, under
    each strategy the waiter runs, with kpack's own reading: its controller sets
    `activeDeadlineSeconds: 1` once `completion` has ended while a sidecar runs (here a proxy
    that refuses the quit), and takes such a pod with `completion` at exit 0 for a built
    image. The skipped `export` and `completion` exit with the failed step's code, so kpack
    reads a failed build; the outcome names `build`, and `completion` (its own
    terminationMessagePath, as kpack's: no record of the waiter's) as skipped."""
    ns = env.namespace("kpackfail")
    rec.namespaces.append(ns)
    # The controller: any object kind works for the kubelet and the garbage collector; kpack's Build is not served here.
    owner = env.kube.create(f"/api/v1/namespaces/{ns}/configmaps", {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "build-owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "build-owner", "uid": owner["metadata"]["uid"],
           "controller": True}
    notes = []
    for mode in waiter_modes(env):
        name = f"build-{mode}"
        steps = [step(s, env.images.busybox, port=ISTIO_TRAFFIC, exit_code=51 if s == "build" else 0) for s in KPACK]
        body = _build_pod(env, name, steps, annotations={p.ANNOTATION_MODE: mode, NO_QUIT: "true",
                                                         "sidecar.istio.io/inject": "true"})
        body["metadata"]["ownerReferences"] = [ref]
        # kpack's completion writes its build metadata to a path of its own: the waiter leaves it alone.
        body["spec"]["containers"][0]["terminationMessagePath"] = "/tmp/metadata"
        env.kube.create(f"/api/v1/namespaces/{ns}/pods", body)
        set_deadline = []

        def kpack_controller() -> dict | None:
            obj = env.kube.pod(ns, name) or {}
            phase = obj.get("status", {}).get("phase")
            if phase == "Running" and terminated(obj, "completion") and not set_deadline:
                env.kube.patch(f"/api/v1/namespaces/{ns}/pods/{name}", {"spec": {"activeDeadlineSeconds": 1}})
                set_deadline.append(True)
            return obj if phase in ("Succeeded", "Failed") else None

        obj = wait_for(kpack_controller, 240, f"{name} to end", interval=0.2)
        assert managed(obj) == mode, managed(obj)
        codes = {n: (terminated(obj, n) or {}).get("exitCode") for n in ("build", "export", "completion")}
        assert codes == {"build": 51, "export": 51, "completion": 51}, codes
        assert not first(log_lines(env.kube, ns, name, "completion"), "^completion start$"), "completion ran"
        verdict = _kpack_verdict(obj)
        assert verdict == "Failed", (verdict, obj["status"].get("reason"), codes)
        result = outcome(env.kube, ns, name)
        assert result["result"] == "Failed" and result.get("failed") == "build", result
        # No record of the waiter's on completion: the watcher reads its skip from the order.
        main = result["mains"][0]
        assert (main["reason"], main.get("message")) == (p.REASON_SKIPPED, "skipped: step 'build' failed with exit "
                                                                               "code 51"), main
        notes.append(f"{mode}: build 51, export and completion skipped with 51, pod {obj['status'].get('reason') or 'Failed'}"
                     f"{' after kpack-style deadline' if set_deadline else ''}, kpack reads {verdict}")
    rec.note("; ".join(notes))


@scenario("debug-copy")
def debug_copy(env: Env, rec: Record) -> None:
    """`kubectl debug --copy-to` of a failed build with the failing step's command replaced,
    under each strategy the cluster runs: with the pod's labels, annotations and probes
    kept, the new command runs in the step's place, in order, and the copy succeeds; with
    kubectl's defaults (labels dropped) a waiter or hybrid copy is admitted unchanged and
    kubectl prints initshift's warning naming the flags."""
    ns = env.namespace("dbgcopy")
    rec.namespaces.append(ns)
    modes = [*waiter_modes(env), *((p.MODE_NATIVE,) if env.native else ())]
    for mode in modes:
        steps = [step("fetch", env.images.busybox, port=ISTIO_TRAFFIC),
                 step("test", env.images.busybox, port=ISTIO_TRAFFIC, exit_code=3)]
        env.kube.create(f"/api/v1/namespaces/{ns}/pods", _build_pod(env, f"build-{mode}", steps, annotations={
            "sidecar.istio.io/inject": "true", p.ANNOTATION_MODE: mode}))
    replaced = ["sh", "-c", 'echo "test replaced"; wget -q -O /dev/null http://127.0.0.1:%d/debug && echo "test '
                            'fetched through the proxy"' % ISTIO_TRAFFIC]

    def debugged(mode: str) -> str:
        build = wait_end(env.kube, ns, f"build-{mode}")
        assert build["status"]["phase"] == "Failed", build["status"]["phase"]
        copy, bare = f"debug-{mode}", f"debug-{mode}-bare"
        # The probes kept too: without the proxy's readiness probe the kubelet reports it
        # Ready once started, the watcher opens the waiter's gate, and the first call is refused.
        keep = ("--keep-labels", "--keep-annotations", "--keep-readiness", "--keep-startup")
        kubectl(env.admin, "debug", "-n", ns, f"build-{mode}", f"--copy-to={copy}", *keep, "--container=test",
                "--", *replaced)
        # A shell in the step's place, its input piped (`-i`): kubectl attaches once the container
        # runs, and the shell reads what it was sent once the steps before it are done.
        kubectl(env.admin, "debug", "-n", ns, f"build-{mode}", f"--copy-to={copy}-sh", *keep, "--container=test",
                "-i", "--", "sh", input='echo "shell in $HOSTNAME"; wget -q -O /dev/null http://127.0.0.1:%d/sh && '
                                        'echo "shell through the proxy"; exit 0\n' % ISTIO_TRAFFIC, timeout=240)
        shell = wait_end(env.kube, ns, f"{copy}-sh")
        said = [x.text for x in log_lines(env.kube, ns, f"{copy}-sh", "test")]
        assert shell["status"]["phase"] == "Succeeded" and said == [f"shell in {copy}-sh", "shell through the proxy"], \
            (shell["status"]["phase"], said)
        obj = wait_end(env.kube, ns, copy)
        assert obj["status"]["phase"] == "Succeeded", f"{copy}: {obj['status']['phase']}"
        assert managed(obj) == mode, managed(obj)
        fetch, test = log_lines(env.kube, ns, copy, "fetch"), log_lines(env.kube, ns, copy, "test")
        completion = log_lines(env.kube, ns, copy, "completion")
        ended, began = first(fetch, "^fetch end$"), first(test, "^test replaced$")
        assert ended and began and first(test, "^test fetched through the proxy$"), [x.text for x in test]
        done = first(completion, "^completion start$")
        assert done, [x.text for x in completion]
        # In order by the waiter's records where it ran them: log timestamps are when the
        # runtime read each container's output, and two containers' can come out of order by
        # microseconds (seen on v1.28.15: test's line 0.1 ms before fetch's last).
        times = {c: record_times(obj, c) for c in ("fetch", "test", "completion")}
        fetch_end = times["fetch"][1] if times["fetch"] else ended.at
        test_start = times["test"][0] if times["test"] else began.at
        completion_start = times["completion"][0] if times["completion"] else done.at
        assert fetch_end <= test_start <= completion_start, (times, ended, began, done)
        if mode == p.MODE_NATIVE:  # the steps are init containers: nothing of initshift's to drop
            return f"{mode}: the copy's test ran its new command after fetch, through the proxy, and so did a shell"
        result = outcome(env.kube, ns, copy)
        assert result["result"] == "Succeeded" and [s["name"] for s in result["steps"]] == ["fetch", "test"], result
        # kubectl's defaults drop the labels (the annotations are kept here: the e2e's Istio
        # would inject its proxy again into a pod without its status annotation).
        out = kubectl(env.admin, "debug", "-n", ns, f"build-{mode}", f"--copy-to={bare}", "--keep-annotations",
                      "--container=test", "--", *replaced)
        assert "a copy of a pod initshift rewrote" in out.stderr and "--keep-labels" in out.stderr, out.stderr
        kept = env.kube.pod(ns, bare) or {}
        assert annotations(kept).get(p.ANNOTATION_NOT_REWRITTEN) == "reserved", annotations(kept)
        env.kube.delete(f"/api/v1/namespaces/{ns}/pods/{bare}", gracePeriodSeconds=0)
        return f"{mode}: the copy's test ran its new command after fetch, through the proxy, and so did a shell " \
               f"given its input with -i; outcome Succeeded"

    with ThreadPoolExecutor(len(modes)) as pool:
        rec.note("; ".join(pool.map(debugged, modes)))


@scenario("oom-step")
def oom_step(env: Env, rec: Record) -> None:
    """An OOM-killed step: the pod ends Failed instead of leaving later steps waiting."""
    ns = env.namespace("oom")
    rec.namespaces.append(ns)
    hog = step("compile", env.images.busybox, port=ISTIO_TRAFFIC,
               extra="head -c 400m /dev/zero | tail > /dev/null || exit $?; ",
               resources={"requests": {"memory": "32Mi"}, "limits": {"memory": "48Mi"}})
    steps = [step("fetch", env.images.busybox, port=ISTIO_TRAFFIC), hog,
             step("package", env.images.busybox, port=ISTIO_TRAFFIC)]
    env.kube.create(f"/api/v1/namespaces/{ns}/pods", _build_pod(env, "build", steps))
    obj = wait_end(env.kube, ns, "build")
    assert obj["status"]["phase"] == "Failed", obj["status"]["phase"]
    state = terminated(obj, "compile") or {}
    result = outcome(env.kube, ns, "build")
    assert result["result"] == "Failed" and result.get("failed") == "compile", result
    package = log_lines(env.kube, ns, "build", "package")
    assert not first(package, "^package start$"), "package ran after the OOM-killed step"
    rec.note(f"strategy {managed(obj)}; compile: {state.get('reason')} exit {state.get('exitCode')}; "
             f"outcome: {result.get('message')}")


CANCEL_GRACE = 20  # seconds: a container that ignores SIGTERM is SIGKILLed (exit 137) after it
_HOLD = "e2e.initshift.io/hold"  # a finalizer: the deleted pod stays readable once it has stopped


def handles_sigterm(env: Env, ns: str, name: str, container: str) -> bool:
    """The container's PID 1 has a SIGTERM handler (SigCgt in its /proc status). The kernel
    drops a SIGTERM sent to a container's PID 1 before it has one (docs/waiter.md): a
    scenario that stops a build checks its waiters are past their start first."""
    out = kubectl(env.admin, "exec", "-n", ns, name, "-c", container, "--", "cat", "/proc/1/status", check=False)
    return has_signal(parse_status(out.stdout), "SigCgt", signal.SIGTERM)


def wait_waiters(env: Env, ns: str, name: str) -> None:
    """Until the first step has made its call through the proxy and every waiter of the
    build handles SIGTERM."""
    wait_for(lambda: first(log_lines(env.kube, ns, name, "fetch"), "^fetch fetched "), 120,
             f"{name}'s first step to run")
    for container in ("compile", "completion"):  # (fetch's waiter has started its command)
        wait_for(lambda: handles_sigterm(env, ns, name, container), 60, f"{name}'s {container} to handle SIGTERM")


def sigkilled(obj: dict) -> dict:
    """The pod's containers that ended on SIGKILL (exit 137), with their terminated state."""
    return {c: end for c in statuses(obj) if (end := terminated(obj, c) or {}).get("exitCode") == 137}


@scenario("cancelled-build")
def cancelled_build(env: Env, rec: Record) -> None:
    """A build deleted while its first step runs (a cancelled CI run), under each strategy
    whose steps the waiter runs: every container stops on the kubelet's SIGTERM (none is
    SIGKILLed when the grace period ends), the later steps never run. (Under the native
    strategy the steps are the pod's own init containers: a shell there as PID 1 ignores
    SIGTERM, as it would without initshift.)"""
    ns = env.namespace("cancel")
    rec.namespaces.append(ns)
    modes = waiter_modes(env)
    for mode in modes:
        steps = [step("fetch", env.images.busybox, port=ISTIO_TRAFFIC, sleep=300),
                 step("compile", env.images.busybox, port=ISTIO_TRAFFIC)]
        body = _build_pod(env, f"cancel-{mode}", steps, annotations={p.ANNOTATION_MODE: mode},
                          terminationGracePeriodSeconds=CANCEL_GRACE)
        body["metadata"]["finalizers"] = [_HOLD]
        env.kube.create(f"/api/v1/namespaces/{ns}/pods", body)

    def stopped(name: str) -> dict | None:
        obj = env.kube.pod(ns, name) or {}
        states = [s.get("state") or {} for s in statuses(obj).values()]  # (never started: waiting)
        return obj if states and not any("running" in st for st in states) else None

    def cancelled(mode: str) -> str:
        name = f"cancel-{mode}"
        try:
            wait_waiters(env, ns, name)
            began = time.monotonic()
            env.kube.delete(f"/api/v1/namespaces/{ns}/pods/{name}")
            obj = wait_for(lambda: stopped(name), 3 * CANCEL_GRACE, f"{name}'s containers to stop")
            took = time.monotonic() - began
            result = outcome(env.kube, ns, name)  # (the finalizer holds the pod until it is written)
            shown = initshift(env, "status", name, "-n", ns)  # as a user sees it meanwhile
        finally:
            env.kube.patch(f"/api/v1/namespaces/{ns}/pods/{name}", {"metadata": {"finalizers": None}})
        assert managed(obj) == mode, f"{name} managed by {managed(obj)!r}"
        ends = {c: terminated(obj, c) or {} for c in statuses(obj)}
        assert not sigkilled(obj), f"{mode}: SIGKILLed at the end of the grace period: {sigkilled(obj)}"
        assert not first(log_lines(env.kube, ns, name, "compile"), "^compile start$"), f"{mode}: compile ran"
        # Waiting its turn, compile ends on its own SIGTERM (Stopped, 143) or, where it reads
        # fetch's record of that signal first, skipped (0): either way it never ran.
        record = json.loads(ends["compile"].get("message") or "{}")
        assert (record.get("reason"), ends["compile"].get("exitCode")) in (
            (p.REASON_STOPPED, 143), (p.REASON_SKIPPED, 0)), f"{mode}: compile, waiting its turn, ended {ends['compile']}"
        assert ends["fetch"].get("exitCode") == 143, f"{mode}: fetch ended {ends['fetch']}"
        assert obj["status"].get("phase") != "Succeeded", f"{mode}: a cancelled build's pod Succeeded"
        # The outcome says the pod was deleted, and that the deletion stopped the proxy (hybrid's
        # native one: the kubelet, after the steps, as ever).
        assert (result["result"], result.get("failed")) == ("Failed", "fetch"), f"{mode}: outcome {result}"
        assert "(the pod was deleted at " in result["message"], f"{mode}: outcome {result}"
        assert result["sidecarsStoppedBy"] == ("native" if mode == p.MODE_HYBRID else "deletion"), \
            f"{mode}: outcome {result}"
        phase = next((x for x in shown.stdout.splitlines() if x.startswith("Phase:")), shown.stdout + shown.stderr)
        assert shown.returncode == 0 and ", Terminating (deleted at " in phase, f"{mode}: initshift status: {phase}"
        return f"{mode}: every container stopped on SIGTERM in {took:.1f} s (grace {CANCEL_GRACE} s); compile " \
               f"{record.get('reason')}; outcome: {result['message']}, sidecars stopped by {result['sidecarsStoppedBy']}"

    with ThreadPoolExecutor(len(modes)) as pool:
        rec.note("; ".join(pool.map(cancelled, modes)))


@scenario("build-deadline")
def build_deadline(env: Env, rec: Record) -> None:
    """A build whose first step hangs past the pod's own `activeDeadlineSeconds`, under
    each strategy whose steps the waiter runs: the kubelet ends the pod
    (`Failed/DeadlineExceeded`), the later step never runs, and the watcher's outcome is
    Failed, naming the hung step with the pod's reason. The deadline is lowered to 1 s once
    every waiter runs (`activeDeadlineSeconds` may be lowered on a running pod); the grace
    period is the cancelled build's, long enough that a stalled node does not turn the
    SIGTERM into a SIGKILL."""
    ns = env.namespace("deadline")
    rec.namespaces.append(ns)
    modes = waiter_modes(env)
    for mode in modes:
        steps = [step("fetch", env.images.busybox, port=ISTIO_TRAFFIC, sleep=300),
                 step("compile", env.images.busybox, port=ISTIO_TRAFFIC)]
        env.kube.create(f"/api/v1/namespaces/{ns}/pods", _build_pod(
            env, f"late-{mode}", steps, annotations={p.ANNOTATION_MODE: mode}, activeDeadlineSeconds=600,
            terminationGracePeriodSeconds=CANCEL_GRACE))

    def ended(mode: str) -> str:
        name = f"late-{mode}"
        wait_waiters(env, ns, name)
        env.kube.patch(f"/api/v1/namespaces/{ns}/pods/{name}", {"spec": {"activeDeadlineSeconds": 1}})
        obj = wait_end(env.kube, ns, name, 120)
        status = obj["status"]
        assert (status["phase"], status.get("reason")) == ("Failed", "DeadlineExceeded"), f"{mode}: {status}"
        assert managed(obj) == mode, f"{name} managed by {managed(obj)!r}"
        assert first(log_lines(env.kube, ns, name, "fetch"), "^fetch fetched "), f"{mode}: fetch never ran"
        assert not first(log_lines(env.kube, ns, name, "compile"), "^compile start$"), f"{mode}: compile ran"
        assert not sigkilled(obj), f"{mode}: SIGKILLed at the end of the grace period: {sigkilled(obj)}"
        result = outcome(env.kube, ns, name)
        assert result["result"] == "Failed" and result.get("failed") == "fetch", f"{mode}: outcome {result}"
        assert "DeadlineExceeded" in result.get("message", ""), f"{mode}: outcome {result}"
        return f"{mode}: {result['message']}; after it: {_skips_name_their_cause(mode, result)}"

    with ThreadPoolExecutor(len(modes)) as pool:
        rec.note("; ".join(pool.map(ended, modes)))


def _skips_name_their_cause(mode: str, result: dict) -> str:
    """In an outcome of a pod the kubelet stopped, a step or main the waiter skipped says
    what became of the step it names: failed, or stopped before it started (the waiter's
    `Stopped` record), as that step's own entry has it. (Which of the waiting ones reads
    another's record before its own SIGTERM comes is the kubelet's race.)"""
    runs = {r["name"]: r for r in result["steps"] + result["mains"]}
    assert runs["compile"]["reason"] in (p.REASON_STOPPED, p.REASON_SKIPPED), f"{mode}: compile {runs['compile']}"
    for run in runs.values():
        said = re.match(r"skipped: step '([^']+)' (failed|was stopped)", run.get("message", ""))
        if run["reason"] == p.REASON_SKIPPED:
            assert said, f"{mode}: {run}"
            stopped = runs[said[1]]["reason"] == p.REASON_STOPPED
            assert (said[2] == "was stopped") == stopped, f"{mode}: {run} says {said[1]} {said[2]}: {runs[said[1]]}"
    return ", ".join(f"{name} {run['reason']}" + (f" ({run['message']})" if run["reason"] == p.REASON_SKIPPED else "")
                     for name, run in list(runs.items())[1:])


@scenario("shared-process-namespace")
def shared_process_namespace(env: Env, rec: Record) -> None:
    """A build with `shareProcessNamespace: true` (the pause container is PID 1, not the
    waiter), under waiter (and hybrid): steps in order through the proxy, a step's child
    left running in the background does not hold the step, the build succeeds."""
    ns = env.namespace("sharedpid")
    rec.namespaces.append(ns)
    steps = [step("fetch", env.images.busybox, port=ISTIO_TRAFFIC, extra="(sleep 600 &); "),
             step("compile", env.images.busybox, port=ISTIO_TRAFFIC)]
    _built_in_each_mode(env, rec, ns, "shared", steps, shareProcessNamespace=True)


def _built_in_each_mode(env: Env, rec: Record, ns: str, prefix: str, steps: list[dict], **spec: object) -> None:
    """A build of `steps` (`fetch`, `compile`) in each strategy whose steps the waiter runs,
    side by side: steps in order through the proxy, the outcome Succeeded."""
    modes = waiter_modes(env)
    for mode in modes:
        env.kube.create(f"/api/v1/namespaces/{ns}/pods", _build_pod(
            env, f"{prefix}-{mode}", steps, annotations={p.ANNOTATION_MODE: mode}, **spec))

    def built(mode: str) -> str:
        build = check_build(env, rec, ns, f"{prefix}-{mode}", steps=["fetch", "compile"], proxy="istio-proxy",
                            strategy=mode)
        result = outcome(env.kube, ns, f"{prefix}-{mode}")
        assert result["result"] == "Succeeded", f"{mode}: outcome {result}"
        return f"{mode}: steps in order, outcome Succeeded, proxy stopped by {proxy_stop(build, 'istio-proxy')}"

    with ThreadPoolExecutor(len(modes)) as pool:
        rec.note("; ".join(pool.map(built, modes)))


def _bare_step(name: str, image: str) -> dict:
    """A step in the `bare` image: busybox's applets called by path, no shell on a PATH; the
    lines `step()`'s steps write, for check_build."""
    url = f"http://127.0.0.1:{ISTIO_TRAFFIC}/{name}"
    script = (f'echo "{name} start"; if /busybox timeout 10 /busybox wget -q -O /dev/null {url}; then '
              f'echo "{name} fetched {url}"; else echo "{name}: network call failed"; exit 7; fi; echo "{name} end"')
    return {"name": name, "image": image, "imagePullPolicy": "IfNotPresent", "command": ["/busybox", "sh", "-c", script],
            "securityContext": {"runAsUser": 12345, "runAsGroup": 12345, "runAsNonRoot": True,
                                "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}}


@scenario("bare-image")
def bare_image(env: Env, rec: Record) -> None:
    """Steps in an image with one static binary and nothing else, as a random UID with a
    read-only root, no capabilities and RuntimeDefault seccomp, under waiter (and hybrid):
    the frozen waiter runs there, the steps run in order through the proxy."""
    ns = env.namespace("bare")
    rec.namespaces.append(ns)
    _built_in_each_mode(env, rec, ns, "bare", [_bare_step("fetch", env.images.bare),
                                              _bare_step("compile", env.images.bare)])


@scenario("user-native-sidecar", applies=native_only)
def user_native_sidecar(env: Env, rec: Record) -> None:
    """A build with a native sidecar of its own before its steps (a daemon the steps call,
    as a dind sidecar would be), under waiter and hybrid: the daemon stays an init
    container the kubelet starts first, each step reaches it and the proxy, the build
    succeeds and the kubelet stops the daemon at the end."""
    ns = env.namespace("usernative")
    rec.namespaces.append(ns)
    daemon = {"name": "daemon", "image": env.images.busybox, "imagePullPolicy": "IfNotPresent", "restartPolicy": "Always",
              "command": ["sh", "-c", "mkdir -p /tmp/www && echo daemon up > /tmp/www/index.html && "
                                      "exec httpd -f -p 2375 -h /tmp/www"],
              "startupProbe": {"tcpSocket": {"port": 2375}, "periodSeconds": 1}}
    uses = 'timeout 5 wget -q -O - http://127.0.0.1:2375/ || exit 9; '
    modes = [p.MODE_WAITER, p.MODE_HYBRID]
    for mode in modes:
        steps = [daemon, step("fetch", env.images.busybox, port=ISTIO_TRAFFIC, extra=uses),
                 step("compile", env.images.busybox, port=ISTIO_TRAFFIC, extra=uses)]
        env.kube.create(f"/api/v1/namespaces/{ns}/pods", _build_pod(env, f"daemon-{mode}", steps,
                                                                     annotations={p.ANNOTATION_MODE: mode}))

    def built(mode: str) -> str:
        name = f"daemon-{mode}"
        build = check_build(env, rec, ns, name, steps=["fetch", "compile"], proxy="istio-proxy", strategy=mode)
        init, _ = container_names(build.obj)
        assert "daemon" in init, f"{mode}: the daemon is no longer an init container: {init}"
        for s in ("fetch", "compile"):
            assert first(build.steps[s], "^daemon up$"), f"{mode}: {s} did not reach the daemon"
        assert terminated(build.obj, "daemon") is not None, f"{mode}: the daemon still runs after the pod ended"
        result = outcome(env.kube, ns, name)
        assert result["result"] == "Succeeded", f"{mode}: outcome {result}"
        return f"{mode}: steps reached the daemon and the proxy, outcome Succeeded"

    with ThreadPoolExecutor(len(modes)) as pool:
        rec.note("; ".join(pool.map(built, modes)))


@scenario("own-sidecar-after-step", applies=native_only)
def own_sidecar_after_step(env: Env, rec: Record) -> None:
    """A build whose own native sidecar comes after its first step, which prepares it (a
    cache that reads the configuration the clone wrote), under `auto`: the native strategy
    keeps that order, the kubelet starts the cache once the clone has run (first start, no
    restart), the later step reaches the cache and the proxy, the pod succeeds."""
    ns = env.namespace("latesidecar")
    rec.namespaces.append(ns)
    mount = [{"name": "workspace", "mountPath": "/workspace"}]
    clone = step("clone", env.images.busybox, port=ISTIO_TRAFFIC, extra="echo cache up > /workspace/index.html; ",
                 volumeMounts=mount)
    cache = {"name": "cache", "image": env.images.busybox, "imagePullPolicy": "IfNotPresent", "restartPolicy": "Always",
             "command": ["sh", "-c", "test -f /workspace/index.html || { echo 'cache: no configuration'; exit 1; }; "
                                     "exec httpd -f -p 6379 -h /workspace"],
             "startupProbe": {"tcpSocket": {"port": 6379}, "periodSeconds": 1}, "volumeMounts": mount}
    build = step("build", env.images.busybox, port=ISTIO_TRAFFIC,
                 extra="timeout 5 wget -q -O - http://127.0.0.1:6379/ || exit 9; ", volumeMounts=mount)
    body = _build_pod(env, "late", [clone, cache, build])
    body["spec"]["volumes"] = [*body["spec"].get("volumes", []), {"name": "workspace", "emptyDir": {}}]
    env.kube.create(f"/api/v1/namespaces/{ns}/pods", body)
    obj = wait_end(env.kube, ns, "late")
    assert obj["status"]["phase"] == "Succeeded", obj["status"]
    assert managed(obj) == p.MODE_NATIVE, managed(obj)
    init, _ = container_names(obj)
    assert init.index("istio-proxy") < init.index("clone") < init.index("cache") < init.index("build"), init
    cache_status = next(c for c in obj["status"]["initContainerStatuses"] if c["name"] == "cache")
    assert cache_status.get("restartCount") == 0, f"the cache started before its configuration: {cache_status}"
    assert first(log_lines(env.kube, ns, "late", "build"), "^cache up$"), "build did not reach the cache"
    assert first(log_lines(env.kube, ns, "late", "clone"), "^clone fetched "), "the clone's call through the proxy"
    rec.note("auto chose native: proxy, clone, cache, build in their order; the cache's first start found the "
             "clone's configuration; build reached it; Succeeded")


@scenario("no-quit-sidecar")
def no_quit_sidecar(env: Env, rec: Record) -> None:
    """A sidecar without a quit endpoint: the watcher ends the pod, the outcome says Succeeded."""
    ns = env.namespace("noquit")
    rec.namespaces.append(ns)
    steps = [step(s, env.images.busybox, port=ISTIO_TRAFFIC) for s in ("fetch", "build")]
    env.kube.create(f"/api/v1/namespaces/{ns}/pods", _build_pod(
        env, "build", steps, annotations={p.ANNOTATION_MODE: p.MODE_WAITER, NO_QUIT: "true"}))
    obj = wait_end(env.kube, ns, "build")
    assert managed(obj) == p.MODE_WAITER, managed(obj)
    proxy = log_lines(env.kube, ns, "build", "istio-proxy")
    assert first(proxy, "quit refused"), f"the last main did not try to quit: {[x.text for x in proxy]}"
    assert obj["status"]["phase"] == "Failed" and obj["status"].get("reason") == "DeadlineExceeded", obj["status"]
    result = outcome(env.kube, ns, "build")
    assert result["result"] == "Succeeded" and result.get("sidecarsStoppedBy") == "deadline", result
    main_end = terminated(obj, "completion")["finishedAt"]
    rec.note(f"quit refused; the watcher set activeDeadlineSeconds: phase Failed/DeadlineExceeded, outcome "
             f"Succeeded, sidecars stopped by {result['sidecarsStoppedBy']} (main ended {main_end})")


@scenario("reinvocation")
def reinvocation(env: Env, rec: Record) -> None:
    """Re-invocation after the mesh injects: initshift leaves the proxy-less pod, then rewrites the injected one."""
    ns = env.namespace("reinv")
    rec.namespaces.append(ns)
    steps = [step(s, env.images.busybox, port=ISTIO_TRAFFIC) for s in ("clone", "build")]
    created = env.kube.create(f"/api/v1/namespaces/{ns}/pods", _build_pod(env, "build", steps))
    inits, mains = container_names(created)
    assert "istio-proxy" in inits + mains, f"the mesh did not inject: {inits} {mains}"
    assert p.ANNOTATION_NOT_REWRITTEN not in annotations(created), annotations(created)
    assert managed(created) == env.build_strategy, managed(created)
    reviews = reviews_in(env, ns)
    decisions = [(r.get("decision"), r.get("reason")) for r in reviews]
    assert len(reviews) >= 2 and decisions[-1][0] == "patched", f"reviews of the pod: {decisions}"
    build = check_build(env, rec, ns, "build", steps=["clone", "build"], proxy="istio-proxy",
                        strategy=env.build_strategy)
    rec.note(f"reviews {decisions}; proxy {'native' if 'istio-proxy' in inits else 'regular'}; "
             f"ended {build.obj['status']['phase']}")


@scenario("linkerd-native", applies=native_only)
def linkerd_native(env: Env, rec: Record) -> None:
    """Linkerd injecting its proxy as a native sidecar (`proxy-enable-native-sidecar`, the
    default from 2.20), first among the init containers: under `auto` the build is hybrid
    around it, its startupProbe goes (its liveness is `/live`, which answers from the start),
    the steps run in order through it, the outcome is Succeeded and the kubelet stops it."""
    ns = env.namespace("lknative", mesh="linkerd")
    rec.namespaces.append(ns)
    names = ["checkout", "compile", "upload"]
    steps = [step(s, env.images.busybox, port=LINKERD_TRAFFIC) for s in names]
    env.kube.create(f"/api/v1/namespaces/{ns}/pods", _build_pod(env, "build", steps, annotations={
        p.LINKERD_NATIVE_ANNOTATIONS[0]: "true"}))  # its name from Linkerd 2.20
    build = check_build(env, rec, ns, "build", steps=names, proxy="linkerd-proxy", strategy=p.MODE_HYBRID)
    inits, _ = container_names(build.obj)
    native = [c["name"] for c in build.obj["spec"]["initContainers"] if c.get("restartPolicy") == "Always"]
    assert native == ["linkerd-proxy"], f"the native sidecars are {native}"
    removed = json.loads(annotations(build.obj).get(p.ANNOTATION_STARTUP_PROBES_REMOVED) or "{}")
    assert list(removed) == ["linkerd-proxy"], f"startupProbes removed: {removed}"
    result = outcome(env.kube, ns, "build")
    assert result["result"] == "Succeeded", result
    # Linkerd names no default container: initshift names the main, not its copier ahead of it.
    check_default_logs(env, ns, "build")
    rec.note(f"strategy hybrid; init containers {inits}; linkerd-proxy stopped by {proxy_stop(build, 'linkerd-proxy')}")
    rec.figure("ready -> step 0", build.ready_to_step0_ms or 0)


@scenario("linkerd")
def linkerd(env: Env, rec: Record) -> None:
    """A Linkerd-shaped pod: the namespace annotated, linkerd-init and linkerd-proxy injected, /shutdown honoured."""
    ns = env.namespace("linkerd", mesh="linkerd")
    rec.namespaces.append(ns)
    names = ["checkout", "compile", "upload"]
    steps = [step(s, env.images.busybox, port=LINKERD_TRAFFIC) for s in names]
    env.kube.create(f"/api/v1/namespaces/{ns}/pods", _build_pod(env, "build", steps))
    build = check_build(env, rec, ns, "build", steps=names, proxy="linkerd-proxy", strategy=env.build_strategy)
    result = outcome(env.kube, ns, "build")
    assert result["result"] == "Succeeded", result
    stop = proxy_stop(build, "linkerd-proxy")
    if env.build_strategy == p.MODE_WAITER:
        assert stop == "quit endpoint", stop
    rec.note(f"strategy {managed(build.obj)}; linkerd-proxy stopped by {stop}")
    rec.figure("ready -> step 0", build.ready_to_step0_ms or 0)


@scenario("not-opted-in")
def not_opted_in(env: Env, rec: Record) -> None:
    """A namespace that is not opted in: the pod is untouched and its init step cannot reach the network."""
    ns = env.namespace("plain", opted=False)
    rec.namespaces.append(ns)
    env.kube.create(f"/api/v1/namespaces/{ns}/pods", _build_pod(
        env, "build", [step("clone", env.images.busybox, port=ISTIO_TRAFFIC)]))
    obj = wait_end(env.kube, ns, "build")
    assert managed(obj) is None and not [k for k in annotations(obj) if k.startswith(p.GROUP)], annotations(obj)
    assert obj["status"]["phase"] == "Failed", obj["status"]["phase"]
    # Exit 7 is the step's failed network call. (Its log is not asked for: once, on v1.28.15,
    # containerd kept the wget error on stderr and lost the short-lived container's stdout.)
    end = terminated(obj, "clone") or {}
    clone = [x.text for x in log_lines(env.kube, ns, "build", "clone")]
    assert end.get("exitCode") == 7, f"clone ended {end}, its log {clone}"
    rec.note("untouched by initshift; the init step ran before the proxy and failed (the problem initshift fixes)")


@scenario("restricted-namespace")
def restricted(env: Env, rec: Record) -> None:
    """A Pod Security `restricted` namespace (Istio CNI-style mesh): the rewritten pod is admitted and succeeds."""
    ns = env.namespace("restricted", mesh="istio-cni", labels={
        "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"})
    rec.namespaces.append(ns)
    secure = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    names = ["fetch", "build"]
    steps = [step(s, env.images.busybox, port=ISTIO_TRAFFIC, securityContext=secure) for s in names]
    body = _build_pod(env, "build", steps, securityContext={
        "runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}})
    body["spec"]["containers"][0]["securityContext"] = secure
    created = env.kube.create(f"/api/v1/namespaces/{ns}/pods", body)
    inits, regular = container_names(created)
    ours = p.COPY_CONTAINER_NAME if env.build_strategy == p.MODE_HYBRID else p.INIT_CONTAINER_NAME
    assert ours in [*inits, *regular], (inits, regular)
    build = check_build(env, rec, ns, "build", steps=names, proxy="istio-proxy", strategy=env.build_strategy)
    rec.note(f"admitted under enforce=restricted with {ours} and istio-validation; strategy {managed(build.obj)}")


@scenario("start-order")
def start_order(env: Env, rec: Record) -> None:
    """Start order in a long-running pod (a Deployment): the app starts after the proxy is ready."""
    ns = env.namespace("order")
    rec.namespaces.append(ns)
    app = step("app", env.images.busybox, port=ISTIO_TRAFFIC, extra='echo "app serving"; sleep 3600; ')
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}}, "template": {
            "metadata": {"labels": {"app": "web"},
                         "annotations": {p.ANNOTATION_START_ORDER: "istio-proxy;app"}},
            "spec": {"terminationGracePeriodSeconds": 2, "containers": [app]}}}}
    env.kube.create(f"/apis/apps/v1/namespaces/{ns}/deployments", deployment)

    def serving() -> dict | None:
        for obj in env.kube.pods(ns, "app=web"):
            lines = log_lines(env.kube, ns, obj["metadata"]["name"], "app")
            if first(lines, "^app serving$"):
                return obj
            if first(lines, "network call failed"):
                raise AssertionError(f"app reached the network before the proxy: {[x.text for x in lines]}")
        return None

    obj = wait_for(serving, 180, "the app serving")
    name = obj["metadata"]["name"]
    assert managed(obj) == p.MANAGED_START_ORDER, managed(obj)
    restarts = (statuses(obj).get("app") or {}).get("restartCount", 0)
    assert restarts == 0, f"app restarted {restarts} times"
    app_lines = log_lines(env.kube, ns, name, "app")
    proxy = log_lines(env.kube, ns, name, "istio-proxy")
    ready, started = first(proxy, " ready$"), first(app_lines, "^app start$")
    assert ready and started and started.at >= proxy_instant(ready), "app started before the proxy was ready"
    inits, _ = container_names(obj)
    rec.note(f"proxy {'native' if 'istio-proxy' in inits else 'regular'}; app's first call through the proxy "
             f"succeeded, no restart")
    rec.figure("ready -> app start", ms(started.at - proxy_instant(ready)))
    env.kube.delete(f"/apis/apps/v1/namespaces/{ns}/deployments/web")


@scenario("deployment-init-network", applies=native_only)
def deployment_init_network(env: Env, rec: Record) -> None:
    """A Deployment whose init container (a schema migration) calls through the proxy, the
    case native sidecars were made for: under `auto` the proxy becomes a native sidecar
    ahead of it, the migration's first call succeeds (no restart), the app serves."""
    ns = env.namespace("deployinit")
    rec.namespaces.append(ns)
    migrate = step("migrate", env.images.busybox, port=ISTIO_TRAFFIC, path="schema")
    app = step("app", env.images.busybox, port=ISTIO_TRAFFIC, extra='echo "app serving"; sleep 3600; ')
    env.kube.create(f"/apis/apps/v1/namespaces/{ns}/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "api"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "api"}}, "template": {
            "metadata": {"labels": {"app": "api"}},
            "spec": {"terminationGracePeriodSeconds": 2, "initContainers": [migrate], "containers": [app]}}}})

    def serving() -> dict | None:
        for obj in env.kube.pods(ns, "app=api"):
            if first(log_lines(env.kube, ns, obj["metadata"]["name"], "app"), "^app serving$"):
                return obj
        return None

    obj = wait_for(serving, 180, "the app serving")
    name = obj["metadata"]["name"]
    assert managed(obj) == p.MODE_NATIVE, managed(obj)
    inits, _ = container_names(obj)
    assert inits.index("istio-proxy") < inits.index("migrate"), f"the proxy is not ahead of migrate: {inits}"
    restarts = (statuses(obj).get("migrate") or {}).get("restartCount", 0)
    assert restarts == 0, f"migrate restarted {restarts} times: its first call did not get through"
    migrated = log_lines(env.kube, ns, name, "migrate")
    assert first(migrated, "^migrate fetched ") and first(migrated, "^migrate end$"), [x.text for x in migrated]
    rec.note(f"strategy native; init containers {inits}; migrate's first call through the proxy succeeded, "
             f"no restart; the app serves")
    env.kube.delete(f"/apis/apps/v1/namespaces/{ns}/deployments/api")


# A tenant namespace's LimitRange as platform teams write them: defaults for containers
# that name nothing, a floor, a ceiling and a burst ratio (the test mesh's own containers
# fit it, as Istio's and Linkerd's defaults fit common ones).
LIMIT_RANGE = {"type": "Container", "default": {"cpu": "200m", "memory": "64Mi"},
               "defaultRequest": {"cpu": "50m", "memory": "32Mi"}, "min": {"cpu": "10m", "memory": "8Mi"},
               "max": {"cpu": "1", "memory": "512Mi"}, "maxLimitRequestRatio": {"cpu": "20", "memory": "4"}}


def _limited(env: Env, short: str, *items: dict) -> str:
    ns = env.namespace(short)
    env.kube.create(f"/api/v1/namespaces/{ns}/limitranges", {
        "apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "tenant"}, "spec": {"limits": list(items)}})
    return ns


@scenario("limit-range")
def limit_range(env: Env, rec: Record) -> None:
    """LimitRanges: a build passes min, max and ratio and succeeds; a Pod max its steps exceed side by side leaves it unchanged."""
    ns = _limited(env, "limits", LIMIT_RANGE)
    rec.namespaces.append(ns)
    names = ["fetch", "compile", "publish"]
    steps = [step(s, env.images.busybox, port=ISTIO_TRAFFIC) for s in names]
    steps[1]["resources"] = {"requests": {"cpu": "300m", "memory": "128Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}}
    created = env.kube.create(f"/api/v1/namespaces/{ns}/pods", _build_pod(env, "build", steps))
    ours = {c["name"]: c["resources"]["requests"] for c in
            [*created["spec"].get("initContainers", []), *created["spec"]["containers"]]
            if c["name"] in (p.INIT_CONTAINER_NAME, p.COPY_CONTAINER_NAME)}
    build = check_build(env, rec, ns, "build", steps=names, proxy="istio-proxy", strategy=env.build_strategy)
    # a second namespace: one pod may use 1 CPU; three 400m steps fit one at a time, not side by side
    per_pod = _limited(env, "podmax", {"type": "Pod", "max": {"cpu": "1"}},
                       {"type": "Container", "default": {"cpu": "400m"}, "defaultRequest": {"cpu": "10m"}})
    rec.namespaces.append(per_pod)
    obj = env.kube.create(f"/api/v1/namespaces/{per_pod}/pods", _build_pod(
        env, "build", [step(s, env.images.busybox, port=None) for s in names]))
    # admitted as it came (its classic proxy then keeps it running: the problem initshift fixes)
    assert managed(obj) is None and annotations(obj).get(p.ANNOTATION_NOT_REWRITTEN) == "resources", \
        annotations(obj)
    env.kube.delete(f"/api/v1/namespaces/{per_pod}/pods/build")
    rec.note(f"strategy {managed(build.obj)}, admitted with {ours}; a pod over a Pod max admitted unchanged")


def _pod_level_on(env: Env) -> bool:
    """PodLevelResources (beta and on by default from Kubernetes 1.34)"""
    return env.minor >= 34


@scenario("pod-level-resources", applies=_pod_level_on)
def pod_level_resources(env: Env, rec: Record) -> None:
    """Pod-level resources: a build within them succeeds; one whose step's limit exceeds them as a regular container is left unchanged, never refused."""
    ns = env.namespace("podlevel")
    rec.namespaces.append(ns)
    names = ["fetch", "compile", "publish"]
    steps = [step(s, env.images.busybox, port=ISTIO_TRAFFIC) for s in names]
    for s in steps:
        s["resources"] = {"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}}
    level = {"requests": {"cpu": "300m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}}
    env.kube.create(f"/api/v1/namespaces/{ns}/pods", _build_pod(env, "build", steps, resources=level))
    build = check_build(env, rec, ns, "build", steps=names, proxy="istio-proxy", strategy=env.build_strategy)
    assert build.obj["spec"]["resources"] == level, build.obj["spec"]["resources"]
    # an init container's limit is not checked against the pod's; a regular container's is
    over = [dict(s) for s in steps]
    over[1]["resources"] = {"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"memory": "1Gi"}}
    obj = env.kube.create(f"/api/v1/namespaces/{ns}/pods", _build_pod(env, "over", over, resources=level))
    assert managed(obj) is None and annotations(obj).get(p.ANNOTATION_NOT_REWRITTEN) == "resources", \
        annotations(obj)
    env.kube.delete(f"/api/v1/namespaces/{ns}/pods/over")
    rec.note(f"strategy {managed(build.obj)} within pod-level {level['requests']}; a step over the pod's "
             f"limit admitted unchanged")


QUOTA = {"limits.cpu": "6", "limits.memory": "8Gi"}
PER_CONTAINER = {"type": "Container", "default": {"cpu": "1", "memory": "256Mi"},
                 "defaultRequest": {"cpu": "10m", "memory": "16Mi"}}


def _quota_namespace(env: Env, short: str, *, opted: bool) -> str:
    """A namespace whose LimitRange gives every container a 1-CPU limit, under a 6-CPU quota
    on limits (a common multi-tenant set-up), its status filled by the quota controller."""
    ns = env.namespace(short, opted=opted, mesh="istio" if opted else None)
    env.kube.create(f"/api/v1/namespaces/{ns}/limitranges", {
        "apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "tenant"}, "spec": {"limits": [PER_CONTAINER]}})
    env.kube.create(f"/api/v1/namespaces/{ns}/resourcequotas", {
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "compute"}, "spec": {"hard": QUOTA}})
    wait_for(lambda: (env.kube.get(f"/api/v1/namespaces/{ns}/resourcequotas/compute") or {}).get("status", {})
             .get("hard"), 60, f"ResourceQuota {ns}/compute's status")
    return ns


@scenario("resource-quota")
def resource_quota(env: Env, rec: Record) -> None:
    """A quota on limits: a build whose steps' limits would exceed it side by side is admitted unchanged, in the apiserver's words; one within it is rewritten."""
    ns, small, plain = (_quota_namespace(env, "quota", opted=True), _quota_namespace(env, "quotasmall", opted=True),
                        _quota_namespace(env, "quotaplain", opted=False))
    rec.namespaces += [ns, small, plain]
    names = ["fetch", "compile", "test", "publish", "sign", "push"]
    # six steps of 1 CPU (the LimitRange's default limit): 2 CPUs with the main and the proxy
    # as admitted, 8 or more rewritten (hybrid's initshift-copy adds 500m)
    obj = env.kube.create(f"/api/v1/namespaces/{ns}/pods", _build_pod(
        env, "build", [step(s, env.images.busybox, port=None) for s in names]))
    assert managed(obj) is None and annotations(obj).get(p.ANNOTATION_NOT_REWRITTEN) == "resources", \
        annotations(obj)
    env.kube.delete(f"/api/v1/namespaces/{ns}/pods/build")
    # The real quota refuses that pod rewritten, in the words initshift's check gives.
    created = {"apiVersion": "v1", "kind": "Pod", "spec": obj["spec"], "metadata": {
        k: obj["metadata"][k] for k in ("name", "labels", "annotations") if k in obj["metadata"]}}
    created["metadata"]["annotations"].pop(p.ANNOTATION_NOT_REWRITTEN, None)
    settings = Settings(feature_gate=True)
    rewritten = rewrite(created, settings, native_supported=env.native).pod
    quotas = env.kube.get(f"/api/v1/namespaces/{plain}/resourcequotas")["items"]
    [expected] = exceeded(created, rewritten, quotas)
    try:
        env.kube.request("POST", f"/api/v1/namespaces/{plain}/pods", body=rewritten, params={"dryRun": "All"})
        raise AssertionError("the apiserver admitted the rewritten pod over its quota")
    except KubeFailure as e:
        assert f": 403 pods \"build\" is forbidden: {expected}" in str(e), (str(e), expected)
    # two steps fit (a namespace of its own: the first pod's charge is not released at once)
    fits = env.kube.create(f"/api/v1/namespaces/{small}/pods", _build_pod(
        env, "small", [step(s, env.images.busybox, port=None) for s in names[:2]]))
    assert managed(fits) == env.build_strategy, annotations(fits)
    env.kube.delete(f"/api/v1/namespaces/{small}/pods/small")
    rec.note(f"over the quota: admitted unchanged; the apiserver refuses it rewritten with \"{expected}\"; "
             f"two steps: {managed(fits)}")


@scenario("static-pod", applies=own_cluster)
def static_pod(env: Env, rec: Record) -> None:
    """A static pod in an opted-in namespace, with an init step and a proxy in its manifest:
    the kubelet runs the manifest, and the mirror pod the apiserver admits through the
    webhooks is left exactly as the kubelet wrote it (`mirror-pod`), so it shows what runs;
    the watcher leaves it alone."""
    ns = env.namespace("static", mesh=None)
    rec.namespaces.append(ns)
    body = pod("builder", [step("prepare", env.images.busybox, port=None)],
               [step("build", env.images.busybox, port=None, sleep=1)])
    body["metadata"]["namespace"] = ns
    body = env.mesh.istio(body, {})  # a proxy put in the manifest by hand (no mesh injects into a static pod)
    manifest = env.cluster.static_pod_dir / f"builder-{env.run}.yaml"  # type: ignore[union-attr]
    manifest.write_text(json.dumps(body))
    name = f"builder-{env.cluster.node}"  # type: ignore[union-attr]
    try:
        obj = wait_for(lambda: env.kube.pod(ns, name), 60, "the mirror pod", interval=0.5)
        assert p.MIRROR_POD_ANNOTATION in annotations(obj), annotations(obj)
        assert container_names(obj) == (["istio-init", "prepare"], ["build", "istio-proxy"]), container_names(obj)
        ours = [k for k in (*annotations(obj), *(obj["metadata"].get("labels") or {})) if k.startswith(p.GROUP)]
        assert not ours, ours
        ran = wait_for(lambda: (o := env.kube.pod(ns, name)) and "terminated" in (
            statuses(o).get("build", {}).get("state") or {}) and o, 60, "the build to end", interval=0.5)
        assert statuses(ran)["build"]["state"]["terminated"]["exitCode"] == 0, statuses(ran)["build"]
        time.sleep(3)  # the watcher's grace after a main's end
        ours = [k for k in annotations(env.kube.pod(ns, name) or ran) if k.startswith(p.GROUP)]
        assert not ours, ours
        reviews = reviews_in(env, ns)
        assert [(r.get("decision"), r.get("reason")) for r in reviews] == [("allowed", "mirror-pod")], reviews
    finally:
        manifest.unlink()
        wait_for(lambda: env.kube.pod(ns, name) is None, 60, "the mirror pod gone", interval=0.5)
    rec.note("the mirror pod kept the manifest's containers and no initshift label or annotation (mirror-pod); "
             "the kubelet ran the manifest; the watcher left it alone")


@scenario("terminal-main")
def terminal_main(env: Env, rec: Record) -> None:
    """A main with a terminal (`stdin: true`, `tty: true`, as `kubectl run -it` makes), under
    each strategy whose mains the waiter runs: the waiter hands the terminal's foreground to
    its program's process group (in a background group a read of the terminal stops the
    program for good, SIGTTIN, and Ctrl-C reaches the waiter instead), and the pod succeeds."""
    ns = env.namespace("tty")
    rec.namespaces.append(ns)
    # /proc/PID/stat: field 5 the process group, 8 the terminal's foreground group
    script = 'set -- $(cat /proc/$$/stat); echo "shell group $5 foreground $8"; echo "shell end"'
    modes = waiter_modes(env)
    for mode in modes:
        shell = {"name": "shell", "image": env.images.busybox, "imagePullPolicy": "IfNotPresent",
                 "command": ["sh", "-c", script], "stdin": True, "tty": True}
        body = pod(f"tty-{mode}", [step("prepare", env.images.busybox, port=ISTIO_TRAFFIC)], [shell],
                   annotations={p.ANNOTATION_MODE: mode})
        env.kube.create(f"/api/v1/namespaces/{ns}/pods", body)
    said = []
    for mode in modes:
        obj = wait_end(env.kube, ns, f"tty-{mode}", timeout=120)
        assert managed(obj) == mode, managed(obj)
        shown = [x.text.strip() for x in log_lines(env.kube, ns, f"tty-{mode}", "shell")]
        assert obj["status"]["phase"] == "Succeeded", (mode, obj["status"]["phase"], shown)
        groups = next((x.split()[2::2] for x in shown if x.startswith("shell group ")), None)
        assert groups and groups[0] == groups[1], f"{mode}: the shell is not in the terminal's foreground: {shown}"
        said.append(f"{mode}: Succeeded, the shell's group {groups[0]} in the terminal's foreground")
    rec.note("; ".join(said))



@scenario("poststart-main")
def poststart_main(env: Env, rec: Record) -> None:
    """A build whose main has a postStart hook that waits for its own program (as charts
    that set up their app from a hook do), under Istio's classic proxy (appended after it),
    in each mode whose steps the waiter runs: the kubelet starts regular containers one by
    one, each once the hook before has returned, so the proxy goes ahead of the steps (after
    the main it never started: the pod stayed Pending); the pod succeeds, its step's call
    through the proxy."""
    ns = env.namespace("hook")
    rec.namespaces.append(ns)
    main = step("main", env.images.busybox, port=None, extra="touch /tmp/up; sleep 1; ")
    main["lifecycle"] = {"postStart": {"exec": {"command": ["sh", "-c", "until [ -f /tmp/up ]; do sleep 0.2; done"]}}}
    modes = waiter_modes(env)
    for mode in modes:
        env.kube.create(f"/api/v1/namespaces/{ns}/pods", pod(
            f"hook-{mode}", [step("clone", env.images.busybox, port=ISTIO_TRAFFIC)], [dict(main)],
            annotations={p.ANNOTATION_MODE: mode}))
    said = []
    for mode in modes:
        obj = wait_end(env.kube, ns, f"hook-{mode}", timeout=120)
        inits, regular = container_names(obj)
        assert obj["status"]["phase"] == "Succeeded", (mode, obj["status"]["phase"], inits, regular)
        assert first(log_lines(env.kube, ns, f"hook-{mode}", "clone"), "^clone fetched "), "the clone's call"
        where = "native" if "istio-proxy" in inits else f"regular, position {regular.index('istio-proxy')}"
        said.append(f"{mode}: Succeeded, the proxy {where}")
    rec.note("; ".join(said))
