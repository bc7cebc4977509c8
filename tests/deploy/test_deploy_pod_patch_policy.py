"""The opt-in ValidatingAdmissionPolicy that narrows the ServiceAccount's cluster-wide pod
`patch` to what the watcher writes: deploy/components/pod-patch-policy and the chart's
`rbac.podPatchPolicy`. Rendered with kubectl's kustomize and Helm's engine, validated
against the Kubernetes schemas of the versions that serve admissionregistration.k8s.io/v1
(1.30 and newer), and held to the watcher's own writes: every merge patch `decide()` makes
in the watcher's decision table stays within what the policy allows. What the apiserver
does with it is the e2e's `pod-patch-policy` (tests/e2e/_podpatchpolicy.py)."""

from __future__ import annotations

import re

import kubernetes_validate
import pytest
import yaml

from tests.support.deploy_render import CHART, Rendered, helm, kustomize
from tests.support.kubedouble import running
from tests.support.podvalidate import NEWEST
from tests.watcher import test_watcher_decide as table
from waiter import protocol as p
from webhook.watcher import _controller
from webhook.watcher._decide import _DEADLINE, decide

COMPONENT = "components/pod-patch-policy"
ON = {"rbac": {"podPatchPolicy": True}}
KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
SERVED_FROM = "1.30.0"  # admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy is GA

RENDERS = {
    "kustomize-default+pod-patch-policy": lambda: kustomize(".", [COMPONENT]),
    "kustomize-cert-manager+pod-patch-policy": lambda: kustomize("overlays/cert-manager", [COMPONENT]),
    "helm-pod-patch-policy": lambda: helm(ON),
    "helm-pod-patch-policy-elsewhere": lambda: helm({**ON, "fullnameOverride": "ci-initshift"}, namespace="platform",
                                                    release="ci"),
}


@pytest.fixture(scope="module", params=list(RENDERS))
def rendered(request) -> Rendered:
    return Rendered(RENDERS[request.param]())


def policy_of(r: Rendered) -> tuple[dict, dict]:
    return r.one("ValidatingAdmissionPolicy"), r.one("ValidatingAdmissionPolicyBinding")


def expressions(policy: dict) -> str:
    """Every CEL expression of the policy, one a line."""
    spec = policy["spec"]
    return "\n".join(x["expression"] for key in ("matchConditions", "variables", "validations")
                     for x in spec.get(key) or [])


def test_off_by_default():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["rbac"]["podPatchPolicy"] is False
    for objects in (kustomize("."), kustomize("overlays/cert-manager"), helm()):
        assert not [o for o in objects if o["kind"] in KINDS]


def test_the_objects_validate_where_the_api_is_served(rendered):
    objects = [o for o in rendered.objects if o["kind"] in KINDS]
    assert sorted(o["kind"] for o in objects) == sorted(KINDS)
    for obj in objects:
        assert obj["apiVersion"] == "admissionregistration.k8s.io/v1"
        for version in (SERVED_FROM, NEWEST):
            kubernetes_validate.validate(obj, version, strict=True)


def test_validation_catches_a_bad_binding():
    _, binding = policy_of(Rendered(kustomize(".", [COMPONENT])))
    binding["spec"]["validationActions"] = "Deny"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(binding, NEWEST, strict=True)


def test_it_matches_pod_updates_by_initshifts_service_account_only(rendered):
    policy, binding = policy_of(rendered)
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"] == {"resourceRules": [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods"]}]}
    pod = rendered.deployment["spec"]["template"]["spec"]
    user = f"system:serviceaccount:{rendered.namespace}:{pod['serviceAccountName']}"
    assert spec["matchConditions"] == [{"name": "initshift-service-account",
                                        "expression": f"request.userInfo.username == '{user}'"}]
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    assert policy["metadata"]["name"] == f"{rendered.deployment['metadata']['name']}-pod-patch"


def test_every_refusal_is_forbidden_with_a_message(rendered):
    policy, _ = policy_of(rendered)
    validations = policy["spec"]["validations"]
    assert len(validations) >= 7
    for v in validations:
        assert v["reason"] == "Forbidden" and v["message"].startswith("initshift "), v
    messages = " ".join(v["message"] for v in validations)
    for field in ("labels", "annotations", "finalizers", "ownerReferences", "containers", "activeDeadlineSeconds",
                  "tolerations", "scheduling gates", "terminationGracePeriodSeconds", p.LABEL_MANAGED):
        assert field in messages, field


def test_chart_and_component_render_the_same_policy():
    k, h = Rendered(kustomize(".", [COMPONENT])), Rendered(helm(ON))
    for kind in KINDS:
        assert h.one(kind)["spec"] == k.one(kind)["spec"], kind
        assert h.one(kind)["metadata"]["name"] == k.one(kind)["metadata"]["name"]


def test_the_chart_names_its_own_service_account_wherever_installed():
    r = Rendered(helm({**ON, "fullnameOverride": "ci-initshift"}, namespace="platform", release="ci"))
    policy, binding = policy_of(r)
    assert "'system:serviceaccount:platform:ci-initshift'" in expressions(policy)
    assert "initshift-system" not in expressions(policy)
    assert binding["spec"]["policyName"] == policy["metadata"]["name"] == "ci-initshift-pod-patch"


