"""`initshift status` against the in-process API double, through a real kubeconfig."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from typing import Callable

import pytest
import yaml

from tests.support.fixtures import pods
from tests.support.jsonstream import json_documents
from tests.support.kubedouble import KubeDouble, terminated
from tests.support.podstatus import at, done, init_done, pod, run, wait, with_status, write_kubeconfig
from tests.cli.test_podview import kpack_deadline_after_success, kpack_running
from waiter import protocol as p
from webhook.cli import _logs as logs_cmd
from webhook.cli import _status as status_cmd

BOUND = 20.0  # no wait here may take longer: a bug fails instead of hanging


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def cfg(kube: KubeDouble, tmp_path) -> str:
    return write_kubeconfig(tmp_path / "kubeconfig", kube.url)


async def status(*argv: str, out: io.StringIO | None = None) -> tuple[int, str, str]:
    out = out if out is not None else io.StringIO()
    err = io.StringIO()
    code = await status_cmd.run(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


async def eventually(check: Callable[[], object], what: str) -> object:
    loop = asyncio.get_running_loop()
    end = loop.time() + BOUND
    while not (value := check()):
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)
    return value


def table(text: str) -> dict[str, dict[str, str]]:
    """The first table in `text`: container -> column -> cell, cut at the header's offsets."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("#  "))
    header = lines[start]
    names = header.split()
    offsets = [header.index(n) for n in names] + [None]
    rows: dict[str, dict[str, str]] = {}
    for line in lines[start + 1:]:
        if not line.strip():
            break
        cells = {n: line[a:b].strip() for n, a, b in zip(names, offsets, offsets[1:])}
        rows[cells["CONTAINER"]] = cells
    return rows


async def test_table_lists_containers_in_execution_order(kube: KubeDouble, cfg: str) -> None:
    kube.put_pod(kpack_running())
    code, out, err = await status("build-1", "--kubeconfig", cfg)  # namespace from the context
    assert (code, err) == (0, "")
    assert "builds/build-1, rewritten by initshift (waiter)" in out and "Result:  Running" in out
    rows = table(out)
    assert list(rows) == ["istio-init", "initshift-init", "prepare", "analyze", "detect", "restore", "build", "export",
                          "completion", "istio-proxy"]
    assert [rows[n]["#"] for n in ("initshift-init", "prepare", "export", "completion")] == ["", "1", "6", ""]
    assert rows["export"]["STATE"] == "waiting for step 5" and rows["completion"]["STATE"] == "waiting for step 6"
    assert rows["prepare"] == {"#": "1", "CONTAINER": "prepare", "KIND": "step", "STATE": "completed", "EXIT": "0",
                               "REASON": "Completed", "STARTED": "10:00:05Z", "DURATION": "4.0s"}
    assert "\x1b[" not in out  # not a terminal: no colour


async def test_a_table_of_a_pod_whose_containers_ran_again_counts_the_runs(kube: KubeDouble, cfg: str) -> None:
    """restartPolicy OnFailure: a RESTARTS column (as kubectl's) once a container has been run
    again, blank for those that were not; without restarts the table has none."""
    job = with_status(pod("job-istio"), init=[init_done("istio-init", 0, 1), init_done("initshift-init", 1, 2)],
                      containers=[{**done("git-clone", 15, 16), "restartCount": 1}, run("build", 3),
                                  run("istio-proxy", 3)])
    job["spec"]["restartPolicy"] = "OnFailure"
    kube.put_pod(job)
    code, out, _ = await status("build-1", "--kubeconfig", cfg)
    rows = table(out)
    assert code == 0 and rows["git-clone"]["RESTARTS"] == "1" and rows["build"]["RESTARTS"] == ""
    assert rows["git-clone"]["EXIT"] == "0" and rows["git-clone"]["REASON"] == "Completed"
    kube.put_pod(kpack_running())
    assert "RESTARTS" not in (await status("build-1", "--kubeconfig", cfg))[1]


async def test_json_and_yaml_outputs(kube: KubeDouble, cfg: str) -> None:
    kube.put_pod(kpack_running())
    code, out, _ = await status("build-1", "-n", "builds", "-o", "json", "--kubeconfig", cfg)
    data = json.loads(out)
    assert code == 0 and [c["name"] for c in data["containers"]][2:4] == ["prepare", "analyze"]
    assert data["containers"][3]["state"] == "running"
    code, out, _ = await status("build-1", "-o", "yaml", "--kubeconfig", cfg)
    assert code == 0 and yaml.safe_load(out) == data | {"containers": yaml.safe_load(out)["containers"]}
    assert [c["state"] for c in yaml.safe_load(out)["containers"]] == [c["state"] for c in data["containers"]]


def created(pod: dict, seconds_ago: float, **meta: str) -> dict:
    when = datetime.now(timezone.utc) - timedelta(seconds=seconds_ago)
    pod["metadata"].update(creationTimestamp=when.strftime("%Y-%m-%dT%H:%M:%SZ"), **meta)
    return pod


async def test_without_a_pod_one_line_per_pod_initshift_rewrote(kube: KubeDouble, cfg: str) -> None:
    """The build history of a namespace, oldest first: strategy, steps done, where each stands."""
    kube.put_pod(created(kpack_running(), 125))
    kube.put_pod(created(kpack_deadline_after_success(), 3 * 3600, name="build-0"))
    kube.put_pod(created(kpack_running(), 45 * 60, namespace="ci", name="nightly"))
    kube.put_pod(created(pod("kpack-istio", "untouched", rewritten=False), 10))  # not initshift's: not listed
    code, out, err = await status("--kubeconfig", cfg)
    assert (code, err) == (0, "")
    assert out.splitlines() == ["NAME     STRATEGY  STEPS  STATUS            AGE",
                                "build-0  waiter    6/6    Succeeded         3h",
                                "build-1  waiter    1/6    analyze: running  2m"]
    code, out, _ = await status("-A", "--kubeconfig", cfg)
    assert code == 0 and [line.split()[:2] for line in out.splitlines()] == [
        ["NAMESPACE", "NAME"], ["builds", "build-0"], ["builds", "build-1"], ["ci", "nightly"]]
    assert out.splitlines()[3].endswith("analyze: running  45m")
    code, out, _ = await status("-o", "json", "--kubeconfig", cfg)
    items = json.loads(out)["items"]
    assert [(i["name"], i["result"]) for i in items] == [("build-0", "Succeeded"), ("build-1", "Running")]
    one = json.loads((await status("build-1", "-o", "json", "--kubeconfig", cfg))[1])  # the pod's own view
    assert [(c["name"], c["state"]) for c in items[1]["containers"]] == [(c["name"], c["state"]) for c in
                                                                         one["containers"]]
    assert [r.query.get("labelSelector") for r in kube.requests if r.path == "/api/v1/namespaces/builds/pods"] == \
        [p.LABEL_MANAGED, p.LABEL_MANAGED]
    code, out, err = await status("-n", "empty", "--kubeconfig", cfg)
    assert (code, out, err) == (0, "", "No pod rewritten by initshift in namespace empty.\n")


