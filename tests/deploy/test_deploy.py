"""deploy/: every way of installing (kustomize base, overlays, components, Helm chart with
default and non-default values) rendered by the real tools and checked object by object:
Kubernetes schemas, exact RBAC, webhook configuration, namespace selection, Deployment,
Service, certificates and Pod Security "restricted"."""

from __future__ import annotations

import inspect
import json
import os
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Callable

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.support import docs, promoperator, pss, servicelinks
from tests.support.deploy_render import CHART, DEPLOY, NAMESPACE, Rendered, RenderError, helm, helm_notes, kustomize
from tests.support.podvalidate import VERSIONS
from waiter import protocol as p
from webhook import __version__
from webhook.cli import _main as cli, _serve as serve_cmd
from webhook.admission import HttpsServer
from webhook.admission._app import MUTATE_PATH
from webhook.settings import Settings, settings_rows

DEFAULTS = Settings()
NO_NODE_VERSIONS = "components/without-node-versions"  # base grants `nodes: list`; this leaves it out
COMPONENTS = (NO_NODE_VERSIONS, "components/registry-pull-secrets")
MONITORING = "components/monitoring"
POD_MONITOR = "components/pod-monitor"  # after MONITORING: a PodMonitor in its ServiceMonitor's place
# Configurations that must come after ours (the apiserver calls them in name order).
MESH_INJECTORS = ("istio-sidecar-injector", "istio-revision-tag-default", "linkerd-proxy-injector-webhook-config")
INJECT_CA_FROM = "cert-manager.io/inject-ca-from"

CUSTOM_VALUES = {
    "image": {"repository": "registry.example/platform/initshift", "tag": "9.9.9", "pullPolicy": "Always"},
    "replicas": 3,
    "featureGate": False,
    "webhook": {"failurePolicy": "Fail", "timeoutSeconds": 8, "excludeNamespaces": ["kube-system", "istio-system"]},
    "certificates": {"mode": "cert-manager"},
    "strategy": "waiter",
    "nativeSidecars": "false",
    "resourcesPolicy": "divide",
    "sidecarNames": ["istio-proxy", "envoy"],
    "injectedImagePullSecrets": ["platform-registry", "mirror.pull"],
    # Helm merges maps with the chart's defaults: null drops a default entry.
    "quitEndpoints": {"envoy": "http://127.0.0.1:9901/quitquitquit", "istio-proxy": None, "linkerd-proxy": None},
    "rbac": {"nodeVersions": False},
    "registry": {"pullSecrets": True},
    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
    "logLevel": "debug",
    "extraEnv": [{"name": "INITSHIFT_GRACE_SECONDS", "value": "20"}],
}
# Every other chart value set, and every monitoring object on.
POD_VALUES = {
    "image": {"repository": "mirror.example/initshift", "digest": "sha256:" + "0123456789abcdef" * 4},
    "imagePullSecrets": [{"name": "mirror-pull"}],
    "priorityClassName": "system-cluster-critical",
    "podAnnotations": {"example.com/owner": "platform"},
    "podLabels": {"team": "platform"},
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                   "whenUnsatisfiable": "ScheduleAnyway",
                                   "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "initshift"}}}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}]}}},
    "podDisruptionBudget": {"enabled": False},
    "metrics": {"port": 9402, "serviceMonitor": {"enabled": True, "labels": {"release": "kps"}},
                "podMonitor": {"enabled": True}, "prometheusRule": {"enabled": True},
                "dashboard": {"enabled": True}},
}

# The values operators ask for (cert-manager's and Kyverno's charts have them), all at once;
# hostNetwork has its own test (it leaves the restricted Pod Security Standard).
REGISTRY_CA = "/etc/initshift/registry-ca"
OPERATOR_VALUES = {
    "nameOverride": "initshift-ci",
    "fullnameOverride": "ci-initshift",
    "serverPort": 9443,
    "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/initshift"}},
    "service": {"annotations": {"example.com/scrape": "false"}},
    "webhook": {"objectSelector": {"matchExpressions": [{"key": "initshift.io/skip", "operator": "DoesNotExist"}]}},
    "certificates": {"mode": "cert-manager", "issuerRef": {"name": "internal-ca", "kind": "ClusterIssuer"}},
    "extraVolumes": [{"name": "registry-ca", "configMap": {"name": "registry-ca"}}],
    "extraVolumeMounts": [{"name": "registry-ca", "mountPath": REGISTRY_CA, "readOnly": True}],
    "extraEnv": [{"name": "INITSHIFT_REGISTRY_CA_FILE", "value": f"{REGISTRY_CA}/ca.crt"}],
    "metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True},
                "prometheusRule": {"enabled": True}, "dashboard": {"enabled": True}},
}


@dataclass(frozen=True)
class Install:
    """What an install is configured to do; the checks derive what must be rendered."""

    render: Callable[[], list[dict]]
    self_managed: bool = True
    node_versions: bool = True  # `nodes: list`, for native-sidecar detection by kubelet versions
    pull_secrets: bool = False
    failure_policy: str = "Ignore"
    replicas: int = 2
    namespace: str = NAMESPACE
    feature_gate: bool = True
    has_namespace_object: bool = True
    pdb: bool = True
    anti_affinity: bool = True  # the default preferred anti-affinity (a custom affinity replaces it)
    object_selector: dict | None = None  # the webhook's objectSelector
    issuer: dict | None = None  # cert-manager: the user's issuerRef (else the chart's own Issuer)


