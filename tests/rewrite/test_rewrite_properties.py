"""Property tests of the waiter-strategy rewrite over generated pods."""

from __future__ import annotations

import copy
import json
from fractions import Fraction

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.fixtures import pods
from tests.support.podvalidate import assert_valid_pod
from waiter import protocol as p
from tests.support.patching import apply_patch
from webhook.admission._patch import make_patch
from webhook.rewrite._resources import container_amounts, pod_requests
from webhook.rewrite._rewrite import rewrite
from webhook.settings import RewriteSettings, Settings

VOLUMES = ("cache", "workspace", "home")
NAME = st.from_regex(r"[a-z][a-z0-9]{0,5}", fullmatch=True).filter(lambda n: not n.startswith("istio"))
# Any text Kubernetes carries in argv: spaces, quotes, empty strings, non-ASCII.
WORD = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)


@st.composite
def resources(draw) -> dict:
    out: dict = {}
    for kind in ("requests", "limits"):
        values = {}
        if draw(st.booleans()):
            values["cpu"] = f"{draw(st.integers(0, 4000))}m"
        if draw(st.booleans()):
            values["memory"] = f"{draw(st.integers(0, 4096))}Mi"
        if values:
            out[kind] = values
    for r, limit in (out.get("limits") or {}).items():  # requests <= limits, as the apiserver demands
        req = (out.get("requests") or {}).get(r)
        if req is not None and int(req[:-2 if r == "memory" else -1]) > int(limit[:-2 if r == "memory" else -1]):
            out["requests"][r] = limit
    return out


@st.composite
def container(draw, name: str) -> dict:
    c: dict = {"name": name, "image": f"registry.example.com/{name}:{draw(st.integers(1, 9))}"}
    c["command"] = draw(st.lists(WORD, min_size=1, max_size=3))
    args = draw(st.none() | st.lists(WORD, max_size=4))
    if args is not None:
        c["args"] = args
    env = draw(st.lists(st.tuples(st.from_regex(r"[A-Z][A-Z0-9_]{0,6}", fullmatch=True), WORD),
                        max_size=3, unique_by=lambda t: t[0]))
    if env:
        c["env"] = [{"name": k, "value": v} for k, v in env]
    mounts = draw(st.lists(st.sampled_from(VOLUMES), unique=True, max_size=3))
    if mounts:
        c["volumeMounts"] = [{"name": v, "mountPath": f"/data/{v}"} for v in mounts]
    res = draw(resources())
    if res:
        c["resources"] = res
    return c


@st.composite
def build_pod(draw) -> dict:
    names = draw(st.lists(NAME, min_size=2, max_size=9, unique=True))
    n_init = draw(st.integers(1, len(names) - 1))
    inits = [draw(container(n)) for n in names[:n_init]]
    mains = [draw(container(n)) for n in names[n_init:]]
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "generated", "namespace": "builds",
                     "annotations": {p.ISTIO_INJECT_ANNOTATION: "true"}},
        "spec": {
            "restartPolicy": draw(st.sampled_from(["Never", "OnFailure"])),
            "initContainers": inits,
            "containers": mains,
            "volumes": [{"name": v, "emptyDir": {}} for v in VOLUMES],
        },
    }
    return pods.inject_istio(pod) if draw(st.booleans()) else pod


def wrapped_argv(c: dict) -> list[str]:
    args = c["args"]
    return args[args.index(p.ARGV_SEPARATOR) + 1:]


SETTINGS = {policy: Settings(feature_gate=True, rewrite=RewriteSettings(resources_policy=policy))
            for policy in ("preserve", "divide", "keep")}
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(build_pod(), st.sampled_from(sorted(SETTINGS)))
def test_every_container_once_intact_and_in_order(pod, policy):
    src = copy.deepcopy(pod)
    result = rewrite(pod, SETTINGS[policy])
    assert pod == src
    assert result.changed, result.warnings
    out = result.pod
    assert_valid_pod(out)
    assert apply_patch(src, make_patch(src, out)) == out

    before = {c["name"]: c for c in [*src["spec"]["initContainers"], *src["spec"]["containers"]]}
    after = [*out["spec"]["initContainers"], *out["spec"]["containers"]]
    after_names = [c["name"] for c in after]
    assert sorted(after_names) == sorted([*before, p.INIT_CONTAINER_NAME])
    steps = [c["name"] for c in src["spec"]["initContainers"] if c["name"] != "istio-init"]
    mains = [c["name"] for c in src["spec"]["containers"] if c["name"] != "istio-proxy"]
    regular = [c["name"] for c in out["spec"]["containers"] if c["name"] != "istio-proxy"]
    assert regular == [*steps, *mains], "steps in their order, ahead of the mains in theirs"
    for c in after:
        if c["name"] not in steps + mains:
            continue
        o = before[c["name"]]
        assert c["image"] == o["image"] and c.get("env") == o.get("env")
        assert c["volumeMounts"][: len(o.get("volumeMounts", []))] == o.get("volumeMounts", [])
        assert wrapped_argv(c) == [*o["command"], *o.get("args", [])], "argv passed as a list, unchanged"


