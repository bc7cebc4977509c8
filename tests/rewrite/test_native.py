"""The native strategy of the pure rewrite over real-shaped pods (Istio classic, istio-cni,
holdApplicationUntilProxyStarts, Linkerd, already native, re-invocation, Deployments)."""

from __future__ import annotations

import copy
import json

import pytest

from tests.support.fixtures import pods
from tests.rewrite.test_rewrite import EXPECTED as WAITER_EXPECTED
from tests.support.podvalidate import NEWEST, assert_valid_pod
from waiter import protocol as p
from webhook.rewrite._native import startup_probe
from tests.support.patching import apply_patch
from webhook.admission._patch import make_patch
from webhook.rewrite._rewrite import plan, rewrite
from webhook.settings import RewriteSettings, Settings

ON = Settings(feature_gate=True)
NATIVE = Settings(feature_gate=True, rewrite=RewriteSettings(mode=p.MODE_NATIVE))  # auto picks hybrid for builds
CATALOGUE = pods.catalogue()
# Native sidecars need the 1.29+ schemas (restartPolicy on init containers).
NATIVE_VERSIONS = ("1.29.0", NEWEST)

# The waiter strategy's decisions, except that every restartPolicy works natively and a
# proxy already native leaves nothing to do.
EXPECTED = {**WAITER_EXPECTED, "deployment-istio": "rewritten", "kpack-istio-native": "already-native",
            "cronjob-deployment-istio": "no-init-containers"}  # a long-running pod without steps needs nothing


def native(pod: dict, settings: Settings = NATIVE, **kw) -> object:
    return rewrite(pod, settings, native_supported=True, **kw)


def with_settings(**fields) -> Settings:
    return Settings(feature_gate=True, rewrite=RewriteSettings(**{"mode": p.MODE_NATIVE, **fields}))


def names(containers) -> list[str]:
    return [c["name"] for c in containers]


def by_name(pod: dict) -> dict[str, dict]:
    spec = pod["spec"]
    return {c["name"]: c for c in [*(spec.get("initContainers") or []), *spec["containers"]]}


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_decision_and_validity(name):
    pod = CATALOGUE[name]
    before = copy.deepcopy(pod)
    result = native(pod)
    assert pod == before, "the rewrite must not mutate its input"
    assert result.reason == EXPECTED[name], result.warnings
    assert result.changed == (EXPECTED[name] == "rewritten")
    assert result.warnings and all(w.startswith("initshift: ") for w in result.warnings)
    if not result.changed:
        assert result.pod == pods.not_rewritten(pod, result.reason)
        return
    assert result.strategy == p.MODE_NATIVE
    assert_valid_pod(result.pod, NATIVE_VERSIONS)
    assert apply_patch(pod, make_patch(pod, result.pod)) == result.pod
    assert result.pod["metadata"]["labels"][p.LABEL_MANAGED] == p.MODE_NATIVE
    twice = native(result.pod)
    assert twice.pod == result.pod and not twice.changed, "idempotent"


@pytest.mark.parametrize("name, order", [
    ("kpack-istio", ["istio-init", "istio-proxy", "prepare", "analyze", "detect", "restore", "build", "export"]),
    ("kpack-istio-cni", ["istio-validation", "istio-proxy", "prepare", "analyze", "detect", "restore", "build",
                         "export"]),
    ("kpack-istio-hold", ["istio-init", "istio-proxy", "prepare", "analyze", "detect", "restore", "build",
                          "export"]),
    ("kpack-linkerd", ["linkerd-init", "linkerd-proxy", "prepare", "analyze", "detect", "restore", "build",
                       "export"]),
    ("job-linkerd", ["linkerd-init", "linkerd-proxy", "git-clone"]),
    ("deployment-istio", ["istio-init", "istio-proxy", "git-clone"]),
])
def test_proxy_goes_after_the_mesh_init_and_before_the_first_step(name, order):
    out = native(CATALOGUE[name]).pod
    assert names(out["spec"]["initContainers"]) == order
    proxy = out["spec"]["initContainers"][1]
    assert proxy["restartPolicy"] == "Always"
    assert proxy["name"] not in names(out["spec"]["containers"])
    assert all("restartPolicy" not in c for c in out["spec"]["initContainers"] if c is not proxy)


