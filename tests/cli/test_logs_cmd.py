"""`initshift logs` against the in-process API double: log endpoints with `follow`, steps
that start while the command follows, the waiter's own lines, one-line errors."""

from __future__ import annotations

import asyncio
import io

import pytest

from tests.support.kubedouble import KubeDouble, terminated
from tests.support.podstatus import at, done, init_done, pod, run, wait, with_status, write_kubeconfig
from tests.cli.test_status_cmd import BOUND, Tty, eventually
from waiter import protocol as p
from webhook.cli import _logs as logs_cmd
from webhook.kube._api import KubeError

NS, NAME = "builds", "build-1"
TEKTON = ["prepare", "place-scripts", "step-git-clone", "step-unit-test", "step-report"]


@pytest.fixture
def cfg(kube: KubeDouble, tmp_path) -> str:
    return write_kubeconfig(tmp_path / "kubeconfig", kube.url, NS)


async def logs(*argv: str, out: io.StringIO | None = None) -> tuple[int, str, str]:
    out = out if out is not None else io.StringIO()
    err = io.StringIO()
    code = await logs_cmd.run(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


def following(kube: KubeDouble, container: str) -> bool:
    """The command has asked the double to follow this container's log."""
    return any(r.path.endswith(f"/pods/{NAME}/log") and r.query.get("container") == container
               and r.query.get("follow") == "true" and r.status in (0, 200) for r in kube.requests)  # 0: streaming


def lines_of(text: str) -> list[str]:
    return text.splitlines()


def tekton_done() -> dict:
    """tekton under Istio (waiter strategy), every step and the main finished."""
    ends = [(5, 9), (9, 12), (12, 20), (20, 40), (40, 41)]
    return with_status(pod("tekton-istio", NAME, NS),
                       init=[init_done("istio-init", 0, 1), init_done("initshift-init", 1, 2)],
                       containers=[*[done(n, a, b) for n, (a, b) in zip(TEKTON, ends)], run("istio-proxy", 3)])


def running_job() -> dict:
    """A Job's pod under Istio (waiter strategy), its steps git-clone and build running."""
    return with_status(pod("job-istio", NAME, NS), init=[init_done("istio-init", 0, 1), init_done("initshift-init", 1, 2)],
                       containers=[run("git-clone", 3), run("build", 3), run("istio-proxy", 3)])


def failed_job() -> dict:
    """running_job after git-clone failed: build skipped, the proxy still running."""
    return with_status(pod("job-istio", NAME, NS), init=[init_done("istio-init", 0, 1), init_done("initshift-init", 1, 2)],
                       containers=[done("git-clone", 3, 5, 128, "Error", "exit status 128"),
                                   done("build", 5, 5, 0, "Skipped", "skipped: git-clone failed", "git-clone"),
                                   run("istio-proxy", 3)])


def end_job(kube: KubeDouble) -> None:
    """running_job's steps end, then its proxy: the pod Succeeded."""
    kube.set_container_statuses(NS, NAME, [done("git-clone", 3, 6), done("build", 6, 9)])
    kube.set_container_statuses(NS, NAME, [terminated("istio-proxy", 0, started_at=at(3), finished_at=at(10))],
                                phase="Succeeded")


async def test_logs_in_step_order_with_prefixes_and_no_waiter_lines(kube: KubeDouble, cfg: str) -> None:
    kube.put_pod(tekton_done())
    # Appended in another order than the steps run: the command restores step order.
    for name in reversed(TEKTON):
        kube.append_log(NS, NAME, name, f"waiter[{name}]: waiting for the previous step")
        kube.append_log(NS, NAME, name, f"{name} says hello")
        kube.append_log(NS, NAME, name, f"{name} is done")
    kube.append_log(NS, NAME, "istio-proxy", "envoy proxy is ready")
    code, out, err = await logs(NAME, "--kubeconfig", cfg)
    assert (code, err) == (0, "")
    assert [line.split(None, 1) for line in lines_of(out)] == [
        [f"[{n}]", text] for n in TEKTON for text in (f"{n} says hello", f"{n} is done")]
    assert lines_of(out)[0] == "[prepare]        prepare says hello"  # prefixes padded to the longest name


async def test_timestamps_on_request_after_the_prefix(kube: KubeDouble, cfg: str) -> None:
    """--timestamps: each line with the kubelet's time of it, after its container's prefix
    (as `kubectl logs --prefix --timestamps`); the waiter's own lines still hidden. Without
    it the kubelet is not asked for them."""
    kube.put_pod(tekton_done())
    kube.append_log(NS, NAME, "prepare", "waiter[prepare]: sidecars ready after 2.1s", at="2026-12-02T10:00:00.100000000Z")
    kube.append_log(NS, NAME, "prepare", "copying entrypoint", at="2026-12-02T10:00:00.250000000Z")
    kube.append_log(NS, NAME, "step-report", "12 passed", at="2026-12-02T10:00:41.000000000Z")
    code, out, err = await logs(NAME, "--kubeconfig", cfg, "--timestamps")
    assert (code, err) == (0, "")
    assert [line.split() for line in lines_of(out)] == [
        ["[prepare]", "2026-12-02T10:00:00.250000000Z", "copying", "entrypoint"],
        ["[step-report]", "2026-12-02T10:00:41.000000000Z", "12", "passed"]]
    asked = [r.query for r in kube.requests if r.path.endswith(f"/pods/{NAME}/log")]
    assert asked and all(q.get("timestamps") == "true" for q in asked)
    kube.requests.clear()
    code, out, err = await logs(NAME, "--kubeconfig", cfg)
    assert (code, err) == (0, "")
    assert [line.split(None, 1) for line in lines_of(out)] == [["[prepare]", "copying entrypoint"],
                                                                ["[step-report]", "12 passed"]]
    assert all("timestamps" not in r.query for r in kube.requests if r.path.endswith("/log"))


async def test_one_container_alone(kube: KubeDouble, cfg: str) -> None:
    """-c NAME: that container's log alone, its lines as they are (as `kubectl logs -c`), a
    step, a main, a sidecar or a kept init container, with its note (prefixed, on stderr); a
    name the pod does not have is one line naming those it has."""
    kube.put_pod(failed_job())
    for name in ("istio-init", "git-clone", "istio-proxy"):
        kube.append_log(NS, NAME, name, f"{name} was here")
    kube.append_log(NS, NAME, "git-clone", "waiter[git-clone]: sidecars ready after 1.0s")
    for name in ("git-clone", "istio-proxy", "istio-init"):
        code, out, err = await logs(NAME, "--kubeconfig", cfg, "-c", name)
        assert (code, out) == (0, f"{name} was here\n")  # as it is: no prefix
        assert err == ("[git-clone] failed (Error, exit code 128): exit status 128\n" if name == "git-clone" else "")
    code, out, err = await logs(NAME, "--kubeconfig", cfg, "--container", "build")
    assert (code, out, err) == (0, "", "[build] skipped (Skipped): skipped: git-clone failed\n")
    code, out, err = await logs(NAME, "--kubeconfig", cfg, "-c", "typo")
    assert (code, out) == (1, "")
    assert err == (f"initshift logs: pod {NS}/{NAME} has no container typo (it has istio-init, initshift-init, "
                   f"git-clone, build, istio-proxy)\n")


async def test_follow_one_step_alone(kube: KubeDouble, cfg: str) -> None:
    """-f -c STEP: that step's log, from its start to its end, and nothing else."""
    kube.put_pod(running_job())
    kube.append_log(NS, NAME, "git-clone", "cloning")
    out = io.StringIO()
    task = asyncio.create_task(logs(NAME, "-f", "-c", "build", "--kubeconfig", cfg, out=out))
    await eventually(lambda: following(kube, "build"), "following build")
    kube.append_log(NS, NAME, "build", "compiled")
    await eventually(lambda: "compiled" in out.getvalue(), "build's line")
    end_job(kube)
    code, text, err = await asyncio.wait_for(task, BOUND)
    assert (code, err, text) == (0, "", "compiled\n")
    assert not following(kube, "git-clone") and not following(kube, "istio-proxy")


async def test_tail_shows_each_containers_last_lines(kube: KubeDouble, cfg: str) -> None:
    """--tail N: the kubelet's last N lines of each container (`tailLines`), as `kubectl logs
    --all-containers --tail`; with --timestamps too."""
    kube.put_pod(tekton_done())
    for name in TEKTON[:2]:
        for i in range(3):
            kube.append_log(NS, NAME, name, f"{name} {i}")
    code, out, err = await logs(NAME, "--kubeconfig", cfg, "--tail", "2")
    assert (code, err) == (0, "")
    assert [line.split(None, 1)[1] for line in lines_of(out)] == ["prepare 1", "prepare 2", "place-scripts 1",
                                                                  "place-scripts 2"]
    assert {r.query.get("tailLines") for r in kube.requests if r.path.endswith("/log")} == {"2"}
    code, out, _ = await logs(NAME, "--kubeconfig", cfg, "--tail", "1", "--timestamps")
    assert code == 0 and [line.split()[2:] for line in lines_of(out)] == [["prepare", "2"], ["place-scripts", "2"]]
    code, out, _ = await logs(NAME, "--kubeconfig", cfg, "--tail", "0")
    assert (code, out) == (0, "")


async def test_tail_counts_the_lines_shown_not_the_waiters_own(kube: KubeDouble, cfg: str) -> None:
    """The kubelet's tailLines counts the waiter's own lines, which are hidden: asked for
    twice as many until N are shown, or the whole log is read."""
    kube.put_pod(tekton_done())
    for line in ["early", "compiled", *[f"waiter[step-report]: quit http://127.0.0.1:1500{i}/quit: HTTP 200"
                                         for i in range(5)]]:
        kube.append_log(NS, NAME, "step-report", line)
    code, out, err = await logs(NAME, "--kubeconfig", cfg, "--tail", "1")
    assert (code, err, [line.split(None, 1)[1] for line in lines_of(out)]) == (0, "", ["compiled"])
    asked = [r.query.get("tailLines") for r in kube.requests if r.query.get("container") == "step-report"]
    assert asked == ["1", "2", "4", "8"]
    code, out, _ = await logs(NAME, "--kubeconfig", cfg, "--tail", "2", "--waiter")
    assert [line.split(None, 1)[1] for line in lines_of(out)] == [
        "waiter[step-report]: quit http://127.0.0.1:15003/quit: HTTP 200",
        "waiter[step-report]: quit http://127.0.0.1:15004/quit: HTTP 200"]
    code, out, _ = await logs(NAME, "--kubeconfig", cfg, "--tail", "9")  # more than there are
    assert [line.split(None, 1)[1] for line in lines_of(out)] == ["early", "compiled"]


async def test_since_shows_the_last_durations_lines(kube: KubeDouble, cfg: str) -> None:
    """--since DURATION: the lines of that last span by the kubelet's clock (`sinceSeconds`,
    rounded up as kubectl rounds it), with --tail too."""
    kube.put_pod(tekton_done())
    for name in TEKTON[:2]:
        kube.append_log(NS, NAME, name, f"{name} long ago", at="2020-01-01T00:00:00.000000000Z")
        kube.append_log(NS, NAME, name, f"{name} just now")
    code, out, err = await logs(NAME, "--kubeconfig", cfg, "--since", "1m30s")
    assert (code, err) == (0, "")
    assert [line.split(None, 1)[1] for line in lines_of(out)] == ["prepare just now", "place-scripts just now"]
    # Asked later (another container's, or a step that starts later under -f): from the same
    # instant, by the seconds since then, rounded up.
    asked = [r.query.get("sinceSeconds") for r in kube.requests if r.path.endswith("/log")]
    assert asked[0] == "90" and set(asked) <= {"90", "91"}, asked
    code, out, _ = await logs(NAME, "--kubeconfig", cfg, "--since", "1.5s", "--tail", "5")
    assert (code, [line.split(None, 1)[1] for line in lines_of(out)]) == (0, ["prepare just now",
                                                                              "place-scripts just now"])


@pytest.mark.parametrize("value", ["5", "0s", "-1m", "1d"])
async def test_since_takes_a_duration(tmp_path, capsys, value: str) -> None:
    code, out, err = await logs(NAME, "--since", value, "--kubeconfig", str(tmp_path / "missing"))
    assert (code, out, err) == (2, "", "")  # argparse's line goes to sys.stderr
    assert "initshift logs: argument --since: " in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-1", "ten", "1.5"])
async def test_tail_takes_a_whole_number_of_lines(tmp_path, capsys, value: str) -> None:
    code, out, err = await logs(NAME, "--tail", value, "--kubeconfig", str(tmp_path / "missing"))
    assert (code, out, err) == (2, "", "")  # argparse's line goes to sys.stderr
    assert "initshift logs: argument --tail: " in capsys.readouterr().err


async def test_a_job_names_its_pod(kube: KubeDouble, cfg: str) -> None:
    """`job/NAME` reads the Job's pod's logs (the newest, when it retried: `initshift status`'s tests)."""
    built = tekton_done()
    built["metadata"].setdefault("labels", {})["job-name"] = "ci"
    kube.put_pod(built)
    for name in TEKTON:
        kube.append_log(NS, NAME, name, f"{name} is done")
    code, out, err = await logs("job/ci", "--kubeconfig", cfg)
    assert (code, err) == (0, "")
    assert [line.split(None, 1)[1] for line in lines_of(out)] == [f"{n} is done" for n in TEKTON]
    # cronjob/NAME: the pod of its newest Job, found by owner.
    kube.put("jobs", {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
        "name": "ci", "namespace": NS, "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly",
                                                             "uid": "uid-nightly", "controller": True}]}, "spec": {}})
    code, cron, err = await logs("cronjob/nightly", "--kubeconfig", cfg)
    assert (code, err, cron) == (0, "", out)


