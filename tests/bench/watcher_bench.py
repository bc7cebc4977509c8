"""`make bench-watcher`: the watcher driving managed build pods at cluster scale.

The in-process API double plays the apiserver, with every write taking 20-30 ms before it
commits (a loaded apiserver's latency); the bench plays the kubelet, writing container
statuses (in-process, as `pods/status` writes would land). The watcher runs as its own
process (`run_watcher`, leader election on, JSON logs at info to /dev/null, as deployed),
so its CPU and memory are its own.

Each scenario starts a fresh double and watcher with N managed pods in flight (Pending).
The driver advances pods through four status changes each (sidecar Ready and steps
running; step 1 done; step 2 done; the main done, the proxy quitting with it for half the
pods and kept running for the other half, which the watcher ends with the deadline) at a
fixed rate, on a window of 64 pods at a time, for a fixed time (or until every pod is
done). A burst: up to 1,000 pods made Ready at once, then all their steps done at once.
`INITSHIFT_GRACE_SECONDS=0`, so the outcome is due at the last change (not after a grace
period whose start the kubelet stamps to the second).

Latencies are measured on the double: from the status change to the answer to the
watcher's PATCH (ready annotation; outcome annotation). Prints, asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field

from tests.support.kubedouble import KubeDouble, running, terminated, waiting
from waiter import protocol as p

NS = "builds"
AGENT = "bench-watcher"
WINDOW = 64  # pods driven at once in the rate phases
SCENARIOS = [(100, 40, 20.0), (100, 200, 15.0), (1000, 40, 20.0), (1000, 200, 15.0), (5000, 40, 20.0),
             (5000, 200, 15.0)]
BURST = 1000
WRITE_LATENCY = (0.020, 0.030)
SETTLE = 30.0  # seconds the watcher gets to write what is due after the last change


def build_pod(name: str) -> dict:
    """A pod as the webhook writes it: two steps, one main, the proxy (with the usual env)."""
    cmd = [p.WAITER_PATH, p.CMD_RUN]
    env = [{"name": f"VAR_{i}", "value": "x" * 40} for i in range(10)]
    return {
        "metadata": {"name": name, "namespace": NS, "labels": {p.LABEL_MANAGED: p.MODE_WAITER, "app": "build"},
                     "annotations": {p.ANNOTATION_STEPS: json.dumps(["fetch", "build"]),
                                     p.ANNOTATION_MAINS: json.dumps(["completion"]),
                                     "sidecar.istio.io/status": json.dumps({"containers": ["istio-proxy"]})}},
        "spec": {"restartPolicy": "Never",
                 "initContainers": [{"name": p.INIT_CONTAINER_NAME, "image": "initshift", "env": env}],
                 "containers": [{"name": n, "image": "tool", "command": cmd, "args": ["--", "make", n], "env": env}
                                for n in ("fetch", "build", "completion")]
                 + [{"name": "istio-proxy", "image": "proxy", "args": ["proxy", "sidecar"], "env": env}]},
    }


def record(name: str) -> str:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return json.dumps({"name": name, "exitCode": 0, "reason": p.REASON_COMPLETED, "startedAt": now,
                       "finishedAt": now, "message": ""})


def done(name: str) -> dict:
    return terminated(name, 0, message=record(name))


@dataclass
class Pod:
    name: str
    quits: bool
    stage: int = 0  # status changes written so far (4: done)
    ready_at: float = 0.0  # when the change that makes it Ready was written
    last_at: float = 0.0  # when the last change was written


@dataclass
class Result:
    label: str
    changes: int = 0
    seconds: float = 0.0
    ready: list[float] = field(default_factory=list)
    outcome: list[float] = field(default_factory=list)
    pods_done: int = 0
    missed: int = 0
    twice: int = 0
    requests: int = 0
    cpu: float = 0.0
    rss: float = 0.0
    hwm: float = 0.0


def advance(kube: KubeDouble, pod: Pod) -> None:
    """The next status change of `pod`, as the kubelet writes it."""
    now = time.monotonic()
    if pod.stage == 0:
        kube.set_container_statuses(NS, pod.name, [running("istio-proxy"), running("fetch"), running("build"),
                                                   running("completion")], phase="Running")
        pod.ready_at = now
    elif pod.stage == 1:
        kube.set_container_statuses(NS, pod.name, [done("fetch")])
    elif pod.stage == 2:
        kube.set_container_statuses(NS, pod.name, [done("build")])
    else:
        last = [done("completion")] + ([terminated("istio-proxy", 0)] if pod.quits else [])
        kube.set_container_statuses(NS, pod.name, last, phase="Succeeded" if pod.quits else None)
    pod.stage += 1
    pod.last_at = now


def annotations(kube: KubeDouble, name: str) -> dict:
    return kube._objects["pods"][(NS, name)]["metadata"].get("annotations") or {}  # no copy: 5,000 pods


def gated(kube: KubeDouble, pod: Pod) -> bool:
    """The steps start only once the watcher opened the gate."""
    return pod.stage != 1 or annotations(kube, pod.name).get(p.ANNOTATION_READY) == p.READY_TRUE


async def drive(kube: KubeDouble, pods: list[Pod], rate: float, seconds: float) -> int:
    """Status changes at `rate` per second on a window of pods, for `seconds` or until all are done."""
    queue = list(pods)
    window: list[Pod] = []
    changes, start = 0, time.monotonic()
    while time.monotonic() - start < seconds and (queue or window):
        due = int((time.monotonic() - start) * rate) - changes
        for _ in range(due):
            while len(window) < WINDOW and queue:
                window.append(queue.pop(0))
            movable = [pd for pd in window if gated(kube, pd)]
            if not movable:
                break
            pod = random.choice(movable)
            advance(kube, pod)
            changes += 1
            if pod.stage == 4:
                window.remove(pod)
        await asyncio.sleep(0.01)
    return changes


async def burst(kube: KubeDouble, pods: list[Pod]) -> int:
    """Every pod Ready at once; once the gates are open, every pod's steps done at once."""
    for pod in pods:
        advance(kube, pod)
    await wait_for(lambda: all(gated(kube, pd) for pd in pods if pd.stage == 1), SETTLE)
    for pod in pods:
        now = time.monotonic()
        done_all = [done("fetch"), done("build"), done("completion")]
        kube.set_container_statuses(NS, pod.name, done_all + ([terminated("istio-proxy", 0)] if pod.quits else []),
                                    phase="Succeeded" if pod.quits else None)
        pod.stage, pod.last_at = 4, now
    return len(pods) * 2