INSTALLS = {
    "kustomize-default": Install(lambda: kustomize(".")),
    "kustomize-self-managed": Install(lambda: kustomize("overlays/self-managed")),
    "kustomize-cert-manager": Install(lambda: kustomize("overlays/cert-manager"), self_managed=False),
    "kustomize-self-managed+components": Install(lambda: kustomize("overlays/self-managed", COMPONENTS),
                                                 node_versions=False, pull_secrets=True),
    "kustomize-cert-manager+without-node-versions": Install(lambda: kustomize("overlays/cert-manager", COMPONENTS[:1]),
                                                            self_managed=False, node_versions=False),
    "helm-default": Install(lambda: helm(), has_namespace_object=False),
    "helm-custom": Install(lambda: helm(CUSTOM_VALUES, namespace="platform"), self_managed=False,
                           node_versions=False, pull_secrets=True, failure_policy="Fail", replicas=3,
                           namespace="platform", feature_gate=False, has_namespace_object=False),
    # One replica: no budget, which would block every node drain.
    "helm-one-replica": Install(lambda: helm({"replicas": 1}), replicas=1, pdb=False, has_namespace_object=False),
    "helm-self-managed+registry": Install(lambda: helm({"registry": {"lookup": True, "pullSecrets": True}}),
                                          pull_secrets=True, has_namespace_object=False),
    "kustomize-default+monitoring": Install(lambda: kustomize(".", [MONITORING])),
    "kustomize-default+pod-monitor": Install(lambda: kustomize(".", [MONITORING, POD_MONITOR])),
    "helm-pod-values+monitoring": Install(lambda: helm(POD_VALUES), has_namespace_object=False, pdb=False,
                                          anti_affinity=False),
    "helm-operator-values": Install(lambda: helm(OPERATOR_VALUES), self_managed=False, has_namespace_object=False,
                                    object_selector=OPERATOR_VALUES["webhook"]["objectSelector"],
                                    issuer={"name": "internal-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}),
}


@pytest.fixture(scope="module", params=list(INSTALLS))
def install(request) -> tuple[Install, Rendered]:
    spec = INSTALLS[request.param]
    return spec, Rendered(spec.render())


# --- schemas ---------------------------------------------------------------------------

# cert-manager's CRDs are not in kubernetes-validate: the fields of cert-manager.io/v1
# Issuer and Certificate that deploy/ may use, transcribed from its API reference, strict.
_OBJECT_META = {"type": "object", "required": ["name"], "properties": {
    "name": {"type": "string"}, "namespace": {"type": "string"},
    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
    "annotations": {"type": "object", "additionalProperties": {"type": "string"}}}, "additionalProperties": False}
CERT_MANAGER_SCHEMAS = {
    "Issuer": {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
               "properties": {
                   "apiVersion": {"const": "cert-manager.io/v1"}, "kind": {"const": "Issuer"}, "metadata": _OBJECT_META,
                   "spec": {"type": "object", "minProperties": 1, "maxProperties": 1, "additionalProperties": False,
                            "properties": {"selfSigned": {"type": "object", "additionalProperties": False,
                                                          "properties": {"crlDistributionPoints": {"type": "array"}}},
                                           "ca": {"type": "object", "required": ["secretName"]}}}}},
    "Certificate": {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
                    "additionalProperties": False, "properties": {
                        "apiVersion": {"const": "cert-manager.io/v1"}, "kind": {"const": "Certificate"},
                        "metadata": _OBJECT_META,
                        "spec": {"type": "object", "required": ["secretName", "issuerRef"], "additionalProperties": False,
                                 "properties": {
                                     "secretName": {"type": "string"}, "commonName": {"type": "string"},
                                     "dnsNames": {"type": "array", "items": {"type": "string"}},
                                     "duration": {"type": "string", "pattern": r"^(\d+h)?(\d+m)?(\d+s)?$"},
                                     "renewBefore": {"type": "string", "pattern": r"^(\d+h)?(\d+m)?(\d+s)?$"},
                                     "isCA": {"type": "boolean"},
                                     "privateKey": {"type": "object", "additionalProperties": False, "properties": {
                                         "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                                         "size": {"type": "integer"}, "encoding": {"enum": ["PKCS1", "PKCS8"]},
                                         "rotationPolicy": {"enum": ["Never", "Always"]}}},
                                     "usages": {"type": "array", "items": {"enum": [
                                         "signing", "digital signature", "content commitment", "key encipherment",
                                         "key agreement", "data encipherment", "cert sign", "crl sign",
                                         "encipher only", "decipher only", "any", "server auth", "client auth",
                                         "code signing", "email protection", "s/mime", "ipsec end system",
                                         "ipsec tunnel", "ipsec user", "timestamping", "ocsp signing",
                                         "microsoft sgc", "netscape sgc"]}},
                                     "issuerRef": {"type": "object", "required": ["name"], "additionalProperties": False,
                                                   "properties": {"name": {"type": "string"},
                                                                  "kind": {"enum": ["Issuer", "ClusterIssuer"]},
                                                                  "group": {"type": "string"}}}}}}},
}


def validate(obj: dict) -> None:
    if str(obj.get("apiVersion", "")).startswith("cert-manager.io/"):
        jsonschema.validate(obj, CERT_MANAGER_SCHEMAS[obj["kind"]])
        return
    if obj.get("apiVersion") == promoperator.GROUP_VERSION:
        promoperator.validate(obj)
        return
    for version in VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


def test_every_object_validates(install):
    _, r = install
    assert r.objects
    for obj in r.objects:
        validate(obj)


def test_base_validates():
    objects = kustomize("base")
    for obj in objects:
        validate(obj)
    assert {o["kind"] for o in objects} >= {"Namespace", "ServiceAccount", "ClusterRole", "Deployment",
                                            "PodDisruptionBudget", "Service", "MutatingWebhookConfiguration"}


def test_validation_catches_a_bad_object():
    deployment = Rendered(kustomize(".")).deployment
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)
    cert = next(o for o in kustomize("overlays/cert-manager") if o["kind"] == "Certificate")
    del cert["spec"]["issuerRef"]
    with pytest.raises(jsonschema.ValidationError):
        validate(cert)


# --- RBAC ------------------------------------------------------------------------------

Grant = tuple[str, str, str, str, str]  # scope ("*" = cluster), apiGroup, resource, verb, resourceName ("*" = any)


def grants(r: Rendered) -> set[Grant]:
    """Every permission the webhook's ServiceAccount gets, one atomic grant per tuple."""
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
             for o in r.of_kind("Role") + r.of_kind("ClusterRole")}
    bound: set[tuple] = set()
    out: set[Grant] = set()
    for b in r.of_kind("RoleBinding") + r.of_kind("ClusterRoleBinding"):
        scope = b["metadata"]["namespace"] if b["kind"] == "RoleBinding" else "*"
        account = r.deployment["spec"]["template"]["spec"]["serviceAccountName"]
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": r.namespace}], b
        ref = b["roleRef"]
        key = (ref["kind"], scope if ref["kind"] == "Role" else None, ref["name"])
        assert key in roles, f"{b['kind']} {b['metadata']['name']} refers to a missing {ref['kind']} {ref['name']}"
        bound.add(key)
        for rule in roles[key]["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], f"wildcard in {ref['name']}: {rule}"
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        for name in rule.get("resourceNames") or ["*"]:
                            out.add((scope, group, resource, verb, name))
    assert bound == set(roles), f"roles bound to nothing: {set(roles) - bound}"
    return out


def expected_grants(spec: Install, r: Rendered) -> set[Grant]:
    """The list the issue allows, and nothing else."""
    env = r.plain_env()
    settings = Settings.from_env(env)
    ns = spec.namespace
    out: set[Grant] = {("*", "", "pods", v, "*") for v in ("get", "list", "watch", "patch")}
    # Events: created, and listed/watched so each replica knows which are sent (each once).
    out |= {("*", "", "events", v, "*") for v in ("create", "list", "watch")}
    # LimitRanges, ResourceQuotas and Namespaces: read only, so the rewrite keeps each pod within its
    # namespace's, with the proxy the namespace's mesh label asks for.
    out |= {("*", "", kind, v, "*") for kind in ("limitranges", "resourcequotas", "namespaces")
            for v in ("list", "watch")}
    # Leader election: create cannot be limited by name; get/update are, to our Lease.
    out.add((ns, "coordination.k8s.io", "leases", "create", "*"))
    out |= {(ns, "coordination.k8s.io", "leases", v, settings.watcher.lease_name) for v in ("get", "update")}
    if spec.self_managed:  # caBundle self-injection
        out |= {("*", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", v,
                 settings.server.webhook_config) for v in ("get", "update")}
        out.add((ns, "", "secrets", "create", "*"))
        out |= {(ns, "", "secrets", v, settings.server.cert_secret) for v in ("get", "patch")}
    if spec.node_versions:
        out.add(("*", "", "nodes", "list", "*"))
    if spec.pull_secrets:
        out |= {("*", "", resource, "get", "*") for resource in ("secrets", "serviceaccounts")}
    return out


def documented_grants() -> set[tuple[str, str, str, str]]:
    """docs/install.md's RBAC table as (scope, resource, verb, name): a row's grant is
    `resources: verbs[; verbs on `name`]`."""
    out = set()
    for row in re.findall(r"^\| ([a-z, ]+): ([^|]+) \| (cluster|own namespace) \|", docs.section(
            docs.page("install.md"), "RBAC, least privilege"), re.M):
        resources, grants, scope = row
        for part in grants.split(";"):
            verbs, _, name = part.partition(" on ")
            out |= {(scope, resource.strip(), verb.strip(), name.strip(" `") or "*")
                    for resource in resources.split(",") for verb in verbs.split(",")}
    return out


def test_install_md_lists_exactly_the_grants_of_every_install():
    """The table names the objects as the defaults do: installs that rename them are left out."""
    default = Settings.from_env({}).watcher.lease_name
    granted = set()
    for spec in INSTALLS.values():
        r = Rendered(spec.render())
        if Settings.from_env(r.plain_env()).watcher.lease_name == default:
            granted |= {("cluster" if ns == "*" else "own namespace", resource, verb, name)
                        for ns, _, resource, verb, name in expected_grants(spec, r)}
    assert documented_grants() == granted


def test_rbac_grants_exactly_the_allowed_list(install):
    spec, r = install
    got, want = grants(r), expected_grants(spec, r)
    assert got - want == set(), f"granted beyond the list: {sorted(got - want)}"
    assert want - got == set(), f"missing: {sorted(want - got)}"


def test_secrets_and_nodes_only_when_asked(install):
    spec, r = install
    g = grants(r)
    secrets = {x for x in g if x[2] == "secrets"}
    if not spec.self_managed and not spec.pull_secrets:
        assert not secrets
    if not spec.pull_secrets:
        # Only our own Secret, in our own namespace (create cannot be limited by name).
        assert all(x[0] == spec.namespace for x in secrets)
        assert all(x[4] != "*" for x in secrets if x[3] != "create")
    assert any(x[2] == "nodes" for x in g) == spec.node_versions


def test_pull_secret_component_turns_the_setting_on():
    env = Rendered(kustomize("overlays/self-managed", COMPONENTS)).plain_env()
    settings = Settings.from_env(env)
    assert settings.registry.pull_secrets and settings.registry.lookup
    assert not Settings.from_env(Rendered(kustomize(".")).plain_env()).registry.pull_secrets


# --- webhook configuration ---------------------------------------------------------------

def selects(selector: dict, labels: dict[str, str]) -> bool:
    """A Kubernetes label selector, evaluated."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        ok = {"In": key in labels and labels[key] in values,
              "NotIn": labels.get(key) not in values,
              "Exists": key in labels,
              "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


def namespace_labels(name: str, opted_in: bool) -> dict[str, str]:
    labels = {"kubernetes.io/metadata.name": name}  # set by the apiserver on every namespace
    if opted_in:
        labels[p.LABEL_NAMESPACE_ENABLED] = "true"
    return labels


def test_webhook_configuration(install):
    spec, r = install
    mwc = r.one("MutatingWebhookConfiguration")
    name = mwc["metadata"]["name"]
    for injector in MESH_INJECTORS:
        assert sorted([name, injector])[0] == name, f"{name} must sort before {injector}"
    assert Settings.from_env(r.plain_env()).server.webhook_config == name
    (hook,) = mwc["webhooks"]
    assert hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["failurePolicy"] == spec.failure_policy
    assert DEFAULTS.registry.budget_seconds < hook["timeoutSeconds"] <= 10
    assert hook["rules"] == [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                              "resources": ["pods"], "scope": "Namespaced"}]
    service = r.one("Service")
    assert hook["clientConfig"]["service"] == {
        "name": service["metadata"]["name"], "namespace": service["metadata"]["namespace"],
        "path": MUTATE_PATH, "port": 443}


def test_namespace_selector_excludes_own_namespace_and_kube_system(install):
    spec, r = install
    (hook,) = r.one("MutatingWebhookConfiguration")["webhooks"]
    selector = hook["namespaceSelector"]
    assert hook.get("objectSelector") == spec.object_selector
    for protected in (spec.namespace, "kube-system"):
        assert not selects(selector, namespace_labels(protected, opted_in=True)), protected
    assert selects(selector, namespace_labels("builds", opted_in=True))
    assert not selects(selector, namespace_labels("builds", opted_in=False))
    assert Settings.from_env({"INITSHIFT_NAMESPACE": spec.namespace}).server.namespace == r.namespace


# --- Deployment, PDB, Service ------------------------------------------------------------

def _port(container: dict, port: int | str) -> int:
    if isinstance(port, int):
        return port
    (number,) = [cp["containerPort"] for cp in container["ports"] if cp["name"] == port]
    return number


def test_deployment(install):
    spec, r = install
    d = r.deployment
    pod = d["spec"]["template"]
    c = r.container
    assert d["spec"]["replicas"] == spec.replicas
    assert selects(d["spec"]["selector"], pod["metadata"]["labels"])
    labels = pod["metadata"]["labels"]
    assert labels["app.kubernetes.io/instance"] and labels["app.kubernetes.io/version"] == __version__
    if spec.anti_affinity:
        term = pod["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
        assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        assert selects(term["podAffinityTerm"]["labelSelector"], pod["metadata"]["labels"])
    if spec.pdb:
        pdb = r.one("PodDisruptionBudget")
        assert selects(pdb["spec"]["selector"], pod["metadata"]["labels"])
        assert 0 < pdb["spec"]["minAvailable"] < spec.replicas
        # A replica that is not Ready (crash-looping) never blocks a node drain.
        assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    else:
        assert not r.of_kind("PodDisruptionBudget")
    assert pod["spec"]["serviceAccountName"] == r.one("ServiceAccount")["metadata"]["name"]
    # No mesh proxy in initshift's own pods, wherever a mesh injects by default.
    assert labels["sidecar.istio.io/inject"] == "false"
    assert pod["metadata"]["annotations"]["linkerd.io/inject"] == "disabled"

    settings = Settings.from_env({**r.plain_env(), "INITSHIFT_NAMESPACE": spec.namespace})
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"), ("startupProbe", "/healthz")):
        get = c[probe]["httpGet"]
        assert (get["path"], get["scheme"], _port(c, get["port"])) == (path, "HTTPS", settings.server.port)
    res = c["resources"]
    assert res["requests"]["cpu"] and res["requests"]["memory"] and res["limits"]["memory"]

    assert c["command"][:2] == ["initshift", "serve"] and "serve" in cli.COMMANDS
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"  # why it exited, for `initshift check`
    assert serve_cmd.parser().parse_args(c["command"][2:]).watch, "the watcher runs in-process"
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["runAsUser"] == pod["spec"]["securityContext"]["runAsUser"] == p.IMAGE_UID


def test_the_server_starts_in_the_environment_the_kubelet_gives(install):
    """The kubelet adds variables for the Services of the pod's namespace, unless the pod
    turns them off: the Service `initshift` gives INITSHIFT_PORT=tcp://IP:443, which the
    server read as its port and refused (deploy/'s pods crashed on a real kubelet)."""
    spec, r = install
    env = servicelinks.container_env(r.deployment, r.of_kind("Service"))
    settings = Settings.from_env(env)
    assert settings.server.port == _port(r.container, "https")
    assert {k for k in env if k.startswith(("INITSHIFT_", "SUPPORT_"))} <= {row[0] for row in settings_rows()}
    assert env["KUBERNETES_SERVICE_HOST"] == "10.96.0.1"  # the API's address, always given


def test_deployment_env_uses_only_real_settings(install):
    spec, r = install
    env = r.env()
    known = {row[0] for row in settings_rows()}
    assert set(env) <= known, f"unknown variables: {set(env) - known}"
    assert env["INITSHIFT_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    settings = Settings.from_env({**r.plain_env(), "INITSHIFT_NAMESPACE": spec.namespace})  # every value parses
    assert settings.feature_gate is spec.feature_gate
    assert p.FEATURE_GATE_ENV in env
    assert settings.server.self_managed_certs is spec.self_managed
    assert settings.registry.pull_secrets is spec.pull_secrets


def test_injected_image_is_the_serving_image(install):
    _, r = install
    # Both set INITSHIFT_IMAGE from the very reference the Deployment runs.
    assert r.plain_env()["INITSHIFT_IMAGE"] == r.container["image"]
    assert Settings.from_env(r.plain_env()).rewrite.image == r.container["image"]


def test_kustomize_images_moves_the_injected_image_too(tmp_path):
    """A user's overlay mirroring the image with `images:` (name and digest): INITSHIFT_IMAGE
    follows the container image, and no other value changes."""
    from tests.support import deploy_render

    mirror = "mirror.example/platform/initshift"
    digest = "sha256:" + "ab" * 32
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [os.path.relpath(DEPLOY, tmp_path)],
        "images": [{"name": "ghcr.io/initshift/initshift", "newName": mirror, "digest": digest}]}))
    mirrored = Rendered(deploy_render._run_kustomize(tmp_path))
    assert mirrored.container["image"] == f"{mirror}@{digest}" == mirrored.plain_env()["INITSHIFT_IMAGE"]
    plain = Rendered(kustomize("."))
    changed = {k for k, v in mirrored.plain_env().items() if plain.plain_env()[k] != v}
    assert changed == {"INITSHIFT_IMAGE"}