async def test_waiter_and_sidecars_on_request(kube: KubeDouble, cfg: str) -> None:
    kube.put_pod(tekton_done())
    kube.append_log(NS, NAME, "prepare", "waiter[prepare]: sidecars ready after 2.1s")
    kube.append_log(NS, NAME, "prepare", "copying entrypoint")
    kube.append_log(NS, NAME, "istio-init", "iptables rules written")
    kube.append_log(NS, NAME, "istio-proxy", "envoy proxy is ready")
    code, out, _ = await logs(NAME, "--kubeconfig", cfg, "--waiter", "--sidecars")
    got = [line.split(None, 1) for line in lines_of(out)]
    assert code == 0 and got == [["[istio-init]", "iptables rules written"],
                                 ["[prepare]", "waiter[prepare]: sidecars ready after 2.1s"],
                                 ["[prepare]", "copying entrypoint"],
                                 ["[istio-proxy]", "envoy proxy is ready"]]


async def test_failed_and_skipped_steps_are_noted_on_stderr(kube: KubeDouble, cfg: str) -> None:
    kube.put_pod(failed_job())
    kube.append_log(NS, NAME, "git-clone", "fatal: could not read from remote repository")
    code, out, err = await logs(NAME, "--kubeconfig", cfg)
    assert code == 0 and lines_of(out) == ["[git-clone] fatal: could not read from remote repository"]
    assert lines_of(err) == ["[git-clone] failed (Error, exit code 128): exit status 128",
                             "[build]     skipped (Skipped): skipped: git-clone failed"]


