"""`initshift check`'s preflight: the install as the cluster sees it, one line per fact.

Every check reads through `KubeApi` with the caller's credentials; nothing is changed. The
rules a configuration must follow are the ones deploy/ ships (see docs/install.md, "The webhook
configuration"): name order before the mesh injectors, `reinvocationPolicy: IfNeeded`,
`sideEffects: None`, a timeout above the registry budget, a namespaceSelector that never
selects initshift's own namespace or kube-system.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
import re
from dataclasses import dataclass
from typing import Any, Awaitable
from urllib.parse import urlsplit

import yaml

from waiter import protocol as p

from ..kube import (ALWAYS, NODE_VERSIONS, PULL_SECRETS, SELF_MANAGED_CERTS, Access, KubeApi, KubeError, PortForward,
                    server_access)
from ..settings import Settings
from ..watcher import parse_time
from ._check_deployment import deployment_lines, failure_policy_of, ready_condition, unanswered
from ._check_report import Line, Report, Target, selects
from ._check_forward import in_cluster, service_pod
from ._check_tls import Served, direct, forwarded, probe
from ._podcli import unreached

_API_TIMEOUT_MAX_SECONDS = 30  # the apiserver's limit for timeoutSeconds
_CERT_MANAGER_INJECT = "cert-manager.io/inject-ca-from"
_NAME_LABEL = "kubernetes.io/metadata.name"  # the apiserver sets it on every namespace
_ALWAYS_EXCLUDED = ("kube-system",)
# Istio: istio-sidecar-injector, istio-revision-tag-*; webhooks *.sidecar-injector.istio.io.
_ISTIO = re.compile(r"(^|\.)sidecar-injector\.istio\.io$")
_LINKERD = re.compile(r"(^|\.)linkerd-proxy-injector\.linkerd\.io$")
ISTIO, LINKERD = "Istio", "Linkerd"
_ISTIO_NATIVE_ENV = "ENABLE_NATIVE_SIDECARS"  # istiod's switch for native sidecars
_LINKERD_CONFIG = "linkerd-config"  # its `values` hold proxy.nativeSidecar


def _labels(obj: dict) -> dict:
    return (obj.get("metadata") or {}).get("labels") or {}


def _annotations(obj: dict) -> dict:
    return (obj.get("metadata") or {}).get("annotations") or {}


def pod_webhook(config: dict) -> dict | None:
    """The configuration's webhook that is called for pod creation."""
    for wh in config.get("webhooks") or []:
        for rule in wh.get("rules") or []:
            if set(rule.get("resources") or []) & {"pods", "*"} and \
                    set(rule.get("operations") or []) & {"CREATE", "*"} and "" in (rule.get("apiGroups") or []):
                return wh
    return None


def calls_for(wh: dict, namespace: dict, pod_labels: dict | None = None) -> bool:
    """Whether the apiserver calls this webhook for a pod with `pod_labels` in `namespace`."""
    return selects(wh.get("namespaceSelector"), _labels(namespace)) and \
        selects(wh.get("objectSelector"), pod_labels or {})


# --- mesh injectors -------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Injector:
    mesh: str
    config: dict  # the MutatingWebhookConfiguration
    native: str  # "yes", "no" or what could not be told, with where it was read

    @property
    def name(self) -> str:
        return str(self.config["metadata"]["name"])

    def injects_in(self, namespace: dict) -> bool:
        hooks = [wh for wh in self.config.get("webhooks") or [] if calls_for(wh, namespace)]
        if self.mesh == LINKERD:  # Linkerd's injector is called everywhere; the annotation decides
            return bool(hooks) and _annotations(namespace).get(p.LINKERD_INJECT_ANNOTATION) == "enabled"
        return bool(hooks)


def _mesh_of(config: dict) -> str | None:
    names = [str(wh.get("name") or "") for wh in config.get("webhooks") or []]
    if any(_ISTIO.search(n) for n in names):
        return ISTIO
    if any(_LINKERD.search(n) for n in names):
        return LINKERD
    return None


