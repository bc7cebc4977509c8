"""`make bench-deployment`: the Deployment's memory as it runs, attacked and in a watcher
burst at once. Prints figures, asserts nothing.

The process is `initshift serve --watch` with the command, environment and memory limit of
deploy/base/deployment.yaml (read from the file; only what a bench on one machine must
change is changed: loopback and free ports, the certificate files' paths, a kubeconfig for
the service account), in a memory cgroup of that limit (no swap), against a real etcd +
kube-apiserver (`tests/support/k8s`, v1.34, as `make bench-watcher` uses). Its output goes
through a pipe to a file outside the cgroup, as a container's goes to the runtime.

Once it idles, everything at once until the watcher has written every pod's outcome (the
attacks start 60 s before the burst, `--lead`, so that it comes on top of what they hold):
- the worst attacks of `make bench-hostile`, each kept up (reopened as the server closes
  them): 4 clients posting the largest review the body limit admits back to back; the
  connection cap's worth of connections each holding a large review's unread body; a client
  that never reads its answers (100 reviews, 8 of 1 MB, 4 x 100 pipelined);
- the burst of `make bench-watcher`: 1,000 build pods created Pending, every one made
  Ready at once, then every one completed at once (the bench plays the kubelet), while the
  apiserver's review of each creation is sent to /mutate on 4 connections;
- the legitimate client of `make bench-hostile` (a review every 20 ms on one kept-alive
  connection) and the kubelet's probes at the Deployment's periods and timeouts.

Then: the cgroup's peak (v1 memory.max_usage_in_bytes, v2 memory.peak) and the process's
VmHWM, the peak of each phase (sampled), OOM kills (memory.oom_control / memory.events),
the legitimate reviews' latency (p99), the probes' failures, and what the watcher did with
the pods (done, missed, written twice, latencies, its writes per pod).

Then, unless `--no-restart`, a replica restarting with the burst in flight: once
more than `--restart-at` of the pods have their outcome written (default: the first; the
old process writes on through its preStop hook and SIGTERM), the bench stops the
process as the kubelet does (the Deployment's preStop hook: SIGUSR1 and its sleep; SIGTERM;
SIGKILL at the end of terminationGracePeriodSeconds) and starts a new one in the same cgroup,
on the same ports, its peak reset (v1; v2's memory.peak cannot be reset: VmHWM and the
sampled usage then). Printed: the old process's exit code and time from SIGTERM to exit, the
new one's peak through its start-up relist and catching up, the time until every pod's
outcome is written, and whether each pod got exactly one (the driver's watch: none missed,
none changed once set; the apiserver's counts: one pod PATCH and one Event per pod, split
between the two processes).
`--limit 8Gi` measures the peak without the Deployment's limit; `--no-attacks` and
`--no-burst` leave one side out (each term alone, measured the same way).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import aiohttp
import httpx
import yaml

from certs import store
from tests.bench import hostile_bench, watcher_bench as wb
from tests.bench._machine import Steal, describe
from tests.support import hostile
from tests.support import https_helpers as h
from tests.support.k8s import free_port
from webhook.rewrite import parse_quantity
from webhook.settings import ServerSettings

MiB = 1024 * 1024
REPO = Path(__file__).resolve().parents[2]
DEPLOYMENT = REPO / "deploy" / "base" / "deployment.yaml"
WINDOW = 30.0  # seconds: the memory's timeline is printed as each window's maximum
SETTLE = 120.0  # seconds the watcher gets, after the last change, for every outcome and deadline
GRACE_DEFAULT = 30.0  # terminationGracePeriodSeconds when the pod spec leaves it out


# --- the Deployment, as written ----------------------------------------------------------
@dataclass
class Probe:
    kind: str
    path: str
    period: float
    timeout: float
    threshold: int


@dataclass
class Deployed:
    namespace: str
    command: list[str]
    env: dict[str, str]
    limit: str
    probes: list[Probe]
    grace: float  # terminationGracePeriodSeconds: preStop and SIGTERM within it, then SIGKILL
    prestop_sleep: float | None  # the preStop hook (SIGUSR1, then this sleep), if there is one


def deployed(path: Path = DEPLOYMENT) -> Deployed:
    doc = yaml.safe_load(path.read_text())
    namespace = doc["metadata"]["namespace"]
    spec = doc["spec"]["template"]["spec"]
    c = next(c for c in spec["containers"] if c["name"] == "initshift")
    env = {}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = str(e["value"])
        elif (e.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
            env[e["name"]] = namespace
        else:
            raise SystemExit(f"{path}: env {e['name']}: a value this bench cannot give")
    probes = [Probe(kind, p["httpGet"]["path"], p.get("periodSeconds", 10), p.get("timeoutSeconds", 1),
                    p.get("failureThreshold", 3))
              for kind in ("livenessProbe", "readinessProbe") if (p := c.get(kind))]
    prestop = " ".join((((c.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}).get("command", []))
    sleep = re.search(r"SIGUSR1.*time\.sleep\(([0-9.]+)\)", prestop)
    if prestop and not sleep:
        raise SystemExit(f"{path}: a preStop hook this bench cannot play: {prestop}")
    return Deployed(namespace, list(c["command"]), env, c["resources"]["limits"]["memory"], probes,
                    float(spec.get("terminationGracePeriodSeconds", GRACE_DEFAULT)),
                    float(sleep.group(1)) if sleep else None)


class Server:
    """The Deployment's container as a process in `cgroup`, its output piped to `log`."""

    def __init__(self, dep: Deployed, certs: Path, kubeconfig: str, cgroup: hostile.MemoryCgroup | None,
                 log: Path, ports: tuple[int, int] | None = None) -> None:
        # `ports`: a restarted container's (the same pod, so the same address and ports).
        self.port, self.metrics_port = ports or (free_port(), free_port())
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("INITSHIFT_") and k not in ("KUBECONFIG", "SUPPORT_INJECTED_SIDECARS")}
        env.update(dep.env)
        self.changed = {"INITSHIFT_HOST": "127.0.0.1", "INITSHIFT_PORT": str(self.port),
                        "INITSHIFT_METRICS_PORT": str(self.metrics_port),
                        "INITSHIFT_TLS_CERT": str(certs / store.TLS_CERT),
                        "INITSHIFT_TLS_KEY": str(certs / store.TLS_KEY)}
        env.update(self.changed)
        assert dep.command[0] == "initshift", dep.command
        self.argv = [sys.executable, "-m", "webhook.cli", *dep.command[1:], "--kubeconfig", kubeconfig]
        self.ca, self.log, self.cgroup = certs / store.CA_CERT, log, cgroup
        self.url = f"https://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(self.argv, env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, preexec_fn=cgroup.enter if cgroup else None)
        self.started = time.monotonic()
        self._copier = threading.Thread(target=self._copy, daemon=True)
        self._copier.start()

    def _copy(self) -> None:
        assert self.proc.stdout is not None
        with self.log.open("wb") as out:
            for line in self.proc.stdout:
                out.write(line)
                out.flush()

    def wait_ready(self, seconds: float = 120) -> None:
        ctx = h.client_context(self.ca)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the server exited ({self.proc.returncode}); its log: {self.log}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/readyz", verify=ctx, timeout=5).status_code == 200:
                    return
            time.sleep(0.2)
        raise SystemExit(f"the server was not ready in {seconds:.0f} s; its log: {self.log}")

    def stop_as_kubelet(self, dep: Deployed) -> "Stopped":
        """The kubelet's stop: the preStop hook, SIGTERM, SIGKILL when the grace period is over."""
        if dep.prestop_sleep is not None:
            self.proc.send_signal(signal.SIGUSR1)
            time.sleep(dep.prestop_sleep)
        sigterm = time.monotonic()
        self.proc.terminate()
        deadline, killed = sigterm + dep.grace - (dep.prestop_sleep or 0), False
        while True:
            # wait4, not Popen.wait: the rusage is the whole life's CPU and peak RSS, which
            # /proc no longer has once the process is reaped.
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                break
            if not killed and time.monotonic() > deadline:
                self.proc.kill()
                killed = True
            time.sleep(0.02)
        took = time.monotonic() - sigterm
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        self._copier.join(10)
        return Stopped(sigterm, took, killed, self.proc.returncode, usage.ru_utime + usage.ru_stime,
                       usage.ru_maxrss * 1024)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._copier.join(10)