async def test_without_a_pod_watch_prints_each_pod_whose_line_changed(kube: KubeDouble, cfg: str) -> None:
    """`status -w` without POD, not on a terminal: the table, then a line per pod whose line
    changed (as `kubectl get -w`), from a watch; until interrupted."""
    kube.put_pod(created(with_status(pod("job-istio"), init=[init_done("istio-init", 0, 1), init_done(
        "initshift-init", 1, 2)], containers=[run("git-clone", 3), run("build", 3), run("istio-proxy", 3)]), 125))
    out = io.StringIO()
    task = asyncio.create_task(status("-w", "--kubeconfig", cfg, out=out))
    await eventually(lambda: "git-clone: running" in out.getvalue(), "the first table")
    await eventually(lambda: kube.open_watches, "the watch")
    kube.set_container_statuses("builds", "build-1", [done("git-clone", 3, 6)])
    await eventually(lambda: "build: running" in out.getvalue(), "the changed line")
    kube.put_pod(created(pod("job-istio", "build-2"), 5))
    await eventually(lambda: "build-2" in out.getvalue(), "a new pod's line")
    task.cancel()  # as Ctrl-C
    await asyncio.gather(task, return_exceptions=True)
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["NAME", "STRATEGY", "STEPS", "STATUS", "AGE"] and len(lines) == 4, lines
    assert lines[1].split()[:5] == ["build-1", "waiter", "0/1", "git-clone:", "running"]
    assert lines[2].split()[:5] == ["build-1", "waiter", "1/1", "build:", "running"]
    assert lines[3].startswith("build-2 ")
    assert lines[2].index("build:") == lines[0].index("STATUS")  # one set of columns