def test_service_routes_443_to_the_server_port_and_carries_metrics(install):
    _, r = install
    svc = r.one("Service")
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert set(ports) == {"https", "metrics"}
    port = ports["https"]
    assert port["port"] == 443
    settings = Settings.from_env(r.plain_env())
    assert _port(r.container, port["targetPort"]) == settings.server.port
    assert ports["metrics"]["port"] == _port(r.container, ports["metrics"]["targetPort"]) == \
        settings.server.metrics_port != settings.server.port
    assert selects({"matchLabels": svc["spec"]["selector"]}, r.deployment["spec"]["template"]["metadata"]["labels"])


def test_tls_files_come_from_the_certificate_source(install):
    spec, r = install
    settings = Settings.from_env({**r.plain_env(), "INITSHIFT_NAMESPACE": spec.namespace})
    mounts = {m["name"]: m for m in r.container["volumeMounts"]}
    volumes = {v["name"]: v for v in r.deployment["spec"]["template"]["spec"]["volumes"]}
    tls_dir = str(PurePosixPath(settings.server.tls_cert).parent)
    assert str(PurePosixPath(settings.server.tls_key).parent) == tls_dir
    (mount,) = [m for m in mounts.values() if m["mountPath"] == tls_dir]
    volume = volumes[mount["name"]]
    mwc = r.one("MutatingWebhookConfiguration")
    annotations = mwc["metadata"].get("annotations") or {}
    if spec.self_managed:
        # The server writes the pair itself: a writable emptyDir, no Secret volume.
        assert "emptyDir" in volume and not mount.get("readOnly")
        assert INJECT_CA_FROM not in annotations
        assert not r.of_kind("Certificate")
    else:
        assert volume["secret"]["secretName"] == settings.server.cert_secret
        assert not volume["secret"].get("optional") and mount["readOnly"] is True
        cert = serving_certificate(r)
        assert cert["spec"]["secretName"] == settings.server.cert_secret
        svc = r.one("Service")["metadata"]
        assert f"{svc['name']}.{svc['namespace']}.svc" in cert["spec"]["dnsNames"]
        assert annotations[INJECT_CA_FROM] == f"{cert['metadata']['namespace']}/{cert['metadata']['name']}"
        issuer = cert["spec"]["issuerRef"]
        if spec.issuer is None:
            assert r.one(issuer["kind"], issuer["name"])
        else:  # the user's own Issuer/ClusterIssuer: the chart makes none, nor a CA
            assert issuer == spec.issuer and not r.of_kind("Issuer") and len(r.of_kind("Certificate")) == 1


