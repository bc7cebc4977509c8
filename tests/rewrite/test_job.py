"""Run-to-completion pods without init containers (a Job's, a CronJob's, a bare pod's): the
mains gated on the sidecars and quitting them (waiter), or the proxy made a native sidecar
(native support), every shape checked against the Kubernetes schemas; what is left alone;
bad input; re-invocation after the mesh injects."""

from __future__ import annotations

import copy
import json

import pytest

from tests.rewrite.test_rewrite import argv_after_separator, flag_values, names, waiter_args
from tests.support.fixtures import pods
from tests.support.patching import apply_patch
from tests.support.podvalidate import NEWEST, assert_valid_pod
from waiter import protocol as p
from webhook.admission._patch import make_patch
from webhook.rewrite._entrypoint import ImageConfig, ImageEntrypoints
from webhook.rewrite._hold import readiness_wait, removed_post_start, without_post_start
from webhook.rewrite._resources import pod_requests
from webhook.rewrite._rewrite import plan, rewrite
from webhook.settings import RewriteSettings, Settings

ON = Settings(feature_gate=True)
CATALOGUE = pods.catalogue()
JOBS = ["cronjob-istio", "cronjob-istio-cni", "cronjob-linkerd", "cronjob-on-failure-istio", "no-init-istio"]
PROXIES = ("istio-proxy", "linkerd-proxy")
MESH_INITS = ("istio-init", "istio-validation", "linkerd-init")


def by_name(pod: dict) -> dict[str, dict]:
    spec = pod["spec"]
    return {c["name"]: c for c in [*(spec.get("initContainers") or []), *spec["containers"]]}


def mains_of(pod: dict) -> list[str]:
    return [c["name"] for c in pod["spec"]["containers"] if c["name"] not in PROXIES]


def check_waiter_job_pod(src: dict, out: dict, native: bool | None = None) -> None:
    """Valid; every main under the waiter with its argv word for word, gated on the sidecars
    (ready file, loopback probes), none waiting for a step; the last one quits every regular
    sidecar; the sidecars untouched; the effective request unchanged; idempotent."""
    assert_valid_pod(out)
    assert apply_patch(src, make_patch(src, out)) == out
    before = by_name(src)
    mains = mains_of(src)
    sidecars = [c for c in src["spec"]["containers"] if c["name"] in PROXIES]
    assert out["metadata"]["labels"][p.LABEL_MANAGED] == p.MODE_WAITER
    assert json.loads(out["metadata"]["annotations"][p.ANNOTATION_STEPS]) == []
    assert json.loads(out["metadata"]["annotations"][p.ANNOTATION_MAINS]) == mains
    assert names(out["spec"]["initContainers"])[-1] == p.INIT_CONTAINER_NAME
    assert names(out["spec"]["containers"]) == names(src["spec"]["containers"]), "the order is kept"
    retry = src["spec"].get("restartPolicy") == "OnFailure"
    quits = [p.DEFAULT_QUIT_ENDPOINTS[s["name"]] for s in sidecars]
    for i, name in enumerate(mains):
        c = by_name(out)[name]
        o = before[name]
        assert c["command"] == [p.WAITER_PATH]
        assert argv_after_separator(c) == [*o["command"], *o.get("args", [])], "argv kept word for word"
        assert {k: v for k, v in c.items() if k not in ("command", "args", "volumeMounts")} == \
            {k: v for k, v in o.items() if k not in ("command", "args", "volumeMounts")}
        assert flag_values(c, p.FLAG_WAIT) == [], "no step to wait for"
        probes = [_probe(x) for x in sidecars]
        # Every main is gated: by the sidecars' probes when each has one, else the ready file.
        assert flag_values(c, p.FLAG_PROBE) == (probes if all(probes) else [])
        assert flag_values(c, p.FLAG_READY_FILE) == ([] if all(probes) else [p.READY_FILE])
        assert flag_values(c, p.FLAG_QUIT) == quits, "any main may be the last"
        assert flag_values(c, p.FLAG_MAINS) == [str(len(mains))]
        assert flag_values(c, p.FLAG_POST) == [p.completion_path(i)]
        assert (p.FLAG_RETRY in waiter_args(c)) == retry
    released = removed_post_start(out)
    for s in sidecars:
        s = quit_served(s)
        if s["name"] in released:  # a readiness wait the mains' gate repeats (Linkerd's linkerd-await)
            assert released[s["name"]] == s["lifecycle"]["postStart"] and readiness_wait(s) is not None
            assert by_name(out)[s["name"]] == without_post_start(s), "the sidecar is untouched but for that hook"
        else:
            assert by_name(out)[s["name"]] == s, "the sidecar is untouched"
            assert readiness_wait(s) is None or not all(flag_values(by_name(out)[m], p.FLAG_PROBE) for m in mains), \
                "a readiness wait the gate repeats goes"
    assert pod_requests(out["spec"]) == pod_requests(src["spec"]), "the effective request is unchanged"
    again = rewrite(out, ON, native_supported=native)
    assert again.pod == out and not again.changed and make_patch(out, again.pod) == [], "idempotent"