async def test_without_a_pod_watch_on_a_terminal_redraws_in_place(kube: KubeDouble, cfg: str,
                                                                  monkeypatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    kube.put_pod(created(kpack_running(), 125))
    out = Tty()
    task = asyncio.create_task(status("-w", "--kubeconfig", cfg, out=out))
    await eventually(lambda: out.getvalue().count("\x1b[H\x1b[J") >= 2, "a redraw on the tick")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    drawings = out.getvalue().split("\x1b[H\x1b[J")[1:]
    assert all(d.splitlines()[1].startswith("build-1  waiter    1/6    analyze: running") for d in drawings)


async def test_without_a_pod_watch_ends_on_a_refusal(kube: KubeDouble, cfg: str) -> None:
    kube.fail_next("/api/v1/namespaces/builds/pods", 403, message='pods is forbidden: User "dev" cannot list')
    code, out, err = await asyncio.wait_for(status("-w", "--kubeconfig", cfg), BOUND)
    assert (code, out) == (1, "")
    assert err == 'initshift status: cannot watch the pods of namespace builds: pods is forbidden: User "dev" ' \
                  'cannot list\n'


async def test_without_a_pod_watch_says_when_it_watches_again(kube: KubeDouble, cfg: str) -> None:
    kube.put_pod(created(kpack_running(), 125))
    kube.fail_next("/api/v1/namespaces/builds/pods", 500, message="etcdserver: leader changed")
    out, err = io.StringIO(), io.StringIO()
    task = asyncio.create_task(status_cmd.run(["-w", "--kubeconfig", cfg], out, err))
    await eventually(lambda: "analyze: running" in out.getvalue(), "the table after the retry")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert err.getvalue() == "initshift status: the watch broke (etcdserver: leader changed); watching again\n"


async def test_without_a_pod_watch_says_a_repeated_break_once(kube: KubeDouble, cfg: str) -> None:
    kube.put_pod(created(kpack_running(), 125))
    kube.fail_next("/api/v1/namespaces/builds/pods", 500, times=3, message="etcdserver: leader changed")
    out, err = io.StringIO(), io.StringIO()
    task = asyncio.create_task(status_cmd.run(["-w", "--kubeconfig", cfg], out, err))
    await eventually(lambda: "analyze: running" in out.getvalue(), "the table after the retries")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert err.getvalue() == "initshift status: the watch broke (etcdserver: leader changed); watching again\n"


async def test_without_a_pod_watch_of_an_apiserver_never_reached_ends_as_the_list_does(tmp_path) -> None:
    dead = write_kubeconfig(tmp_path / "dead", "http://127.0.0.1:9")  # the discard port: nothing listens
    for extra in ((), ("-w",)):
        code, out, err = await asyncio.wait_for(status(*extra, "--kubeconfig", dead), BOUND)
        assert (code, out) == (1, "")
        assert err == "initshift status: cannot reach the Kubernetes API: GET /api/v1/namespaces/builds/pods: " \
                      "cannot connect to 127.0.0.1:9: connection refused\n"


async def test_all_namespaces_is_for_the_list(kube: KubeDouble, cfg: str, capsys) -> None:
    code, _, _ = await status("build-1", "-A", "--kubeconfig", cfg)
    assert code == 2
    assert capsys.readouterr().err.splitlines()[-1] == \
        "initshift status: -A is for the list: leave out POD (a pod's namespace is -n) (see --help)"


async def test_the_list_by_labels(kube: KubeDouble, cfg: str, capsys) -> None:
    """-l SELECTOR: the pods initshift rewrote that have those labels (as kubectl's -l; the
    apiserver reads the selector), in the list and its watch; not with POD."""
    kube.put_pod(created(kpack_running(), 125, labels={"app": "ci", p.LABEL_MANAGED: p.MODE_WAITER}))
    kube.put_pod(created(kpack_deadline_after_success(), 3600, name="build-0"))
    code, out, err = await status("-l", "app=ci", "--kubeconfig", cfg)
    assert (code, err, [line.split()[0] for line in out.splitlines()]) == (0, "", ["NAME", "build-1"])
    code, out, _ = await status("-l", "app!=ci", "--kubeconfig", cfg)
    assert (code, [line.split()[0] for line in out.splitlines()]) == (0, ["NAME", "build-0"])
    code, out, err = await status("--selector", "app=nope", "--kubeconfig", cfg)
    assert (code, out, err) == (0, "", "No pod rewritten by initshift in namespace builds with labels app=nope.\n")
    code, out, err = await status("-l", "app in (ci", "--kubeconfig", cfg)  # the apiserver's 400, in its words
    assert (code, out) == (1, "") and err.startswith(
        "initshift status: cannot list the pods of namespace builds with labels app in (ci: unable to parse ")
    out = io.StringIO()
    task = asyncio.create_task(status("-w", "-l", "app=ci", "--kubeconfig", cfg, out=out))
    await eventually(lambda: kube.open_watches, "the watch")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert [line.split()[0] for line in out.getvalue().splitlines()] == ["NAME", "build-1"]
    asked = {r.query.get("labelSelector") for r in kube.requests if r.path == "/api/v1/namespaces/builds/pods"}
    assert asked == {f"{p.LABEL_MANAGED},{x}" for x in ("app=ci", "app!=ci", "app=nope", "app in (ci")}
    code, _, _ = await status("build-1", "-l", "app=ci", "--kubeconfig", cfg)
    assert code == 2
    assert capsys.readouterr().err.splitlines()[-1] == "initshift status: -l is for the list: leave out POD (see --help)"


async def test_deadline_exceeded_pod_reads_as_succeeded(kube: KubeDouble, cfg: str) -> None:
    kube.put_pod(kpack_deadline_after_success())
    code, out, _ = await status("build-1", "--kubeconfig", cfg)
    assert code == 0
    assert "Result:  Succeeded: 6 steps and 1 main succeeded" in out
    assert "Phase:   Failed (DeadlineExceeded); sidecars stopped by deadline" in out
    assert "the phase comes from ending the sidecars" in out
    assert "istio-proxy: stopped by deadline" in out


async def test_a_pod_being_deleted_reads_as_terminating(kube: KubeDouble, cfg: str) -> None:
    """A cancelled build while the kubelet stops it: as `kubectl get` says it, Terminating,
    with when the deletion was asked for (its deletionTimestamp less its grace period)."""
    running = kpack_running()
    running["metadata"].update(deletionTimestamp="2024-05-01T10:05:20Z", deletionGracePeriodSeconds=20)
    kube.put_pod(running)
    code, out, _ = await status("build-1", "--kubeconfig", cfg)
    assert code == 0 and "Phase:   Running, Terminating (deleted at 10:05:00Z)\n" in out
    one = json.loads((await status("build-1", "-o", "json", "--kubeconfig", cfg))[1])
    assert one["deletedAt"] == "2024-05-01T10:05:00Z"
    code, out, _ = await status("--kubeconfig", cfg)
    assert out.splitlines()[1].split()[:4] == ["build-1", "waiter", "1/6", "Terminating"]
    del running["metadata"]["deletionTimestamp"]
    kube.put_pod(running)
    one = json.loads((await status("build-1", "-o", "json", "--kubeconfig", cfg))[1])
    assert one["deletedAt"] is None and one["phase"] == "Running"


async def test_never_rewritten_pod_shows_its_init_containers(kube: KubeDouble, cfg: str) -> None:
    plain = with_status(pod("job", rewritten=False), init=[init_done("git-clone", 0, 4, 128)],
                        containers=[wait("build")], phase="Failed")
    kube.put_pod(plain)
    code, out, _ = await status("build-1", "--kubeconfig", cfg)
    rows = table(out)
    assert code == 0 and "not rewritten by initshift" in out and "Result:  Failed" in out
    assert [(r["#"], r["KIND"], r["STATE"], r["EXIT"], r["REASON"]) for r in rows.values()] == [
        ("1", "step", "failed", "128", "Error"), ("", "main", "not run", "", "NotRun")]


async def test_a_pod_left_as_it_was_shows_the_reason(kube: KubeDouble, cfg: str) -> None:
    plain = with_status(pods.not_rewritten(pod("job", rewritten=False), "no-sidecar"),
                        init=[init_done("git-clone", 0, 4, 0)], containers=[run("build")], phase="Running")
    kube.put_pod(plain)
    code, out, _ = await status("build-1", "--kubeconfig", cfg)
    assert code == 0 and "not rewritten by initshift (reason: no-sidecar)" in out
    code, out, _ = await status("build-1", "--kubeconfig", cfg, "-o", "json")
    assert code == 0 and json.loads(out)["notRewritten"] == "no-sidecar"


def job_attempt(name: str, created: str) -> dict:
    """kpack_running() as attempt `name` of Job `report` (the labels the Job controller sets)."""
    attempt = kpack_running()
    attempt["metadata"].update(name=name, creationTimestamp=created)
    attempt["metadata"].setdefault("labels", {}).update({"job-name": "report", "batch.kubernetes.io/job-name": "report"})
    return attempt


async def test_a_job_names_its_newest_pod(kube: KubeDouble, cfg: str) -> None:
    """`job/NAME`, as kubectl takes it: a user knows the Job, not its pod's generated name.
    A Job that retried has a pod per attempt: the newest is shown, and said."""
    kube.put_pod(job_attempt("report-a1b2c", "2024-05-01T10:00:00Z"))
    code, out, err = await status("job/report", "--kubeconfig", cfg)
    assert (code, err) == (0, "") and "builds/report-a1b2c, rewritten by initshift (waiter)" in out
    kube.put_pod(job_attempt("report-z9y8x", "2024-05-01T10:04:00Z"))
    kube.put_pod(job_attempt("report-m5n6o", "2024-05-01T10:02:00Z"))
    code, out, err = await status("jobs.batch/report", "--kubeconfig", cfg, "-o", "json")
    assert (code, json.loads(out)["name"]) == (0, "report-z9y8x")
    assert err == "Found 3 pods, using pod/report-z9y8x (the newest)\n"
    code, out, err = await status("pod/report-m5n6o", "--kubeconfig", cfg, "-o", "json")
    assert (code, err, json.loads(out)["name"]) == (0, "", "report-m5n6o")


def cron_run(job: str, created: str, cronjob: str = "nightly") -> dict:
    """Job `job` as the CronJob controller makes one for `cronjob`: owned by it."""
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": job, "namespace": "builds", "creationTimestamp": created, "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "CronJob", "name": cronjob, "uid": f"uid-{cronjob}",
                 "controller": True, "blockOwnerDeletion": True}]},
            "spec": {"template": {}}}


