"""Property tests of the hybrid strategy over generated pods and mesh injections (before
and after initshift), as tests/rewrite/test_rewrite_properties.py and
test_native_properties.py do for the other strategies."""

from __future__ import annotations

import copy

from hypothesis import given
from hypothesis import strategies as st

from tests.rewrite import test_rewrite_properties as waiter_props
from tests.rewrite.test_hybrid import check_hybrid_pod, check_kubelet_hold, names, removed_record
from tests.rewrite.test_rewrite import kubectl_default
from tests.support.fixtures import pods
from tests.support.podvalidate import assert_valid_pod
from waiter import protocol as p
from webhook.rewrite._rewrite import rewrite
from webhook.settings import RewriteSettings, Settings

SETTINGS = {policy: Settings(feature_gate=True, rewrite=RewriteSettings(mode=p.MODE_HYBRID, resources_policy=policy))
            for policy in ("preserve", "divide")}
AUTO = Settings(feature_gate=True)
PROPERTY = waiter_props.PROPERTY


def inject(pod: dict, mesh: str) -> dict:
    return pods.inject_linkerd(pod) if mesh == "linkerd" else pods.inject_istio(pod, mesh)


@st.composite
def meshed_pod(draw) -> tuple[dict, str]:
    """A run-to-completion pod with steps and mains, injected by a mesh (the proxy regular or
    native) or only asking for one, and the mesh that injects late."""
    names_ = draw(st.lists(waiter_props.NAME.filter(lambda n: not n.startswith("linkerd")), min_size=2, max_size=8,
                           unique=True))
    n_init = draw(st.integers(1, len(names_) - 1))
    mesh = None if draw(st.booleans()) else draw(st.sampled_from(["classic", "cni", "hold", "native", "linkerd"]))
    asks = {p.LINKERD_INJECT_ANNOTATION: "enabled"} if mesh == "linkerd" else {p.ISTIO_INJECT_ANNOTATION: "true"}
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "generated", "namespace": "builds", "annotations": asks},
        "spec": {
            "restartPolicy": draw(st.sampled_from(["Never", "OnFailure"])),
            "initContainers": [draw(waiter_props.container(n)) for n in names_[:n_init]],
            "containers": [draw(waiter_props.container(n)) for n in names_[n_init:]],
            "volumes": [{"name": v, "emptyDir": {}} for v in waiter_props.VOLUMES],
        },
    }
    late = draw(st.sampled_from(["classic", "cni", "hold", "native", "linkerd"]))
    return (inject(pod, mesh) if mesh else pod), late


def pods_injected(pod: dict) -> bool:
    return any(c["name"] in ("istio-init", "linkerd-init", "istio-validation") for c in pod["spec"]["initContainers"])


@PROPERTY
@given(meshed_pod(), st.sampled_from(sorted(SETTINGS)), st.booleans())
def test_valid_unique_request_kept_idempotent_and_reinvocation(case, policy, auto):
    pod, late_mesh = case
    src = copy.deepcopy(pod)
    settings = AUTO if auto else SETTINGS[policy]
    once = rewrite(pod, settings, native_supported=True)
    assert pod == src, "the input is never mutated"
    assert once.changed and once.strategy == p.MODE_HYBRID, once.warnings
    check_hybrid_pod(src, once.pod)
    mains = [c for c in names(src["spec"]["containers"]) if c not in ("istio-proxy", "linkerd-proxy")]
    assert kubectl_default(once.pod) in (kubectl_default(src), mains[0]), "kubectl takes the pod's own container"
    if pods_injected(src):
        return
    # No proxy yet: the mesh injects after initshift (natively as asked, or into containers).
    injected = inject(once.pod, late_mesh)
    again = rewrite(injected, settings, native_supported=True)
    assert again.changed and again.reason == "refreshed", again.warnings
    out = again.pod
    assert_valid_pod(out)
    check_kubelet_hold(injected, out)
    inits = names(out["spec"]["initContainers"])
    proxy = "linkerd-proxy" if late_mesh == "linkerd" else "istio-proxy"
    assert inits[-1] == proxy and names(out["spec"]["containers"])[0] == p.COPY_CONTAINER_NAME, \
        "the proxy is the last init container; the waiter is copied after it"
    assert proxy not in names(out["spec"]["containers"])
    assert all(p.FLAG_QUIT not in c.get("args", []) for c in out["spec"]["containers"])
    assert kubectl_default(out) == mains[0], "the mesh keeps the default container initshift named"
    assert rewrite(out, settings, native_supported=True).pod == out, "idempotent"


@PROPERTY
@given(waiter_props.build_pod(), st.sampled_from(sorted(SETTINGS)))
def test_waiter_generated_pods_as_hybrid(pod, policy):
    """The waiter strategy's generated pods (argv of any text, any requests and limits)."""
    src = copy.deepcopy(pod)
    result = rewrite(pod, SETTINGS[policy], native_supported=True)
    assert result.changed and result.strategy == p.MODE_HYBRID, result.warnings
    check_hybrid_pod(src, result.pod)


@st.composite
def proxied_pod(draw) -> dict:
    """A build pod whose proxy the kubelet may or may not need to hold the rest on: native
    already or classic, with or without a startupProbe or a livenessProbe of its own, a
    readiness probe step 0 can or cannot run on loopback, and maybe an init container kept
    after the steps (so after the proxy) or a second sidecar."""
    pod, _ = draw(meshed_pod().filter(lambda case: not pods_injected(case[0])))  # only asks for a proxy
    pod = inject(pod, draw(st.sampled_from(["classic", "cni", "native"])))
    spec = pod["spec"]
    proxy = next(c for c in [*spec["initContainers"], *spec["containers"]] if c["name"] == p.ISTIO_PROXY)
    if draw(st.booleans()):
        del proxy["startupProbe"]
    if draw(st.booleans()):
        proxy["livenessProbe"] = {"httpGet": {"path": "/healthz/ready", "port": 15021}}
    if draw(st.integers(0, 4)) == 0:
        proxy["readinessProbe"] = {"exec": {"command": ["pilot-agent", "ready"]}}
    if draw(st.booleans()):
        spec["initContainers"].append({"name": "keep-after", "image": "busybox", "command": ["true"]})
        pod["metadata"]["annotations"][p.ANNOTATION_KEEP_INIT] = "keep-after"
    if draw(st.booleans()):
        pod["metadata"]["annotations"][p.ANNOTATION_SIDECARS] = "cache"
        spec["containers"].append({"name": "cache", "image": "redis:7",
                                   "readinessProbe": {"tcpSocket": {"port": 6379}}})
    return pod


@PROPERTY
@given(proxied_pod(), st.booleans())
def test_the_kubelet_holds_the_steps_exactly_where_step_0_does_not(pod, later):
    """check_hybrid_pod holds the hold both ways; and a regular container another webhook adds
    after initshift, which the waiter does not run, puts every removed startupProbe back."""
    src = copy.deepcopy(pod)
    out = rewrite(pod, AUTO, native_supported=True).pod
    check_hybrid_pod(src, out)
    if later and removed_record(out):
        out["spec"]["containers"].append({"name": "late", "image": "busybox", "command": ["sleep", "1"]})
        again = rewrite(out, AUTO, native_supported=True).pod
        assert removed_record(again) == {}
        assert_valid_pod(again)
        check_kubelet_hold(out, again)