def quit_served(sidecar: dict) -> dict:
    """A sidecar as the waiter's quit needs it: Linkerd's proxy (the fixture's, of a Linkerd
    before 2.16, has no entry) serving its /shutdown."""
    if sidecar["name"] != p.LINKERD_PROXY:
        return sidecar
    return {**sidecar, "env": [*sidecar.get("env", []), {"name": p.LINKERD_SHUTDOWN_ENV, "value": "true"}]}


def _probe(sidecar: dict) -> str | None:
    from webhook.rewrite._waiter import loopback_probe
    return loopback_probe(sidecar)


def check_native_job_pod(src: dict, out: dict) -> None:
    """Valid; the regular proxy now a native sidecar after the mesh's init containers, with a
    startupProbe (its own or derived from its readiness probe); the mains and everything else
    untouched, no waiter; the effective request unchanged; idempotent."""
    assert_valid_pod(out, ("1.29.0", NEWEST))  # restartPolicy on init containers
    assert apply_patch(src, make_patch(src, out)) == out
    assert out["metadata"]["labels"][p.LABEL_MANAGED] == p.MODE_NATIVE
    inits = out["spec"]["initContainers"]
    assert p.INIT_CONTAINER_NAME not in names(inits), "no waiter where nothing needs it"
    proxies = [c for c in inits if c["name"] in PROXIES]
    assert proxies and all(c["restartPolicy"] == "Always" and "startupProbe" in c for c in proxies)
    assert names(inits) == [n for n in names(src["spec"].get("initContainers") or [])] + names(proxies), \
        "after the mesh's init containers"
    assert out["spec"]["containers"] == [c for c in src["spec"]["containers"] if c["name"] not in PROXIES]
    for c in proxies:
        was = by_name(src)[c["name"]]
        assert {k: v for k, v in c.items() if k not in ("restartPolicy", "startupProbe")} == \
            {k: v for k, v in was.items() if k != "startupProbe"}
    assert pod_requests(out["spec"]) == pod_requests(src["spec"]), "native sidecars count in both phases"
    again = rewrite(out, ON, native_supported=True)
    assert again.pod == out and not again.changed, "idempotent"


@pytest.mark.parametrize("name", JOBS)
def test_job_shapes_under_the_waiter(name):
    src = copy.deepcopy(CATALOGUE[name])
    for native in (None, False):
        result = rewrite(CATALOGUE[name], ON, native_supported=native)
        assert CATALOGUE[name] == src, "the input is never mutated"
        assert result.changed and result.strategy == p.MODE_WAITER, result.warnings
        check_waiter_job_pod(src, result.pod, native)


@pytest.mark.parametrize("name", JOBS)
@pytest.mark.parametrize("mode", [p.MODE_AUTO, p.MODE_NATIVE, p.MODE_HYBRID])
def test_job_shapes_with_native_sidecars(name, mode):
    src = CATALOGUE[name]
    result = rewrite(src, Settings(feature_gate=True, rewrite=RewriteSettings(mode=mode)), native_supported=True)
    assert result.changed and result.strategy == p.MODE_NATIVE, result.warnings
    check_native_job_pod(src, result.pod)