async def test_follow_waits_for_steps_that_start_while_following(kube: KubeDouble, cfg: str) -> None:
    """A never-rewritten pod: each init container starts only after the one before ends."""
    steps = TEKTON[:4]
    kube.put_pod(with_status(pod("tekton", NAME, NS, rewritten=False),
                             init=[run("prepare", 0), *[wait(n) for n in steps[1:]]],
                             containers=[wait("step-report")], phase="Pending"))
    kube.append_log(NS, NAME, "prepare", "prepare: line 1")
    out = io.StringIO()
    task = asyncio.create_task(logs(NAME, "-f", "--kubeconfig", cfg, out=out))
    await eventually(lambda: following(kube, "prepare"), "following prepare")
    kube.append_log(NS, NAME, "prepare", "prepare: line 2")
    await eventually(lambda: "prepare: line 2" in out.getvalue(), "prepare's second line")
    statuses = [run("prepare", 0)]
    for i, name in enumerate(steps[1:], 1):
        statuses[-1] = init_done(steps[i - 1], 2 * i - 2, 2 * i)  # the previous step ends ...
        kube.set_container_statuses(NS, NAME, init=statuses + [wait(n) for n in steps[i:]])
        await asyncio.sleep(0.05)  # ... and the command waits for the next one to start
        statuses.append(run(name, 2 * i))
        kube.set_container_statuses(NS, NAME, init=statuses + [wait(n) for n in steps[i + 1:]])
        await eventually(lambda n=name: following(kube, n), f"following {name}")
        kube.append_log(NS, NAME, name, f"{name}: working")
    statuses[-1] = init_done(steps[-1], 6, 8)
    kube.set_container_statuses(NS, NAME, [run("step-report", 9)], init=statuses, phase="Running")
    await eventually(lambda: following(kube, "step-report"), "following the main")
    kube.append_log(NS, NAME, "step-report", "report: 12 passed")
    kube.set_container_statuses(NS, NAME, [terminated("step-report", 0, started_at=at(9), finished_at=at(10))],
                                phase="Succeeded")
    code, text, err = await asyncio.wait_for(task, BOUND)
    assert (code, err) == (0, "")
    assert [line.split(None, 1)[1] for line in lines_of(text)] == [
        "prepare: line 1", "prepare: line 2", "place-scripts: working", "step-git-clone: working",
        "step-unit-test: working", "report: 12 passed"]
    # It never asked for the log of a container that had not started (the kubelet's 400).
    assert not [r for r in kube.requests if r.path.endswith("/log") and r.status != 200]


