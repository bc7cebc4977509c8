"""Builds evicted mid-step, as a node drain evicts them: through the Eviction API
(`pods/eviction`, what `kubectl drain` does per pod), a Job's pod and a bare pod under each
strategy, then `kubectl drain` of the node without `--pod-selector` while a bare build runs
(refused, for want of flags), and with both flags once a Job's build runs too. Each evicted build stops within its grace period (the waiter-run
steps on the kubelet's SIGTERM, none SIGKILLed), its outcome is written at most once and
names the eviction, and each Job's replacement pod is rewritten and Succeeds, the Job
Complete."""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from waiter import protocol as p

from ._builds import sigkilled, wait_waiters
from ._env import Env, Record, own_cluster, scenario, waiter_modes
from ._jobs import job_done
from ._kube import PodWatch, kubectl, wait_for
from ._mesh import ISTIO_TRAFFIC
from ._pods import ENDED, first, log_lines, managed, outcome, pod, statuses, step, terminated

GRACE = 20  # seconds: a container still running at its end is SIGKILLed (exit 137)
NODE = "localhost"
OUTCOME_EVENTS = ("StepsSucceeded", "StepsFailed")


def _template(env: Env, mode: str, sleep: float) -> dict:
    """A build pod under `mode`: a step through the proxy that then works `sleep` seconds,
    a second step, a main."""
    steps = [step("fetch", env.images.busybox, port=ISTIO_TRAFFIC, sleep=sleep),
             step("compile", env.images.busybox, port=ISTIO_TRAFFIC)]
    return pod("", steps, [step("completion", env.images.busybox, port=None)],
               annotations={p.ANNOTATION_MODE: mode}, terminationGracePeriodSeconds=GRACE)


def _job(env: Env, ns: str, name: str, mode: str, sleep: float = 8) -> None:
    """A Job of the build: its first step works `sleep` seconds (the replacement pod too)."""
    body = _template(env, mode, sleep=sleep)
    env.kube.create(f"/apis/batch/v1/namespaces/{ns}/jobs", {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"backoffLimit": 2, "template": {"metadata": {"annotations": body["metadata"]["annotations"]},
                                                 "spec": body["spec"]}}})


def _bare(env: Env, ns: str, name: str, mode: str) -> None:
    body = _template(env, mode, sleep=300)
    body["metadata"]["name"] = name
    env.kube.create(f"/api/v1/namespaces/{ns}/pods", body)


def _job_pods(env: Env, ns: str, job: str) -> list[dict]:
    return sorted(env.kube.pods(ns, f"job-name={job}"), key=lambda x: x["metadata"]["creationTimestamp"])


def _in_step(env: Env, ns: str, name: str, mode: str) -> None:
    """Until the first step has made its call (and, where the waiter runs the steps, every
    waiter handles SIGTERM: a signal before that is dropped, docs/waiter.md)."""
    if mode == p.MODE_NATIVE:
        wait_for(lambda: first(log_lines(env.kube, ns, name, "fetch"), "^fetch fetched "), 120,
                 f"{name}'s first step to run")
    else:
        wait_waiters(env, ns, name)


