"""Pod-level resources (`spec.resources`): the rewritten pod fits them wherever the pod as
admitted does (webhook/rewrite/_podlevel.py), or is admitted unchanged saying why in the
apiserver's words; the pod's request and QoS class are read from them as the apiserver
reads them (webhook/rewrite/_resources.py).

The expected messages, defaults and QoS classes are what a real v1.34.9 kube-apiserver
answered for the same pods (server-side dry-run create); the e2e's `pod-level-resources`
scenario runs such a build on a real kubelet."""

from __future__ import annotations

import copy

import pytest

from tests.support.fixtures import pods
from tests.support.podvalidate import NEWEST, assert_valid_pod
from waiter import protocol as p
from webhook.rewrite._limitrange import violations
from webhook.rewrite._podlevel import added, fit
from webhook.rewrite._quantity import format_quantity
from webhook.rewrite._reasons import Reason
from webhook.rewrite._resources import container_amounts, pod_level, pod_level_defaults_pending, pod_requests, \
    qos_class
from webhook.rewrite._rewrite import rewrite
from webhook.settings import RewriteSettings, Settings


def settings(policy: str = "preserve", mode: str = "auto") -> Settings:
    return Settings(feature_gate=True, rewrite=RewriteSettings(resources_policy=policy, mode=mode))


def container(name: str, requests: dict | None = None, limits: dict | None = None, **kw: object) -> dict:
    res = {**({"requests": requests} if requests else {}), **({"limits": limits} if limits else {})}
    return {"name": name, "image": "busybox", "command": ["sh", "-c", "true"], "resources": res, **kw}


PROXY = container("istio-proxy", {"cpu": "100m", "memory": "128Mi"}, image="proxyv2",
                  readinessProbe={"httpGet": {"path": "/healthz/ready", "port": 15021}})