async def test_a_cronjob_names_its_newest_runs_pod(kube: KubeDouble, cfg: str) -> None:
    """`cronjob/NAME`: the pod of the CronJob's newest Job, by owner (another CronJob's Job,
    newer still, is not one of its runs); which Job was taken is said when it keeps several."""
    kube.put("jobs", cron_run("nightly-28000", "2024-05-01T03:00:00Z"))
    kube.put("jobs", cron_run("nightly-29440", "2024-05-02T03:00:00Z"))
    kube.put("jobs", cron_run("weekly-29500", "2024-05-03T03:00:00Z", cronjob="weekly"))
    for job, pod_name in (("nightly-28000", "nightly-28000-aaaaa"), ("nightly-29440", "nightly-29440-bbbbb")):
        attempt = job_attempt(pod_name, "2024-05-02T03:00:01Z")
        attempt["metadata"]["labels"].update({"job-name": job, "batch.kubernetes.io/job-name": job})
        kube.put_pod(attempt)
    code, out, err = await status("cronjob/nightly", "--kubeconfig", cfg, "-o", "json")
    assert (code, json.loads(out)["name"]) == (0, "nightly-29440-bbbbb")
    assert err == "Found 2 jobs, using job/nightly-29440 (the newest)\n"
    code, out, err = await status("cj/weekly", "--kubeconfig", cfg)
    assert (code, out, err) == (1, "", "initshift status: job weekly-29500 has no pods in namespace builds\n")
    kube.fail_next("/apis/batch/v1/namespaces/builds/jobs", 403, message='jobs.batch is forbidden: User "dev" '
                                                                          'cannot list resource "jobs"')
    code, out, err = await status("cronjob/nightly", "--kubeconfig", cfg)
    assert (code, out, err) == (1, "", 'initshift status: no permission to list the jobs of cronjob builds/nightly: '
                                       'jobs.batch is forbidden: User "dev" cannot list resource "jobs"\n')


async def test_watch_of_a_cronjob_follows_its_newest_job(kube: KubeDouble, cfg: str) -> None:
    """`-w cronjob/NAME` follows the run it shows as `-w job/NAME` would, then ends."""
    run = cron_run("report", "2024-05-01T03:00:00Z")
    kube.put("jobs", {**run, "status": report_job("Complete")["status"]})
    kube.put_pod(ended_attempt("report-a1b2c", "2024-05-01T10:00:00Z", "Succeeded"))
    code, out, err = await asyncio.wait_for(status("cronjob/nightly", "-w", "-o", "json", "--kubeconfig", cfg), BOUND)
    assert (code, err) == (0, "job/report: Complete\n") and json.loads(out)["name"] == "report-a1b2c"
    assert job_reads(kube) == 1  # the Job of its run, read for its next pod, and its end said


def nightly_cronjob() -> dict:
    """A CronJob that has not run yet."""
    return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "nightly", "namespace": "builds"},
            "spec": {"schedule": "0 3 * * *", "jobTemplate": {"spec": {"template": {"spec": {
                "restartPolicy": "Never", "containers": [{"name": "report", "image": "busybox"}]}}}}}}


FORBIDDEN = 'cannot get resource "{}" in API group "batch"'


@pytest.mark.parametrize("ref, setup, message", [
    ("job/report", lambda kube: kube.put("jobs", report_job()), "job report has no pods in namespace builds"),
    ("job/typo", lambda kube: None, "job typo not found in namespace builds"),
    ("job/report", lambda kube: kube.fail_next("/apis/batch/v1/namespaces/builds/jobs/report", 403,
                                               message=FORBIDDEN.format("jobs")),
     "job report has no pods in namespace builds"),  # no `get` on jobs: cannot tell, as before
    ("cronjob/typo", lambda kube: None, "cronjob typo not found in namespace builds"),
    ("cj/nightly", lambda kube: kube.fail_next("/apis/batch/v1/namespaces/builds/cronjobs/nightly", 403,
                                               message=FORBIDDEN.format("cronjobs")),
     "cronjob nightly has no jobs in namespace builds"),
    ("cronjob/nightly", lambda kube: kube.put("cronjobs", nightly_cronjob()),
     "cronjob nightly has no jobs in namespace builds"),
], ids=["job-without-pods", "job-typo", "job-unreadable", "cronjob-typo", "cronjob-unreadable",
        "cronjob-without-runs"])
async def test_what_names_no_pod_is_one_line(kube: KubeDouble, cfg: str, ref: str, setup, message: str) -> None:
    """A mistyped Job or CronJob is not found, as kubectl says it (`jobs.batch "typo" not
    found`), not one without pods or runs."""
    setup(kube)
    code, out, err = await status(ref, "--kubeconfig", cfg)
    assert (code, out, err) == (1, "", f"initshift status: {message}\n")