@pytest.mark.parametrize("mode", [p.MODE_NATIVE, p.MODE_HYBRID])
def test_native_or_hybrid_asked_for_where_native_sidecars_do_not_run(mode):
    settings = Settings(feature_gate=True, rewrite=RewriteSettings(mode=mode))
    refused = rewrite(CATALOGUE["cronjob-istio"], settings, native_supported=False)
    assert refused.reason == "native-unsupported" and f"INITSHIFT_MODE={mode}, but" in refused.warnings[0]
    unknown = rewrite(CATALOGUE["cronjob-istio"], settings, native_supported=None)
    assert unknown.strategy == p.MODE_NATIVE and any("unknown" in w for w in unknown.warnings)
    # The warnings name where the mode came from: the server's setting above, the pod's
    # annotation, or the caller's (`initshift mutate --mode`).
    assert any(f"as INITSHIFT_MODE={mode} asks" in w for w in unknown.warnings)
    annotated = copy.deepcopy(CATALOGUE["cronjob-istio"])
    annotated["metadata"]["annotations"][p.ANNOTATION_MODE] = mode
    assert f"{p.ANNOTATION_MODE}={mode}, but" in rewrite(annotated, Settings(feature_gate=True),
                                                         native_supported=False).warnings[0]
    flagged = rewrite(CATALOGUE["cronjob-istio"], settings, native_supported=None, mode_from="--mode")
    assert any(f"as --mode {mode} asks" in w for w in flagged.warnings), flagged.warnings


def test_cronjob_under_istio_classic_layout():
    """The README's worked example, flag by flag."""
    src = CATALOGUE["cronjob-istio"]
    out = rewrite(src, ON).pod
    report = out["spec"]["containers"][0]
    assert report["args"] == [
        p.CMD_RUN, p.FLAG_NAME, "report", p.FLAG_POST, p.completion_path(0),
        p.FLAG_PROBE, "http://127.0.0.1:15021/healthz/ready",
        p.FLAG_QUIT, "http://127.0.0.1:15020/quitquitquit", p.FLAG_MAINS_DIR, p.MAINS_MOUNT, p.FLAG_MAINS, "1",
        p.ARGV_SEPARATOR, "sh", "-c", src["spec"]["containers"][0]["args"][0]]
    assert [m["name"] for m in report["volumeMounts"]] == [p.BIN_VOLUME, p.run_volume(0), p.MAINS_VOLUME]
    writable = [m["name"] for m in report["volumeMounts"] if not m.get("readOnly")]
    assert writable == [p.run_volume(0), p.MAINS_VOLUME]
    assert names(out["spec"]["initContainers"]) == ["istio-init", p.INIT_CONTAINER_NAME]


def test_linkerd_is_quit_on_its_shutdown_endpoint():
    out = rewrite(CATALOGUE["cronjob-linkerd"], ON).pod
    report = by_name(out)["report"]
    assert flag_values(report, p.FLAG_QUIT) == ["http://127.0.0.1:4191/shutdown"]
    assert flag_values(report, p.FLAG_PROBE) == ["http://127.0.0.1:4191/ready"]
    assert out["spec"]["containers"][0]["name"] == "linkerd-proxy", "the proxy still starts first"


def test_on_failure_and_several_mains():
    result = rewrite(CATALOGUE["cronjob-on-failure-istio"], ON)
    out = result.pod
    for name in ("report", "upload"):
        c = by_name(out)[name]
        assert p.FLAG_RETRY in waiter_args(c) and flag_values(c, p.FLAG_MAINS) == ["2"]
        assert flag_values(c, p.FLAG_PROBE) == ["http://127.0.0.1:15021/healthz/ready"]
    assert any("a main the kubelet restarts waits for the sidecars again" in w for w in result.warnings)
    assert not any("failed step" in w for w in result.warnings)


