"""The in-process API double (tests/support/kubedouble.py) against the real apiserver: a
rule the watcher's fast tests rely on, taken from what a real apiserver did, is checked
here on every version the e2e runs, by sending the same requests to both."""

from __future__ import annotations

import asyncio
import json
import threading
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable

import httpx

from tests.support.kubedouble import SYSTEM_NAMESPACES, KubeDouble
from webhook.kube import KubeApi
from webhook.watcher._leader import LeaderElector

from ._env import Env, Record, scenario
from ._kube import wait_for

_HOLD = "example.com/hold"
_NS = "<namespace>"  # a body's namespace, filled in per scenario


def _nowhere(ns: str) -> str:
    """A node no kubelet runs, for pods that must count as bound (deleted gracefully), one
    per namespace: the pod garbage collector force-deletes pods bound to a missing node 40 s
    after it first sees one there (it deleted a later scenario's pod on a shared name)."""
    return f"no-such-node.{ns}"

Mark = tuple[str | None, int | None] | str
Step = tuple[Callable[[], object], Callable[[datetime], object]]  # (to the apiserver, to the double at a time)


def _mark(obj: dict | None) -> Mark:
    """What deleting left of a pod: its mark (deletionTimestamp, grace), or "gone"."""
    if obj is None:
        return "gone"
    meta = obj["metadata"]
    return meta.get("deletionTimestamp"), meta.get("deletionGracePeriodSeconds")


@scenario("double-deletion")
def double_deletion(env: Env, rec: Record) -> None:
    """Graceful deletion of pods bound to a node, with and without a finalizer, as the
    double models it (`KubeDouble.delete_pod`): each request goes to the apiserver and to
    the double as at the moments just before and just after it was sent; what the
    apiserver left (deletionTimestamp to the second, the grace, or the pod gone) must be
    what the double left at one of them, the double of the apiserver's version. The
    watcher's tests of a deleted build rest on this: with kubernetes#122646 (v1.34.9, not
    v1.28.15) the kubelet's last delete of a pod a finalizer holds moves its
    deletionTimestamp to that moment."""
    ns = env.namespace("double", mesh=None, opted=False)
    rec.namespaces.append(ns)
    double = KubeDouble(version=f"v1.{env.minor}.0")  # (a rule changed between the two)
    base = f"/api/v1/namespaces/{ns}/pods"
    said: list[str] = []

    def create(name: str, finalizers: list[str]) -> None:
        body = {"metadata": {"name": name, "namespace": ns, "finalizers": finalizers},
                "spec": {"nodeName": _nowhere(ns), "terminationGracePeriodSeconds": 20,
                         "containers": [{"name": "c", "image": env.images.busybox}]}}
        double.put_pod(env.kube.create(base, body))

    def same(name: str, what: str, step: Step) -> None:
        real, model = step
        before = datetime.now(timezone.utc)
        real()
        after = datetime.now(timezone.utc)
        got = _mark(env.kube.pod(ns, name))
        saved = double.pod(ns, name)
        expected: list[Mark] = []
        for at in (before, after):
            model(at)
            expected.append(_mark(double.get("pods", ns, name)))
            double.put_pod(saved)  # (as it was, for the other moment)
        assert got in expected, f"{name}, {what}: the apiserver left {got}, the double {expected[0]} or {expected[1]}"
        model(before if got == expected[0] else after)
        said.append(f"{name} {what}: {'gone' if got == 'gone' else f'grace {got[1]}'}")

    def delete(name: str, grace: int | None = None) -> Step:
        params = {} if grace is None else {"gracePeriodSeconds": grace}
        return (lambda: env.kube.delete(f"{base}/{name}", **params),
                lambda at: double.delete_pod(ns, name, grace, at=at))

    def unhold(name: str) -> Step:
        patch = {"metadata": {"finalizers": None}}
        return lambda: env.kube.patch(f"{base}/{name}", patch), lambda _: double.merge("pods", ns, name, patch)

    create("held", [_HOLD])
    same("held", "deleted", delete("held"))
    same("held", "deleted with grace 30 (longer)", delete("held", 30))
    same("held", "deleted with grace 5", delete("held", 5))
    same("held", "deleted with grace 0 (the kubelet's last)", delete("held", 0))
    same("held", "deleted with grace 0 again", delete("held", 0))
    same("held", "finalizer removed", unhold("held"))
    create("free", [])
    same("free", "deleted with grace 10", delete("free", 10))
    same("free", "deleted with grace 0", delete("free", 0))
    create("pending", [_HOLD])
    same("pending", "deleted", delete("pending"))
    same("pending", "finalizer removed in its grace", unhold("pending"))
    same("pending", "deleted with grace 0", delete("pending", 0))
    rec.note("the apiserver and the double agree: " + "; ".join(said))


MERGE, JSON_PATCH = "application/merge-patch+json", "application/json-patch+json"
_CURRENT, _STALE = "<current>", "<stale>"  # a patch's metadata.resourceVersion, filled in per server

# (what, subresource, content type, body), sent in this order to one pod on each server.
_UPDATES: list[tuple[str, str, str, Any]] = [
    ("an annotation added", "", MERGE, {"metadata": {"annotations": {"e2e.initshift.io/a": "1"}}}),
    ("the same patch again (nothing changes)", "", MERGE, {"metadata": {"annotations": {"e2e.initshift.io/a": "1"}}}),
    ("a patch on a stale resourceVersion", "", MERGE,
     {"metadata": {"resourceVersion": _STALE, "annotations": {"e2e.initshift.io/b": "1"}}}),
    ("a patch on the current resourceVersion", "", MERGE,
     {"metadata": {"resourceVersion": _CURRENT, "annotations": {"e2e.initshift.io/b": "1"}}}),
    ("activeDeadlineSeconds set", "", MERGE, {"spec": {"activeDeadlineSeconds": 100}}),
    ("activeDeadlineSeconds raised", "", MERGE, {"spec": {"activeDeadlineSeconds": 200}}),
    ("activeDeadlineSeconds lowered", "", MERGE, {"spec": {"activeDeadlineSeconds": 50}}),
    ("activeDeadlineSeconds 0", "", MERGE, {"spec": {"activeDeadlineSeconds": 0}}),
    ("an image changed", "", JSON_PATCH, [{"op": "replace", "path": "/spec/containers/0/image", "value": "other:1"}]),
    ("restartPolicy changed", "", MERGE, {"spec": {"restartPolicy": "Never"}}),
    ("a label value ending in '-'", "", MERGE, {"metadata": {"labels": {"e2e.initshift.io/l": "a-"}}}),
    ("an annotation key with a space", "", MERGE, {"metadata": {"annotations": {"e2e initshift": "1"}}}),
    ("annotations over 256 KiB", "", MERGE, {"metadata": {"annotations": {"e2e.initshift.io/big": "x" * 262144}}}),
    ("a JSON patch whose test fails", "", JSON_PATCH, [{"op": "test", "path": "/metadata/name", "value": "other"}]),
    ("/status with an annotation, a spec change and a message", "/status", MERGE,
     {"metadata": {"annotations": {"e2e.initshift.io/c": "1"}}, "spec": {"activeDeadlineSeconds": 10},
      "status": {"message": "from the status"}}),
    ("a spec change with a status change", "", MERGE,
     {"spec": {"activeDeadlineSeconds": 40}, "status": {"message": "from the pod"}}),
]