def serving_certificate(r: Rendered) -> dict:
    """The Certificate whose Secret the server mounts (cert-manager installs)."""
    secret = Settings.from_env(r.plain_env()).server.cert_secret
    (cert,) = [c for c in r.of_kind("Certificate") if c["spec"]["secretName"] == secret]
    return cert


def _hours(duration: str) -> float:
    h, m, s = (re.search(rf"(\d+){unit}", duration) for unit in "hms")
    return sum(int(x.group(1)) * f for x, f in ((h, 1), (m, 1 / 60), (s, 1 / 3600)) if x)


@pytest.mark.parametrize("name", [i for i, spec in INSTALLS.items() if not spec.self_managed and spec.issuer is None])
def test_cert_manager_signs_with_a_ca_of_its_own(name):
    """cert-manager's CA bootstrap: a self-signed Issuer makes a CA (isCA), a CA Issuer signs
    the serving certificate with it. The serving Secret's ca.crt, which cainjector copies into
    the caBundle, is then that CA, the same across renewals; a self-signed serving certificate
    made every renewal a new CA in the caBundle before the replicas had the new files."""
    r = Rendered(INSTALLS[name].render())
    serving = serving_certificate(r)["spec"]
    assert not serving.get("isCA")
    ref = serving["issuerRef"]
    assert (ref["kind"], ref.get("group", "cert-manager.io")) == ("Issuer", "cert-manager.io")
    signer = r.one("Issuer", ref["name"])["spec"]
    assert "selfSigned" not in signer, "the serving certificate would be its own CA"
    (ca,) = [c["spec"] for c in r.of_kind("Certificate") if c["spec"]["secretName"] == signer["ca"]["secretName"]]
    assert ca["isCA"] is True and ca["commonName"]
    assert "selfSigned" in r.one("Issuer", ca["issuerRef"]["name"])["spec"]
    # Long-lived and renewed with the same key: certificates it signed before stay trusted.
    assert _hours(ca["duration"]) >= 10 * _hours(serving["duration"])
    assert ca["privateKey"]["rotationPolicy"] == "Never"
    assert ca["secretName"] != serving["secretName"]