def test_configured_quit_endpoint_and_custom_sidecar():
    pod = copy.deepcopy(CATALOGUE["cronjob"])
    pod["metadata"]["annotations"][p.ANNOTATION_SIDECARS] = "vault-agent"
    pod["spec"]["containers"].append({"name": "vault-agent", "image": "hashicorp/vault:1.17",
                                      "readinessProbe": {"tcpSocket": {"port": 8200}}})
    settings = Settings(feature_gate=True, rewrite=RewriteSettings(
        quit_endpoints={**p.DEFAULT_QUIT_ENDPOINTS, "vault-agent": "http://127.0.0.1:8200/agent/v1/quit"}))
    out = rewrite(pod, settings).pod
    report = by_name(out)["report"]
    assert flag_values(report, p.FLAG_QUIT) == ["http://127.0.0.1:8200/agent/v1/quit"]
    assert flag_values(report, p.FLAG_PROBE) == ["tcp://127.0.0.1:8200"]
    assert_valid_pod(out)
    native = rewrite(pod, settings, native_supported=True).pod
    assert by_name(native)["vault-agent"]["startupProbe"] == {"tcpSocket": {"port": 8200}}, "derived"


# --- what is left alone ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, native, reason", [
    ("cronjob-deployment-istio", None, "no-init-containers"),  # long-running: never touched
    ("cronjob-deployment-istio", True, "no-init-containers"),
    ("cronjob", None, "no-sidecar"),
    ("cronjob", True, "no-sidecar"),
    ("cronjob-istio-native", None, "already-native"),  # the kubelet already orders and stops it
    ("cronjob-istio-native", True, "already-native"),
])
def test_left_alone_with_the_reason_on_the_pod(name, native, reason):
    pod = CATALOGUE[name]
    result = rewrite(pod, ON, native_supported=native)
    assert not result.changed and result.reason == reason, result.warnings
    assert result.pod == pods.not_rewritten(pod, reason)
    if pod["spec"]["restartPolicy"] != "Always":
        assert result.pod["metadata"]["annotations"][p.ANNOTATION_NOT_REWRITTEN] == reason, \
            "a run-to-completion pod says why, init containers or not"


def test_istio_injection_turned_off_is_left_alone():
    pod = copy.deepcopy(CATALOGUE["cronjob"])
    pod["metadata"]["annotations"][p.ISTIO_INJECT_ANNOTATION] = "false"
    for native in (None, True):
        result = rewrite(pod, ON, native_supported=native)
        assert result.reason == "no-sidecar" and not result.changed
        assert "re-invoked if a mesh injects later" in result.warnings[0]


def test_a_pod_of_sidecars_only_is_left_alone():
    pod = copy.deepcopy(CATALOGUE["cronjob-istio"])
    pod["spec"]["containers"] = [c for c in pod["spec"]["containers"] if c["name"] in PROXIES]
    waiter = rewrite(pod, ON)
    assert waiter.reason == "no-mains" and not waiter.changed
    native = rewrite(pod, ON, native_supported=True)
    assert native.reason == "no-mains" and not native.changed and native.denied is None


def test_mode_disabled_and_gate_off_touch_nothing():
    pod = copy.deepcopy(CATALOGUE["cronjob-istio"])
    assert rewrite(pod, Settings()).pod is pod
    pod["metadata"]["annotations"][p.ANNOTATION_MODE] = p.MODE_DISABLED
    assert rewrite(pod, ON).pod is pod


# --- re-invocation: initshift first, the proxy added later -----------------------------------------------------
def test_reinvocation_after_the_mesh_injects_waiter():
    asked = copy.deepcopy(CATALOGUE["cronjob"])
    asked["metadata"]["annotations"][p.ISTIO_INJECT_ANNOTATION] = "true"
    first = rewrite(asked, ON)
    assert not first.changed and first.reason == "no-sidecar"
    assert "re-invoked after it" in first.warnings[0]
    injected = pods.inject_istio(first.pod)
    second = rewrite(injected, ON)
    assert second.changed and second.strategy == p.MODE_WAITER
    assert p.ANNOTATION_NOT_REWRITTEN not in second.pod["metadata"]["annotations"], "the old reason goes"
    clean = copy.deepcopy(injected)
    del clean["metadata"]["annotations"][p.ANNOTATION_NOT_REWRITTEN]
    check_waiter_job_pod(clean, second.pod)