@dataclass
class Stopped:
    sigterm: float  # when SIGTERM was sent (monotonic)
    took: float  # seconds from SIGTERM to the exit
    killed: bool  # SIGKILLed at the end of the grace period
    code: int
    cpu: float  # seconds over its life
    hwm: int  # peak RSS over its life (bytes)


# --- what runs beside the burst ------------------------------------------------------------
class Sampler:
    """The cgroup's usage and the process's RSS every `every` seconds, by phase."""

    def __init__(self, b: hostile_bench.Bench, every: float = 0.25) -> None:
        self.b, self.every, self.phase = b, every, "idle"
        self.peaks: dict[str, list[int]] = {}
        self.windows: list[int] = []  # the usage's maximum in each WINDOW seconds from the start
        self.start = time.monotonic()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                now = [self.b.memory(), hostile.memory_kb(self.b.pid) * 1024]
            except OSError:  # the process is gone (between a restart's two, or killed): its RSS is none
                try:
                    now = [self.b.memory(), 0]
                except OSError:
                    return
            peak = self.peaks.setdefault(self.phase, [0, 0])
            peak[:] = [max(a, b) for a, b in zip(peak, now)]
            window = int((time.monotonic() - self.start) // WINDOW)
            self.windows += [0] * (window + 1 - len(self.windows))
            self.windows[window] = max(self.windows[window], now[0])
            self.stop.wait(self.every)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


def keep_up(stop: threading.Event, attack: Callable[[], list[socket.socket]], opened: list[int],
            hold: float = 60.0) -> None:
    """`attack` again each time the server has closed the connections it opened (or after
    `hold` seconds), until `stop`."""
    while not stop.is_set():
        try:
            socks = attack()
        except (OSError, ValueError):
            socks = []
        opened.append(len(socks))
        deadline = time.monotonic() + hold
        while not stop.is_set() and time.monotonic() < deadline and hostile.wait_closed(socks, 0.5):
            pass
        hostile.close_all(socks)
        if not socks:
            stop.wait(0.5)


@dataclass
class ProbeResult:
    probe: Probe
    statuses: list[int] = field(default_factory=list)  # 0: no answer within the timeout
    worst_run: int = 0  # failures in a row at most


def probing(stop: threading.Event, url: str, ctx: Any, result: ProbeResult, paused: threading.Event) -> None:
    """The kubelet's HTTPS probe: a new connection each period, the probe's timeout; none
    while `paused` (a container stopping and its successor starting: the kubelet does not
    count those against the Deployment's probes)."""
    run = 0
    while not stop.wait(result.probe.period):
        if paused.is_set():
            continue
        try:
            status = httpx.get(url + result.probe.path, verify=ctx, timeout=result.probe.timeout).status_code
        except httpx.HTTPError:
            status = 0
        result.statuses.append(status)
        run = 0 if 200 <= status < 400 else run + 1
        result.worst_run = max(result.worst_run, run)


@contextlib.contextmanager
def attacks(b: hostile_bench.Bench, large: bytes, small: bytes, enabled: bool) -> Iterator[dict[str, Any]]:
    """The worst attacks of `make bench-hostile`, kept up while the block runs; yields what
    they saw so far."""
    seen: dict[str, Any] = {"bodies": [], "answers": []}
    if not enabled:
        yield seen
        return
    stop = threading.Event()
    unread = hostile_bench.cases(b, large, small)[5][1]
    cap = ServerSettings().max_connections
    threads = [threading.Thread(target=keep_up, args=(stop, lambda: hostile.unread_bodies(b.port, b.ctx, large, cap),
                                                      seen["bodies"]), daemon=True),
               threading.Thread(target=keep_up, args=(stop, lambda: unread()[1], seen["answers"]), daemon=True)]
    with hostile.posting(b.url, str(b.ca), large, 4) as flood:
        seen["flood"] = flood
        for t in threads:
            t.start()
        try:
            yield seen
        finally:
            stop.set()
            for t in threads:
                t.join(120)
            seen["flood_statuses"] = list(flood())


async def reviews(url: str, ctx: Any, body: bytes, count: int, connections: int = 4) -> list[tuple[int, float]]:
    """The apiserver's review of each pod created: `count` reviews over `connections`
    kept-alive connections."""
    out: list[tuple[int, float]] = []
    left = iter(range(count))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections, ssl=ctx)) as session:
        async def one_connection() -> None:
            for _ in left:
                start = time.perf_counter()
                try:
                    async with session.post(f"{url}/mutate", data=body, headers=hostile.JSON_CT,
                                            timeout=aiohttp.ClientTimeout(total=30)) as resp:
                        await resp.read()
                        status = resp.status
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    status = 0
                out.append((status, time.perf_counter() - start))
        await asyncio.gather(*(one_connection() for _ in range(connections)))
    return out


