"""A namespace's ResourceQuotas: a rewritten pod that would exceed one the pod as admitted
fits is admitted unchanged, saying why in the apiserver's words
(webhook/rewrite/_quota.py). The e2e's `resource-quota` scenario checks the words and the
charge against a real apiserver's quota admission."""

from __future__ import annotations

import copy
import re

import pytest

from tests.support.fixtures import pods
from waiter import protocol as p
from webhook.rewrite._quota import exceeded
from webhook.rewrite._reasons import Reason
from webhook.rewrite._rewrite import rewrite
from webhook.settings import RewriteSettings, Settings


def settings(mode: str = "auto") -> Settings:
    return Settings(feature_gate=True, rewrite=RewriteSettings(mode=mode))


def quota(name: str, hard: dict, used: dict | None = None, **spec: object) -> dict:
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name, "namespace": "ns"},
            "spec": {"hard": hard, **spec}, "status": {"hard": hard, "used": used or {k: "0" for k in hard}}}


def limited_build() -> dict:
    """kpack under Istio, each of its six steps limited to 2 CPUs and 1Gi (a LimitRange's
    `default`): charged 2 CPUs of limits.cpu as admitted, 12 rewritten."""
    pod = copy.deepcopy(pods.catalogue()["kpack-istio"])
    for c in pod["spec"]["initContainers"]:
        if c["name"] != "istio-init":
            c["resources"] = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "2", "memory": "1Gi"}}
    return pod


@pytest.mark.parametrize("mode", ["waiter", "hybrid"])
def test_a_rewrite_that_would_exceed_a_quota_leaves_the_pod_unchanged(mode: str) -> None:
    pod = limited_build()
    free = rewrite(pod, settings(mode), native_supported=True)
    assert free.changed
    tight = [quota("compute", {"limits.cpu": "8", "requests.cpu": "4"}, {"limits.cpu": "1", "requests.cpu": "1"})]
    result = rewrite(pod, settings(mode), native_supported=True, quotas=tight)
    assert not result.changed and result.reason == Reason.RESOURCES and result.pod["spec"] == pod["spec"]
    assert result.pod["metadata"]["annotations"][p.ANNOTATION_NOT_REWRITTEN] == "resources"
    [message] = exceeded(pod, free.pod, tight)
    # six 2-CPU steps side by side, and the rest (requests.cpu is kept: not named)
    assert re.fullmatch(r"exceeded quota: compute, requested: limits\.cpu=14\d\d\dm, used: limits\.cpu=1, "
                        r"limited: limits\.cpu=8", message), message
    assert result.warnings == [f"initshift: the rewritten pod would break the namespace's quota ({message}); "
                               f"admitted unchanged"]
    # room enough: rewritten as without a quota
    ample = [quota("compute", {"limits.cpu": "100", "limits.memory": "100Gi", "requests.cpu": "4"})]
    assert rewrite(pod, settings(mode), native_supported=True, quotas=ample).pod == free.pod


