"""initshift's own tools and parts against the live cluster: `initshift check` (preflight
and --smoke), `initshift status` and `logs -f`, RBAC as the ServiceAccount, and the
watcher killed in the middle of a build."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from waiter import protocol as p

from ._check import check_build
from ._env import Env, Record, scenario
from ._install import NAMESPACE
from ._kube import wait_for
from ._mesh import ISTIO_TRAFFIC
from ._pods import annotations, first, log_lines, managed, outcome, pod, step, wait_end


def initshift(env: Env, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """The CLI as a user runs it, with the admin's kubeconfig."""
    return subprocess.run([sys.executable, "-m", "webhook.cli", *args, "--kubeconfig", str(env.admin)],
                          capture_output=True, text=True, timeout=timeout)


@scenario("check")
def check(env: Env, rec: Record) -> None:
    """`initshift check` against the live cluster: the preflight, then --smoke's build pod and Job-shaped pod."""
    proc = initshift(env, "check", "-n", NAMESPACE, "-o", "json", timeout=120)
    try:
        lines = json.loads(proc.stdout)["checks"]
    except (ValueError, KeyError):
        raise AssertionError(f"check -o json printed no report (exit {proc.returncode}): {proc.stdout[-1000:]} "
                             f"{proc.stderr[-1000:]}") from None
    failed = [x for x in lines if not x.get("ok")]
    assert proc.returncode == 0 and not failed, f"check exited {proc.returncode}: {failed}"
    titles = " ".join(x["title"] for x in lines)
    assert "Istio injector" in titles and "Linkerd injector" in titles, titles
    ns = env.namespace("smoke")
    rec.namespaces.append(ns)
    smoke = initshift(env, "check", "-n", NAMESPACE, "--smoke", ns, "--timeout", "240", "--image",
                      env.images.busybox, "--net-image", env.images.curl, "--net-url",
                      f"http://127.0.0.1:{ISTIO_TRAFFIC}/smoke", timeout=300)
    assert smoke.returncode == 0, f"check --smoke exited {smoke.returncode}:\n{smoke.stdout[-3000:]}\n" \
                                  f"{smoke.stderr[-2000:]}"
    smoke_lines = [x for x in smoke.stdout.splitlines() if "smoke" in x.lower() or "✔" in x]
    rec.note(f"preflight: {len(lines)} checks passed; --smoke passed ({len(smoke_lines)} lines)")


@scenario("status-and-logs")
def status_and_logs(env: Env, rec: Record) -> None:
    """`initshift logs -f` follows a running build step by step; `initshift status` shows the result."""
    ns = env.namespace("status")
    rec.namespaces.append(ns)
    names = ["fetch", "compile", "test"]
    steps = [step(s, env.images.busybox, port=ISTIO_TRAFFIC, sleep=1.0) for s in names]
    env.kube.create(f"/api/v1/namespaces/{ns}/pods", pod("build", steps, [step("completion", env.images.busybox,
                                                                              port=None)]))
    follow = subprocess.Popen([sys.executable, "-m", "webhook.cli", "logs", "build", "-n", ns, "-f",
                               "--kubeconfig", str(env.admin)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "NO_COLOR": "1"})
    try:
        out, err = follow.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        follow.kill()
        raise AssertionError("initshift logs -f did not end with the pod") from None
    assert follow.returncode == 0, f"logs -f exited {follow.returncode}: {err[-1000:]}"
    got = [line.split()[0] for line in out.splitlines() if line.startswith("[")]
    order = [c.strip("[]") for c in dict.fromkeys(got)]
    assert order == [*names, "completion"], f"logs -f printed {order}:\n{out}"
    for s in names:
        assert f"[{s}]" in out and f"{s} end" in out, out
    wait_end(env.kube, ns, "build")
    result = outcome(env.kube, ns, "build")
    status = initshift(env, "status", "build", "-n", ns, "-o", "json", timeout=60)
    assert status.returncode == 0, status.stderr
    view = json.loads(status.stdout)
    text = json.dumps(view)
    assert result["result"] in text and all(s in text for s in names), view
    table = initshift(env, "status", "build", "-n", ns, timeout=60).stdout
    assert "Succeeded" in table, table
    rec.note(f"logs -f followed {', '.join(order)}; status: {table.splitlines()[1].strip() if table else ''}")


@scenario("rbac")
def rbac(env: Env, rec: Record) -> None:
    """The ServiceAccount may do the server's and watcher's work and nothing more (kubectl auth can-i)."""
    rows = env.install.can_i()
    wrong = [r for r in rows if r[3] != r[4]]
    assert not wrong, "kubectl auth can-i differs from what initshift needs: " + "; ".join(
        f"{v} {w} in {n}: expected {'yes' if e else 'no'}" for v, w, n, e, _ in wrong)
    forbidden = [line for line in env.install.logs_forbidden() if "nodes" not in line]
    assert not forbidden, "initshift was refused something it needs:\n" + "\n".join(forbidden[:5])
    rec.details += ["| verb | what | where | allowed |", "|---|---|---|---|"]
    rec.details += [f"| {v} | `{w}` | {n} | {'yes' if got else 'no'} |" for v, w, n, _, got in rows]
    rec.note(f"{sum(r[3] for r in rows)} grants used, {sum(not r[3] for r in rows)} refusals confirmed; "
             f"the server and watcher ran as {NAMESPACE}/initshift with no 403 but `list nodes` (optional)")


@scenario("watcher-killed", phase=2)
def watcher_killed(env: Env, rec: Record) -> None:
    """The watcher killed (SIGKILL) mid-build: a new one takes the Lease over and records the outcome."""
    ns = env.namespace("killed")
    rec.namespaces.append(ns)
    names = ["s1", "s2", "s3", "s4"]
    steps = [step(s, env.images.busybox, port=ISTIO_TRAFFIC, sleep=1.5) for s in names]
    env.kube.create(f"/api/v1/namespaces/{ns}/pods", pod("build", steps, [step("completion", env.images.busybox,
                                                                              port=None)]))
    wait_for(lambda: first(log_lines(env.kube, ns, "build", "s2"), "^s2 start$"), 180, "step s2 running")
    assert env.install.watcher is not None
    env.install.watcher.popen.kill()
    env.install.watcher.popen.wait()
    killed_at = time.monotonic()
    env.install.start_watcher()
    build = check_build(env, rec, ns, "build", steps=names, proxy="istio-proxy", strategy=env.build_strategy)
    result = outcome(env.kube, ns, "build", timeout=120)
    took = time.monotonic() - killed_at
    assert result["result"] == "Succeeded", result
    env.install.wait_watcher_leads(env.kube)
    assert p.ANNOTATION_OUTCOME in annotations(env.kube.pod(ns, "build") or {})
    rec.note(f"strategy {managed(build.obj)}; watcher killed during s2, restarted at once; outcome Succeeded")
    rec.figure("kill -> outcome written", took, "s")