def _seen(pod: dict) -> dict:
    """What the double's rules decide, of a pod an update answered with."""
    meta, spec = pod["metadata"], pod["spec"]
    return {"annotations": {k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith("e2e")},
            "labels": {k: v for k, v in (meta.get("labels") or {}).items() if k.startswith("e2e")},
            "activeDeadlineSeconds": spec.get("activeDeadlineSeconds"), "image": spec["containers"][0]["image"],
            "restartPolicy": spec.get("restartPolicy"), "message": (pod.get("status") or {}).get("message")}


class _Served:
    """The double served over HTTP from a thread of its own (the e2e harness is synchronous)."""

    def __init__(self, *namespaces: str) -> None:
        """`namespaces`: those the run made, which the double has too (beside a new cluster's)."""
        self.double = KubeDouble(namespaces=(*SYSTEM_NAMESPACES, *namespaces))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.double.start(), self._loop).result(30)
        self.http = httpx.Client(base_url=self.double.url, timeout=30.0)

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on the double's loop (what it does may schedule work there)."""
        async def call() -> Any:
            return fn(*args)
        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(30)

    def close(self) -> None:
        self.http.close()
        asyncio.run_coroutine_threadsafe(self.double.stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()


def _answer(http: httpx.Client, method: str, path: str, body: Any, ctype: str) -> tuple[int, dict]:
    content = None if body is None else json.dumps(body)
    resp = http.request(method, path, content=content, headers={"Content-Type": ctype})
    return resp.status_code, resp.json() if "json" in resp.headers.get("content-type", "") else {}


@scenario("double-updates")
def double_updates(env: Env, rec: Record) -> None:
    """The pod update rules the watcher's tests rely on, as the double models them, against
    the apiserver: the same patches to the same pod on both (merge and JSON patches, a
    stale and a current resourceVersion, `activeDeadlineSeconds` set, raised, lowered, 0,
    other spec fields, invalid labels and annotations, `/status`) get the same status code
    and, where they succeed, leave the same fields and move the resourceVersion alike
    (not at all when nothing changed)."""
    ns = env.namespace("dupd", mesh=None, opted=False)
    rec.namespaces.append(ns)
    body = {"metadata": {"name": "updated", "namespace": ns},
            "spec": {"nodeName": _nowhere(ns), "containers": [{"name": "c", "image": env.images.busybox}]}}
    served = _Served(ns)
    try:
        real = env.kube.create(f"/api/v1/namespaces/{ns}/pods", body)
        served.double.put_pod(real)
        path = f"/api/v1/namespaces/{ns}/pods/updated"
        sides = {"apiserver": env.kube.http, "double": served.http}
        versions = {side: [_answer(http, "GET", path, None, MERGE)[1]["metadata"]["resourceVersion"]]
                    for side, http in sides.items()}
        agreed = []
        for what, sub, ctype, patch in _UPDATES:
            got = {}
            for side, http in sides.items():
                text = json.dumps(patch).replace(_CURRENT, versions[side][-1]).replace(_STALE, versions[side][0])
                code, obj = _answer(http, "PATCH", path + sub, json.loads(text), ctype)
                moved = None
                if code == 200:
                    rv = obj["metadata"]["resourceVersion"]
                    moved = rv != versions[side][-1]
                    versions[side].append(rv)
                got[side] = (code, moved, _seen(obj) if code == 200 else None)
            assert got["apiserver"] == got["double"], f"{what}: {got}"
            agreed.append(f"{what} {got['double'][0]}")
    finally:
        served.close()
        env.kube.delete(f"/api/v1/namespaces/{ns}/pods/updated", gracePeriodSeconds=0)
    rec.note("the apiserver and the double agree: " + "; ".join(agreed))


@scenario("double-events")
def double_events(env: Env, rec: Record) -> None:
    """Event creation as the double validates it, against the apiserver: a core/v1 Event
    shaped as the watcher's (one fixed name per pod and action), created twice (409: how
    the watcher never records one twice), with names the apiserver takes though they are
    no DNS subdomain (capitals, a space, 300 characters) and ones it refuses (`%`, `..`),
    and with an `involvedObject.namespace` other than its own or empty, gets the same
    status code; so does an events.k8s.io/v1 Event, with its `regarding` namespace and
    without (validated as one type, the same rule)."""
    ns = env.namespace("devt", mesh=None, opted=False)
    rec.namespaces.append(ns)
    served = _Served(ns)

    def event(name: str, involved_ns: str) -> dict:
        return {"apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": ns},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": involved_ns, "name": "build-1"},
                "reason": "StepsSucceeded", "message": "Succeeded", "type": "Normal",
                "source": {"component": "initshift-watcher"}, "reportingComponent": "initshift.io/watcher",
                "reportingInstance": "e2e", "action": "outcome", "firstTimestamp": "2026-12-01T10:00:00Z",
                "lastTimestamp": "2026-12-01T10:00:00Z", "count": 1}

    def new_event(name: str, regarding_ns: str) -> dict:
        return {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": name, "namespace": ns},
                "regarding": {"apiVersion": "v1", "kind": "Pod", "namespace": regarding_ns, "name": "build-1"},
                "reason": "StepsSucceeded", "note": "Succeeded", "type": "Normal", "action": "outcome",
                "eventTime": "2026-12-01T10:00:00.000000Z", "reportingController": "initshift.io/watcher",
                "reportingInstance": "e2e"}

    cases = [("the watcher's Event", event("build-1.0123456789ab", ns)),
             ("the same again", event("build-1.0123456789ab", ns)),
             ("a name with capitals", event("Build-1.0123456789ab", ns)),
             ("a name with a space", event("build 1.0123456789ab", ns)),
             ("a name of 300 characters", event("b" * 300, ns)),
             ("a name with '%'", event("build%1", ns)),
             ("the name '..'", event("..", ns)),
             ("another namespace's pod", event("build-1.abcdef012345", "default")),
             ("no involvedObject namespace", event("build-1.abcdef012346", "")),
             ("an events.k8s.io/v1 Event", new_event("build-1.abcdef012347", ns)),
             ("an events.k8s.io/v1 Event about no namespace's pod", new_event("build-1.abcdef012348", ""))]
    agreed = []
    try:
        for what, body in cases:
            api = "apis/events.k8s.io/v1" if "regarding" in body else "api/v1"
            got = {side: _answer(http, "POST", f"/{api}/namespaces/{ns}/events", body, "application/json")[0]
                   for side, http in (("apiserver", env.kube.http), ("double", served.http))}
            assert got["apiserver"] == got["double"], f"{what}: {got}"
            agreed.append(f"{what} {got['double']}")
    finally:
        served.close()
    rec.note("the apiserver and the double agree: " + "; ".join(agreed))


def _counted(name: str, then: str) -> list[str]:
    """A container's command that prints `NAME run N`, N its run in the pod (counted on an
    emptyDir), then runs `then` (`$n`: N)."""
    return ["sh", "-c", f'n=$(cat /runs/{name} 2>/dev/null || echo 0); echo "{name} run $n"; '
                        f'echo $((n + 1)) > /runs/{name}; {then}']


