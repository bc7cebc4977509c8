"""The hybrid strategy of the pure rewrite (native sidecars + waiter-run steps) over
real-shaped pods: every catalogue pod, argv torture, Guaranteed QoS, the gate, what `auto`
picks, pods without sidecars, and re-invocation after the mesh injected."""

from __future__ import annotations

import copy
import json
from fractions import Fraction

import pytest

from tests.support.fixtures import pods
from tests.rewrite.test_job import check_native_job_pod
from tests.rewrite.test_rewrite import EXPECTED as WAITER_EXPECTED, argv_after_separator, flag_values, names, waiter_args
from tests.support.podvalidate import assert_valid_pod
from waiter import protocol as p
from tests.support.patching import apply_patch
from webhook.admission._patch import make_patch
from webhook.rewrite._entrypoint import ImageConfig, ImageEntrypoints
from webhook.rewrite._classify import managed_as, sidecar_names
from webhook.rewrite._hold import liveness_needs_startup
from webhook.rewrite._native import startup_probe
from webhook.rewrite._waiter import loopback_probe
from webhook.rewrite._resources import pod_requests
from webhook.rewrite._rewrite import plan, rewrite
from webhook.settings import RewriteSettings, Settings

AUTO = Settings(feature_gate=True)
HYBRID = Settings(feature_gate=True, rewrite=RewriteSettings(mode=p.MODE_HYBRID))
CATALOGUE = pods.catalogue()

# The waiter strategy's decisions (a proxy already native is rewritten by both, as hybrid).
EXPECTED = WAITER_EXPECTED
PROXIES = ("istio-proxy", "linkerd-proxy")
TORTURE = ["", " ", "a b", "'q'", '"dq"', "$(HOME)", "$$(HOME)", "back\\slash", "new\nline", "tab\there",
           "ünï©ødé", "--", "-c", "*", "; rm -rf /", "--name"]


def hybrid(pod: dict, settings: Settings = HYBRID, **kw):
    return rewrite(pod, settings, native_supported=True, **kw)


def by_name(pod: dict) -> dict[str, dict]:
    spec = pod["spec"]
    return {c["name"]: c for c in [*(spec.get("initContainers") or []), *spec["containers"]]}


def torture_pod() -> dict:
    pod = copy.deepcopy(CATALOGUE["tekton-istio"])
    for i, c in enumerate(pod["spec"]["initContainers"][1:]):
        c["command"] = ["/bin/sh", "-c", 'printf "%s|" "$@"', TORTURE[i]]
        c["args"] = TORTURE[i:] + [""]
    return pod


def guaranteed_pod() -> dict:
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    guaranteed = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
    for c in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]:
        c["resources"] = copy.deepcopy(guaranteed)
    return pod


SHAPES = {**CATALOGUE, "argv-torture": torture_pod(), "guaranteed": guaranteed_pod()}
EXPECTED_SHAPES = {**EXPECTED, "argv-torture": "rewritten", "guaranteed": "rewritten"}


def first_step(pod: dict) -> dict:
    """The container step 0's gate holds: the first, after hybrid's copier."""
    containers = pod["spec"]["containers"]
    return containers[1] if managed_as(pod) == p.MODE_HYBRID else containers[0]


def check_copier(src: dict, copier: dict) -> None:
    """The waiter is copied in the first regular container's postStart hook, which the
    kubelet runs before it creates the next container; it reserves nothing."""
    assert copier["command"] == list(p.COPY_HOLD_COMMAND)
    assert copier["lifecycle"] == {"postStart": {"exec": {"command": list(p.COPY_HOOK_COMMAND)}}}
    assert copier["volumeMounts"] == [{"name": p.BIN_VOLUME, "mountPath": p.BIN_MOUNT}]
    if any(pod_requests(src["spec"]).values()):
        assert copier["resources"]["requests"] == {"cpu": "0", "memory": "0"}
    else:
        assert "resources" not in copier, "a BestEffort pod stays BestEffort"


def check_hybrid_pod(src: dict, out: dict) -> None:
    """Valid, every container once, proxies native and the last init containers, the copier
    first, steps in order under the waiter, no quit, the effective request not grown,
    idempotent."""
    assert_valid_pod(out)
    assert apply_patch(src, make_patch(src, out)) == out
    before, after = by_name(src), by_name(out)
    assert sorted(after) == sorted([*before, p.COPY_CONTAINER_NAME])
    inits, regular = out["spec"]["initContainers"], out["spec"]["containers"]
    assert not any(c["name"] in PROXIES for c in regular), "no proxy among the regular containers"
    assert p.INIT_CONTAINER_NAME not in names(inits)
    check_copier(src, regular[0])
    assert all(c.get("restartPolicy") == "Always" for c in inits if c["name"] in PROXIES)
    meta = out["metadata"]
    assert meta["labels"][p.LABEL_MANAGED] == p.MODE_HYBRID
    steps = json.loads(meta["annotations"][p.ANNOTATION_STEPS])
    mains = json.loads(meta["annotations"][p.ANNOTATION_MAINS])
    assert [c["name"] for c in regular if c["name"] in steps + mains] == steps + mains
    for c in regular:
        if c["name"] in steps + mains:
            o = before[c["name"]]
            assert c["command"] == [p.WAITER_PATH]
            assert argv_after_separator(c) == [*o["command"], *o.get("args", [])], "argv kept as a list"
            assert flag_values(c, p.FLAG_QUIT) == [], "the kubelet stops native sidecars: nothing to quit"
    for r, value in pod_requests(out["spec"]).items():
        assert value <= pod_requests(src["spec"]).get(r, Fraction(0)), (r, "effective request grew")
    check_kubelet_hold(src, out)
    again = hybrid(out)
    assert again.pod == out and not again.changed and make_patch(out, again.pod) == [], "idempotent"


