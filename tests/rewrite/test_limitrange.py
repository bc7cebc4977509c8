"""A namespace's LimitRanges: the rewritten pod passes LimitRanger's validation wherever the
pod as admitted does (webhook/rewrite/_limitrange.py), or is admitted unchanged saying why.

`defaulted` plays LimitRanger's defaulting, which the apiserver runs on the pod before the
mutating webhooks; `violations` is its validation, which runs after them (checked against a
real kube-apiserver by the e2e's `limit-range` scenario)."""

from __future__ import annotations

import copy

import pytest

from tests.support.fixtures import pods
from tests.support.podvalidate import assert_valid_pod
from waiter import protocol as p
from webhook.rewrite._quantity import parse
from webhook.rewrite._limitrange import added_violations, fit, violations
from webhook.rewrite._reasons import Reason
from webhook.rewrite._resources import pod_requests
from webhook.rewrite._rewrite import rewrite
from webhook.settings import RewriteSettings, Settings

# One a real Istio's containers pass (istio-init: 10m/40Mi requests, 2/1Gi limits).
TENANT = {"type": "Container", "default": {"cpu": "2", "memory": "2Gi"},
          "defaultRequest": {"cpu": "50m", "memory": "32Mi"}, "min": {"cpu": "10m", "memory": "8Mi"},
          "max": {"cpu": "4", "memory": "8Gi"}, "maxLimitRequestRatio": {"cpu": "200", "memory": "64"}}


def limit_range(name: str, *items: dict) -> dict:
    return {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": name, "namespace": "ns"},
            "spec": {"limits": list(items)}}


def defaulted(pod: dict, lr: dict) -> dict:
    """LimitRanger's admission defaults: a missing limit from `default`, a missing request
    from `defaultRequest` (the apiserver's own defaulting set requests from limits before)."""
    pod = copy.deepcopy(pod)
    item = next(i for i in lr["spec"]["limits"] if i["type"] == "Container")
    spec = pod["spec"]
    for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        res = c.setdefault("resources", {})
        for r, v in (res.get("limits") or {}).items():  # the apiserver's defaulting, at decoding
            res.setdefault("requests", {}).setdefault(r, v)
        for key, defaults in (("limits", item.get("default") or {}), ("requests", item.get("defaultRequest") or {})):
            for r, v in defaults.items():
                res.setdefault(key, {}).setdefault(r, v)
    return pod


def settings(policy: str = "preserve") -> Settings:
    return Settings(feature_gate=True, rewrite=RewriteSettings(resources_policy=policy))


SHAPES = ["kpack-istio", "kpack-linkerd", "tekton-istio", "job-istio", "cronjob-istio-cni", "kpack-istio-native"]


@pytest.mark.parametrize("policy", ["preserve", "divide", "keep"])
@pytest.mark.parametrize("native", [False, True], ids=["waiter", "hybrid"])
@pytest.mark.parametrize("shape", SHAPES)
def test_the_rewritten_pod_passes_the_namespaces_limit_range(shape: str, native: bool, policy: str) -> None:
    lrs = [limit_range("tenant", TENANT)]
    pod = defaulted(pods.catalogue()[shape], lrs[0])
    assert not violations(pod, lrs)
    unfitted = rewrite(pod, settings(policy), native_supported=native)
    assert unfitted.changed
    result = rewrite(pod, settings(policy), native_supported=native, limit_ranges=lrs)
    assert result.changed and result.reason == Reason.REWRITTEN, result.warnings
    assert violations(result.pod, lrs) == []
    assert_valid_pod(result.pod)
    # what the fit raised, it raised to the least that passes (min, or limit / ratio); under
    # preserve and divide, what that adds is taken back from the steps while they have room
    before = {c["name"]: c for c in _containers(unfitted.pod)}
    steps = result.pod["metadata"]["annotations"].get(p.ANNOTATION_STEPS, "[]")
    old_total, new_total = pod_requests(unfitted.pod["spec"]), pod_requests(result.pod["spec"])
    for c in _containers(result.pod):
        old = (before[c["name"]].get("resources") or {}).get("requests") or {}
        for r, q in (c.get("resources") or {}).get("requests", {}).items():
            floor = _floor(c, r)
            if f'"{c["name"]}"' in steps and policy != "keep":
                assert parse(q, r) >= floor
                if new_total.get(r, 0) > old_total.get(r, 0):
                    assert parse(q, r) == floor or parse(q, r) <= parse(old.get(r, "0"), r), (c["name"], r, q)
            elif not (r in old and q == old[r]):
                assert parse(q, r) == floor, (c["name"], r, q, floor)
    if policy != "keep":
        assert all(new_total[r] <= old_total[r] for r in ("cpu", "memory")) or \
            any("LimitRange (tenant)" in w for w in result.warnings), result.warnings


