"""The API double behaves like the apiserver where tests rely on it."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import datetime, timedelta, timezone
from typing import Any, AsyncIterator

import aiohttp
import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import watch as k8s_watch

from tests.support.kubedouble import KubeDouble, label_matcher, merge_patch, running, terminated
from webhook.kube._api import KubeError

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
BOUND = 10.0


@pytest.fixture
def kube(kube: KubeDouble) -> KubeDouble:
    """The shared double, with the namespaces these tests write into made."""
    for name in ("ns", "sys"):
        kube.make_namespace(name)
    return kube


@pytest.fixture
async def http(kube: KubeDouble) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=kube.url) as session:
        yield session


def pod(name: str, ns: str = "ns", labels: dict | None = None, containers: tuple[str, ...] = ("main",)) -> dict:
    return {"metadata": {"name": name, "namespace": ns, "labels": labels or {}},
            "spec": {"containers": [{"name": c, "image": "busybox"} for c in containers]}}


async def call(http: aiohttp.ClientSession, method: str, path: str, body: Any = None,
               ctype: str = "application/json", **params: str) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body)
    async with http.request(method, path, data=data, params=params, headers={"Content-Type": ctype}) as r:
        text = await r.text()
        return r.status, json.loads(text) if text and r.content_type == "application/json" else text


def test_merge_patch_is_rfc7386() -> None:
    target = {"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]}
    assert merge_patch(target, {"a": "z", "c": {"f": None}, "l": [3]}) == {"a": "z", "c": {"d": "e"}, "l": [3]}
    assert merge_patch({"a": "b"}, {"a": {"x": None}}) == {"a": {}}
    assert target["c"] == {"d": "e", "f": "g"}  # never mutated


@pytest.mark.parametrize("selector,expected", [
    ("app=web", ["a"]), ("app==web", ["a"]), ("app!=web", ["b", "c"]), ("app in (web, db)", ["a", "b"]),
    ("app notin (web)", ["b", "c"]), ("tier", ["a"]), ("!tier", ["b", "c"]), ("app=web,tier=front", ["a"]),
    ("", ["a", "b", "c"]),
])
def test_label_selectors(selector: str, expected: list[str]) -> None:
    labels = {"a": {"app": "web", "tier": "front"}, "b": {"app": "db"}, "c": {}}
    match = label_matcher(selector)
    assert [n for n, lb in labels.items() if match(lb)] == expected


async def test_list_across_namespaces_with_selectors(kube: KubeDouble, http: aiohttp.ClientSession) -> None:
    kube.put_pod(pod("a", "one", {"app": "web"}))
    kube.put_pod(pod("b", "two", {"app": "web"}))
    kube.put_pod(pod("c", "two", {"app": "db"}))
    status, body = await call(http, "GET", "/api/v1/pods", labelSelector="app=web")
    assert status == 200 and [i["metadata"]["name"] for i in body["items"]] == ["a", "b"]
    assert body["metadata"]["resourceVersion"] == str(kube.resource_version)
    _, body = await call(http, "GET", "/api/v1/namespaces/two/pods")
    assert [i["metadata"]["name"] for i in body["items"]] == ["b", "c"]
    _, body = await call(http, "GET", "/api/v1/pods", fieldSelector="metadata.name=c")
    assert [i["metadata"]["name"] for i in body["items"]] == ["c"]
    status, body = await call(http, "GET", "/api/v1/pods", labelSelector="app in (web")
    assert status == 400 and body["kind"] == "Status"


async def test_create_get_conflicts_and_generate_name(kube: KubeDouble, http: aiohttp.ClientSession) -> None:
    status, created = await call(http, "POST", "/api/v1/namespaces/ns/pods", pod("x"))
    assert status == 201 and created["status"]["phase"] == "Pending" and created["metadata"]["uid"]
    status, body = await call(http, "POST", "/api/v1/namespaces/ns/pods", pod("x"))
    assert status == 409 and body["reason"] == "AlreadyExists"
    status, body = await call(http, "POST", "/api/v1/namespaces/ns/pods",
                              {"metadata": {"generateName": "build-"}, "spec": {"containers": []}})
    assert status == 201 and body["metadata"]["name"].startswith("build-") and len(body["metadata"]["name"]) == 11
    status, body = await call(http, "GET", "/api/v1/namespaces/ns/pods/nope")
    assert status == 404 and body["reason"] == "NotFound" and body["code"] == 404
    status, _ = await call(http, "GET", "/api/v1/namespaces/ns/widgets")
    assert status == 404


async def test_merge_patch_semantics(kube: KubeDouble, http: aiohttp.ClientSession) -> None:
    p0 = kube.put_pod({**pod("m"), "metadata": {"name": "m", "namespace": "ns", "annotations": {"keep": "1", "drop": "2"}}})
    rv0 = p0["metadata"]["resourceVersion"]
    status, body = await call(http, "PATCH", "/api/v1/namespaces/ns/pods/m",
                              {"metadata": {"annotations": {"drop": None, "new": "3"}}}, MERGE)
    assert status == 200 and body["metadata"]["annotations"] == {"keep": "1", "new": "3"}
    assert int(body["metadata"]["resourceVersion"]) > int(rv0)
    # Conditional on a stale resourceVersion: 409 and nothing changes.
    status, body = await call(http, "PATCH", "/api/v1/namespaces/ns/pods/m",
                              {"metadata": {"resourceVersion": rv0, "annotations": {"x": "y"}}}, MERGE)
    assert status == 409 and body["reason"] == "Conflict"
    assert "x" not in kube.pod("ns", "m")["metadata"]["annotations"]
    # A no-op patch does not bump the resourceVersion.
    rv1 = kube.pod("ns", "m")["metadata"]["resourceVersion"]
    status, body = await call(http, "PATCH", "/api/v1/namespaces/ns/pods/m", {"metadata": {"annotations": {"keep": "1"}}},
                              MERGE)
    assert status == 200 and body["metadata"]["resourceVersion"] == rv1
    # A merge patch also works on a pod without annotations.
    kube.put_pod(pod("bare"))
    status, body = await call(http, "PATCH", "/api/v1/namespaces/ns/pods/bare", {"metadata": {"annotations": {"a": "b"}}},
                              MERGE)
    assert status == 200 and body["metadata"]["annotations"] == {"a": "b"}
    status, _ = await call(http, "PATCH", "/api/v1/namespaces/ns/pods/m", {"metadata": {}},
                           "application/strategic-merge-patch+json")
    assert status == 415
    status, body = await call(http, "PATCH", "/api/v1/namespaces/ns/pods/m",
                              [{"op": "add", "path": "/metadata/labels", "value": {"j": "p"}}],
                              JSON_PATCH)
    assert status == 200 and body["metadata"]["labels"] == {"j": "p"}


async def test_labels_are_validated_on_every_write(kube: KubeDouble, http: aiohttp.ClientSession) -> None:
    """As the apiserver: a value ending in "-" (a generateName copied into a label) is 422."""
    status, body = await call(http, "POST", "/api/v1/namespaces/ns/pods", pod("x", labels={"app": "smoke-"}))
    assert status == 422 and 'metadata.labels: Invalid value: "smoke-"' in body["message"]
    assert (await call(http, "POST", "/api/v1/namespaces/ns/pods", pod("x", labels={"a/b/c": "v"})))[0] == 422
    ok = {"app.kubernetes.io/name": "smoke", "e": "", "x": "a_b.c-1"}
    assert (await call(http, "POST", "/api/v1/namespaces/ns/pods", pod("x", labels=ok)))[0] == 201
    status, _ = await call(http, "PATCH", "/api/v1/namespaces/ns/pods/x", {"metadata": {"labels": {"v": "x" * 64}}},
                           MERGE)
    assert status == 422


async def test_pod_update_rules(kube: KubeDouble, http: aiohttp.ClientSession) -> None:
    kube.put_pod(pod("r"))
    path = "/api/v1/namespaces/ns/pods/r"
    status, body = await call(http, "PATCH", path, {"spec": {"activeDeadlineSeconds": 5}}, MERGE)
    assert status == 200 and body["spec"]["activeDeadlineSeconds"] == 5
    assert (await call(http, "PATCH", path, {"spec": {"activeDeadlineSeconds": 1}}, MERGE))[0] == 200
    status, body = await call(http, "PATCH", path, {"spec": {"activeDeadlineSeconds": 10}}, MERGE)
    assert status == 422 and body["reason"] == "Invalid"
    assert (await call(http, "PATCH", path, {"spec": {"activeDeadlineSeconds": 0}}, MERGE))[0] == 422
    assert (await call(http, "PATCH", path, {"spec": {"restartPolicy": "Always"}}, MERGE))[0] == 422
    status, body = await call(http, "PATCH", path, {"spec": {"containers": [{"name": "main", "image": "alpine"}]}},
                              MERGE)
    assert status == 200 and body["spec"]["containers"][0]["image"] == "alpine"
    # Status is not written through the main resource, only through /status.
    status, body = await call(http, "PATCH", path, {"status": {"phase": "Running"}}, MERGE)
    assert status == 200 and body["status"]["phase"] == "Pending"
    status, body = await call(http, "PATCH", path + "/status", {"status": {"phase": "Running"}}, MERGE)
    assert status == 200 and body["status"]["phase"] == "Running"


async def _read_events(resp: aiohttp.ClientResponse, n: int) -> list[dict]:
    out = []
    while len(out) < n:
        line = await asyncio.wait_for(resp.content.readline(), BOUND)
        assert line, f"stream ended after {out}"
        out.append(json.loads(line))
    return out


async def test_watch_replays_streams_and_expires(kube: KubeDouble, http: aiohttp.ClientSession) -> None:
    sel = {"labelSelector": "app=web"}
    kube.put_pod(pod("w1", labels={"app": "web"}))
    rv = str(kube.resource_version)
    kube.put_pod(pod("w2", labels={"app": "web"}))  # after rv: replayed
    kube.put_pod(pod("other", labels={"app": "db"}))  # filtered out
    async with http.get("/api/v1/namespaces/ns/pods", params={"watch": "true", "resourceVersion": rv, **sel}) as r:
        events = await _read_events(r, 1)
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "w2")]
        kube.set_container_statuses("ns", "w1", [running("main")], phase="Running")
        w2 = kube.pod("ns", "w2")
        w2["metadata"]["labels"] = {"app": "db"}  # leaves the selection: DELETED
        kube.put_pod(w2)
        kube.delete("pods", "ns", "w1")
        events = await _read_events(r, 3)
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == \
            [("MODIFIED", "w1"), ("DELETED", "w2"), ("DELETED", "w1")]
        assert int(events[0]["object"]["metadata"]["resourceVersion"]) < int(events[2]["object"]["metadata"]["resourceVersion"])
    # No resourceVersion: synthetic ADDED for what exists.
    async with http.get("/api/v1/pods", params={"watch": "true", "timeoutSeconds": "1"}) as r:
        events = await _read_events(r, 2)
        assert {e["object"]["metadata"]["name"] for e in events} == {"w2", "other"}
        assert await asyncio.wait_for(r.content.readline(), BOUND) == b""  # timeoutSeconds ends it
    kube.compact()
    async with http.get("/api/v1/pods", params={"watch": "true", "resourceVersion": rv}) as r:
        (event,) = await _read_events(r, 1)
        assert event["type"] == "ERROR" and event["object"]["code"] == 410


async def test_drop_watches_cuts_the_connection(kube: KubeDouble, http: aiohttp.ClientSession) -> None:
    kube.put_pod(pod("d"))
    async with http.get("/api/v1/pods", params={"watch": "true"}) as r:
        await _read_events(r, 1)
        assert kube.drop_watches() == 1
        with pytest.raises(aiohttp.ClientError):
            while await asyncio.wait_for(r.content.readline(), BOUND):
                pass
    assert kube.open_watches == 0


async def test_fault_injection(kube: KubeDouble, http: aiohttp.ClientSession) -> None:
    kube.put_pod(pod("f"))
    kube.fail_next("/api/v1/namespaces/ns/pods", 500, times=2, method="GET")
    assert (await call(http, "GET", "/api/v1/namespaces/ns/pods/f"))[0] == 500  # below the path: matches
    assert (await call(http, "PATCH", "/api/v1/namespaces/ns/pods/f", {}, MERGE))[0] == 200  # other method
    assert (await call(http, "GET", "/api/v1/namespaces/ns/pods"))[0] == 500
    assert (await call(http, "GET", "/api/v1/namespaces/ns/pods"))[0] == 200  # used up
    kube.fail_next("/api/v1/pods", 410, watch=True)
    assert (await call(http, "GET", "/api/v1/pods"))[0] == 200  # not a watch
    async with http.get("/api/v1/pods", params={"watch": "true"}) as r:
        (event,) = await _read_events(r, 1)
        assert event["type"] == "ERROR" and event["object"]["reason"] == "Expired"
    assert [r.status for r in kube.requests[-2:]] == [200, 200]


async def test_events_leases_and_cluster_objects(kube: KubeDouble, http: aiohttp.ClientSession) -> None:
    kube.put_pod(pod("e"))
    ev = {"metadata": {"generateName": "e."}, "involvedObject": {"kind": "Pod", "name": "e", "namespace": "ns"},
          "reason": "R"}
    assert (await call(http, "POST", "/api/v1/namespaces/ns/events", ev))[0] == 201
    new = {"metadata": {"name": "e.2"}, "regarding": {"kind": "Pod", "name": "e"}, "reason": "S"}
    assert (await call(http, "POST", "/apis/events.k8s.io/v1/namespaces/ns/events", new))[0] == 422  # no namespace
    new["regarding"]["namespace"] = "ns"
    assert (await call(http, "POST", "/apis/events.k8s.io/v1/namespaces/ns/events", new))[0] == 201
    assert [e["reason"] for e in kube.events_for("ns", "e")] == ["R", "S"]
    leases = "/apis/coordination.k8s.io/v1/namespaces/sys/leases"
    status, lease = await call(http, "POST", leases, {"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}})
    assert status == 201
    lease["spec"]["holderIdentity"] = "b"
    status, updated = await call(http, "PUT", f"{leases}/l", lease)
    assert status == 200 and updated["spec"]["holderIdentity"] == "b"
    status, _ = await call(http, "PUT", f"{leases}/l", lease)  # the old resourceVersion again
    assert status == 409
    kube.put_node("n1", "v1.29.4")
    _, nodes = await call(http, "GET", "/api/v1/nodes")
    assert nodes["items"][0]["status"]["nodeInfo"]["kubeletVersion"] == "v1.29.4"
    kube.put("secrets", {"metadata": {"name": "s", "namespace": "ns"}, "data": {"k": "dg=="}})
    assert (await call(http, "GET", "/api/v1/namespaces/ns/secrets/s"))[1]["data"] == {"k": "dg=="}
    kube.put("serviceaccounts", {"metadata": {"name": "default", "namespace": "ns"}})
    assert (await call(http, "GET", "/api/v1/namespaces/ns/serviceaccounts/default"))[0] == 200
    kube.put("mutatingwebhookconfigurations", {"metadata": {"name": "w"}, "webhooks": [{
        "name": "x.example.com", "clientConfig": {"url": "https://x.example.com"}, "sideEffects": "None",
        "admissionReviewVersions": ["v1"]}]})
    mwc = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/w"
    status, body = await call(http, "PATCH", mwc, [{"op": "add", "path": "/webhooks/0/clientConfig/caBundle",
                                                    "value": "Q0E="}], JSON_PATCH)
    assert status == 200 and body["webhooks"][0]["clientConfig"]["caBundle"] == "Q0E="
    status, version = await call(http, "GET", "/version")
    assert status == 200 and version["gitVersion"] == "v1.30.2" and version["minor"] == "30"


async def test_pod_logs(kube: KubeDouble, http: aiohttp.ClientSession) -> None:
    kube.put_pod(pod("l", containers=("step", "proxy")))
    status, body = await call(http, "GET", "/api/v1/namespaces/ns/pods/l/log", container="step")
    assert status == 400 and "waiting to start" in body["message"]  # no log before the container starts
    kube.set_container_statuses("ns", "l", [running("step"), running("proxy")], phase="Running")
    kube.append_log("ns", "l", "step", "one")
    kube.append_log("ns", "l", "step", "two\n")
    status, text = await call(http, "GET", "/api/v1/namespaces/ns/pods/l/log", container="step")
    assert status == 200 and text == "one\ntwo\n"
    assert (await call(http, "GET", "/api/v1/namespaces/ns/pods/l/log", container="step", tailLines="1"))[1] == "two\n"
    status, body = await call(http, "GET", "/api/v1/namespaces/ns/pods/l/log")
    assert status == 400 and "choose one of" in body["message"]
    async with http.get("/api/v1/namespaces/ns/pods/l/log", params={"container": "step", "follow": "true"}) as r:
        assert await asyncio.wait_for(r.content.readline(), BOUND) == b"one\n"
        assert await asyncio.wait_for(r.content.readline(), BOUND) == b"two\n"
        kube.append_log("ns", "l", "step", "three")
        assert await asyncio.wait_for(r.content.readline(), BOUND) == b"three\n"
        kube.end_log("ns", "l", "step")
        assert await asyncio.wait_for(r.content.readline(), BOUND) == b""
    kube.append_log("ns", "l", "proxy", "p1")
    async with http.get("/api/v1/namespaces/ns/pods/l/log", params={"container": "proxy", "follow": "true"}) as r:
        assert await asyncio.wait_for(r.content.readline(), BOUND) == b"p1\n"
        kube.set_container_statuses("ns", "l", [terminated("proxy", 0)])  # the container stopped
        assert await asyncio.wait_for(r.content.readline(), BOUND) == b""


async def test_pod_logs_since_seconds(kube: KubeDouble, http: aiohttp.ClientSession) -> None:
    """`sinceSeconds`: the lines of the last N seconds; checked as the apiserver checks
    PodLogOptions, before it looks for the pod (v1.34.9's words): a number (400), positive,
    and not beside `sinceTime` (422)."""
    kube.put_pod(pod("l", containers=("step",)))
    kube.set_container_statuses("ns", "l", [running("step")], phase="Running")
    kube.append_log("ns", "l", "step", "old", at="2020-01-01T00:00:00.000000000Z")
    kube.append_log("ns", "l", "step", "new")
    path = "/api/v1/namespaces/ns/pods/l/log"
    assert await call(http, "GET", path, container="step", sinceSeconds="60") == (200, "new\n")
    for query, code, message in [
            ({"sinceSeconds": "5", "sinceTime": "2026-01-01T00:00:00Z"}, 422, 'PodLogOptions "l" is invalid: []: '
             'Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified'),
            ({"sinceSeconds": "0"}, 422, 'PodLogOptions "l" is invalid: sinceSeconds: Invalid value: 0: must be '
             'greater than 0'),
            ({"sinceSeconds": "-3"}, 422, 'PodLogOptions "l" is invalid: sinceSeconds: Invalid value: -3: must be '
             'greater than 0'),
            ({"sinceSeconds": "x"}, 400, 'strconv.ParseInt: parsing "x": invalid syntax')]:
        for where in (path, "/api/v1/namespaces/ns/pods/missing/log"):  # options first, then the pod
            status, body = await call(http, "GET", where, container="step", **query)
            assert (status, body["message"]) == (code, message.replace('"l"', '"missing"') if "missing" in where
                                                 else message)


async def test_kubernetes_asyncio_typed_clients_work(kube: KubeDouble) -> None:
    """Other engineers use the generated clients: models, watch and logs must parse."""
    kube.put_pod(pod("t", labels={"app": "web"}))
    kube.set_container_statuses("ns", "t", [running("main")], phase="Running")
    kube.append_log("ns", "t", "main", "hello")
    async with kube.api_client() as api_client:
        v1 = k8s.CoreV1Api(api_client)
        pods = await v1.list_namespaced_pod("ns", label_selector="app=web")
        assert [p.metadata.name for p in pods.items] == ["t"]
        assert await v1.read_namespaced_pod_log("t", "ns", container="main") == "hello\n"
        w = k8s_watch.Watch()
        async with w.stream(v1.list_namespaced_pod, "ns", timeout_seconds=1) as stream:
            async for event in stream:
                assert event["type"] == "ADDED" and event["object"].metadata.name == "t"
                w.stop()
        version = await k8s.VersionApi(api_client).get_code()
        assert version.git_version == "v1.30.2"


async def test_kube_api_errors_carry_the_status(kube: KubeDouble) -> None:
    api = kube.kube_api()
    try:
        with pytest.raises(KubeError) as err:
            await api.get_pod("ns", "missing")
        assert err.value.not_found and "not found" in err.value.message
        assert await api.get_lease("sys", "missing") is None
        kube.put_pod(pod("k"))
        kube.fail_next("/api/v1/namespaces/ns/pods/k", 409)
        with pytest.raises(KubeError) as err:
            await api.patch_pod("ns", "k", {"metadata": {"labels": {"a": "b"}}})
        assert err.value.conflict
        kube.compact()
        with pytest.raises(KubeError) as err:
            async for _ in api.watch_pods("ns", resource_version="1"):
                pass
        assert err.value.gone
    finally:
        await api.close()
    unreachable = type(api).for_host("http://127.0.0.1:9")
    try:
        with pytest.raises(KubeError) as err:
            await unreachable.list_pods()
        assert err.value.status == 0
    finally:
        await unreachable.close()


SAR = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


def review(user: str, **attrs: str) -> dict:
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user, "resourceAttributes": attrs}}


async def test_subject_access_reviews_answer_from_the_rbac_table(kube: KubeDouble,
                                                                 http: aiohttp.ClientSession) -> None:
    kube.grant("sa", {("*", "", "pods", "get", "*"), ("ns", "coordination.k8s.io", "leases", "update", "lease"),
                      ("ns", "coordination.k8s.io", "leases", "create", "*")})

    async def allowed(**attrs: str) -> bool:
        status, body = await call(http, "POST", SAR, review("sa", **attrs))
        assert status == 201 and body["kind"] == "SubjectAccessReview" and body["spec"]["user"] == "sa"
        return body["status"]["allowed"]

    assert await allowed(verb="get", resource="pods")  # a ClusterRoleBinding: every namespace
    assert await allowed(verb="get", resource="pods", namespace="x", name="p")
    assert not await allowed(verb="list", resource="pods")  # RBAC denies by default
    lease = dict(group="coordination.k8s.io", resource="leases")
    assert await allowed(verb="update", namespace="ns", name="lease", **lease)
    assert not await allowed(verb="update", namespace="ns", name="other", **lease)  # resourceNames
    assert not await allowed(verb="update", namespace="other", name="lease", **lease)  # a Role: one namespace
    assert not await allowed(verb="create", **lease)  # cluster-wide needs a cluster grant
    assert await allowed(verb="create", namespace="ns", **lease)
    kube.revoke("sa", "get", "pods")
    assert not await allowed(verb="get", resource="pods")
    status, body = await call(http, "POST", SAR, {"spec": {"resourceAttributes": {"verb": "get"}}})
    assert status == 422 and "at least one of user or group" in body["message"]
    status, body = await call(http, "POST", SAR, {"spec": {"user": "sa"}})
    assert status == 422 and "exactly one of" in body["message"]
    assert (await call(http, "GET", SAR))[0] == 405
    assert kube.items("pods") == []  # nothing is stored


async def test_namespaces_are_labelled_with_their_name(kube: KubeDouble, http: aiohttp.ClientSession) -> None:
    kube.put("namespaces", {"metadata": {"name": "a"}})
    await call(http, "POST", "/api/v1/namespaces", {"metadata": {"name": "b", "labels": {"x": "y"}}})
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in kube.items("namespaces")
              if n["metadata"]["name"] in ("a", "b")}
    assert labels == {"a": {"kubernetes.io/metadata.name": "a"}, "b": {"x": "y", "kubernetes.io/metadata.name": "b"}}


async def test_pod_creation_runs_the_admission_chain_in_order(kube: KubeDouble, http: aiohttp.ClientSession) -> None:
    seen: list[str] = []

    def hook(tag: str) -> Any:
        async def mutate(body: dict, namespace: str) -> dict:
            seen.append(f"{tag}:{namespace}")
            body["metadata"].setdefault("labels", {})[tag] = str(len(seen))
            return body
        return mutate

    kube.admission = [hook("first"), hook("second")]
    status, created = await call(http, "POST", "/api/v1/namespaces/ns/pods", pod("p"))
    assert status == 201 and seen == ["first:ns", "second:ns"]
    assert created["metadata"]["labels"] == {"first": "1", "second": "2"}
    await call(http, "POST", "/api/v1/namespaces/ns/configmaps", {"metadata": {"name": "c"}})
    assert len(seen) == 2, "only pod creation is admitted"


async def test_paged_lists_come_from_one_snapshot(kube: KubeDouble, http: aiohttp.ClientSession) -> None:
    for i in range(5):
        kube.put_pod(pod(f"p{i}"))
    status, first = await call(http, "GET", "/api/v1/pods", limit="2")
    assert status == 200 and [o["metadata"]["name"] for o in first["items"]] == ["p0", "p1"]
    assert first["metadata"]["remainingItemCount"] == 3
    kube.put_pod(pod("p9"))  # after the snapshot: not in its pages
    _, second = await call(http, "GET", "/api/v1/pods", limit="2", **{"continue": first["metadata"]["continue"]})
    _, third = await call(http, "GET", "/api/v1/pods", limit="2", **{"continue": second["metadata"]["continue"]})
    assert [o["metadata"]["name"] for o in second["items"] + third["items"]] == ["p2", "p3", "p4"]
    assert "continue" not in third["metadata"]
    assert first["metadata"]["resourceVersion"] == third["metadata"]["resourceVersion"]
    _, again = await call(http, "GET", "/api/v1/pods", limit="2")
    kube.put_pod(pod("p10"))
    kube.compact()  # etcd compacted the snapshot's revision
    status, body = await call(http, "GET", "/api/v1/pods", limit="2", **{"continue": again["metadata"]["continue"]})
    assert status == 410 and "too old" in body["message"]
    status, body = await call(http, "GET", "/api/v1/pods", limit="2", resourceVersion="1",
                              **{"continue": first["metadata"]["continue"]})
    assert status == 400 and "not allowed when using continue" in body["message"]
    assert (await call(http, "GET", "/api/v1/pods", limit="two"))[0] == 400
    assert (await call(http, "GET", "/api/v1/pods", **{"continue": "garbage"}))[0] == 400
    api = kube.kube_api()
    try:
        pages = [(len(items), rv) async for items, rv in api.list_pages("pods", "ns", limit=4)]
    finally:
        await api.close()
    assert [n for n, _ in pages] == [4, 3] and len({rv for _, rv in pages}) == 1


async def test_bookmarks_only_when_asked(kube: KubeDouble, http: aiohttp.ClientSession) -> None:
    kube.bookmark_seconds = 0.1
    kube.put_pod(pod("b"))
    rv = str(kube.resource_version)
    kube.put("configmaps", {"metadata": {"name": "c", "namespace": "ns"}})  # moves the resourceVersion on
    params = {"watch": "true", "resourceVersion": rv, "allowWatchBookmarks": "true"}
    async with http.get("/api/v1/pods", params=params) as r:
        (event,) = await _read_events(r, 1)
        assert event["type"] == "BOOKMARK" and event["object"]["kind"] == "Pod"
        assert event["object"]["metadata"] == {"resourceVersion": str(kube.resource_version)}
    async with http.get("/api/v1/pods", params={"watch": "true", "resourceVersion": rv, "timeoutSeconds": "1"}) as r:
        assert await asyncio.wait_for(r.content.readline(), BOUND) == b""  # none without allowWatchBookmarks
    # Events have no watch cache in the apiserver: their watches are etcd's, with no bookmarks
    # (kube-apiserver v1.34.9, other namespaces changing: a pods watch got one at 60 s and
    # 120 s, an events watch none in 130 s).
    async with http.get("/api/v1/events", params={**params, "timeoutSeconds": "1"}) as r:
        assert await asyncio.wait_for(r.content.readline(), BOUND) == b""


async def test_write_latency_delays_writes_not_reads(kube: KubeDouble, http: aiohttp.ClientSession) -> None:
    kube.put_pod(pod("l"))
    kube.write_latency = (0.2, 0.25)
    await call(http, "GET", "/api/v1/namespaces/ns/pods/l")
    await call(http, "PATCH", "/api/v1/namespaces/ns/pods/l", {"metadata": {"annotations": {"a": "b"}}}, MERGE)
    get, patch = kube.requests[-2:]
    assert get.finished - get.started < 0.2 <= patch.finished - patch.started


@pytest.mark.parametrize("blip", [False, True])
async def test_outages_reset_requests_and_watches(kube: KubeDouble, http: aiohttp.ClientSession, blip: bool) -> None:
    kube.put_pod(pod("o"))
    async with http.get("/api/v1/pods", params={"watch": "true"}) as r:
        await _read_events(r, 1)
        kube.outage(0.4, blip=blip)
        began = asyncio.get_running_loop().time()
        with pytest.raises(aiohttp.ClientError):  # (a PATCH: aiohttp retries a reset GET once by itself)
            await call(http, "PATCH", "/api/v1/namespaces/ns/pods/o", {"metadata": {"labels": {"a": "b"}}}, MERGE)
        # A blip holds the request until the network comes back; a server that is gone answers nothing at once.
        assert (asyncio.get_running_loop().time() - began >= 0.2) is blip
        with pytest.raises(aiohttp.ClientError):  # the open watch is cut too
            while await asyncio.wait_for(r.content.readline(), BOUND):
                pass
    await asyncio.sleep(0.45)
    assert (await call(http, "GET", "/api/v1/namespaces/ns/pods/o"))[0] == 200
    assert "labels" not in kube.pod("ns", "o")["metadata"]  # the write never landed (none: not even empty)


async def test_a_silenced_client_reaches_nothing(kube: KubeDouble) -> None:
    kube.put_pod(pod("s"))
    dead, alive = kube.kube_api("dead"), kube.kube_api("alive")
    try:
        kube.silence("dead", "POST")
        with pytest.raises(KubeError) as e:
            await dead.create_event("ns", {"metadata": {"name": "s.1"}, "involvedObject": {"namespace": "ns"}})
        assert e.value.status == 0
        assert (await dead.get_pod("ns", "s"))["metadata"]["name"] == "s"  # only its POSTs
        kube.silence("dead")
        with pytest.raises(KubeError):
            await dead.get_pod("ns", "s")
        assert (await alive.get_pod("ns", "s"))["metadata"]["name"] == "s"
    finally:
        await dead.close()
        await alive.close()


async def test_events_are_validated_and_selected_by_source(kube: KubeDouble, http: aiohttp.ClientSession) -> None:
    ev = {"metadata": {"name": "x.1"}, "involvedObject": {"kind": "Pod", "name": "x", "namespace": "ns"},
          "source": {"component": "initshift-watcher"}, "reason": "R"}
    assert (await call(http, "POST", "/api/v1/namespaces/ns/events", ev))[0] == 201
    status, body = await call(http, "POST", "/api/v1/namespaces/ns/events", ev)
    assert status == 409 and body["reason"] == "AlreadyExists"
    # An Event's name need only be a path segment (v1.34.9 and v1.28.15; e2e double-events).
    assert (await call(http, "POST", "/api/v1/namespaces/ns/events", {**ev, "metadata": {"name": "X_1"}}))[0] == 201
    for bad in ("x%1", "x/1", ".."):
        status, body = await call(http, "POST", "/api/v1/namespaces/ns/events", {**ev, "metadata": {"name": bad}})
        assert status == 422 and "metadata.name" in body["message"], (bad, body)
    elsewhere = {**ev, "metadata": {"name": "x.2"}, "involvedObject": {"name": "x", "namespace": "other"}}
    assert (await call(http, "POST", "/api/v1/namespaces/ns/events", elsewhere))[0] == 422
    other = {**ev, "metadata": {"name": "y.1"}, "source": {"component": "kubelet"}}
    assert (await call(http, "POST", "/api/v1/namespaces/ns/events", other))[0] == 201
    _, listed = await call(http, "GET", "/api/v1/events", fieldSelector="source=initshift-watcher")
    assert sorted(e["metadata"]["name"] for e in listed["items"]) == ["X_1", "x.1"]


async def test_metadata_is_validated_as_the_apiserver_does(kube: KubeDouble, http: aiohttp.ClientSession) -> None:
    """Label and annotation keys are qualified names, label values short, annotations at
    most 256 KiB together: 422, on create and on every update."""
    status, _ = await call(http, "POST", "/api/v1/namespaces/ns/pods", pod("ok", labels={"app": "x"}))
    assert status == 201
    for meta, what in [
        ({"annotations": {"initshift.io/ready-" + "c" * 60: "true"}}, "name part must be no more than 63"),
        ({"annotations": {"Bad_Prefix.io/x": "y"}}, "prefix part"),
        ({"annotations": {"a": "x" * (256 * 1024)}}, "Too long"),
        ({"labels": {"app": "x" * 64}}, "must be no more than 63 characters"),
        ({"labels": {"app": "-x"}}, "a valid label"),
    ]:
        status, body = await call(http, "PATCH", "/api/v1/namespaces/ns/pods/ok", {"metadata": meta}, MERGE)
        assert status == 422 and what in body["message"], (meta, body)
        status, body = await call(http, "POST", "/api/v1/namespaces/ns/pods", {**pod("new"), "metadata": {
            "name": "new", **meta}})
        assert status == 422 and what in body["message"], (meta, body)
    status, _ = await call(http, "PATCH", "/api/v1/namespaces/ns/pods/ok",
                           {"metadata": {"annotations": {"initshift.io/ready-" + "c" * 57: "true",
                                                         "Example.COM/Mixed_Case.Name": "x" * 1000}}}, MERGE)
    assert status == 200, "annotation keys are checked lower-cased; values have no alphabet"
    # The status subresource writes the status and the metadata, never the spec.
    status, body = await call(http, "PATCH", "/api/v1/namespaces/ns/pods/ok/status",
                              {"metadata": {"annotations": {"via": "status"}}, "spec": {"nodeName": "n"},
                               "status": {"phase": "Running"}}, MERGE)
    assert status == 200 and body["metadata"]["annotations"]["via"] == "status"
    assert body["status"]["phase"] == "Running" and "nodeName" not in body["spec"]


def bound(kube: KubeDouble, name: str, finalizers: list[str] | None = None) -> dict:
    """A pod scheduled to a node (so deleted gracefully), grace 20."""
    body = pod(name)
    body["metadata"]["finalizers"] = finalizers or []
    body["spec"].update(nodeName="node-a", terminationGracePeriodSeconds=20)
    return kube.put_pod(body)


def mark(kube: KubeDouble, name: str) -> tuple[str | None, int | None]:
    meta = (kube.get("pods", "ns", name) or {"metadata": {"gone": True}})["metadata"]
    return meta.get("deletionTimestamp"), meta.get("deletionGracePeriodSeconds")


@pytest.mark.parametrize("version, last", [("v1.28.15", "2026-12-01T18:10:52Z"), ("v1.34.9", "2026-12-01T18:10:55Z")])
def test_a_pods_deletion_mark_moves_as_the_apiservers_version_moves_it(version: str, last: str) -> None:
    """The rules real kube-apiservers showed (e2e double-deletion; a pod bound to a node, grace
    20): a delete marks it (`deletionTimestamp` now + grace, to the second); a shorter grace
    moves the mark by the difference, which with kubernetes#122646 never moves it
    before now: the kubelet's last delete (grace 0) leaves v1.28.15's mark at the time the
    deletion was asked for and sets v1.34.9's to its own time; a later one keeps it."""
    kube = KubeDouble(version=version)
    asked = datetime(2026, 12, 1, 18, 10, 52, 400000, tzinfo=timezone.utc)
    bound(kube, "held", ["example.com/hold"])
    kube.delete_pod("ns", "held", at=asked)
    assert mark(kube, "held") == ("2026-12-01T18:11:12Z", 20)
    kube.delete_pod("ns", "held", 30, at=asked + timedelta(seconds=2))  # longer: no change
    assert mark(kube, "held") == ("2026-12-01T18:11:12Z", 20)
    kube.delete_pod("ns", "held", 5, at=asked + timedelta(seconds=2))
    assert mark(kube, "held") == ("2026-12-01T18:10:57Z", 5)
    kube.delete_pod("ns", "held", 0, at=asked + timedelta(seconds=3))  # the kubelet's last delete
    assert mark(kube, "held") == (last, 0)
    kube.delete_pod("ns", "held", 0, at=asked + timedelta(seconds=9))  # already marked earlier: kept
    kube.delete_pod("ns", "held", 30, at=asked + timedelta(seconds=9))  # (no grace left: none is given back)
    assert mark(kube, "held") == (last, 0)
    kube.merge("pods", "ns", "held", {"metadata": {"finalizers": None}})
    assert kube.get("pods", "ns", "held") is None, "its last finalizer gone, it goes"


async def test_pods_are_deleted_gracefully_as_the_apiserver_does(kube: KubeDouble, http: aiohttp.ClientSession) -> None:
    """Through the API, the same rules (`gracePeriodSeconds` in the query or DeleteOptions)."""
    # Through the API: a DELETE's gracePeriodSeconds (query or DeleteOptions); no finalizer:
    # marked, then gone at grace 0.
    bound(kube, "free")
    status, answer = await call(http, "DELETE", "/api/v1/namespaces/ns/pods/free", {"gracePeriodSeconds": 10})
    assert status == 200 and answer["metadata"]["deletionGracePeriodSeconds"] == 10
    status, _ = await call(http, "DELETE", "/api/v1/namespaces/ns/pods/free", gracePeriodSeconds="0")
    assert status == 200 and kube.get("pods", "ns", "free") is None
    # Removing a finalizer while a grace period runs does not delete it; a pod nothing runs
    # (not bound, or ended) goes at once.
    bound(kube, "pending-grace", ["example.com/hold"])
    kube.delete_pod("ns", "pending-grace")
    await call(http, "PATCH", "/api/v1/namespaces/ns/pods/pending-grace", {"metadata": {"finalizers": None}}, MERGE)
    assert mark(kube, "pending-grace")[1] == 20
    kube.put_pod(pod("unbound"))
    kube.delete_pod("ns", "unbound")
    assert kube.get("pods", "ns", "unbound") is None


async def test_a_deleted_pod_is_marked_then_deleted_in_the_watch(kube: KubeDouble, http: aiohttp.ClientSession) -> None:
    """As a watch of v1.34.9 and v1.28.15 shows it (e2e double-watch): a delete with no
    grace left writes the mark first (MODIFIED, grace 0), then the DELETED event; a pod a
    finalizer held goes when the finalizer is removed, its DELETED event the object as it
    was, finalizer and all."""
    rv = str(kube.resource_version)
    kube.put_pod(pod("free"))
    held = pod("held")
    held["metadata"]["finalizers"] = ["example.com/hold"]
    kube.put_pod(held)
    await call(http, "DELETE", "/api/v1/namespaces/ns/pods/free")
    await call(http, "DELETE", "/api/v1/namespaces/ns/pods/held")
    await call(http, "PATCH", "/api/v1/namespaces/ns/pods/held", {"metadata": {"finalizers": None}}, MERGE)
    async with http.get("/api/v1/pods", params={"watch": "true", "resourceVersion": rv}) as r:
        events = await _read_events(r, 6)
    assert [(e["type"], e["object"]["metadata"]["name"], e["object"]["metadata"].get("deletionGracePeriodSeconds"),
             e["object"]["metadata"].get("finalizers")) for e in events] == [
        ("ADDED", "free", None, None), ("ADDED", "held", None, ["example.com/hold"]),
        ("MODIFIED", "free", 0, None), ("DELETED", "free", 0, None),
        ("MODIFIED", "held", 0, ["example.com/hold"]), ("DELETED", "held", 0, ["example.com/hold"])]


CM, JOBS = "/api/v1/namespaces/ns/configmaps", "/apis/batch/v1/namespaces/ns/jobs"
_JOB = {"spec": {"suspend": True, "template": {"spec": {"restartPolicy": "Never",
                                                        "containers": [{"name": "c", "image": "busybox"}]}}}}


async def test_delete_options_are_read_before_the_object_is_looked_up(http: aiohttp.ClientSession) -> None:
    """As e2e `double-delete-options` found on v1.34.9 and v1.28.15: an unknown policy, or
    one beside orphanDependents, is 422 whether or not the object exists; then 404, whose
    Status names it; a body's options are read, not the query's."""
    status, body = await call(http, "DELETE", f"{CM}/none", {"propagationPolicy": "Nope"})
    assert (status, body["details"]) == (422, {"group": "meta.k8s.io", "kind": "DeleteOptions"})
    assert body["message"] == ('DeleteOptions.meta.k8s.io "" is invalid: propagationPolicy: Unsupported value: '
                               '"Nope": supported values: "Foreground", "Background", "Orphan", "nil"')
    status, body = await call(http, "DELETE", f"{CM}/none", {"propagationPolicy": "Orphan", "orphanDependents": True})
    assert status == 422 and body["message"].endswith("orphanDependents and deletionPropagation cannot be both set")
    status, body = await call(http, "DELETE", f"{CM}/none", propagationPolicy="Nope")
    assert status == 422
    status, body = await call(http, "DELETE", f"{CM}/none", {}, propagationPolicy="Nope")  # a body: the query unread
    assert (status, body["details"]) == (404, {"name": "none", "kind": "configmaps"})


async def test_a_deletes_preconditions_and_dry_run(kube: KubeDouble, http: aiohttp.ClientSession) -> None:
    """`preconditions` that do not match are 409, the UID's before the resourceVersion's; a
    dry run answers as the delete would (marked, or a Status) and changes nothing."""
    _, job = await call(http, "POST", JOBS, {"metadata": {"name": "j"}, **_JOB})
    uid, rv = job["metadata"]["uid"], job["metadata"]["resourceVersion"]
    status, body = await call(http, "DELETE", f"{JOBS}/j", {"preconditions": {"uid": "x", "resourceVersion": "1"}})
    assert (status, body["details"]) == (409, {"name": "j", "group": "batch", "kind": "Job"})
    assert body["message"] == (f'Operation cannot be fulfilled on Job.batch "j": the UID in the precondition (x) does '
                               f"not match the UID in record ({uid}). The object might have been deleted and then "
                               f"recreated")
    status, body = await call(http, "DELETE", f"{JOBS}/j", {"preconditions": {"uid": uid, "resourceVersion": "1"}})
    assert status == 409 and f"the ResourceVersion in the precondition (1) does not match the ResourceVersion in " \
                              f"record ({rv}). The object might have been modified" in body["message"]
    status, body = await call(http, "DELETE", f"{JOBS}/j", dryRun="All")
    assert status == 200 and body["metadata"]["finalizers"] == ["orphan"] and body["metadata"]["resourceVersion"] == rv
    status, body = await call(http, "DELETE", f"{JOBS}/j", dryRun="All", propagationPolicy="Background")
    assert (status, body["kind"], body["details"]["uid"]) == (200, "Status", uid)
    kube.put_pod(pod("p"))
    status, body = await call(http, "DELETE", "/api/v1/namespaces/ns/pods/p", dryRun="All")
    assert status == 200 and body["metadata"]["deletionGracePeriodSeconds"] == 0
    assert kube.get("jobs", "ns", "j") == job and "deletionTimestamp" not in kube.get("pods", "ns", "p")["metadata"]


async def test_finalizers_hold_a_deleted_object_as_no_garbage_collector_runs(kube: KubeDouble,
                                                                             http: aiohttp.ClientSession) -> None:
    """A Job's default policy is Orphan: marked (grace 0) with the collector's finalizer,
    which a later delete swaps for its policy's (none for Background: then it goes); a
    ConfigMap held by a finalizer of its own is marked and answered, a second delete changes
    nothing, no finalizer may be added to it, and it goes with its last finalizer."""
    await call(http, "POST", JOBS, {"metadata": {"name": "j"}, **_JOB})
    status, body = await call(http, "DELETE", f"{JOBS}/j")
    meta = body["metadata"]
    assert (status, body["kind"], meta["finalizers"], meta["deletionGracePeriodSeconds"]) == (200, "Job", ["orphan"], 0)
    _, again = await call(http, "DELETE", f"{JOBS}/j", {"propagationPolicy": "Orphan"})
    assert again == body, "the same policy again: unchanged, not even its resourceVersion"
    _, body = await call(http, "DELETE", f"{JOBS}/j", {"propagationPolicy": "Foreground"})
    assert body["metadata"]["finalizers"] == ["foregroundDeletion"]
    status, body = await call(http, "DELETE", f"{JOBS}/j", {"propagationPolicy": "Background"})
    assert (status, body["kind"]) == (200, "Status") and kube.get("jobs", "ns", "j") is None
    await call(http, "POST", CM, {"metadata": {"name": "c", "finalizers": ["example.com/hold"]}})
    status, body = await call(http, "DELETE", f"{CM}/c")
    assert (status, body["kind"], body["metadata"]["finalizers"]) == (200, "ConfigMap", ["example.com/hold"])
    assert (await call(http, "DELETE", f"{CM}/c"))[1] == body
    status, refused = await call(http, "PATCH", f"{CM}/c", {"metadata": {"finalizers": ["example.com/hold", "b"]}},
                                 MERGE)
    assert (status, refused["message"]) == (422, 'ConfigMap "c" is invalid: metadata.finalizers: Forbidden: no new '
                                                 'finalizers can be added if the object is being deleted, found new '
                                                 'finalizers []string{"b"}')
    status, _ = await call(http, "PATCH", f"{CM}/c", {"metadata": {"finalizers": None}}, MERGE)
    assert status == 200 and kube.get("configmaps", "ns", "c") is None


async def test_a_deleted_namespace_is_terminating_and_takes_nothing_new(kube: KubeDouble,
                                                                       http: aiohttp.ClientSession) -> None:
    """As e2e `double-namespaces` found on v1.34.9 and v1.28.15 (no namespace controller
    runs beside the double): a namespace is created Active with the `kubernetes` finalizer;
    deleted, it is answered and stays Terminating; nothing can be created in it (403), an
    object in it can still be updated."""
    status, made = await call(http, "POST", "/api/v1/namespaces", {"metadata": {"name": "gone"}})
    assert (status, made["status"], made["spec"]) == (201, {"phase": "Active"}, {"finalizers": ["kubernetes"]})
    await call(http, "POST", "/api/v1/namespaces/gone/configmaps", {"metadata": {"name": "a"}})
    for _ in range(2):
        status, body = await call(http, "DELETE", "/api/v1/namespaces/gone")
        assert (status, body["kind"], body["status"]["phase"]) == (200, "Namespace", "Terminating")
        assert "deletionTimestamp" in body["metadata"] and body["spec"]["finalizers"] == ["kubernetes"]
    assert kube.get("namespaces", None, "gone")["status"]["phase"] == "Terminating"
    status, body = await call(http, "POST", "/api/v1/namespaces/gone/events", {"metadata": {"name": "e"}})
    assert (status, body["reason"], body["details"]) == (403, "Forbidden", {"name": "e", "kind": "events"})
    assert body["message"] == ('events "e" is forbidden: unable to create new content in namespace gone because it '
                               'is being terminated')
    status, _ = await call(http, "PATCH", "/api/v1/namespaces/gone/configmaps/a", {"data": {"k": "v"}}, MERGE)
    assert status == 200


async def test_a_namespace_that_does_not_exist_takes_nothing(kube: KubeDouble, http: aiohttp.ClientSession) -> None:
    """As e2e `double-namespaces` found on v1.34.9 and v1.28.15: a create in a namespace
    that does not exist is 404, the namespace named, before any validation; so is a Lease's
    PUT, which creates; a PUT of a ConfigMap there is its own 404 (ConfigMaps are not
    created by a PUT). An object a test puts there makes the namespace, as no object lives
    outside one."""
    missing = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": 'namespaces "never-made" not found', "reason": "NotFound",
               "details": {"name": "never-made", "kind": "namespaces"}, "code": 404}
    configmaps = "/api/v1/namespaces/never-made/configmaps"
    leases = "/apis/coordination.k8s.io/v1/namespaces/never-made/leases"
    assert await call(http, "POST", configmaps, {"metadata": {"name": "a"}}) == (404, missing)
    assert await call(http, "POST", configmaps, {"metadata": {"name": "A_"}}) == (404, missing)
    assert await call(http, "PUT", f"{leases}/l", {"metadata": {"name": "l"}, "spec": {}}) == (404, missing)
    status, body = await call(http, "PUT", f"{configmaps}/a", {"metadata": {"name": "a"}})
    assert (status, body["message"]) == (404, 'configmaps "a" not found')
    kube.put("configmaps", {"metadata": {"name": "seed", "namespace": "never-made"}})
    assert kube.get("namespaces", None, "never-made")["status"] == {"phase": "Active"}
    assert (await call(http, "POST", configmaps, {"metadata": {"name": "a"}}))[0] == 201