async def _istio_native(api: KubeApi, service: dict) -> str:
    where = f"{service.get('namespace')}/{service.get('name')}"
    deployment = await api.get_deployment(str(service.get("namespace")), str(service.get("name")))
    if deployment is None:
        return f"unknown (no Deployment {where})"
    containers = deployment.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or []
    for c in containers:
        for env in c.get("env") or []:
            if env.get("name") == _ISTIO_NATIVE_ENV:
                value = str(env.get("value") or "")
                return f"{'yes' if value == 'true' else 'no'} ({_ISTIO_NATIVE_ENV}={value} on Deployment {where})"
    image = next((str(c.get("image")) for c in containers), "")
    return f"Istio's default ({_ISTIO_NATIVE_ENV} unset on Deployment {where}, image {image}; on from Istio 1.27)"


async def _linkerd_native(api: KubeApi, service: dict) -> str:
    ns = str(service.get("namespace"))
    cm = await api.get_configmap(ns, _LINKERD_CONFIG)
    if cm is None:
        return f"unknown (no ConfigMap {ns}/{_LINKERD_CONFIG})"
    try:
        values = yaml.safe_load((cm.get("data") or {}).get("values") or "") or {}
    except yaml.YAMLError:
        values = {}
    values = values if isinstance(values, dict) else {}
    proxy = values.get("proxy")
    native = proxy.get("nativeSidecar") if isinstance(proxy, dict) else None
    if native is None:  # as Istio's unset switch: the release decides
        version = values.get("linkerdVersion")
        return (f"Linkerd's default (proxy.nativeSidecar unset in {ns}/{_LINKERD_CONFIG}"
                f"{f', linkerdVersion {version}' if version else ''}; on from Linkerd 2.20)")
    return f"{'yes' if native is True else 'no'} (proxy.nativeSidecar: {str(native).lower()} in {ns}/{_LINKERD_CONFIG})"


async def find_injectors(api: KubeApi, configs: list[dict]) -> list[_Injector]:
    out = []
    for config in configs:
        mesh = _mesh_of(config)
        if mesh is None:
            continue
        service = next(((wh.get("clientConfig") or {}).get("service") for wh in config.get("webhooks") or []
                        if (wh.get("clientConfig") or {}).get("service")), None)
        try:
            native = "unknown (the injector is not a Service)" if service is None else \
                await (_istio_native if mesh == ISTIO else _linkerd_native)(api, service)
        except KubeError as e:
            native = f"unknown ({e.status or ''} {e.message})".replace("( ", "(")
        out.append(_Injector(mesh, config, native))
    return out


# --- the checks -----------------------------------------------------------------------------------
async def _check_api(api: KubeApi, report: Report) -> bool:
    try:
        version = await api.get_version()
    except KubeError as e:
        if e.status == 401:  # reached, and it refused the credentials: in status's and logs' words
            report(Line("kubernetes-api", False, "the Kubernetes API accepts your credentials", str(unreached(e))))
        else:  # one advice: the error's own where it has one (an untrusted certificate: the cluster CA)
            advice = "" if ": check " in e.message else "; check the kubeconfig, the context and the network"
            report(Line("kubernetes-api", False, "can reach the Kubernetes API", e.message + advice))
        return False
    report(Line("kubernetes-api", True, f"can reach the Kubernetes API ({version.get('gitVersion', '?')})",
                data={"version": version.get("gitVersion")}))
    return True