def build(level: dict, *, step_limits: dict | None = None) -> dict:
    """A build: two init steps (800m/800Mi the larger), a main and a classic proxy."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "build", "namespace": "ns"},
            "spec": {"restartPolicy": "Never", "resources": level,
                     "initContainers": [container("clone", {"cpu": "500m", "memory": "512Mi"}),
                                        container("compile", {"cpu": "800m", "memory": "800Mi"}, step_limits)],
                     "containers": [container("main", {"cpu": "100m", "memory": "100Mi"}), copy.deepcopy(PROXY)]}}


TIGHT = {"requests": {"cpu": "800m", "memory": "800Mi"}, "limits": {"cpu": "800m", "memory": "800Mi"}}
ROOMY = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}}


# --- as the apiserver reads them -------------------------------------------------------------

def test_pod_level_requests_are_defaulted_as_the_apiserver_defaults_them() -> None:
    # limits only: cpu, which a container requests, defaults to their aggregate; memory,
    # which none requests, to its limit (v1.34.9: requests {cpu: 100m, memory: 1Gi})
    spec = {"resources": {"limits": {"cpu": "1", "memory": "1Gi"}},
            "containers": [container("m", {"cpu": "100m"})]}
    assert pod_level(spec) == ({"cpu": 100, "memory": 1 << 30}, {"cpu": 1000, "memory": 1 << 30})
    # requests alone are not defaulted; resources pod-level resources cannot set are left out
    spec = {"resources": {"requests": {"memory": "100Mi", "ephemeral-storage": "1Gi"}},
            "containers": [container("m", {"cpu": "1500m", "memory": "50Mi"})]}
    assert pod_level(spec) == ({"memory": 100 << 20}, {})
    assert pod_level({"containers": [container("m", {"cpu": "1"})]}) == ({}, {})


@pytest.mark.parametrize(("level", "containers", "qos"), [
    # pod-level resources decide alone, whatever the containers say
    ({"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}, [{}], "Guaranteed"),
    ({"limits": {"cpu": "1", "memory": "1Gi"}}, [{}], "Guaranteed"),  # requests defaulted to the limits
    ({"limits": {"cpu": "1", "memory": "1Gi"}}, [{"requests": {"cpu": "100m"}}], "Burstable"),
    ({"requests": {"cpu": "1"}}, [{"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}],
     "Burstable"),
    ({"limits": {"cpu": "1"}}, [{"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}], "Burstable"),  # no memory limit
    ({}, [{"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}], "BestEffort"),
])
def test_the_qos_class_comes_from_pod_level_resources(level: dict, containers: list, qos: str) -> None:
    spec = {"resources": level, "containers": [container(f"c{i}", **res) for i, res in enumerate(containers)]}
    assert qos_class(spec) == qos


def test_a_limit_range_pod_item_reads_the_pod_level_amounts() -> None:
    # v1.34.9: Pod max cpu 1200m passes a pod-level limit of 1 over containers' limits adding
    # up to 1.6, refuses one of 1.5; Pod min cpu 500m passes a pod-level request of 600m over
    # containers requesting 100m, refuses 400m
    def pod(level: dict, *cs: dict) -> dict:
        return {"spec": {"resources": level, "containers": list(cs)}}
    cap = [{"metadata": {"name": "lr"}, "spec": {"limits": [{"type": "Pod", "max": {"cpu": "1200m"}}]}}]
    floor = [{"metadata": {"name": "lr"}, "spec": {"limits": [{"type": "Pod", "min": {"cpu": "500m"}}]}}]
    two = [container("m", {"cpu": "100m"}, {"cpu": "800m"}), container("n", {"cpu": "100m"}, {"cpu": "800m"})]
    assert violations(pod({"limits": {"cpu": "1"}}, *two), cap) == []
    assert [v.message for v in violations(pod({"limits": {"cpu": "1500m"}}, two[0]), cap)] == [
        "maximum cpu usage per Pod is 1200m, but limit is 1500m"]
    assert violations(pod({"requests": {"cpu": "600m"}}, container("m", {"cpu": "100m"})), floor) == []
    assert [v.message for v in violations(pod({"requests": {"cpu": "400m"}}, container("m", {"cpu": "100m"})),
                                          floor)] == ["minimum cpu usage per Pod is 500m, but request is 400m"]


# --- the rewrite within them ------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["waiter", "hybrid"])
@pytest.mark.parametrize("policy", ["preserve", "divide"])
def test_a_build_within_its_pod_level_resources_is_rewritten_within_them(mode: str, policy: str) -> None:
    pod = build(TIGHT)
    result = rewrite(pod, settings(policy, mode=mode), native_supported=True)
    assert result.changed and result.reason == Reason.REWRITTEN, result.warnings
    assert result.pod["spec"]["resources"] == TIGHT  # never changed
    assert added(pod, result.pod) == []
    total = pod_requests(result.pod["spec"])
    assert total["cpu"] <= 800 and total["memory"] <= 800 << 20, total
    # neither the pod's request nor its QoS class changes: the pod-level ones are the pod's
    assert not [w for w in result.warnings if "effective request" in w or "QoS" in w], result.warnings
    assert_valid_pod(result.pod, (NEWEST,))  # 1.28 has no pod-level resources


def test_native_leaves_a_pod_whose_pod_level_request_cannot_hold_the_proxy_beside_the_steps() -> None:
    # v1.34.9 refused the native rewrite of this pod with exactly these two errors
    pod = build(TIGHT)
    result = rewrite(pod, settings(mode="native"), native_supported=True)
    assert not result.changed and result.reason == Reason.RESOURCES and result.pod["spec"] == pod["spec"]
    assert result.pod["metadata"]["annotations"][p.ANNOTATION_NOT_REWRITTEN] == "resources"
    assert result.warnings == [
        'initshift: the rewritten pod would break its pod-level resources (spec.resources.requests[cpu]: Invalid '
        'value: "800m": must be greater than or equal to aggregate container requests of 900m; '
        'spec.resources.requests[memory]: Invalid value: "800Mi": must be greater than or equal to aggregate '
        'container requests of 928Mi); admitted unchanged']
    # with room for the proxy beside the steps: rewritten, and no growth to warn about
    roomy = rewrite(build(ROOMY), settings(mode="native"), native_supported=True)
    assert roomy.changed and roomy.strategy == "native", roomy.warnings
    assert not [w for w in roomy.warnings if "effective request" in w], roomy.warnings


def test_keep_leaves_a_pod_whose_steps_side_by_side_exceed_its_pod_level_request() -> None:
    result = rewrite(build(TIGHT), settings("keep", mode="waiter"))
    assert not result.changed and result.reason == Reason.RESOURCES
    assert "aggregate container requests of" in result.warnings[0], result.warnings


@pytest.mark.parametrize("mode", ["waiter", "hybrid"])
def test_a_step_whose_limit_exceeds_the_pod_limit_as_a_regular_container_is_left_unchanged(mode: str) -> None:
    # an init container's limit is not checked against the pod's (v1.34.9 admits this pod);
    # a regular container's is, and a step's limit is the user's, never lowered
    pod = build(ROOMY, step_limits={"memory": "3Gi"})
    result = rewrite(pod, settings(mode=mode), native_supported=True)
    assert not result.changed and result.reason == Reason.RESOURCES
    index = next(i for i, c in enumerate(rewrite(build(ROOMY), settings(mode=mode), native_supported=True)
                                          .pod["spec"]["containers"]) if c["name"] == "compile")
    assert (f'spec.resources.containers[{index}][memory].limits: Invalid value: "3Gi": must be less than or equal '
            f'to pod limits of 2Gi') in result.warnings[0], result.warnings
    # native keeps the steps init containers: nothing to check
    assert rewrite(pod, settings(mode="native"), native_supported=True).changed


def test_initshift_copy_is_kept_within_the_pod_limits() -> None:
    level = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "300m", "memory": "48Mi"}}
    pod = build(level)
    for c in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]:
        c["resources"] = {"requests": {"cpu": "100m", "memory": "16Mi"}, "limits": {"cpu": "200m", "memory": "32Mi"}}
    result = rewrite(pod, settings(mode="hybrid"), native_supported=True)
    assert result.changed, result.warnings
    copier = next(c for c in result.pod["spec"]["containers"] if c["name"] == p.COPY_CONTAINER_NAME)
    assert copier["resources"]["limits"] == {"cpu": "300m", "memory": "48Mi"}, copier["resources"]
    assert added(pod, result.pod) == []
    assert_valid_pod(result.pod, (NEWEST,))  # 1.28 has no pod-level resources


def test_fit_lowers_a_request_over_the_new_limit_and_leaves_others_alone() -> None:
    before = {"spec": {"resources": {"limits": {"memory": "32Mi"}}, "containers": []}}
    after = {"spec": {"containers": [
        container(p.COPY_CONTAINER_NAME, {"cpu": "10m", "memory": "64Mi"}, {"cpu": "500m", "memory": "64Mi"}),
        container("step", limits={"memory": "64Mi"})]}}
    fitted = fit(before, after)
    assert fitted["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"cpu": "500m", "memory": "32Mi"}}
    assert fitted["spec"]["containers"][1] is after["spec"]["containers"][1]
    assert fit(before, fitted) is fitted


def test_a_pod_that_already_breaks_them_is_not_blamed_on_the_rewrite() -> None:
    # the apiserver refuses this pod whatever initshift does: the rewrite is not held back by it
    pod = build({"requests": {"cpu": "100m"}})
    assert rewrite(pod, settings(mode="waiter")).changed


@pytest.mark.parametrize("shape", ["kpack-istio", "tekton-istio", "job-istio", "kpack-istio-native"])
@pytest.mark.parametrize("mode", ["waiter", "hybrid", "native"])
def test_catalogue_pods_with_pod_level_resources_are_rewritten_or_left_saying_why(shape: str, mode: str) -> None:
    pod = copy.deepcopy(pods.catalogue()[shape])
    pod["spec"]["resources"] = {"requests": {k: v for k, v in _as_strings(pod_requests(pod["spec"])).items()
                                             if k in ("cpu", "memory")}}
    result = rewrite(pod, settings(mode=mode), native_supported=True)
    if result.changed:
        assert added(pod, result.pod) == [], result.warnings
        assert_valid_pod(result.pod, (NEWEST,))  # 1.28 has no pod-level resources
    else:
        assert result.pod["spec"] == pod["spec"] and result.warnings, result


def _as_strings(amounts: dict) -> dict:
    return {r: format_quantity(v, r) for r, v in amounts.items() if v > 0}



@pytest.mark.parametrize("variant", ["classic", "native"])
@pytest.mark.parametrize("mode", ["auto", "waiter", "hybrid"])
def test_a_pod_asking_for_a_proxy_is_rewritten_once_the_proxy_is_there(mode: str, variant: str) -> None:
    # The mesh's webhook runs after initshift's (the names sort so): the proxy's request is
    # unknown at the first review, and a pod-level request (defaulted on decode to the pod
    # as sent) may not hold it beside the steps. So the first review leaves the pod, and the
    # re-invoked one rewrites it as a first admission of the injected pod, within them.
    pod = copy.deepcopy(pods.catalogue()["kpack"])
    pod["metadata"].setdefault("annotations", {})[p.ISTIO_INJECT_ANNOTATION] = "true"
    mesh_only = pods.inject_istio(pod, variant)
    pod["spec"]["resources"] = {"requests": _as_strings({r: pod_requests(mesh_only["spec"])[r]
                                                         for r in ("cpu", "memory")})}
    first = rewrite(pod, settings(mode=mode), native_supported=True)
    assert first.reason == Reason.NO_SIDECAR and first.pod["spec"] == pod["spec"], first.warnings
    assert "pod-level requests" in first.warnings[0]
    again = rewrite(pods.inject_istio(first.pod, variant), settings(mode=mode), native_supported=True)
    assert again.changed and again.reason == Reason.REWRITTEN, again.warnings
    assert added(pods.inject_istio(pod, variant), again.pod) == []
    assert_valid_pod(again.pod, (NEWEST,))


def test_pod_level_requests_still_to_be_defaulted_are_those_containers_request_and_the_pod_does_not_name() -> None:
    # Decoded with a pod-level cpu limit and no container requesting memory; LimitRanger then
    # gave the containers memory requests: memory is still to be defaulted (on the next patch).
    spec = {"resources": {"limits": {"cpu": "2"}, "requests": {"cpu": "1"}},
            "containers": [container("m", {"cpu": "100m", "memory": "32Mi"})]}
    assert pod_level_defaults_pending(spec) == ["memory"]
    spec["resources"]["requests"]["memory"] = "32Mi"
    assert pod_level_defaults_pending(spec) == []
    # Without pod-level limits the apiserver defaults nothing.
    assert pod_level_defaults_pending({"resources": {"requests": {"cpu": "1"}}, "containers": spec["containers"]}) == []
    assert pod_level_defaults_pending({"containers": spec["containers"]}) == []


@pytest.mark.parametrize("mode", ["auto", "waiter", "hybrid"])
def test_a_pod_whose_pod_level_request_is_still_to_be_defaulted_gets_no_patch_before_its_proxy(mode: str) -> None:
    # Found on v1.34.9 (e2e never-refused): a pod with a pod-level cpu limit, whose containers
    # LimitRanger gave memory requests after the pod was decoded, asks Istio for a proxy.
    # Any patch at the first review, even the not-rewritten annotation alone, makes the
    # apiserver default the pod-level memory request then, to the containers' 32Mi; the
    # proxy's 16Mi beside them then exceeds it and the pod is refused ("must be greater than
    # or equal to aggregate container requests of 48Mi"). So the first review patches nothing.
    pod = copy.deepcopy(pods.catalogue()["kpack"])
    pod["metadata"].setdefault("annotations", {})[p.ISTIO_INJECT_ANNOTATION] = "true"
    pod["spec"]["resources"] = {"limits": {"cpu": "8"}, "requests": {"cpu": "1"}}
    for c in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]:
        c.setdefault("resources", {}).setdefault("requests", {})["memory"] = "32Mi"
    first = rewrite(pod, settings(mode=mode), native_supported=True)
    assert first.reason == Reason.NO_SIDECAR and first.pod == pod and not first.changed
    assert "pod-level requests" in first.warnings[0]
    # Once defaulted (the mesh's patch did it), a pod left unchanged says why on itself again.
    done = copy.deepcopy(pod)
    done["spec"]["resources"]["requests"]["memory"] = _as_strings(pod_requests(pod["spec"]))["memory"]
    assert rewrite(done, settings(mode=mode), native_supported=True).pod["metadata"]["annotations"][
        p.ANNOTATION_NOT_REWRITTEN] == Reason.NO_SIDECAR


@pytest.mark.parametrize(("mode", "variant"), [("waiter", "classic"), ("hybrid", "classic"), ("hybrid", "native")])
def test_a_sidecar_added_after_the_rewrite_still_fits_the_pod_level_request(mode: str, variant: str) -> None:
    # A pod rewritten with no sidecar at all (its mode asked for by name) that another
    # webhook then gives one: on re-invocation the steps' budget gives back what the
    # sidecar needs beyond the pod-level request, a native one included (it counts in
    # every phase; v1.34.9 refused the pod before: "must be greater than or equal to
    # aggregate container requests").
    pod = copy.deepcopy(pods.catalogue()["kpack"])
    pod["metadata"].setdefault("annotations", {})[p.ANNOTATION_MODE] = mode
    mesh_only = pod_requests(pods.inject_istio(pod)["spec"])
    pod["spec"]["resources"] = {"requests": _as_strings({r: mesh_only[r] for r in ("cpu", "memory")})}
    first = rewrite(pod, settings(), native_supported=True)
    assert first.changed and first.strategy == mode, first.warnings
    refreshed = rewrite(pods.inject_istio(first.pod, variant), settings(), native_supported=True)
    assert refreshed.changed and refreshed.reason == Reason.REFRESHED, refreshed.warnings
    total = pod_requests(refreshed.pod["spec"])
    assert all(total[r] <= mesh_only[r] for r in ("cpu", "memory")), (total, mesh_only)
    assert_valid_pod(refreshed.pod, (NEWEST,))
    assert rewrite(refreshed.pod, settings(), native_supported=True).pod == refreshed.pod


@pytest.mark.parametrize("room", [False, True])
def test_native_does_not_ask_for_a_native_proxy_its_pod_level_requests_may_not_hold(room: bool) -> None:
    # Asked for natively, the mesh's proxy would count beside every step, unchecked by
    # initshift (v1.34.9 refused such a pod, 10m/16Mi over). It is left to land in
    # containers and made native on re-invocation only if the requests hold it.
    pod = copy.deepcopy(pods.catalogue()["kpack"])
    pod["metadata"].setdefault("annotations", {})[p.ISTIO_INJECT_ANNOTATION] = "true"
    pod["spec"]["restartPolicy"] = "Always"  # a long-running pod: auto gives it native
    mesh_only = pod_requests(pods.inject_istio(pod)["spec"])
    extra = {"cpu": 100, "memory": 128 << 20} if room else {"cpu": 0, "memory": 0}
    pod["spec"]["resources"] = {"requests": _as_strings({r: mesh_only[r] + extra[r] for r in ("cpu", "memory")})}
    first = rewrite(pod, settings(), native_supported=True)
    notes = first.pod["metadata"]["annotations"]
    assert first.reason == Reason.NO_SIDECAR and p.ISTIO_NATIVE_ANNOTATION not in notes
    assert notes[p.ANNOTATION_NOT_REWRITTEN] == "no-sidecar" and p.LABEL_MANAGED not in first.pod["metadata"]["labels"]
    second = rewrite(pods.inject_istio(first.pod), settings(), native_supported=True)
    if room:
        assert second.changed and second.strategy == "native", second.warnings
        assert added(pod, second.pod) == []
    else:
        assert not second.changed and second.reason == Reason.RESOURCES, second.warnings
    # without pod-level requests the mesh is asked, as before
    del pod["spec"]["resources"]
    assert rewrite(pod, settings(), native_supported=True).reason == Reason.ANNOTATED


# --- a property over generated pods and pod-level resources ----------------------------------

from hypothesis import HealthCheck, given, settings as hsettings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.rewrite.test_rewrite_properties import build_pod  # noqa: E402
from webhook.rewrite._podcheck import pod_problems  # noqa: E402


@st.composite
def pod_level_resources(draw, pod: dict) -> dict:
    """Pod-level requests and limits the pod as admitted passes: each at least its aggregate
    request and its regular containers' largest limit, by a generated margin (often none)."""
    spec = pod["spec"]
    aggregate = pod_requests(spec)
    out: dict = {}
    for r in draw(st.sets(st.sampled_from(["cpu", "memory"]), min_size=1)):
        top = max([0, *(_limit(c, r) for c in spec["containers"])])
        floor = max(aggregate.get(r, 0), 1)
        unit = 1 if r == "cpu" else 1 << 20
        request = floor + draw(st.sampled_from([0, 0, 50, 500])) * unit
        if draw(st.booleans()):
            out.setdefault("requests", {})[r] = format_quantity(request, r)
        if draw(st.booleans()):
            limit = max(request, top) + draw(st.sampled_from([0, 0, 100, 4000])) * unit
            out.setdefault("limits", {})[r] = format_quantity(limit, r)
    return out