async def test_pages_end_at_the_limit_as_etcds_store_pages(kube: KubeDouble, http: aiohttp.ClientSession) -> None:
    """As e2e `double-lists` found on v1.34.9 and v1.28.15: a token is reusable; with a
    selector, a page ends at `limit` matches and a token comes whenever anything follows,
    so the last page may be empty, and no remainingItemCount; a continue applies the
    selector it is sent with; objects come in the order of their storage keys."""
    for i in range(5):
        kube.put_pod(pod(f"p{i}", labels={"odd": str(i % 2)}))
    names = lambda body: [o["metadata"]["name"] for o in body["items"]]  # noqa: E731
    _, first = await call(http, "GET", "/api/v1/namespaces/ns/pods", limit="2")
    token = first["metadata"]["continue"]
    for _ in range(2):
        _, again = await call(http, "GET", "/api/v1/namespaces/ns/pods", limit="2", **{"continue": token})
        assert names(again) == ["p2", "p3"] and again["metadata"]["remainingItemCount"] == 1
    _, rest = await call(http, "GET", "/api/v1/namespaces/ns/pods", **{"continue": token})
    assert names(rest) == ["p2", "p3", "p4"] and "continue" not in rest["metadata"]
    _, odd = await call(http, "GET", "/api/v1/namespaces/ns/pods", labelSelector="odd=1", **{"continue": token})
    assert names(odd) == ["p3"]
    _, page = await call(http, "GET", "/api/v1/namespaces/ns/pods", labelSelector="odd=1", limit="2")
    assert names(page) == ["p1", "p3"] and "remainingItemCount" not in page["metadata"]
    _, last = await call(http, "GET", "/api/v1/namespaces/ns/pods", labelSelector="odd=1", limit="2",
                         **{"continue": page["metadata"]["continue"]})
    assert names(last) == [] and "continue" not in last["metadata"]
    _, whole = await call(http, "GET", "/api/v1/namespaces/ns/pods", labelSelector="odd=0", limit="3")
    assert names(whole) == ["p0", "p2", "p4"] and "continue" not in whole["metadata"]
    status, _ = await call(http, "GET", "/api/v1/namespaces/other/pods", **{"continue": token})
    assert status == 400  # another collection's token
    kube.put_pod(pod("x", ns="a-b"))
    kube.put_pod(pod("x", ns="a"))
    _, everywhere = await call(http, "GET", "/api/v1/pods")
    assert [o["metadata"]["namespace"] for o in everywhere["items"]][:2] == ["a-b", "a"]  # "a-b/x" < "a/x"


