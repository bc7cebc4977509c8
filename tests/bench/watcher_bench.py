"""`make bench-watcher`: the watcher driving build pods through a real kube-apiserver.

The API: etcd + kube-apiserver from ../shared/k8s (`tests/support/k8s`, v1.34) when the
binaries are there, else the in-process API double (`tests/support/kubedouble.py`, every
write waiting 20-30 ms before it commits, as a loaded apiserver would). The bench plays the
kubelet: the pods are created bound to a node that does not exist (`spec.nodeName`), and
their status is written through `pods/status` as the kubelet writes it (a merge patch of the
whole status). The watcher is `initshift watch` in its own process (leader election on,
JSON logs at info to a file), so its CPU is its own. `--watcher-tree DIR` runs the watcher
of another checkout (e.g. `git worktree add --detach /tmp/base main`) beside this tree's
against the same driver, and `--repeat N` runs every row N times, the rounds interleaved
(each round's order rotated by one), then prints each watcher's share per pod over the
rounds (median and spread): a before/after judged in one run on one machine. `--price`
prices each kind of the watcher's requests instead (`tests/bench/watcher_price.py`).

The pods are what the webhook writes for a Job pod with two init steps under Istio (the real
rewrite of `tests/support/fixtures`, waiter strategy): steps `git-clone` and `deps`, main
`build`, the proxy. Two kinds: *probe-gated* (the proxy as Istio injects it, with its
loopback readiness probe, which step 0's waiter checks itself) and *annotation-gated* (a
proxy without a readiness probe: step 0 reads the watcher's `initshift.io/ready`
annotation, so the driver starts the steps only once it is written).

Each scenario starts a fresh API and watcher with N pods in flight (Pending). The driver
takes each through four status changes (proxy Ready and the containers running; step 1
done; step 2 done; the main done, the proxy quitting with it for half the pods and kept
running for the other half, which the watcher ends with `activeDeadlineSeconds`) at a fixed
rate over a window of 64 pods at a time until every pod is done; a burst makes every pod
Ready at once, then finishes all their steps at once. `INITSHIFT_GRACE_SECONDS=0`: the
outcome (and the deadline) is due at the last change. A row without a watcher measures what
the kubelet's writes alone cost the apiserver; on the double, a row where every write takes
about a second shows what goes first when the apiserver is slow.

Figures: latencies from the answer to the driver's status write to the driver's watch
seeing the watcher's write (ready annotation, outcome annotation, activeDeadlineSeconds);
the watcher's writes per pod (pod PATCHes and Event writes, counted by the apiserver's
`apiserver_request_total`, or the double's request log); missed (a pod done without an
outcome, or a gated pod never opened) and written twice (an outcome that changed once
set); the status writes' own latency (the floor under the others); the API server's CPU per
pod (kube-apiserver and etcd, less what they spend idle with the watcher connected; less
the row without a watcher: the watcher's share) and the watcher's. Prints, asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import ssl
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from tests.bench._machine import Steal, describe
from tests.support.fixtures.pods import catalogue
from tests.support.kubedouble import SYSTEM_NAMESPACES, KubeDouble, running, terminated, waiting
from tests.support.podstatus import write_kubeconfig as double_kubeconfig
from waiter import protocol as p
import aiohttp

NS = "builds"
NODE = "bench-node"  # no such Node: nothing but the driver writes the pods' status
WINDOW = 64  # pods driven at once in the rate phases
DOUBLE_WRITE_LATENCY = (0.020, 0.030)
SLOW_WRITE_LATENCY = (0.8, 1.2)  # "a busy apiserver": the slow scenario on the double
SETTLE = 60.0  # seconds the watcher gets to write what is due after the last change
QUIET = 3.0  # the watcher's writes have stopped (its Events drained) after this long without one
IDLE_SECONDS = 5.0  # how long the servers' idle CPU is measured before a run
REPO = Path(__file__).resolve().parents[2]
STEPS, MAIN, PROXY = ("git-clone", "deps"), "build", "istio-proxy"


@dataclass(frozen=True)
class Scenario:
    label: str
    pods: int
    rate: float  # status changes per second; 0: a burst
    gated: float  # share of the pods that read the ready annotation (a proxy without a loopback probe)
    slow: bool = False  # the double only: every write takes ~1 s
    watcher: bool = True  # False: the kubelet's writes alone (what the API spends without a watcher)


SCENARIOS = [
    Scenario("1,000 pods, 40/s, no watcher (baseline)", 1000, 40, 0.0, watcher=False),
    Scenario("1,000 pods, 40/s, probe-gated", 1000, 40, 0.0),
    Scenario("1,000 pods, 40/s, annotation-gated", 1000, 40, 1.0),
    Scenario("1,000 pods, 200/s, probe-gated", 1000, 200, 0.0),
    Scenario("1,000 pods, burst, probe-gated", 1000, 0, 0.0),
]
SLOW = Scenario("300 pods, 40/s, half gated, writes ~1 s", 300, 40, 0.5, slow=True)


# --- the driver's client ---------------------------------------------------------------------
class ApiError(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"{status}: {text[:300]}")
        self.status = status


class Client:
    """The driver's own client: plain aiohttp (with the admin's certificate on a real
    apiserver), so that playing the kubelet costs the bench as little CPU as it can."""

    def __init__(self, base: str, ssl_context: ssl.SSLContext | None = None) -> None:
        self.base = base.rstrip("/")
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64, ssl=ssl_context or False),
                                             headers={"User-Agent": "bench-watcher-driver"})

    async def request(self, method: str, path: str, body: Any = None, *, query: dict | None = None,
                      content_type: str = "application/json", accept: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body)
        async with self.session.request(method, self.base + path, data=data, params=query,
                                        headers={"Content-Type": content_type, "Accept": accept}) as resp:
            text = await resp.text()
            if not 200 <= resp.status < 300:
                raise ApiError(resp.status, text)
            return json.loads(text) if text else None

    async def watch(self, path: str, resource_version: str) -> Any:
        params = {"watch": "true", "resourceVersion": resource_version, "timeoutSeconds": "3600"}
        async with self.session.get(self.base + path, params=params,
                                    timeout=aiohttp.ClientTimeout(total=None, sock_read=None)) as resp:
            if resp.status != 200:
                raise ApiError(resp.status, await resp.text())
            async for line in resp.content:
                if line.strip():
                    event = json.loads(line)
                    yield event["type"], event["object"]

    async def close(self) -> None:
        await self.session.close()


# --- the pods --------------------------------------------------------------------------------
def templates() -> dict[str, dict]:
    """The rewritten pod of each kind (probe-gated, annotation-gated), bound to NODE."""
    from webhook.rewrite import rewrite
    from webhook.settings import Settings

    base = catalogue()["job-istio"]
    base = copy.deepcopy(base)
    clone = next(c for c in base["spec"]["initContainers"] if c["name"] == "git-clone")
    base["spec"]["initContainers"].append({**copy.deepcopy(clone), "name": "deps", "command": ["sh", "-c"],
                                           "args": ["npm ci --prefix /src"]})
    unprobed = copy.deepcopy(base)
    for c in unprobed["spec"]["containers"]:
        if c["name"] == PROXY:
            c.pop("readinessProbe", None)
    out = {}
    for kind, pod in (("probe", base), ("annotation", unprobed)):
        new = rewrite(pod, Settings(feature_gate=True), native_supported=False).pod
        assert new["metadata"]["labels"][p.LABEL_MANAGED] == p.MODE_WAITER
        new["metadata"].pop("generateName", None)
        new["metadata"]["namespace"] = NS
        new["spec"]["nodeName"] = NODE
        out[kind] = new
    return out


def pod_object(template: dict, name: str) -> dict:
    pod = copy.deepcopy(template)
    pod["metadata"]["name"] = name
    return pod


def _record(name: str) -> str:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return json.dumps({"name": name, "exitCode": 0, "reason": p.REASON_COMPLETED, "startedAt": now,
                       "finishedAt": now, "message": ""})


def _done(name: str) -> dict:
    return terminated(name, 0, message=_record(name), image="tool")


INITS = (p.INIT_CONTAINER_NAME, "istio-init")


@dataclass
class Pod:
    name: str
    quits: bool  # the proxy quits with the last main (else the watcher ends the pod)
    gated: bool  # step 0 reads the ready annotation
    stage: int = 0  # status changes written so far (4: done)
    busy: bool = False  # a status write in flight
    changed_at: list[float] = field(default_factory=list)  # when each change's write was answered
    ready_seen: float | None = None
    outcome_seen: float | None = None
    outcome: str | None = None
    outcome_changes: int = 0
    deadline_seen: float | None = None

    def status(self, stage: int, now: str) -> dict:
        """The whole status after `stage` changes, as the kubelet writes it."""
        inits = [terminated(n, 0, image="init") for n in INITS]
        containers = {n: running(n, image="tool", started_at=now) for n in (*STEPS, MAIN)}
        containers[PROXY] = running(PROXY, image="proxy", started_at=now)
        phase = "Running"
        for step in STEPS[:max(0, stage - 1)]:
            containers[step] = _done(step)
        if stage >= 4:
            containers[MAIN] = _done(MAIN)
            if self.quits:
                containers[PROXY] = terminated(PROXY, 0, image="proxy")
                phase = "Succeeded"
        return {"status": {"phase": phase, "startTime": now, "initContainerStatuses": inits,
                           "containerStatuses": [containers[n] for n in sorted(containers)]}}

    def movable(self) -> bool:
        """The next change may be written: step 0 starts only once the gate opened."""
        return not self.busy and self.stage < 4 and not (self.stage == 1 and self.gated and self.ready_seen is None)


def pending_status() -> dict:
    return {"status": {"phase": "Pending", "initContainerStatuses": [waiting(n, image="init") for n in INITS],
                       "containerStatuses": [waiting(n, "PodInitializing", image="tool")
                                             for n in sorted((*STEPS, MAIN, PROXY))]}}


# --- the API: a real kube-apiserver or the double ----------------------------------------------
class Backend(Protocol):
    label: str
    kubeconfig: str

    async def start(self, scenario: Scenario) -> Client: ...

    async def stop(self) -> None: ...

    async def writes(self) -> dict[str, int]:
        """The watcher's requests so far by kind: pod patches, Event writes, pod GETs, Lease writes."""
        ...

    async def watching(self) -> bool:
        """The watcher has its pods watch open."""
        ...

    def cpu(self) -> dict[str, float]:
        """CPU seconds the API's processes have used (none for the in-process double)."""
        ...