# --- a replica restarting with the burst in flight -------------------------------------------
def written(pd: wb.Pod) -> float | None:
    """When the driver saw every write the pod is owed (its outcome, and the deadline of one
    whose proxy keeps running), else None."""
    if pd.outcome_seen is None or (not pd.quits and pd.deadline_seen is None):
        return None
    return max(pd.outcome_seen, pd.deadline_seen or 0.0)


@dataclass
class Restart:
    old: Stopped
    new: Server
    old_peak: int  # the cgroup's peak before the reset: the first process's
    left: int  # the cgroup's usage as the new process started (what the old one left: page cache)
    kills_before: int
    writes_at_exit: dict[str, int]
    codes_at_exit: dict[str, int]  # the pod PATCHes by answer, as the old process exited
    legit_cut: tuple[int, int]  # legitimate samples before the stop began, and before the new one was ready
    ready: float = 0.0  # seconds from the new process's start to /readyz 200
    watching: float = 0.0  # ... to its pods watch open
    peak: int = 0  # the cgroup's peak from the new start until every outcome was written (v1)
    hwm: int = 0  # the new process's VmHWM then
    events: collections.Counter[str] = field(default_factory=collections.Counter)  # the watcher's, by pod
    patch_codes: dict[str, int] = field(default_factory=dict)  # the pod PATCHes by answer