async def test_follow_a_waiter_pod_step_by_step_with_the_sidecar_alongside(kube: KubeDouble, cfg: str) -> None:
    """Waiter strategy: every container runs from the start; the command still shows one
    step's log to its end before the next step's, and the sidecar's as it comes."""
    kube.put_pod(running_job())
    out = io.StringIO()
    task = asyncio.create_task(logs(NAME, "--follow", "--sidecars", "--kubeconfig", cfg, out=out))
    await eventually(lambda: following(kube, "git-clone") and following(kube, "istio-proxy"), "two follows")
    kube.append_log(NS, NAME, "git-clone", "Cloning into 'src'...")
    kube.append_log(NS, NAME, "build", "waiter[build]: waiting for git-clone")
    kube.append_log(NS, NAME, "istio-proxy", "Envoy proxy is READY")
    await eventually(lambda: "READY" in out.getvalue() and "Cloning" in out.getvalue(), "first lines")
    assert "[build]" not in out.getvalue()  # build's log waits for git-clone's to end
    kube.set_container_statuses(NS, NAME, [done("git-clone", 3, 6)])
    await eventually(lambda: following(kube, "build"), "following build")
    kube.append_log(NS, NAME, "build", "compiled 10 files")
    kube.set_container_statuses(NS, NAME, [done("build", 6, 9)])
    kube.append_log(NS, NAME, "istio-proxy", "quitquitquit received")
    kube.set_container_statuses(NS, NAME, [terminated("istio-proxy", 0, started_at=at(3), finished_at=at(10))],
                                phase="Succeeded")
    code, text, err = await asyncio.wait_for(task, BOUND)
    assert (code, err) == (0, "")
    got = [line.split(None, 1) for line in lines_of(text)]
    ours = [g for g in got if g[0] != "[istio-proxy]"]
    assert ours == [["[git-clone]", "Cloning into 'src'..."], ["[build]", "compiled 10 files"]]
    assert [g[1] for g in got if g[0] == "[istio-proxy]"] == ["Envoy proxy is READY", "quitquitquit received"]


@pytest.mark.parametrize("shown", [False, True], ids=["", "timestamps-since"])
async def test_follow_takes_up_a_broken_stream_where_it_stopped(kube: KubeDouble, cfg: str, shown: bool) -> None:
    """A follow that breaks while the step runs (a proxy's idle timeout) is opened again from
    the second of the last line printed (`sinceTime`), and the kubelet's timestamps skip what
    was printed: no line lost or shown twice, lines of the same time included. The pod's
    watch, broken with it, is watched again. The times are shown with --timestamps only."""
    kube.put_pod(running_job())
    same = "2026-11-29T18:00:01.500000000Z"
    kube.append_log(NS, NAME, "git-clone", "one", at="2026-11-29T18:00:00.900000000Z")
    kube.append_log(NS, NAME, "git-clone", "two", at=same)
    kube.append_log(NS, NAME, "git-clone", "three", at=same)  # the same time as the one before
    out = io.StringIO()
    extra = ["--timestamps", "--since", "87600h"] if shown else []  # --since: the first stream's, not beside sinceTime
    task = asyncio.create_task(logs(NAME, "-f", "--kubeconfig", cfg, *extra, out=out))
    await eventually(lambda: "three" in out.getvalue(), "the first lines")
    kube.cut_log_follows()
    kube.drop_watches()  # the pod's watch breaks too: taken up from its last resourceVersion
    kube.append_log(NS, NAME, "git-clone", "four", at=same)  # while no one follows, at that time still
    kube.append_log(NS, NAME, "git-clone", "five", at="2026-11-29T18:00:02.000000000Z")
    await eventually(lambda: "five" in out.getvalue(), "the lines after the break")
    end_job(kube)
    code, text, err = await asyncio.wait_for(task, BOUND)
    assert (code, err) == (0, "")
    stamps = ["2026-11-29T18:00:00.900000000Z", same, same, same, "2026-11-29T18:00:02.000000000Z"]
    texts = ["one", "two", "three", "four", "five"]
    assert [line.split(None, 1)[1] for line in lines_of(text)] == (
        [f"{at} {t}" for at, t in zip(stamps, texts)] if shown else texts)
    follows = [r.query for r in kube.requests if r.path.endswith(f"/pods/{NAME}/log")
               and r.query.get("container") == "git-clone"]
    assert follows[0].get("sinceTime") is None and follows[1]["sinceTime"] == "2026-11-29T18:00:01Z"
    assert all(q["timestamps"] == "true" and q["follow"] == "true" for q in follows)