async def _check_namespace(api: KubeApi, target: Target, report: Report) -> bool:
    """initshift's namespace (-n) exists. Where it does not (a typo, an install elsewhere) every
    line after would be a ✘ about that namespace, one of them advice to change the webhook's
    selector: the check ends here, as `linkerd check` does, naming where the configuration
    sends pods."""
    try:
        if await api.get_namespace(target.namespace) is not None:
            return True
    except KubeError:
        return True  # unreadable (403): the checks after it say what they can
    hint = f"-n names the namespace initshift is installed in (default {Target.defaults().namespace})"
    try:
        config = await api.get_webhook_config(target.webhook_config)
    except KubeError:
        config = None
    service = ((pod_webhook(config) or {}).get("clientConfig") or {}).get("service") if config else None
    if service and service.get("namespace"):
        hint += (f"; MutatingWebhookConfiguration {target.webhook_config} sends pods to Service "
                 f"{service['namespace']}/{service.get('name')}: -n {service['namespace']}")
    report(Line("kubernetes-api", False, f"initshift's namespace {target.namespace} exists", hint))
    return False


def _configuration_lines(config: dict, wh: dict, target: Target, budget: float) -> list[Line]:
    """What the configuration must hold, as deploy/ ships it."""
    s = "webhook-configuration"
    out = []
    side = wh.get("sideEffects")
    out.append(Line(s, side == "None", f"sideEffects: {side}",
                    "" if side == "None" else "initshift has no side effects: set sideEffects: None (dry-run "
                                              "requests are refused by the apiserver otherwise)"))
    again = wh.get("reinvocationPolicy", "Never")
    out.append(Line(s, again == "IfNeeded", f"reinvocationPolicy: {again}",
                    "" if again == "IfNeeded" else "set reinvocationPolicy: IfNeeded, so initshift sees the pod "
                                                   "again after the mesh injected its proxy"))
    # Either is a choice (docs/install.md): the line says what it means while no replica answers.
    policy = failure_policy_of(wh)
    out.append(Line(s, True, f"failurePolicy: {policy} (while no replica answers, {unanswered(policy)})",
                    data={"failurePolicy": policy}))
    timeout = wh.get("timeoutSeconds", 10)
    fits = isinstance(timeout, int) and budget < timeout <= _API_TIMEOUT_MAX_SECONDS
    out.append(Line(s, fits, f"timeoutSeconds: {timeout} (above the {budget:g}s registry lookup budget)",
                    "" if fits else f"set timeoutSeconds between {int(budget) + 1} and {_API_TIMEOUT_MAX_SECONDS}"))
    excluded = [n for n in (target.namespace, *_ALWAYS_EXCLUDED)
                if not calls_for(wh, {"metadata": {"labels": {_NAME_LABEL: n, p.LABEL_NAMESPACE_ENABLED: "true"}}})]
    missing = [n for n in (target.namespace, *_ALWAYS_EXCLUDED) if n not in excluded]
    out.append(Line(s, not missing, f"namespaceSelector never selects {' or '.join((target.namespace, *_ALWAYS_EXCLUDED))}",
                    "" if not missing else f"the selector would send pods of {', '.join(missing)} to initshift: add "
                                           f"{_NAME_LABEL} NotIn [{', '.join((target.namespace, *_ALWAYS_EXCLUDED))}]"))
    return out


def _address(wh: dict, target: Target) -> tuple[str, int, str] | str:
    """(host, port, name the certificate must carry), or why there is none."""
    cc = wh.get("clientConfig") or {}
    if cc.get("url"):
        url = urlsplit(cc["url"])
        name = url.hostname or ""
        where = urlsplit(target.service_url) if target.service_url else url
        return where.hostname or name, where.port or 443, name
    svc = cc.get("service") or {}
    if not svc.get("name"):
        return "the configuration has neither clientConfig.url nor clientConfig.service"
    name = f"{svc['name']}.{svc.get('namespace', 'default')}.svc"
    if target.service_url:
        url = urlsplit(target.service_url)
        return url.hostname or "", url.port or 443, name
    return name, int(svc.get("port") or 443), name


def _days(delta: dt.timedelta) -> str:
    days = delta.total_seconds() / 86400
    return f"{days:.0f} days" if abs(days) >= 2 else f"{delta.total_seconds() / 3600:.0f} hours"