def test_the_charge_is_the_schedulers_and_the_words_the_apiservers() -> None:
    before = {"spec": {"initContainers": [{"name": "a", "resources": {"limits": {"cpu": "2", "memory": "1Gi"}}},
                                          {"name": "b", "resources": {"limits": {"cpu": "2", "memory": "1Gi"}}}],
                       "containers": [{"name": "m", "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}}}]}}
    after = {"spec": {"containers": [*before["spec"]["initContainers"], *before["spec"]["containers"]]}}
    q = quota("compute", {"limits.cpu": "4", "limits.memory": "3Gi", "pods": "10", "cpu": "10"},
              {"limits.cpu": "500m", "limits.memory": "0", "pods": "3", "cpu": "0"})
    # as init containers: 2 CPUs (the larger of 2 and 0.5); as regular ones: 4.5
    assert exceeded(before, after, [q]) == [
        "exceeded quota: compute, requested: limits.cpu=4500m, used: limits.cpu=500m, limited: limits.cpu=4"]
    # a pod the quota refuses as admitted is not the rewrite's doing; nor a quota without status
    assert exceeded(before, after, [quota("x", {"limits.cpu": "2"}, {"limits.cpu": "1"})]) == []
    assert exceeded(before, after, [{**q, "status": {}}]) == []


@pytest.mark.parametrize(("scopes", "selector", "applies"), [
    (["NotTerminating"], None, True),
    (["Terminating"], None, False),  # no activeDeadlineSeconds at creation
    (["NotBestEffort"], None, True),
    (["BestEffort"], None, False),
    ([], {"scopeName": "PriorityClass", "operator": "In", "values": ["builds"]}, True),
    ([], {"scopeName": "PriorityClass", "operator": "NotIn", "values": ["builds"]}, False),
    ([], {"scopeName": "PriorityClass", "operator": "DoesNotExist"}, False),
    ([], {"scopeName": "CrossNamespacePodAffinity", "operator": "Exists"}, False),
])
def test_only_quotas_whose_scopes_match_the_pod_count(scopes: list, selector: dict | None, applies: bool) -> None:
    pod = limited_build()
    pod["spec"]["priorityClassName"] = "builds"
    spec = {"scopes": scopes, **({"scopeSelector": {"matchExpressions": [selector]}} if selector else {})}
    tight = [quota("scoped", {"limits.cpu": "8"}, **spec)]
    result = rewrite(pod, settings("waiter"), quotas=tight)
    assert result.changed is not applies, result.warnings


def test_a_pod_asking_for_a_proxy_under_a_quota_is_rewritten_once_the_proxy_is_there() -> None:
    # The mesh's webhook runs after initshift's: the proxy's limits are unknown at the first
    # review, and the quota may not hold them beside the steps (v1.34.9 refused such pods
    # rewritten, by the proxy's limit). The re-invoked review rewrites it, or leaves it.
    pod = copy.deepcopy(pods.catalogue()["kpack"])
    pod["metadata"].setdefault("annotations", {})[p.ISTIO_INJECT_ANNOTATION] = "true"
    ample = [quota("compute", {"limits.cpu": "100", "limits.memory": "100Gi"})]
    first = rewrite(pod, settings("waiter"), quotas=ample)
    assert first.reason == Reason.NO_SIDECAR and first.pod["spec"] == pod["spec"], first.warnings
    assert "ResourceQuotas" in first.warnings[0]
    again = rewrite(pods.inject_istio(first.pod), settings("waiter"), quotas=ample)
    assert again.changed and again.reason == Reason.REWRITTEN, again.warnings
    # a quota that counts objects only, or none: rewritten at once, as before
    counts = [quota("objects", {"pods": "10"})]
    assert rewrite(pod, settings("waiter"), quotas=counts).reason == Reason.REWRITTEN
    assert rewrite(pod, settings("waiter")).reason == Reason.REWRITTEN


@pytest.mark.parametrize("mode", ["auto", "waiter", "hybrid"])
def test_a_pod_with_a_proxy_of_its_own_asking_a_mesh_for_another_waits_for_it_under_a_quota(mode: str) -> None:
    # Found on v1.34.9 (e2e never-refused): Linkerd's proxy already there, Istio's asked for.
    # Rewritten at the first review, the steps side by side fitted the quota only without
    # Istio's proxy, whose limits then pushed the pod over (`exceeded quota`), where the pod
    # as admitted and injected fits. So it waits for the re-invoked review, as a pod with no
    # proxy at all does, and that review checks the quota with both proxies there.
    pod = copy.deepcopy(pods.catalogue()["job-linkerd"])
    pod["metadata"].setdefault("annotations", {})[p.ISTIO_INJECT_ANNOTATION] = "true"
    ample = [quota("compute", {"limits.cpu": "100", "limits.memory": "100Gi"})]
    first = rewrite(pod, settings(mode), native_supported=True, quotas=ample)
    assert first.reason == Reason.NO_SIDECAR and first.pod["spec"] == pod["spec"], first.warnings
    assert "has not injected its proxy yet" in first.warnings[0]
    again = rewrite(pods.inject_istio(first.pod), settings(mode), native_supported=True, quotas=ample)
    assert again.changed, again.warnings
    # Without a quota that charges resources it is rewritten at once, as before; and a pod
    # the mesh has injected already (its status annotation) waits for nothing.
    assert rewrite(pod, settings(mode), native_supported=True).changed
    injected = pods.inject_istio(pod)
    assert rewrite(injected, settings(mode), native_supported=True, quotas=ample).changed


def _namespace(labels: dict | None = None, annotations: dict | None = None) -> dict:
    return {"metadata": {"name": "ns", "labels": labels or {}, "annotations": annotations or {}}}


@pytest.mark.parametrize(("labels", "annotations", "pod_says", "waits"), [
    ({"istio-injection": "enabled"}, None, None, True),
    ({"istio.io/rev": "1-27"}, None, None, True),  # a revision label injects too
    ({"istio-injection": "disabled", "istio.io/rev": "1-27"}, None, None, False),  # istio-injection wins
    ({"istio-injection": "enabled"}, None, "false", False),  # the pod opts out of its namespace's
    (None, {"linkerd.io/inject": "enabled"}, None, False),  # Linkerd's proxy is there already
    ({}, None, None, False),
])
def test_a_namespace_label_that_asks_a_mesh_for_a_proxy_makes_the_pod_wait_under_a_quota(
        labels: dict | None, annotations: dict | None, pod_says: str | None, waits: bool) -> None:
    # Istio injects by the namespace's label alone, after initshift's first review: the pod
    # itself does not say so, its Namespace (read by the server, docs/admission-server.md) does.
    pod = copy.deepcopy(pods.catalogue()["job-linkerd"])
    if pod_says is not None:
        pod["metadata"].setdefault("labels", {})[p.ISTIO_INJECT_LABEL] = pod_says
    ample = [quota("compute", {"limits.cpu": "100", "limits.memory": "100Gi"})]
    result = rewrite(pod, settings("waiter"), quotas=ample, namespace=_namespace(labels, annotations))
    assert (result.reason == Reason.NO_SIDECAR) is waits and result.changed is not waits, result.warnings
    # Not known (no Namespace read): rewritten at once, as before; nor waits a pod on the
    # host's network, which the meshes never inject.
    assert rewrite(pod, settings("waiter"), quotas=ample).changed
    pod["spec"]["hostNetwork"] = True  # (the native strategy: the waiter leaves such a pod, host-network)
    assert rewrite(pod, settings("native"), native_supported=True, quotas=ample,
                   namespace=_namespace(labels, annotations)).changed


def test_a_pod_only_its_namespace_asks_a_mesh_for_is_told_the_proxy_comes_later() -> None:
    """Istio injects by the namespace's label, after initshift's first call: that call's
    warning (which kubectl prints with the re-invoked call's) must not say no injection was
    asked for."""
    pod = copy.deepcopy(pods.catalogue()["job"])
    first = rewrite(pod, settings("waiter"), namespace=_namespace({"istio-injection": "enabled"}))
    assert first.reason == Reason.NO_SIDECAR and not first.changed
    assert first.warnings == ["initshift: no sidecar yet: the namespace asks a mesh for its proxy, injected after "
                              "initshift's webhook; the pod is rewritten when the apiserver re-invokes initshift "
                              "after the mesh"]
    assert rewrite(pods.inject_istio(pod), settings("waiter"), namespace=_namespace({"istio-injection": "enabled"})).changed
    for namespace in (None, _namespace()):  # not known, or asking nothing: as before
        assert "no mesh injection requested" in rewrite(pod, settings("waiter"), namespace=namespace).warnings[0]


def test_a_namespace_annotated_for_linkerd_makes_a_pod_with_istios_proxy_wait_under_a_quota() -> None:
    pod = copy.deepcopy(pods.catalogue()["kpack-istio"])
    ample = [quota("compute", {"limits.cpu": "100", "limits.memory": "100Gi"})]
    linkerd = _namespace(annotations={"linkerd.io/inject": "enabled"})
    assert rewrite(pod, settings("waiter"), quotas=ample, namespace=linkerd).reason == Reason.NO_SIDECAR
    pod["metadata"]["annotations"]["linkerd.io/inject"] = "disabled"  # the pod's own word wins
    assert rewrite(pod, settings("waiter"), quotas=ample, namespace=linkerd).changed