def removed_record(pod: dict, annotation: str = p.ANNOTATION_STARTUP_PROBES_REMOVED) -> dict:
    raw = pod["metadata"].get("annotations", {}).get(annotation)
    return json.loads(raw) if raw else {}


def removed_hooks(pod: dict) -> dict:
    return removed_record(pod, p.ANNOTATION_POST_START_REMOVED)


def post_start(container: dict) -> dict | None:
    return (container.get("lifecycle") or {}).get("postStart")


def check_kubelet_hold(src: dict, out: dict) -> None:
    """Nothing reaches the network before the proxy is ready where initshift took the kubelet's
    hold away: every startupProbe it removed belongs to a native sidecar step 0 probes on
    loopback, after which no init container starts, in a pod whose every regular container
    the waiter runs, and without a livenessProbe that probe kept off a slow start. A removed
    probe is the sidecar's own as admitted, or the one derived from its readiness probe."""
    spec = out["spec"]
    inits = spec["initContainers"]
    steps = json.loads(out["metadata"]["annotations"][p.ANNOTATION_STEPS])
    mains = json.loads(out["metadata"]["annotations"][p.ANNOTATION_MAINS])
    step0 = next(c for c in spec["containers"] if c["name"] == (steps or mains)[0])
    before = by_name(src)
    for name, probe in removed_record(out).items():
        i = names(inits).index(name)
        proxy = inits[i]
        assert proxy["restartPolicy"] == "Always" and "startupProbe" not in proxy, name
        assert loopback_probe(proxy) in flag_values(step0, p.FLAG_PROBE), "step 0 waits for its readiness itself"
        assert names(inits)[i + 1:] == [], "nothing else starts after it"
        assert names(spec["containers"]) == [p.COPY_CONTAINER_NAME, *steps, *mains], \
            "the waiter runs every regular container but its own copier"
        assert proxy.get("readinessProbe") == before[name].get("readinessProbe"), "readiness untouched"
        was = before[name].get("startupProbe")
        assert probe == (was if was is not None else startup_probe(before[name]["readinessProbe"]))
        assert was is None or not liveness_needs_startup(proxy)
    for name, hook in removed_hooks(out).items():  # a readiness wait goes on the same conditions
        i = names(inits).index(name)
        assert post_start(inits[i]) is None and hook == post_start(before[name]), name
        assert loopback_probe(inits[i]) in flag_values(step0, p.FLAG_PROBE) and names(inits)[i + 1:] == []
        assert names(spec["containers"]) == [p.COPY_CONTAINER_NAME, *steps, *mains]
    # And the other way: where all of that holds for a mesh's native sidecar, the hold is gone.
    recognised = sidecar_names(out["metadata"]["annotations"], RewriteSettings())
    wrapped = sorted(names(spec["containers"])) == sorted([p.COPY_CONTAINER_NAME, *steps, *mains])
    for i, c in enumerate(inits):
        if c.get("restartPolicy") == "Always" and c["name"] in recognised and wrapped \
                and loopback_probe(c) in flag_values(step0, p.FLAG_PROBE) \
                and names(inits)[i + 1:] == [] \
                and not (liveness_needs_startup(c) and "startupProbe" in before[c["name"]]):
            assert "startupProbe" not in c, c["name"]


def test_shapes_are_complete():
    assert set(EXPECTED) == set(CATALOGUE)


@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize("settings", [HYBRID, AUTO], ids=["hybrid", "auto-native"])
def test_every_shape_hybrid_and_auto_with_native_support(name, settings):
    pod = SHAPES[name]
    src = copy.deepcopy(pod)
    result = hybrid(pod, settings)
    assert pod == src, "the rewrite must not mutate its input"
    want = EXPECTED_SHAPES[name]
    if settings is AUTO and name == "deployment-istio":
        want = "rewritten"  # auto: native for restartPolicy Always
    assert result.reason == want, result.warnings
    assert result.warnings and all(w.startswith("initshift: ") for w in result.warnings)
    if not result.changed:
        assert result.pod == pods.not_rewritten(pod, result.reason)
        return
    if name == "deployment-istio":
        assert result.strategy == p.MODE_NATIVE
        return
    if name.startswith(("cronjob", "no-init")):
        # No step for the waiter: the proxy becomes a native sidecar, nothing else changes.
        assert result.strategy == p.MODE_NATIVE
        check_native_job_pod(src, result.pod)
        return
    assert result.strategy == p.MODE_HYBRID
    check_hybrid_pod(src, result.pod)