async def patch_codes(backend: wb.RealBackend) -> dict[str, int]:
    """The watcher's pod PATCHes by the apiserver's answer (the driver writes pods/status
    only): a PATCH past one per pod is a second outcome only if it was not refused (409:
    its resourceVersion was no longer the pod's)."""
    codes: collections.Counter[str] = collections.Counter()
    for lb, n in await backend.requests():
        if lb.get("resource") == "pods" and lb.get("verb") == "PATCH" and not lb.get("subresource"):
            codes[lb.get("code", "?")] += n
    return dict(sorted(codes.items()))


async def events_by_pod(api: wb.Client) -> collections.Counter[str]:
    """The watcher's Events in the pods' namespace by pod: an Event POST counted twice above
    may be a 409 (its fixed name taken), which makes no second Event; this says which."""
    listed = await api.request("GET", f"/api/v1/namespaces/{wb.NS}/events")
    return collections.Counter(e["involvedObject"]["name"] for e in listed["items"]
                               if (e.get("source") or {}).get("component", "").startswith("initshift"))


async def restarting(at: float, dep: Deployed, servers: list[Server], b: hostile_bench.Bench,
                     cgroup: hostile.MemoryCgroup | None, backend: wb.RealBackend, pods: list[wb.Pod],
                     sampler: Sampler, legit: hostile.Legit, paused: threading.Event, certs: Path,
                     log: Path) -> Restart:
    """Once more than `at` of the pods have their outcome written, the replica stopped as the
    kubelet stops it and a new one started in its place; returns once that one watches the
    pods."""
    await wb.wait_for(lambda: sum(pd.outcome_seen is not None for pd in pods) > at * len(pods), SETTLE)
    old = servers[-1]
    cut = len(legit.samples)
    paused.set()
    sampler.phase = "restart: preStop, SIGTERM, exit"
    stopped = await asyncio.to_thread(old.stop_as_kubelet, dep)
    writes, codes = await backend.writes(), await patch_codes(backend)
    old_peak = cgroup.peak_bytes() if cgroup is not None else stopped.hwm
    if cgroup is not None:
        cgroup.reset_peak()
    kills = cgroup.oom_kills() if cgroup is not None else 0
    sampler.phase = "restarted: start-up and relist"
    new = Server(dep, certs, backend.kubeconfig, cgroup, log, (old.port, old.metrics_port))
    servers.append(new)
    r = Restart(stopped, new, old_peak, b.memory() if cgroup is not None else 0, kills, writes, codes, (cut, 0))
    b.pid = new.proc.pid
    await asyncio.to_thread(new.wait_ready)
    r.ready, r.legit_cut = time.monotonic() - new.started, (cut, len(legit.samples))
    paused.clear()
    if not await wb.wait_for(lambda: backend.watching(at_least=2), 120):
        raise SystemExit(f"the restarted watcher did not start watching; its log: {new.log}")
    r.watching = time.monotonic() - new.started
    sampler.phase = "restarted: catching up"
    return r