@pytest.mark.parametrize("tail, before", [(1, ["two"]), (0, [])])
async def test_follow_with_tail_starts_from_the_last_lines_and_resumes_after_them(
        kube: KubeDouble, cfg: str, tail: int, before: list[str]) -> None:
    """-f --tail N: the log's last N lines, then what comes; a stream opened again after a
    break starts from the last line shown (`sinceTime`, no `tailLines`)."""
    kube.put_pod(running_job())
    kube.append_log(NS, NAME, "git-clone", "one", at="2026-12-02T10:00:00.100000000Z")
    kube.append_log(NS, NAME, "git-clone", "two", at="2026-12-02T10:00:00.200000000Z")
    out = io.StringIO()
    task = asyncio.create_task(logs(NAME, "-f", "--tail", str(tail), "--kubeconfig", cfg, out=out))
    await eventually(lambda: following(kube, "git-clone"), "following git-clone")
    kube.append_log(NS, NAME, "git-clone", "three", at="2026-12-02T10:00:01.000000000Z")
    await eventually(lambda: "three" in out.getvalue(), "the line after the tail")
    kube.cut_log_follows()
    kube.append_log(NS, NAME, "git-clone", "four", at="2026-12-02T10:00:02.000000000Z")
    await eventually(lambda: "four" in out.getvalue(), "the line after the break")
    end_job(kube)
    code, text, err = await asyncio.wait_for(task, BOUND)
    assert (code, err) == (0, "")
    assert [line.split(None, 1)[1] for line in lines_of(text)] == [*before, "three", "four"]
    asked = [(r.query.get("follow"), r.query.get("tailLines"), r.query.get("sinceTime")) for r in kube.requests
             if r.path.endswith(f"/pods/{NAME}/log") and r.query.get("container") == "git-clone"]
    # --tail N > 0: the last lines read first (the waiter's own may hide some), then followed
    # from the second of the last; --tail 0: followed from what comes.
    first = [(None, "1", None), ("true", None, "2026-12-02T10:00:00Z")] if tail else [("true", "0", None)]
    assert asked == [*first, ("true", None, "2026-12-02T10:00:01Z")]


async def test_follow_with_tail_shows_all_of_a_log_that_was_empty_before_a_break(kube: KubeDouble, cfg: str) -> None:
    """-f --tail N over a log that was empty when its last lines were read, and whose stream
    broke before a line came: all of the log is new, so it is all shown (none lost)."""
    kube.put_pod(running_job())
    out = io.StringIO()
    task = asyncio.create_task(logs(NAME, "-f", "--tail", "1", "--kubeconfig", cfg, out=out))
    await eventually(lambda: following(kube, "git-clone"), "following git-clone")
    kube.cut_log_follows()
    for line in ("one", "two", "three"):  # while no one follows
        kube.append_log(NS, NAME, "git-clone", line)
    await eventually(lambda: "three" in out.getvalue(), "the lines after the break")
    end_job(kube)
    code, text, err = await asyncio.wait_for(task, BOUND)
    assert (code, err) == (0, "")
    assert [line.split(None, 1)[1] for line in lines_of(text)] == ["one", "two", "three"]


async def follow_first_run(kube: KubeDouble, cfg: str, line: str, code: int) -> tuple[asyncio.Task, io.StringIO]:
    """`logs -f` on running_job under restartPolicy OnFailure, once git-clone's first run has
    printed `line` and ended with `code`: the command's task and its output so far."""
    job = running_job()
    job["spec"]["restartPolicy"] = "OnFailure"
    kube.put_pod(job)
    out = io.StringIO()
    task = asyncio.create_task(logs(NAME, "-f", "--kubeconfig", cfg, out=out))
    await eventually(lambda: following(kube, "git-clone"), "following git-clone")
    kube.append_log(NS, NAME, "git-clone", line, at="2026-12-02T10:00:04.000000000Z")
    await eventually(lambda: line in out.getvalue(), "the first run's line")
    kube.set_container_statuses(NS, NAME, [terminated("git-clone", code, started_at=at(3), finished_at=at(5))])
    return task, out


async def test_follow_stays_on_a_step_the_kubelet_runs_again(kube: KubeDouble, cfg: str) -> None:
    """restartPolicy OnFailure: the kubelet runs a failed step again. -f says so and shows the
    new run's log after the last's, and moves on only once the step has succeeded."""
    task, out = await follow_first_run(kube, cfg, "fatal: the remote end hung up", 128)
    await asyncio.sleep(0.2)  # the first run's stream has ended; the step is to run again
    assert not following(kube, "build")
    kube.set_container_statuses(NS, NAME, [{**run("git-clone", 15), "restartCount": 1, "lastState": {
        "terminated": {"exitCode": 128, "reason": "Error", "startedAt": at(3), "finishedAt": at(5)}}}])
    kube.append_log(NS, NAME, "git-clone", "cloned", at="2026-12-02T10:00:15.000000000Z")
    await eventually(lambda: "cloned" in out.getvalue(), "the second run's line")
    end_job(kube)
    code, text, err = await asyncio.wait_for(task, BOUND)
    assert (code, lines_of(text)) == (0, ["[git-clone] fatal: the remote end hung up", "[git-clone] cloned"])
    assert err == "[git-clone] run again by the kubelet (restart 1; the last run: Error, exit code 128)\n"


async def test_follow_reads_a_quick_second_run_that_has_ended_already(kube: KubeDouble, cfg: str) -> None:
    """A step's second run that ends before its status reaches -f (the kubelet reports it
    terminated, exit 0, restarted once): its log is still read, then -f moves on."""
    task, out = await follow_first_run(kube, cfg, "flaked", 1)
    await asyncio.sleep(0.2)  # the first run's stream has ended
    kube.append_log(NS, NAME, "git-clone", "cloned", at="2026-12-02T10:00:05.000000000Z", run=1)
    kube.set_container_statuses(NS, NAME, [{**terminated("git-clone", 0, started_at=at(5), finished_at=at(5)),
                                            "restartCount": 1, "lastState": {"terminated": {
                                                "exitCode": 1, "reason": "Error", "startedAt": at(3),
                                                "finishedAt": at(4)}}}])
    await eventually(lambda: following(kube, "build"), "following build")
    end_job(kube)
    code, text, err = await asyncio.wait_for(task, BOUND)
    assert (code, lines_of(text)) == (0, ["[git-clone] flaked", "[git-clone] cloned"])
    assert err == "[git-clone] run again by the kubelet (restart 1; the last run: Error, exit code 1)\n"