def test_kpack_layout_gate_and_resources():
    src = CATALOGUE["kpack-istio"]
    result = hybrid(src)
    out = result.pod
    spec = out["spec"]
    steps = ["prepare", "analyze", "detect", "restore", "build", "export"]
    assert names(spec["initContainers"]) == ["istio-init", "istio-proxy"]
    assert names(spec["containers"]) == [p.COPY_CONTAINER_NAME, *steps, "completion"]
    proxy, was = by_name(out)["istio-proxy"], by_name(src)["istio-proxy"]
    assert {k: v for k, v in proxy.items() if k != "restartPolicy"} == \
        {k: v for k, v in was.items() if k != "startupProbe"}, "the proxy keeps its spec but its startupProbe"
    assert removed_record(out) == {"istio-proxy": was["startupProbe"]}, "recorded as it was"
    assert any("removed the startupProbe of 'istio-proxy'" in w for w in result.warnings)
    step0 = first_step(out)
    assert flag_values(step0, p.FLAG_PROBE) == ["http://127.0.0.1:15021/healthz/ready"]
    assert flag_values(step0, p.FLAG_READY_FILE) == [], "the waiter's gate: the probe alone"
    assert p.READY_VOLUME not in [v["name"] for v in spec["volumes"]]
    assert all(flag_values(c, p.FLAG_WAIT) == [p.completion_path(i - 1)]
               for i, c in enumerate(spec["containers"][1:]) if i), "each waits for the one before; the main for the last"
    assert pod_requests(spec) == pod_requests(src["spec"]), "preserve: the effective request is unchanged"
    assert first_step(out)["resources"]["requests"] == {"cpu": "800m", "memory": "1792Mi"}
    assert not any("grows" in w for w in result.warnings)


def test_linkerd_probed_on_loopback_gets_no_startup_probe():
    result = hybrid(CATALOGUE["kpack-linkerd"])
    out = result.pod
    proxy = by_name(out)["linkerd-proxy"]
    assert proxy["restartPolicy"] == "Always" and "startupProbe" not in proxy, \
        "step 0 probes it itself: the kubelet need not hold the regular containers back"
    assert flag_values(first_step(out), p.FLAG_PROBE) == ["http://127.0.0.1:4191/ready"]
    assert names(out["spec"]["initContainers"]) == ["linkerd-init", "linkerd-proxy"]
    # Nor on linkerd-await: the kubelet starts the next container once the postStart hook returns.
    was = post_start(by_name(CATALOGUE["kpack-linkerd"])["linkerd-proxy"])
    assert was["exec"]["command"][0] == "/usr/lib/linkerd/linkerd-await"
    assert "lifecycle" not in proxy and removed_hooks(out) == {"linkerd-proxy": was}
    assert any("removed the postStart hook of 'linkerd-proxy'" in w for w in result.warnings)
    again = hybrid(out, AUTO).pod
    assert again == out, "re-invocation keeps it (and its record), in any mode"


def with_istio_hold(shape: str) -> dict:
    """`shape` with Istio's holdApplicationUntilProxyStarts: a postStart `pilot-agent wait`."""
    pod = copy.deepcopy(CATALOGUE[shape])
    proxy = next(c for c in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]
                 if c["name"] == "istio-proxy")
    proxy["lifecycle"] = {"postStart": {"exec": {"command": ["pilot-agent", "wait"]}},
                          "preStop": {"exec": {"command": ["pilot-agent", "request", "POST", "drain"]}}}
    return pod


@pytest.mark.parametrize("shape", ["job-istio", "kpack-istio-native"])
def test_istios_hold_until_the_proxy_starts_goes_where_step_0_waits_for_it(shape):
    pod = with_istio_hold(shape)
    out = hybrid(pod).pod
    assert proxy_of(out)["lifecycle"] == {"preStop": {"exec": {"command": ["pilot-agent", "request", "POST", "drain"]}}}
    assert removed_hooks(out) == {"istio-proxy": {"exec": {"command": ["pilot-agent", "wait"]}}}
    check_hybrid_pod(pod, out)


@pytest.mark.parametrize("command", [["sh", "-c", "pilot-agent wait && touch /x"], ["pilot-agent", "request", "GET"],
                                     ["/usr/lib/linkerd/linkerd-await", "--port=4191", "--", "touch", "/x"],
                                     ["linkerd-await", "touch", "/x"]])
def test_a_post_start_hook_that_does_more_than_wait_stays(command):
    pod = with_istio_hold("job-istio")
    proxy_of(pod)["lifecycle"]["postStart"] = {"exec": {"command": command}}
    out = hybrid(pod).pod
    assert post_start(proxy_of(out)) == post_start(proxy_of(pod)) and removed_hooks(out) == {}


def test_the_readiness_wait_stays_where_something_starts_after_the_proxy_and_comes_back_on_reinvocation():
    pod = with_istio_hold("job-istio")
    pod["spec"]["initContainers"].append({"name": "vault-agent-init", "image": "vault:1.17",
                                          "command": ["vault", "agent", "-exit-after-auth"]})
    pod["metadata"]["annotations"][p.ANNOTATION_KEEP_INIT] = "vault-agent-init"
    out = hybrid(pod).pod
    assert post_start(proxy_of(out)) == {"exec": {"command": ["pilot-agent", "wait"]}} and removed_hooks(out) == {}
    first = hybrid(with_istio_hold("job-istio")).pod
    assert post_start(proxy_of(first)) is None
    first["spec"]["containers"].append({"name": "log-shipper", "image": "fluent-bit:3", "command": ["fluent-bit"]})
    back = hybrid(first)
    assert post_start(proxy_of(back.pod)) == {"exec": {"command": ["pilot-agent", "wait"]}}
    assert removed_hooks(back.pod) == {}
    assert_valid_pod(back.pod)