def _server_lines(served: Served, now: dt.datetime) -> list[Line]:
    s = "webhook-server"
    if served.error:
        return [Line(s, False, f"initshift answers on {served.address} ({served.server_name})",
                     f"{served.error}. Is the Deployment running (its lines below)?")]
    out = [Line(s, True, f"initshift answers on {served.address} ({served.server_name})")]
    out.append(Line(s, not served.verify_error, "the caBundle verifies the certificate the server presents",
                    f"{served.verify_error}: the apiserver cannot call the webhook (failurePolicy decides what "
                    f"happens to pods). Self-managed: restart the Deployment to re-inject the caBundle; "
                    f"cert-manager: check its cainjector" if served.verify_error else ""))
    cert = served.certificate
    if cert is not None:
        left = cert.not_valid_after_utc - now
        if left.total_seconds() <= 0:
            out.append(Line(s, False, f"serving certificate expired {cert.not_valid_after_utc:%Y-%m-%d %H:%M}Z "
                                      f"({_days(-left)} ago)",
                            "renewal is not happening: self-managed, the server renews at start-up and "
                            "before expiry (restart it and read its log); cert-manager, check the Certificate",
                            {"notAfter": cert.not_valid_after_utc.isoformat()}))
        else:
            out.append(Line(s, True, f"serving certificate valid until {cert.not_valid_after_utc:%Y-%m-%d}, "
                                     f"{_days(left)} left", data={"notAfter": cert.not_valid_after_utc.isoformat()}))
    ready = served.ready or {}
    if served.ready_status == 200:
        native = {True: "supported", False: "not supported", None: "unknown"}.get(ready.get("native_supported"),
                                                                                   "unknown")
        out.append(Line(s, True, f"/readyz: ready, strategy {ready.get('strategy') or 'unknown'}, native sidecars "
                                 f"{native}", data={"readyz": ready}))
    else:
        why = served.ready_error or f"{served.ready_status} {ready.get('status', '')}".strip()
        out.append(Line(s, False, f"/readyz: {why}", "the server is not ready: read its log "
                                                     "(kubectl -n NAMESPACE logs deploy/initshift)",
                        {"readyz": ready}))
    return out


async def _overdue_lease_pods(api: KubeApi, target: Target, lease: dict | None,
                              now: dt.datetime) -> list[dict] | None:
    """The pods of initshift's namespace where the Lease is held and overdue (None otherwise,
    or where they cannot be read: the line then says what it said without them)."""
    spec = (lease or {}).get("spec") or {}
    renewed = parse_time(spec.get("renewTime"))
    if not spec.get("holderIdentity") or renewed is None or \
            (now - renewed).total_seconds() <= float(spec.get("leaseDurationSeconds") or 0):
        return None
    try:
        return (await api.list_pods(target.namespace))[0]
    except KubeError:
        return None


