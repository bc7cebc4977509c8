"""Jobs and CronJobs: the Job completes (its proxy does not keep the pod running) and its
first attempt reaches the network through the proxy; a Job whose pod restarts its
containers in place (`OnFailure`) runs a failed step again before the next."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from tests.support.jsonstream import json_documents
from waiter import protocol as p

from ._check import check_build, proxy_instant, proxy_stop, record_times
from ._env import Env, Record, scenario, waiter_modes
from ._kube import kubectl, wait_for
from ._mesh import ISTIO_TRAFFIC, LINKERD_ADMIN_PORT, LINKERD_TRAFFIC
from ._pods import first, log_lines, managed, outcome, statuses, step
from ._tools import initshift

JOB_TIMEOUT = 240.0


def job_done(env: Env, ns: str, name: str) -> dict:
    def finished() -> dict | None:
        job = env.kube.get(f"/apis/batch/v1/namespaces/{ns}/jobs/{name}") or {}
        conditions = {c["type"]: c["status"] for c in (job.get("status") or {}).get("conditions") or []}
        if conditions.get("Failed") == "True":
            raise AssertionError(f"Job {name} failed: {job['status']}")
        return job if conditions.get("Complete") == "True" else None

    return wait_for(finished, JOB_TIMEOUT, f"Job {ns}/{name} Complete", interval=0.5)


def _job_pod(env: Env, ns: str, job: str) -> dict:
    pods = env.kube.pods(ns, f"job-name={job}")
    assert len(pods) == 1, f"Job {job} ran {len(pods)} pods: the first attempt did not succeed"
    return pods[0]


@scenario("job-git-clone")
def job_git_clone(env: Env, rec: Record) -> None:
    """A Job with a `git clone` init step: the clone goes through the proxy, the Job completes."""
    ns = env.namespace("job")
    rec.namespaces.append(ns)
    clone = step("git-clone", env.images.busybox, port=ISTIO_TRAFFIC, path="repo.git",
                 extra="echo cloned > /workspace/HEAD; ",
                 volumeMounts=[{"name": "workspace", "mountPath": "/workspace"}])
    build = step("build", env.images.busybox, port=None, extra="cat /workspace/HEAD; ",
                 volumeMounts=[{"name": "workspace", "mountPath": "/workspace"}])
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "clone-build"},
           "spec": {"backoffLimit": 0, "template": {"spec": {
               "restartPolicy": "Never", "terminationGracePeriodSeconds": 5, "initContainers": [clone],
               "containers": [build], "volumes": [{"name": "workspace", "emptyDir": {}}]}}}}
    started = time.monotonic()
    env.kube.create(f"/apis/batch/v1/namespaces/{ns}/jobs", job)
    job_done(env, ns, "clone-build")
    took = time.monotonic() - started
    obj = _job_pod(env, ns, "clone-build")
    name = obj["metadata"]["name"]
    built = check_build(env, rec, ns, name, steps=["git-clone"], proxy="istio-proxy",
                        paths={"git-clone": "repo.git"}, strategy=env.build_strategy)
    assert first(log_lines(env.kube, ns, name, "build"), "^cloned$"), "build did not see the clone"
    rec.note(f"strategy {managed(obj)}; proxy stopped by {proxy_stop(built, 'istio-proxy')}")
    rec.figure("Job completion", took, "s")


@scenario("linkerd-job")
def linkerd_job(env: Env, rec: Record) -> None:
    """Jobs under Linkerd as 2.16 and later inject it (the proxy's /shutdown off unless
    asked for), their pods under the waiter: initshift turns the endpoint on, the main's
    quit stops the proxy, on its admin port where the pod moves it
    (`config.linkerd.io/admin-port`), and each Job completes with its one pod
    (`backoffLimit: 0`: a pod ended by the watcher's deadline, phase Failed, would fail it)."""
    ns = env.namespace("l5djob", mesh="linkerd")
    rec.namespaces.append(ns)
    admin = {"report": 4191, "digest": 4192}
    for job_name, port in admin.items():
        main = step(job_name, env.images.busybox, port=LINKERD_TRAFFIC, path="nightly")
        moved = {} if port == 4191 else {LINKERD_ADMIN_PORT: str(port)}
        env.kube.create(f"/apis/batch/v1/namespaces/{ns}/jobs", {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": job_name},
            "spec": {"backoffLimit": 0, "template": {
                "metadata": {"annotations": {p.ANNOTATION_MODE: p.MODE_WAITER, **moved}},
                "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 5, "containers": [main]}}}})
    said, names = [], {}
    for job_name, port in admin.items():
        job_done(env, ns, job_name)
        obj = _job_pod(env, ns, job_name)
        name = names[job_name] = obj["metadata"]["name"]
        built = check_build(env, rec, ns, name, steps=[], proxy="linkerd-proxy", strategy=p.MODE_WAITER)
        assert first(log_lines(env.kube, ns, name, job_name), f"^{job_name} fetched "), "the call through the proxy"
        proxy = next(c for c in obj["spec"]["containers"] if c["name"] == p.LINKERD_PROXY)
        assert {"name": p.LINKERD_SHUTDOWN_ENV, "value": "true"} in proxy.get("env", []), proxy.get("env")
        quits = [x.text for x in log_lines(env.kube, ns, name, job_name, waiter=True) if " quit " in x.text]
        assert quits == [f"waiter[{job_name}]: quit http://127.0.0.1:{port}/shutdown: HTTP 200"], quits
        stop = proxy_stop(built, p.LINKERD_PROXY)
        assert stop == "quit endpoint", stop
        said.append(f"{job_name}: the quit went to :{port}")
    shown = initshift(env, "status", "job/report", "-n", ns, "-o", "json", timeout=60)  # the pod by its Job
    assert shown.returncode == 0 and json.loads(shown.stdout)["name"] == names["report"], (shown.returncode,
                                                                                          shown.stderr)
    rec.note(f"strategy waiter; /shutdown turned on; {'; '.join(said)}; linkerd-proxy stopped by the quit "
             f"endpoint; each Job completed with its one pod; `initshift status job/report` shows it")


@scenario("istio-status-port")
def istio_status_port(env: Env, rec: Record) -> None:
    """Jobs whose pods move Istio's status server, where pilot-agent serves /quitquitquit:
    one by `status.sidecar.istio.io/port`, one by the `statusPort` of its
    `proxy.istio.io/config` (which Istio's injector also writes into the proxy's
    PROXY_CONFIG). Under the waiter the main's quit goes to that port, the proxy ends and
    each Job completes with its one pod (`backoffLimit: 0`: a pod the watcher's deadline
    ended would fail it)."""
    ns = env.namespace("statusport")
    rec.namespaces.append(ns)
    moved = {"report": (15030, {p.ISTIO_STATUS_PORT_ANNOTATION: "15030"}),
             "digest": (15031, {p.ISTIO_PROXY_CONFIG_ANNOTATION: "statusPort: 15031\n"})}
    for job_name, (_, annotations) in moved.items():
        main = step(job_name, env.images.busybox, port=ISTIO_TRAFFIC, path="nightly")
        env.kube.create(f"/apis/batch/v1/namespaces/{ns}/jobs", {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": job_name},
            "spec": {"backoffLimit": 0, "template": {
                "metadata": {"annotations": {p.ANNOTATION_MODE: p.MODE_WAITER, **annotations}},
                "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 5, "containers": [main]}}}})
    for job_name, (port, _) in moved.items():
        job_done(env, ns, job_name)
        obj = _job_pod(env, ns, job_name)
        name = obj["metadata"]["name"]
        built = check_build(env, rec, ns, name, steps=[], proxy=p.ISTIO_PROXY, strategy=p.MODE_WAITER)
        quits = [x.text for x in log_lines(env.kube, ns, name, job_name, waiter=True) if " quit " in x.text]
        assert quits == [f"waiter[{job_name}]: quit http://127.0.0.1:{port}/quitquitquit: HTTP 200"], quits
        stop = proxy_stop(built, p.ISTIO_PROXY)
        assert stop == "quit endpoint", stop
        rec.note(f"{job_name} ({', '.join(moved[job_name][1])}): strategy {managed(obj)}; the quit went to :{port}; "
                 f"istio-proxy stopped by {stop}; the Job completed with its one pod")


@scenario("job-ttl")
def job_ttl(env: Env, rec: Record) -> None:
    """A Job with `ttlSecondsAfterFinished: 0` (the TTL controller deletes it, and its pods,
    as soon as it has finished: a common CronJob setting), under the waiter: its main
    succeeds, and the watcher, whose pod is deleted right after the end, records the
    outcome or lets it go calmly (no error, no traceback in its log)."""
    ns = env.namespace("ttl")
    rec.namespaces.append(ns)
    report = step("report", env.images.busybox, port=ISTIO_TRAFFIC, path="nightly")
    env.kube.create(f"/apis/batch/v1/namespaces/{ns}/jobs", {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "report"},
        "spec": {"backoffLimit": 0, "ttlSecondsAfterFinished": 0, "template": {
            "metadata": {"annotations": {p.ANNOTATION_MODE: p.MODE_WAITER}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 5, "containers": [report]}}}})
    name = wait_for(lambda: next((x["metadata"]["name"] for x in env.kube.pods(ns, "job-name=report")), None),
                    60, "the Job's pod", interval=0.2)
    phases: list[str] = []

    def gone() -> bool:
        pod = env.kube.pod(ns, name)
        if pod is not None:
            phases.append((pod.get("status") or {}).get("phase", ""))
        return pod is None and env.kube.get(f"/apis/batch/v1/namespaces/{ns}/jobs/report") is None

    wait_for(gone, JOB_TIMEOUT, f"Job {ns}/report finished and deleted with its pod", interval=0.1)
    assert "Failed" not in phases, phases
    time.sleep(3)  # the watcher's grace after the pod's end, and its retries
    log = env.install.watcher.log.read_text(errors="replace").splitlines()
    about = [line for line in log if f'"pod":"{name}"' in line]
    bad = [line for line in about if '"level":"error"' in line]
    assert not bad and not any("Traceback" in line for line in log), bad or "a traceback in the watcher's log"
    said = [json.loads(line)["msg"] for line in about if '"action":"outcome"' in line]
    assert all(m.startswith("Succeeded") for m in said), said
    rec.note(f"the TTL controller deleted the Job and its pod once it finished (phases seen: "
             f"{', '.join(dict.fromkeys(phases))}); the watcher: {said[0] if said else 'no outcome (pod gone first)'}; "
             f"no error in its {len(about)} lines about the pod")


@scenario("cronjob")
def cronjob(env: Env, rec: Record) -> None:
    """A CronJob-created Job without init containers: Completes, its first attempt through the proxy, the proxy ends."""
    ns = env.namespace("cron")
    rec.namespaces.append(ns)
    report = step("report", env.images.busybox, port=ISTIO_TRAFFIC, path="nightly", extra='echo "sent"; ')
    cron = {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "nightly-report"},
            "spec": {"schedule": "* * * * *", "concurrencyPolicy": "Forbid", "jobTemplate": {"spec": {
                "backoffLimit": 0, "template": {"spec": {
                    "restartPolicy": "Never", "terminationGracePeriodSeconds": 5, "containers": [report]}}}}}}
    env.kube.create(f"/apis/batch/v1/namespaces/{ns}/cronjobs", cron)
    # `initshift status -w cronjob/NAME` before its first run: it waits for the run, then follows it.
    watch = subprocess.Popen([sys.executable, "-m", "webhook.cli", "status", "-w", "-o", "json",
                              "cronjob/nightly-report", "-n", ns, "--kubeconfig", str(env.admin)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "NO_COLOR": "1"})

    def first_job() -> dict | None:
        jobs = (env.kube.get(f"/apis/batch/v1/namespaces/{ns}/jobs") or {}).get("items") or []
        return next((j for j in jobs if any(o.get("kind") == "CronJob" for o in j["metadata"].get(
            "ownerReferences") or [])), None)

    job = wait_for(first_job, 90, "the CronJob's first Job (the schedule is every minute)", interval=1.0)
    name = job["metadata"]["name"]
    env.kube.patch(f"/apis/batch/v1/namespaces/{ns}/cronjobs/nightly-report", {"spec": {"suspend": True}})
    seen = time.monotonic()
    job_done(env, ns, name)
    took = time.monotonic() - seen
    obj = _job_pod(env, ns, name)
    pod_name = obj["metadata"]["name"]
    assert managed(obj) == env.job_strategy, managed(obj)
    built = check_build(env, rec, ns, pod_name, steps=[], proxy="istio-proxy")
    lines = log_lines(env.kube, ns, pod_name, "report")
    assert first(lines, "^report fetched ") and first(lines, "^sent$"), [x.text for x in lines]
    ready, start = first(built.proxy, " ready$"), first(lines, "^report start$")
    recorded = record_times(built.obj, "report")  # a waiter's main; under native, the log's time
    began = recorded[0] if recorded else start.at if start else None
    assert ready and began and began >= proxy_instant(ready), "report started before the proxy was ready"
    stop = proxy_stop(built, "istio-proxy")
    if env.job_strategy == p.MODE_WAITER:
        assert stop == "quit endpoint", stop
    shown = initshift(env, "status", "cronjob/nightly-report", "-n", ns, "-o", "json", timeout=60)
    assert shown.returncode == 0 and json.loads(shown.stdout)["name"] == pod_name, (shown.returncode, shown.stderr)
    try:
        out, err = watch.communicate(timeout=120)
    finally:
        watch.kill()
    said = err.splitlines()
    # The run may come before the command has looked (a schedule's minute about to turn): then it is shown at once.
    waited = said[:1] == ["cronjob/nightly-report: no run yet; waiting for its next (schedule '* * * * *')"]
    assert watch.returncode == 0 and (f"cronjob/nightly-report: job/{name}" in said if waited else
                                      not any("cronjob/" in line for line in said)), \
        f"status -w exited {watch.returncode}, said:\n{err}"
    drawn = [doc["name"] for doc in json_documents(out)]
    assert drawn and set(drawn) == {pod_name}, f"status -w drew {drawn}"
    rec.note(f"strategy {managed(obj)}; first attempt through the proxy; proxy stopped by {stop}; "
             f"`initshift status cronjob/nightly-report` shows its pod, and `status -w`, started before the "
             f"first run, {'waited for it and ' if waited else 'found it at once and '}followed it to its end")
    rec.figure("Job completion (from the Job's creation seen)", took, "s")


# The clone's first try fails before it reaches the network (a flaky resolver, say): the
# marker on the pod's emptyDir tells the kubelet's second run it has been tried. The main
# fails its first try the same way: its second must still find the proxy.
_FLAKY = 'if [ ! -f /workspace/tried ]; then touch /workspace/tried; echo "clone flaked"; exit 1; fi; '


@scenario("job-on-failure")
def job_on_failure(env: Env, rec: Record) -> None:
    """A Job with `restartPolicy: OnFailure` whose clone and main fail at their first try,
    under each strategy the cluster runs: the kubelet runs the clone again in the same pod,
    the build waits for that run (and reads what it cloned), the main's second run still
    reaches the network through the proxy, the Job completes, the proxy ends, and where the
    watcher follows the pod its outcome is Succeeded."""
    ns = env.namespace("onfail")
    rec.namespaces.append(ns)
    mount = [{"name": "workspace", "mountPath": "/workspace"}]
    clone = step("clone", env.images.busybox, port=ISTIO_TRAFFIC, path="repo.git",
                 extra="echo cloned > /workspace/HEAD; ", volumeMounts=mount)
    clone["command"][-1] = _FLAKY + clone["command"][-1]
    build = step("build", env.images.busybox, port=ISTIO_TRAFFIC, extra="cat /workspace/HEAD; ", volumeMounts=mount)
    test = step("test", env.images.busybox, port=ISTIO_TRAFFIC, extra="cat /workspace/HEAD; ", volumeMounts=mount)
    test["command"][-1] = _FLAKY.replace("tried", "tested").replace("clone", "test") + test["command"][-1]
    modes = [*waiter_modes(env), *((p.MODE_NATIVE,) if env.native else ())]
    for mode in modes:
        env.kube.create(f"/apis/batch/v1/namespaces/{ns}/jobs", {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"retry-{mode}"},
            # OnFailure: each container restart counts against backoffLimit.
            "spec": {"backoffLimit": 3, "template": {
                "metadata": {"annotations": {p.ANNOTATION_MODE: mode}},
                "spec": {"restartPolicy": "OnFailure", "terminationGracePeriodSeconds": 5,
                         "initContainers": [clone, build], "containers": [test],
                         "volumes": [{"name": "workspace", "emptyDir": {}}]}}}})

    # A clone that never succeeds: at the backoffLimit the Job controller deletes the pod.
    doomed = step("clone", env.images.busybox, port=None, exit_code=1)
    env.kube.create(f"/apis/batch/v1/namespaces/{ns}/jobs", {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "give-up"},
        "spec": {"backoffLimit": 1, "template": {"spec": {
            "restartPolicy": "OnFailure", "terminationGracePeriodSeconds": 5, "initContainers": [doomed],
            "containers": [step("build", env.images.busybox, port=None)]}}}})
    # `initshift status -w job/NAME` goes on past that deletion, and says how the Job ended.
    give_up = subprocess.Popen([sys.executable, "-m", "webhook.cli", "status", "-w", "-o", "json", "job/give-up",
                                "-n", ns, "--kubeconfig", str(env.admin)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env={**os.environ, "NO_COLOR": "1"})

    def checked(mode: str) -> str:
        # `initshift logs -f job/NAME`, started before the Job has a pod: it waits for it,
        # then follows each step through the kubelet's second run of it.
        follow = subprocess.Popen([sys.executable, "-m", "webhook.cli", "logs", "-f", f"job/retry-{mode}", "-n", ns,
                                   "--kubeconfig", str(env.admin)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env={**os.environ, "NO_COLOR": "1"})
        job_done(env, ns, f"retry-{mode}")
        try:
            out, err = follow.communicate(timeout=120)
        finally:
            follow.kill()
        assert follow.returncode == 0, f"{mode}: logs -f exited {follow.returncode}: {err[-1000:]}"
        shown = [line.split(None, 1) for line in out.splitlines()]
        ends = [text for _, text in shown if text in ("clone end", "build end", "test end")]
        assert ends == ["clone end", "build end", "test end"], f"{mode}: logs -f showed\n{out}"
        notes = [" ".join(line.split()) for line in err.splitlines()]  # prefixes padded to the longest name
        for again in ("clone", "test"):  # how the last run ended, where the kubelet still says it
            assert {f"[{again}] run again by the kubelet (restart 1; the last run: Error, exit code 1)",
                    f"[{again}] run again by the kubelet (restart 1)"} & set(notes), f"{mode}: logs -f said\n{err}"
        obj = _job_pod(env, ns, f"retry-{mode}")
        name = obj["metadata"]["name"]
        built = check_build(env, rec, ns, name, steps=["clone", "build"], proxy="istio-proxy",
                            paths={"clone": "repo.git"}, strategy=mode)
        restarts = {c: (statuses(built.obj).get(c) or {}).get("restartCount") for c in ("clone", "build", "test")}
        assert restarts == {"clone": 1, "build": 0, "test": 1}, f"{mode}: restarts {restarts}"
        shown = initshift(env, "status", name, "-n", ns, timeout=60).stdout  # its table's RESTARTS column
        lines = shown.splitlines()
        at = next(i for i, line in enumerate(lines) if line.split()[:2] == ["#", "CONTAINER"])
        header, rows = lines[at], lines[at + 1:]
        rows = rows[:rows.index("")] if "" in rows else rows  # the Messages: block after
        cells = lambda line, a, b: line[header.index(a):header.index(b)].strip()  # noqa: E731
        counted = {cells(r, "CONTAINER", "KIND"): cells(r, "RESTARTS", "REASON") for r in rows}
        counted = {c: n for c, n in counted.items() if n}
        assert counted == {"clone": "1", "test": "1"}, f"{mode}: status showed\n{shown}"
        previous = _check_previous(env, ns, name, built.obj, mode)
        test = log_lines(env.kube, ns, name, "test")
        assert first(test, "^test fetched "), f"{mode}: test's second run found no proxy: {[x.text for x in test]}"
        assert first(log_lines(env.kube, ns, name, "build"), "^cloned$"), f"{mode}: build did not read the clone"
        assert first(log_lines(env.kube, ns, name, "test"), "^cloned$"), f"{mode}: test did not read the clone"
        said = "no watcher (the kubelet runs the steps)"
        if mode != p.MODE_NATIVE:  # the watcher follows the pods whose steps the waiter runs
            result = outcome(env.kube, ns, name)
            assert result["result"] == "Succeeded", f"{mode}: outcome {result}"
            said = "outcome Succeeded"
        return f"{mode}: clone and test run twice (`logs -f` followed both runs, `status` counts them, `logs -p` " \
               f"{previous}), {said}, proxy stopped by {proxy_stop(built, 'istio-proxy')}"

    with ThreadPoolExecutor(len(modes)) as pool:
        rec.note("; ".join(pool.map(checked, modes)))
    try:
        _, err = give_up.communicate(timeout=180)
    finally:
        give_up.kill()
    said = err.splitlines()
    # The watch sees the pod end, or (v1.34.9, often) the controller's deletion of it first.
    deleted = [line for line in said if line.startswith("job/give-up: pod/give-up-") and line.endswith(" was deleted")]
    assert give_up.returncode == 0 and said[-1:] == [
        "job/give-up: Failed (BackoffLimitExceeded: Job has reached the specified backoff limit)"] and \
        len(said) == 1 + len(deleted) <= 2, f"status -w job/give-up exited {give_up.returncode}, said:\n{err}"
    rec.note(f"a clone that always fails: at the backoffLimit the Job controller deletes the pod; `status -w "
             f"job/NAME` {'said the deletion and ' if deleted else 'saw the pod end, then said '}how the Job ended "
             f"(exit 0)")


def _check_previous(env: Env, ns: str, name: str, obj: dict, mode: str) -> str:
    """`initshift logs -p` on the ended pod shows the first (flaked) run of each container
    whose run before the kubelet still reports (`lastState`: not always once the pod has
    ended), as `kubectl logs -p -c` reads it, and how it ended; with none, an error. What it
    showed, for the record."""
    kept = [c for c in ("clone", "test") if (statuses(obj).get(c) or {}).get("lastState", {}).get("terminated")]
    shown = initshift(env, "logs", "-p", name, "-n", ns, timeout=60)
    if not kept:
        assert shown.returncode == 1 and "has a previous run" in shown.stderr, \
            f"{mode}: logs -p exited {shown.returncode}: {shown.stdout}{shown.stderr}"
        return "said the kubelet no longer reports the first runs"
    assert shown.returncode == 0, f"{mode}: logs -p exited {shown.returncode}: {shown.stderr}"
    lines = [" ".join(line.split()) for line in shown.stdout.splitlines()]
    assert lines == [f"[{c}] {c} flaked" for c in kept], f"{mode}: logs -p showed\n{shown.stdout}"
    notes = [" ".join(line.split()) for line in shown.stderr.splitlines()]
    assert notes == [f"[{c}] the previous run: Error, exit code 1" for c in kept], f"{mode}: logs -p said\n{shown.stderr}"
    for c in kept:  # one container alone, as kubectl reads its previous run (the waiter's lines too)
        alone = initshift(env, "logs", "-p", "-c", c, "--waiter", name, "-n", ns, timeout=60)
        theirs = kubectl(env.admin, "logs", "-p", "-c", c, "-n", ns, name)
        assert (alone.returncode, alone.stdout) == (0, theirs.stdout), f"{mode}: logs -p -c {c}: {alone.stdout!r} " \
                                                                       f"{alone.stderr!r}, kubectl: {theirs.stdout!r}"
    return f"showed the first runs of {' and '.join(kept)}"


@scenario("job-failure-policy")
def job_failure_policy(env: Env, rec: Record) -> None:
    """A Job whose `podFailurePolicy` names its containers, its clone step failing, under
    each strategy the cluster runs: the Job controller matches the rules as it would without
    initshift. Rule 0 fails the Job on the main's own failure, rule 1 on the clone's exit 3.
    Without initshift the main never starts (no exit code to match): rule 1 fails the Job.
    The waiter's skipped containers must not present the clone's failure as their own."""
    ns = env.namespace("podfail")
    rec.namespaces.append(ns)
    clone = step("clone", env.images.busybox, port=None, exit_code=3)
    build = step("build", env.images.busybox, port=None)
    test = step("test", env.images.busybox, port=None)
    modes = [*waiter_modes(env), *((p.MODE_NATIVE,) if env.native else ())]
    rules = [{"action": "FailJob", "onExitCodes": {"containerName": "test", "operator": "NotIn", "values": [0]}},
             {"action": "FailJob", "onExitCodes": {"containerName": "clone", "operator": "In", "values": [3]}}]
    for mode in modes:
        env.kube.create(f"/apis/batch/v1/namespaces/{ns}/jobs", {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"policy-{mode}"},
            "spec": {"backoffLimit": 2, "podFailurePolicy": {"rules": rules}, "template": {
                "metadata": {"annotations": {p.ANNOTATION_MODE: mode}},
                "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
                         "initContainers": [clone, build], "containers": [test]}}}})

    def checked(mode: str) -> str:
        def failed() -> dict | None:
            job = env.kube.get(f"/apis/batch/v1/namespaces/{ns}/jobs/policy-{mode}") or {}
            return next((c for c in (job.get("status") or {}).get("conditions") or []
                         if c["type"] == "Failed" and c["status"] == "True"), None)

        condition = wait_for(failed, JOB_TIMEOUT, f"Job policy-{mode} Failed", interval=0.5)
        message = condition.get("message", "")
        assert condition.get("reason") == "PodFailurePolicy", f"{mode}: {condition}"
        assert "Container clone " in message and "rule at index 1" in message, f"{mode}: {message}"
        pods = env.kube.pods(ns, f"job-name=policy-{mode}")
        assert len(pods) == 1, f"{mode}: the Job ran {len(pods)} pods"
        obj = pods[0]
        assert managed(obj) == mode, f"{mode}: managed {managed(obj)}"
        ran = {c: (statuses(obj).get(c) or {}).get("state", {}) for c in ("clone", "build", "test")}
        if mode != p.MODE_NATIVE:
            result = outcome(env.kube, ns, obj["metadata"]["name"])
            assert result["result"] == "Failed" and result["failed"] == "clone", f"{mode}: outcome {result}"
        return f"{mode}: FailJob by rule 1 (clone's exit 3); exit codes " + ", ".join(
            f"{c} {s['terminated']['exitCode']}" if "terminated" in s else f"{c} never ran" for c, s in ran.items())

    # Only the rule for the main: the clone's failure is counted, and the Job retries it
    # (`backoffLimit: 1`), as Kubernetes does where the main never started.
    env.kube.create(f"/apis/batch/v1/namespaces/{ns}/jobs", {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "retried"},
        "spec": {"suspend": True, "backoffLimit": 1, "podFailurePolicy": {"rules": rules[:1]}, "template": {
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
                     "initContainers": [clone, build], "containers": [test]}}}})

    def followed() -> str:
        """`initshift status -w job/retried`, started while the Job is suspended (no pod
        yet), waits for its first pod, then follows the retry to the Job's end."""
        watch = subprocess.Popen([sys.executable, "-m", "webhook.cli", "status", "-w", "job/retried", "-n", ns,
                                  "-o", "json", "--kubeconfig", str(env.admin)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            said = watch.stderr.readline()  # its first line, before the Job is resumed
            assert said == "job/retried: suspended, no pod yet; waiting for the Job controller to create one\n", said
            env.kube.patch(f"/apis/batch/v1/namespaces/{ns}/jobs/retried", {"spec": {"suspend": False}})
            out, rest = watch.communicate(timeout=JOB_TIMEOUT)
        finally:
            watch.kill()
        assert watch.returncode == 0, (watch.returncode, rest)
        names = [doc["name"] for doc in json_documents(out)]  # one per drawing
        pods = sorted(x["metadata"]["name"] for x in env.kube.pods(ns, "job-name=retried"))
        assert len(pods) == 2 and sorted(set(names)) == pods, (pods, names)
        assert rest.splitlines() == [f"job/retried: pod/{names[0]}", f"job/retried: next pod/{names[-1]}",
                                     "job/retried: Failed (BackoffLimitExceeded: Job has reached the specified "
                                     "backoff limit)"], rest
        job = env.kube.get(f"/apis/batch/v1/namespaces/{ns}/jobs/retried") or {}
        failed = [c for c in job["status"].get("conditions") or [] if c["type"] == "Failed"]
        assert failed and failed[0]["reason"] == "BackoffLimitExceeded", job["status"]
        return "retried (rule 0 only): the clone's failure counted, 2 pods, BackoffLimitExceeded, both followed " \
               "by `initshift status -w job/retried`, started while the Job was suspended"

    with ThreadPoolExecutor(len(modes) + 1) as pool:
        follow = pool.submit(followed)
        notes = list(pool.map(checked, modes))
        rec.note("; ".join([*notes, follow.result()]))