def test_namespaced_objects_live_in_the_install_namespace(install):
    spec, r = install
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration"}
    for o in r.objects:
        ns = o["metadata"].get("namespace")
        assert (ns is None) if o["kind"] in cluster_scoped else (ns == spec.namespace), (o["kind"], ns)
    namespaces = r.of_kind("Namespace")
    if spec.has_namespace_object:
        (ns_obj,) = namespaces
        assert ns_obj["metadata"]["name"] == spec.namespace
        assert ns_obj["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    else:
        assert not namespaces  # Helm installs into an existing (or --create-namespace) namespace


# --- Pod Security "restricted" -------------------------------------------------------------

def test_deployment_pod_is_restricted(install):
    _, r = install
    assert pss.template_violations(r.deployment) == []


def test_injected_init_container_is_restricted():
    from webhook.rewrite._waiter import init_container

    for settings in (DEFAULTS, Settings.from_env({"INITSHIFT_IMAGE": "registry.example/x:1",
                                                  "INITSHIFT_IMAGE_PULL_POLICY": "Always"})):
        c = init_container(settings.rewrite)
        assert pss.container_violations(c) == []
        assert c["name"] == p.INIT_CONTAINER_NAME
        assert c["image"] == settings.rewrite.image
        assert c["securityContext"]["runAsUser"] == p.IMAGE_UID
        assert c["command"][0].startswith(p.IMAGE_WAITER_DIR + "/")
        # It must also pass inside a pod that sets nothing at pod level.
        assert pss.pod_violations({"spec": {"initContainers": [c], "containers": []}}) == []


def test_rewritten_restricted_pod_stays_restricted():
    """A build pod that passes "restricted" still passes after the waiter rewrite."""
    from webhook.rewrite._rewrite import rewrite

    from tests.support.fixtures import pods

    pod = pods.load("job-git-clone")
    restricted = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
                  "seccompProfile": {"type": "RuntimeDefault"}}
    for c in [*(pod["spec"].get("initContainers") or []), *pod["spec"]["containers"]]:
        c["securityContext"] = dict(restricted)
    pod["spec"].pop("securityContext", None)
    pod = pods.inject_istio(pod)
    for c in [*(pod["spec"].get("initContainers") or []), *pod["spec"]["containers"]]:
        c["securityContext"] = {**restricted, **{k: v for k, v in (c.get("securityContext") or {}).items()
                                                 if k not in ("privileged", "capabilities", "runAsNonRoot",
                                                              "runAsUser", "allowPrivilegeEscalation")}}
    before = pss.pod_violations(pod)
    assert before == [], before
    result = rewrite(pod, Settings.from_env({p.FEATURE_GATE_ENV: "true", "INITSHIFT_MODE": "waiter"}))
    assert result.changed, result.reason
    assert pss.pod_violations(result.pod) == []


# --- Helm chart against kustomize and the code's defaults ------------------------------------

def _strip_helm_labels(obj: dict) -> dict:
    obj = yaml.safe_load(yaml.safe_dump(obj))
    for labels in (obj["metadata"].get("labels") or {},):
        for key in ("app.kubernetes.io/instance", "app.kubernetes.io/version", "app.kubernetes.io/managed-by",
                    "helm.sh/chart", "app.kubernetes.io/part-of", "app.kubernetes.io/component"):
            labels.pop(key, None)
    return obj


def test_chart_renders_the_same_objects_as_kustomize():
    k, h = Rendered(kustomize(".")), Rendered(helm())
    ids = lambda r: {(o["kind"], o["metadata"]["name"]) for o in r.objects if o["kind"] != "Namespace"}  # noqa: E731
    assert ids(h) == ids(k)
    assert grants(h) == grants(k)
    for kind in ("MutatingWebhookConfiguration", "Service", "PodDisruptionBudget"):
        assert _strip_helm_labels(h.one(kind))["spec" if kind != "MutatingWebhookConfiguration" else "webhooks"] == \
            _strip_helm_labels(k.one(kind))["spec" if kind != "MutatingWebhookConfiguration" else "webhooks"]
    assert h.deployment["spec"]["template"]["metadata"] == k.deployment["spec"]["template"]["metadata"]
    hp, kp = h.deployment["spec"]["template"]["spec"], k.deployment["spec"]["template"]["spec"]
    for key in ("securityContext", "affinity", "volumes", "serviceAccountName"):
        assert hp[key] == kp[key], key
    hc, kc = dict(h.container), dict(k.container)
    for key in ("command", "ports", "livenessProbe", "readinessProbe", "startupProbe", "resources",
                "securityContext", "volumeMounts", "image", "imagePullPolicy"):
        assert hc[key] == kc[key], key
    # The chart spells out settings kustomize leaves at their defaults: same values.
    he, ke = h.env(), k.env()
    assert {n: e for n, e in he.items() if n in ke} == ke
    assert Settings.from_env(h.plain_env()) == Settings.from_env(k.plain_env())


def test_chart_rejects_bad_values():
    import helm_python

    for bad in ({"webhook": {"failurePolicy": "Sometimes"}}, {"strategy": "fast"}, {"replicas": 0},
                {"certificates": {"mode": "vault"}}, {"quitEndpoints": {"envoy": "tcp://x"}},
                {"injectedImagePullSecrets": ["Registry"]}, {"injectedImagePullSecrets": [{"name": "registry"}]}):
        with pytest.raises(helm_python.HelmValuesError):
            helm(bad)


