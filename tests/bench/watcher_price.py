"""`python -m tests.bench.watcher_bench --price`: what each of the watcher's requests costs a
real kube-apiserver, one kind at a time.

Where `make bench-watcher`'s "of which watcher" goes: on one fresh etcd + kube-apiserver
with N build pods (created Pending, the driver's own pods watch open, as in the bench), each
step below makes N requests of one kind (16 at a time) and prints kube-apiserver's (and
etcd's) CPU per request, less their idle rate. The watcher's watches are opened and closed
by the bench itself (its `KubeApi` with the watcher's selectors, nothing written back), so
the price of a pod change delivered to the watcher is the difference between the same
status write with and without them (averaged over a write before and one after, so that
the store's growth cancels), with the driver's JSON watch of the pods open (the bench's
case: the apiserver encodes each change once for both) and closed (the watcher the only
JSON watcher, as where the kubelet's protobuf watch is the only other). Writes are made as the watcher makes them (its patch of the
outcome annotation, conditional on the resourceVersion; its Event, the recorder's shape),
beside the other patch types for comparison. Prints, asserts nothing.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Awaitable, Callable

from waiter import protocol as p
from webhook.kube import KubeApi
from webhook.watcher._controller import _EVENT_SELECTOR, _LABEL_SELECTOR
from webhook.watcher._recorder import COMPONENT, event_name

CONCURRENCY = 16
_METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
IDLE_SECONDS = 5.0
_OUTCOME = json.dumps({"phase": "Succeeded", "steps": [{"name": "git-clone", "exitCode": 0}, {"name": "deps", "exitCode": 0}],
                       "mains": [{"name": "build", "exitCode": 0}]}, separators=(",", ":"))


class _Watches:
    """The watcher's two watches (its pods, its Events), read and dropped."""

    def __init__(self, api: KubeApi) -> None:
        self.api, self.tasks = api, []
        self.events = 0

    async def _drain(self, plural: str, **selectors: str) -> None:
        async for _ in self.api.watch(plural, None, timeout_seconds=3600, **selectors):
            self.events += 1

    def open(self) -> None:
        self.tasks = [asyncio.ensure_future(self._drain("pods", label_selector=_LABEL_SELECTOR)),
                      asyncio.ensure_future(self._drain("events", field_selector=_EVENT_SELECTOR))]

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks = []


async def price(backend: Any, pods: int) -> None:
    from tests.bench.watcher_bench import NS, SCENARIOS, Pod, create_pods

    api = await backend.start(SCENARIOS[0])
    watcher_api = await KubeApi.from_config(backend.kubeconfig)
    watches = _Watches(watcher_api)
    rows: list[tuple[str, float, float]] = []
    try:
        fleet = [Pod(f"build-{i:05d}", quits=True, gated=False) for i in range(pods)]
        driver, driver_watch = await create_pods(api, fleet)
        rv: dict[str, str] = {}
        uid: dict[str, str] = {}

        async def each(label: str, call: Callable[[Pod], Awaitable[Any]]) -> None:
            slots = asyncio.Semaphore(CONCURRENCY)

            async def one(pod: Pod) -> None:
                async with slots:
                    got = await call(pod)
                    meta = (got or {}).get("metadata") or {}
                    if got and got.get("kind") in ("Pod", "PartialObjectMetadata"):
                        rv[pod.name], uid[pod.name] = meta["resourceVersion"], meta["uid"]
            await asyncio.sleep(1.0)
            c0, t0 = backend.cpu(), time.monotonic()
            await asyncio.sleep(IDLE_SECONDS)
            c1, t1 = backend.cpu(), time.monotonic()
            await asyncio.gather(*(one(pd) for pd in fleet))
            await asyncio.sleep(1.0)  # the watches have delivered what the writes made
            c2, t2 = backend.cpu(), time.monotonic()
            per = {proc: 1000 * ((c2[proc] - c1[proc]) - (c1[proc] - c0[proc]) / (t1 - t0) * (t2 - t1)) / pods
                   for proc in c2}
            rows.append((label, per["kube-apiserver"], per["etcd"]))
            print(f"  {label}: {per['kube-apiserver']:.2f} ms", flush=True)

        def status(stage: int) -> Callable[[Pod], Awaitable[Any]]:
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            return lambda pod: api.request("PATCH", f"/api/v1/namespaces/{NS}/pods/{pod.name}/status",
                                           pod.status(stage, now), content_type="application/merge-patch+json")

        notes = iter(range(1 << 30))

        def note() -> Callable[[Pod], Awaitable[Any]]:
            """A status write every round of which changes the pod (its `status.message`)."""
            n = next(notes)
            return lambda pod: api.request("PATCH", f"/api/v1/namespaces/{NS}/pods/{pod.name}/status",
                                           {"status": {"message": f"bench {n}"}},
                                           content_type="application/merge-patch+json")

        def patch(kind: str, key: str, accept: str = "application/json") -> Callable[[Pod], Awaitable[Any]]:
            def body(pod: Pod) -> Any:
                if kind == "json":
                    return [{"op": "test", "path": "/metadata/resourceVersion", "value": rv[pod.name]},
                            {"op": "add", "path": "/metadata/annotations/" + key.replace("/", "~1"), "value": _OUTCOME}]
                return {"metadata": {"annotations": {key: _OUTCOME}, "resourceVersion": rv[pod.name]}}
            types = {"merge": "application/merge-patch+json", "json": "application/json-patch+json",
                     "strategic": "application/strategic-merge-patch+json"}
            return lambda pod: api.request("PATCH", f"/api/v1/namespaces/{NS}/pods/{pod.name}", body(pod),
                                           content_type=types[kind], accept=accept)

        def event(group: str, n: int) -> Callable[[Pod], Awaitable[Any]]:
            def body(pod: Pod) -> dict:
                name = event_name(pod.name, uid[pod.name], f"outcome-{n}")
                involved = {"apiVersion": "v1", "kind": "Pod", "namespace": NS, "name": pod.name,
                            "uid": uid[pod.name], "resourceVersion": rv[pod.name]}
                now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
                if group == "core":
                    return {"apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": NS},
                            "involvedObject": involved, "reason": "Succeeded", "message": "2 steps and 1 mains succeeded",
                            "type": "Normal", "source": {"component": COMPONENT},
                            "reportingComponent": f"{p.GROUP}/watcher", "reportingInstance": "bench",
                            "action": f"outcome-{n}", "firstTimestamp": now[:19] + "Z", "lastTimestamp": now[:19] + "Z",
                            "count": 1}
                return {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": name, "namespace": NS},
                        "regarding": involved, "reason": "Succeeded", "note": "2 steps and 1 mains succeeded",
                        "type": "Normal", "reportingController": f"{p.GROUP}/watcher", "reportingInstance": "bench",
                        "action": f"outcome-{n}", "eventTime": now}
            path = f"/api/v1/namespaces/{NS}/events" if group == "core" else \
                f"/apis/events.k8s.io/v1/namespaces/{NS}/events"
            return lambda pod: api.request("POST", path, body(pod))

        async def fan_out(label: str) -> None:
            """What one pod change costs the watcher's watch: a write before, one with, one after."""
            await each(f"{label}, no watcher watches", note())
            watches.open()
            await each(f"{label}, the watcher's watches open", note())
            await watches.close()
            await each(f"{label}, no watcher watches again", note())

        await each("status write (the kubelet's: the whole status)", status(1))
        await fan_out("status message written")
        watches.open()
        await each("outcome merge patch (the watcher's), watches open", patch("merge", p.ANNOTATION_OUTCOME))
        await each("the same as a JSON patch (test rv, add)", patch("json", p.ANNOTATION_OUTCOME + "-json"))
        await each("the same as a strategic merge patch", patch("strategic", p.ANNOTATION_OUTCOME + "-smp"))
        await each("the merge patch, answered as PartialObjectMetadata", patch("merge", p.ANNOTATION_OUTCOME + "-m",
                                                                              _METADATA))
        await each("Event POST core/v1 (the watcher's), watches open", event("core", 1))
        await watches.close()
        await each("Event POST core/v1, no Event watch", event("core", 2))
        await each("Event POST events.k8s.io/v1, no Event watch", event("events", 3))
        await each("outcome merge patch, no watcher watches", patch("merge", p.ANNOTATION_OUTCOME + "-2"))
        await each("GET pod", lambda pod: api.request("GET", f"/api/v1/namespaces/{NS}/pods/{pod.name}"))
        driver_watch.cancel()
        await asyncio.gather(driver_watch, return_exceptions=True)
        del driver
        await fan_out("status message written, the driver's watch closed too")
    finally:
        await watches.close()
        await watcher_api.close()
        await api.close()
        await backend.stop()
    width = max(len(label) for label, _, _ in rows)
    print(f"\n{'request (' + str(pods) + ' of each)':<{width}} {'apiserver ms':>12} {'etcd ms':>8}")
    for label, api_ms, etcd_ms in rows:
        print(f"{label:<{width}} {api_ms:>12.2f} {etcd_ms:>8.2f}")
    print("ms: CPU per request less the idle rate; the driver's own pods watch open but in the last three rows")