def _floor(c: dict, r: str) -> int:
    limit = parse(c["resources"]["limits"][r], r)
    return max(parse(TENANT["min"][r], r), -(-limit * 1000 // parse(TENANT["maxLimitRequestRatio"][r], "cpu")))


def _containers(pod: dict) -> list[dict]:
    return [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]


def test_without_the_fit_the_apiserver_would_refuse_the_rewrite() -> None:
    lrs = [limit_range("tenant", TENANT)]
    pod = defaulted(pods.catalogue()["job-istio"], lrs[0])
    unfitted = rewrite(pod, settings(), native_supported=True)
    assert {v.message for v in violations(unfitted.pod, lrs)} >= {
        "minimum cpu usage per Container is 10m, but request is 0",
        "minimum memory usage per Container is 8Mi, but request is 0"}
    result = rewrite(pod, settings(), native_supported=True, limit_ranges=lrs)
    assert result.changed and not violations(result.pod, lrs)
    copier = next(c for c in result.pod["spec"]["containers"] if c["name"] == p.COPY_CONTAINER_NAME)
    assert copier["resources"]["requests"] == {"cpu": "10m", "memory": "8Mi"}


def test_a_zero_request_is_raised_to_min_and_to_limit_over_ratio() -> None:
    item = {"type": "Container", "min": {"cpu": "10m"}, "maxLimitRequestRatio": {"cpu": "4", "memory": "2"}}
    before = {"spec": {"containers": [{"name": "a", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}}
    after = {"spec": {"containers": [{"name": "a", "resources": {
        "requests": {"cpu": "0", "memory": "0"}, "limits": {"cpu": "1", "memory": "1Gi"}}}]}}
    fitted, notes = fit(before, after, [limit_range("lr", item)])
    assert fitted["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
    assert notes and "cpu=250m" in notes[0] and "maxLimitRequestRatio cpu=4, memory=2" in notes[0]
    assert after["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "0", "memory": "0"}  # input kept


def test_initshifts_own_containers_get_the_namespaces_limits_within_max() -> None:
    item = {"type": "Container", "max": {"cpu": "100m", "ephemeral-storage": "1Gi"},
            "default": {"cpu": "100m", "ephemeral-storage": "512Mi"}, "min": {"memory": "32Mi"}}
    own = {"name": p.INIT_CONTAINER_NAME, "resources": {"requests": {"cpu": "10m", "memory": "16Mi"},
                                                         "limits": {"cpu": "500m", "memory": "64Mi"}}}
    fitted, _ = fit({"spec": {}}, {"spec": {"initContainers": [own]}}, [limit_range("lr", item)])
    assert fitted["spec"]["initContainers"][0]["resources"] == {
        "requests": {"cpu": "10m", "memory": "32Mi"},
        "limits": {"cpu": "100m", "memory": "64Mi", "ephemeral-storage": "512Mi"}}
    assert not violations(fitted, [limit_range("lr", item)])


def test_a_step_keeps_its_own_limit_and_what_the_rewrite_did_not_write_is_left_alone() -> None:
    item = {"type": "Container", "min": {"cpu": "100m"}, "max": {"cpu": "500m"}}
    step = {"name": "s", "resources": {"requests": {"cpu": "50m"}, "limits": {"cpu": "1"}}}  # its own violations
    mesh = {"name": "istio-proxy", "resources": {"requests": {"cpu": "10m"}}}
    lowered = {**step, "resources": {"requests": {"cpu": "0"}, "limits": {"cpu": "1"}}}
    fitted, _ = fit({"spec": {"containers": [step, mesh]}}, {"spec": {"containers": [lowered, mesh]}},
                    [limit_range("lr", item)])
    assert fitted["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "100m"}, "limits": {"cpu": "1"}}
    assert fitted["spec"]["containers"][1] is mesh


def test_the_tightest_of_several_limit_ranges_applies() -> None:
    lrs = [limit_range("a", {"type": "Container", "min": {"cpu": "10m"}, "maxLimitRequestRatio": {"cpu": "10"}}),
           limit_range("b", {"type": "Container", "min": {"cpu": "30m"}, "maxLimitRequestRatio": {"cpu": "20"}})]
    after = {"spec": {"containers": [{"name": "a", "resources": {"requests": {"cpu": "0"}, "limits": {"cpu": "1"}}}]}}
    fitted, _ = fit({"spec": {}}, after, lrs)
    assert fitted["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "100m"}  # 1 / 10 beats 30m
    assert not violations(fitted, lrs)


def test_violations_say_what_limitranger_says() -> None:
    item = {"type": "Container", "min": {"cpu": "10m"}, "max": {"memory": "1Gi"},
            "maxLimitRequestRatio": {"cpu": "2"}}
    pod = {"spec": {"containers": [
        {"name": "none"},
        {"name": "zero", "resources": {"requests": {"cpu": "0"}, "limits": {"cpu": "1", "memory": "2Gi"}}},
        {"name": "burst", "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "1", "memory": "1Gi"}}},
        {"name": "ok", "resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "1", "memory": "1Gi"}}}]}}
    got = {(v.where, v.message) for v in violations(pod, [limit_range("lr", item)])}
    assert got == {
        ("none", "minimum cpu usage per Container is 10m.  No request is specified"),
        ("none", "maximum memory usage per Container is 1Gi.  No limit is specified"),
        ("none", "cpu max limit to request ratio per Container is 2, but no request is specified or request is 0"),
        ("zero", "minimum cpu usage per Container is 10m, but request is 0"),
        ("zero", "maximum memory usage per Container is 1Gi, but limit is 2Gi"),
        ("zero", "cpu max limit to request ratio per Container is 2, but no request is specified or request is 0"),
        ("burst", "cpu max limit to request ratio per Container is 2, but provided ratio is 10.000000"),
    }


def test_a_pod_limit_the_steps_exceed_side_by_side_leaves_the_pod_unchanged() -> None:
    """A `Pod` item bounds the pod's effective limit: init steps count one at a time, the
    same steps as regular containers add up. A step's limit is never lowered to fit."""
    pod_max = limit_range("per-pod", {"type": "Pod", "max": {"cpu": "3"}})
    pod = pods.catalogue()["kpack-istio"]
    for c in pod["spec"]["initContainers"]:
        c["resources"] = {"limits": {"cpu": "1"}}
    pod["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    for c in pod["spec"]["containers"][1:]:
        c.pop("resources", None)
    assert not violations(pod, [pod_max])
    result = rewrite(pod, settings(), native_supported=False, limit_ranges=[pod_max])
    assert not result.changed and result.reason == Reason.RESOURCES
    assert result.pod["spec"] == pod["spec"]
    [warning] = [w for w in result.warnings if "LimitRange per-pod" in w]
    assert "maximum cpu usage per Pod is 3, but limit is" in warning and "admitted unchanged" in warning


def test_a_violation_the_admitted_pod_already_has_does_not_stop_the_rewrite() -> None:
    lrs = [limit_range("tenant", TENANT)]
    pod = defaulted(pods.catalogue()["kpack-istio"], lrs[0])
    pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "8"  # over max: the apiserver will say so
    before = violations(pod, lrs)
    assert before
    result = rewrite(pod, settings(), native_supported=False, limit_ranges=lrs)
    assert result.changed
    assert added_violations(pod, result.pod, lrs) == []


def test_limit_ranges_without_container_or_pod_items_change_nothing() -> None:
    pvc_only = limit_range("storage", {"type": "PersistentVolumeClaim", "min": {"storage": "1Gi"}})
    pod = pods.catalogue()["kpack-istio"]
    assert rewrite(pod, settings(), native_supported=False, limit_ranges=[pvc_only]).pod == \
        rewrite(pod, settings(), native_supported=False).pod


def test_preserve_takes_the_floors_back_from_the_largest_step() -> None:
    """kpack under a LimitRange: preserve zeroes five steps, the floors raise them, and the
    step that holds the pod's request gives that back: the effective request stays, and no
    warning. Under keep nothing was zeroed: nothing to give back."""
    lrs = [limit_range("tenant", TENANT)]
    pod = defaulted(pods.catalogue()["kpack-istio"], lrs[0])
    for policy in ("preserve", "keep"):
        plain = rewrite(pod, settings(policy), native_supported=False)
        fitted = rewrite(pod, settings(policy), native_supported=False, limit_ranges=lrs)
        assert pod_requests(fitted.pod["spec"]) == pod_requests(plain.pod["spec"]), policy
        assert not violations(fitted.pod, lrs) and not [w for w in fitted.warnings if "LimitRange" in w]
    plain = {c["name"]: c["resources"]["requests"] for c in
             rewrite(pod, settings(), native_supported=False).pod["spec"]["containers"]}
    fitted = {c["name"]: c["resources"]["requests"] for c in
              rewrite(pod, settings(), native_supported=False, limit_ranges=lrs).pod["spec"]["containers"]}
    zeroed = [n for n, req in plain.items() if req.get("memory") == "0"]
    assert len(zeroed) == 5 and all(parse(fitted[n]["memory"], "memory") > 0 for n in zeroed)
    [top] = [n for n, req in plain.items() if n not in zeroed and n in KPACK_STEPS]
    assert parse(fitted[top]["memory"], "memory") < parse(plain[top]["memory"], "memory")


KPACK_STEPS = ("prepare", "analyze", "detect", "restore", "build", "export")


def test_a_step_whose_request_is_its_limit_gives_back_too() -> None:
    """A step with a limit and no request (the apiserver defaults the request to the limit)
    under a LimitRange with only a ratio (which defaults no request): the give-back writes
    the request it lowers."""
    lrs = [limit_range("burst", {"type": "Container", "maxLimitRequestRatio": {"cpu": "4"}})]
    pod = pods.catalogue()["kpack-istio"]
    for c in pod["spec"]["initContainers"]:
        if c["name"] in KPACK_STEPS:
            c["resources"] = {"limits": {"cpu": "1"}}
    plain = rewrite(pod, settings(), native_supported=False)
    result = rewrite(pod, settings(), native_supported=False, limit_ranges=lrs)
    assert result.changed and result.reason == Reason.REWRITTEN, result.warnings
    assert not added_violations(pod, result.pod, lrs)
    requests = {c["name"]: c["resources"]["requests"]["cpu"] for c in result.pod["spec"]["containers"]
                if c["name"] in KPACK_STEPS}
    assert list(requests.values()) == ["250m"] * 6, requests  # 1 / 4 each: the top gave back all it could
    grown = pod_requests(result.pod["spec"])["cpu"] - pod_requests(plain.pod["spec"])["cpu"]
    held = sum(parse((c["resources"].get("requests") or c["resources"]["limits"])["cpu"], "cpu")
               for c in plain.pod["spec"]["containers"] if c["name"] in KPACK_STEPS)
    assert 0 < held < 6 * 250 and grown == 6 * 250 - held  # six floors where preserve's budget held less
    assert any("LimitRange (burst)" in w and "maxLimitRequestRatio cpu=4" in w for w in result.warnings)


# --- properties over generated pods and LimitRanges -------------------------------------------

from hypothesis import HealthCheck, given, settings as hsettings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.rewrite.test_rewrite_properties import build_pod  # noqa: E402
from webhook.rewrite._podcheck import pod_problems  # noqa: E402


@st.composite
def container_item(draw) -> dict:
    """A valid `Container` item as the apiserver stores it (defaulted: default from max,
    defaultRequest from default then min), min <= defaultRequest <= default <= max."""
    item: dict = {"type": "Container"}
    for r, unit, top in (("cpu", "m", 4000), ("memory", "Mi", 4096)):
        if not draw(st.booleans()):
            continue
        low = draw(st.integers(0, top // 8))
        high = draw(st.integers(max(low, 1), top))
        chosen = draw(st.sets(st.sampled_from(["min", "max", "ratio"]), min_size=1))
        if "min" in chosen:
            item.setdefault("min", {})[r] = f"{low}{unit}"
        if "max" in chosen:
            item.setdefault("max", {})[r] = f"{high}{unit}"
            item.setdefault("default", {})[r] = f"{high}{unit}"
        if "ratio" in chosen:
            item.setdefault("maxLimitRequestRatio", {})[r] = str(draw(st.integers(1, 100)))
        floor = item.get("min", {}).get(r)
        default = item.get("default", {}).get(r)
        if default or floor:
            item.setdefault("defaultRequest", {})[r] = floor or default
    return item


@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(build_pod(), container_item(), st.sampled_from(["preserve", "divide", "keep"]), st.booleans())
def test_any_pod_under_any_limit_range_is_fitted_or_left_as_it_came(pod, item, policy, native):
    """The rewrite never fails on a LimitRange: a rewritten pod has no violation the pod as
    admitted lacks and stays a valid pod; otherwise the pod is left as it came, saying why."""
    lrs = [limit_range("generated", item)]
    pod = defaulted(pod, lrs[0]) if item.get("default") or item.get("defaultRequest") else pod
    if pod_problems(pod):  # a default limit under a container's own request: the apiserver refuses it
        return
    result = rewrite(pod, settings(policy), native_supported=native, limit_ranges=lrs)
    if result.changed:
        assert added_violations(pod, result.pod, lrs) == [], result.warnings
        assert not pod_problems(result.pod)
    else:
        assert result.pod["spec"] == pod["spec"] and result.warnings
