"""initshift's own tools and parts against the live cluster: `initshift check` (preflight
and --smoke), `initshift status` and `logs -f`, RBAC as the ServiceAccount, and the
watcher killed, or the node's kubelet restarted, in the middle of a build."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

import yaml

from waiter import protocol as p

from ._check import check_build
from concurrent.futures import ThreadPoolExecutor

from ._env import Env, Record, check_report, initshift, native_only, own_cluster, scenario, waiter_modes
from ._install import NAMESPACE
from ._kube import kubectl, parse_time, wait_for
from ._mesh import ISTIO_TRAFFIC, READY_AFTER
from ._pods import annotations, first, log_lines, managed, outcome, pod, statuses, step, wait_end
from ._viewer import viewer


@scenario("check")
def check(env: Env, rec: Record) -> None:
    """`initshift check` against the live cluster: the preflight, then --smoke's build pod and Job-shaped pod."""
    code, lines = check_report(env, "-n", NAMESPACE)
    failed = [x for x in lines if not x.get("ok")]
    assert code == 0 and not failed, f"check exited {code}: {failed}"
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


@scenario("least-privilege")
def least_privilege(env: Env, rec: Record) -> None:
    """`initshift check` (and --smoke), `status` and `logs` as a user granted exactly what the docs list for them."""
    ns = env.namespace("viewer")
    rec.namespaces.append(ns)
    with viewer(env, ns) as config:
        code, lines = check_report(env, "-n", NAMESPACE, kubeconfig=config)
        failed = [x for x in lines if not x.get("ok")]
        assert code == 0 and not failed, f"check as the viewer exited {code}: {failed}"
        smoke = initshift(env, "check", "-n", NAMESPACE, "--smoke", ns, "--keep", "--timeout", "240", "--image",
                          env.images.busybox, "--net-image", env.images.curl, "--net-url",
                          f"http://127.0.0.1:{ISTIO_TRAFFIC}/smoke", timeout=300, kubeconfig=config)
        assert smoke.returncode == 0, f"check --smoke as the viewer exited {smoke.returncode}:\n" \
                                      f"{smoke.stdout[-3000:]}\n{smoke.stderr[-2000:]}"
        (kept,) = [x["metadata"]["name"] for x in env.kube.pods(ns) if x["metadata"]["name"].startswith(
            "initshift-smoke-") and not x["metadata"]["name"].startswith("initshift-smoke-job-")]
        shown = {" ".join(args[:-2]): initshift(env, *args, timeout=120, kubeconfig=config)
                 for args in (("status", kept, "-n", ns), ("status", "-n", ns), ("logs", kept, "-n", ns))}
        refused = {what: f"exit {r.returncode}: {r.stderr.strip()[-300:]}" for what, r in shown.items()
                   if r.returncode != 0 or not r.stdout.strip()}
        assert not refused, f"as the viewer: {refused}"
    rec.note(f"as a ServiceAccount granted only the documented verbs: check {len(lines)} lines ✔, --smoke passed, "
             f"{', '.join(shown)} answered")


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
    # --timestamps: the kubelet's time of each line after its prefix. The runtime stamps a
    # line when it reads it from the container's pipe, each container's apart, so the last
    # line of a step and the first of the next can come stamped out of order (seen by 0.2 ms
    # on v1.28.15); each step's first line comes after the one before's (1 s of work apart).
    stamped = initshift(env, "logs", "build", "-n", ns, "--timestamps", timeout=60)
    assert stamped.returncode == 0, stamped.stderr
    rows = [line.split(None, 2) for line in stamped.stdout.splitlines() if line.startswith("[")]
    assert rows and all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z", r[1]) for r in rows), stamped.stdout
    times = [r[1] for r in rows if r[0].strip("[]") in names]
    starts = [next(r[1] for r in rows if r[0] == f"[{s}]") for s in names]
    assert starts == sorted(starts), f"logs --timestamps: the steps' first lines out of time order:\n{stamped.stdout}"
    # --tail 1: each container's last line shown (the waiter's own, which the kubelet counts, hidden).
    last = initshift(env, "logs", "build", "-n", ns, "--tail", "1", timeout=60)
    assert last.returncode == 0, last.stderr
    assert [line.split(None, 1) for line in last.stdout.splitlines()] == [
        [f"[{c}]", f"{c} end"] for c in [*names, "completion"]], last.stdout
    recent = initshift(env, "logs", "build", "-n", ns, "--since", "10m", timeout=60)  # by the kubelet's clock
    assert (recent.returncode, recent.stdout) == (0, initshift(env, "logs", "build", "-n", ns, timeout=60).stdout), \
        recent.stderr
    # -c (--waiter: every line the kubelet has): the container's log as `kubectl logs -c` prints it.
    alone = initshift(env, "logs", "build", "-n", ns, "-c", "compile", "--waiter", timeout=60)
    raw = kubectl(env.admin, "logs", "build", "-n", ns, "-c", "compile").stdout
    assert (alone.returncode, alone.stdout) == (0, raw) and "compile end" in raw, (alone.stdout, raw, alone.stderr)
    result = outcome(env.kube, ns, "build")
    status = initshift(env, "status", "build", "-n", ns, "-o", "json", timeout=60)
    assert status.returncode == 0, status.stderr
    view = json.loads(status.stdout)
    text = json.dumps(view)
    assert result["result"] in text and all(s in text for s in names), view
    table = initshift(env, "status", "build", "-n", ns, timeout=60).stdout
    assert "Succeeded" in table, table
    listed = initshift(env, "status", "-n", ns, timeout=60).stdout.splitlines()
    strategy = managed(env.kube.get(f"/api/v1/namespaces/{ns}/pods/build"))
    assert len(listed) == 2 and listed[1].split()[:4] == ["build", strategy, "3/3", "Succeeded"], listed
    # -l: the apiserver reads the selector beside initshift's own, and refuses a malformed one.
    by_label = initshift(env, "status", "-n", ns, "-l", f"{p.LABEL_MANAGED}={strategy}", timeout=60).stdout
    assert [line.split()[:4] for line in by_label.splitlines()] == [line.split()[:4] for line in listed], by_label
    none = initshift(env, "status", "-n", ns, "-l", "app=other", timeout=60)
    assert (none.returncode, none.stdout) == (0, "") and "with labels app=other" in none.stderr, none.stderr
    bad = initshift(env, "status", "-n", ns, "-l", "app in (ci", timeout=60)
    assert bad.returncode == 1 and bad.stderr.startswith(f"initshift status: cannot list the pods of namespace {ns} "
                                                         f"with labels app in (ci: "), bad.stderr
    rec.note(f"logs -f followed {', '.join(order)}; logs --timestamps: {len(times)} step lines, each step's first "
             f"in step order; logs --tail 1: each one's last line; logs -c compile: as kubectl logs -c prints it; "
             f"--since 10m: all of them; status: {table.splitlines()[1].strip() if table else ''}; the namespace's list: "
             f"{' '.join(listed[1].split())}, by -l too; a malformed -l: {bad.stderr.strip()}")