async def test_leases_are_decoded_and_updated_as_the_apiserver_does(kube: KubeDouble,
                                                                     http: aiohttp.ClientSession) -> None:
    """As e2e `double-leases` found on v1.34.9 and v1.28.15."""
    leases = "/apis/coordination.k8s.io/v1/namespaces/sys/leases"
    spec = {"holderIdentity": "a", "leaseDurationSeconds": 15, "renewTime": "2026-12-01T10:00:00.123456+01:00",
            "bogus": 1, "acquireTime": None}
    status, lease = await call(http, "POST", leases, {"metadata": {"name": "l", "labels": {}}, "spec": spec})
    assert status == 201 and "labels" not in lease["metadata"]
    assert lease["spec"] == {"holderIdentity": "a", "leaseDurationSeconds": 15,
                             "renewTime": "2026-12-01T09:00:00.123456Z"}
    refused = [({"renewTime": "2026-12-01T10:00:00Z"}, 400), ({"renewTime": "2026-12-01T10:00:00.123Z"}, 400),
               ({"leaseDurationSeconds": "3"}, 400), ({"leaseDurationSeconds": 2**31}, 400),
               ({"leaseDurationSeconds": 0}, 422), ({"leaseTransitions": -1}, 422)]
    for i, (bad, code) in enumerate(refused):
        assert (await call(http, "POST", leases, {"metadata": {"name": f"bad{i}"}, "spec": bad}))[0] == code, bad
    assert (await call(http, "POST", leases, {"metadata": {"name": "m", "resourceVersion": "7"}}))[0] == 500
    unconditional = {"metadata": {"name": "l"}, "spec": {"holderIdentity": "b"}}
    status, body = await call(http, "PUT", f"{leases}/l", unconditional)
    assert status == 422 and "must be specified for an update" in body["message"]
    assert (await call(http, "PUT", f"{leases}/l", {**lease, "metadata": {**lease["metadata"], "name": "o"}}))[0] == 400
    assert (await call(http, "PUT", f"{leases}/l", {**lease, "metadata": {}}))[0] == 400
    status, same = await call(http, "PUT", f"{leases}/l", lease)
    assert status == 200 and same["metadata"]["resourceVersion"] == lease["metadata"]["resourceVersion"]
    status, created = await call(http, "PUT", f"{leases}/new", {"metadata": {"name": "new", "resourceVersion": "3"}})
    assert status == 201 and created["metadata"]["name"] == "new"
    assert (await call(http, "PUT", "/api/v1/namespaces/ns/pods/none", pod("none")))[0] == 404