def test_sidecar_step0_cannot_probe_gets_a_startup_probe_instead():
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    proxy = pod["spec"]["containers"][-1]
    del proxy["startupProbe"]
    proxy["readinessProbe"] = {"exec": {"command": ["pilot-agent", "ready"]}, "periodSeconds": 1}
    pod["metadata"]["annotations"][p.ANNOTATION_SIDECARS] = "cache"
    pod["spec"]["containers"].append({"name": "cache", "image": "redis:7",
                                      "readinessProbe": {"tcpSocket": {"port": 6379}}})
    result = hybrid(pod)
    out = result.pod
    assert by_name(out)["istio-proxy"]["startupProbe"] == {"exec": {"command": ["pilot-agent", "ready"]},
                                                           "periodSeconds": 1}
    assert "startupProbe" not in by_name(out)["cache"]
    step0 = first_step(out)
    assert flag_values(step0, p.FLAG_PROBE) == ["tcp://127.0.0.1:6379"], "the one it can probe"
    assert flag_values(step0, p.FLAG_READY_FILE) == []
    assert any("'istio-proxy' got a startupProbe" in w for w in result.warnings)
    check_hybrid_pod(pod, out)
    # Only sidecars step 0 cannot probe: the kubelet's start order is the whole gate.
    del pod["metadata"]["annotations"][p.ANNOTATION_SIDECARS]
    pod["spec"]["containers"].pop()
    alone = hybrid(pod).pod
    step0 = first_step(alone)
    assert flag_values(step0, p.FLAG_PROBE) == [] and flag_values(step0, p.FLAG_READY_FILE) == []
    assert p.READY_VOLUME not in [v["name"] for v in alone["spec"]["volumes"]]
    check_hybrid_pod(pod, alone)


def test_sidecar_without_any_probe_is_warned():
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    proxy = pod["spec"]["containers"][-1]
    del proxy["startupProbe"], proxy["readinessProbe"]
    result = hybrid(pod)
    assert any("no readiness or startup probe" in w for w in result.warnings)
    step0 = first_step(result.pod)
    assert flag_values(step0, p.FLAG_PROBE) == [] and flag_values(step0, p.FLAG_READY_FILE) == []


def test_guaranteed_pod_keeps_its_request_and_warns_of_the_qos_change():
    src = guaranteed_pod()
    result = hybrid(src)
    assert pod_requests(result.pod["spec"]) == pod_requests(src["spec"])
    assert any("QoS class changes from Guaranteed to Burstable" in w for w in result.warnings)


def test_argv_torture_reaches_the_waiter_word_for_word():
    src = torture_pod()
    out = hybrid(src).pod
    for c in out["spec"]["containers"][1:]:
        o = by_name(src)[c["name"]]
        assert argv_after_separator(c) == [*o["command"], *o.get("args", [])]


def test_auto_picks_hybrid_native_or_waiter():
    job = CATALOGUE["job-istio"]
    assert rewrite(job, AUTO, native_supported=True).strategy == p.MODE_HYBRID
    assert rewrite(job, AUTO, native_supported=None).strategy == p.MODE_WAITER
    assert rewrite(job, AUTO, native_supported=False).strategy == p.MODE_WAITER
    assert rewrite(CATALOGUE["deployment-istio"], AUTO, native_supported=True).strategy == p.MODE_NATIVE
    on_failure = copy.deepcopy(job)
    on_failure["spec"]["restartPolicy"] = "OnFailure"
    result = rewrite(on_failure, AUTO, native_supported=True)
    assert result.strategy == p.MODE_HYBRID
    assert all(p.FLAG_RETRY in waiter_args(c) for c in result.pod["spec"]["containers"][1:])
    ordered = copy.deepcopy(job)
    ordered["metadata"]["annotations"][p.ANNOTATION_START_ORDER] = "istio-proxy;build"
    result = rewrite(ordered, AUTO, native_supported=True)
    assert result.strategy == p.MANAGED_START_ORDER, "start order stays with native sidecars"
    assert "git-clone" in names(result.pod["spec"]["initContainers"])


def _with_own_sidecar(pod: dict, after: int) -> dict:
    """`pod` with a native sidecar of its own (a cache the later steps use) placed after
    its first `after` steps."""
    pod = copy.deepcopy(pod)
    inits = pod["spec"]["initContainers"]
    steps = [i for i, c in enumerate(inits) if c["name"] not in ("istio-init", "istio-validation", "istio-proxy")]
    at = steps[after] if after < len(steps) else len(inits)
    inits.insert(at, {"name": "cache", "image": "redis:7", "command": ["redis-server"], "restartPolicy": "Always"})
    return pod


def test_a_sidecar_of_the_pods_own_after_a_step_keeps_its_place():
    """Kubernetes starts a native sidecar where it is declared, once the init containers
    before it have run (they may prepare it). auto keeps that under the native strategy;
    an explicit waiter or hybrid moves the steps out, which starts it first: said."""
    late = _with_own_sidecar(CATALOGUE["job-istio"], after=1)
    result = rewrite(late, AUTO, native_supported=True)
    assert result.strategy == p.MODE_NATIVE and result.changed
    inits = names(result.pod["spec"]["initContainers"])
    assert inits.index("istio-proxy") < inits.index("git-clone") < inits.index("cache"), \
        "the proxy first; the sidecar still starts after the step before it"
    assert any("native sidecar 'cache' comes after step 'git-clone': the native strategy keeps that order" in w
               for w in result.warnings), result.warnings
    assert_valid_pod(result.pod)
    for settings in (HYBRID, Settings(feature_gate=True, rewrite=RewriteSettings(mode=p.MODE_WAITER))):
        moved = rewrite(late, settings, native_supported=True)
        assert moved.strategy == settings.rewrite.mode and moved.changed
        assert any("native sidecar 'cache' now starts before the steps declared ahead of it ('git-clone')" in w
                   for w in moved.warnings), moved.warnings
        assert_valid_pod(moved.pod)
    first = rewrite(_with_own_sidecar(CATALOGUE["job-istio"], after=0), AUTO, native_supported=True)
    assert first.strategy == p.MODE_HYBRID and not any("native sidecar 'cache'" in w for w in first.warnings), \
        "a sidecar before every step starts first anyway"
    proxy_late = pods.inject_istio(CATALOGUE["job"], "native")
    inits = proxy_late["spec"]["initContainers"]
    inits.append(inits.pop(1))  # the mesh's proxy after the step: moving the step behind it is the point
    assert rewrite(proxy_late, AUTO, native_supported=True).strategy == p.MODE_HYBRID