def test_reinvocation_after_the_mesh_injects_native():
    asked = copy.deepcopy(CATALOGUE["cronjob"])
    asked["metadata"]["annotations"][p.ISTIO_INJECT_ANNOTATION] = "true"
    first = rewrite(asked, ON, native_supported=True)
    assert first.changed and first.reason == "annotated"
    assert first.pod["metadata"]["annotations"][p.ISTIO_NATIVE_ANNOTATION] == "true"
    # The mesh honours the annotation: nothing left to do.
    native = rewrite(pods.inject_istio(first.pod, "native"), ON, native_supported=True)
    assert not native.changed and native.reason == "unchanged"
    # An older mesh ignores it and injects a regular proxy: moved as the first admission would have.
    classic = pods.inject_istio(first.pod)
    moved = rewrite(classic, ON, native_supported=True)
    assert moved.changed and moved.strategy == p.MODE_NATIVE
    check_native_job_pod(classic, moved.pod)


def test_refresh_of_a_rewritten_job_recomputes_gate_and_quit():
    out = rewrite(CATALOGUE["cronjob-istio"], ON).pod
    # A second mesh's proxy added after the rewrite: gated on and quit too.
    late = pods.inject_linkerd(out)
    again = rewrite(late, ON)
    assert again.changed and again.reason == "refreshed"
    report = by_name(again.pod)["report"]
    assert flag_values(report, p.FLAG_QUIT) == ["http://127.0.0.1:4191/shutdown",
                                                "http://127.0.0.1:15020/quitquitquit"]
    assert_valid_pod(again.pod)


# --- bad input ---------------------------------------------------------------------------------------------------
def test_main_without_command_is_looked_up_or_denied():
    pod = copy.deepcopy(CATALOGUE["cronjob-istio"])
    del pod["spec"]["containers"][0]["command"]
    assert [x.container for x in plan(pod, ON).lookups()] == ["report"]
    denied = rewrite(pod, ON)
    assert denied.denied and "'report'" in denied.denied and "curlimages/curl:8.10.1" in denied.denied
    admitted = rewrite(pod, Settings(feature_gate=True, rewrite=RewriteSettings(on_unresolved="admit")))
    assert not admitted.changed and admitted.reason == "unresolved-entrypoint"
    assert admitted.pod["metadata"]["annotations"][p.ANNOTATION_NOT_REWRITTEN] == "unresolved-entrypoint"
    images = {"curlimages/curl:8.10.1": ImageEntrypoints({"linux/amd64": ImageConfig(("/entrypoint.sh",),
                                                                                      ("curl",))})}
    resolved = rewrite(pod, ON, images=images).pod
    assert argv_after_separator(by_name(resolved)["report"]) == ["/entrypoint.sh", *pod["spec"]["containers"][0]["args"]]
    assert plan(pod, ON, native_supported=True).lookups() == [], "native placement never needs the image"
    assert rewrite(pod, ON, native_supported=True).changed


@pytest.mark.parametrize("change", ["volume", "container", "copier", "mount"])
def test_reserved_names_leave_the_job_unchanged_with_the_reason(change):
    pod = copy.deepcopy(CATALOGUE["cronjob-istio"])
    main = pod["spec"]["containers"][0]
    if change == "volume":
        pod["spec"].setdefault("volumes", []).append({"name": p.MAINS_VOLUME, "emptyDir": {}})
    elif change in ("container", "copier"):
        name = p.INIT_CONTAINER_NAME if change == "container" else p.COPY_CONTAINER_NAME
        pod["spec"]["containers"].append({**copy.deepcopy(main), "name": name})
    else:
        pod["spec"].setdefault("volumes", []).append({"name": "x", "emptyDir": {}})
        main["volumeMounts"] = [{"name": "x", "mountPath": "/initshift/mains"}]
    result = rewrite(pod, ON)
    assert not result.changed and result.denied is None and "reserved by initshift" in result.warnings[0]
    assert result.pod["metadata"]["annotations"][p.ANNOTATION_NOT_REWRITTEN] == result.reason