async def wait_for(check, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if check():
            return True
        await asyncio.sleep(0.1)
    return False


def proc_stats(pid: int) -> tuple[float, float, float]:
    """(CPU seconds, RSS MiB, peak RSS MiB) of a process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status"))
    return cpu, int(status["VmRSS"].split()[0]) / 1024, int(status["VmHWM"].split()[0]) / 1024


def measure(kube: KubeDouble, pods: list[Pod], result: Result, since: int) -> None:
    """Latencies from the double's record of the watcher's patches after request `since`."""
    ready_at: dict[str, float] = {}
    outcome_at: dict[str, list[float]] = {}
    for r in kube.requests[since:]:
        if r.user_agent != AGENT or r.method != "PATCH" or r.status != 200:
            continue
        name = r.path.rsplit("/", 1)[1]
        ann = (r.body.get("metadata") or {}).get("annotations") or {}
        if p.ANNOTATION_READY in ann:
            ready_at.setdefault(name, r.finished)
        if p.ANNOTATION_OUTCOME in ann:
            outcome_at.setdefault(name, []).append(r.finished)
    for pod in pods:
        if pod.stage >= 1 and pod.name in ready_at:
            result.ready.append(ready_at[pod.name] - pod.ready_at)
        if pod.stage == 4:
            result.pods_done += 1
            got = outcome_at.get(pod.name)
            if not got:
                result.missed += 1
                continue
            result.outcome.append(got[0] - pod.last_at)
            result.twice += len(got) > 1
        elif pod.stage >= 1 and pod.name not in ready_at:
            result.missed += 1
    result.requests = sum(1 for r in kube.requests[since:] if r.user_agent == AGENT)


async def scenario(n: int, label: str, rate: float, seconds: float) -> Result:
    """N pods in flight, a fresh double and watcher; drive them at `rate` (0: a burst)."""
    async with KubeDouble(history_limit=20000) as kube:
        pods = [Pod(f"build-{i:05d}", quits=i % 2 == 0) for i in range(n)]
        for pod in pods:
            kube.put_pod(build_pod(pod.name))
            kube.set_container_statuses(NS, pod.name, [waiting("istio-proxy"), waiting("fetch"), waiting("build"),
                                                       waiting("completion")], phase="Pending")
        kube.write_latency = WRITE_LATENCY
        env = {**os.environ, "INITSHIFT_GRACE_SECONDS": "0", "INITSHIFT_LOG_LEVEL": "info"}
        proc = subprocess.Popen([sys.executable, "-m", "tests.bench.watcher_bench", "--watcher", kube.url], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            listed = lambda: any(r.user_agent == AGENT and r.query.get("watch") == "true"  # noqa: E731
                                 and r.path == "/api/v1/pods" for r in kube.requests)
            if not await wait_for(listed, 120):
                raise SystemExit("the watcher did not start watching")
            await asyncio.sleep(1.0)
            result = Result(label)
            since = len(kube.requests)
            cpu0, _, _ = proc_stats(proc.pid)
            start = time.monotonic()
            if rate:
                result.changes = await drive(kube, pods, rate, seconds)
            else:
                result.changes = await burst(kube, pods[:BURST])
            result.seconds = time.monotonic() - start
            moved = [pd for pd in pods if pd.stage > 0]
            await wait_for(lambda: all(p.ANNOTATION_OUTCOME in annotations(kube, pd.name)
                                       for pd in moved if pd.stage == 4), SETTLE)
            await asyncio.sleep(0.5)
            measure(kube, moved, result, since)
            result.cpu, result.rss, result.hwm = proc_stats(proc.pid)
            result.cpu -= cpu0
            return result
        finally:
            proc.terminate()
            proc.wait(30)


def pct(values: list[float], q: float) -> str:
    if not values:
        return "-"
    values = sorted(values)
    return f"{values[min(len(values) - 1, int(len(values) * q))]:.2f}"


def report(results: list[Result]) -> None:
    print(f"watcher benchmark: writes {WRITE_LATENCY[0] * 1000:.0f}-{WRITE_LATENCY[1] * 1000:.0f} ms on the API "
          f"double, {os.cpu_count()} cores shared by the double, the driver and the watcher")
    print(f"{'load':<28} {'changes/s':>9} {'ready p50/p99 s':>16} {'outcome p50/p99 s':>18} {'done':>5} "
          f"{'missed':>6} {'twice':>5} {'req/pod':>7} {'CPU s':>6} {'RSS/peak MiB':>13}")
    for r in results:
        print(f"{r.label:<28} {r.changes / max(r.seconds, 1e-9):>9.0f} "
              f"{pct(r.ready, 0.5) + ' / ' + pct(r.ready, 0.99):>16} "
              f"{pct(r.outcome, 0.5) + ' / ' + pct(r.outcome, 0.99):>18} {r.pods_done:>5} {r.missed:>6} "
              f"{r.twice:>5} {r.requests / max(r.pods_done, 1):>7.1f} {r.cpu:>6.1f} "
              f"{r.rss:>6.0f}/{r.hwm:<6.0f}")


async def run_all(only: int | None) -> list[Result]:
    results: list[Result] = []
    runs = [(n, f"{n:,} pods, {rate}/s ({seconds:.0f} s)", rate, seconds) for n, rate, seconds in SCENARIOS]
    runs += [(n, f"{n:,} pods, burst of {min(n, BURST):,}", 0, 0) for n in sorted({s[0] for s in SCENARIOS})]
    runs.sort(key=lambda r: r[0])
    for n, label, rate, seconds in runs:
        if only and n != only:
            continue
        results.append(await scenario(n, label, rate, seconds))
        print(f"  ({label}: done)", file=sys.stderr, flush=True)
    return results


def watcher_main(url: str) -> None:
    """The watcher process: `run_watcher` against the double, until SIGTERM."""
    import signal

    from webhook import logs
    from webhook.kube import KubeApi
    from webhook.settings import Settings
    from webhook.watcher import run_watcher

    settings = Settings.from_env()
    logs.configure(settings.server.log_level)

    async def main() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        api = KubeApi.for_host(url)
        api.user_agent = AGENT
        try:
            await run_watcher(settings, stop, api=api, identity="bench")
        finally:
            await api.close()
    asyncio.run(main())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--watcher", metavar="URL", help=argparse.SUPPRESS)
    ap.add_argument("--pods", type=int, help="only the scenarios with this many pods")
    args = ap.parse_args()
    if args.watcher:
        watcher_main(args.watcher)
        return 0
    report(asyncio.run(run_all(args.pods)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