class _Cuttable:
    """A TCP forwarder to the apiserver whose open connections can all be reset at once, as
    a load balancer's idle timeout or an apiserver restart does to a long follow."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.open: list[socket.socket] = []
        self.cuts = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
                upstream = socket.create_connection(self.target)
            except OSError:
                return
            self.open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.cuts += 1
        self._reset()

    def _reset(self) -> None:
        for sock in self.open:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.shutdown(socket.SHUT_RDWR)
        self.open = []

    def close(self) -> None:
        self.listener.close()
        self._reset()


@scenario("logs-resume")
def logs_resume(env: Env, rec: Record) -> None:
    """`initshift logs -f --since 1h` through a connection to the apiserver that is reset
    mid-step, twice: the followed log is taken up again from the kubelet's timestamps (never
    beside `sinceSeconds`, which the apiserver refuses) and the pod's watch from its
    resourceVersion; every line printed once, in order."""
    ns = env.namespace("resume")
    rec.namespaces.append(ns)
    count = 60
    talk = step("talk", env.images.busybox, port=None,
                extra=f'i=0; while [ $i -lt {count} ]; do echo "talk line $i"; i=$((i+1)); sleep 0.1; done; ')
    env.kube.create(f"/api/v1/namespaces/{ns}/pods", pod("build", [talk], [step("done", env.images.busybox,
                                                                                port=None)]))
    config = yaml.safe_load(env.admin.read_text())
    server = urlsplit(config["clusters"][0]["cluster"]["server"])
    proxy = _Cuttable((server.hostname or "127.0.0.1", server.port or 443))
    config["clusters"][0]["cluster"]["server"] = f"https://{server.hostname}:{proxy.port}"
    through = env.admin.with_name("resume.kubeconfig")
    through.write_text(yaml.safe_dump(config))
    follow = subprocess.Popen([sys.executable, "-m", "webhook.cli", "logs", "build", "-n", ns, "-f", "--since", "1h",
                               "--kubeconfig", str(through)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "NO_COLOR": "1"})
    seen: list[str] = []
    try:
        assert follow.stdout is not None
        for line in follow.stdout:
            seen.append(line.rstrip("\n"))
            if line.rstrip().endswith(("talk line 15", "talk line 35")):
                proxy.cut()
        follow.wait(timeout=240)
    finally:
        if follow.poll() is None:
            follow.kill()
        proxy.close()
    err = follow.stderr.read() if follow.stderr else ""
    assert follow.returncode == 0, f"logs -f exited {follow.returncode}: {err[-1000:]}"
    talked = [line.split(None, 1)[1] for line in seen if line.startswith("[talk]")]
    want = ["talk start", *(f"talk line {i}" for i in range(count)), "talk end"]
    assert proxy.cuts == 2 and talked == want, f"{proxy.cuts} cuts; logs -f printed:\n" + "\n".join(seen)
    assert any(line.startswith("[done]") for line in seen), seen
    rec.note(f"the connection reset twice mid-step: {len(talked)} lines of `talk`, each once and in order")


@scenario("rbac")
def rbac(env: Env, rec: Record) -> None:
    """The ServiceAccount may do the server's and watcher's work and nothing more (kubectl auth can-i)."""
    rows = env.install.can_i()
    wrong = [r for r in rows if r[3] != r[4]]
    assert not wrong, "kubectl auth can-i differs from what initshift needs: " + "; ".join(
        f"{v} {w} in {n}: expected {'yes' if e else 'no'}" for v, w, n, e, _ in wrong)
    forbidden = env.install.logs_forbidden()
    assert not forbidden, "initshift was refused something it needs:\n" + "\n".join(forbidden[:5])
    rec.details += ["| verb | what | where | allowed |", "|---|---|---|---|"]
    rec.details += [f"| {v} | `{w}` | {n} | {'yes' if got else 'no'} |" for v, w, n, _, got in rows]
    rec.note(f"{sum(r[3] for r in rows)} grants used, {sum(not r[3] for r in rows)} refusals confirmed; "
             f"the server and watcher ran as {NAMESPACE}/initshift with no 403")


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


@scenario("kubelet-restarted", phase=2, applies=own_cluster)
def kubelet_restarted(env: Env, rec: Record) -> None:
    """The node's kubelet restarted twice during a build (an upgrade, a configuration
    change), under each strategy whose steps the waiter runs: while step 0 waits for the
    proxy's readiness (the new kubelet reports the proxy not ready until its first probe),
    and while a step runs. No command runs twice (a container the kubelet had created but not
    started when it stopped is created again), the steps stay in order through the proxy,
    the outcome is Succeeded, the proxy ends."""
    assert env.cluster is not None
    ns = env.namespace("kubelet")
    rec.namespaces.append(ns)
    modes = waiter_modes(env)
    _start_builds(env, ns, modes, {READY_AFTER: "6"})

    def proxy_starting(mode: str) -> bool:
        proxy = statuses(env.kube.pod(ns, f"build-{mode}") or {}).get("istio-proxy") or {}
        return "running" in (proxy.get("state") or {}) and not proxy.get("ready")

    for mode in modes:
        wait_for(lambda: proxy_starting(mode), 120, f"build-{mode}'s proxy running, not ready yet")
    gate_down = env.cluster.restart_kubelet()
    assert not any(first(log_lines(env.kube, ns, f"build-{mode}", "s1"), "^s1 start$") for mode in modes), \
        "s1 started before the proxy was ready: the restart did not come during the gate's wait"
    _wait_step_runs(env, ns, modes, "s2")
    down = env.cluster.restart_kubelet()
    with ThreadPoolExecutor(len(modes)) as pool:
        notes = list(pool.map(lambda mode: _built_once(env, rec, ns, mode), modes))
    rec.note(f"kubelet restarted during the gate's wait and during s2 (healthy again in {gate_down:.1f} / "
             f"{down:.1f} s); " + "; ".join(notes))


@scenario("apiserver-restarted", phase=2, applies=own_cluster)
def apiserver_restarted(env: Env, rec: Record) -> None:
    """kube-apiserver stopped while a build runs and started again at least 12 s later (a
    control-plane upgrade), under each strategy whose steps the waiter runs: the build runs
    to its end without the API; the watcher, its watch and Lease cut for longer than its
    renew deadline (10 s), writes the outcome once the API is back and renews its Lease; a
    build created afterwards is rewritten and succeeds."""
    assert env.cluster is not None
    ns = env.namespace("apiserver")
    rec.namespaces.append(ns)
    modes = waiter_modes(env)
    _start_builds(env, ns, modes)
    _wait_step_runs(env, ns, modes, "s2")
    down = env.cluster.plane.restart_apiserver(down=12)
    back = dt.datetime.now(dt.timezone.utc)
    with ThreadPoolExecutor(len(modes)) as pool:
        notes = list(pool.map(lambda mode: _built_once(env, rec, ns, mode), modes))
    for mode in modes:  # the build ended while the API was down: its outcome waited for the API,
        obj = env.kube.pod(ns, f"build-{mode}") or {}  # and for the kubelet's status (seconds in managedFields)
        posted = max(parse_time(f["time"]) for f in obj["metadata"].get("managedFields") or []
                     if f.get("manager") == "kubelet" and f.get("subresource") == "status")
        decided = parse_time(outcome(env.kube, ns, f"build-{mode}")["decidedAt"])
        rec.note(f"{mode}: the outcome {(decided - posted).total_seconds():.0f} s after the kubelet's last status "
                 f"(both to the second; that status {(posted - back).total_seconds():+.0f} s from the apiserver's "
                 f"/readyz answering 200, which comes after it serves)")
    lease = env.install.env.get("INITSHIFT_LEASE_NAME", "initshift-watcher")

    def renewed() -> bool:
        obj = env.kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{lease}") or {}
        when = (obj.get("spec") or {}).get("renewTime")
        return bool(when) and parse_time(when) > back

    wait_for(renewed, 60, "the watcher's Lease renewed after the restart")
    assert env.install.watcher is not None
    said = env.install.watcher.log.read_text(errors="replace")
    assert "lost the lease" in said, "the watcher never gave up its Lease: the API was not down long enough"
    after = [step(s, env.images.busybox, port=ISTIO_TRAFFIC) for s in ("fetch", "compile")]
    env.kube.create(f"/api/v1/namespaces/{ns}/pods", pod("after", after, [step("completion", env.images.busybox,
                                                                              port=None)]))
    build = check_build(env, rec, ns, "after", steps=["fetch", "compile"], proxy="istio-proxy",
                        strategy=env.build_strategy)
    assert outcome(env.kube, ns, "after", timeout=120)["result"] == "Succeeded"
    rec.note(f"kube-apiserver stopped during s2, ready again {down:.1f} s after its SIGTERM; "
             + "; ".join(notes)
             + f"; the watcher gave up its Lease and took it again; a build created after: {managed(build.obj)}, Succeeded")


OLD_KUBELET, NEW_KUBELET = "v1.28.15", "v1.34.9"


@scenario("kubelet-upgrade", phase=2, applies=native_only)
def kubelet_upgrade(env: Env, rec: Record) -> None:
    """A cluster upgrade seen by `auto`: a second node whose kubelet reports v1.28, then,
    upgraded in place, v1.34 (a Node object of its own; no pod runs there), with the server
    reading node versions (`nodes: list`, which the install grants by default) every second.
    Builds get the waiter while any kubelet is older than v1.29 and hybrid once the last one
    is upgraded, without a restart; a build rewritten under the waiter before the switch ends
    under it."""
    ns = env.namespace("upgrade")
    rec.namespaces.append(ns)
    node = f"old-pool-{env.run}"

    def cleanup() -> None:  # before the server restarts as it was: it must find every kubelet upgraded
        env.kube.delete(f"/api/v1/nodes/{node}")

    def kubelet(version: str) -> None:  # what a kubelet reports of itself when it (re)starts
        env.kube.patch(f"/api/v1/nodes/{node}/status", {"status": {"nodeInfo": {"kubeletVersion": version}}})

    try:
        env.kube.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}, "spec": {
            "unschedulable": True, "taints": [{"key": "e2e.initshift.io/no-kubelet", "effect": "NoSchedule"}]}})
        kubelet(OLD_KUBELET)
        with env.install.serving_with(INITSHIFT_NATIVE_REFRESH_SECONDS="1"):
            try:
                before = env.install.readyz()[1]
                assert (before.get("strategy"), before.get("native_supported")) == (p.MODE_WAITER, False), before
                steps = [step("fetch", env.images.busybox, port=ISTIO_TRAFFIC, sleep=6),
                         step("test", env.images.busybox, port=ISTIO_TRAFFIC)]
                env.kube.create(f"/api/v1/namespaces/{ns}/pods", pod("during", steps, [
                    step("completion", env.images.busybox, port=None)]))
                wait_for(lambda: first(log_lines(env.kube, ns, "during", "fetch"), "^fetch fetched "), 120,
                         "the first build's first step to run")
                upgraded = time.monotonic()
                kubelet(NEW_KUBELET)
                after = wait_for(lambda: (lambda r: r if r.get("strategy") == p.MODE_HYBRID else None)(
                    env.install.readyz()[1]), 30, "the server to switch to hybrid")
                switched = time.monotonic() - upgraded
                assert after.get("native_supported") is True, after
                env.kube.create(f"/api/v1/namespaces/{ns}/pods", pod("after", steps, [
                    step("completion", env.images.busybox, port=None)]))
                check_build(env, rec, ns, "during", steps=["fetch", "test"], proxy="istio-proxy",
                            strategy=p.MODE_WAITER)
                check_build(env, rec, ns, "after", steps=["fetch", "test"], proxy="istio-proxy",
                            strategy=p.MODE_HYBRID)
                for name in ("during", "after"):
                    assert outcome(env.kube, ns, name)["result"] == "Succeeded", name
                assert env.install.server is not None
                said = [json.loads(line)["msg"] for line in env.install.server.log.read_text().splitlines()
                        if '"initshift.cluster"' in line]
                old = f"lowest kubelet {OLD_KUBELET[:5]} of 2 node(s) is older than v1.29"
                assert any(old in m for m in said), said
            finally:
                cleanup()
    finally:
        cleanup()
    rec.note(f"a node's kubelet {OLD_KUBELET}: builds under the waiter; reported {NEW_KUBELET}: the server said "
             f"hybrid {switched:.1f} s later (refresh every 1 s), without a restart; the build started before "
             f"ended under the waiter, the one after under hybrid, both Succeeded")


STEPS = ["s1", "s2", "s3", "s4"]


def _start_builds(env: Env, ns: str, modes: list[str], annotations: dict[str, str] | None = None) -> None:
    """`build-MODE` in each mode: four 1.5 s steps through the proxy and a main."""
    for mode in modes:
        steps = [step(s, env.images.busybox, port=ISTIO_TRAFFIC, sleep=1.5) for s in STEPS]
        env.kube.create(f"/api/v1/namespaces/{ns}/pods", pod(
            f"build-{mode}", steps, [step("completion", env.images.busybox, port=None)],
            annotations={p.ANNOTATION_MODE: mode, **(annotations or {})}))


def _wait_step_runs(env: Env, ns: str, modes: list[str], name: str) -> None:
    for mode in modes:
        wait_for(lambda: first(log_lines(env.kube, ns, f"build-{mode}", name), f"^{name} start$"), 180,
                 f"build-{mode}'s step {name} running")


def _built_once(env: Env, rec: Record, ns: str, mode: str) -> str:
    """`build-MODE` ended as it should (check_build), no command ran twice, the outcome is
    Succeeded. (A kubelet stopped between creating a container and starting it creates
    another on its restart, `restartPolicy: Never` or not: restartCount 1, the first one
    never started. What must not happen is a container that ran being run again: its
    earlier instance would have logged.)"""
    name = f"build-{mode}"
    build = check_build(env, rec, ns, name, steps=STEPS, proxy="istio-proxy", strategy=mode)
    again = {c: s.get("restartCount") for c, s in statuses(build.obj).items() if s.get("restartCount")}
    for c in again:
        before = [line for line in env.kube.logs(ns, name, c, previous=True).splitlines() if f" {c} start" in line]
        assert not before, f"{name}: {c} ran again (restartCount {again[c]}); its earlier run logged {before}"
    result = outcome(env.kube, ns, name, timeout=120)
    assert result["result"] == "Succeeded", f"{name}: {result}"
    recreated = f" (the kubelet re-created {', '.join(again)}: the first never ran its command)" if again else ""
    return f"{mode}: in order, each once{recreated}, outcome Succeeded"