@PROPERTY
@given(build_pod(), st.sampled_from(["preserve", "divide"]))
def test_effective_requests_never_grow(pod, policy):
    out = rewrite(pod, SETTINGS[policy]).pod
    before, after = pod_requests(pod["spec"]), pod_requests(out["spec"])
    for r, value in after.items():
        assert value <= before.get(r, Fraction(0)), (r, value, before.get(r))


@PROPERTY
@given(build_pod(), st.sampled_from(["preserve", "divide"]))
def test_a_second_proxy_injected_later_is_weighed_against_the_budget(pod, policy):
    # A pod with Linkerd's proxy, rewritten, then given Istio's by a webhook that runs after
    # initshift's: the pod's effective request is at most the one the meshes alone give it,
    # and a second re-invocation changes nothing. (A native one grows the init phase beside
    # initshift-init too, which the steps cannot give back: test_rewrite.py has that case.)
    if any(c["name"] in ("istio-proxy", "linkerd-proxy") for c in pod["spec"]["containers"]):
        return
    with_linkerd = pods.inject_linkerd(pod)
    once = rewrite(with_linkerd, SETTINGS[policy])
    if not once.changed:
        return
    refreshed = rewrite(pods.inject_istio(once.pod), SETTINGS[policy]).pod
    assert_valid_pod(refreshed)
    mesh_only = pod_requests(pods.inject_istio(with_linkerd)["spec"])
    assert all(v <= mesh_only.get(r, 0) for r, v in pod_requests(refreshed["spec"]).items() if v), \
        (pod_requests(refreshed["spec"]), mesh_only)
    assert rewrite(refreshed, SETTINGS[policy]).pod == refreshed


@PROPERTY
@given(build_pod())
def test_idempotent_also_after_a_sidecar_is_injected(pod):
    once = rewrite(pod, SETTINGS["preserve"]).pod
    assert rewrite(once, SETTINGS["preserve"]).pod == once
    if any(c["name"] == "istio-proxy" for c in once["spec"]["containers"]):
        return
    injected = pods.inject_istio(once)
    refreshed = rewrite(injected, SETTINGS["preserve"]).pod
    assert_valid_pod(refreshed)
    assert rewrite(refreshed, SETTINGS["preserve"]).pod == refreshed
    # Apart from the gate (step 0, the quit flags, the ready volume) and the steps' requests
    # nothing moved. The proxy came after the rewrite, so its request is taken back from the
    # steps' budget: the pod's effective request is at most the one the mesh alone gives it.
    steps = set(json.loads(once["metadata"]["annotations"][p.ANNOTATION_STEPS]))
    for a, b in zip(injected["spec"]["containers"][1:], refreshed["spec"]["containers"][1:]):
        same = {k: v for k, v in a.items() if k not in ("args", "resources")}
        assert same == {k: v for k, v in b.items() if k not in ("args", "resources")}
        if a["name"] in steps:
            old, new = container_amounts(a)[0], container_amounts(b)[0]
            assert set(new) == set(old) and all(new[r] <= old[r] for r in old), (old, new)
        else:
            assert a.get("resources") == b.get("resources")
        if a.get("command") == [p.WAITER_PATH]:
            assert wrapped_argv(a) == wrapped_argv(b)
    mesh_only = pod_requests(pods.inject_istio(pod)["spec"])
    assert all(v <= mesh_only.get(r, 0) for r, v in pod_requests(refreshed["spec"]).items() if v), \
        (pod_requests(refreshed["spec"]), mesh_only)
    assert refreshed["spec"]["initContainers"] == injected["spec"]["initContainers"]
    assert refreshed["metadata"] == injected["metadata"]