@scenario("double-logs")
def double_logs(env: Env, rec: Record) -> None:
    """Which run of a container the kubelet's log endpoint serves, as the double models it
    (each run its own log, by restartCount), against a real kubelet: a pod under
    restartPolicy OnFailure with a container in its second run after a failed first, one
    waiting to be restarted (CrashLoopBackOff, its status still its last run's), and one
    never run again; each read with and without `previous=true` (and a container the pod
    does not have) gets the same status code, and the same log or message, from both."""
    ns = env.namespace("dlogs", mesh=None, opted=False)
    rec.namespaces.append(ns)
    mount = [{"name": "runs", "mountPath": "/runs"}]
    names = ("flaky", "looping", "steady")
    body = {"metadata": {"name": "logs", "namespace": ns}, "spec": {
        "restartPolicy": "OnFailure", "terminationGracePeriodSeconds": 1,
        "volumes": [{"name": "runs", "emptyDir": {}}],
        "containers": [{"name": name, "image": env.images.busybox, "volumeMounts": mount, "command": _counted(
            name, then)} for name, then in zip(names, ('[ "$n" -ge 1 ] && exec sleep 3600; exit 1', "exit 1",
                                                       "exec sleep 3600"))]}}
    path = f"/api/v1/namespaces/{ns}/pods/logs"

    def settled() -> dict | None:  # flaky in its second run, looping waiting to be restarted after its second
        obj = env.kube.get(path)
        st = {s["name"]: s for s in (obj or {}).get("status", {}).get("containerStatuses") or []}
        flaky, looping = st.get("flaky") or {}, st.get("looping") or {}
        ready = "running" in flaky.get("state", {}) and flaky.get("restartCount") == 1 and \
            "waiting" in looping.get("state", {}) and looping.get("restartCount", 0) >= 1 and \
            "terminated" in looping.get("lastState", {})
        return obj if ready else None

    reads = [(name, previous) for name in (*names, "nosuch") for previous in (False, True)]
    served = _Served(ns)
    try:
        env.kube.create(f"/api/v1/namespaces/{ns}/pods", body)
        for _ in range(3):  # looping may start its next run while it is read: then again
            real = wait_for(settled, 120, "flaky's second run and looping in its back-off", interval=0.5)
            got = {"apiserver": [_log(env.kube.http, path, name, previous) for name, previous in reads]}
            if _restarts(env.kube.get(path)) == _restarts(real):
                break
        else:
            raise AssertionError("the pod kept restarting while it was read")
        served.run(served.double.put_pod, real)
        for name in names:  # each run printed one line: the double is told which run printed it
            for run in range(_restarts(real)[name] + 1):
                served.run(served.double.append_log, ns, "logs", name, f"{name} run {run}", None, run)
        got["double"] = [_log(served.http, path, name, previous) for name, previous in reads]
    finally:
        served.close()
        env.kube.delete(path, gracePeriodSeconds=0)
    for (name, previous), real_read, double_read in zip(reads, got["apiserver"], got["double"]):
        assert real_read == double_read, f"{name}{' previous' if previous else ''}: apiserver {real_read}, " \
                                         f"double {double_read}"
    rec.note("the apiserver and the double agree: " + "; ".join(
        f"{name}{' previous' if previous else ''} {code} {text.strip()!r}"
        for (name, previous), (code, text) in zip(reads, got["double"])))


def _log(http: httpx.Client, path: str, container: str, previous: bool) -> tuple[int, str]:
    """A log read: its status code and the log, or the apiserver's message."""
    resp = http.get(path + "/log", params={"container": container, **({"previous": "true"} if previous else {})})
    return resp.status_code, resp.text if resp.status_code == 200 else resp.json().get("message", "")


def _restarts(pod: dict | None) -> dict[str, int]:
    return {s["name"]: s.get("restartCount", 0) for s in (pod or {}).get("status", {}).get("containerStatuses") or []}


_WATCHED = "e2e.initshift.io/watched"


@scenario("double-watch")
def double_watch(env: Env, rec: Record) -> None:
    """A pods watch with a label selector, as the double streams it, against the apiserver
    (the watcher's informers watch so): the same creates, label changes across the
    selector, changes outside it, deletes (one held by a finalizer until it is removed),
    then a watch from the resourceVersion before them, give the same events in the same
    order (type, pod, its deletion grace and finalizers): a pod that comes into the
    selector is ADDED, one that leaves it DELETED, changes to pods outside it never seen; a
    deleted pod is first MODIFIED, marked with grace 0, and the DELETED event of a held one
    still names its finalizer."""
    ns = env.namespace("dwatch", mesh=None, opted=False)
    rec.namespaces.append(ns)
    base = f"/api/v1/namespaces/{ns}/pods"

    def body(name: str, label: str, finalizers: tuple[str, ...] = ()) -> dict:
        # Never scheduled (no scheduler by that name): no kubelet changes it, and each delete is
        # one at once, as the double's of a pod without a node.
        return {"metadata": {"name": name, "labels": {_WATCHED: label}, "finalizers": list(finalizers)},
                "spec": {"schedulerName": "initshift-e2e-no-such-scheduler",
                         "containers": [{"name": "c", "image": env.images.busybox}]}}

    def labelled(label: str) -> dict:
        return {"metadata": {"labels": {_WATCHED: label}}}

    changes: list[tuple[str, str, Any, str]] = [
        ("POST", base, body("a", "in"), "application/json"),
        ("POST", base, body("b", "out"), "application/json"),
        ("PATCH", f"{base}/b", {"metadata": {"annotations": {_WATCHED: "outside"}}}, MERGE),
        ("PATCH", f"{base}/b", labelled("in"), MERGE),
        ("PATCH", f"{base}/a", labelled("out"), MERGE),
        ("PATCH", f"{base}/a", {"metadata": {"annotations": {_WATCHED: "outside"}}}, MERGE),
        ("PATCH", f"{base}/b", {"metadata": {"annotations": {_WATCHED: "inside"}}}, MERGE),
        ("DELETE", f"{base}/b", None, "application/json"),
        ("DELETE", f"{base}/a", None, "application/json"),
        ("POST", base, body("c", "in", (_HOLD,)), "application/json"),
        ("DELETE", f"{base}/c", None, "application/json"),
        ("PATCH", f"{base}/c", {"metadata": {"finalizers": None}}, MERGE),
    ]
    served = _Served(ns)
    seen: dict[str, list[tuple]] = {}
    try:
        for side, http in (("apiserver", env.kube.http), ("double", served.http)):
            start = _answer(http, "GET", base, None, "application/json")[1]["metadata"]["resourceVersion"]
            for method, path, change, ctype in changes:
                code, _ = _answer(http, method, path, change, ctype)
                assert code < 300, f"{side}: {method} {path}: {code}"
            params = {"watch": "true", "resourceVersion": start, "labelSelector": f"{_WATCHED}=in",
                      "timeoutSeconds": "2"}
            with http.stream("GET", base, params=params, timeout=30.0) as resp:
                events = [json.loads(line) for line in resp.iter_lines() if line]
            seen[side] = [(e["type"], m["name"], m.get("deletionGracePeriodSeconds"), m.get("finalizers"))
                          for e in events for m in (e["object"]["metadata"],)]
    finally:
        served.close()
    assert seen["apiserver"] == seen["double"], seen
    rec.note(f"the apiserver and the double agree: {', '.join(f'{e[0]} {e[1]}' for e in seen['double'])}")


_AS_GOT = "<as got>"  # a PUT of the Lease as a GET returned it