def report_restart(r: Restart, dep: Deployed, pods: list[wb.Pod], cgroup: hostile.MemoryCgroup | None,
                   limit: int, writes: dict[str, int], legit: hostile.Legit) -> None:
    s, t0 = r.old, r.new.started
    done_at_stop = sum(1 for pd in pods if len(pd.changed_at) == 4 and pd.changed_at[-1] <= s.sigterm)
    out_at_stop = sum(1 for pd in pods if pd.outcome_seen is not None and pd.outcome_seen <= s.sigterm)
    at_exit = sum(1 for pd in pods if (w := written(pd)) is not None and w <= t0)
    last = [written(pd) for pd in pods]
    prestop = f"preStop (SIGUSR1, {dep.prestop_sleep:g} s), " if dep.prestop_sleep is not None else ""
    print(f"\nrestart with the burst in flight ({prestop}SIGTERM, SIGKILL at {dep.grace:g} s): at SIGTERM "
          f"{done_at_stop:,} of {len(pods):,} pods done, {out_at_stop:,} outcomes written; the old process exited "
          f"{s.code} {s.took:.1f} s after SIGTERM" + (" (SIGKILLed at the grace period's end)" if s.killed else "")
          + f", {s.cpu:.0f} s CPU, peak {r.old_peak / MiB:.0f} MiB ({'the cgroup' if cgroup else 'VmHWM'}; "
          f"its RSS {s.hwm / MiB:.0f} MiB); {at_exit:,} pods had every write by then")
    peak = (f"peak {r.peak / MiB:.0f} MiB (the cgroup's, reset at its start; limit {limit / MiB:.0f} MiB: "
            f"{(limit - r.peak) / MiB:.0f} MiB left), " if cgroup is not None and not cgroup.v2 else "")
    kills = cgroup.oom_kills() - r.kills_before if cgroup is not None else 0
    print(f"restarted process, from its start: ready in {r.ready:.1f} s, its pods watch open in {r.watching:.1f} s; "
          f"through its start-up relist and catching up: {peak}VmHWM {r.hwm / MiB:.0f} MiB; the cgroup held "
          f"{r.left / MiB:.0f} MiB as it started (what the old one left: page cache); OOM kills: {kills}")
    if at_exit == len(pods):
        print("    every pod's outcome was written before the new process started: it had nothing to catch up "
              "(a lower --restart-at stops the old one earlier)")
    elif all(w is not None for w in last):
        end = max(w for w in last if w is not None)
        print(f"    every pod's outcome written {end - t0:.1f} s after the new process started "
              f"({end - s.sigterm:.1f} s after SIGTERM; {len(pods) - at_exit:,} pods' writes seen after it started)")
    else:
        print(f"    {sum(w is None for w in last):,} pods without every write {SETTLE:.0f} s after the last change")
    n = len(pods)
    missed = sum(1 for pd in pods if pd.stage == 4 and written(pd) is None)
    twice = sum(1 for pd in pods if pd.outcome_changes > 1)
    (old_p, old_e), (all_p, all_e) = ((w.get("pod_patches", 0), w.get("event_writes", 0))
                                      for w in (r.writes_at_exit, writes))
    print(f"    exactly one outcome per pod: missed {missed}, changed once set {twice}; pod PATCHes {old_p:,} by the "
          f"old process + {all_p - old_p:,} by the new = {all_p:,} for {n:,} pods (by answer: {r.codes_at_exit} as the "
          f"old one exited, {r.patch_codes} in all; a 504 is also the apiserver's answer to a request its client gave "
          f"up, written or not), Event writes {old_e:,} + {all_e - old_e:,} = {all_e:,} (one of each per pod when "
          f"none is doubled), pod GETs {writes.get('pod_gets', 0):,}; the watcher's Events there: "
          f"{sum(r.events.values()):,} on {len(r.events):,} pods, {sum(1 for v in r.events.values() if v > 1)} pods "
          f"with more than one")
    cut, ready = r.legit_cut
    print(f"    legitimate /mutate from the stop until the new process was ready: "
          f"{hostile_bench.summary(legit.samples[cut:ready])}; after: {hostile_bench.summary(legit.samples[ready:])}")