async def test_a_delete_answers_the_object_or_a_status_as_the_apiserver_does(kube: KubeDouble,
                                                                             http: aiohttp.ClientSession) -> None:
    """As e2e `double-deletes` found on v1.34.9 and v1.28.15."""
    for path, kind in (("/api/v1/namespaces/ns/serviceaccounts", "ServiceAccount"), ("/api/v1/namespaces/ns/configmaps",
                       "Status"), ("/apis/coordination.k8s.io/v1/namespaces/ns/leases", "Status")):
        _, created = await call(http, "POST", path, {"metadata": {"name": "d"}})
        status, answer = await call(http, "DELETE", f"{path}/d")
        assert status == 200 and answer["kind"] == kind
        if kind == "Status":
            group = "coordination.k8s.io" if "leases" in path else None
            assert answer["details"] == {"name": "d", **({"group": group} if group else {}),
                                         "kind": path.rpartition("/")[2], "uid": created["metadata"]["uid"]}
        assert (await call(http, "DELETE", f"{path}/d"))[0] == 404


# Go's base64 as the apiserver decoded these Secret values (v1.34.9): the stored value, or
# the byte offset of its "illegal base64 data at input byte N".
_BASE64_AS_DECODED = {"YWI=": "YWI=", "YWJjZGV=": "YWJjZGU=", "YWJj\nZGVm": "YWJjZGVm", "YQ==\n": "YQ==", "": "",
                      "YQ": 0, "YQ=": 3, "Y===": 1, "YQ==YQ==": 4, "YWJjZA": 4, "YW Jj": 2, "YWJjZA=": 7,
                      "abc=d": 4, "Y": 0, "YWJjZ": 4}