# (what, method, the Lease's name in the path (None: POST), body), in this order on each server; a
# body's resourceVersion may be _CURRENT or _STALE (of the Lease "l"), its spec a MicroTime.
_LEASE_STEPS: list[tuple[str, str, str | None, Any]] = [
    ("created", "POST", None, {"metadata": {"name": "l"}, "spec": {
        "holderIdentity": "a", "leaseDurationSeconds": 15, "acquireTime": "2026-12-01T10:00:00.123456+01:00",
        "renewTime": "2026-12-01T10:00:00,654321Z", "leaseTransitions": 0, "e2eUnknown": 1, "preferredHolder": None}}),
    ("created again", "POST", None, {"metadata": {"name": "l"}, "spec": {}}),
    ("created with a resourceVersion", "POST", None, {"metadata": {"name": "m", "resourceVersion": "7"}}),
    ("created with a duration of 0", "POST", None, {"metadata": {"name": "n"}, "spec": {"leaseDurationSeconds": 0}}),
    ("created with -1 transitions", "POST", None, {"metadata": {"name": "n"}, "spec": {"leaseTransitions": -1}}),
    ("a renewTime without its fraction", "POST", None,
     {"metadata": {"name": "n"}, "spec": {"renewTime": "2026-12-01T10:00:00Z"}}),
    ("a renewTime in milliseconds", "POST", None,
     {"metadata": {"name": "n"}, "spec": {"renewTime": "2026-12-01T10:00:00.123Z"}}),
    ("a duration as a string", "POST", None, {"metadata": {"name": "n"}, "spec": {"leaseDurationSeconds": "3"}}),
    ("a duration of 1.5", "POST", None, {"metadata": {"name": "n"}, "spec": {"leaseDurationSeconds": 1.5}}),
    ("a duration over int32", "POST", None, {"metadata": {"name": "n"}, "spec": {"leaseDurationSeconds": 2**31}}),
    ("replaced without a resourceVersion", "PUT", "l", {"metadata": {"name": "l"}, "spec": {"holderIdentity": "b"}}),
    ("replaced on the current resourceVersion", "PUT", "l",
     {"metadata": {"name": "l", "resourceVersion": _CURRENT}, "spec": {"holderIdentity": "b", "leaseTransitions": 1}}),
    ("replaced on a stale resourceVersion", "PUT", "l",
     {"metadata": {"name": "l", "resourceVersion": _STALE}, "spec": {"holderIdentity": "c"}}),
    ("replaced by itself (nothing changes)", "PUT", "l", _AS_GOT),
    ("replaced under another name", "PUT", "l", {"metadata": {"name": "o", "resourceVersion": _CURRENT}}),
    ("replaced without a name", "PUT", "l", {"metadata": {"resourceVersion": _CURRENT}}),
    ("replaced with another namespace", "PUT", "l",
     {"metadata": {"name": "l", "namespace": "default", "resourceVersion": _CURRENT}}),
    ("replaced with a duration of 0", "PUT", "l",
     {"metadata": {"name": "l", "resourceVersion": _CURRENT}, "spec": {"leaseDurationSeconds": 0}}),
    ("replaced invalid on a stale resourceVersion", "PUT", "l",
     {"metadata": {"name": "l", "resourceVersion": _STALE}, "spec": {"leaseDurationSeconds": 0}}),
    ("replaced on resourceVersion 'abc'", "PUT", "l", {"metadata": {"name": "l", "resourceVersion": "abc"}}),
    ("one that does not exist replaced", "PUT", "p", {"metadata": {"name": "p", "resourceVersion": "3"},
                                                       "spec": {"holderIdentity": "p"}}),
]


@scenario("double-leases")
def double_leases(env: Env, rec: Record) -> None:
    """Lease writes as the double models them, against the apiserver (the watcher's leader
    election rests on them): the same creates and replaces on both (an existing name, a
    resourceVersion on create, invalid durations and transitions, MicroTimes the apiserver
    cannot decode and ones it normalizes, wrong types, a PUT without a resourceVersion, on
    a stale and the current one, of the object as it is, under another name or namespace,
    of one that does not exist) get the same status code and, where they succeed, the same
    spec, and move the resourceVersion alike. Then the watcher's own LeaderElector, two
    replicas on a clock of their own, acquires, renews, is refused, takes over, releases
    and acquires again on both, with the same answers and the same Lease left."""
    ns = env.namespace("dlease", mesh=None, opted=False)
    rec.namespaces.append(ns)
    base = f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
    served = _Served(ns)
    agreed = []
    try:
        sides = {"apiserver": env.kube.http, "double": served.http}
        versions: dict[str, list[str]] = {side: [] for side in sides}
        for what, method, name, body in _LEASE_STEPS:
            got = {}
            for side, http in sides.items():
                path = base if name is None else f"{base}/{name}"
                if body == _AS_GOT:
                    sent = _answer(http, "GET", path, None, "application/json")[1]
                else:
                    known = versions[side] or ["1"]
                    sent = json.loads(json.dumps(body).replace(_CURRENT, known[-1]).replace(_STALE, known[0]))
                code, obj = _answer(http, method, path, sent, "application/json")
                moved = None
                if code < 300 and obj["metadata"]["name"] == "l":
                    rv = obj["metadata"]["resourceVersion"]
                    moved = bool(versions[side]) and rv != versions[side][-1]
                    versions[side].append(rv)
                got[side] = (code, moved, obj.get("spec") if code < 300 else None)
            assert got["apiserver"] == got["double"], f"{what}: {got}"
            agreed.append(f"{what} {got['double'][0]}")
        elected = {"apiserver": asyncio.run(_elections(lambda: KubeApi.from_config(str(env.admin)), ns)),
                   "double": asyncio.run(_elections(lambda: _at(served.double.url), ns))}
    finally:
        served.close()
    assert elected["apiserver"] == elected["double"], elected
    rec.note("the apiserver and the double agree: " + "; ".join(agreed) +
             f"; elections {elected['double'][0]}, leaving {elected['double'][1]}")


async def _at(url: str) -> KubeApi:
    return KubeApi.for_host(url)


async def _elections(connect: Callable[[], Awaitable[KubeApi]], ns: str) -> tuple[list[bool], dict]:
    """Two replicas' LeaderElector on one Lease, on a clock the steps move: what each
    attempt answered, and the Lease's holder, duration and transitions at the end."""
    now = [0.0]
    api = await connect()
    try:
        a, b = (LeaderElector(api, ns, "elected", who, 15.0, clock=lambda: now[0]) for who in ("a", "b"))
        answers = [await a.try_acquire_or_renew(),  # created
                   await a.try_acquire_or_renew(),  # renewed on the Lease as a last wrote it
                   await b.try_acquire_or_renew()]  # held by a, seen now: refused
        now[0] += 16.0  # a has not renewed within the Lease's duration
        answers += [await b.try_acquire_or_renew(),  # taken over
                    await a.try_acquire_or_renew()]  # its own hold ran out: it reads b's, refused
        await b.release()
        answers.append(await a.try_acquire_or_renew())  # released: a takes it at once
        spec = (await api.get_lease(ns, "elected") or {}).get("spec") or {}
    finally:
        await api.close()
    return answers, {k: spec.get(k) for k in ("holderIdentity", "leaseDurationSeconds", "leaseTransitions")}