@pytest.mark.parametrize("name", ["kpack-istio", "kpack-istio-hold", "kpack-linkerd", "tekton-istio"])
def test_everything_else_keeps_its_spec_and_order(name):
    src = CATALOGUE[name]
    out = native(src).pod
    proxy = next(c for c in out["spec"]["initContainers"] if c.get("restartPolicy") == "Always")
    original = by_name(src)[proxy["name"]]
    added = {k for k in proxy if k not in original}
    assert added <= {"restartPolicy", "startupProbe"}
    assert {k: v for k, v in proxy.items() if k not in added} == original, "the proxy keeps its whole spec"
    assert [c for c in out["spec"]["initContainers"] if c is not proxy] == src["spec"]["initContainers"]
    assert out["spec"]["containers"] == [c for c in src["spec"]["containers"] if c["name"] != proxy["name"]]
    assert out["spec"]["volumes"] == src["spec"]["volumes"]
    labels = dict(out["metadata"]["labels"])
    assert labels.pop(p.LABEL_MANAGED) == p.MODE_NATIVE
    assert {**out["metadata"], "labels": labels} == src["metadata"], "only our label is added"


def test_istio_keeps_its_own_startup_probe_and_hold_keeps_its_hook():
    proxy = by_name(native(CATALOGUE["kpack-istio"]).pod)["istio-proxy"]
    assert proxy["startupProbe"] == by_name(CATALOGUE["kpack-istio"])["istio-proxy"]["startupProbe"]
    hold = by_name(native(CATALOGUE["kpack-istio-hold"]).pod)["istio-proxy"]
    assert hold["lifecycle"] == {"postStart": {"exec": {"command": ["pilot-agent", "wait"]}}}


def test_linkerd_gets_a_startup_probe_from_its_readiness_probe():
    result = native(CATALOGUE["kpack-linkerd"])
    proxy = by_name(result.pod)["linkerd-proxy"]
    assert proxy["startupProbe"] == {"httpGet": {"path": "/ready", "port": "linkerd-admin"}, "initialDelaySeconds": 2}
    assert proxy["readinessProbe"] == by_name(CATALOGUE["kpack-linkerd"])["linkerd-proxy"]["readinessProbe"]
    assert proxy["lifecycle"]["postStart"]["exec"]["command"][0] == "/usr/lib/linkerd/linkerd-await"
    assert any("startupProbe derived" in w for w in result.warnings)


@pytest.mark.parametrize("handler", [
    {"httpGet": {"path": "/healthz/ready", "port": 15021, "scheme": "HTTPS",
                 "httpHeaders": [{"name": "X-Probe", "value": "1"}]}},
    {"tcpSocket": {"port": "admin"}},
    {"exec": {"command": ["pilot-agent", "ready"]}},
    {"grpc": {"port": 9090, "service": "health"}},
])
def test_probe_derivation_keeps_ports_paths_and_thresholds(handler):
    readiness = {**copy.deepcopy(handler), "initialDelaySeconds": 1, "periodSeconds": 2, "timeoutSeconds": 3,
                 "failureThreshold": 40, "successThreshold": 3}
    probe = startup_probe(readiness)
    assert probe == {**handler, "initialDelaySeconds": 1, "periodSeconds": 2, "timeoutSeconds": 3,
                     "failureThreshold": 40, "successThreshold": 1}, "successThreshold must be 1"
    probe[next(iter(handler))]["mutated"] = True
    assert "mutated" not in readiness[next(iter(handler))], "a copy, not a shared object"


def test_probe_derivation_refuses_what_is_not_a_probe():
    assert startup_probe(None) is None
    assert startup_probe({"periodSeconds": 3}) is None
    assert startup_probe({"exec": {"command": ["a"]}, "tcpSocket": {"port": 1}}) is None  # two handlers: invalid


def test_derived_probe_in_a_pod_validates_and_sidecar_without_probe_is_warned():
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    proxy = pod["spec"]["containers"][-1]
    del proxy["startupProbe"]
    proxy["readinessProbe"]["successThreshold"] = 2
    result = native(pod)
    derived = by_name(result.pod)["istio-proxy"]["startupProbe"]
    assert derived == {"httpGet": {"path": "/healthz/ready", "port": 15021, "scheme": "HTTP"}, "periodSeconds": 15,
                       "timeoutSeconds": 3, "failureThreshold": 4, "successThreshold": 1}
    assert_valid_pod(result.pod, NATIVE_VERSIONS)
    del proxy["readinessProbe"]
    bare = native(pod)
    assert "startupProbe" not in by_name(bare.pod)["istio-proxy"]
    assert any("no readiness or startup probe" in w for w in bare.warnings)


def test_already_native_proxy_is_admitted_unchanged():
    result = native(CATALOGUE["kpack-istio-native"])
    assert not result.changed and "already runs as a native sidecar" in result.warnings[0]
    # The other strategies run its steps under the waiter beside the native proxy (hybrid).
    for settings in (ON, with_settings(mode=p.MODE_WAITER)):
        assert rewrite(CATALOGUE["kpack-istio-native"], settings).strategy == p.MODE_HYBRID