# --- the run -----------------------------------------------------------------------------
async def run(args: argparse.Namespace, workdir: Path) -> None:
    dep = deployed()
    limit_text = args.limit or dep.limit
    limit = parse_quantity(limit_text, "memory")
    certs = workdir / "certs"
    certs.mkdir()
    h.make_certs(certs)
    small = hostile.small_body()
    large = hostile.largest_body(ServerSettings().max_body_bytes)
    backend = wb.RealBackend("1.34")
    scenario = wb.Scenario(f"{args.pods:,} pods, burst, probe-gated", args.pods, 0, 0.0)
    api = await backend.start(scenario)
    cgroup = hostile.MemoryCgroup.create(limit, f"initshift-deployment-bench-{os.getpid()}")
    servers: list[Server] = []  # the first, and the restarted one
    try:
        print(f"Kubernetes: {backend.label}")
        print(f"the Deployment ({DEPLOYMENT.relative_to(REPO)}): `{' '.join(dep.command)}`, "
              + " ".join(f"{k}={v}" for k, v in dep.env.items()))
        print(f"memory cgroup: " + (f"{'v2' if cgroup.v2 else 'v1'}, limit {limit_text} ({limit / MiB:.0f} MiB, "
                                    f"no swap)" if cgroup else "none writable here: VmHWM only"), flush=True)
        server = Server(dep, certs, backend.kubeconfig, cgroup, workdir / "server.log")
        servers.append(server)
        print(f"changed for one machine: {' '.join(f'{k}={v}' for k, v in server.changed.items())}, "
              f"--kubeconfig (the admin's, for the service account's)", flush=True)
        await asyncio.to_thread(server.wait_ready)
        if not await wb.wait_for(lambda: backend.watching(at_least=1), 120):
            raise SystemExit(f"the watcher did not start watching; its log: {server.log}")
        await asyncio.sleep(5)
        b = hostile_bench.Bench(server.port, server.metrics_port, server.ca, server.proc.pid, cgroup)
        idle_rss = hostile.memory_kb(server.proc.pid) * 1024
        print(f"idle: {b.idle / MiB:.0f} MiB ({'the cgroup' if cgroup else 'RSS'}), VmRSS {idle_rss / MiB:.0f} MiB; "
              f"reviews: normal {len(small) / 1024:.0f} KiB, largest {len(large) / 1e6:.2f} MB", flush=True)
        if cgroup is not None:
            cgroup.reset_peak()
        cpu0 = hostile.cpu_seconds(server.proc.pid)
        sampler = Sampler(b)
        legit = hostile.Legit(server.url, str(server.ca))
        stop_probes, paused = threading.Event(), threading.Event()
        probes = [ProbeResult(p) for p in dep.probes]
        probers = [threading.Thread(target=probing, args=(stop_probes, server.url, b.ctx, r, paused), daemon=True)
                   for r in probes]
        for t in probers:
            t.start()
        pods = [wb.Pod(f"build-{i:05d}", quits=i % 2 == 0, gated=False) for i in range(args.pods)]
        result = wb.Result(scenario)
        creations: list[tuple[int, float]] = []
        restart: Restart | None = None
        started = time.monotonic()
        with legit.running(), attacks(b, large, small, not args.no_attacks) as seen:
            sampler.phase = "attacks alone" if not args.no_attacks else "idle"
            await asyncio.sleep(args.lead if not args.no_attacks else 0)
            if not args.no_burst:
                sampler.phase = "pods created"
                reviewing = asyncio.ensure_future(reviews(server.url, b.ctx, small, args.pods))
                driver, watch = await wb.create_pods(api, pods)
                sampler.phase = "burst: ready, then done"
                # Beside the burst: the stop may come while the driver still completes pods.
                restarted = None if args.no_restart else asyncio.ensure_future(restarting(
                    args.restart_at, dep, servers, b, cgroup, backend, pods, sampler, legit, paused, certs,
                    workdir / "server-restarted.log"))
                burst_start = time.monotonic()
                result.changes = await driver.burst()
                result.seconds = time.monotonic() - burst_start
                if restarted is not None:
                    restart = await restarted
                    server = restart.new
                else:
                    sampler.phase = "settling"
                await wb.wait_for(lambda: all(written(pd) is not None for pd in pods if pd.stage == 4), SETTLE)
                if restart is not None:  # its figures through the catching up, before what follows adds to them
                    restart.peak = cgroup.peak_bytes() if cgroup is not None else 0
                    restart.hwm = hostile.memory_kb(server.proc.pid, "VmHWM") * 1024
                    sampler.phase = "settling"
                creations = await reviewing
                result.writes = await wb.quiet(backend, time.monotonic() + SETTLE)  # the driver still watching: a late rewrite counts
                if restart is not None:
                    restart.events, restart.patch_codes = await events_by_pod(api), await patch_codes(backend)
                watch.cancel()
                await asyncio.gather(watch, return_exceptions=True)
                wb.measure(pods, result)
            else:
                await asyncio.sleep(args.attack_seconds)
            sampler.phase = "attacks stopping"
        took = time.monotonic() - started
        stop_probes.set()
        for t in probers:
            t.join(30)
        sampler.close()
        alive = server.proc.poll() is None
        cpu = hostile.cpu_seconds(server.proc.pid) - cpu0 if alive else float("nan")
        hwm = hostile.memory_kb(server.proc.pid, "VmHWM") * 1024 if alive else 0
        peak = cgroup.peak_bytes() if cgroup is not None else hwm
        if restart is not None:  # the run's figures are both processes'
            cpu = hostile.cpu_seconds(server.proc.pid) + restart.old.cpu - cpu0 if alive else float("nan")
            hwm, peak = max(hwm, restart.old.hwm), max(peak, restart.old_peak)
        report(b, cgroup, limit, peak, hwm, alive, servers, took, cpu, sampler,
               legit.samples[:restart.legit_cut[0]] if restart else legit.samples, creations, seen, probes,
               result if not args.no_burst else None)
        if restart is not None:
            report_restart(restart, dep, pods, cgroup, limit, result.writes, legit)
    finally:
        for s in servers:
            s.stop()
        if cgroup is not None:
            cgroup.remove()
        await api.close()
        await backend.stop()