# (what, query, the step whose continue token it sends, or None), in this order on each server's
# five Leases l0..l4 of one namespace, labelled odd=0/1; before the steps marked "after changes", l9
# is created and l0 deleted on both; those marked "across namespaces" list every namespace's Leases
# of the run (the same five in a second namespace, whose name is the first's and "-b").
_LIST_STEPS: list[tuple[str, dict[str, str], int | None]] = [
    ("a page of 2", {"limit": "2"}, None),
    ("its next page", {"limit": "2"}, 0),
    ("its next page again (a token is reusable)", {"limit": "2"}, 0),
    ("the rest, without a limit", {}, 0),
    ("a continue with a selector of its own", {"labelSelector": "odd=1"}, 0),
    ("a page of 5 of 5", {"limit": "5"}, None),
    ("a page of 4 of 5", {"limit": "4"}, None),
    ("a page of 2 of odd=1", {"labelSelector": "odd=1", "limit": "2"}, None),
    ("its next page (empty: l4 followed)", {"labelSelector": "odd=1", "limit": "2"}, 7),
    ("a page of 3 of odd=0", {"labelSelector": "odd=0", "limit": "3"}, None),
    ("a page of 2 with a field selector", {"fieldSelector": "metadata.name!=l1", "limit": "2"}, None),
    ("its next page", {"fieldSelector": "metadata.name!=l1", "limit": "2"}, 10),
    ("a page of 1 matching nothing", {"labelSelector": "odd=7", "limit": "1"}, None),
    ("limit 0", {"limit": "0"}, None),
    ("limit -1", {"limit": "-1"}, None),
    ("limit 'abc'", {"limit": "abc"}, None),
    ("a continue token that is not one", {"limit": "2", "continue": "garbage"}, None),
    ("a continue with a resourceVersion", {"limit": "2", "resourceVersion": "1"}, 0),
    ("after changes: the first page's next page", {"limit": "2"}, 0),
    ("after changes: a page of 2", {"limit": "2"}, None),
    ("across namespaces: a page of 3", {"limit": "3"}, None),
    ("across namespaces: its next page", {"limit": "3"}, 20),
    ("across namespaces: the rest", {}, 21),
]
_CHANGED_AT, _ACROSS_FROM = 18, 20
_LISTED = "e2e.initshift.io/listed"


@scenario("double-lists")
def double_lists(env: Env, rec: Record) -> None:
    """Paged lists as the double serves them, against the apiserver (the watcher's informers
    list page by page, with selectors): the same lists of the same Leases on both give the
    same status code, names, continue token or none, and remainingItemCount: a page ends
    at `limit` matches, a token comes whenever any object follows (the last page of a
    selector may be empty), is reusable and reads the first page's snapshot after changes,
    takes the selector it is sent with; no remainingItemCount under a selector; across
    namespaces, in the order of their storage keys (`NS-b/l0` before `NS/l0`)."""
    ns = env.namespace("dlist", mesh=None, opted=False)
    other = env.namespace("dlist", mesh=None, opted=False, suffix="-b")
    rec.namespaces += [ns, other]
    base = f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
    served = _Served(ns, other)
    seen: dict[str, list[tuple]] = {}
    try:
        for side, http in (("apiserver", env.kube.http), ("double", served.http)):
            for where in (ns, other):
                for i in range(5):
                    lease = {"metadata": {"name": f"l{i}", "labels": {"odd": str(i % 2), _LISTED: env.run}}}
                    code, _ = _answer(http, "POST", f"/apis/coordination.k8s.io/v1/namespaces/{where}/leases", lease,
                                      "application/json")
                    assert code == 201, f"{side}: {where}/l{i}: {code}"
            tokens: dict[int, str] = {}
            seen[side] = []
            for step, (what, query, continued) in enumerate(_LIST_STEPS):
                if step == _CHANGED_AT:
                    assert _answer(http, "POST", base, {"metadata": {"name": "l9"}}, "application/json")[0] == 201
                    assert _answer(http, "DELETE", f"{base}/l0", None, "application/json")[0] == 200
                params, path = dict(query), base
                if step >= _ACROSS_FROM:
                    params["labelSelector"], path = f"{_LISTED}={env.run}", "/apis/coordination.k8s.io/v1/leases"
                if continued is not None:
                    params["continue"] = tokens[continued]
                resp = http.get(path, params=params)
                body = resp.json()
                meta = body.get("metadata") or {}
                if meta.get("continue"):
                    tokens[step] = meta["continue"]
                names = [f"{o['metadata']['namespace']}/{o['metadata']['name']}" if step >= _ACROSS_FROM
                         else o["metadata"]["name"] for o in body.get("items") or []]
                seen[side].append((what, resp.status_code, names, "continue" in meta, meta.get("remainingItemCount")))
    finally:
        served.close()
    for real, model in zip(seen["apiserver"], seen["double"]):
        assert real == model, f"apiserver {real}, double {model}"
    rec.note("the apiserver and the double agree: " + "; ".join(f"{s[0]} {s[1]} {s[2]}" for s in seen["double"]))


# (resource's path below the namespace, a body to create): what `double-deletes` deletes.
_DELETED: list[tuple[str, dict]] = [
    ("api/v1/configmaps", {"metadata": {"name": "d"}}),
    ("api/v1/secrets", {"metadata": {"name": "d"}}),
    ("api/v1/serviceaccounts", {"metadata": {"name": "d"}}),
    ("api/v1/services", {"metadata": {"name": "d"}, "spec": {"ports": [{"port": 80}]}}),
    ("api/v1/limitranges", {"metadata": {"name": "d"}, "spec": {"limits": [{"type": "Container", "max": {"cpu": "1"}}]}}),
    ("api/v1/resourcequotas", {"metadata": {"name": "d"}, "spec": {"hard": {"pods": "10"}}}),
    ("api/v1/events", {"metadata": {"name": "d"}, "involvedObject": {"kind": "Pod", "name": "p", "namespace": _NS},
                       "reason": "R"}),
    ("apis/events.k8s.io/v1/events", {"metadata": {"name": "d"}, "regarding": {"kind": "Pod", "name": "p", "namespace": _NS},
                                      "reason": "R", "action": "A", "eventTime": "2026-12-01T10:00:00.000000Z",
                                      "reportingController": "initshift.io/e2e", "reportingInstance": "e2e",
                                      "type": "Normal"}),
    ("apis/coordination.k8s.io/v1/leases", {"metadata": {"name": "d"}}),
    ("apis/apps/v1/deployments", {"metadata": {"name": "d"}, "spec": {
        "replicas": 0, "selector": {"matchLabels": {"e2e": "d"}},
        "template": {"metadata": {"labels": {"e2e": "d"}}, "spec": {"containers": [{"name": "c", "image": "none"}]}}}}),
    ("apis/batch/v1/cronjobs", {"metadata": {"name": "d"}, "spec": {"schedule": "0 0 1 1 *", "suspend": True,
                                "jobTemplate": {"spec": {"template": {"spec": {
                                    "restartPolicy": "Never", "containers": [{"name": "c", "image": "none"}]}}}}}}),
    ("apis/policy/v1/poddisruptionbudgets", {"metadata": {"name": "d"}, "spec": {
        "minAvailable": 1, "selector": {"matchLabels": {"e2e": "d"}}}}),
]