def _lease_line(lease: dict | None, target: Target, now: dt.datetime,
                pods: list[dict] | None = None) -> Line:
    """`pods`: those of initshift's namespace, read when the Lease is overdue (None: unread)."""
    s, where = "watcher", f"{target.namespace}/{target.lease}"
    if lease is None:
        return Line(s, False, f"watcher Lease {where} exists",
                    "no watcher ever ran: start it with `initshift serve --watch` (the Deployment does), or "
                    "INITSHIFT_LEADER_ELECTION=false was set and nothing holds a Lease")
    spec = lease.get("spec") or {}
    holder, renewed = spec.get("holderIdentity") or "", parse_time(spec.get("renewTime"))
    duration = float(spec.get("leaseDurationSeconds") or 0)
    if not holder:
        return Line(s, False, f"watcher Lease {where} is held", "released and not taken again: no watcher is running")
    if renewed is None:
        return Line(s, False, f"watcher Lease {where} held by {holder} was renewed", "it has no renewTime")
    age = (now - renewed).total_seconds()
    if age > duration:
        title = f"watcher Lease {where} held by {holder}, last renewed {age:.0f}s ago (duration {duration:g}s)"
        data = {"holder": holder, "renewedSecondsAgo": round(age, 1)}
        # The identity is the holder's hostname (its pod's name) and a suffix of its own.
        holder_pod = holder.rsplit("-", 1)[0]
        live = sorted(x["metadata"]["name"] for x in pods or () if ready_condition(x)
                      and not x["metadata"].get("deletionTimestamp") and x["metadata"]["name"] != holder_pod)
        gone = pods is not None and not any(x["metadata"]["name"] == holder_pod for x in pods)
        if gone and live:
            return Line(s, False, title,
                        f"its holder's pod {holder_pod} is gone (killed, evicted, or a previous install's, whose "
                        f"Lease was left): a handover, not a stuck watcher. Ready replica(s) {', '.join(live)} "
                        f"take the Lease once they have seen it unchanged for {duration:g}s, and meanwhile act on "
                        f"every write overdue by a few seconds; run check again in {duration:g}s, and read their "
                        f"log if it still says so (kubectl -n {target.namespace} logs deploy/initshift)", data)
        return Line(s, False, title,
                    "not renewed within its duration: the watcher is stuck or gone; pods wait for "
                    f"{p.ANNOTATION_READY} (kubectl -n {target.namespace} logs deploy/initshift)", data)
    return Line(s, True, f"watcher Lease {where} held by {holder}, renewed {max(age, 0):.0f}s ago",
                data={"holder": holder, "renewedSecondsAgo": round(max(age, 0), 1)})


async def _rbac_lines(api: KubeApi, target: Target, needed: set[str]) -> list[Line]:
    s = "rbac"
    user = f"system:serviceaccount:{target.namespace}:{target.service_account}"
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{target.namespace}", "system:authenticated"]
    settings = Settings()
    settings = settings.replace(server=dataclasses.replace(settings.server, namespace=target.namespace,
                                                webhook_config=target.webhook_config),
                                watcher=dataclasses.replace(settings.watcher, lease_name=target.lease))
    answers: list[tuple[Access, bool]] = []
    for access in server_access(settings):
        allowed, _ = await api.review_access(user, groups, access.attributes())
        answers.append((access, allowed))
    denied = [a for a, ok in answers if not ok and a.needed in needed]
    required = [a for a, _ in answers if a.needed in needed]
    who = f"service account {target.namespace}/{target.service_account}"
    out = [Line(s, not denied, f"{who} may make the {len(required)} calls the server makes"
                + (f" (with {SELF_MANAGED_CERTS})" if SELF_MANAGED_CERTS in needed else ""),
                "" if not denied else "forbidden: " + "; ".join(f"{a.text()} ({a.why})" for a in denied)
                + ". Re-apply deploy/ (or the chart) so its Roles and bindings are back",
                {"denied": [a.attributes() for a in denied]})]
    for optional in (NODE_VERSIONS, PULL_SECRETS):
        entries = [(a, ok) for a, ok in answers if a.needed == optional]
        granted = all(ok for _, ok in entries)
        what = ", ".join(a.text() for a, _ in entries)
        if optional == NODE_VERSIONS:
            out.append(_node_versions_line(what, granted))
            continue
        out.append(Line(s, True, f"{optional}: {what} {'granted' if granted else 'not granted'}",
                        data={"optional": optional, "granted": granted}))
    return out


# Granted by default (deploy/base, Helm rbac.nodeVersions=true); an install may leave it out.
_NODE_VERSIONS_TITLE = "native-sidecar detection by kubelet versions"
_NODE_VERSIONS_RISK = (
    "warning: native-sidecar detection goes by the apiserver's version alone. A kubelet older than v1.29 "
    "under a v1.29+ apiserver (the skew an upgrade allows) runs a hybrid or native pod's proxy, a native "
    "sidecar, as an ordinary init container that never exits: the pod hangs in Init. Grant it (deploy/ "
    "without components/without-node-versions, Helm rbac.nodeVersions=true), or set INITSHIFT_NATIVE_SIDECARS=false "
    "(Helm nativeSidecars) while any kubelet is older than v1.29")