def test_a_kept_init_container_after_a_step_is_warned_about_only_where_it_moves_ahead():
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    pod["spec"]["initContainers"].append({"name": "setup", "image": "busybox", "command": ["true"]})
    pod["metadata"]["annotations"][p.ANNOTATION_KEEP_INIT] = "setup"
    said = "init container 'setup' is kept (initshift.io/keep-init) and now runs before the steps that preceded it"
    for settings in (HYBRID, Settings(feature_gate=True, rewrite=RewriteSettings(mode=p.MODE_WAITER))):
        result = rewrite(pod, settings, native_supported=True)
        assert result.strategy == settings.rewrite.mode and any(said in w for w in result.warnings), result.warnings
    native = rewrite(pod, Settings(feature_gate=True, rewrite=RewriteSettings(mode=p.MODE_NATIVE)),
                     native_supported=True)
    assert native.strategy == p.MODE_NATIVE and not any("keep-init" in w for w in native.warnings), \
        "the native strategy keeps every init container in its place"


def test_hybrid_refuses_what_it_cannot_handle():
    always = hybrid(CATALOGUE["deployment-istio"])
    assert always.reason == "restart-policy" and "mode=native handles it" in always.warnings[0]
    lacking = rewrite(CATALOGUE["deployment-istio"], HYBRID, native_supported=False)
    assert lacking.reason == "restart-policy" and "mode=native" not in lacking.warnings[0], "native is refused there"
    assert "native sidecars would, but the cluster does not run native sidecars" in lacking.warnings[0]
    refused = rewrite(CATALOGUE["job-istio"], HYBRID, native_supported=False)
    assert refused.reason == "native-unsupported" and "1.29" in refused.warnings[0]
    unknown = rewrite(CATALOGUE["job-istio"], HYBRID, native_supported=None)
    assert unknown.strategy == p.MODE_HYBRID and any("unknown" in w for w in unknown.warnings)
    ordered = copy.deepcopy(CATALOGUE["job-istio"])
    ordered["metadata"]["annotations"][p.ANNOTATION_START_ORDER] = "istio-proxy;build"
    denied = hybrid(ordered)
    assert denied.denied and "hybrid strategy" in denied.denied


def test_already_native_proxy_gets_hybrid_on_any_detection():
    pod = CATALOGUE["kpack-istio-native"]
    for settings in (AUTO, Settings(feature_gate=True, rewrite=RewriteSettings(mode=p.MODE_WAITER))):
        for detected in (True, None, False):
            result = rewrite(pod, settings, native_supported=detected)
            assert result.strategy == p.MODE_HYBRID, (detected, result.warnings)
            assert names(result.pod["spec"]["initContainers"]) == ["istio-init", "istio-proxy"]
            istio, ours = pod["spec"]["initContainers"][1], result.pod["spec"]["initContainers"][1]
            assert ours == {k: v for k, v in istio.items() if k != "startupProbe"}, \
                "left as Istio made it but for its startupProbe"
            assert removed_record(result.pod) == {"istio-proxy": istio["startupProbe"]}
    native = rewrite(pod, Settings(feature_gate=True, rewrite=RewriteSettings(mode=p.MODE_NATIVE)),
                     native_supported=True)
    assert native.reason == "already-native", "native stays for users who ask for it"


def test_native_sidecar_annotation_gets_hybrid_and_asks_the_mesh():
    job = copy.deepcopy(CATALOGUE["job"])
    job["metadata"]["annotations"].update({p.ISTIO_INJECT_ANNOTATION: "true", p.ISTIO_NATIVE_ANNOTATION: "true"})
    result = rewrite(job, AUTO, native_supported=None)
    assert result.strategy == p.MODE_HYBRID, "the pod asks for a native proxy"
    classic = rewrite(pods.inject_istio(job), AUTO, native_supported=None)
    assert classic.strategy == p.MODE_WAITER, "the mesh injected a regular proxy anyway: not made native here"
    plain = copy.deepcopy(CATALOGUE["job"])
    plain["metadata"]["annotations"][p.LINKERD_INJECT_ANNOTATION] = "enabled"
    asked = hybrid(plain)
    assert all(asked.pod["metadata"]["annotations"][k] == "true" for k in p.LINKERD_NATIVE_ANNOTATIONS)
    assert any("no sidecar yet" in w for w in asked.warnings)