def test_the_schema_refuses_a_value_that_is_not_a_boolean():
    import helm_python

    for bad in ({"rbac": {"podPatchPolicy": "true"}}, {"rbac": {"podPatchPolicy": 1}},
                {"rbac": {"podPatchPolicies": True}}):
        with pytest.raises(helm_python.HelmValuesError):
            helm(bad)


def test_the_chart_fails_where_the_cluster_lacks_the_api():
    """Offline (`helm template`) the API set is Helm's own, without kinds: the policy renders.
    Against a cluster Helm discovers kinds (`v1/Pod`): without `.../v1/ValidatingAdmissionPolicy`
    (1.28, 1.29) or on a --kube-version before 1.30, rendering fails naming the value; the e2e's
    `pod-patch-policy-unserved` sees it against the v1.28 apiserver."""
    text = (CHART / "templates" / "podpatchpolicy.yaml").read_text()
    assert '.Capabilities.APIVersions.Has "v1/Pod"' in text
    assert '"admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"' in text
    assert 'semverCompare "<1.30.0-0" .Capabilities.KubeVersion.Version' in text
    assert re.search(r'fail \(printf "rbac\.podPatchPolicy needs [^"]*leave rbac\.podPatchPolicy false"', text)


# --- the policy against what the watcher writes --------------------------------------------------

def _allowed(policy: dict) -> tuple[set[str], str, int, set[str]]:
    """(annotation keys the policy lets change, the prefix it lets change, the one
    activeDeadlineSeconds it lets set, the initshift.io/managed values of the pods it lets
    be updated), read from its CEL."""
    spec = policy["spec"]
    refused = next(v["expression"] for v in spec["variables"] if v["name"] == "refusedAnnotations")
    keys = set(re.findall(r"k != '([^']+)'", refused))
    (prefix,) = re.findall(r"k\.startsWith\('([^']+)'\)", refused)
    (deadline,) = {int(n) for n in re.findall(r"activeDeadlineSeconds == optional\.of\((\d+)\)", expressions(policy))}
    managed = next(v["expression"] for v in spec["validations"] if f"'{p.LABEL_MANAGED}'" in v["expression"])
    (values,) = re.findall(r"in \[([^\]]+)\]", managed)
    return keys, prefix, deadline, set(re.findall(r"'([^']+)'", values))


def _within(patch: dict, keys: set[str], prefix: str, deadline: int) -> list[str]:
    """What of a merge patch the policy would refuse (empty: nothing)."""
    out = [f"{k}" for k in patch if k not in ("metadata", "spec")]
    meta, spec = patch.get("metadata") or {}, patch.get("spec") or {}
    out += [f"metadata.{k}" for k in meta if k not in ("annotations", "resourceVersion")]
    out += [f"annotation {k}" for k in meta.get("annotations") or {} if k not in keys and not k.startswith(prefix)]
    out += [f"spec.{k}={v}" for k, v in spec.items() if (k, v) != ("activeDeadlineSeconds", deadline)]
    return out


def test_the_policy_names_the_watchers_annotations_pods_and_deadline():
    policy, _ = policy_of(Rendered(kustomize(".", [COMPONENT])))
    keys, prefix, deadline, managed = _allowed(policy)
    assert keys == {p.ANNOTATION_READY, p.ANNOTATION_OUTCOME} and prefix == p.ANNOTATION_READY_PREFIX
    assert deadline == _DEADLINE
    # The pods the watcher watches: its label selector's values.
    (selected,) = re.findall(r" in \(([^)]+)\)", _controller._LABEL_SELECTOR)
    assert managed == set(selected.split(",")) == {p.MODE_WAITER, p.MODE_HYBRID, p.MANAGED_START_ORDER}


@pytest.mark.parametrize("pod", [c[1] for c in table.CASES] + [
    table.start_order_pod([running("cache")]), table.start_order_pod([running("cache", ready=False)])],
    ids=[c[0] for c in table.CASES] + ["start-order-ready", "start-order-not-ready"])
def test_every_write_of_the_watcher_is_within_the_policy(pod):
    policy, _ = policy_of(Rendered(kustomize(".", [COMPONENT])))
    keys, prefix, deadline, managed = _allowed(policy)
    assert pod["metadata"]["labels"][p.LABEL_MANAGED] in managed
    for action in decide(pod, table.NOW, table.W).actions:
        patch = _controller._conditional(action.patch, "42")  # as the controller sends it
        assert _within(patch, keys, prefix, deadline) == [], (action.kind, patch)


def test_the_check_of_a_write_catches_what_the_policy_refuses():
    keys, prefix, deadline = {p.ANNOTATION_READY}, p.ANNOTATION_READY_PREFIX, 1
    assert _within({"metadata": {"labels": {"a": "b"}}}, keys, prefix, deadline) == ["metadata.labels"]
    assert _within({"metadata": {"annotations": {p.ANNOTATION_STEPS: "[]"}}}, keys, prefix, deadline) == \
        [f"annotation {p.ANNOTATION_STEPS}"]
    assert _within({"spec": {"activeDeadlineSeconds": 5}}, keys, prefix, deadline) == ["spec.activeDeadlineSeconds=5"]
    assert _within({"spec": {"containers": []}}, keys, prefix, deadline) == ["spec.containers=[]"]