async def test_secret_values_are_decoded_as_the_apiservers_go_decodes_them(kube: KubeDouble,
                                                                           http: aiohttp.ClientSession) -> None:
    """As e2e `double-secrets` found on v1.34.9: line ends skipped, padding required, trailing
    bits dropped; a create's undecodable value is a 400 naming its offset, a patch's a 422."""
    secrets = "/api/v1/namespaces/ns/secrets"
    for i, (value, want) in enumerate(_BASE64_AS_DECODED.items()):
        status, body = await call(http, "POST", secrets, {"metadata": {"name": f"b{i}"}, "data": {"a": value}})
        if isinstance(want, int):
            assert (status, body["message"]) == (400, 'Secret in version "v1" cannot be handled as a Secret: '
                                                      f"illegal base64 data at input byte {want}"), value
        else:
            assert (status, body.get("data", {}).get("a", "")) == (201, want), value
    status, body = await call(http, "PATCH", f"{secrets}/b0", {"data": {"a": "ab!c"}}, MERGE)
    assert status == 422 and body["message"].endswith("illegal base64 data at input byte 2")
    status, body = await call(http, "POST", secrets, {"metadata": {"name": "s"}, "stringData": {"k": "plain"},
                                                      "data": {"k": "eA==", "j": "eQ=="}})
    assert (status, body["type"], body["data"]) == (201, "Opaque", {"k": "cGxhaW4=", "j": "eQ=="})
    assert "stringData" not in body