@pytest.mark.parametrize("inject, keys", [
    ((p.ISTIO_INJECT_ANNOTATION, "true"), (p.ISTIO_NATIVE_ANNOTATION,)),
    ((p.LINKERD_INJECT_ANNOTATION, "enabled"), p.LINKERD_NATIVE_ANNOTATIONS),
])
def test_reinvocation_before_and_after_injection(inject, keys):
    job = copy.deepcopy(CATALOGUE["job"])
    job["metadata"]["annotations"][inject[0]] = inject[1]
    first = native(job)
    assert first.changed and first.reason == "annotated" and first.strategy == p.MODE_NATIVE
    assert all(first.pod["metadata"]["annotations"][key] == "true" for key in keys), "under every name it reads"
    assert first.pod["metadata"]["labels"][p.LABEL_MANAGED] == p.MODE_NATIVE
    assert first.pod["spec"] == job["spec"], "nothing else changes before the proxy exists"
    assert_valid_pod(first.pod, NATIVE_VERSIONS)
    assert native(first.pod).pod == first.pod

    # A mesh that ignored the annotation put its proxy in containers: re-invocation moves it.
    istio = keys == (p.ISTIO_NATIVE_ANNOTATION,)
    injected = pods.inject_istio(first.pod) if istio else pods.inject_linkerd(first.pod)
    second = native(injected)
    assert second.changed and second.reason == "rewritten"
    assert_valid_pod(second.pod, NATIVE_VERSIONS)
    proxy = "istio-proxy" if istio else "linkerd-proxy"
    assert names(second.pod["spec"]["initContainers"])[1:] == [proxy, "git-clone"]
    assert native(second.pod).pod == second.pod


@pytest.mark.parametrize("key", p.LINKERD_NATIVE_ANNOTATIONS)
def test_linkerds_switch_under_any_of_its_names(key):
    """Linkerd renamed its native-sidecar annotation (alpha, beta from 2.19, GA from 2.20):
    a pod's own "false" under any name is its choice, left alone with every other name; its
    "true" under any name asks for a native proxy (hybrid beside it)."""
    job = copy.deepcopy(CATALOGUE["job"])
    job["metadata"]["annotations"].update({p.LINKERD_INJECT_ANNOTATION: "enabled", key: "false"})
    kept = native(job)
    assert all(k not in kept.pod["metadata"]["annotations"] for k in p.LINKERD_NATIVE_ANNOTATIONS if k != key)
    assert kept.pod["metadata"]["annotations"][key] == "false"
    assert any(f"the pod sets {key}='false'; left as it is" in w for w in kept.warnings), kept.warnings
    job["metadata"]["annotations"][key] = "true"
    assert rewrite(job, with_settings(mode=p.MODE_WAITER)).strategy == p.MODE_HYBRID, "asked natively: hybrid"


def test_reinvocation_after_native_injection_changes_nothing():
    job = copy.deepcopy(CATALOGUE["job"])
    job["metadata"]["annotations"][p.ISTIO_INJECT_ANNOTATION] = "true"
    first = native(job).pod
    injected = pods.inject_istio(first, "native")  # the mesh honoured the annotation
    again = native(injected)
    assert not again.changed and again.reason == "unchanged"
    # Detection flipping between the two calls does not switch the pod to the waiter.
    assert rewrite(injected, ON, native_supported=False).pod == injected
    assert rewrite(pods.inject_istio(first), ON, native_supported=False).strategy == p.MODE_NATIVE


def test_explicit_native_injection_opt_out_is_respected():
    job = copy.deepcopy(CATALOGUE["job"])
    job["metadata"]["annotations"].update({p.ISTIO_INJECT_ANNOTATION: "true", p.ISTIO_NATIVE_ANNOTATION: "false"})
    result = native(job)
    assert result.pod["metadata"]["annotations"][p.ISTIO_NATIVE_ANNOTATION] == "false"
    assert any("left as it is" in w for w in result.warnings)


def test_pod_without_mesh_or_sidecar_is_left_alone():
    for name in ("job", "kpack", "tekton"):
        result = native(CATALOGUE[name])
        assert not result.changed and result.reason == "no-sidecar"
        assert "nothing to fix" in result.warnings[0]