@scenario("double-deletes")
def double_deletes(env: Env, rec: Record) -> None:
    """DELETE's answer as the double gives it, against the apiserver: for each namespaced
    resource the double serves but pods (`double-deletion`), Jobs and namespaces (whose
    deletion waits for a controller), an object created then deleted answers 200 with the
    object (ServiceAccounts, Services, ResourceQuotas) or a `Status` of Success naming it
    (name, group, kind, its uid), on both; deleted again, 404 on both."""
    ns = env.namespace("ddel", mesh=None, opted=False)
    rec.namespaces.append(ns)
    served = _Served(ns)
    agreed = []
    try:
        for path, body in _DELETED:
            body = json.loads(json.dumps(body).replace(_NS, ns))
            got = {}
            for side, http in (("apiserver", env.kube.http), ("double", served.http)):
                collection = f"/{path.rpartition('/')[0]}/namespaces/{ns}/{path.rpartition('/')[2]}"
                code, created = _answer(http, "POST", collection, body, "application/json")
                assert code == 201, f"{side}: {path}: {code} {created}"
                code, answer = _answer(http, "DELETE", f"{collection}/d", None, "application/json")
                details = dict(answer.get("details") or {})
                uid = details.pop("uid", None)
                again, _ = _answer(http, "DELETE", f"{collection}/d", None, "application/json")
                got[side] = (code, answer.get("kind"), details, uid == created["metadata"]["uid"] if uid else None, again)
            assert got["apiserver"] == got["double"], f"{path}: {got}"
            agreed.append(f"{path} {got['double'][0]} {got['double'][1]}, again {got['double'][4]}")
    finally:
        served.close()
    rec.note("the apiserver and the double agree: " + "; ".join(agreed))


def _deletion(code: int, answer: dict, own: dict[str, str] | None = None) -> tuple:
    """What a DELETE or an update answered, comparable across the two: the status, the kind,
    the reason and message (the object's own uid and resourceVersion in it replaced), the
    finalizers, whether it is marked, its grace, and a Status's details (no uid)."""
    meta = answer.get("metadata") or {}
    message = answer.get("message") or ""
    for value, placeholder in (((own or {}).get("uid"), "<uid>"), ((own or {}).get("rv"), "<rv>")):
        if value:
            message = message.replace(f"({value})", f"({placeholder})")
    details = {k: v for k, v in (answer.get("details") or {}).items() if k not in ("uid", "causes")}
    return (code, answer.get("kind"), answer.get("reason"), message, meta.get("finalizers"),
            "deletionTimestamp" in meta, meta.get("deletionGracePeriodSeconds"), details)


@scenario("double-delete-options")
def double_delete_options(env: Env, rec: Record) -> None:
    """A DELETE's options as the double takes them, against the apiserver: a propagationPolicy
    that is none of the three, or beside orphanDependents, is 422 before the object is
    looked up; `preconditions` that do not match are 409 (the UID's first); `dryRun=All`
    answers as a delete would and changes nothing; a Job's default policy is Orphan, its
    answer the Job marked with the garbage collector's `orphan` finalizer, Foreground's
    `foregroundDeletion`; an object a finalizer of its own holds is marked and answered, a
    second delete leaves it as it was, an update may not add a finalizer to it (422), and
    it goes when its last finalizer is removed. Each step goes to both; every answer and
    what a GET then finds agree. Nothing compared depends on the cluster's garbage
    collector, which the double does not run: its finalizers are only answered."""
    ns = env.namespace("ddopt", mesh=None, opted=False)
    rec.namespaces.append(ns)
    core, batch = f"/api/v1/namespaces/{ns}", f"/apis/batch/v1/namespaces/{ns}"
    job = {"spec": {"suspend": True, "template": {"spec": {  # suspended: the Job controller makes no pod
        "restartPolicy": "Never", "containers": [{"name": "c", "image": env.images.busybox}]}}}}
    creates = {
        f"{core}/configmaps/c1": {"metadata": {"name": "c1", "finalizers": [_HOLD]}},
        f"{batch}/jobs/j1": {"metadata": {"name": "j1"}, **job},
        f"{batch}/jobs/j2": {"metadata": {"name": "j2", "finalizers": [_HOLD]}, **job},
        f"{core}/pods/p1": {"metadata": {"name": "p1"}, "spec": {
            "nodeName": _nowhere(ns), "terminationGracePeriodSeconds": 20,
            "containers": [{"name": "c", "image": env.images.busybox}]}},
    }
    c1, j1, j2, p1 = creates
    # (what, method, path, body, content type)
    steps: list[tuple[str, str, str, Any, str]] = [
        ("an unknown policy", "DELETE", f"{core}/configmaps/none", {"propagationPolicy": "Nope"}, "application/json"),
        ("a policy and orphanDependents", "DELETE", f"{core}/configmaps/none",
         {"propagationPolicy": "Orphan", "orphanDependents": True}, "application/json"),
        ("nothing there", "DELETE", f"{core}/configmaps/none", None, "application/json"),
        ("another uid", "DELETE", c1, {"preconditions": {"uid": "x", "resourceVersion": "1"}}, "application/json"),
        ("another resourceVersion", "DELETE", c1, {"preconditions": {"resourceVersion": "1"}}, "application/json"),
        ("a dry run", "DELETE", f"{c1}?dryRun=All", None, "application/json"),
        ("after the dry run", "GET", c1, None, "application/json"),
        ("held by its finalizer", "DELETE", c1, None, "application/json"),
        ("deleted again", "DELETE", c1, {"propagationPolicy": "Background"}, "application/json"),
        ("a finalizer added", "PATCH", c1, {"metadata": {"finalizers": [_HOLD, "example.com/new"]}}, MERGE),
        ("its finalizer removed", "PATCH", c1, {"metadata": {"finalizers": None}}, MERGE),
        ("gone", "GET", c1, None, "application/json"),
        ("a Job's dry run", "DELETE", f"{j1}?dryRun=All", None, "application/json"),
        ("a Job's dry run in the background", "DELETE", f"{j1}?dryRun=All&propagationPolicy=Background", None,
         "application/json"),
        ("after the dry runs", "GET", j1, None, "application/json"),
        ("a Job's uid", "DELETE", j1, {"preconditions": {"uid": "x"}}, "application/json"),
        ("a Job by default", "DELETE", j1, None, "application/json"),
        ("a held Job in the foreground", "DELETE", j2, {"propagationPolicy": "Foreground"}, "application/json"),
        ("a pod's uid", "DELETE", p1, {"preconditions": {"uid": "x"}}, "application/json"),
        ("a pod's dry run", "DELETE", f"{p1}?dryRun=All", None, "application/json"),
        ("after the pod's dry run", "GET", p1, None, "application/json"),
        ("a pod orphaned", "DELETE", p1, {"propagationPolicy": "Orphan", "gracePeriodSeconds": 0}, "application/json"),
    ]
    served = _Served(ns)
    sides = {"apiserver": env.kube.http, "double": served.http}
    own: dict[str, dict[str, dict[str, str]]] = {side: {} for side in sides}
    agreed = []
    try:
        for path, body in creates.items():
            for side, http in sides.items():
                code, made = _answer(http, "POST", path.rpartition("/")[0], body, "application/json")
                assert code == 201, f"{side}: {path}: {code} {made}"
                own[side][path] = {"uid": made["metadata"]["uid"], "rv": made["metadata"]["resourceVersion"]}
        for what, method, path, body, ctype in steps:
            got = {side: _deletion(*_answer(http, method, path, body, ctype), own[side].get(path.partition("?")[0], {}))
                   for side, http in sides.items()}
            assert got["apiserver"] == got["double"], f"{what}: {got}"
            agreed.append(f"{what} {got['double'][0]}")
    finally:
        for path in (j1, j2, p1):  # the cluster's garbage collector may have taken theirs already
            env.kube.http.request("PATCH", path, content=json.dumps({"metadata": {"finalizers": None}}),
                                  headers={"Content-Type": MERGE})
        served.close()
    rec.note("the apiserver and the double agree: " + "; ".join(agreed))


