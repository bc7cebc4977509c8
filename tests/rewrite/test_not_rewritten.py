"""Decisions visible on the pod: a pod with init containers, or a run-to-completion one, that
initshift leaves as it is carries the reason (initshift.io/not-rewritten), the one change made to it."""

from __future__ import annotations

import copy

import pytest

from tests.rewrite.test_rewrite import CATALOGUE, ON, with_settings
from tests.support.fixtures import pods
from waiter import protocol as p
from webhook.rewrite import rewrite
from webhook.settings import Settings

NATIVE = with_settings(mode=p.MODE_NATIVE)


def reason_on(pod: dict) -> str | None:
    return ((pod.get("metadata") or {}).get("annotations") or {}).get(p.ANNOTATION_NOT_REWRITTEN)


@pytest.mark.parametrize("settings", [ON, NATIVE], ids=["waiter", "native"])
@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_skipped_pods_with_init_containers_carry_the_reason_and_nothing_else(name, settings):
    pod = CATALOGUE[name]
    result = rewrite(pod, settings, native_supported=True)
    if result.changed:
        assert reason_on(result.pod) is None
        return
    if pod["spec"].get("initContainers") or pod["spec"].get("restartPolicy") in ("Never", "OnFailure"):
        assert reason_on(result.pod) == result.reason
        stripped = copy.deepcopy(result.pod)
        del stripped["metadata"]["annotations"][p.ANNOTATION_NOT_REWRITTEN]
        assert stripped == {**pod, "metadata": {**pod["metadata"],
                                                "annotations": pod["metadata"].get("annotations") or {}}}
    else:
        assert result.pod is pod, "long-running pods without init containers are not touched at all"


def test_the_catalogue_has_both_kinds_of_skip():
    skipped = {n: rewrite(pod, ON) for n, pod in CATALOGUE.items()}
    assert {n for n, r in skipped.items() if not r.changed and reason_on(r.pod)} >= {"job", "deployment-istio",
                                                                                     "cronjob"}
    service = pods.as_deployment_pod(pods.without_init(CATALOGUE["cronjob-istio"]))
    untouched = rewrite(service, ON)
    assert untouched.pod is service and untouched.reason == "no-init-containers"


@pytest.mark.parametrize("mode", p.MODES[1:])
@pytest.mark.parametrize("detected", [True, None, False])
def test_a_plain_long_running_pod_is_never_touched(mode, detected):
    """No init container, no sidecar, restartPolicy Always (a Deployment's pod): untouched in
    every mode, no note on it, no word about restartPolicy, counted as no-init-containers."""
    plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "shop"},
             "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}}
    result = rewrite(plain, with_settings(mode=mode), native_supported=detected)
    assert result.pod is plain and not result.changed and result.reason == "no-init-containers"
    assert result.warnings == ["initshift: no init container needs the sidecars; admitted unchanged"]


@pytest.mark.parametrize("settings", [ON, NATIVE], ids=["waiter", "native"])
def test_a_later_rewrite_drops_the_reason(settings):
    """Admitted before the mesh injected (no-sidecar), rewritten on re-invocation."""
    first = rewrite(CATALOGUE["job"], settings, native_supported=True)
    assert reason_on(first.pod) == "no-sidecar"
    second = rewrite(pods.inject_istio(first.pod), settings, native_supported=True)
    assert second.changed and second.strategy and reason_on(second.pod) is None
    assert rewrite(second.pod, settings, native_supported=True).pod == second.pod


def test_same_reason_again_is_no_change_and_a_new_reason_replaces_it():
    first = rewrite(CATALOGUE["deployment-istio"], ON)
    assert reason_on(first.pod) == "restart-policy"
    assert rewrite(first.pod, ON).pod is first.pod
    native_refused = rewrite(first.pod, NATIVE, native_supported=False)
    assert native_refused.reason == "native-unsupported" and reason_on(native_refused.pod) == "native-unsupported"


@pytest.mark.parametrize("settings, pod, reason", [
    (Settings(), CATALOGUE["job-istio"], "feature-gate-off"),
    (with_settings(mode=p.MODE_DISABLED), CATALOGUE["job-istio"], "disabled"),
    (ON, {**CATALOGUE["job-istio"], "metadata": {**CATALOGUE["job-istio"]["metadata"],
                                                 "annotations": {p.ANNOTATION_MODE: "disabled"}}}, "disabled"),
], ids=["feature-gate-off", "mode-disabled", "pod-disabled"])
def test_switched_off_pods_are_not_touched(settings, pod, reason):
    result = rewrite(pod, settings)
    assert result.reason == reason and result.pod is pod


def test_a_managed_pod_never_gets_the_reason():
    """A native pod re-invoked with nothing left to do is initshift's own, not a skip."""
    once = rewrite(CATALOGUE["kpack-istio"], NATIVE, native_supported=True)
    again = rewrite(once.pod, NATIVE, native_supported=True)
    assert not again.changed and reason_on(again.pod) is None and again.pod == once.pod


def test_admitted_without_entrypoint_says_why():
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    del pod["spec"]["initContainers"][1]["command"]
    admitted = rewrite(pod, with_settings(on_unresolved="admit"))
    assert admitted.reason == "unresolved-entrypoint" and reason_on(admitted.pod) == "unresolved-entrypoint"
    denied = rewrite(pod, ON)
    assert denied.denied and denied.pod is pod, "a denied pod is never created: nothing to annotate"