async def test_secrets_are_validated_as_the_apiserver_does(kube: KubeDouble, http: aiohttp.ClientSession) -> None:
    """As e2e `double-secrets` found on v1.34.9 and v1.28.15: a type's required keys, data
    keys, the total size, `type` and an immutable Secret's data never changing."""
    secrets, tls = "/api/v1/namespaces/ns/secrets", {"tls.crt": "Yw==", "tls.key": "aw=="}

    async def refused(method: str, path: str, body: Any, ctype: str = "application/json") -> str:
        status, answer = await call(http, method, path, body, ctype)
        assert status == 422, answer
        return answer["message"]

    assert await refused("POST", secrets, {"metadata": {"name": "t"}, "type": "kubernetes.io/tls"}) == \
        'Secret "t" is invalid: [data[tls.crt]: Required value, data[tls.key]: Required value]'
    assert await refused("POST", secrets, {"metadata": {"name": "k"}, "data": {".": ""}}) == \
        """Secret "k" is invalid: data[.]: Invalid value: ".": must not be '.'"""
    assert "regex used for validation is '[-._a-zA-Z0-9]+'" in \
        await refused("POST", secrets, {"metadata": {"name": "k"}, "data": {"a/b": ""}})
    big = base64.b64encode(b"x" * (1024 * 1024 + 1)).decode()
    assert await refused("POST", secrets, {"metadata": {"name": "k"}, "data": {"a": big}}) == \
        'Secret "k" is invalid: data: Too long: may not be more than 1048576 bytes'
    assert await refused("POST", secrets, {"metadata": {"name": "b"}, "type": "kubernetes.io/basic-auth"}) == \
        'Secret "b" is invalid: [data[username]: Required value, data[password]: Required value]'
    assert "cannot unmarshal array" in await refused("POST", secrets, {
        "metadata": {"name": "d"}, "type": "kubernetes.io/dockerconfigjson", "data": {".dockerconfigjson": "WzFd"}})
    status, _ = await call(http, "POST", secrets, {"metadata": {"name": "t"}, "type": "kubernetes.io/tls", "data": tls})
    assert status == 201
    assert await refused("PATCH", f"{secrets}/t", [{"op": "remove", "path": "/data/tls.key"}], JSON_PATCH) == \
        'Secret "t" is invalid: data[tls.key]: Required value'
    assert await refused("PATCH", f"{secrets}/t", {"type": "Opaque"}, MERGE) == \
        'Secret "t" is invalid: type: Invalid value: "Opaque": field is immutable'
    status, _ = await call(http, "POST", secrets, {"metadata": {"name": "i"}, "immutable": True, "data": {"a": "eA=="}})
    assert status == 201
    assert await refused("PATCH", f"{secrets}/i", {"data": {"a": "eQ=="}}, MERGE) == \
        'Secret "i" is invalid: data: Forbidden: field is immutable when `immutable` is set'
    assert await refused("PATCH", f"{secrets}/i", {"immutable": False}, MERGE) == \
        'Secret "i" is invalid: immutable: Forbidden: field is immutable when `immutable` is set'