@scenario("double-namespaces")
def double_namespaces(env: Env, rec: Record) -> None:
    """A namespace's deletion as the double models it (no namespace controller runs beside
    it), against the apiserver: deleted, it answers 200 with itself Terminating (its
    `deletionTimestamp` set, `spec.finalizers` kept), and so again; a ConfigMap or an Event
    created in it then is refused (403, the NamespaceLifecycle's message), an update of an
    object in it is not. In a namespace never made, a create is 404 naming the namespace
    (an invalid object's too), and so is a Lease's PUT (which creates), while a ConfigMap's
    PUT is its own 404. The apiserver's namespace controller is held back meanwhile by a
    ConfigMap a finalizer of this scenario holds, removed at the end."""
    ns = env.namespace("dns", mesh=None, opted=False)
    rec.namespaces.append(ns)
    served = _Served()
    sides = {"apiserver": env.kube.http, "double": served.http}
    base, never = f"/api/v1/namespaces/{ns}", f"/api/v1/namespaces/{ns}-never"
    held = {"metadata": {"name": "held", "finalizers": [_HOLD]}}

    def ns_state(code: int, answer: dict) -> tuple:
        meta = answer.get("metadata") or {}
        return (code, answer.get("kind"), (answer.get("status") or {}).get("phase"),
                (answer.get("spec") or {}).get("finalizers"), "deletionTimestamp" in meta,
                meta.get("deletionGracePeriodSeconds"), meta.get("finalizers"))

    try:
        code, made = _answer(served.http, "POST", "/api/v1/namespaces", {"metadata": {"name": ns}}, "application/json")
        assert code == 201, made
        for side, http in sides.items():
            code, made = _answer(http, "POST", f"{base}/configmaps", held, "application/json")
            assert code == 201, f"{side}: {code} {made}"
        steps: list[tuple[str, str, str, Any, str, Callable[[int, dict], tuple]]] = [
            ("the namespace", "GET", base, None, "application/json", ns_state),
            ("deleted", "DELETE", base, None, "application/json", ns_state),
            ("deleted again", "DELETE", base, None, "application/json", ns_state),
            ("after", "GET", base, None, "application/json", ns_state),
            ("a ConfigMap created in it", "POST", f"{base}/configmaps", {"metadata": {"name": "new"}},
             "application/json", _deletion),
            ("an Event created in it", "POST", f"{base}/events", {
                "metadata": {"name": "e"}, "involvedObject": {"kind": "Pod", "name": "p", "namespace": ns},
                "reason": "R"}, "application/json", _deletion),
            ("an update in it", "PATCH", f"{base}/configmaps/held", {"data": {"k": "v"}}, MERGE,
             lambda code, answer: (code, answer.get("data"))),
            ("a ConfigMap created in a namespace never made", "POST", f"{never}/configmaps",
             {"metadata": {"name": "new"}}, "application/json", _deletion),
            ("an invalid one", "POST", f"{never}/configmaps", {"metadata": {"name": "New_"}}, "application/json",
             _deletion),
            ("a Lease put there", "PUT", f"/apis/coordination.k8s.io/v1/namespaces/{ns}-never/leases/l",
             {"metadata": {"name": "l"}, "spec": {}}, "application/json", _deletion),
            ("a ConfigMap put there", "PUT", f"{never}/configmaps/new", {"metadata": {"name": "new"}},
             "application/json", _deletion),
        ]
        agreed = []
        for what, method, path, body, ctype, view in steps:
            got = {side: view(*_answer(http, method, path, body, ctype)) for side, http in sides.items()}
            assert got["apiserver"] == got["double"], f"{what}: {got}"
            agreed.append(f"{what} {got['double'][0]}")
        rec.note("the apiserver and the double agree: " + "; ".join(agreed))
    finally:
        env.kube.http.request("PATCH", f"{base}/configmaps/held", headers={"Content-Type": MERGE},
                              content=json.dumps({"metadata": {"finalizers": None}}))
        served.close()


# Secret values the apiserver decodes with Go's base64 (the double ports its decoder).
_SECRET_VALUES = ("YWI=", "YWJjZGV=", "YWJj\nZGVm", "YQ==\n", "", "YQ", "YQ=", "Y===", "YQ==YQ==", "YWJjZA", "YW Jj",
                  "YWJjZA=", "abc=d", "Y", "YWJjZ", "é")


def _said(code: int, answer: dict) -> tuple:
    """An answer's code, and an error's message."""
    return code, answer.get("message") if code >= 400 else None


def _coded(code: int, answer: dict) -> tuple:
    """An answer's code alone (where the message quotes Go's JSON parser or the whole object)."""
    return (code,)