async def test_follow_says_a_step_was_run_again_before_it_followed_it(kube: KubeDouble, cfg: str) -> None:
    """A step the kubelet had run again before -f reached it: its last run's end is said
    first (that run's log is the kubelet's no more), then its log."""
    job = running_job()
    job["spec"]["restartPolicy"] = "OnFailure"
    kube.put_pod(job)
    kube.set_container_statuses(NS, NAME, [{**run("git-clone", 15), "restartCount": 2, "lastState": {
        "terminated": {"exitCode": 128, "reason": "Error", "startedAt": at(9), "finishedAt": at(10)}}}])
    kube.append_log(NS, NAME, "git-clone", "cloned")
    task = asyncio.create_task(logs(NAME, "-f", "--kubeconfig", cfg))
    await eventually(lambda: following(kube, "git-clone"), "following git-clone")
    end_job(kube)
    code, text, err = await asyncio.wait_for(task, BOUND)
    assert (code, lines_of(text)) == (0, ["[git-clone] cloned"])
    assert err == "[git-clone] run again by the kubelet (restart 2; the last run: Error, exit code 128)\n"


async def test_a_run_again_is_said_without_the_last_runs_end_where_the_kubelet_no_longer_says_it(
        kube: KubeDouble, cfg: str) -> None:
    """After the pod has ended the kubelet may report a restarted container without its
    `lastState` (seen on v1.34.9, native strategy): the restart is said alone."""
    job = running_job()
    job["spec"]["restartPolicy"] = "OnFailure"
    kube.put_pod(job)
    kube.set_container_statuses(NS, NAME, [{**done("git-clone", 15, 16), "restartCount": 1}, done("build", 16, 17),
                                           terminated("istio-proxy", 0, started_at=at(3), finished_at=at(18))],
                                phase="Succeeded")
    kube.append_log(NS, NAME, "git-clone", "cloned")
    code, text, err = await asyncio.wait_for(logs(NAME, "-f", "--kubeconfig", cfg), BOUND)
    assert (code, lines_of(text), err) == (0, ["[git-clone] cloned"], "[git-clone] run again by the kubelet (restart 1)\n")


async def test_follow_notes_steps_the_pod_never_ran(kube: KubeDouble, cfg: str) -> None:
    kube.put_pod(with_status(pod("job", NAME, NS, rewritten=False), init=[run("git-clone", 0)],
                             containers=[wait("build")], phase="Pending"))
    task = asyncio.create_task(logs(NAME, "-f", "--kubeconfig", cfg))
    await eventually(lambda: following(kube, "git-clone"), "following git-clone")
    kube.append_log(NS, NAME, "git-clone", "fatal: repository not found")
    kube.set_container_statuses(NS, NAME, [wait("build")], init=[init_done("git-clone", 0, 3, 128)],
                                phase="Failed")
    code, text, err = await asyncio.wait_for(task, BOUND)
    assert code == 0 and lines_of(text) == ["[git-clone] fatal: repository not found"]
    # "not run", as `initshift status` says it (not the JSON slug "not-run")
    assert lines_of(err) == ["[git-clone] failed (Error, exit code 128)", "[build]     not run (NotRun)"]


def unpulled(name: str, reason: str = "ImagePullBackOff") -> dict:
    """A container the kubelet cannot start: its image cannot be pulled."""
    status = wait(name, reason)
    status["state"]["waiting"]["message"] = 'Back-off pulling image "registry.invalid/tools:1"'
    return status


PULL_NOTE = '[place-scripts]  pending ({}): Back-off pulling image "registry.invalid/tools:1"'


async def test_a_step_the_kubelet_cannot_start_is_noted(kube: KubeDouble, cfg: str) -> None:
    """A step stuck in ImagePullBackOff has no log: the note says why, where nothing was said."""
    kube.put_pod(with_status(pod("tekton", NAME, NS, rewritten=False),
                             init=[init_done("prepare", 0, 1), unpulled("place-scripts"),
                                   *[wait(n) for n in TEKTON[2:4]]],
                             containers=[wait("step-report")], phase="Pending"))
    kube.append_log(NS, NAME, "prepare", "prepared")
    code, out, err = await logs(NAME, "--kubeconfig", cfg)
    assert (code, lines_of(out)) == (0, ["[prepare]        prepared"])
    assert lines_of(err) == [PULL_NOTE.format("ImagePullBackOff")]


async def test_follow_says_once_why_a_step_does_not_start(kube: KubeDouble, cfg: str) -> None:
    """`-f` keeps waiting for a step the kubelet cannot start (the image may yet be pushed),
    saying why on stderr once per reason, not once per status update."""
    init = [init_done("prepare", 0, 1), unpulled("place-scripts", "ErrImagePull"), *[wait(n) for n in TEKTON[2:4]]]
    kube.put_pod(with_status(pod("tekton", NAME, NS, rewritten=False), init=init, containers=[wait("step-report")],
                             phase="Pending"))
    err = io.StringIO()
    task = asyncio.create_task(logs_cmd.run([NAME, "-f", "--kubeconfig", cfg], io.StringIO(), err))
    await eventually(lambda: "ErrImagePull" in err.getvalue(), "the note on ErrImagePull")
    for _ in range(2):  # the kubelet's back-off: the same reason again and again
        init[1] = unpulled("place-scripts")
        kube.set_container_statuses(NS, NAME, [wait("step-report")], init=init, phase="Pending")
        await eventually(lambda: "ImagePullBackOff" in err.getvalue(), "the note on ImagePullBackOff")
    kube.set_container_statuses(NS, NAME, [wait("step-report")], init=init, phase="Failed",
                                reason="DeadlineExceeded")  # activeDeadlineSeconds ends it
    code = await asyncio.wait_for(task, BOUND)
    assert lines_of(err.getvalue())[:2] == [PULL_NOTE.format("ErrImagePull"), PULL_NOTE.format("ImagePullBackOff")]
    assert code == 0 and "pending" not in "".join(lines_of(err.getvalue())[2:])


