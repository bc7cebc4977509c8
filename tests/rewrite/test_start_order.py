"""Declared start order (`initshift.io/start-order`): the pure rewrite and the watcher's patch."""

from __future__ import annotations

import json

import copy

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from tests.support.fixtures import pods
from tests.support.podvalidate import assert_valid_pod
from waiter import protocol as p
from webhook.rewrite import _start_order as start_order
from webhook.rewrite._entrypoint import ImageConfig, ImageEntrypoints
from tests.support.patching import apply_patch
from webhook.admission._patch import make_patch
from webhook.rewrite._resources import pod_requests
from webhook.rewrite._rewrite import plan, rewrite
from webhook.settings import RewriteSettings, Settings
from webhook.rewrite._errors import RewriteError

ON = Settings(feature_gate=True)


def web_pod(order: str | None, restart_policy: str = "Always", istio: bool = True) -> dict:
    """A Deployment's pod: app needs the proxy and a probe-less cache; agent has an exec probe."""
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "web-", "namespace": "shop", "labels": {"app": "web"}, "annotations": {}},
        "spec": {
            "restartPolicy": restart_policy,
            "containers": [
                {"name": "app", "image": "shop/web:1.4", "command": ["/web"], "args": ["--port", "8080"],
                 "ports": [{"name": "http", "containerPort": 8080}],
                 "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}},
                 "resources": {"requests": {"cpu": "200m", "memory": "256Mi"}}},
                {"name": "cache", "image": "redis:7", "command": ["redis-server"],
                 "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}}},
                {"name": "agent", "image": "shop/agent:2", "command": ["agent"],
                 "readinessProbe": {"exec": {"command": ["agent", "check"]}}},
            ],
        },
    }
    if istio:
        pod = pods.inject_istio(pod)
    if order is not None:
        pod["metadata"]["annotations"][p.ANNOTATION_START_ORDER] = order
    return pod


def by_name(pod: dict) -> dict[str, dict]:
    spec = pod["spec"]
    return {c["name"]: c for c in [*spec.get("initContainers", []), *spec["containers"]]}


def flags(c: dict) -> list[str]:
    return c["args"][: c["args"].index(p.ARGV_SEPARATOR)]


def argv(c: dict) -> list[str]:
    return c["args"][c["args"].index(p.ARGV_SEPARATOR) + 1:]


def ok(pod: dict, **kw) -> dict:
    before = copy.deepcopy(pod)
    result = rewrite(pod, ON, **kw)
    assert pod == before, "the rewrite must not mutate its input"
    assert result.denied is None, result.denied
    assert result.changed and result.reason == "rewritten", result.warnings
    assert result.strategy == p.MANAGED_START_ORDER
    assert_valid_pod(result.pod)
    assert apply_patch(pod, make_patch(pod, result.pod)) == result.pod
    again = rewrite(result.pod, ON, **kw)
    assert again.denied is None and again.pod == result.pod, "re-invocation must give the same pod"
    return result.pod


def denied(pod: dict, **kw) -> str:
    result = rewrite(pod, ON, **kw)
    assert result.denied and result.pod is pod and not result.changed
    assert result.denied.startswith("initshift: ") and "\n" not in result.denied
    return result.denied


# --- the annotation -------------------------------------------------------------------------

def test_groups_parse() -> None:
    assert start_order.parse_groups("istio-proxy, cache ; app;") == [["istio-proxy", "cache"], ["app"]]


@pytest.mark.parametrize("value, message", [
    ("", "expected groups of container names"),
    ("a,b,c", "a single group orders nothing"),
    ("a;;b", "group 2 is empty"),
    ("a,,b;c", "group 1 has an empty name"),
    ("a,a;b", "'a' is listed twice in group 1"),
    ("a;b;a", "'a' is in groups 1 and 3: it would wait for itself (a cycle)"),
])
def test_bad_annotations(value: str, message: str) -> None:
    with pytest.raises(RewriteError) as e:
        start_order.parse_groups(value)
    assert message in str(e.value) and e.value.deny


@hsettings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.sampled_from(["istio-proxy", "app", "cache", "agent", "x"]), min_size=1, max_size=3),
                min_size=1, max_size=4))
def test_any_annotation_is_applied_whole_or_denied(groups: list[list[str]]) -> None:
    pod = web_pod(";".join(",".join(g) for g in groups))
    result = rewrite(pod, ON)
    if result.denied:
        assert not result.changed and result.pod is pod
    else:
        assert result.changed
        assert_valid_pod(result.pod, versions=("1.28.0",))
        assert rewrite(result.pod, ON).pod == result.pod


# --- the rewrite ------------------------------------------------------------------------------