@scenario("double-secrets")
def double_secrets(env: Env, rec: Record) -> None:
    """Secrets as the double decodes and validates them, against the apiserver (self-managed
    certificates and pull secrets are Secrets): each value of `_SECRET_VALUES` decoded as Go
    decodes base64 (stored the same, or refused 400 at the same byte), `stringData` merged,
    the type defaulted; a type's required keys, bad keys, the size limit, a patch that drops
    a required key, changes the type, undecodable values in a patch (422) and an immutable
    Secret's data; the same status code, and the same message where it does not quote Go's
    JSON parser or the whole object; initshift's own Secret write (`write_secret`: create,
    409, conditional JSON patch with a current and a stale resourceVersion) too."""
    ns = env.namespace("dsec", mesh=None, opted=False)
    rec.namespaces.append(ns)
    served = _Served(ns)
    sides = {"apiserver": env.kube.http, "double": served.http}
    base, json_ct = f"/api/v1/namespaces/{ns}/secrets", "application/json"
    tls = {"tls.crt": "Yw==", "tls.key": "aw=="}

    def secret(name: str, data: dict | None = None, kind: str | None = None, **more: Any) -> dict:
        return {"metadata": {"name": name}, **({"data": data} if data is not None else {}),
                **({"type": kind} if kind is not None else {}), **more}

    def stored(code: int, answer: dict) -> tuple:
        return code, answer.get("type"), answer.get("data"), "stringData" in answer

    steps: list[tuple[str, str, str, Any, str, Callable[[int, dict], tuple]]] = [
        (f"value {value!r}", "POST", base, secret(f"v{i}", {"a": value}), json_ct,
         stored if i < 5 else _said) for i, value in enumerate(_SECRET_VALUES)]
    steps += [
        ("stringData", "POST", base, secret("s", {"k": "eA==", "j": "eQ=="}, stringData={"k": "plain"}), json_ct,
         stored),
        ("no type", "POST", base, secret("o", {}), json_ct, stored),
        ("tls without keys", "POST", base, secret("t0", {}, "kubernetes.io/tls"), json_ct, _said),
        ("tls without its key", "POST", base, secret("t0", {"tls.crt": "Yw=="}, "kubernetes.io/tls"), json_ct, _said),
        ("basic-auth with neither", "POST", base, secret("b", {}, "kubernetes.io/basic-auth"), json_ct, _said),
        ("basic-auth with a password", "POST", base, secret("b", {"password": "cA=="}, "kubernetes.io/basic-auth"),
         json_ct, stored),
        ("ssh-auth without its key", "POST", base, secret("h", {}, "kubernetes.io/ssh-auth"), json_ct, _said),
        ("a service account token without its account", "POST", base,
         secret("a", {}, "kubernetes.io/service-account-token"), json_ct, _said),
        ("a pull secret of an array", "POST", base,
         secret("d", {".dockerconfigjson": "WzFd"}, "kubernetes.io/dockerconfigjson"), json_ct, _said),
        ("a pull secret that is no JSON", "POST", base,
         secret("d", {".dockerconfigjson": "bm9wZQ=="}, "kubernetes.io/dockerconfigjson"), json_ct, _coded),
        ("a pull secret", "POST", base,
         secret("d", {".dockerconfigjson": "eyJhdXRocyI6e319"}, "kubernetes.io/dockerconfigjson"), json_ct, stored),
        ("a key '.'", "POST", base, secret("k", {".": ""}), json_ct, _said),
        ("a key 'a/b'", "POST", base, secret("k", {"a/b": ""}), json_ct, _said),
        ("over 1 MiB", "POST", base, secret("k", {"a": "eHh4" * 349526}), json_ct, _coded),
        # initshift's write_secret, as the self-managed certificates write theirs
        ("the serving Secret", "POST", base, secret("t", tls, "kubernetes.io/tls"), json_ct, stored),
        ("again", "POST", base, secret("t", tls, "kubernetes.io/tls"), json_ct, _said),
        ("its data replaced, at its resourceVersion", "PATCH", f"{base}/t",
         [{"op": "add", "path": "/data", "value": {**tls, "ca.crt": "YQ=="}},
          {"op": "add", "path": "/metadata/resourceVersion", "value": _CURRENT}], JSON_PATCH, stored),
        ("at a stale one", "PATCH", f"{base}/t", [{"op": "add", "path": "/data", "value": tls},
                                                  {"op": "add", "path": "/metadata/resourceVersion",
                                                   "value": _STALE}], JSON_PATCH, _said),
        ("its key dropped", "PATCH", f"{base}/t", [{"op": "remove", "path": "/data/tls.key"}], JSON_PATCH, _said),
        ("its type changed", "PATCH", f"{base}/t", {"type": "Opaque"}, MERGE, _said),
        ("a value no base64", "PATCH", f"{base}/t", {"data": {"tls.crt": "ab!c"}}, MERGE, _coded),
        ("an immutable Secret", "POST", base, secret("i", {"a": "eA=="}, immutable=True), json_ct, stored),
        ("its data changed", "PATCH", f"{base}/i", {"data": {"a": "eQ=="}}, MERGE, _said),
        ("made mutable", "PATCH", f"{base}/i", {"immutable": False}, MERGE, _said),
    ]
    versions: dict[str, list[str]] = {side: [] for side in sides}
    agreed = []
    try:
        for what, method, path, body, ctype, view in steps:
            got = {}
            for side, http in sides.items():
                text = json.dumps(body)
                if versions[side]:
                    text = text.replace(_CURRENT, versions[side][-1]).replace(_STALE, versions[side][0])
                code, answer = _answer(http, method, path, json.loads(text), ctype)
                if path.endswith("/t") or (code == 201 and answer["metadata"]["name"] == "t"):
                    if code in (200, 201):
                        versions[side].append(answer["metadata"]["resourceVersion"])
                got[side] = view(code, answer)
            assert got["apiserver"] == got["double"], f"{what}: {got}"
            agreed.append(f"{what} {got['double'][0]}")
    finally:
        served.close()
    rec.note("the apiserver and the double agree: " + "; ".join(agreed))


@scenario("double-webhook-configurations")
def double_webhook_configurations(env: Env, rec: Record) -> None:
    """Webhook configurations as the double decodes and validates them, against the
    apiserver (initshift's certificates write the caBundle of its own): a caBundle decoded
    as Go's base64 decodes it (stored re-encoded or left out when empty; an undecodable one
    400 at the same byte), a PUT of the object as read leaving its resourceVersion, a stale
    one 409; each webhook's name, one of url or service, sideEffects and
    admissionReviewVersions (422, the same words); the same status code and message."""
    served = _Served()
    sides = {"apiserver": env.kube.http, "double": served.http}
    prefix = f"e2e-{env.namespace('dwhc', mesh=None, opted=False)}"
    base = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"

    def hook(name: str = "pods.initshift.io", **change: Any) -> dict:
        made = {"name": name, "clientConfig": {"service": {"namespace": "initshift-system", "name": "initshift",
                                                           "path": "/mutate"}},
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
                "sideEffects": "None", "admissionReviewVersions": ["v1"], "failurePolicy": "Ignore",
                # no object matches: the configuration is never called
                "objectSelector": {"matchLabels": {"e2e.initshift.io/never": "true"}}}
        made.update(change)
        return {key: value for key, value in made.items() if value is not None}

    def config(name: str, *hooks: dict) -> dict:
        return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": f"{prefix}-{name}"}, "webhooks": list(hooks)}

    read: dict[str, dict] = {}

    def with_bundle(side: str, bundle: str | None, version: str = "now") -> dict:
        obj = json.loads(json.dumps(read[side][version]))
        obj["webhooks"][0]["clientConfig"]["caBundle"] = bundle
        return obj

    agreed = []
    try:
        for side, http in sides.items():
            code, obj = _answer(http, "POST", base, config("a", hook()), "application/json")
            assert code == 201, f"{side}: {code} {obj}"
            read[side] = {"first": obj, "now": obj}
        puts: list[tuple[str, str | None]] = [("the object as read", "<keep>"), ("a caBundle", "Q0E="),
                                              ("one with a line end", "Q0E=\n"), ("an empty one", ""),
                                              ("one no base64", "Q0E"), ("one at a stale resourceVersion", "<stale>")]
        for what, bundle in puts:
            got = {}
            for side, http in sides.items():
                if bundle == "<keep>":
                    body = read[side]["now"]
                elif bundle == "<stale>":
                    body = with_bundle(side, "Q0I=", "first")
                else:
                    body = with_bundle(side, bundle)
                code, answer = _answer(http, "PUT", f"{base}/{prefix}-a", body, "application/json")
                moved = None
                if code == 200:
                    moved = answer["metadata"]["resourceVersion"] != read[side]["now"]["metadata"]["resourceVersion"]
                    read[side]["now"] = answer
                    bundle_now = answer["webhooks"][0].get("clientConfig", {}).get("caBundle", "<none>")
                    got[side] = (code, moved, bundle_now)
                else:
                    got[side] = _said(code, answer)
            assert got["apiserver"] == got["double"], f"{what}: {got}"
            agreed.append(f"{what} {got['double'][0]}")
        creates = [("no sideEffects", config("b", hook(sideEffects=None))),
                   ("sideEffects Some", config("c", hook(sideEffects="Some"))),
                   ("a name of two segments", config("d", hook("pods.initshift"))),
                   ("a name with capitals", config("e", hook("Pods.initshift.io"))),
                   ("a name twice", config("f", hook(), hook())),
                   ("no url or service", config("g", hook(clientConfig={}))),
                   ("a url and a service", config("h", hook(clientConfig={
                       "url": "https://example.com/mutate",
                       "service": {"namespace": "initshift-system", "name": "initshift"}}))),
                   ("no admissionReviewVersions", config("i", hook(admissionReviewVersions=None))),
                   ("two webhooks wrong", config("j", hook("one"), hook("two.initshift.io", sideEffects=None))),
                   ("no webhooks", config("k"))]
        for what, body in creates:
            got = {side: _said(*_answer(http, "POST", base, body, "application/json")) for side, http in sides.items()}
            assert got["apiserver"] == got["double"], f"{what}: {got}"
            agreed.append(f"{what} {got['double'][0]}")
    finally:
        served.close()
        for name in "abcdefghijk":
            env.kube.http.request("DELETE", f"{base}/{prefix}-{name}")
    rec.note("the apiserver and the double agree: " + "; ".join(agreed))
