"""LimitRanges through the real HTTPS server: a build pod in a namespace with a LimitRange
(min cpu 10m, memory 8Mi, a memory limit/request ratio) gets a patch whose containers all
pass it, whether the view knew the LimitRange (no I/O) or a live list had to say; an API
that fails or refuses costs the review nothing but the LimitRange."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any, AsyncIterator

import httpx
import pytest

from tests.kube.test_views import live_lists, until
from tests.support import https_helpers as h
from tests.support.kubedouble import KubeDouble
from tests.support.patching import apply_patch, decode_patch
from waiter import protocol as p
from webhook.admission import HttpsServer, bind
from webhook.kube import LimitRanges, Namespaces, NamespaceView, ResourceQuotas
from webhook.rewrite._quantity import parse
from webhook.rewrite._resources import pod_requests

MIN = {"cpu": "10m", "memory": "8Mi"}
RATIO = {"memory": "64"}
LIMIT_RANGE = {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "defaults", "namespace": "builds"},
               "spec": {"limits": [{"type": "Container", "min": MIN, "max": {"cpu": "4", "memory": "8Gi"},
                                    "default": {"cpu": "500m", "memory": "512Mi"},
                                    "defaultRequest": {"cpu": "100m", "memory": "64Mi"},
                                    "maxLimitRequestRatio": RATIO}]}}


def violations(pod: dict) -> list[str]:
    """What LIMIT_RANGE's min and ratio refuse in `pod` (LimitRanger's Container checks)."""
    out = []
    for c in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]:
        res = c.get("resources") or {}
        requests, limits = res.get("requests") or {}, res.get("limits") or {}
        for r, least in MIN.items():
            if r in requests and parse(requests[r], r) < parse(least, r):
                out.append(f"{c['name']}: {r} request {requests[r]} < min {least}")
        for r, ratio in RATIO.items():
            if r in limits and (parse(requests.get(r, "0"), r) == 0
                                or parse(limits[r], r) > parse(requests[r], r) * int(ratio)):
                out.append(f"{c['name']}: {r} limit {limits[r]} over {ratio} x request {requests.get(r)}")
    return out


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, *views: NamespaceView, run_view: bool = True) -> AsyncIterator[str]:
    """The real server on this loop with the views as its companions; yields its URL."""
    kinds = {LimitRanges: "limit_ranges", ResourceQuotas: "quotas", Namespaces: "namespaces"}
    server = HttpsServer(h.settings_for(tmp_path), sock=bind(), reload_interval=0.1, graceful_seconds=1,
                         **{kinds[type(view)]: view for view in views})
    task = asyncio.create_task(server.serve(*([view.run for view in views] if run_view else [])))
    try:
        await until(lambda: server.uvicorn.started or task.done(), "the server started", 30)
        yield h.base_url(server)
    finally:
        server.stop()
        await asyncio.wait_for(task, 10)
        server.sock.close()


async def mutate(url: str, ca: Path, pod: dict, namespace: str = "builds") -> dict:
    async with httpx.AsyncClient(verify=h.client_context(ca), timeout=30) as c:
        r = await c.post(f"{url}/mutate", json=h.review(pod, namespace=namespace))
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture
async def api(kube: KubeDouble) -> AsyncIterator[Any]:
    client = kube.kube_api()
    yield client
    await client.close()


async def test_a_pod_in_a_namespace_with_a_limit_range_passes_it(kube, api, tmp_path):
    ca = h.make_certs(tmp_path)
    pod = h.kpack_istio()
    view = LimitRanges(api)
    async with serving(tmp_path, view) as url:
        await until(lambda: view.synced, "the view synced")
        before = apply_patch(pod, decode_patch(await mutate(url, ca, pod, "elsewhere")))
        assert before["metadata"]["labels"][p.LABEL_MANAGED] == p.MODE_WAITER
        assert violations(before), "without a LimitRange the rewrite writes requests of 0: nothing to test"
        # Created after start: the watch brings it, and the review reads it without I/O.
        kube.make_namespace("builds")
        await api.request("POST", "/api/v1/namespaces/builds/limitranges", body=LIMIT_RANGE)
        await until(lambda: view.known("builds") is not None, "the watch brought the LimitRange")
        answer = await mutate(url, ca, pod)
    after = apply_patch(pod, decode_patch(answer))
    assert after["metadata"]["labels"][p.LABEL_MANAGED] == p.MODE_WAITER
    assert violations(after) == []
    # preserve: the floors are taken back from the step that holds the request, no warning
    assert pod_requests(after["spec"]) == pod_requests(before["spec"])
    assert not answer["response"].get("warnings"), answer["response"]["warnings"]
    assert live_lists(kube, "builds") == 0


async def test_a_limit_range_the_view_does_not_hold_yet_is_listed_live(kube, api, tmp_path):
    """The informer has not synced (or not seen it yet): the review waits for a live list."""
    ca = h.make_certs(tmp_path)
    kube.put("limitranges", LIMIT_RANGE)
    pod = h.kpack_istio()
    async with serving(tmp_path, LimitRanges(api), run_view=False) as url:
        first = apply_patch(pod, decode_patch(await mutate(url, ca, pod)))
        second = apply_patch(pod, decode_patch(await mutate(url, ca, pod)))
    assert violations(first) == violations(second) == []
    assert live_lists(kube, "builds") == 1  # the second review read the cache


@pytest.mark.parametrize("status", [500, 403])
async def test_an_api_that_fails_costs_the_review_only_the_limit_range(kube, api, tmp_path, caplog, status):
    """A failed live list (500), or RBAC refusing LimitRanges altogether (403: an upgrade that
    kept the old RBAC): the server serves, the pod is rewritten as without a LimitRange."""
    ca = h.make_certs(tmp_path)
    kube.put("limitranges", LIMIT_RANGE)
    kube.fail_next("/api/v1/namespaces/builds/limitranges", status, times=100)
    if status == 403:
        kube.fail_next("/api/v1/limitranges", 403, times=100, message="limitranges is forbidden")
    view = LimitRanges(api)
    pod = h.kpack_istio()
    with caplog.at_level(logging.WARNING, logger="initshift.limitranges"):
        async with serving(tmp_path, view, run_view=status == 403) as url:
            if status == 403:
                await until(lambda: view.forbidden, "the view turned off")
            answers = [await mutate(url, ca, pod) for _ in range(2)]
    for answer in answers:
        out = apply_patch(pod, decode_patch(answer))
        assert out["metadata"]["labels"][p.LABEL_MANAGED] == p.MODE_WAITER and violations(out)
    warned = [r.getMessage() for r in caplog.records if r.name == "initshift.limitranges"]
    assert len(warned) == 1, warned
    assert ("may not list them" if status == 403 else "LimitRanges of namespace builds not read") in warned[0]
    assert live_lists(kube, "builds") == (0 if status == 403 else 1)


async def test_a_pod_left_as_it_is_reads_no_limit_range(kube, api, tmp_path):
    """A pod the rewrite leaves alone (no sidecar, nothing to fix) is answered without a
    live list, even in a namespace the view knows nothing of."""
    ca = h.make_certs(tmp_path)
    kube.put("limitranges", LIMIT_RANGE)
    pod = h.kpack_istio()
    pod["spec"]["containers"] = [c for c in pod["spec"]["containers"] if c["name"] != "istio-proxy"]
    pod["metadata"].pop("annotations", None)
    async with serving(tmp_path, LimitRanges(api), run_view=False) as url:
        answer = await mutate(url, ca, pod)
    out = apply_patch(pod, decode_patch(answer)) if "patch" in answer["response"] else pod
    assert p.LABEL_MANAGED not in (out["metadata"].get("labels") or {}) and out["spec"] == pod["spec"]
    assert live_lists(kube, "builds") == 0
