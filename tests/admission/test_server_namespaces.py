"""A namespace's mesh label through the real HTTPS server: a pod with a proxy of its own, in
a namespace whose label asks Istio for another and under a quota that charges limits, waits
for the re-invoked review (Istio's proxy comes after initshift's first one), whether the
view held the Namespace (no I/O) or a live list had to say; without the label it is
rewritten at once."""

from __future__ import annotations

import copy

import pytest

from tests.admission.test_server_limitranges import api, mutate, serving  # noqa: F401 - api: a fixture
from tests.kube.test_views import live_lists, until
from tests.support import https_helpers as h
from tests.support.fixtures import pods
from tests.support.patching import apply_patch, decode_patch
from waiter import protocol as p
from webhook.kube import Namespaces, ResourceQuotas


def namespace(labels: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "builds", "labels": labels}}


QUOTA = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "compute", "namespace": "builds"},
         "spec": {"hard": {"limits.cpu": "100"}}, "status": {"hard": {"limits.cpu": "100"}, "used": {"limits.cpu": "0"}}}


@pytest.mark.parametrize("synced", [True, False], ids=["informer", "live-list"])
async def test_a_pod_whose_namespace_asks_a_mesh_for_a_proxy_waits_for_it_under_a_quota(kube, api, tmp_path, synced):
    ca = h.make_certs(tmp_path)
    kube.put("namespaces", namespace({"istio-injection": "enabled"}))
    kube.put("resourcequotas", QUOTA)
    ttl = {} if synced else {"ttl": 0.0}  # live: every review lists
    quotas, namespaces = ResourceQuotas(api, **ttl), Namespaces(api, **ttl)
    pod = copy.deepcopy(pods.catalogue()["job-linkerd"])  # Linkerd's proxy, and nothing asks Istio but the label
    async with serving(tmp_path, quotas, namespaces, run_view=synced) as url:
        if synced:
            await until(lambda: namespaces.known("builds") and quotas.known("builds"), "the views hold them")
        waits = await mutate(url, ca, pod)
        kube.put("namespaces", namespace({}))  # the label gone: nothing more comes
        if synced:
            await until(lambda: not namespaces.known("builds")[0]["metadata"]["labels"], "the watch brought it")
        now = await mutate(url, ca, pod)
    kept = apply_patch(pod, decode_patch(waits))
    assert p.LABEL_MANAGED not in kept["metadata"].get("labels", {})
    assert kept["metadata"]["annotations"][p.ANNOTATION_NOT_REWRITTEN] == "no-sidecar"
    assert "has not injected its proxy yet" in waits["response"]["warnings"][0]
    assert apply_patch(pod, decode_patch(now))["metadata"]["labels"][p.LABEL_MANAGED] == p.MODE_WAITER
    lists = sum(1 for r in kube.requests if r.method == "GET" and r.path == "/api/v1/namespaces"
                and "metadata.name=builds" in str(r.query))
    assert lists == (0 if synced else 2) and live_lists(kube, "builds", "resourcequotas") == (0 if synced else 2)


@pytest.mark.parametrize("synced", [True, False], ids=["informer", "live-list"])
async def test_a_pod_without_a_sidecar_yet_is_told_its_namespaces_mesh_comes_later(kube, api, tmp_path, synced):
    """The first review of a build pod in a namespace labelled for Istio, before Istio's
    webhook (which runs after initshift's): admitted unchanged, saying the proxy comes and the
    re-invoked review rewrites the pod; it said "no mesh injection requested" (the server read
    the Namespace only for pods it rewrites)."""
    ca = h.make_certs(tmp_path)
    kube.put("namespaces", namespace({"istio-injection": "enabled"}))
    ttl = {} if synced else {"ttl": 0.0}
    namespaces = Namespaces(api, **ttl)
    pod = copy.deepcopy(pods.catalogue()["job"])  # no proxy, no mesh annotation
    async with serving(tmp_path, namespaces, run_view=synced) as url:
        if synced:
            await until(lambda: namespaces.known("builds"), "the view holds it")
        first = await mutate(url, ca, pod)
        elsewhere = await mutate(url, ca, pod, "plain")
    assert apply_patch(pod, decode_patch(first))["metadata"]["annotations"][p.ANNOTATION_NOT_REWRITTEN] == "no-sidecar"
    assert first["response"]["warnings"] == [
        "initshift: no sidecar yet: the namespace asks a mesh for its proxy, injected after initshift's webhook; "
        "the pod is rewritten when the apiserver re-invokes initshift after the mesh"]
    assert elsewhere["response"]["warnings"][0].startswith("initshift: no sidecar and no mesh injection requested")