async def test_a_404_page_that_is_not_the_apis_is_said_as_it_came(tmp_path) -> None:
    """A server URL missing a proxy's path: a 404 from something other than the apiserver is
    not "pod NAME not found"."""
    from aiohttp import web

    async def page(request: web.Request) -> web.Response:  # Go's http.NotFound, as a bare server says it
        return web.Response(status=404, text="404 page not found\n")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", page)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        cfg = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}")
        code, out, err = await status("build-1", "--kubeconfig", cfg)
        assert (code, out, err) == (1, "", "initshift status: cannot read pod builds/build-1: 404: 404 page not found\n")
        code, out, err = await status("job/report", "--kubeconfig", cfg)
        assert (code, out, err) == (1, "", "initshift status: cannot list the pods of job builds/report: 404: "
                                           "404 page not found\n")
    finally:
        await runner.cleanup()


SUBDOMAIN = ("expected a Kubernetes name (RFC 1123 subdomain: lower-case letters, digits and '-', and dots, at most "
             "253 characters)")


@pytest.mark.parametrize("ref, message", [
    ("deployment/web", "deployment/web: a pod's name (or pod/NAME), job/NAME or cronjob/NAME, not deployment/"),
    ("job/", "job/: no name after the /"),
    ("job/foo/bar", "job/foo/bar: a resource/name may not have more than one slash"),
    ("/foo", "/foo: no kind before the /"),
    ("", "an empty name"),
    # Names that would address another object: `..` read the Namespace as the pod, `?` began a query.
    ("..", f"{SUBDOMAIN}, got '..'"),
    ("build-1?watch=1", f"{SUBDOMAIN}, got 'build-1?watch=1'"),
    ("job/a?b", f"job/a?b: {SUBDOMAIN}, got 'a?b'"),
    ("Build-1", f"{SUBDOMAIN}, got 'Build-1'"),
])
async def test_a_pod_argument_of_another_form_is_a_usage_error(tmp_path, capsys, ref: str, message: str) -> None:
    """Said before any cluster access: the kubeconfig named does not even exist."""
    code, out, err = await status(ref, "--kubeconfig", str(tmp_path / "missing"))
    assert (code, out, err) == (2, "", "")  # argparse's line goes to sys.stderr
    assert capsys.readouterr().err == f"initshift status: argument POD: {message} (see --help)\n"


@pytest.mark.parametrize("argv", [["-n", ".."], ["build-1", "-n", ".."], ["build-1", "-n", "builds?x=1"],
                                  ["-n", ""], ["-A", "-n", "Builds"]])
async def test_a_namespace_that_is_no_name_is_a_usage_error(tmp_path, capsys, argv: list[str]) -> None:
    """As every -n is held (check, watch, review): `-n ..` listed the pods of every namespace."""
    code, out, err = await status(*argv, "--kubeconfig", str(tmp_path / "missing"))
    assert (code, out, err) == (2, "", "")
    assert capsys.readouterr().err == (f"initshift status: argument -n/--namespace: expected a Kubernetes name (RFC "
                                       f"1123 label: lower-case letters, digits and '-', at most 63 characters), got "
                                       f"{argv[argv.index('-n') + 1]!r} (see --help)\n")


@pytest.mark.parametrize("setup, message", [
    (lambda kube: None, "initshift status: pod build-1 not found in namespace builds\n"),
    (lambda kube: kube.fail_next("/api/v1/namespaces/builds/pods/build-1", 403,
                                 message='pods "build-1" is forbidden: User "dev" cannot get resource "pods" in '
                                         'API group "" in the namespace "builds"'),
     'initshift status: no permission to read pod builds/build-1: pods "build-1" is forbidden: User "dev" cannot '
     'get resource "pods" in API group "" in the namespace "builds"\n'),
    (lambda kube: kube.put_pod(with_status(pod("no-init-istio", rewritten=False), containers=[run("build")])),
     "initshift status: pod build-1 is not managed by initshift as a build (initshift.io/managed is not set) "
     "and has no init containers to show\n"),
], ids=["missing", "forbidden", "not-managed"])
async def test_one_line_errors(kube: KubeDouble, cfg: str, setup, message: str) -> None:
    setup(kube)
    code, out, err = await status("build-1", "--kubeconfig", cfg)
    assert (code, out, err) == (1, "", message)


async def test_unreadable_kubeconfig_and_unreachable_server(tmp_path) -> None:
    code, _, err = await status("x", "--kubeconfig", str(tmp_path / "missing"))
    assert code == 1 and err.startswith("initshift status: kubeconfig ") and err.count("\n") == 1
    dead = write_kubeconfig(tmp_path / "dead", "http://127.0.0.1:9")  # the discard port: nothing listens
    code, _, err = await status("x", "--kubeconfig", dead)
    assert code == 1 and err.startswith("initshift status: cannot reach the Kubernetes API") \
        and err.count("\n") == 1 and err.endswith("cannot connect to 127.0.0.1:9: connection refused\n")