def report(b: hostile_bench.Bench, cgroup: hostile.MemoryCgroup | None, limit: int, peak: int, hwm: int,
           alive: bool, servers: list[Server], took: float, cpu: float, sampler: Sampler,
           legit: list[tuple[int, float]], creations: list[tuple[int, float]], seen: dict[str, Any],
           probes: list[ProbeResult], result: wb.Result | None) -> None:
    kills = cgroup.oom_kills() if cgroup is not None else 0
    server = servers[-1]
    print(f"\nran {took:.0f} s; server {'alive' if alive else f'exited ({server.proc.returncode})'}"
          + (" (restarted once: the figures are both processes')" if len(servers) > 1 else "") + f", {cpu:.0f} s CPU")
    print(f"memory: peak {peak / MiB:.0f} MiB ({'the cgroup' if cgroup else 'VmHWM'}"
          + (f", limit {limit / MiB:.0f} MiB: {(limit - peak) / MiB:.0f} MiB left" if cgroup else "")
          + f"), VmHWM {hwm / MiB:.0f} MiB, idle {b.idle / MiB:.0f} MiB; OOM kills: {kills}")
    for phase, (usage, rss) in sampler.peaks.items():
        print(f"    {phase}: at most {usage / MiB:.0f} MiB ({'the cgroup' if cgroup else 'RSS'}), VmRSS {rss / MiB:.0f}"
              f" MiB (sampled every {sampler.every} s)")
    print(f"    the {'cgroup' if cgroup else 'RSS'}'s maximum in each {WINDOW:g} s from the start: "
          + ", ".join(f"{x / MiB:.0f}" for x in sampler.windows) + " MiB")
    print(f"legitimate /mutate (one kept-alive connection, every 20 ms)"
          + (", until the restart" if len(servers) > 1 else "") + f": {hostile_bench.summary(legit)}")
    if creations:
        print(f"the apiserver's reviews of the {len(creations):,} pods created (4 connections): "
              f"{hostile_bench.summary(creations)}")
    for r in probes:
        failed = sum(1 for s in r.statuses if not 200 <= s < 400)
        print(f"kubelet {r.probe.kind} {r.probe.path} every {r.probe.period:g} s, timeout {r.probe.timeout:g} s: "
              f"{len(r.statuses)} probes, {failed} failed, at most {r.worst_run} in a row (the kubelet acts at "
              f"{r.probe.threshold}) {dict(collections.Counter(r.statuses))}")
    if "flood_statuses" in seen:
        print(f"attacks: 4 clients posting {len(hostile.largest_body(ServerSettings().max_body_bytes)) / 1e6:.1f} MB "
              f"reviews: {dict(collections.Counter(seen['flood_statuses']))}; unread bodies: {len(seen['bodies'])} "
              f"rounds, {max(seen['bodies'], default=0)} connections at most; unread answers: "
              f"{len(seen['answers'])} rounds")
    if result is not None:
        n = max(1, result.done)
        print(f"watcher: {result.done:,} pods done ({result.changes:,} status changes in {result.seconds:.0f} s), "
              f"missed {result.missed}, written twice {result.twice}; outcome p50/p99 {wb._p(result.outcome)} s, "
              f"deadline p50/p99 {wb._p(result.deadline)} s after the pod's last change; "
              f"{result.writes.get('pod_patches', 0) / n:.2f} pod PATCHes and "
              f"{result.writes.get('event_writes', 0) / n:.2f} Event writes per pod")
    errors = [line for s in servers for line in s.log.read_text(errors="replace").splitlines()
              if '"level": "error"' in line or '"level":"error"' in line]
    print(f"server log: {len(errors)} error lines" + "".join(f"\n    {line[:300]}" for line in errors[:5]))


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.bench.deployment_bench", description=__doc__.split("\n")[0])
    ap.add_argument("--pods", type=int, default=1000, help="build pods in the burst (default 1,000)")
    ap.add_argument("--limit", help="the cgroup's memory limit, a Kubernetes quantity (default: the Deployment's)")
    ap.add_argument("--lead", type=float, default=60.0,
                    help="seconds the attacks run alone before the first pod is created (default 60)")
    ap.add_argument("--no-attacks", action="store_true", help="the burst alone")
    ap.add_argument("--no-burst", action="store_true", help="the attacks alone (for --attack-seconds)")
    ap.add_argument("--attack-seconds", type=float, default=60.0, help="with --no-burst: how long (default 60)")
    ap.add_argument("--restart-at", type=float, default=0.0, metavar="SHARE",
                    help="restart the replica once more than this share of the burst's outcomes is written "
                         "(default 0: at the first; the old process writes on through its preStop and SIGTERM)")
    ap.add_argument("--no-restart", action="store_true", help="no restart during the burst")
    args = ap.parse_args()
    print(describe(), flush=True)
    steal = Steal()
    workdir = Path(tempfile.mkdtemp(prefix="initshift-deployment-bench-"))
    try:
        asyncio.run(run(args, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(steal)
    return 0


if __name__ == "__main__":
    sys.exit(main())