def _node_versions_line(what: str, granted: bool) -> Line:
    """`list nodes`: a warning when not granted, never a failure (an install may refuse it)."""
    data = {"optional": NODE_VERSIONS, "granted": granted, "warning": not granted}
    if granted:
        return Line("rbac", True, f"{_NODE_VERSIONS_TITLE}: {what} granted", data=data)
    return Line("rbac", True, f"{_NODE_VERSIONS_TITLE}: {what} not granted (warning)", _NODE_VERSIONS_RISK, data)


POD_PATCH_SUFFIX = "-pod-patch"  # deploy/components/pod-patch-policy's initshift-pod-patch, Helm's FULLNAME-pod-patch


async def _pod_patch_lines(api: KubeApi, target: Target) -> list[Line]:
    """The opt-in policy narrowing the service account's pod `patch` (docs/install.md): absent
    is fine; present, it must name that account and be bound to deny. A kustomize namespace
    move that does not patch its expression leaves it naming no one, silently."""
    s, user = "rbac", f"system:serviceaccount:{target.namespace}:{target.service_account}"
    try:
        found = await api.list_admission_policies()
    except KubeError as e:
        if e.status != 403:
            raise
        # Optional, and readable only with a grant older viewers' roles lack: a warning.
        return [Line(s, True, "pod-patch policy: cannot be read (warning)",
                     f"warning: {e.message} (your credentials need read access to validatingadmissionpolicies and "
                     f"validatingadmissionpolicybindings)", {"optional": "pod-patch policy", "warning": True})]
    every, bindings = found if found is not None else ([], [])  # None: no such API (before 1.30)
    policies = [v for v in every if v["metadata"]["name"].endswith(POD_PATCH_SUFFIX)]
    if not policies:
        return [Line(s, True, "pod-patch policy: none (the service account may patch any field of any pod; "
                              "opt-in: components/pod-patch-policy, Helm rbac.podPatchPolicy, Kubernetes 1.30+)",
                     data={"optional": "pod-patch policy", "installed": False})]
    out = []
    for policy in policies:
        name = policy["metadata"]["name"]
        expressions = [str(c.get("expression")) for c in (policy.get("spec") or {}).get("matchConditions") or []]
        bound = [b["metadata"]["name"] for b in bindings if (b.get("spec") or {}).get("policyName") == name
                 and "Deny" in ((b.get("spec") or {}).get("validationActions") or [])]
        names_user = any(f"'{user}'" in e for e in expressions)
        why = "" if names_user else (f"its matchConditions name another account ({'; '.join(expressions) or 'none'}), "
                                     f"so it narrows no one: patch the name in (a kustomize namespace move does not)")
        if not bound:
            why = (why + "; " if why else "") + "no ValidatingAdmissionPolicyBinding with validationActions Deny "                                                 "names it, so nothing is denied"
        out.append(Line(s, not why, f"pod-patch policy {name} narrows {user}'s pod patches", why,
                        {"optional": "pod-patch policy", "installed": True, "policy": name, "bindings": bound}))
    return out