@pytest.mark.parametrize("mode", [p.MODE_WAITER, p.MODE_HYBRID])
def test_explicit_mode_rewrites_several_steps_without_sidecar(mode):
    for name in ("kpack", "tekton"):
        pod = copy.deepcopy(CATALOGUE[name])
        assert rewrite(pod, AUTO, native_supported=True).reason == "no-sidecar", "auto leaves it alone"
        assert rewrite(pod, Settings(feature_gate=True, rewrite=RewriteSettings(mode=mode)),
                       native_supported=True).reason == "no-sidecar", "the server's default is not a request"
        pod["metadata"].setdefault("annotations", {})[p.ANNOTATION_MODE] = mode
        # hybrid needs native sidecars even without a sidecar yet: one injected later is made native
        if mode == p.MODE_HYBRID:
            assert rewrite(pod, AUTO, native_supported=False).reason == "native-unsupported"
        for detected in (True, None, False) if mode == p.MODE_WAITER else (True, None):
            result = rewrite(pod, AUTO, native_supported=detected)
            assert result.changed and result.strategy == mode, result.warnings
            assert any("no sidecar" in w for w in result.warnings)
            assert_valid_pod(result.pod)
            step0 = first_step(result.pod)
            assert flag_values(step0, p.FLAG_PROBE) == [] and flag_values(step0, p.FLAG_READY_FILE) == []
            assert result.pod["metadata"]["labels"][p.LABEL_MANAGED] == mode
            assert rewrite(result.pod, AUTO, native_supported=detected).pod == result.pod
    one_step = copy.deepcopy(CATALOGUE["job"])
    one_step["metadata"]["annotations"][p.ANNOTATION_MODE] = mode
    assert rewrite(one_step, AUTO).reason == "no-sidecar", "one step: nothing to hand off"


def test_steps_without_command_need_lookups():
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    del pod["spec"]["initContainers"][1]["command"]
    the_plan = plan(pod, HYBRID, native_supported=True)
    assert [x.container for x in the_plan.lookups()] == ["git-clone"]
    images = {"alpine/git:2.45.2": ImageEntrypoints({"linux/amd64": ImageConfig(("git",))})}
    out = the_plan.rewrite(images=images).pod
    assert argv_after_separator(first_step(out))[0] == "git"
    assert the_plan.rewrite().denied, "unresolved: denied as for the waiter strategy"


@pytest.mark.parametrize("lookup_error", [None, "registry.example: connection refused"])
def test_auto_gives_native_to_a_pod_hybrid_cannot_have_for_want_of_an_entrypoint(lookup_error):
    """auto picks native for a pod hybrid cannot handle (DESIGN): a step without `command`
    whose ENTRYPOINT is not known (no registry lookup, or a failed one) would deny a pod
    native runs; an explicit hybrid still denies it (INITSHIFT_ON_UNRESOLVED)."""
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    del pod["spec"]["initContainers"][1]["command"]
    the_plan = plan(pod, AUTO, native_supported=True)
    assert [x.container for x in the_plan.lookups()] == ["git-clone"], "hybrid is still tried first"
    result = the_plan.rewrite(lookup_error=lookup_error)
    assert result.denied is None and result.changed and result.strategy == p.MODE_NATIVE
    assert_valid_pod(result.pod)
    init = [c["name"] for c in result.pod["spec"]["initContainers"]]
    assert init.index("istio-proxy") < init.index("git-clone"), init
    assert "command" not in by_name(result.pod)["git-clone"], "the step is not wrapped"
    assert result.warnings[0].startswith(f"initshift: {lookup_error or 'containers without `command`'}")
    assert "auto chose native" in result.warnings[0]
    images = {"alpine/git:2.45.2": ImageEntrypoints({"linux/amd64": ImageConfig(("git",))})}
    assert the_plan.rewrite(images=images).strategy == p.MODE_HYBRID, "resolved: hybrid as before"
    assert plan(pod, HYBRID, native_supported=True).rewrite().denied, "asked for by name: denied"
    assert plan(pod, AUTO, native_supported=False).rewrite().denied, "no native sidecars: the waiter needs it"
    already = pods.inject_istio(pods.load("job-git-clone"), "native")  # Istio's native mode: the pod runs as is
    del already["spec"]["initContainers"][2]["command"]
    kept = plan(already, AUTO, native_supported=True).rewrite()
    assert kept.denied is None and not kept.changed and kept.reason == "already-native", kept


@pytest.mark.parametrize("variant", ["classic", "native", "linkerd"])
def test_reinvocation_after_the_mesh_injected(variant):
    job = copy.deepcopy(CATALOGUE["tekton"])
    asks = (p.LINKERD_INJECT_ANNOTATION, "enabled") if variant == "linkerd" else (p.ISTIO_INJECT_ANNOTATION, "true")
    job["metadata"]["annotations"] = {**(job["metadata"].get("annotations") or {}), asks[0]: asks[1]}
    first = hybrid(job)
    assert first.changed and first.strategy == p.MODE_HYBRID
    keys = p.LINKERD_NATIVE_ANNOTATIONS if variant == "linkerd" else (p.ISTIO_NATIVE_ANNOTATION,)
    assert all(first.pod["metadata"]["annotations"][k] == "true" for k in keys), "the mesh is asked for a native proxy"
    step0 = first_step(first.pod)
    assert flag_values(step0, p.FLAG_PROBE) == [], "no sidecar yet: no wait"
    assert_valid_pod(first.pod)

    injected = pods.inject_linkerd(first.pod) if variant == "linkerd" else pods.inject_istio(first.pod, variant)
    second = hybrid(injected)
    assert second.changed and second.reason == "refreshed" and second.strategy == p.MODE_HYBRID
    out = second.pod
    assert_valid_pod(out)
    proxy = "linkerd-proxy" if variant == "linkerd" else "istio-proxy"
    mesh_init = "linkerd-init" if variant == "linkerd" else "istio-init"
    assert names(out["spec"]["initContainers"]) == [mesh_init, proxy]
    assert by_name(out)[proxy]["restartPolicy"] == "Always"
    url = "http://127.0.0.1:4191/ready" if variant == "linkerd" else "http://127.0.0.1:15021/healthz/ready"
    assert flag_values(first_step(out), p.FLAG_PROBE) == [url]
    assert all(flag_values(c, p.FLAG_QUIT) == [] for c in out["spec"]["containers"][1:])
    assert hybrid(out).pod == out and not hybrid(out).changed, "idempotent"
    # The same pod as a first admission after the injection, but for the requests planned
    # without the proxy and the annotation asking for a native one.
    direct = hybrid(pods.inject_linkerd(job) if variant == "linkerd" else pods.inject_istio(job, variant)).pod

    def shape(pod: dict) -> list:
        return [(c["name"], c.get("args"), c.get("restartPolicy"), c.get("volumeMounts"))
                for c in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]]

    assert shape(out) == shape(direct)
    assert sorted(v["name"] for v in out["spec"]["volumes"]) == sorted(v["name"] for v in direct["spec"]["volumes"])
    # Detection flipping between the calls does not change the strategy.
    assert rewrite(out, AUTO, native_supported=False).pod == out