async def test_colour_on_a_terminal_only_and_never_with_no_color(kube: KubeDouble, cfg: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    kube.put_pod(kpack_deadline_after_success())
    monkeypatch.delenv("NO_COLOR", raising=False)
    _, out, _ = await status("build-1", "--kubeconfig", cfg, out=Tty())
    assert "\x1b[32mSucceeded\x1b[0m" in out and "\x1b[32mcompleted" in out
    monkeypatch.setenv("NO_COLOR", "1")
    _, out, _ = await status("build-1", "--kubeconfig", cfg, out=Tty())
    assert "\x1b[" not in out


async def test_watch_redraws_as_the_pod_progresses_and_stops_when_it_ends(kube: KubeDouble, cfg: str) -> None:
    start = with_status(pod("job-istio"), init=[init_done("istio-init", 0, 1), init_done("initshift-init", 1, 2)],
                        containers=[run("git-clone", 3), run("build", 3), run("istio-proxy", 3, ready=False)])
    kube.put_pod(start)
    out = io.StringIO()
    task = asyncio.create_task(status("build-1", "--watch", "--kubeconfig", cfg, out=out))
    await eventually(lambda: "waiting for sidecars" in out.getvalue(), "the first drawing")
    await eventually(lambda: kube.open_watches, "the watch")

    kube.set_container_statuses("builds", "build-1", [run("istio-proxy", 3)])
    kube.put_pod({**kube.pod("builds", "build-1"), "metadata": {
        **kube.pod("builds", "build-1")["metadata"],
        "annotations": {**kube.pod("builds", "build-1")["metadata"]["annotations"], p.ANNOTATION_READY: "true"}}})
    await eventually(lambda: out.getvalue().count("Result:") >= 2, "a redraw")
    kube.set_container_statuses("builds", "build-1", [done("git-clone", 5, 9), done("build", 9, 20)])
    kube.set_container_statuses("builds", "build-1", [terminated("istio-proxy", 0, started_at=at(3),
                                                                 finished_at=at(21))])
    outcome = {"result": "Succeeded", "failed": None, "message": "1 step and 1 main succeeded", "steps": [],
               "mains": [], "sidecarsStoppedBy": "quit", "decidedAt": at(22)}
    current = kube.pod("builds", "build-1")
    current["metadata"]["annotations"][p.ANNOTATION_OUTCOME] = json.dumps(outcome)
    kube.put_pod(current)
    kube.set_container_statuses("builds", "build-1", phase="Succeeded")
    code, text, err = await asyncio.wait_for(task, BOUND)
    assert (code, err) == (0, "")
    drawings = text.split("Pod:     ")[1:]
    states = [table(d)["git-clone"]["STATE"] for d in drawings]
    assert states[0] == "waiting for sidecars" and states[-1] == "completed" and "running" in states
    assert table(drawings[-1])["istio-proxy"]["STATE"] == "stopped"
    assert "Result:  Succeeded: 1 step and 1 main succeeded" in drawings[-1]
    assert all(d != e for d, e in zip(drawings, drawings[1:]))  # only changes are redrawn


async def test_watch_ends_with_a_message_when_the_pod_is_deleted(kube: KubeDouble, cfg: str) -> None:
    kube.put_pod(kpack_running())
    task = asyncio.create_task(status("build-1", "-w", "-o", "json", "--kubeconfig", cfg))
    await eventually(lambda: kube.open_watches, "the watch")
    kube.delete("pods", "builds", "build-1")
    code, out, err = await asyncio.wait_for(task, BOUND)
    assert (code, err) == (1, "initshift status: pod builds/build-1 was deleted\n")
    assert json.loads(out)["name"] == "build-1"


@pytest.mark.parametrize("kube", ["v1.34.9"], indirect=True)
async def test_watch_keeps_the_first_deletion_time_the_kubelets_last_delete_moves(kube: KubeDouble,
                                                                                   cfg: str) -> None:
    """A cancelled build whose pod a finalizer holds: the kubelet's last delete moves its
    deletionTimestamp (kubernetes#122646: the double as v1.34.9); `-w` keeps saying when the
    deletion was asked for."""
    running = kpack_running()
    running["metadata"]["finalizers"] = ["batch.kubernetes.io/job-tracking"]
    running["spec"].update(nodeName="node-a", terminationGracePeriodSeconds=20)
    kube.put_pod(running)
    out = io.StringIO()
    task = asyncio.create_task(status("build-1", "-w", "-o", "json", "--kubeconfig", cfg, out=out))
    await eventually(lambda: kube.open_watches, "the watch")

    def drawn() -> list[str | None]:
        text, decoder, docs, at = out.getvalue(), json.JSONDecoder(), [], 0
        while text[at:].strip():
            doc, at = decoder.raw_decode(text, len(text) - len(text[at:].lstrip()))
            docs.append(doc["deletedAt"])
        return docs

    asked = datetime(2024, 5, 1, 10, 5, 0, tzinfo=timezone.utc)
    kube.delete_pod("builds", "build-1", at=asked)
    await eventually(lambda: drawn()[-1], "the deletion drawn")
    kube.set_container_statuses("builds", "build-1", [terminated("istio-proxy", 0)])  # (the kubelet stopping it)
    kube.delete_pod("builds", "build-1", 0, at=asked + timedelta(seconds=7))  # the kubelet's, once it stopped all
    assert kube.pod("builds", "build-1")["metadata"]["deletionTimestamp"] == "2024-05-01T10:05:07Z"
    await eventually(lambda: len(drawn()) >= 3, "the kubelet's delete drawn")
    kube.merge("pods", "builds", "build-1", {"metadata": {"finalizers": None}})
    code, _, err = await asyncio.wait_for(task, BOUND)
    assert (code, err) == (1, "initshift status: pod builds/build-1 was deleted\n")
    assert drawn() == [None, "2024-05-01T10:05:00Z", "2024-05-01T10:05:00Z"], drawn()


def test_the_installed_command_prints_one_line_and_no_traceback(tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-m", "webhook.cli", "status", "x", "--kubeconfig",
                           str(tmp_path / "missing")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("initshift status: kubeconfig ") and proc.stderr.count("\n") == 1
    listed = subprocess.run([sys.executable, "-m", "webhook.cli", "--help"], capture_output=True, text=True,
                            timeout=60).stdout
    assert "\n  status " in listed and "\n  logs " in listed


async def test_watch_on_a_terminal_redraws_in_place(kube: KubeDouble, cfg: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    kube.put_pod(kpack_running())
    out = Tty()
    task = asyncio.create_task(status("build-1", "-w", "--kubeconfig", cfg, out=out))
    await eventually(lambda: kube.open_watches, "the watch")
    finished = kpack_deadline_after_success()
    current = kube.pod("builds", "build-1")
    current["metadata"]["annotations"] = finished["metadata"]["annotations"]
    kube.put_pod(current)
    kube.set_container_statuses("builds", "build-1", finished["status"]["containerStatuses"], phase="Failed",
                                reason="DeadlineExceeded")
    code, text, _ = await asyncio.wait_for(task, BOUND)
    screens = text.split("\x1b[H\x1b[J")
    assert code == 0 and screens[0] == "" and len(screens) >= 3
    assert "Running" in screens[1] and "\x1b[32mSucceeded\x1b[0m" in screens[-1]


def ended_attempt(name: str, created: str, result: str) -> dict:
    """Attempt `name` of Job `report`, ended with the watcher's outcome `result`."""
    code = 0 if result == "Succeeded" else 3
    attempt = with_status(pod("job-istio"), init=[init_done("istio-init", 0, 1), init_done("initshift-init", 1, 2)],
                          containers=[done("git-clone", 3, 5), done("build", 5, 9, code),
                                      terminated("istio-proxy", 0, started_at=at(3), finished_at=at(10))],
                          phase="Succeeded" if code == 0 else "Failed")
    attempt["metadata"].update(name=name, creationTimestamp=created)
    attempt["metadata"]["labels"].update({"job-name": "report", "batch.kubernetes.io/job-name": "report"})
    attempt["metadata"]["annotations"][p.ANNOTATION_OUTCOME] = json.dumps({
        "result": result, "failed": None if code == 0 else "build", "message": "", "steps": [], "mains": [],
        "sidecarsStoppedBy": "quit", "decidedAt": at(11)})
    return attempt


def report_job(*conditions: str) -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "report", "namespace": "builds"},
            "spec": {"template": {}},
            "status": {"conditions": [{"type": c, "status": "True"} for c in conditions]}}


def job_reads(kube: KubeDouble) -> int:
    return sum(1 for r in kube.requests if r.path == "/apis/batch/v1/namespaces/builds/jobs/report")


async def test_watch_of_a_job_follows_its_next_pod_until_the_job_is_finished(kube: KubeDouble, cfg: str) -> None:
    """`-w job/NAME`: its pod failed and the Job controller starts another (after its
    backoff): that one is shown and watched in turn; once the Job is Complete, it ends."""
    kube.put("jobs", report_job())
    kube.put_pod(ended_attempt("report-a1b2c", "2024-05-01T10:00:00Z", "Failed"))
    task = asyncio.create_task(status("job/report", "-w", "-o", "json", "--kubeconfig", cfg))
    await eventually(lambda: job_reads(kube) >= 2, "the Job read again while no next pod exists")
    assert not task.done()
    kube.put_pod(ended_attempt("report-z9y8x", "2024-05-01T10:00:30Z", "Succeeded"))
    await eventually(lambda: job_reads(kube) >= 3, "the Job read after the second pod ended")
    kube.put("jobs", report_job("SuccessCriteriaMet", "Complete"))
    code, out, err = await asyncio.wait_for(task, BOUND)
    assert (code, err) == (0, "job/report: next pod/report-z9y8x\njob/report: Complete\n")
    shown = [doc["name"] for doc in json_documents(out)]  # one per drawing
    assert shown[0] == "report-a1b2c" and shown[-1] == "report-z9y8x" and set(shown) == {"report-a1b2c", "report-z9y8x"}


async def test_watch_of_a_job_without_a_pod_yet_waits_for_its_first(kube: KubeDouble, cfg: str) -> None:
    """`-w job/NAME` right after the Job is created (no pod yet): its first pod is waited
    for, as `kubectl logs -f job/NAME` waits, and said so; without -w that is an error."""
    kube.put("jobs", report_job())
    err = io.StringIO()
    task = asyncio.create_task(status_cmd.run(["job/report", "-w", "-o", "json", "--kubeconfig", cfg],
                                              io.StringIO(), err))
    await eventually(lambda: "no pod yet" in err.getvalue(), "the wait said")
    assert not task.done()
    assert err.getvalue() == "job/report: no pod yet; waiting for the Job controller to create one\n"
    code, out, said = await status("job/report", "--kubeconfig", cfg)  # without -w: at once
    assert (code, said) == (1, "initshift status: job report has no pods in namespace builds\n")
    kube.put_pod(ended_attempt("report-a1b2c", "2024-05-01T10:00:00Z", "Succeeded"))
    kube.put("jobs", report_job("SuccessCriteriaMet", "Complete"))
    assert await asyncio.wait_for(task, BOUND) == 0
    assert err.getvalue().splitlines()[1:] == ["job/report: pod/report-a1b2c", "job/report: Complete"]


async def follow_until_deleted(kube: KubeDouble, cfg: str, command, resource: str, name: str,
                               reads: Callable[[], int]) -> list[str]:
    """`status -w` (`logs -f`) of the Job or CronJob `name`, which it waits on (`reads` counts
    the reads of it), until the object is deleted: the command's lines on stderr."""
    follow = "-w" if command is status_cmd else "-f"
    kind = "job" if resource == "jobs" else "cronjob"
    err = io.StringIO()
    task = asyncio.create_task(command.run([f"{kind}/{name}", follow, "--kubeconfig", cfg], io.StringIO(), err))
    await eventually(lambda: reads() >= 2, f"the {kind} read again while it waits")
    kube.delete(resource, "builds", name)
    assert await asyncio.wait_for(task, BOUND) == 1
    return err.getvalue().splitlines()


@pytest.mark.parametrize("command", [status_cmd, logs_cmd], ids=["status -w", "logs -f"])
async def test_following_a_job_without_a_pod_ends_when_it_is_deleted_or_finished(
        kube: KubeDouble, cfg: str, command) -> None:
    """A suspended Job is waited for (it may be resumed), and said so; once deleted, the
    command ends with that. A finished Job without pods is an error at once."""
    kube.put("jobs", {**report_job(), "spec": {"suspend": True, "template": {}}})
    said = await follow_until_deleted(kube, cfg, command, "jobs", "report", lambda: job_reads(kube))
    prog = "status" if command is status_cmd else "logs"
    assert said == ["job/report: suspended, no pod yet; waiting for the Job controller to create one",
                    f"initshift {prog}: job builds/report was deleted"]
    follow = "-w" if command is status_cmd else "-f"
    kube.put("jobs", report_job("Failed"))
    err = io.StringIO()
    assert await asyncio.wait_for(command.run(["job/report", follow, "--kubeconfig", cfg], io.StringIO(), err),
                                  BOUND) == 1
    assert err.getvalue() == f"initshift {prog}: job report has no pods in namespace builds\n"


async def test_watch_of_a_job_goes_on_past_a_deleted_pod(kube: KubeDouble, cfg: str) -> None:
    """`-w job/NAME` whose pod is deleted: the Job says what follows. Under restartPolicy
    OnFailure the Job controller deletes the pod at the Job's backoffLimit: the Job's end
    is said, and the watch ends as for a Job that finished; a pod deleted by someone else
    (a drain) is replaced by the controller, and the new pod is watched in turn. A pod
    named as such ends the watch with the deletion, as before."""
    kube.put("jobs", report_job())
    attempt = job_attempt("report-a1b2c", "2024-05-01T10:00:00Z")
    kube.put_pod(attempt)
    err = io.StringIO()
    task = asyncio.create_task(status_cmd.run(["job/report", "-w", "-o", "json", "--kubeconfig", cfg],
                                              io.StringIO(), err))
    await eventually(lambda: any(r.query.get("watch") for r in kube.requests), "the pod watched")
    kube.delete("pods", "builds", "report-a1b2c")  # a drain: the Job controller makes another
    await eventually(lambda: job_reads(kube) >= 1, "the Job read for the next pod")
    kube.put_pod(job_attempt("report-z9y8x", "2024-05-01T10:01:00Z"))
    await eventually(lambda: "next pod/report-z9y8x" in err.getvalue(), "the next pod followed")
    kube.put("jobs", {**report_job(), "status": {"conditions": [
        {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded"},
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
         "message": "Job has reached the specified backoff limit"}]}})
    kube.delete("pods", "builds", "report-z9y8x")  # the controller's, at the backoffLimit
    rc = await asyncio.wait_for(task, BOUND)
    assert rc == 0, err.getvalue()
    assert err.getvalue().splitlines() == [
        "job/report: pod/report-a1b2c was deleted", "job/report: next pod/report-z9y8x",
        "job/report: pod/report-z9y8x was deleted",
        "job/report: Failed (BackoffLimitExceeded: Job has reached the specified backoff limit)"]
    kube.put_pod(attempt)
    task = asyncio.create_task(status("report-a1b2c", "-w", "--kubeconfig", cfg))
    await eventually(lambda: sum(1 for r in kube.requests if r.query.get("watch")) >= 3, "the pod watched")
    kube.delete("pods", "builds", "report-a1b2c")
    code, _, said = await asyncio.wait_for(task, BOUND)
    assert (code, said) == (1, "initshift status: pod builds/report-a1b2c was deleted\n")


def cronjob_reads(kube: KubeDouble) -> int:
    return sum(1 for r in kube.requests if r.path == "/apis/batch/v1/namespaces/builds/cronjobs/nightly")


async def test_watch_of_a_cronjob_without_a_run_yet_waits_for_its_first(kube: KubeDouble, cfg: str) -> None:
    """`-w cronjob/NAME` right after the CronJob is created: its first run is waited for,
    said with its schedule, then followed as a run found at once would be."""
    kube.put("cronjobs", nightly_cronjob())
    err = io.StringIO()
    task = asyncio.create_task(status_cmd.run(["cronjob/nightly", "-w", "-o", "json", "--kubeconfig", cfg],
                                              io.StringIO(), err))
    await eventually(lambda: cronjob_reads(kube) >= 2, "the CronJob read again while it has no run")
    assert not task.done()
    assert err.getvalue() == "cronjob/nightly: no run yet; waiting for its next (schedule '0 3 * * *')\n"
    kube.put("jobs", {**cron_run("report", "2024-05-01T03:00:00Z"), "status": report_job("Complete")["status"]})
    kube.put_pod(ended_attempt("report-a1b2c", "2024-05-01T03:00:01Z", "Succeeded"))
    assert await asyncio.wait_for(task, BOUND) == 0
    assert err.getvalue().splitlines()[1:] == ["cronjob/nightly: job/report", "job/report: Complete"]


@pytest.mark.parametrize("command", [status_cmd, logs_cmd], ids=["status -w", "logs -f"])
async def test_following_a_cronjob_without_a_run_ends_when_it_is_deleted(kube: KubeDouble, cfg: str, command) -> None:
    """A suspended CronJob is waited for too (it may be resumed, or run by hand), and said
    so; once deleted, the command ends with that."""
    kube.put("cronjobs", {**nightly_cronjob(), "spec": {**nightly_cronjob()["spec"], "suspend": True}})
    said = await follow_until_deleted(kube, cfg, command, "cronjobs", "nightly", lambda: cronjob_reads(kube))
    prog = "status" if command is status_cmd else "logs"
    assert said == ["cronjob/nightly: suspended, no run yet; waiting for its next (schedule '0 3 * * *')",
                    f"initshift {prog}: cronjob builds/nightly was deleted"]


async def test_watch_of_a_job_ends_with_its_pod_where_the_job_cannot_be_read(kube: KubeDouble, cfg: str) -> None:
    kube.put_pod(ended_attempt("report-a1b2c", "2024-05-01T10:00:00Z", "Failed"))
    kube.fail_next("/apis/batch/v1/namespaces/builds/jobs/report", 403,
                   message='jobs.batch "report" is forbidden: User "dev" cannot get resource "jobs"')
    code, out, err = await asyncio.wait_for(status("job/report", "-w", "-o", "json", "--kubeconfig", cfg), BOUND)
    assert code == 0 and json.loads(out)["name"] == "report-a1b2c"
    assert err == ('job/report: cannot follow its next pod: no permission to read job builds/report: jobs.batch '
                   '"report" is forbidden: User "dev" cannot get resource "jobs"\n')
    code, _, err = await asyncio.wait_for(status("job/report", "-w", "--kubeconfig", cfg), BOUND)
    assert (code, err) == (1, "initshift status: job builds/report was deleted\n")
