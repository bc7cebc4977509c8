"""The admission answer for a pod initshift does not rewrite: the reason annotation as the
only patch, the pod still counted as skipped; never in a protected namespace, never on a
denial."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from tests.support import https_helpers as h
from tests.support.fixtures import pods
from waiter import protocol as p
from webhook.admission import _review as admission
from webhook.admission._app import Reviewer
from tests.support.patching import apply_patch, decode_patch


def reviewer() -> Reviewer:
    return Reviewer(h.settings_for(Path("."), namespace="initshift-system"), None, lambda: None)


async def decide(pod: dict, namespace: str = "builds"):
    _, decision = await reviewer().decide(json.dumps(h.review(pod, namespace=namespace)).encode())
    return decision


async def test_skipped_pod_gets_only_the_reason():
    pod = pods.load("job-git-clone")
    decision = await decide(pod)
    assert (decision.outcome, decision.reason, decision.pod_result) == ("allowed", "no-sidecar", "skipped")
    patch = decode_patch(decision.answer)
    assert apply_patch(pod, patch) == pods.not_rewritten(pod, "no-sidecar")
    assert [op["path"] for op in patch] == ["/metadata/annotations/initshift.io~1not-rewritten"]
    assert "no sidecar" in decision.answer["response"]["warnings"][0]


async def test_long_running_pod_without_init_containers_no_patch():
    decision = await decide(pods.as_deployment_pod(pods.without_init(h.kpack_istio())))
    assert decision.reason == "no-init-containers" and "patch" not in decision.answer["response"]


async def test_protected_namespace_is_never_patched():
    decision = await decide(pods.load("job-git-clone"), "kube-system")
    assert decision.reason == "protected-namespace" and "patch" not in decision.answer["response"]


async def test_denied_pod_has_no_patch():
    pod = copy.deepcopy(h.kpack_istio())
    pod["metadata"]["annotations"][p.ANNOTATION_START_ORDER] = "nope"
    decision = await decide(pod)
    resp = decision.answer["response"]
    assert decision.outcome == "denied" and resp["allowed"] is False and "patch" not in resp


async def test_rewritten_pod_is_still_patched_and_counted_rewritten():
    decision = await decide(h.kpack_istio())
    assert (decision.outcome, decision.pod_result) == ("patched", "rewritten")