def _limit(c: dict, r: str) -> int:
    return container_amounts(c)[1].get(r, 0)


@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), build_pod(), st.sampled_from(["preserve", "divide", "keep"]),
       st.sampled_from(["auto", "waiter", "hybrid", "native"]))
def test_any_pod_with_pod_level_resources_is_fitted_or_left_as_it_came(data, pod, policy, mode):
    """The rewrite never emits a pod the apiserver would refuse for its pod-level resources:
    a rewritten pod has no problem the pod as admitted lacks and stays a valid pod;
    otherwise the pod is left as it came, saying why. So too after the mesh injects."""
    if pod_problems(pod):
        return
    pod["spec"]["resources"] = data.draw(pod_level_resources(pod))
    assert added(pod, pod) == []
    result = rewrite(pod, settings(policy, mode=mode), native_supported=True)
    if result.changed:
        assert added(pod, result.pod) == [], result.warnings
        assert not pod_problems(result.pod)
    else:
        assert result.pod["spec"] == pod["spec"] and result.warnings
    # The mesh's webhook runs after initshift's: a proxy it injects then (as the pod asks,
    # classic or native) must still leave a pod the apiserver admits, wherever the pod the
    # mesh alone makes is admitted.
    if any(c["name"] == p.ISTIO_PROXY for c in [*result.pod["spec"].get("initContainers", []),
                                                *result.pod["spec"]["containers"]]):
        return
    variant = data.draw(st.sampled_from(["classic", "native"]))
    mesh_only = pods.inject_istio(pod, variant)
    again = rewrite(pods.inject_istio(result.pod, variant), settings(policy, mode=mode), native_supported=True)
    if not added(pod, mesh_only):
        assert added(mesh_only, again.pod) == [], again.warnings
    assert not pod_problems(again.pod)