def test_deployment_pod_gets_its_order() -> None:
    pod = web_pod("istio-proxy,cache;app")
    out = ok(pod)
    c = by_name(out)
    assert c["istio-proxy"] == by_name(pod)["istio-proxy"], "a probed first-group container is left alone"
    app = c["app"]
    assert app["command"] == [p.WAITER_PATH]
    assert flags(app) == [p.CMD_START_AFTER, p.FLAG_NAME, "app",
                          p.FLAG_PROBE, "http://127.0.0.1:15021/healthz/ready",
                          p.FLAG_AFTER_MARKER, p.marker_path("cache")]
    assert argv(app) == ["/web", "--port", "8080"]
    # cache has no probe: wrapped only to write its startup marker, waiting for nothing
    assert flags(c["cache"]) == [p.CMD_START_AFTER, p.FLAG_NAME, "cache", p.FLAG_MARKER, p.marker_path("cache")]
    assert argv(c["cache"]) == ["redis-server"]
    assert c["agent"] == by_name(pod)["agent"], "a container outside the annotation is untouched"
    assert {"name": p.MARKER_VOLUME, "mountPath": p.MARKER_MOUNT, "readOnly": True} in app["volumeMounts"]
    assert {"name": p.MARKER_VOLUME, "mountPath": p.MARKER_MOUNT, "readOnly": False} in c["cache"]["volumeMounts"]
    assert out["spec"]["initContainers"][-1]["name"] == p.INIT_CONTAINER_NAME
    assert out["metadata"]["labels"][p.LABEL_MANAGED] == p.MANAGED_START_ORDER
    assert pod_requests(out["spec"]) == pod_requests(pod["spec"]), "the pod's request must not grow"
    for name in ("app", "cache"):  # nothing else of the container changes
        rest = {k: v for k, v in c[name].items() if k not in ("command", "args", "volumeMounts")}
        assert rest == {k: v for k, v in by_name(pod)[name].items() if k not in ("command", "args", "volumeMounts")}


def test_three_groups_wait_only_for_the_previous_group() -> None:
    out = ok(web_pod("istio-proxy;cache;app"))
    c = by_name(out)
    assert flags(c["cache"])[3:] == [p.FLAG_MARKER, p.marker_path("cache"),
                                     p.FLAG_PROBE, "http://127.0.0.1:15021/healthz/ready"]
    assert flags(c["app"])[3:] == [p.FLAG_AFTER_MARKER, p.marker_path("cache")]


def test_exec_probe_falls_back_to_the_watchers_ready_annotation() -> None:
    out = ok(web_pod("agent;app"))
    c = by_name(out)
    assert flags(c["app"])[3:] == [p.FLAG_AFTER_READY_FILE, p.container_ready_path("agent")]
    assert {"name": p.CONTAINER_READY_VOLUME, "mountPath": p.CONTAINER_READY_MOUNT, "readOnly": True} \
        in c["app"]["volumeMounts"]
    assert c["agent"] == by_name(web_pod(None))["agent"]
    volume = next(v for v in out["spec"]["volumes"] if v["name"] == p.CONTAINER_READY_VOLUME)
    assert volume["downwardAPI"]["items"] == [{"path": "agent", "fieldRef": {
        "fieldPath": f"metadata.annotations['{p.ANNOTATION_READY_PREFIX}agent']"}}]
    assert p.MARKER_VOLUME not in {v["name"] for v in out["spec"]["volumes"]}


def test_max_wait_setting_reaches_the_gated_containers() -> None:
    s = Settings(feature_gate=True, rewrite=RewriteSettings(start_order_max_wait_seconds=90))
    c = by_name(rewrite(web_pod("istio-proxy,cache;app"), s).pod)
    assert flags(c["app"])[-2:] == [p.FLAG_MAX_WAIT, "90"]
    assert p.FLAG_MAX_WAIT not in flags(c["cache"]), "a container that waits for nothing has no max wait"


def test_entrypointless_container_uses_the_image_or_is_denied() -> None:
    pod = web_pod("istio-proxy;app")
    del pod["spec"]["containers"][0]["command"]
    assert [(x.container, x.image) for x in plan(pod, ON).lookups()] == [("app", "shop/web:1.4")]
    message = denied(pod)
    assert "'app' (image 'shop/web:1.4')" in message and "ENTRYPOINT" in message
    images = {"shop/web:1.4": ImageEntrypoints({"linux/amd64": ImageConfig(("/entry",), ("serve",))})}
    out = ok(pod, images=images)
    assert argv(by_name(out)["app"]) == ["/entry", "--port", "8080"]
    assert plan(out, ON).lookups() == [], "a wrapped container's argv is read back, not looked up again"
    multi = {"shop/web:1.4": ImageEntrypoints({"linux/amd64": ImageConfig(("/amd",)),
                                               "linux/arm64": ImageConfig(("/arm",))})}
    app = by_name(ok(pod, images=multi))["app"]
    assert argv(app) == ["--port", "8080"], "the container's own args stay words after --"
    table = flags(app)[flags(app).index(p.FLAG_ARGV_MAP) + 1]
    assert json.loads(table) == {"linux/amd64": ["/amd"], "linux/arm64": ["/arm"]}


