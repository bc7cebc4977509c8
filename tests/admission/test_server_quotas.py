"""ResourceQuotas through the real HTTPS server: a build whose steps' limits would exceed its
namespace's quota once they run side by side is admitted unchanged, saying so, whether the
view knew the quota (no I/O) or a live list had to say; a quota with room changes nothing."""

from __future__ import annotations

import pytest

from tests.kube.test_views import live_lists, until
from tests.admission.test_server_limitranges import api, mutate, serving  # noqa: F401 - api: a fixture
from tests.support import https_helpers as h
from tests.support.patching import apply_patch, decode_patch
from waiter import protocol as p
from webhook.kube import ResourceQuotas


def quota(limit: str) -> dict:
    hard = {"limits.memory": limit}
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "compute", "namespace": "builds"},
            "spec": {"hard": hard}, "status": {"hard": hard, "used": {"limits.memory": "1Gi"}}}


def limited_build() -> dict:
    """kpack under Istio, each step limited to 1Gi of memory: 1Gi of limits.memory as admitted
    (and the proxy's), about 6Gi rewritten."""
    pod = h.kpack_istio()
    for c in pod["spec"]["initContainers"]:
        c["resources"] = {"requests": {"memory": "64Mi"}, "limits": {"memory": "1Gi"}}
    return pod


@pytest.mark.parametrize("synced", [True, False], ids=["informer", "live-list"])
async def test_a_quota_the_rewrite_would_exceed_leaves_the_pod_unchanged(kube, api, tmp_path, synced):
    ca = h.make_certs(tmp_path)
    kube.put("resourcequotas", quota("4Gi"))
    view = ResourceQuotas(api) if synced else ResourceQuotas(api, ttl=0.0)  # live: every review lists
    pod = limited_build()
    async with serving(tmp_path, view, run_view=synced) as url:
        if synced:
            await until(lambda: view.known("builds") is not None, "the view holds the quota")
        answer = await mutate(url, ca, pod)
        kube.put("resourcequotas", quota("100Gi"))  # raised: the pod fits once rewritten
        if synced:
            await until(lambda: view.known("builds")[0]["status"]["hard"]["limits.memory"] == "100Gi",
                        "the watch brought the new quota")
        roomy = await mutate(url, ca, pod)
    kept = apply_patch(pod, decode_patch(answer))
    assert kept["metadata"]["annotations"][p.ANNOTATION_NOT_REWRITTEN] == "resources"
    assert p.LABEL_MANAGED not in kept["metadata"].get("labels", {})
    [warning] = answer["response"]["warnings"]
    assert warning.startswith("initshift: the rewritten pod would break the namespace's quota (exceeded quota: "
                              "compute, requested: limits.memory="), warning
    assert warning.endswith(", used: limits.memory=1Gi, limited: limits.memory=4Gi); admitted unchanged"), warning
    rewritten = apply_patch(pod, decode_patch(roomy))
    assert rewritten["metadata"]["labels"][p.LABEL_MANAGED] == p.MODE_WAITER
    assert live_lists(kube, "builds", "resourcequotas") == (0 if synced else 2)