def test_unrecognised_regular_sidecar_injected_later_is_gated_by_the_ready_file():
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    proxy = pod["spec"]["containers"][-1]
    proxy["readinessProbe"] = {"exec": {"command": ["pilot-agent", "ready"]}}
    first = hybrid(pod).pod
    assert flag_values(first_step(first), p.FLAG_READY_FILE) == []
    late = copy.deepcopy(first)
    late["spec"]["containers"].append({"name": "log-shipper", "image": "fluent-bit:3",
                                       "readinessProbe": {"exec": {"command": ["true"]}}})
    out = hybrid(late).pod
    step0 = first_step(out)
    assert flag_values(step0, p.FLAG_READY_FILE) == [p.READY_FILE], "the kubelet does not order a regular sidecar"
    assert flag_values(step0, p.FLAG_PROBE) == []
    assert p.READY_VOLUME in [v["name"] for v in out["spec"]["volumes"]]
    assert_valid_pod(out)
    assert hybrid(out).pod == out


# --- the kubelet's hold: the proxy's startupProbe -----------------------------------------------

def proxy_of(pod: dict, name: str = "istio-proxy") -> dict:
    return by_name(pod)[name]


@pytest.mark.parametrize("shape", ["kpack-istio-native", "kpack-istio", "job-istio", "tekton-istio"])
def test_the_proxys_startup_probe_goes_where_step_0_gates_on_its_readiness(shape):
    """Natively injected (the mesh's own startupProbe) or made native by initshift (the classic
    proxy's own): step 0 probes its readiness on loopback, so the kubelet's hold goes."""
    src = CATALOGUE[shape]
    result = hybrid(src)
    out = result.pod
    assert "startupProbe" not in proxy_of(out) and proxy_of(out)["readinessProbe"] == proxy_of(src)["readinessProbe"]
    assert removed_record(out) == {"istio-proxy": proxy_of(src)["startupProbe"]}
    step0 = first_step(out)
    assert flag_values(step0, p.FLAG_PROBE) == ["http://127.0.0.1:15021/healthz/ready"]
    check_hybrid_pod(src, out)
    assert hybrid(out, AUTO).pod == out, "re-invocation keeps it, in any mode"


def test_a_proxy_made_native_without_a_startup_probe_records_the_one_not_derived():
    out = hybrid(CATALOGUE["kpack-linkerd"]).pod
    assert "startupProbe" not in proxy_of(out, "linkerd-proxy")
    assert removed_record(out) == {"linkerd-proxy": startup_probe(proxy_of(out, "linkerd-proxy")["readinessProbe"])}, \
        "what native's rule would add, kept to put back if a re-invocation needs it"


def test_an_ungated_init_container_after_the_proxy_keeps_the_hold():
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    pod["spec"]["initContainers"].append({"name": "vault-agent-init", "image": "vault:1.17",
                                          "command": ["vault", "agent", "-exit-after-auth"]})
    pod["metadata"]["annotations"][p.ANNOTATION_KEEP_INIT] = "vault-agent-init"
    out = hybrid(pod).pod
    assert names(out["spec"]["initContainers"]) == ["istio-init", "istio-proxy", "vault-agent-init"]
    assert proxy_of(out)["startupProbe"] == proxy_of(pod)["startupProbe"], "the kubelet still holds vault-agent-init"
    assert removed_record(out) == {}
    check_hybrid_pod(pod, out)
    # Without a startupProbe of its own, a proxy initshift makes native gets the derived one.
    del pod["spec"]["containers"][-1]["startupProbe"]
    derived = hybrid(pod)
    assert proxy_of(derived.pod)["startupProbe"] == startup_probe(proxy_of(pod)["readinessProbe"])
    assert any("'istio-proxy' got a startupProbe derived" in w for w in derived.warnings)


def test_a_sidecar_after_the_proxy_keeps_the_proxys_hold_and_loses_its_own():
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    pod["metadata"]["annotations"][p.ANNOTATION_SIDECARS] = "cache"
    pod["spec"]["containers"].append({"name": "cache", "image": "redis:7", "readinessProbe": {"tcpSocket": {"port": 6379}},
                                      "startupProbe": {"tcpSocket": {"port": 6379}, "periodSeconds": 1}})
    out = hybrid(pod).pod
    assert names(out["spec"]["initContainers"]) == ["istio-init", "istio-proxy", "cache"]
    assert "startupProbe" in proxy_of(out), "cache starts after the proxy: the kubelet holds it until the proxy started"
    assert "startupProbe" not in proxy_of(out, "cache")
    assert list(removed_record(out)) == ["cache"]
    assert flag_values(first_step(out), p.FLAG_PROBE) == ["http://127.0.0.1:15021/healthz/ready",
                                                                       "tcp://127.0.0.1:6379"]
    check_hybrid_pod(pod, out)