@pytest.mark.parametrize("order, message", [
    ("istio-proxy;web", "'web' is not a container of this pod"),
    ("istio-init;app", "'istio-init' is an init container"),
    ("app;cache;app", "a cycle"),
    ("app", "a single group"),
])
def test_invalid_annotations_are_denied_whole(order: str, message: str) -> None:
    assert message in denied(web_pod(order))


def test_native_sidecar_only_in_the_first_group() -> None:
    pod = pods.inject_istio(web_pod(None, istio=False), "native")
    pod["metadata"]["annotations"][p.ANNOTATION_START_ORDER] = "app;istio-proxy"
    assert "native sidecar 'istio-proxy' always starts before" in denied(pod)
    pod["metadata"]["annotations"][p.ANNOTATION_START_ORDER] = "istio-proxy;cache;app"
    c = by_name(ok(pod))
    assert p.FLAG_PROBE not in flags(c["cache"]), "the kubelet starts regular containers after native sidecars"


def test_proxy_not_injected_yet_is_ordered_on_reinvocation() -> None:
    pod = web_pod("istio-proxy;cache;app", istio=False)
    first = rewrite(pod, ON)
    assert first.denied is None and first.changed
    assert any("'istio-proxy' named in" in w for w in first.warnings)
    assert p.FLAG_PROBE not in flags(by_name(first.pod)["cache"])
    injected = pods.inject_istio(first.pod)  # the mesh injects, the apiserver re-invokes us
    second = rewrite(injected, ON)
    assert second.changed and second.denied is None
    assert_valid_pod(second.pod)
    assert flags(by_name(second.pod)["cache"])[-2:] == [p.FLAG_PROBE, "http://127.0.0.1:15021/healthz/ready"]
    assert rewrite(second.pod, ON).pod == second.pod
    # the same as ordering a pod that had the proxy from the start, but for the volumes' order
    direct = rewrite(pods.inject_istio(pod), ON).pod
    assert by_name(direct) == by_name(second.pod)


def test_native_sidecars_preferred_for_a_first_group_of_proxies() -> None:
    out = ok(web_pod("istio-proxy;app"), native_supported=True)
    inits = out["spec"]["initContainers"]
    assert [c["name"] for c in inits] == ["istio-init", "istio-proxy"]
    assert inits[1]["restartPolicy"] == "Always" and "startupProbe" in inits[1]
    assert by_name(out)["app"] == by_name(web_pod(None))["app"], "the kubelet orders it: nothing to wrap"
    # the rest of the order is still applied by the waiter
    out = ok(web_pod("istio-proxy;cache;app"), native_supported=True)
    c = by_name(out)
    assert c["istio-proxy"]["restartPolicy"] == "Always"
    assert flags(c["app"])[3:] == [p.FLAG_AFTER_MARKER, p.marker_path("cache")]
    # mode waiter keeps the proxy where it is
    pod = web_pod("istio-proxy;app")
    pod["metadata"]["annotations"][p.ANNOTATION_MODE] = p.MODE_WAITER
    assert "istio-proxy" in {c["name"] for c in ok(pod, native_supported=True)["spec"]["containers"]}


def test_a_first_group_with_other_containers_is_wrapped_not_made_native() -> None:
    c = by_name(ok(web_pod("istio-proxy,cache;app"), native_supported=True))
    assert "restartPolicy" not in c["istio-proxy"]


def test_waiter_strategy_pods_are_denied_with_a_clear_message() -> None:
    pod = pods.catalogue()["job-istio"]
    pod["metadata"]["annotations"][p.ANNOTATION_START_ORDER] = "istio-proxy;build"
    assert "cannot be combined with the waiter strategy (this pod's init containers would become steps)" \
        in denied(pod, native_supported=False)


@pytest.mark.parametrize("policy", ["OnFailure", "Never"])
def test_a_jobs_pod_without_steps_is_denied_where_its_mains_are_the_waiters(policy: str) -> None:
    """The waiter gates a Job's mains and its last main quits the proxy; the declared order
    alone would gate them and quit nothing: the Job would never complete."""
    pod = web_pod("istio-proxy;app,cache", policy)
    message = denied(pod, native_supported=False)
    assert "cannot be combined with the waiter strategy (this pod's mains would run under the waiter, whose " \
           "last main quits the proxy); use initshift.io/mode=native" in message, message
    native = by_name(ok(pod, native_supported=True))
    assert native["istio-proxy"]["restartPolicy"] == "Always", "the kubelet stops it after the mains"