def test_auto_follows_detection():
    pod = CATALOGUE["deployment-istio"]
    assert rewrite(pod, ON, native_supported=True).strategy == p.MODE_NATIVE
    for detected, why in ((None, "unknown"), (False, "does not run native sidecars")):
        result = rewrite(pod, ON, native_supported=detected)
        assert result.reason == "restart-policy" and why in result.warnings[0], result.warnings
    assert rewrite(CATALOGUE["job-istio"], ON, native_supported=None).strategy == p.MODE_WAITER


def test_native_sidecars_setting_overrides_detection():
    pod = CATALOGUE["job-istio"]
    assert rewrite(pod, with_settings(native_sidecars="true"), native_supported=None).strategy == p.MODE_NATIVE
    assert rewrite(pod, with_settings(mode="auto", native_sidecars="true"), native_supported=None).strategy == \
        p.MODE_HYBRID
    assert rewrite(pod, with_settings(mode="auto", native_sidecars="false"), native_supported=True).strategy == \
        p.MODE_WAITER


def test_mode_native_on_unsupported_and_unknown_clusters():
    pod = copy.deepcopy(CATALOGUE["deployment-istio"])
    pod["metadata"].setdefault("annotations", {})[p.ANNOTATION_MODE] = p.MODE_NATIVE
    refused = rewrite(pod, ON, native_supported=False)
    assert not refused.changed and refused.reason == "native-unsupported" and "1.29" in refused.warnings[0]
    unknown = rewrite(pod, ON, native_supported=None)
    assert unknown.changed and unknown.strategy == p.MODE_NATIVE
    assert any("unknown" in w for w in unknown.warnings)
    assert rewrite(CATALOGUE["job-istio"], with_settings(mode="native"), native_supported=True).changed


def test_native_needs_no_image_lookups():
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    del pod["spec"]["initContainers"][1]["command"]
    assert plan(pod, NATIVE, native_supported=True).lookups() == []
    assert native(pod).changed, "steps keep running as init containers: no ENTRYPOINT needed"


def test_extra_sidecars_move_too_in_their_order():
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    pod["metadata"]["annotations"][p.ANNOTATION_SIDECARS] = "cache"
    pod["spec"]["containers"].insert(0, {"name": "cache", "image": "redis:7",
                                         "readinessProbe": {"tcpSocket": {"port": 6379}}})
    result = native(pod)
    assert names(result.pod["spec"]["initContainers"]) == ["istio-init", "cache", "istio-proxy", "git-clone"]
    assert names(result.pod["spec"]["containers"]) == ["build"]
    assert by_name(result.pod)["cache"]["startupProbe"] == {"tcpSocket": {"port": 6379}}
    assert "sidecars 'cache', 'istio-proxy'" in result.warnings[0]
    assert_valid_pod(result.pod, NATIVE_VERSIONS)


def test_kept_init_containers_before_the_first_step_run_before_the_proxy():
    pod = copy.deepcopy(CATALOGUE["tekton-istio"])
    pod["metadata"]["annotations"][p.ANNOTATION_KEEP_INIT] = "prepare,place-scripts"
    out = native(pod).pod
    assert names(out["spec"]["initContainers"]) == ["istio-init", "prepare", "place-scripts", "istio-proxy",
                                                    "step-git-clone", "step-unit-test"]


def test_mesh_init_after_a_step_keeps_the_proxy_behind_it():
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    inits = pod["spec"]["initContainers"]
    inits.insert(0, {"name": "early", "image": "alpine", "command": ["true"]})
    result = native(pod)
    assert names(result.pod["spec"]["initContainers"]) == ["early", "istio-init", "istio-proxy", "git-clone"]
    assert any("'early'" in w and "without the sidecars" in w for w in result.warnings)


def test_resources_growth_is_warned():
    result = native(CATALOGUE["kpack-istio"])
    assert any("effective request grows" in w and "beside the init containers" in w for w in result.warnings)
    assert not any("grows" in w for w in native(CATALOGUE["job-istio"]).warnings), "the build main dominates"


def test_a_pod_of_sidecars_only_is_left_alone():
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    pod["spec"]["containers"] = [c for c in pod["spec"]["containers"] if c["name"] == "istio-proxy"]
    result = native(pod)
    assert not result.changed and result.reason == "no-mains" and "no container to run" in result.warnings[0]


def test_istio_status_annotation_is_left_to_istio():
    src = CATALOGUE["kpack-istio"]
    out = native(src).pod
    assert out["metadata"]["annotations"][p.ISTIO_STATUS_ANNOTATION] == \
        src["metadata"]["annotations"][p.ISTIO_STATUS_ANNOTATION]
    assert json.loads(out["metadata"]["annotations"][p.ISTIO_STATUS_ANNOTATION])["containers"] == ["istio-proxy"]
