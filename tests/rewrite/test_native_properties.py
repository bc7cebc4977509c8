"""Property tests of the native strategy over generated pods and mesh injections."""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.fixtures import pods
from tests.support.podvalidate import assert_valid_pod
from tests.rewrite.test_native import NATIVE_VERSIONS
from tests.rewrite.test_rewrite_properties import NAME, VOLUMES, container
from waiter import protocol as p
from tests.support.patching import apply_patch
from webhook.admission._patch import make_patch
from webhook.rewrite._podcheck import pod_problems
from webhook.rewrite._rewrite import rewrite
from webhook.settings import RewriteSettings, Settings

ON = Settings(feature_gate=True, rewrite=RewriteSettings(mode=p.MODE_NATIVE))
PROXIES = ("istio-proxy", "linkerd-proxy")
MESH_INITS = ("istio-init", "istio-validation", "linkerd-init")
PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def inject(pod: dict, mesh: str) -> dict:
    if mesh == "linkerd":
        return pods.inject_linkerd(pod)
    return pods.inject_istio(pod, mesh)


@st.composite
def build_pod(draw) -> tuple[dict, str | None]:
    """A pod with steps and mains, any restartPolicy, injected by a mesh or only asking for one."""
    names = draw(st.lists(NAME.filter(lambda n: not n.startswith("linkerd")), min_size=2, max_size=8, unique=True))
    n_init = draw(st.integers(1, len(names) - 1))
    mesh = draw(st.sampled_from(["classic", "cni", "hold", "linkerd", None]))
    asks = {p.LINKERD_INJECT_ANNOTATION: "enabled"} if mesh == "linkerd" else {p.ISTIO_INJECT_ANNOTATION: "true"}
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "generated", "namespace": "builds", "annotations": asks},
        "spec": {
            "restartPolicy": draw(st.sampled_from(["Never", "OnFailure", "Always"])),
            "initContainers": [draw(container(n)) for n in names[:n_init]],
            "containers": [draw(container(n)) for n in names[n_init:]],
            "volumes": [{"name": v, "emptyDir": {}} for v in VOLUMES],
        },
    }
    return (inject(pod, mesh) if mesh else pod), draw(st.sampled_from(["classic", "cni", "hold", "linkerd"]))


def check_native_layout(src: dict, out: dict) -> None:
    before = {c["name"]: c for c in [*src["spec"]["initContainers"], *src["spec"]["containers"]]}
    inits, regular = out["spec"]["initContainers"], out["spec"]["containers"]
    assert sorted(c["name"] for c in [*inits, *regular]) == sorted(before), "every container exactly once"
    assert not any(c["name"] in PROXIES for c in regular), "no proxy left among the regular containers"
    names = [c["name"] for c in inits]
    proxies = [i for i, n in enumerate(names) if n in PROXIES]
    steps = [i for i, n in enumerate(names) if n not in PROXIES and n not in MESH_INITS]
    mesh = [i for i, n in enumerate(names) if n in MESH_INITS]
    assert all(m < x for m in mesh for x in proxies), "mesh init containers first"
    assert all(x < s for x in proxies for s in steps), "proxies before every step"
    src_steps = [c for c in src["spec"]["initContainers"] if c["name"] not in PROXIES]
    assert [c for c in inits if c["name"] not in PROXIES] == src_steps, "init containers unchanged, in order"
    assert regular == [c for c in src["spec"]["containers"] if c["name"] not in PROXIES]
    for i in proxies:
        c = inits[i]
        assert c["restartPolicy"] == "Always" and "startupProbe" in c
        original = before[c["name"]]
        added = {"restartPolicy"} | ({"startupProbe"} if "startupProbe" not in original else set())
        assert {k: v for k, v in c.items() if k not in added} == original, "the proxy keeps its spec"


@PROPERTY
@given(build_pod())
def test_valid_idempotent_and_reinvocation_moves_the_proxy(case):
    pod, late_mesh = case
    src = copy.deepcopy(pod)
    once = rewrite(pod, ON, native_supported=True)
    assert pod == src, "the input is never mutated"
    assert once.changed and once.strategy == p.MODE_NATIVE, once.warnings
    out = once.pod
    assert not pod_problems(out)
    assert apply_patch(src, make_patch(src, out)) == out
    assert out["metadata"]["labels"][p.LABEL_MANAGED] == p.MODE_NATIVE
    again = rewrite(out, ON, native_supported=True)
    assert again.pod == out and not again.changed, "idempotent"

    if once.reason == "rewritten":
        check_native_layout(src, out)
        assert_valid_pod(out, NATIVE_VERSIONS)
        return
    # Annotated only (no proxy yet): a mesh that injects into containers anyway is undone.
    assert once.reason == "annotated" and out["spec"] == src["spec"]
    injected = inject(out, late_mesh)
    moved = rewrite(injected, ON, native_supported=True)
    assert moved.changed and moved.reason == "rewritten"
    assert_valid_pod(moved.pod, NATIVE_VERSIONS)
    check_native_layout(injected, moved.pod)
    assert rewrite(moved.pod, ON, native_supported=True).pod == moved.pod