def test_composes_with_the_native_strategy() -> None:
    pod = pods.catalogue()["job-istio"]
    pod["spec"]["containers"].insert(1, {"name": "uploader", "image": "shop/up:1", "command": ["upload"]})
    pod["metadata"]["annotations"][p.ANNOTATION_START_ORDER] = "istio-proxy;build;uploader"
    out = ok(pod, native_supported=True)
    c = by_name(out)
    assert c["istio-proxy"]["restartPolicy"] == "Always" and c["git-clone"] in out["spec"]["initContainers"]
    assert flags(c["uploader"])[3:] == [p.FLAG_AFTER_MARKER, p.marker_path("build")]
    assert flags(c["build"])[3:] == [p.FLAG_MARKER, p.marker_path("build")]


def test_gate_off_disabled_and_reserved_names() -> None:
    pod = web_pod("istio-proxy;app")
    assert rewrite(pod, Settings()).pod is pod
    disabled = web_pod("istio-proxy;app")
    disabled["metadata"]["annotations"][p.ANNOTATION_MODE] = p.MODE_DISABLED
    assert rewrite(disabled, ON).reason == "disabled"
    taken = web_pod("istio-proxy;app")
    taken["spec"]["volumes"].append({"name": p.MARKER_VOLUME, "emptyDir": {}})
    assert "is reserved by initshift" in denied(taken)


def test_volumes_added_after_us_keep_their_place() -> None:
    out = ok(web_pod("istio-proxy,cache;app"))
    out["spec"]["volumes"].append({"name": "late", "emptyDir": {}})
    again = rewrite(out, ON)
    assert again.pod == out and not again.changed


# --- the watcher's part -----------------------------------------------------------------------

def test_ready_patch_mirrors_the_kubelet() -> None:
    out = ok(web_pod("agent;app"))
    assert start_order.start_order_ready_patch(out) == {
        "metadata": {"annotations": {f"{p.ANNOTATION_READY_PREFIX}agent": "false"}}}
    out["status"] = {"containerStatuses": [{"name": "agent", "ready": True}, {"name": "app", "ready": False}]}
    patch = start_order.start_order_ready_patch(out)
    assert patch == {"metadata": {"annotations": {f"{p.ANNOTATION_READY_PREFIX}agent": "true"}}}
    out["metadata"]["annotations"].update(patch["metadata"]["annotations"])
    assert start_order.start_order_ready_patch(out) is None
    out["status"]["containerStatuses"][0]["ready"] = False  # restarted: not ready again
    assert start_order.start_order_ready_patch(out)["metadata"]["annotations"] == {
        f"{p.ANNOTATION_READY_PREFIX}agent": "false"}
    assert start_order.start_order_ready_patch(ok(web_pod("istio-proxy;app"))) is None


def test_a_name_too_long_for_its_ready_annotation_is_denied() -> None:
    # initshift.io/ready-<name> must be a qualified name (name part <= 63 characters): the
    # apiserver rejects a downward-API item, and the watcher's patch, with a longer key.
    long = "agent-" + "x" * 52  # 58 characters: a valid container name, a 64-character key
    pod = web_pod(f"{long};app")
    next(c for c in pod["spec"]["containers"] if c["name"] == "agent")["name"] = long
    assert f"{long!r}" in denied(pod) and "too long" in denied(pod)
    pod["metadata"]["annotations"][p.ANNOTATION_START_ORDER] = "istio-proxy;app"
    ok(pod)  # the same container, not waited for: nothing to read


def test_podcheck_sees_bad_downward_api_annotation_keys() -> None:
    from webhook.rewrite._podcheck import pod_problems
    out = ok(web_pod("agent;app"))
    volume = next(v for v in out["spec"]["volumes"] if v["name"] == p.CONTAINER_READY_VOLUME)
    volume["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"] = f"metadata.annotations['{'a' * 64}']"
    assert any("not a valid annotation key" in x for x in pod_problems(out))


def test_pull_secrets_go_with_initshift_init() -> None:
    s = Settings(feature_gate=True, rewrite=RewriteSettings(image_pull_secrets=("platform-registry",)))
    out = rewrite(web_pod("istio-proxy;app"), s).pod
    assert out["spec"]["imagePullSecrets"] == [{"name": "platform-registry"}]
    assert rewrite(out, s).pod == out