async def test_webhook_configurations_are_decoded_and_validated_as_the_apiserver_does(
        kube: KubeDouble, http: aiohttp.ClientSession) -> None:
    """As e2e `double-webhook-configurations` found on v1.34.9 and v1.28.15."""
    base = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
    hook = {"name": "pods.initshift.io", "clientConfig": {"service": {"namespace": "x", "name": "y"}},
            "sideEffects": "None", "admissionReviewVersions": ["v1"]}
    status, made = await call(http, "POST", base, {"metadata": {"name": "w"}, "webhooks": [hook]})
    assert status == 201
    made["webhooks"][0]["clientConfig"]["caBundle"] = "Q0E=\n"
    status, put = await call(http, "PUT", f"{base}/w", made)
    assert (status, put["webhooks"][0]["clientConfig"]["caBundle"]) == (200, "Q0E=")
    put["webhooks"][0]["clientConfig"]["caBundle"] = "Q0E"
    status, body = await call(http, "PUT", f"{base}/w", put)
    assert (status, body["message"]) == (400, 'MutatingWebhookConfiguration in version "v1" cannot be handled as a '
                                              "MutatingWebhookConfiguration: illegal base64 data at input byte 0")
    wrong = [{**hook, "name": "pods.io", "sideEffects": None}, {**hook, "clientConfig": {}, "admissionReviewVersions": []}]
    status, body = await call(http, "POST", base, {"metadata": {"name": "v"}, "webhooks": wrong})
    assert (status, body["message"]) == (422, (
        'MutatingWebhookConfiguration.admissionregistration.k8s.io "v" is invalid: [webhooks[0].name: Invalid value: '
        '"pods.io": should be a domain with at least three segments separated by dots, webhooks[0].sideEffects: '
        "Required value: must specify one of None, NoneOnDryRun, webhooks[1].clientConfig: Required value: exactly one "
        "of url or service is required, webhooks[1].admissionReviewVersions: Required value: must specify one of v1, "
        "v1beta1]"))