def test_a_liveness_probe_keeps_the_startup_probe_that_holds_it_off():
    pod = copy.deepcopy(CATALOGUE["kpack-istio-native"])
    pod["spec"]["initContainers"][1]["livenessProbe"] = {"httpGet": {"path": "/healthz/ready", "port": 15021}}
    out = hybrid(pod).pod
    assert proxy_of(out) == pod["spec"]["initContainers"][1] and removed_record(out) == {}
    check_hybrid_pod(pod, out)


def test_linkerds_native_proxy_gives_up_its_startup_probe_for_all_its_liveness():
    """Linkerd's native proxy (its chart's: a startupProbe on /ready every second, liveness
    on the admin server's /live): /live answers as soon as the proxy runs, so the startupProbe
    holds liveness back from nothing, and goes as Istio's does. Another /live keeps it."""
    pod = pods.inject_linkerd(CATALOGUE["tekton"])
    pod["metadata"]["annotations"][p.LINKERD_INJECT_ANNOTATION] = "enabled"
    proxy = next(c for c in pod["spec"]["containers"] if c["name"] == p.LINKERD_PROXY)
    pod["spec"]["containers"].remove(proxy)
    del proxy["lifecycle"]  # a native proxy awaits with a startupProbe instead of the hook
    startup = {"httpGet": {"path": "/ready", "port": 4191}, "periodSeconds": 1, "failureThreshold": 120}
    proxy.update(restartPolicy="Always", startupProbe=startup)
    assert proxy["livenessProbe"]["httpGet"]["path"] == "/live"
    pod["spec"]["initContainers"].insert(1, proxy)
    out = hybrid(pod).pod
    assert "startupProbe" not in proxy_of(out, p.LINKERD_PROXY) and removed_record(out) == {p.LINKERD_PROXY: startup}
    assert proxy_of(out, p.LINKERD_PROXY)["livenessProbe"] == proxy["livenessProbe"], "liveness untouched"
    check_hybrid_pod(pod, out)
    other = copy.deepcopy(pod)
    other["spec"]["initContainers"][1]["livenessProbe"]["httpGet"]["path"] = "/healthz"
    kept = hybrid(other).pod
    assert proxy_of(kept, p.LINKERD_PROXY)["startupProbe"] == startup and removed_record(kept) == {}


def test_a_proxy_step_0_cannot_probe_keeps_its_startup_probe():
    pod = copy.deepcopy(CATALOGUE["kpack-istio-native"])
    pod["spec"]["initContainers"][1]["readinessProbe"] = {"exec": {"command": ["pilot-agent", "ready"]}}
    out = hybrid(pod).pod
    assert proxy_of(out)["startupProbe"] == pod["spec"]["initContainers"][1]["startupProbe"]
    assert removed_record(out) == {} and flag_values(first_step(out), p.FLAG_PROBE) == []


def test_reinvocation_puts_the_probe_back_when_a_container_no_longer_waits_for_step_0():
    """Another webhook adds, after initshift, an init container after the proxy or a regular
    container the waiter does not run: each would start before the proxy is ready."""
    first = hybrid(CATALOGUE["kpack-istio-native"]).pod
    was = removed_record(first)["istio-proxy"]
    late_init = copy.deepcopy(first)
    late_init["spec"]["initContainers"].append({"name": "vault-agent-init", "image": "vault:1.17",
                                                "command": ["vault", "agent"]})
    late_regular = copy.deepcopy(first)
    late_regular["spec"]["containers"].append({"name": "log-shipper", "image": "fluent-bit:3",
                                               "command": ["fluent-bit"]})
    for pod in (late_init, late_regular):
        out = hybrid(pod).pod
        assert out["metadata"]["labels"][p.LABEL_MANAGED] == p.MODE_HYBRID
        assert proxy_of(out)["startupProbe"] == was and removed_record(out) == {}
        assert_valid_pod(out)
        assert hybrid(out).pod == out, "idempotent"


def test_a_record_the_pod_is_created_with_is_not_trusted():
    pod = copy.deepcopy(CATALOGUE["kpack-istio-native"])
    pod["spec"]["initContainers"][1]["livenessProbe"] = {"tcpSocket": {"port": 15021}}
    pod["metadata"]["annotations"][p.ANNOTATION_STARTUP_PROBES_REMOVED] = json.dumps({"istio-proxy": {"exec": {
        "command": ["true"]}}, "nobody": {}})
    out = hybrid(pod).pod
    assert p.ANNOTATION_STARTUP_PROBES_REMOVED not in out["metadata"]["annotations"]
    assert proxy_of(out)["startupProbe"] == pod["spec"]["initContainers"][1]["startupProbe"]


def test_the_mesh_injecting_natively_after_initshift():
    job = copy.deepcopy(CATALOGUE["tekton"])
    job["metadata"].setdefault("annotations", {})[p.ISTIO_INJECT_ANNOTATION] = "true"
    first = hybrid(job).pod
    assert p.ANNOTATION_STARTUP_PROBES_REMOVED not in first["metadata"]["annotations"], "no proxy yet"
    injected = pods.inject_istio(first, "native")
    out = hybrid(injected).pod
    assert "startupProbe" not in proxy_of(out)
    assert removed_record(out) == {"istio-proxy": proxy_of(injected)["startupProbe"]}
    assert hybrid(out).pod == out
    assert_valid_pod(out)