def _evict(env: Env, ns: str, name: str) -> None:
    """What `kubectl drain` does per pod: a POST to its `eviction` subresource."""
    env.kube.create(f"/api/v1/namespaces/{ns}/pods/{name}/eviction", {
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": ns}})


def _ended(env: Env, watch: PodWatch, ns: str, name: str, mode: str, since: float) -> str:
    """The evicted build stopped within its grace period (under the waiter-run strategies
    every container on its SIGTERM) and is gone; its outcome written at most once, naming
    the eviction. What it showed, for the note."""
    took, obj = wait_for(lambda: watch.gone(ns, name), 3 * GRACE + 30, f"{name} evicted and gone", interval=0.5)
    took -= since
    assert managed(obj) == mode, f"{name} managed by {managed(obj)!r}"
    conditions = {c["type"]: c for c in obj["status"].get("conditions") or []}
    disruption = conditions.get("DisruptionTarget") or {}
    assert disruption.get("status") == "True" and disruption.get("reason") == "EvictionByEvictionAPI", \
        f"{name}: DisruptionTarget {disruption}"
    ends = {c: terminated(obj, c) or {} for c in statuses(obj)}
    proxy = ends.get("istio-proxy") or {}
    last = max((x.get("finishedAt") or "" for c, x in ends.items() if c not in ("istio-proxy", p.INIT_CONTAINER_NAME)),
               default="")
    if mode == p.MODE_HYBRID:  # a native sidecar: the kubelet stops it after the regular containers (under
        # native, where a step is a running init container, it stops both at once: the proxy
        # may go first, as without initshift)
        assert proxy.get("finishedAt", "") >= last, f"{name}: istio-proxy ended {proxy}, before {last}"
    said = f"{name} ({mode}): gone {took:.1f} s after the eviction, phase {obj['status'].get('phase')}, " \
           f"DisruptionTarget {disruption.get('reason')}, istio-proxy exit {proxy.get('exitCode')} at " \
           f"{proxy.get('finishedAt', '')[11:19]} (steps and main by {last[11:19]})"
    if mode == p.MODE_NATIVE:
        # The steps are the pod's own init containers: the shell as PID 1 ignores SIGTERM,
        # as without initshift, and runs on until it ends (or the grace period does).
        return f"{said}, fetch exit {ends.get('fetch', {}).get('exitCode')}"
    assert not sigkilled(obj), f"{name}: SIGKILLed at the end of the grace period: {sigkilled(obj)}"
    assert ends["fetch"].get("exitCode") == 143, f"{name}: fetch ended {ends['fetch']}"
    values = [json.loads(v) for v in sorted(watch.values(ns, name))]
    events = [e for e in env.kube.events(ns, name) if e.get("reason") in OUTCOME_EVENTS]
    assert len(values) <= 1, f"{name}: the outcome written {len(values)} times: {values}"
    if not values:  # a bare pod is deleted once its containers have stopped: the watcher may be late
        assert not obj["metadata"].get("ownerReferences"), f"{name}: gone without an outcome, though its Job held it"
        return f"{said}; no outcome (gone first), {len(events)} outcome Event(s)"
    (result,) = values
    assert result["result"] == "Failed" and result.get("failed") == "fetch", f"{name}: outcome {result}"
    assert "Evict" in result.get("message", ""), f"{name}: the outcome does not name the eviction: {result}"
    # The kubelet's SIGTERM stopped the proxy (a native one: the kubelet, after the steps, as ever).
    assert result["sidecarsStoppedBy"] == ("native" if mode == p.MODE_HYBRID else "deletion"), f"{name}: {result}"
    assert len(events) == 1, f"{name}: outcome Events {[(e['reason'], e.get('count')) for e in events]}"
    return f"{said}; outcome: {result['message']}, sidecars stopped by {result['sidecarsStoppedBy']}"


def _replaced(env: Env, watch: PodWatch, ns: str, job: str, mode: str) -> str:
    """The Job Complete, its replacement pod rewritten under `mode` and Succeeded."""
    failed = (job_done(env, ns, job).get("status") or {}).get("failed")
    pods = [x for x in _job_pods(env, ns, job) if x["status"].get("phase") in ENDED]
    last = pods[-1]
    name = last["metadata"]["name"]
    assert (managed(last), last["status"]["phase"]) == (mode, "Succeeded"), \
        f"{job}'s replacement {name}: {managed(last)} {last['status']['phase']}"
    if mode != p.MODE_NATIVE:
        result = outcome(env.kube, ns, name)
        assert result["result"] == "Succeeded", f"{name}: outcome {result}"
        assert len(watch.values(ns, name)) == 1, f"{name}: the outcome written {watch.values(ns, name)}"
    return f"{job} Complete ({failed} failed attempt counted), replacement {name} {mode} Succeeded"


def _said(done: subprocess.CompletedProcess) -> str:
    """kubectl drain's refusal, the line naming why."""
    return next((line for line in done.stderr.splitlines() if "override" in line), done.stderr.strip())[:300]


@scenario("evicted", phase=2, applies=own_cluster)
def evicted(env: Env, rec: Record) -> None:
    """Builds evicted mid-step (the Eviction API per pod, then `kubectl drain` of the node
    without --pod-selector): each stops within its grace period, its outcome once naming the
    eviction, each Job's replacement rewritten and Succeeded, the Job Complete."""
    ns = env.namespace("evicted")
    rec.namespaces.append(ns)
    modes = [p.MODE_WAITER, *((p.MODE_NATIVE, p.MODE_HYBRID) if env.native else ())]
    watch = PodWatch(env.admin, [ns], p.ANNOTATION_OUTCOME)
    try:
        # 1. The Eviction API on a Job's pod under each strategy, and on a bare pod under
        # each whose steps the waiter runs.
        for mode in modes:
            _job(env, ns, f"job-{mode}", mode)
        for mode in waiter_modes(env):
            _bare(env, ns, f"bare-{mode}", mode)

        def job_evicted(mode: str) -> str:
            job = f"job-{mode}"
            name = wait_for(lambda: (x := _job_pods(env, ns, job)) and x[0]["metadata"]["name"], 60, f"{job}'s pod")
            _in_step(env, ns, name, mode)
            since = time.monotonic()
            _evict(env, ns, name)
            return f"{_ended(env, watch, ns, name, mode, since)}; {_replaced(env, watch, ns, job, mode)}"

        def bare_evicted(mode: str) -> str:
            name = f"bare-{mode}"
            _in_step(env, ns, name, mode)
            since = time.monotonic()
            _evict(env, ns, name)
            return _ended(env, watch, ns, name, mode, since)

        with ThreadPoolExecutor(len(modes) + 2) as pool:
            done = [pool.submit(job_evicted, m) for m in modes] + [pool.submit(bare_evicted, m)
                                                                    for m in waiter_modes(env)]
            rec.details += [f.result() for f in done]

        # 2. `kubectl drain` of the node, no --pod-selector, while a bare build runs: refused
        # without --force (the bare pod) and --delete-emptydir-data (the waiter's emptyDir),
        # nothing evicted; then, the node uncordoned and a Job's build started too, with both
        # flags, every pod evicted. (The Job's pod comes after the refusals, and its step
        # works 45 s: on a loaded machine, with other scenarios' pods on the node, a drain took
        # 21.9 s and a 15 s step ended before its eviction reached it.)
        mode = env.build_strategy
        _bare(env, ns, "bare-drain", mode)
        _in_step(env, ns, "bare-drain", mode)
        try:
            refused = kubectl(env.admin, "drain", NODE, "--ignore-daemonsets", "--timeout=30s", check=False)
            assert refused.returncode and "(use --delete-emptydir-data to override)" in refused.stderr, refused
            bare = kubectl(env.admin, "drain", NODE, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=30s",
                           check=False)
            assert bare.returncode and "(use --force to override)" in bare.stderr, bare
            assert (env.kube.pod(ns, "bare-drain") or {}).get("status", {}).get("phase") == "Running", \
                "a refused drain evicted a build"
            kubectl(env.admin, "uncordon", NODE)  # a refused drain leaves the node cordoned
            _job(env, ns, "job-drain", mode, sleep=45)
            job_pod = wait_for(lambda: (x := _job_pods(env, ns, "job-drain")) and x[0]["metadata"]["name"], 60,
                               "job-drain's pod")
            _in_step(env, ns, job_pod, mode)
            since = time.monotonic()
            drained = kubectl(env.admin, "drain", NODE, "--ignore-daemonsets", "--delete-emptydir-data", "--force",
                              "--timeout=120s", check=False)
            took = time.monotonic() - since
            assert drained.returncode == 0, drained
            rec.details.append(f"kubectl drain {NODE}: refused ({_said(refused)}), with --delete-emptydir-data "
                               f"refused ({_said(bare)}), with --force too drained in {took:.1f} s")
            ends = [_ended(env, watch, ns, x, mode, since) for x in (job_pod, "bare-drain")]
        finally:
            kubectl(env.admin, "uncordon", NODE, check=False)
        rec.details += ends + [_replaced(env, watch, ns, "job-drain", mode)]
    finally:
        watch.close()