def _namespace_lines(namespaces: list[dict], wh: dict | None, injectors: list[_Injector],
                     excluded: tuple[str, ...] = ()) -> list[Line]:
    """`excluded`: the namespaces the selector must never select (initshift's, kube-system),
    whose opt-in label is no one's mistake here."""
    s = "namespaces"
    if wh is None:
        return []
    # What opts a namespace in is the configuration's namespaceSelector: its matchLabels all
    # (Helm merges a value's matchLabels into the default's, so a new label is one more).
    wanted = {str(k): str(v) for k, v in ((wh.get("namespaceSelector") or {}).get("matchLabels") or {}).items()}
    label = "kubectl label namespace NAME " + (" ".join(f"{k}={v}" for k, v in wanted.items())
                                              or f"{p.LABEL_NAMESPACE_ENABLED}=true")
    opted = [ns for ns in namespaces if calls_for(wh, ns)]
    out: list[Line] = []
    # Labelled to opt in, as the docs say, and yet not selected: a selector changed under them.
    stranded = [ns for ns in namespaces if _labels(ns).get(p.LABEL_NAMESPACE_ENABLED) == "true"
                and ns not in opted and ns["metadata"]["name"] not in excluded]
    if stranded:
        def lacks(ns: dict) -> str:
            missing = [f"{k}={v}" for k, v in wanted.items() if _labels(ns).get(k) != v]
            return f"{ns['metadata']['name']} (lacks {', '.join(missing)})" if missing else ns["metadata"]["name"]
        out.append(Line(s, False, f"namespaces labelled {p.LABEL_NAMESPACE_ENABLED}=true that the namespaceSelector "
                                  f"does not select: {', '.join(lacks(ns) for ns in stranded)}",
                        "their pods are created unchanged: the webhook configuration's namespaceSelector "
                        f"{json.dumps(wh.get('namespaceSelector') or {}, sort_keys=True)} asks for more (a Helm "
                        f"value's matchLabels are merged into the default's). Opt them in ({label}) or take "
                        f"the label away ({p.LABEL_NAMESPACE_ENABLED}-)",
                        {"namespaces": [ns["metadata"]["name"] for ns in stranded]}))
    if not opted:
        return [Line(s, True, "no namespace is opted in yet", label), *out]
    def meshes(ns: dict) -> str:
        found = sorted({i.mesh for i in injectors if i.injects_in(ns)})
        return f" ({', '.join(found)} injects)" if found else " (no mesh injects)"
    names = [f"{ns['metadata']['name']}{meshes(ns)}" for ns in opted]
    return [Line(s, True, f"opted-in namespaces: {', '.join(names)}",
                 data={"namespaces": [ns["metadata"]["name"] for ns in opted]}), *out]


def _injector_lines(injectors: list[_Injector], config_name: str | None) -> list[Line]:
    s = "mesh"
    if not injectors:
        return [Line(s, True, "no Istio or Linkerd injector found: pods get no proxy, initshift has nothing to fix")]
    out = []
    for i in injectors:
        after = config_name is None or config_name < i.name
        title = f"{i.mesh} injector {i.name}: called after {config_name or 'initshift'}" if after else \
            f"{i.mesh} injector {i.name} is called before {config_name}"
        out.append(Line(s, after, f"{title}; injects natively: {i.native}",
                        "" if after else f"the apiserver calls configurations in name order: initshift must see the "
                                         f"pod first; rename {config_name} so it sorts before {i.name}",
                        {"mesh": i.mesh, "configuration": i.name, "native": i.native}))
    return out