async def test_a_step_the_pods_end_stopped_is_noted_without_the_waiters_exit_code(kube: KubeDouble, cfg: str) -> None:
    """The pod was deleted while step 1 ran: the waiter of the next one records `Stopped` and
    exits 143 (SIGTERM), which is not the step's; the note says it did not run."""
    stopped = with_status(pod("job-istio", NAME, NS), init=[init_done("istio-init", 0, 1),
                                                             init_done("initshift-init", 1, 2)],
                          containers=[done("git-clone", 3, 5, 143, "Error", "killed by SIGTERM"),
                                      done("build", 5, 5, 143, p.REASON_STOPPED,
                                           "stopped by SIGTERM before the command started"),
                                      run("istio-proxy", 3)], phase="Failed")
    kube.put_pod(stopped)
    code, _, err = await logs(NAME, "--kubeconfig", cfg)
    assert code == 0 and lines_of(err) == [
        "[git-clone] failed (Error, exit code 143): killed by SIGTERM",
        "[build]     not run (Stopped): stopped by SIGTERM before the command started"]


async def test_follow_reports_a_deleted_pod(kube: KubeDouble, cfg: str) -> None:
    kube.put_pod(with_status(pod("job", NAME, NS, rewritten=False), init=[wait("git-clone", "ContainerCreating")],
                             containers=[wait("build")], phase="Pending"))
    task = asyncio.create_task(logs(NAME, "-f", "--kubeconfig", cfg))
    await eventually(lambda: kube.open_watches, "the watch")
    kube.delete("pods", NS, NAME)
    assert await asyncio.wait_for(task, BOUND) == (1, "", f"initshift logs: pod {NS}/{NAME} was deleted\n")


@pytest.mark.parametrize("setup, message", [
    (lambda kube: None, f"initshift logs: pod {NAME} not found in namespace {NS}\n"),
    (lambda kube: kube.put_pod(with_status(pod("no-init-istio", NAME, NS, rewritten=False),
                                           containers=[run("build")])),
     f"initshift logs: pod {NAME} is not managed by initshift as a build (initshift.io/managed is not set) "
     f"and has no init containers to show\n"),
    (lambda kube: (kube.put_pod(tekton_done()), kube.fail_next(f"/api/v1/namespaces/{NS}/pods/{NAME}/log", 403,
                                                               message="pods \"build-1\" is forbidden: cannot get "
                                                                       "resource \"pods/log\"")),
     f"initshift logs: no permission to read the log of prepare in pod {NS}/{NAME}: pods \"build-1\" is "
     f"forbidden: cannot get resource \"pods/log\"\n"),
], ids=["missing", "not-managed", "forbidden-log"])
async def test_one_line_errors(kube: KubeDouble, cfg: str, setup, message: str) -> None:
    setup(kube)
    code, out, err = await logs(NAME, "--kubeconfig", cfg)
    assert (code, out, err) == (1, "", message)


@pytest.mark.parametrize("ref", ["deploy/foo", "job/", "job/foo/bar", "job/a?b"])
async def test_a_pod_argument_of_another_form_is_a_usage_error(tmp_path, capsys, ref: str) -> None:
    """Exit 2 before any cluster access (the kubeconfig named does not exist); the words: test_status_cmd."""
    code, out, err = await logs(ref, "--kubeconfig", str(tmp_path / "missing"))
    assert (code, out, err) == (2, "", "")  # argparse's line goes to sys.stderr
    assert capsys.readouterr().err.startswith(f"initshift logs: argument POD: {ref}: ")


@pytest.mark.parametrize("argv", [["..", "-n", "builds"], ["build-1", "-n", ".."]])
async def test_a_name_that_would_address_another_object_is_a_usage_error(tmp_path, capsys, argv: list[str]) -> None:
    code, out, err = await logs(*argv, "--kubeconfig", str(tmp_path / "missing"))
    assert (code, out, err) == (2, "", "")
    assert "expected a Kubernetes name" in capsys.readouterr().err