_METRIC = re.compile(r'^apiserver_request_total\{([^}]*)\} ([0-9.e+]+)$')
_LONGRUNNING = re.compile(r'^apiserver_longrunning_requests\{([^}]*)\} ([0-9.e+]+)$')


def _labels(text: str) -> dict[str, str]:
    return dict(re.findall(r'(\w+)="([^"]*)"', text))


class RealBackend:
    """etcd + kube-apiserver (tests/support/k8s), one fresh pair per scenario."""

    def __init__(self, version: str) -> None:
        self.version, self.label, self.kubeconfig = version, "", ""
        self._cm: Any = None
        self.plane: Any = None

    async def start(self, scenario: Scenario) -> Client:
        from tests.support.k8s import control_plane

        self._cm = control_plane(self.version)
        self.plane = await asyncio.to_thread(self._cm.__enter__)
        self.label = f"kube-apiserver {self.plane.version} + etcd (tests/support/k8s)"
        self.kubeconfig = str(self.plane.kubeconfig)
        context = ssl.create_default_context(cafile=str(self.plane.ca_file))
        context.load_cert_chain(str(self.plane.dir / "pki" / "admin.crt"), str(self.plane.dir / "pki" / "admin.key"))
        api = Client(self.plane.server, context)
        for ns in (NS, "initshift-system"):
            await api.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
            # No controller-manager: the ServiceAccount admission needs the default one to exist.
            await _retry(lambda ns=ns: api.request("POST", f"/api/v1/namespaces/{ns}/serviceaccounts",
                                                   {"metadata": {"name": "default"}}))
        return api

    async def stop(self) -> None:
        if self._cm is not None:
            await asyncio.to_thread(self._cm.__exit__, None, None, None)
            self._cm = None

    async def metrics(self) -> list[str]:
        status, body = await asyncio.to_thread(self.plane.get, "/metrics", 30.0)
        if status != 200:
            raise SystemExit(f"GET /metrics: {status}")
        return body.decode().splitlines()

    async def requests(self) -> list[tuple[dict[str, str], int]]:
        """apiserver_request_total: each series' labels and count."""
        return [(_labels(m.group(1)), int(float(m.group(2))))
                for m in map(_METRIC.match, await self.metrics()) if m]

    async def writes(self) -> dict[str, int]:
        counts = {"pod_patches": 0, "event_writes": 0, "pod_gets": 0, "lease": 0}
        for lb, n in await self.requests():
            verb, resource, sub = lb.get("verb"), lb.get("resource"), lb.get("subresource", "")
            if resource == "pods" and sub == "" and verb == "PATCH":
                counts["pod_patches"] += n  # the driver writes pods/status only
            elif resource == "events" and verb in ("POST", "PATCH", "PUT"):
                counts["event_writes"] += n  # nothing else makes Events here
            elif resource == "pods" and sub == "" and verb == "GET":
                counts["pod_gets"] += n
            elif resource == "leases" and verb in ("PUT", "POST"):
                counts["lease"] += n
        return counts

    async def watching(self, at_least: int = 2) -> bool:
        """At least `at_least` pods watches are open (2: the driver's and the watcher's)."""
        open_ = 0
        for line in await self.metrics():
            m = _LONGRUNNING.match(line)
            if m:
                lb = _labels(m.group(1))
                if lb.get("resource") == "pods" and lb.get("verb") == "WATCH":
                    open_ += int(float(m.group(2)))
        return open_ >= at_least

    def cpu(self) -> dict[str, float]:
        return {"kube-apiserver": self.plane.apiserver.cpu_seconds(), "etcd": self.plane.etcd.cpu_seconds()}


