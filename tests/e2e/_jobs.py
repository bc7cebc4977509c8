"""Jobs and CronJobs: the Job completes (its proxy does not keep the pod running) and its
first attempt reaches the network through the proxy."""

from __future__ import annotations

import time

from waiter import protocol as p

from ._check import check_build, proxy_instant, proxy_stop, record_times
from ._env import Env, Record, scenario
from ._kube import wait_for
from ._mesh import ISTIO_TRAFFIC
from ._pods import first, log_lines, managed, step

JOB_TIMEOUT = 240.0


def _job_done(env: Env, ns: str, name: str) -> dict:
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
    _job_done(env, ns, "clone-build")
    took = time.monotonic() - started
    obj = _job_pod(env, ns, "clone-build")
    name = obj["metadata"]["name"]
    built = check_build(env, rec, ns, name, steps=["git-clone"], proxy="istio-proxy",
                        paths={"git-clone": "repo.git"}, strategy=env.build_strategy)
    assert first(log_lines(env.kube, ns, name, "build"), "^cloned$"), "build did not see the clone"
    rec.note(f"strategy {managed(obj)}; proxy stopped by {proxy_stop(built, 'istio-proxy')}")
    rec.figure("Job completion", took, "s")


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

    def first_job() -> dict | None:
        jobs = (env.kube.get(f"/apis/batch/v1/namespaces/{ns}/jobs") or {}).get("items") or []
        return next((j for j in jobs if any(o.get("kind") == "CronJob" for o in j["metadata"].get(
            "ownerReferences") or [])), None)

    job = wait_for(first_job, 90, "the CronJob's first Job (the schedule is every minute)", interval=1.0)
    name = job["metadata"]["name"]
    env.kube.patch(f"/apis/batch/v1/namespaces/{ns}/cronjobs/nightly-report", {"spec": {"suspend": True}})
    seen = time.monotonic()
    _job_done(env, ns, name)
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
    rec.note(f"strategy {managed(obj)}; first attempt through the proxy; proxy stopped by {stop}")
    rec.figure("Job completion (from the Job's creation seen)", took, "s")
