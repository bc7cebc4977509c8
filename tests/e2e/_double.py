"""The in-process API double (tests/support/kubedouble.py) against the real apiserver: a
rule the watcher's fast tests rely on, taken from what a real apiserver did, is checked
here on every version the e2e runs, by sending the same requests to both."""

from __future__ import annotations

import asyncio
import json
import threading
from datetime import datetime, timezone
from typing import Any, Callable

import httpx

from tests.support.kubedouble import KubeDouble

from ._env import Env, Record, scenario

_HOLD = "example.com/hold"


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

    def __init__(self) -> None:
        self.double = KubeDouble()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.double.start(), self._loop).result(30)
        self.http = httpx.Client(base_url=self.double.url, timeout=30.0)

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
    served = _Served()
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
    status code."""
    ns = env.namespace("devt", mesh=None, opted=False)
    rec.namespaces.append(ns)
    served = _Served()

    def event(name: str, involved_ns: str) -> dict:
        return {"apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": ns},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": involved_ns, "name": "build-1"},
                "reason": "StepsSucceeded", "message": "Succeeded", "type": "Normal",
                "source": {"component": "initshift-watcher"}, "reportingComponent": "initshift.io/watcher",
                "reportingInstance": "e2e", "action": "outcome", "firstTimestamp": "2026-12-01T10:00:00Z",
                "lastTimestamp": "2026-12-01T10:00:00Z", "count": 1}

    cases = [("the watcher's Event", event("build-1.0123456789ab", ns)),
             ("the same again", event("build-1.0123456789ab", ns)),
             ("a name with capitals", event("Build-1.0123456789ab", ns)),
             ("a name with a space", event("build 1.0123456789ab", ns)),
             ("a name of 300 characters", event("b" * 300, ns)),
             ("a name with '%'", event("build%1", ns)),
             ("the name '..'", event("..", ns)),
             ("another namespace's pod", event("build-1.abcdef012345", "default")),
             ("no involvedObject namespace", event("build-1.abcdef012346", ""))]
    agreed = []
    try:
        for what, body in cases:
            got = {side: _answer(http, "POST", f"/api/v1/namespaces/{ns}/events", body, "application/json")[0]
                   for side, http in (("apiserver", env.kube.http), ("double", served.http))}
            assert got["apiserver"] == got["double"], f"{what}: {got}"
            agreed.append(f"{what} {got['double']}")
    finally:
        served.close()
    rec.note("the apiserver and the double agree: " + "; ".join(agreed))


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
    served = _Served()
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
            # (finalizers: an empty list the apiserver leaves out, the double keeps)
            seen[side] = [(e["type"], m["name"], m.get("deletionGracePeriodSeconds"), m.get("finalizers") or None)
                          for e in events for m in (e["object"]["metadata"],)]
    finally:
        served.close()
    assert seen["apiserver"] == seen["double"], seen
    rec.note(f"the apiserver and the double agree: {', '.join(f'{e[0]} {e[1]}' for e in seen['double'])}")