class DoubleBackend:
    """The in-process API double; the watcher is told it is one (a kubeconfig to its URL)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir, self.label, self.kubeconfig = workdir, "", ""
        self.kube: KubeDouble | None = None

    async def start(self, scenario: Scenario) -> Client:
        # The namespaces the real backend makes (start() there), beside a new cluster's.
        namespaces = (*SYSTEM_NAMESPACES, NS, "initshift-system")
        self.kube = await KubeDouble(history_limit=50000, namespaces=namespaces).start()
        self.kube.write_latency = SLOW_WRITE_LATENCY if scenario.slow else DOUBLE_WRITE_LATENCY
        lo, hi = self.kube.write_latency
        self.label = f"the in-process API double (writes take {lo * 1000:.0f}-{hi * 1000:.0f} ms)"
        self.kubeconfig = double_kubeconfig(self.workdir / "double.kubeconfig", self.kube.url, NS)
        return Client(self.kube.url)

    async def stop(self) -> None:
        if self.kube is not None:
            await self.kube.stop()
            self.kube = None

    def _watcher_requests(self) -> list:
        assert self.kube is not None
        return [r for r in self.kube.requests if r.user_agent.startswith("initshift-watcher")]

    async def writes(self) -> dict[str, int]:
        counts = {"pod_patches": 0, "event_writes": 0, "pod_gets": 0, "lease": 0}
        for r in self._watcher_requests():
            if r.method == "PATCH" and re.fullmatch(r"/api/v1/namespaces/[^/]+/pods/[^/]+", r.path):
                counts["pod_patches"] += 1
            elif r.method in ("POST", "PATCH", "PUT") and "/events" in r.path:
                counts["event_writes"] += 1
            elif r.method == "GET" and re.fullmatch(r"/api/v1/namespaces/[^/]+/pods/[^/]+", r.path):
                counts["pod_gets"] += 1
            elif "/leases" in r.path and r.method in ("PUT", "POST"):
                counts["lease"] += 1
        return counts

    async def watching(self) -> bool:
        return any(r.query.get("watch") == "true" and r.path == "/api/v1/pods" for r in self._watcher_requests())

    def cpu(self) -> dict[str, float]:
        return {}


async def quiet(backend: RealBackend, deadline: float) -> dict[str, int]:
    """The watcher's writes once they have stopped (its Events go out at 20/s after the
    outcomes, so a count read at the last outcome is short of them): no pod write, Event or
    GET for QUIET seconds (the Lease's renewals go on), or the loop's clock past `deadline`."""
    last, since = await backend.writes(), time.monotonic()
    while time.monotonic() - since < QUIET and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        now = await backend.writes()
        if any(now[k] != last[k] for k in now if k != "lease"):
            since = time.monotonic()
        last = now
    return last


async def _retry(call: Callable[[], Any], seconds: float = 30.0) -> Any:
    """An API call right after start-up (the namespace's admission may lag a moment); one
    that finds its object there already is done."""
    end = time.monotonic() + seconds
    while True:
        try:
            return await call()
        except ApiError as e:
            if e.status == 409:
                return None
            if time.monotonic() > end:
                raise
            await asyncio.sleep(0.2)


# --- the watcher process ---------------------------------------------------------------------
class WatcherProcess:
    def __init__(self, tree: Path, kubeconfig: str, log: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(tree), "INITSHIFT_GRACE_SECONDS": "0", "INITSHIFT_LOG_LEVEL": "info",
               "INITSHIFT_NAMESPACE": "initshift-system"}
        env.pop("KUBECONFIG", None)
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "webhook.cli", "watch", "--kubeconfig", kubeconfig],
                                         cwd=tree, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out)

    def stats(self) -> tuple[float, float]:
        """(CPU seconds, peak RSS MiB)."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        status = dict(line.split(":", 1) for line in open(f"/proc/{self.proc.pid}/status"))
        return cpu, int(status["VmHWM"].split()[0]) / 1024

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


# --- driving ---------------------------------------------------------------------------------
class Driver:
    def __init__(self, api: Client, pods: list[Pod]) -> None:
        self.api = api
        self.pods = {pd.name: pd for pd in pods}
        self.writes: set[asyncio.Task] = set()
        self.failed = 0
        self.latency: list[float] = []  # seconds each status write took: the API's own latency

    async def write(self, pod: Pod, stage: int) -> None:
        pod.busy = True
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        sent = time.monotonic()
        try:
            await self.api.request("PATCH", f"/api/v1/namespaces/{NS}/pods/{pod.name}/status",
                                   pod.status(stage, now), content_type="application/merge-patch+json")
            self.latency.append(time.monotonic() - sent)
        except (ApiError, aiohttp.ClientError) as e:
            self.failed += 1
            print(f"  status write of {pod.name} failed: {e}", file=sys.stderr)
            return
        finally:
            pod.busy = False
        pod.stage = stage
        pod.changed_at += [time.monotonic()] * (stage - len(pod.changed_at))

    def spawn(self, pod: Pod, stage: int) -> None:
        task = asyncio.ensure_future(self.write(pod, stage))
        self.writes.add(task)
        task.add_done_callback(self.writes.discard)

    async def watch(self, since: str) -> None:
        """What the watcher wrote, as a client sees it (the driver's own pods watch)."""
        rv = since
        while True:
            try:
                async for kind, obj in self.api.watch(f"/api/v1/namespaces/{NS}/pods", rv):
                    if kind == "ERROR":
                        raise SystemExit(f"the driver's watch failed: {obj.get('message')}")
                    rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                    if kind in ("ADDED", "MODIFIED"):
                        self.seen(obj)
            except (ApiError, aiohttp.ClientError):
                await asyncio.sleep(0.1)

    def seen(self, obj: dict) -> None:
        pod = self.pods.get(obj["metadata"]["name"])
        if pod is None:
            return
        now = time.monotonic()
        ann = obj["metadata"].get("annotations") or {}
        if ann.get(p.ANNOTATION_READY) == p.READY_TRUE and pod.ready_seen is None:
            pod.ready_seen = now
        value = ann.get(p.ANNOTATION_OUTCOME)
        if value is not None and value != pod.outcome:
            pod.outcome_changes += 1
            pod.outcome = value
            if pod.outcome_seen is None:
                pod.outcome_seen = now
        if (obj.get("spec") or {}).get("activeDeadlineSeconds") is not None and pod.deadline_seen is None:
            pod.deadline_seen = now

    async def at_rate(self, rate: float) -> int:
        queue = list(self.pods.values())
        window: list[Pod] = []
        changes, start = 0, time.monotonic()
        while queue or window:
            due = int((time.monotonic() - start) * rate) - changes
            for _ in range(due):
                while len(window) < WINDOW and queue:
                    window.append(queue.pop(0))
                movable = [pd for pd in window if pd.movable()]
                if not movable:
                    break
                pod = random.choice(movable)
                self.spawn(pod, pod.stage + 1)
                pod.busy = True
                changes += 1
            window = [pd for pd in window if pd.stage < 4 or pd.busy]
            await asyncio.sleep(0.005)
        await asyncio.gather(*self.writes)
        return changes

    async def burst(self) -> int:
        pods = list(self.pods.values())
        await self._all(pods, 1)
        await wait_for(lambda: all(pd.ready_seen is not None for pd in pods if pd.gated), SETTLE)
        await self._all(pods, 4)
        return len(pods) * 2

    async def _all(self, pods: list[Pod], stage: int) -> None:
        slots = asyncio.Semaphore(64)

        async def one(pod: Pod) -> None:
            async with slots:
                await self.write(pod, stage)
        await asyncio.gather(*(one(pd) for pd in pods))


async def wait_for(check: Callable[[], Any], seconds: float, step: float = 0.1) -> bool:
    """Until `check()` (a function, or a coroutine function) is true, or `seconds` have passed."""
    async def holds() -> bool:
        value = check()
        return bool(await value if asyncio.iscoroutine(value) else value)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if await holds():
            return True
        await asyncio.sleep(step)
    return await holds()


async def create_pods(api: Client, pods: list[Pod]) -> tuple[Driver, asyncio.Future]:
    """The pods, created Pending; the driver, watching them from there on."""
    kinds = templates()
    slots = asyncio.Semaphore(32)

    async def create(pod: Pod) -> None:
        async with slots:
            template = kinds["annotation" if pod.gated else "probe"]
            await _retry(lambda: api.request("POST", f"/api/v1/namespaces/{NS}/pods", pod_object(template, pod.name)))
            await api.request("PATCH", f"/api/v1/namespaces/{NS}/pods/{pod.name}/status",
                              pending_status(), content_type="application/merge-patch+json")
    await asyncio.gather(*(create(pd) for pd in pods))
    listed = await api.request("GET", f"/api/v1/namespaces/{NS}/pods", query={"limit": "1"})
    driver = Driver(api, pods)
    return driver, asyncio.ensure_future(driver.watch(listed["metadata"]["resourceVersion"]))


# --- a scenario ------------------------------------------------------------------------------
@dataclass
class Result:
    scenario: Scenario
    api: str = ""
    changes: int = 0
    seconds: float = 0.0
    ready: list[float] = field(default_factory=list)
    outcome: list[float] = field(default_factory=list)
    deadline: list[float] = field(default_factory=list)
    done: int = 0
    missed: int = 0
    twice: int = 0
    writes: dict[str, int] = field(default_factory=dict)
    server_cpu: dict[str, float] = field(default_factory=dict)  # net of idle, per pod (ms)
    api_latency: list[float] = field(default_factory=list)  # the status writes' (the kubelet's)
    watcher_cpu: float = 0.0
    watcher_hwm: float = 0.0
    tree: str = ""  # whose watcher ("" for a row without one)
    round: int = 0  # which repeat (--repeat): a watcher row's share is taken against its round's baseline
    label: str = ""  # the row's name in the report


async def scenario(backend: Backend, s: Scenario, tree: Path, workdir: Path) -> Result:
    result = Result(s, tree=_tree_name(tree) if s.watcher else "")
    api = await backend.start(s)
    watcher: WatcherProcess | None = None
    try:
        result.api = backend.label
        pods = [Pod(f"build-{i:05d}", quits=i % 2 == 0, gated=(i % 100) < s.gated * 100) for i in range(s.pods)]
        driver, watch = await create_pods(api, pods)
        if s.watcher:
            watcher = WatcherProcess(tree, backend.kubeconfig,
                                     workdir / f"watcher-{_tree_name(tree)}-{s.pods}-{s.rate}-{s.gated}.log")
            if not await wait_for(backend.watching, 120):
                raise SystemExit(f"the watcher did not start watching; its log: {watcher.log}")
        await asyncio.sleep(1.0)
        # The servers' CPU with nothing to do but the watcher's Lease, to take off the run's.
        idle0, t0 = backend.cpu(), time.monotonic()
        await asyncio.sleep(IDLE_SECONDS if idle0 else 0)
        idle1, t1 = backend.cpu(), time.monotonic()
        writes0 = await backend.writes()
        cpu0 = watcher.stats()[0] if watcher else 0.0
        start = time.monotonic()
        result.changes = await (driver.at_rate(s.rate) if s.rate else driver.burst())
        result.seconds = time.monotonic() - start
        result.api_latency = driver.latency
        if watcher:
            await wait_for(lambda: all(pd.outcome_seen is not None for pd in pods if pd.stage == 4), SETTLE)
        last = await quiet(backend, start + result.seconds + 2 * SETTLE)
        end_cpu, end = backend.cpu(), time.monotonic()
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        measure(pods, result, s.watcher)
        result.writes = {k: last[k] - writes0.get(k, 0) for k in last}
        for proc, used in end_cpu.items():
            idle_rate = (idle1[proc] - idle0[proc]) / (t1 - t0)
            busy = used - idle1[proc] - idle_rate * (end - t1)
            result.server_cpu[proc] = 1000 * busy / max(1, result.done)
        if watcher:
            cpu1, result.watcher_hwm = watcher.stats()
            result.watcher_cpu = cpu1 - cpu0
            if not watcher.alive():
                raise SystemExit(f"the watcher exited; its log: {watcher.log}")
        return result
    finally:
        if watcher is not None:
            watcher.stop()
        await api.close()
        await backend.stop()


def measure(pods: list[Pod], result: Result, watched: bool = True) -> None:
    for pod in pods:
        if not watched:
            result.done += pod.stage == 4
            continue
        if pod.gated and pod.stage >= 1:
            if pod.ready_seen is None:
                result.missed += 1
            else:
                result.ready.append(pod.ready_seen - pod.changed_at[0])
        if pod.stage < 4:
            continue
        result.done += 1
        if pod.outcome_seen is None:
            result.missed += 1
            continue
        result.outcome.append(pod.outcome_seen - pod.changed_at[-1])
        result.twice += pod.outcome_changes > 1
        if not pod.quits:
            if pod.deadline_seen is None:
                result.missed += 1
            else:
                result.deadline.append(pod.deadline_seen - pod.changed_at[-1])


# --- report ----------------------------------------------------------------------------------
def pct(values: list[float], q: float) -> str:
    if not values:
        return "-"
    values = sorted(values)
    return f"{values[min(len(values) - 1, int(len(values) * q))]:.2f}"


def _p(values: list[float]) -> str:
    return f"{pct(values, 0.5)} / {pct(values, 0.99)}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _share(r: Result, results: list[Result]) -> float | None:
    """The watcher's share of kube-apiserver's CPU per pod: the row less its round's row
    without a watcher at the same load."""
    api_ms = r.server_cpu.get("kube-apiserver")
    base = next((b for b in results if not b.scenario.watcher and b.round == r.round
                 and (b.scenario.pods, b.scenario.rate) == (r.scenario.pods, r.scenario.rate)), None)
    if api_ms is None or base is None or not r.scenario.watcher:
        return None
    return api_ms - base.server_cpu["kube-apiserver"]


def report(results: list[Result], trees: list[Path]) -> None:
    print("watcher benchmark (" + ", ".join(f"{_tree_name(t)}: {t}" for t in trees) + ")")
    print(describe())
    print("API: " + "; ".join(sorted({r.api for r in results})))
    width = max(42, *(len(r.label) for r in results))
    print(f"\n{'load':<{width}} {'chg/s':>5} {'API write p50/p99':>17} {'ready p50/p99':>13} {'outcome p50/p99':>15} "
          f"{'deadline p50/p99':>16} {'done':>5} {'missed':>6} {'twice':>5}")
    for r in results:
        print(f"{r.label:<{width}} {r.changes / max(r.seconds, 1e-9):>5.0f} {_p(r.api_latency):>17} "
              f"{_p(r.ready):>13} {_p(r.outcome):>15} {_p(r.deadline):>16} {r.done:>5} {r.missed:>6} {r.twice:>5}")
    print("seconds: API write, the kubelet's status writes; the others, from the answer to the status write that "
          "made a write due to the watcher's write seen on a watch")
    print(f"\n{'load':<{width}} {'PATCH/pod':>9} {'Event/pod':>9} {'writes/pod':>10} {'apiserver ms/pod':>16} "
          f"{'of which watcher':>16} {'etcd ms/pod':>11} {'watcher CPU s':>13} {'peak MiB':>8}")
    for r in results:
        n = max(1, r.done)
        patches, events = r.writes.get("pod_patches", 0) / n, r.writes.get("event_writes", 0) / n
        print(f"{r.label:<{width}} {patches:>9.2f} {events:>9.2f} {patches + events:>10.2f} "
              f"{_ms(r.server_cpu.get('kube-apiserver')):>16} {_ms(_share(r, results)):>16} "
              f"{_ms(r.server_cpu.get('etcd')):>11} {r.watcher_cpu:>13.1f} {r.watcher_hwm:>8.0f}")
    print("writes/pod: the watcher's pod PATCHes and Event writes per pod done; ms/pod: CPU less the idle rate, per "
          "pod done; of which watcher: less the run without a watcher at the same load (in the same round)")
    rounds = 1 + max(r.round for r in results)
    if rounds > 1 or len(trees) > 1:
        summary(results, width)


def summary(results: list[Result], width: int) -> None:
    """The A/B: each watcher's share per pod over the rounds, median and spread."""
    groups: dict[tuple[str, str], list[Result]] = {}
    for r in results:
        if r.scenario.watcher:
            groups.setdefault((r.scenario.label, r.tree), []).append(r)
    print(f"\n{'load [watcher]':<{width}} {'rounds':>6} {'writes/pod':>10} {'of which watcher, each round':>30} "
          f"{'median':>7} {'min-max':>11}")
    for (label, tree), rows in groups.items():
        shares = [x for x in (_share(r, results) for r in rows) if x is not None]
        writes = statistics.median(sum(r.writes.get(k, 0) for k in ("pod_patches", "event_writes")) / max(1, r.done)
                                   for r in rows)
        each = " ".join(f"{x:.1f}" for x in shares)
        spread = f"{min(shares):.1f}-{max(shares):.1f}" if shares else "-"
        med = _ms(statistics.median(shares) if shares else None)
        print(f"{label + ' [' + tree + ']':<{width}} {len(rows):>6} {writes:>10.2f} {each:>30} {med:>7} {spread:>11}")
    print("of which watcher: kube-apiserver CPU ms per pod less the same round's run without a watcher; the rounds' "
          "runs interleaved (each round's order rotated), so a drift in the machine's load touches every row alike")


def _tree_name(tree: Path) -> str:
    return "this tree" if tree == REPO else tree.name


def pick_backend(choice: str, workdir: Path) -> Backend:
    from tests.support.k8s import available

    real = any(v.startswith("v1.34") for v in available()) and shutil.which("etcd")
    if choice == "double" or (choice == "auto" and not real):
        if choice == "auto":
            print("no kube-apiserver binaries or no etcd: the in-process API double plays the apiserver",
                  file=sys.stderr)
        return DoubleBackend(workdir)
    return RealBackend("1.34")


def plan(chosen: list[Scenario], trees: list[Path], rounds: int) -> list[tuple[int, Scenario, Path]]:
    """Every round runs each scenario without a watcher once and with each tree's watcher
    once; each round's order is the previous one's rotated by one, so that no row always
    runs first or last."""
    runs = [(s, tree) for s in chosen for tree in (trees if s.watcher else trees[:1])]
    return [(r, s, tree) for r in range(rounds) for s, tree in runs[r % len(runs):] + runs[:r % len(runs)]]


async def run_all(args: argparse.Namespace, trees: list[Path]) -> list[Result]:
    with tempfile.TemporaryDirectory(prefix="bench-watcher-") as tmp:
        workdir = Path(tmp)
        backend = pick_backend(args.api, workdir)
        chosen = [s for s in SCENARIOS if not args.only or re.search(args.only, s.label)]
        if args.pods:
            chosen = [dataclasses.replace(s, pods=args.pods, label=s.label.replace(f"{s.pods:,} pods", f"{args.pods:,} pods"))
                      for s in chosen]
        if isinstance(backend, DoubleBackend) and not args.only:
            chosen.append(SLOW)
        results = []
        for round_, s, tree in plan(chosen, trees, args.repeat):
            print(f"  ({s.label}{' [' + _tree_name(tree) + ']' if s.watcher else ''}, round {round_ + 1} ...)",
                  file=sys.stderr, flush=True)
            result = await scenario(backend, s, tree, workdir)
            result.round = round_
            result.label = " ".join(x for x in (s.label, f"[{_tree_name(tree)}]" if s.watcher and len(trees) > 1 else "",
                                                f"#{round_ + 1}" if args.repeat > 1 else "") if x)
            results.append(result)
        return results


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.bench.watcher_bench")
    ap.add_argument("--api", choices=["auto", "real", "double"], default="auto",
                    help="a real kube-apiserver (../shared/k8s), the in-process double, or the first that exists")
    ap.add_argument("--watcher-tree", metavar="DIR", action="append", default=[],
                    help="also run the watcher of this checkout, beside this tree's (an A/B; may be repeated)")
    ap.add_argument("--only", metavar="REGEX", help="only the scenarios whose label matches")
    ap.add_argument("--pods", type=int, help="this many pods in each scenario (default: as labelled)")
    ap.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="run every row N times, interleaved, and print the median and spread of the watcher's share")
    ap.add_argument("--price", action="store_true",
                    help="instead: what each kind of the watcher's requests costs a real kube-apiserver "
                         "(tests/bench/watcher_price.py)")
    args = ap.parse_args()
    if args.price:
        from tests.bench.watcher_price import price

        steal = Steal()
        print(describe())
        asyncio.run(price(RealBackend("1.34"), args.pods or 1000))
        print(steal)
        return 0
    trees = [REPO, *(Path(t).resolve() for t in args.watcher_tree)]
    steal = Steal()
    report(asyncio.run(run_all(args, trees)), trees)
    print(steal)
    return 0


if __name__ == "__main__":
    sys.exit(main())