def test_chart_custom_values_take_effect():
    r = Rendered(helm(CUSTOM_VALUES, namespace="platform"))
    settings = Settings.from_env(r.plain_env())
    assert r.container["image"] == "registry.example/platform/initshift:9.9.9" == settings.rewrite.image
    assert settings.rewrite.image_pull_policy == "Always"
    assert settings.rewrite.mode == "waiter"
    assert settings.rewrite.native_sidecars == "false"
    assert settings.rewrite.resources_policy == "divide"
    assert settings.rewrite.sidecar_names == ("istio-proxy", "envoy")
    assert settings.rewrite.image_pull_secrets == ("platform-registry", "mirror.pull")
    assert settings.rewrite.quit_endpoints == {"envoy": "http://127.0.0.1:9901/quitquitquit"}
    assert settings.server.log_level == "debug"
    assert settings.watcher.grace_seconds == 20
    (hook,) = r.one("MutatingWebhookConfiguration")["webhooks"]
    assert hook["timeoutSeconds"] == 8
    assert not selects(hook["namespaceSelector"], namespace_labels("istio-system", opted_in=True))
    assert r.container["resources"] == CUSTOM_VALUES["resources"]


def test_chart_defaults_are_the_code_defaults():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    rw = DEFAULTS.rewrite
    assert tuple(values["sidecarNames"]) == rw.sidecar_names == p.DEFAULT_SIDECAR_NAMES
    assert tuple(values["injectedImagePullSecrets"]) == rw.image_pull_secrets == ()
    assert values["quitEndpoints"] == rw.quit_endpoints == p.DEFAULT_QUIT_ENDPOINTS
    assert (values["strategy"], values["nativeSidecars"], values["resourcesPolicy"]) == \
        (rw.mode, rw.native_sidecars, rw.resources_policy)
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert sorted(schema["properties"]["strategy"]["enum"]) == sorted(p.MODES), "every INITSHIFT_MODE value"
    assert values["webhook"]["configName"] == DEFAULTS.server.webhook_config
    assert values["webhook"]["namespaceSelector"]["matchLabels"] == {p.LABEL_NAMESPACE_ENABLED: "true"}


def test_versions_agree():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    base = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())
    (image,) = base["images"]
    assert chart["appVersion"] == image["newTag"] == __version__
    assert DEFAULTS.rewrite.image == f"{image['name']}:{__version__}"
    assert Rendered(helm()).container["image"] == DEFAULTS.rewrite.image == Rendered(kustomize(".")).container["image"]
    assert Rendered(kustomize(".")).deployment["spec"]["template"]["metadata"]["labels"][
        "app.kubernetes.io/version"] == __version__


def test_chart_kube_version_is_the_oldest_validated():
    from tests.support.podvalidate import OLDEST

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    major_minor = ".".join(OLDEST.split(".")[:2])
    assert chart["kubeVersion"] == f">={major_minor}.0-0"
    for page in ("README.md", "install.md"):
        assert f"Kubernetes {major_minor} or newer" in docs.page(page), page


def test_render_errors_are_one_line(tmp_path):
    (tmp_path / "kustomization.yaml").write_text("resources: [missing.yaml]\n")
    from tests.support import deploy_render

    with pytest.raises(RenderError) as e:
        deploy_render._run_kustomize(tmp_path)
    assert "missing.yaml" in str(e.value)


def test_installs_cover_every_component_and_overlay():
    """A new overlay or component must be added to INSTALLS to be checked."""
    on_disk = {f"overlays/{d}" for d in os.listdir(DEPLOY / "overlays")}
    on_disk |= {f"components/{d}" for d in os.listdir(DEPLOY / "components")}
    # components/pod-patch-policy: its own file, test_deploy_pod_patch_policy.py (admissionregistration.k8s.io/v1
    # is served from 1.30, after the oldest version `validate` checks against).
    covered = {"overlays/self-managed", "overlays/cert-manager", *COMPONENTS, MONITORING, POD_MONITOR,
               "components/pod-patch-policy"}
    assert on_disk == covered



def test_chart_lints_clean():
    import helm_python

    report = helm_python.lint(str(CHART))
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] > 1] == []  # only "icon is recommended" (INFO)


# --- the values operators ask for ---------------------------------------------------------

def test_chart_names_follow_the_overrides():
    r = Rendered(helm(OPERATOR_VALUES))
    settings = Settings.from_env(r.plain_env())
    for o in r.objects:
        name = o["metadata"]["name"]
        if o["kind"] != "MutatingWebhookConfiguration":  # its name orders it among the injectors: configName
            assert name == "ci-initshift" or name.startswith("ci-initshift-"), (o["kind"], name)
        assert o["metadata"]["labels"]["app.kubernetes.io/name"] == "initshift-ci", (o["kind"], name)
    service, account = r.one("Service"), r.one("ServiceAccount")
    pod = r.deployment["spec"]["template"]
    assert pod["spec"]["serviceAccountName"] == account["metadata"]["name"] == "ci-initshift"
    assert settings.server.service_name == service["metadata"]["name"] == "ci-initshift"
    assert settings.server.cert_secret == r.one("Certificate")["spec"]["secretName"] == "ci-initshift-tls"
    assert settings.watcher.lease_name == "ci-initshift-watcher"
    assert selects({"matchLabels": service["spec"]["selector"]}, pod["metadata"]["labels"])
    assert selects(r.deployment["spec"]["selector"], pod["metadata"]["labels"])
    # nameOverride alone names the objects too (fullname defaults to the name)
    only_name = Rendered(helm({"nameOverride": "builds"}))
    assert only_name.deployment["metadata"]["name"] == only_name.one("Service")["metadata"]["name"] == "builds"
    assert Settings.from_env(only_name.plain_env()).server.cert_secret == "builds-tls"