async def preflight(api: KubeApi, target: Target, report: Report) -> None:
    """Every preflight line, in order, through `report`."""
    if not await _check_api(api, report):
        return
    if not await _check_namespace(api, target, report):
        return
    now = dt.datetime.now(dt.timezone.utc)
    s = "webhook-configuration"
    try:
        config = await api.get_webhook_config(target.webhook_config)
    except KubeError as e:
        report(Line(s, False, f"read MutatingWebhookConfiguration {target.webhook_config}", e.message))
        config = None
    configs = await _or_line(api.list_webhook_configs(), report, "mesh", "MutatingWebhookConfigurations") or []
    wh = None
    if config is None:
        report(Line(s, False, f"MutatingWebhookConfiguration {target.webhook_config} exists",
                    "no configuration: pods are never sent to initshift. Install it: kubectl apply -k deploy/ "
                    "(or the Helm chart)"))
    else:
        wh = pod_webhook(config)
        report(Line(s, wh is not None, f"MutatingWebhookConfiguration {target.webhook_config} exists"
                    + (f" (webhook {wh.get('name')})" if wh else ""),
                    "" if wh else "it has no webhook for CREATE pods: re-apply deploy/"))
    if wh is not None:
        for line in _configuration_lines(config or {}, wh, target, Settings().registry.budget_seconds):
            report(line)
        await _server(api, wh, target, now, report)
    try:
        lease = await api.get_lease(target.namespace, target.lease)
        report(_lease_line(lease, target, now, await _overdue_lease_pods(api, target, lease, now)))
    except KubeError as e:
        report(Line("watcher", False, f"read the watcher Lease {target.namespace}/{target.lease}", e.message))
    needed = {ALWAYS} | ({SELF_MANAGED_CERTS} if config is not None and
                         _CERT_MANAGER_INJECT not in _annotations(config) else set())
    try:
        for line in await _rbac_lines(api, target, needed):
            report(line)
    except KubeError as e:
        report(Line("rbac", False, "ask the API what initshift's service account may do (SubjectAccessReview)",
                    f"{e.message}: you need create on subjectaccessreviews.authorization.k8s.io"))
    for line in await _or_line(_pod_patch_lines(api, target), report, "rbac",
                               "ValidatingAdmissionPolicies (the pod-patch policy)") or []:
        report(line)
    injectors = await find_injectors(api, configs)
    namespaces = await _or_line(api.list_namespaces(), report, "namespaces", "namespaces") or []
    opted = [ns["metadata"]["name"] for ns in namespaces if wh is not None and calls_for(wh, ns)]
    by_service = wh is not None and bool((wh.get("clientConfig") or {}).get("service"))
    policy = failure_policy_of(wh) if wh is not None else None
    for line in await deployment_lines(api, target, opted, by_service, policy):
        report(line)
    excluded = (target.namespace, *_ALWAYS_EXCLUDED)
    for line in _namespace_lines(namespaces, wh, injectors, excluded) + \
            _injector_lines(injectors, config and target.webhook_config):
        report(line)


async def _server(api: KubeApi, wh: dict, target: Target, now: dt.datetime, report: Report) -> None:
    address = _address(wh, target)
    if isinstance(address, str):
        report(Line("webhook-server", False, "the configuration says where initshift is", address))
        return
    svc = (wh.get("clientConfig") or {}).get("service")
    found = None
    if svc:
        where = f"{svc.get('namespace')}/{svc.get('name')}"
        try:
            found = await api.get_service(str(svc.get("namespace")), str(svc.get("name")))
        except KubeError as e:
            why = e.message
        else:
            why = "it does not exist: re-apply deploy/"
        report(Line("webhook-server", found is not None, f"Service {where} exists", "" if found else why))
    raw = (wh.get("clientConfig") or {}).get("caBundle") or ""
    try:
        ca_pem = base64.b64decode(raw)
    except ValueError:
        ca_pem = b""
    host, port, name = address
    if not svc or target.service_url or in_cluster():
        served = await probe(f"{host}:{port}", direct(host, port), name, ca_pem)
    elif found is None:
        return  # no Service, nothing behind it: its line said so
    else:
        pod = await service_pod(api, found, port)
        if isinstance(pod, str):
            report(Line("webhook-server", False, f"initshift answers on {name}:{port} (through a port-forward)", pod))
            return
        async with PortForward(api, str(svc.get("namespace")), *pod) as forward:
            served = await probe(f"pod/{pod[0]}:{pod[1]} through a port-forward", forwarded(forward), name, ca_pem)
        if served.error and forward.errors:  # the kubelet's own words: nothing listens, the pod is gone
            served = dataclasses.replace(served, error=forward.errors[-1])
    for line in _server_lines(served, now):
        report(line)


async def _or_line(call: Awaitable[Any], report: Report, section: str, what: str) -> Any:
    """The call's answer, or None after a ✘ line saying why it failed."""
    try:
        return await call
    except KubeError as e:
        report(Line(section, False, f"list {what}", f"{e.message} (your credentials need read access)"))
        return None