def test_forged_watcher_annotations_are_removed():
    pod = copy.deepcopy(CATALOGUE["cronjob-istio"])
    pod["metadata"]["annotations"].update({p.ANNOTATION_READY: p.READY_TRUE,
                                           p.ANNOTATION_OUTCOME: json.dumps({"result": "Succeeded"})})
    for native in (None, True):
        result = rewrite(pod, ON, native_supported=native)
        assert result.changed and "only the initshift watcher writes them" in result.warnings[0]
        ann = result.pod["metadata"]["annotations"]
        assert p.ANNOTATION_READY not in ann and p.ANNOTATION_OUTCOME not in ann


def test_a_job_too_large_to_rewrite_is_left_unchanged():
    from webhook.rewrite._podcheck import MAX_OBJECT_BYTES, object_bytes

    pod = copy.deepcopy(CATALOGUE["cronjob-istio"])
    main = pod["spec"]["containers"][0]
    main["env"] = [{"name": "PAD", "value": ""}]
    main["env"][0]["value"] = "x" * (MAX_OBJECT_BYTES - object_bytes(pod) - 200)
    result = rewrite(pod, ON)
    assert not result.changed and result.reason == "too-large" and result.denied is None


@pytest.mark.parametrize("pod", [
    {"metadata": "x", "spec": {"restartPolicy": "Never", "containers": [{"name": "a", "image": "i"}]}},
    {"metadata": {"labels": "x"}, "spec": {"restartPolicy": "Never", "containers": [{"name": "a", "image": "i"}]}},
    {"metadata": {"annotations": "x"}, "spec": {"restartPolicy": "OnFailure", "containers": "x"}},
    {"spec": {"restartPolicy": ["Never"], "containers": [{"name": "a", "image": "i"}]}},
    {"spec": "x"},
], ids=["metadata-string", "labels-string", "annotations-string", "policy-list", "spec-string"])
def test_malformed_run_to_completion_pods_are_left_unchanged(pod):
    for native in (None, True):
        result = rewrite(pod, ON, native_supported=native)
        assert not result.changed and result.denied is None and result.reason == "invalid"


def test_argo_workflows_wait_and_main_are_both_mains():
    """An Argo Workflows pod by its shape (argoexec `init`, then `wait` beside `main`): the
    docs' claim that the proxy is quit only after `wait` has saved the outputs."""
    argoexec = "quay.io/argoproj/argoexec:v3.5.8"
    src = pods.inject_istio({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "hello-abc12", "namespace": "argo", "annotations": {}},
        "spec": {
            "restartPolicy": "Never",
            "initContainers": [{"name": "init", "image": argoexec, "command": ["argoexec", "init"],
                                "volumeMounts": [{"name": "var-run-argo", "mountPath": "/var/run/argo"}]}],
            "containers": [
                {"name": "wait", "image": argoexec, "command": ["argoexec", "wait"]},
                {"name": "main", "image": "busybox", "command": ["/var/run/argo/argoexec", "emissary", "--",
                                                                 "sh", "-c", "echo hello"],
                 "volumeMounts": [{"name": "var-run-argo", "mountPath": "/var/run/argo"}]}],
            "volumes": [{"name": "var-run-argo", "emptyDir": {}}],
        },
    })
    out = rewrite(src, ON).pod
    assert_valid_pod(out)
    assert json.loads(out["metadata"]["annotations"][p.ANNOTATION_STEPS]) == ["init"]
    assert json.loads(out["metadata"]["annotations"][p.ANNOTATION_MAINS]) == ["wait", "main"]
    for name in ("wait", "main"):
        c = by_name(out)[name]
        assert flag_values(c, p.FLAG_MAINS) == ["2"] and flag_values(c, p.FLAG_QUIT) == [
            p.DEFAULT_QUIT_ENDPOINTS["istio-proxy"]]