def test_chart_extra_volumes_hold_a_registry_ca_on_the_read_only_root():
    r = Rendered(helm(OPERATOR_VALUES))
    volumes = {v["name"]: v for v in r.deployment["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["mountPath"]: m for m in r.container["volumeMounts"]}
    assert volumes["registry-ca"] == {"name": "registry-ca", "configMap": {"name": "registry-ca"}}
    assert mounts[REGISTRY_CA]["name"] == "registry-ca" and mounts[REGISTRY_CA]["readOnly"] is True
    assert r.container["securityContext"]["readOnlyRootFilesystem"] is True
    ca_file = Settings.from_env(r.plain_env()).registry.ca_file
    assert PurePosixPath(ca_file).parent == PurePosixPath(REGISTRY_CA)
    assert {"tls", "tmp"} <= set(volumes), "the chart's own volumes stay"


def test_chart_annotations_and_object_selector():
    r = Rendered(helm(OPERATOR_VALUES))
    assert r.one("ServiceAccount")["metadata"]["annotations"] == OPERATOR_VALUES["serviceAccount"]["annotations"]
    assert r.one("Service")["metadata"]["annotations"] == OPERATOR_VALUES["service"]["annotations"]
    (hook,) = r.one("MutatingWebhookConfiguration")["webhooks"]
    assert selects(hook["objectSelector"], {"app": "build"})
    assert not selects(hook["objectSelector"], {"app": "build", "initshift.io/skip": "true"})
    plain = Rendered(helm())
    assert "annotations" not in plain.one("ServiceAccount")["metadata"]
    assert "annotations" not in plain.one("Service")["metadata"]


def test_chart_host_network_moves_both_ports():
    r = Rendered(helm({"hostNetwork": True, "serverPort": 10443, "metrics": {"port": 10080}}))
    pod = r.deployment["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    settings = Settings.from_env(r.plain_env())
    ports = {p["name"]: p["containerPort"] for p in r.container["ports"]}
    assert ports == {"https": 10443, "metrics": 10080} == {"https": settings.server.port,
                                                            "metrics": settings.server.metrics_port}
    svc = {p["name"]: p for p in r.one("Service")["spec"]["ports"]}
    assert svc["https"]["port"] == 443 and _port(r.container, svc["https"]["targetPort"]) == 10443
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert _port(r.container, r.container[probe]["httpGet"]["port"]) == 10443
    for obj in r.objects:
        validate(obj)
    # Replaced one at a time where it runs: a surge replica would find its ports taken
    # wherever a replica runs (make e2e's server-pod rolls it out on one node).
    assert r.deployment["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 1, "maxSurge": 0}
    default = Rendered(helm()).deployment["spec"]
    assert "hostNetwork" not in default["template"]["spec"]
    assert default["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    import helm_python

    with pytest.raises(helm_python.HelmRenderError, match="metrics.port must differ from serverPort"):
        helm({"serverPort": 8080})


def test_chart_uses_an_existing_issuer():
    for ref, want in (({"name": "internal-ca", "kind": "ClusterIssuer"},
                       {"name": "internal-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}),
                      ({"name": "pca", "kind": "Issuer", "group": "awspca.cert-manager.io"},
                       {"name": "pca", "kind": "Issuer", "group": "awspca.cert-manager.io"}),
                      ({"name": "team-ca"}, {"name": "team-ca", "kind": "Issuer", "group": "cert-manager.io"})):
        r = Rendered(helm({"certificates": {"mode": "cert-manager", "issuerRef": ref}}))
        assert r.one("Certificate")["spec"]["issuerRef"] == want and not r.of_kind("Issuer")
        for obj in r.objects:
            validate(obj)
    own = Rendered(helm({"certificates": {"mode": "cert-manager"}}))
    assert own.one("Issuer", serving_certificate(own)["spec"]["issuerRef"]["name"])["spec"]["ca"]  # the chart's own CA


@pytest.mark.parametrize("bad", [
    {"workers": 2}, {"serverPort": 0}, {"serverPort": 70000}, {"hostNetwork": "yes"},
    {"nameOverride": "Not_A_Name"}, {"fullnameOverride": "x" * 51},
    # The Service takes the name: a DNS-1035 label, which starts with a letter.
    {"nameOverride": "1nitshift"}, {"fullnameOverride": "0-initshift"},
    # No sidecar names: nothing would ever be rewritten; a comma would split a name.
    {"sidecarNames": []}, {"sidecarNames": ["istio-proxy,envoy"]}, {"sidecarNames": ["envoy", "envoy"]},
    # At or below the registry lookup budget (4 s): the apiserver gives up before a lookup does.
    {"webhook": {"timeoutSeconds": 4}}, {"webhook": {"timeoutSeconds": 1}},
    # The labels the chart sets; name and component are its selectors'.
    {"podLabels": {"app.kubernetes.io/name": "other"}}, {"podLabels": {"app.kubernetes.io/component": "other"}},
    {"podLabels": {"app.kubernetes.io/instance": "other"}}, {"podLabels": {"app.kubernetes.io/version": "9"}},
    {"serviceAccount": {"annotations": {"a": 1}}}, {"serviceAccount": {"name": "other"}},
    {"service": {"annotations": []}}, {"service": {"type": "NodePort"}},
    {"webhook": {"objectSelector": {"matchExpressions": [{"key": "k", "operator": "Maybe"}]}}},
    {"webhook": {"objectSelector": {"matchLabel": {"a": "b"}}}},
    {"certificates": {"mode": "cert-manager", "issuerRef": {"kind": "ClusterIssuer"}}},
    {"certificates": {"mode": "cert-manager", "issuerRef": {"name": "ca", "kind": "Vault"}}},
    {"extraVolumes": [{"configMap": {"name": "x"}}]}, {"extraVolumeMounts": [{"name": "x"}]},
    {"extraVolumeMounts": [{"name": "x", "mountPath": "relative"}]},
], ids=lambda v: json.dumps(v)[:60])
def test_chart_schema_rejects_bad_operator_values(bad):
    import helm_python

    with pytest.raises(helm_python.HelmValuesError):
        helm(bad)


def _notes(values: dict) -> str:
    return helm_notes(values, namespace="platform")


def test_notes_point_at_check_and_warn_about_fail():
    """(tests/deploy/test_notes.py holds the names and the check line to the rendered objects.)"""
    text = _notes({})
    assert "initshift check -n platform\n" in text  # it port-forwards itself (tests/deploy/test_notes.py)
    assert "kubectl initshift check" in text
    assert "failurePolicy=Ignore" in text and "WARNING: failurePolicy=Fail" not in text
    fail = _notes({"webhook": {"failurePolicy": "Fail"}})
    assert "WARNING: failurePolicy=Fail" in fail and "REJECTS every pod" in fail


def test_private_registry_kustomization_of_the_docs_sets_the_pull_secrets(tmp_path):
    """docs/install.md's kustomization for a private registry, rendered as a user would."""
    from tests.support import deploy_render, docs

    kustomization = yaml.safe_load(docs.fenced_after(docs.page("install.md"), "# my-initshift/kustomization.yaml"))
    assert kustomization["resources"] == ["../initshift/deploy"]
    kustomization["resources"] = [os.path.relpath(DEPLOY, tmp_path)]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    rendered = Rendered(deploy_render._run_kustomize(tmp_path))
    assert Settings.from_env(rendered.plain_env()).rewrite.image_pull_secrets == ("platform-registry",)
    plain = Rendered(kustomize("."))
    assert {k for k, v in rendered.plain_env().items() if plain.plain_env().get(k) != v} == \
        {"INITSHIFT_IMAGE_PULL_SECRETS"}


@pytest.mark.parametrize("install", [i for i in INSTALLS if i in ("kustomize-default", "helm-default")])
def test_a_stopping_replica_keeps_serving_first(install):
    """The preStop hook drains the server (SIGUSR1 to PID 1, which it is: the pod shares no
    process namespace) and sleeps, in the image's own Python (no shell), within the grace
    period that also covers the server's graceful stop."""
    r = Rendered(INSTALLS[install].render())
    hook = r.container["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[:2] == ["python3", "-c"]
    delay = float(re.fullmatch(HOOK, hook[2]).group(1))
    assert not r.deployment["spec"]["template"]["spec"].get("shareProcessNamespace")
    grace = r.deployment["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
    assert delay == 5 and delay + _STOPPING_SECONDS <= grace


# The preStop hook: the server drained (SIGUSR1, webhook/admission/_https.py), then the delay.
HOOK = r"import os, signal, time; os\.kill\(1, signal\.SIGUSR1\); time\.sleep\((\d+)\)"

# The longest a server takes once SIGTERM has come: uvicorn's graceful stop of the reviews in
# flight, then its companions (the watcher, certificate renewal) given 5 s to end.
_STOPPING_SECONDS = inspect.signature(HttpsServer).parameters["graceful_seconds"].default + 5


def test_chart_shutdown_delay_value():
    assert "lifecycle" not in Rendered(helm({"shutdownDelaySeconds": 0})).container
    hook = Rendered(helm({"shutdownDelaySeconds": 12})).container["lifecycle"]["preStop"]["exec"]["command"]
    assert re.fullmatch(HOOK, hook[2]).group(1) == "12"
    import helm_python

    with pytest.raises(helm_python.HelmValuesError):
        helm({"shutdownDelaySeconds": 16})  # past the grace period with the graceful stop
    assert 15 + _STOPPING_SECONDS <= 30


# --- what the audit of deploy/ found ---------------------------------------------------------

NODES_LIST: Grant = ("*", "", "nodes", "list", "*")


def test_every_default_install_lets_detection_read_kubelet_versions():
    """A v1.28 kubelet under a v1.29+ apiserver (an upgrade in progress) runs a native sidecar
    as an ordinary init container that never exits: only the kubelets' versions tell `auto`
    so, and reading them needs `nodes: list`. Every default grants it; leaving it out is a
    choice (Helm rbac.nodeVersions=false, components/without-node-versions), the same objects
    either way."""
    for defaults in (kustomize("."), kustomize("overlays/self-managed"), kustomize("overlays/cert-manager"), helm(),
                     helm({"certificates": {"mode": "cert-manager"}})):
        assert NODES_LIST in grants(Rendered(defaults))
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["rbac"]["nodeVersions"] is True
    h, k = Rendered(helm({"rbac": {"nodeVersions": False}})), Rendered(kustomize(".", [NO_NODE_VERSIONS]))
    assert NODES_LIST not in grants(h) and grants(h) == grants(k)
    ids = lambda r: {(o["kind"], o["metadata"]["name"]) for o in r.objects if o["kind"] != "Namespace"}  # noqa: E731
    assert ids(h) == ids(k)
    assert ids(Rendered(kustomize("."))) - ids(k) == {("ClusterRole", "initshift-node-versions"),
                                                      ("ClusterRoleBinding", "initshift-node-versions")}


def _chart_env_names() -> set[str]:
    """Every variable the chart sets, with every value that adds one turned on."""
    names: set[str] = set()
    for values in ({}, CUSTOM_VALUES, OPERATOR_VALUES, {"registry": {"lookup": True, "pullSecrets": True}}):
        names |= set(Rendered(helm(values)).env()) - {e["name"] for e in values.get("extraEnv", [])}
    return names


@pytest.mark.parametrize("name", sorted(_chart_env_names()))
def test_chart_extra_env_may_not_repeat_a_variable_the_chart_sets(name):
    """Twice in the container's env, server-side apply refuses the Deployment (duplicate
    entries for key [name=...]) and client-side apply keeps one of the two for ever: the
    chart refuses it, naming the variable and the value that sets it."""
    import helm_python

    with pytest.raises(helm_python.HelmRenderError, match=rf"extraEnv sets {name}, which the chart sets from \S"):
        helm({"extraEnv": [{"name": name, "value": "1"}]})


def test_chart_extra_env_names_the_value_to_set_instead():
    import helm_python

    with pytest.raises(helm_python.HelmRenderError, match="extraEnv sets INITSHIFT_LOG_LEVEL, which the chart sets "
                                                          "from logLevel: set that value instead"):
        helm({"extraEnv": [{"name": "INITSHIFT_LOG_LEVEL", "value": "debug"}]})
    with pytest.raises(helm_python.HelmRenderError, match="extraEnv sets INITSHIFT_GRACE_SECONDS twice"):
        helm({"extraEnv": [{"name": "INITSHIFT_GRACE_SECONDS", "value": "20"},
                           {"name": "INITSHIFT_GRACE_SECONDS", "value": "30"}]})
    # Any other setting is added once, after the chart's own.
    env = Rendered(helm({"extraEnv": [{"name": "INITSHIFT_GRACE_SECONDS", "value": "20"}]})).container["env"]
    assert [e["name"] for e in env].count("INITSHIFT_GRACE_SECONDS") == 1 and env[-1]["value"] == "20"


def test_chart_pod_labels_and_annotations_keep_the_mesh_out_unless_told():
    """initshift's pods opt out of Istio's and Linkerd's injection; podLabels and podAnnotations
    add to that, and may opt back in."""
    pod = Rendered(helm(POD_VALUES)).deployment["spec"]["template"]["metadata"]
    assert pod["labels"]["team"] == "platform" and pod["labels"]["sidecar.istio.io/inject"] == "false"
    assert pod["annotations"] == {"example.com/owner": "platform", "linkerd.io/inject": "disabled"}
    back = Rendered(helm({"podLabels": {"sidecar.istio.io/inject": "true"},
                          "podAnnotations": {"linkerd.io/inject": "enabled"}})).deployment["spec"]["template"]["metadata"]
    assert back["labels"]["sidecar.istio.io/inject"] == "true" and back["annotations"] == {"linkerd.io/inject": "enabled"}


def test_chart_timeout_minimum_is_above_the_registry_budget():
    """docs/install.md: the webhook's timeout must exceed the registry lookup budget."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    timeout = schema["properties"]["webhook"]["properties"]["timeoutSeconds"]
    assert timeout["minimum"] - 1 <= DEFAULTS.registry.budget_seconds < timeout["minimum"]
    assert timeout["maximum"] == 30
    Rendered(helm({"webhook": {"timeoutSeconds": timeout["minimum"]}}))