async def test_prefixes_are_coloured_on_a_terminal(kube: KubeDouble, cfg: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    kube.put_pod(tekton_done())
    kube.append_log(NS, NAME, "prepare", "hello")
    monkeypatch.delenv("NO_COLOR", raising=False)
    _, out, _ = await logs(NAME, "--kubeconfig", cfg, out=Tty())
    assert out == f"\x1b[36m[prepare]{' ' * 7}\x1b[0m hello\n"
    monkeypatch.setenv("NO_COLOR", "")  # empty: not set, per no-color.org
    _, out, _ = await logs(NAME, "--kubeconfig", cfg, out=Tty())
    assert out.startswith("\x1b[36m")


async def test_pod_log_before_the_container_starts_is_the_kubelets_400(kube: KubeDouble) -> None:
    kube.put_pod(with_status(pod("job", NAME, NS, rewritten=False), init=[wait("git-clone", "ContainerCreating")],
                             containers=[wait("build")], phase="Pending"))
    async with kube.kube_api() as api:
        with pytest.raises(KubeError) as e:
            async for _ in api.pod_log(NS, NAME, "git-clone"):
                pass
    assert e.value.status == 400 and "is waiting to start: ContainerCreating" in e.value.message


async def test_a_container_waiting_to_restart_shows_its_last_runs_log(kube: KubeDouble, cfg: str) -> None:
    """CrashLoopBackOff: the kubelet serves the last run's log (seen on v1.34.9), and so does
    `initshift logs`, as `kubectl logs` does; then it says why the step is not running."""
    looping = wait("prepare", "CrashLoopBackOff")
    looping["lastState"] = terminated("prepare", 2)["state"]
    kube.put_pod(with_status(pod("tekton", NAME, NS, rewritten=False), init=[looping],
                             containers=[wait("step-report")], phase="Pending"))
    kube.append_log(NS, NAME, "prepare", "prepare: no such repository")
    code, out, err = await logs(NAME, "--kubeconfig", cfg)
    assert (code, lines_of(out)) == (0, ["[prepare]        prepare: no such repository"]), err
    assert lines_of(err) == ["[prepare]        pending (CrashLoopBackOff)"]


def rerun_job(kube: KubeDouble) -> None:
    """running_job under restartPolicy OnFailure whose git-clone failed once (exit 128) and
    runs again, each run with a log of its own."""
    job = running_job()
    job["spec"]["restartPolicy"] = "OnFailure"
    kube.put_pod(job)
    kube.append_log(NS, NAME, "git-clone", "waiter[git-clone]: running git clone")
    kube.append_log(NS, NAME, "git-clone", "fatal: the remote end hung up", at="2026-12-02T10:00:04.500000000Z")
    kube.set_container_statuses(NS, NAME, [{**run("git-clone", 15), "restartCount": 1, "lastState": {
        "terminated": {"exitCode": 128, "reason": "Error", "startedAt": at(3), "finishedAt": at(5)}}}])
    kube.append_log(NS, NAME, "git-clone", "cloned")


async def test_previous_shows_the_run_before_the_current_of_each_container_run_again(
        kube: KubeDouble, cfg: str) -> None:
    """-p: the last run of a step the kubelet ran again, as `kubectl logs --previous` reads it,
    then how it ended; the containers never run again are left out."""
    rerun_job(kube)
    code, out, err = await logs(NAME, "-p", "--kubeconfig", cfg)
    assert (code, lines_of(out)) == (0, ["[git-clone] fatal: the remote end hung up"]), err
    assert err == "[git-clone] the previous run: Error, exit code 128\n"
    code, out, err = await logs(NAME, "--previous", "--waiter", "--timestamps", "--tail", "1", "-c", "git-clone",
                                "--kubeconfig", cfg)
    assert (code, out) == (0, "2026-12-02T10:00:04.500000000Z fatal: the remote end hung up\n"), err
    code, out, err = await logs(NAME, "-p", "--waiter", "-c", "git-clone", "--kubeconfig", cfg)
    assert (code, lines_of(out)) == (0, ["waiter[git-clone]: running git clone", "fatal: the remote end hung up"])
    code, out, _ = await logs(NAME, "--kubeconfig", cfg)  # the current run's, as before
    assert (code, lines_of(out)) == (0, ["[git-clone] cloned"])


async def test_previous_of_a_container_waiting_to_restart_is_its_last_run(kube: KubeDouble, cfg: str) -> None:
    """CrashLoopBackOff: the status still has the last run's restartCount, and `previous`
    reads that run (the kubelet's lastState), as the current log does."""
    looping = wait("prepare", "CrashLoopBackOff")
    looping["lastState"] = terminated("prepare", 2)["state"]
    kube.put_pod(with_status(pod("tekton", NAME, NS, rewritten=False), init=[looping],
                             containers=[wait("step-report")], phase="Pending"))
    kube.append_log(NS, NAME, "prepare", "prepare: no such repository")
    code, out, err = await logs(NAME, "-p", "--kubeconfig", cfg)
    assert (code, lines_of(out)) == (0, ["[prepare]        prepare: no such repository"]), err
    assert err == "[prepare]        the previous run: Error, exit code 2\n"


async def test_previous_without_a_run_again_is_an_error(kube: KubeDouble, cfg: str) -> None:
    rerun_job(kube)
    code, out, err = await logs(NAME, "-p", "-c", "build", "--kubeconfig", cfg)
    assert (code, out, err) == (1, "", f"initshift logs: no previous run of container build in pod {NS}/{NAME}: "
                                       f"not run again by the kubelet\n")
    kube.put_pod(tekton_done())
    kube.set_container_statuses(NS, NAME, [{**done("prepare", 5, 9), "restartCount": 1}])
    code, out, err = await logs(NAME, "-p", "--kubeconfig", cfg)
    assert (code, out) == (1, "")
    assert err.startswith(f"initshift logs: no container of pod {NS}/{NAME} has a previous run: ")
    code, out, err = await logs(NAME, "-p", "-c", "prepare", "--kubeconfig", cfg)
    assert (code, err) == (1, f"initshift logs: no previous run of container prepare in pod {NS}/{NAME}: run again "
                              f"(restart 1), but the kubelet no longer reports the run before, as after the pod has "
                              f"ended\n")


async def test_previous_is_not_followed(kube: KubeDouble, cfg: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The runs --previous reads have ended: with -f a usage error, said before the cluster is asked."""
    code, out, _ = await logs(NAME, "-p", "-f", "--kubeconfig", cfg)
    assert (code, out, kube.requests) == (2, "", [])
    assert capsys.readouterr().err == ("initshift logs: argument -f/--follow: not allowed with argument "
                                       "-p/--previous (see --help)\n")


async def test_pod_log_previous_is_the_kubelets_400_without_a_last_run(kube: KubeDouble) -> None:
    kube.put_pod(running_job())
    async with kube.kube_api() as api:
        with pytest.raises(KubeError) as e:
            async for _ in api.pod_log(NS, NAME, "git-clone", previous=True):
                pass
    assert (e.value.status, e.value.message) == (
        400, f'previous terminated container "git-clone" in pod "{NAME}" not found')
