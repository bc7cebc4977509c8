"""The rendered RBAC against the API calls the code really makes.

Every request goes through `webhook.kube.KubeApi._open`; a recording subclass turns each
call into the RBAC attributes the apiserver would authorise (verb, group, resource,
namespace, name) and checks them against the grants each install renders. The certificate
code is driven through its real functions; the watcher's calls through KubeApi's methods
with the namespace and Lease name the watcher uses."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.support.deploy_render import REPO, Rendered, helm, kustomize
from tests.deploy.test_deploy import COMPONENTS, grants
from webhook.kube._api import KubeApi, KubeError
from webhook.settings import Settings

Attrs = tuple[str, str, str, str, str]  # verb, group, resource, namespace ("" = cluster), name ("" = none)
Responder = Callable[[str, str, dict], tuple[int, Any]]

# KubeApi methods the running server never calls (test and debugging helpers); RBAC need not cover them.
# `initshift check`, `status` and `logs` run with the user's credentials: their calls are listed here too.
NOT_USED_BY_THE_SERVER = {"pod_log", "create_pod", "delete_pod", "get_webhook_config", "list_webhook_configs",
                          "list_namespaces", "get_service", "get_deployment", "get_configmap", "review_access", "get_version",
                          "get_job", "get_cronjob", "list_jobs", "list_services", "list_admission_policies",
                          "get_namespace", "list_pod_disruption_budgets"}


class _Resp:
    def __init__(self, status: int, payload: Any) -> None:
        self.status = status
        self._data = b"" if payload is None else json.dumps(payload).encode()
        self.content = self

    async def read(self) -> bytes:
        return self._data

    async def readline(self) -> bytes:
        return b""  # an empty watch/log stream

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


class Recorder(KubeApi):
    """A KubeApi whose requests are recorded and answered by `responder`."""

    def __init__(self, responder: Responder) -> None:
        super().__init__(None)  # type: ignore[arg-type]
        self.responder = responder
        self.calls: list[Attrs] = []

    async def _open(self, method: str, path: str, *, query: dict | None = None, **_: Any) -> _Resp:  # type: ignore[override]
        self.calls.append(request_attrs(method, path, query or {}))
        status, payload = self.responder(method, path, query or {})
        if not 200 <= status <= 299:
            # As the apiserver's Status says it: only its own NotFound means the object is absent.
            raise KubeError(status, f"{method} {path}", "NotFound" if status == 404 else "")
        return _Resp(status, payload)


_PATH = re.compile(r"^/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)(?:/namespaces/(?P<ns>[^/]+))?/(?P<res>[^/]+)"
                   r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$")


# Non-resource URLs every authenticated client may GET (ClusterRole system:public-info-viewer).
PUBLIC_INFO = {"/version", "/healthz", "/livez", "/readyz"}


def request_attrs(method: str, path: str, query: dict) -> Attrs:
    """What the apiserver's RequestInfo resolver makes of a resource request."""
    if path in PUBLIC_INFO:
        return method.lower(), "", path, "", ""
    m = _PATH.match(path)
    assert m, f"not a resource path: {path}"
    resource = m["res"] + (f"/{m['sub']}" if m["sub"] else "")
    if method == "GET":
        verb = "get" if m["name"] else ("watch" if query.get("watch") in ("true", "1") else "list")
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]
    return verb, m["group"] or "", resource, m["ns"] or "", m["name"] or ""


def allowed(g: set[tuple], attrs: Attrs) -> bool:
    verb, group, resource, ns, name = attrs
    if resource in PUBLIC_INFO:
        return verb == "get"
    return any(scope in ("*", ns) and grp == group and res == resource and v == verb and rn in ("*", name)
               for scope, grp, res, v, rn in g)


# --- what the code calls -----------------------------------------------------------------

async def watcher_calls(settings: Settings) -> list[Attrs]:
    rec = Recorder(lambda m, path, q: (404, None) if m == "GET" and "/leases/" in path
                   else (200, {"items": [], "metadata": {"resourceVersion": "1"}}))
    ns, lease = settings.server.namespace, settings.watcher.lease_name
    await rec.list_pods(None, label_selector="initshift.io/managed=waiter")
    async for _ in rec.watch_pods(None, label_selector="initshift.io/managed=waiter", resource_version="1"):
        pass
    await rec.get_pod("builds", "p")
    await rec.patch_pod("builds", "p", {"metadata": {"annotations": {}}})
    await rec.create_event("builds", {"metadata": {"generateName": "p."}})
    async for _ in rec.list_pages("events", None, field_selector="source=initshift-watcher"):
        pass
    async for _ in rec.watch("events", None, field_selector="source=initshift-watcher", resource_version="1"):
        pass
    assert await rec.get_lease(ns, lease) is None
    await rec.create_lease(ns, {"metadata": {"name": lease}})
    await rec.replace_lease(ns, lease, {"metadata": {"name": lease}})
    return rec.calls


async def limitrange_calls() -> list[Attrs]:
    """The admission server's views of LimitRanges, ResourceQuotas and Namespaces: each
    one's list and watch, then a live list."""
    import asyncio

    from webhook.kube import LimitRanges, Namespaces, ResourceQuotas

    calls: list[Attrs] = []
    for kind in (LimitRanges, ResourceQuotas, Namespaces):
        rec = Recorder(lambda m, path, q: (200, {"items": [], "metadata": {"resourceVersion": "1"}}))
        view, stop = kind(rec), asyncio.Event()
        task = asyncio.create_task(view.run(stop))
        for _ in range(500):
            if any(c[0] == "watch" for c in rec.calls):
                break
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, 10)
        assert view.synced and await view.lookup("builds") == []
        calls += rec.calls
    return calls


WATCHER_METHODS = {"list_pods", "watch_pods", "get_pod", "patch_pod", "create_event", "get_lease", "create_lease",
                   "replace_lease", "list_pages", "watch"}
CERTIFICATE_METHODS = {"get_secret"}  # certificate_calls makes them
PULL_SECRET_METHODS = {"get_service_account"}  # pull_secret_calls makes it (and get_secret)


async def certificate_calls(settings: Settings, tls_dir: Path) -> list[Attrs]:
    """webhook.admission._certs.ensure on a fresh install, then a Secret write that meets an existing one.
    The serving pair goes to `tls_dir`, not to the install's path on this machine."""
    import dataclasses

    from webhook.kube import _certs as certs_kube
    from webhook.admission import _certs as manage

    settings = settings.replace(server=dataclasses.replace(
        settings.server, tls_cert=str(tls_dir / "tls.crt"), tls_key=str(tls_dir / "tls.key")))

    state: dict[str, Any] = {"mwc": {"metadata": {"name": settings.server.webhook_config, "resourceVersion": "1"},
                                     "webhooks": [{"name": "pods.initshift.io", "clientConfig": {}}]}}

    def responder(method: str, path: str, query: dict) -> tuple[int, Any]:
        if "/secrets" in path:
            if method == "GET":
                return (200, state["secret"]) if "secret" in state else (404, None)
            if method == "POST":
                if "secret" in state:
                    return 409, None
                state["secret"] = {"data": {}}
            return 200, state.get("secret")
        if method == "PUT":
            state["mwc"] = {**state["mwc"], "webhooks": json.loads(json.dumps(state["mwc"]["webhooks"]))}
        return 200, state["mwc"]

    rec = Recorder(responder)
    await manage.ensure_certificates(settings, rec)
    assert (tls_dir / "tls.crt").is_file()
    await certs_kube.write_secret(rec, settings.server.namespace, settings.server.cert_secret, {"tls.crt": ""})
    return rec.calls


async def pull_secret_calls() -> list[Attrs]:
    from webhook.registry._pullsecrets import KubeSecretsSource

    rec = Recorder(lambda m, path, q: (200, {}))
    source = KubeSecretsSource(rec)
    await source.get_secret("builds", "regcred")
    await source.get_service_account("builds", "default")
    return rec.calls


# --- the checks --------------------------------------------------------------------------

INSTALLS = {
    "kustomize-default": (lambda: kustomize("."), True, False),
    "kustomize-cert-manager": (lambda: kustomize("overlays/cert-manager"), False, False),
    "kustomize-self-managed+components": (lambda: kustomize("overlays/self-managed", COMPONENTS), True, True),
    "helm-default": (lambda: helm(), True, False),
    "helm-cert-manager+pull-secrets": (lambda: helm({"certificates": {"mode": "cert-manager"},
                                                     "registry": {"pullSecrets": True}}, namespace="platform"),
                                       False, True),
}


@pytest.mark.parametrize("name", list(INSTALLS))
async def test_rbac_allows_every_call_the_code_makes(name, tmp_path):
    render, self_managed, pull_secrets = INSTALLS[name]
    r = Rendered(render())
    settings = Settings.from_env({**r.plain_env(), "INITSHIFT_NAMESPACE": r.namespace})
    assert settings.server.self_managed_certs is self_managed
    g = grants(r)
    calls = await watcher_calls(settings) + await limitrange_calls()
    if self_managed:
        calls += await certificate_calls(settings, tmp_path)
    if pull_secrets:
        calls += await pull_secret_calls()
    denied = [c for c in calls if not allowed(g, c)]
    assert denied == [], f"{name}: the code would be forbidden: {denied}"


async def node_calls() -> list[Attrs]:
    from webhook.kube import read_versions

    rec = Recorder(lambda m, path, q: (200, {"major": "1", "minor": "30", "gitVersion": "v1.30.2"})
                   if path == "/version" else (200, {"items": [], "metadata": {}}))
    await read_versions(rec)
    return [c for c in rec.calls if c[2] not in PUBLIC_INFO]


async def test_server_access_is_exactly_what_the_code_calls(tmp_path):
    """`webhook.kube.server_access` (what `initshift check` asks a SubjectAccessReview for)
    describes every call the server makes, and nothing it does not make."""
    from webhook.kube import ALWAYS, NODE_VERSIONS, PULL_SECRETS, SELF_MANAGED_CERTS, server_access

    settings = Settings()
    calls = {ALWAYS: await watcher_calls(settings) + await limitrange_calls(), SELF_MANAGED_CERTS: await certificate_calls(settings, tmp_path),
             NODE_VERSIONS: await node_calls(), PULL_SECRETS: await pull_secret_calls()}
    listed = server_access(settings)
    for needed, made in calls.items():
        entries = [a for a in listed if a.needed == needed]
        uncovered = [c for c in made if not any(a.covers(*c) for a in entries)]
        assert uncovered == [], f"{needed}: calls missing from server_access: {uncovered}"
        unused = [a.text() for a in entries if not any(a.covers(*c) for c in made)]
        assert unused == [], f"{needed}: server_access lists calls the code does not make: {unused}"
    assert {a.needed for a in listed} == set(calls)


@pytest.mark.parametrize("name", list(INSTALLS))
def test_every_install_grants_what_server_access_lists(name):
    from webhook.kube import ALWAYS, NODE_VERSIONS, PULL_SECRETS, SELF_MANAGED_CERTS, server_access

    render, self_managed, pull_secrets = INSTALLS[name]
    r = Rendered(render())
    settings = Settings.from_env({**r.plain_env(), "INITSHIFT_NAMESPACE": r.namespace})
    wanted = {ALWAYS, *([SELF_MANAGED_CERTS] if self_managed else []), *([PULL_SECRETS] if pull_secrets else [])}
    g = grants(r)
    for a in server_access(settings):
        attrs = (a.verb, a.group, a.resource, a.namespace, a.name)
        if a.needed in wanted:
            assert allowed(g, attrs), f"{name}: {a.text()} is not granted"
        elif a.needed == NODE_VERSIONS:  # granted unless components/without-node-versions leaves it out
            assert allowed(g, attrs) == (not name.endswith("+components")), a.text()


async def test_certificate_code_needs_rights_cert_manager_installs_do_not_grant(tmp_path):
    """The check can fail: cert-manager installs do not let the server write certificates."""
    r = Rendered(kustomize("overlays/cert-manager"))
    settings = Settings.from_env({**r.plain_env(), "INITSHIFT_NAMESPACE": r.namespace})
    calls = await certificate_calls(settings, tmp_path)
    g = grants(r)
    denied = {(c[0], c[2]) for c in calls if not allowed(g, c)}
    assert {("get", "secrets"), ("create", "secrets"), ("patch", "secrets"),
            ("get", "mutatingwebhookconfigurations"), ("update", "mutatingwebhookconfigurations")} <= denied


def test_request_attrs_like_the_apiserver():
    assert request_attrs("GET", "/api/v1/pods", {"watch": "true"}) == ("watch", "", "pods", "", "")
    assert request_attrs("GET", "/api/v1/pods", {}) == ("list", "", "pods", "", "")
    assert request_attrs("GET", "/api/v1/namespaces/a/pods/b/log", {}) == ("get", "", "pods/log", "a", "b")
    assert request_attrs("PUT", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/w", {}) == \
        ("update", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "w")
    assert request_attrs("POST", "/apis/coordination.k8s.io/v1/namespaces/n/leases", {}) == \
        ("create", "coordination.k8s.io", "leases", "n", "")


def test_every_kube_api_method_is_covered():
    """A new KubeApi call needs its RBAC grant in deploy/ and a line in watcher_calls (or
    NOT_USED_BY_THE_SERVER if only tests call it)."""
    methods = {n for n, f in inspect.getmembers(KubeApi, inspect.isfunction) if not n.startswith("_")
               and (inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f))
               and n not in ("close", "from_config", "request")}
    covered = WATCHER_METHODS | CERTIFICATE_METHODS | PULL_SECRET_METHODS | NOT_USED_BY_THE_SERVER
    assert methods == covered, methods ^ covered
    server = server_modules()
    assert {"webhook.watcher._controller", "webhook.admission._certs", "webhook.admission._app"} <= server
    for name in NOT_USED_BY_THE_SERVER:
        users = [m for m in sorted(server) if re.search(rf"\.{name}\(", _source(m).read_text())]
        assert users == [], f"{name} is now called by {users}: grant it in deploy/ and cover it here"


def _source(module: str) -> Path:
    path = REPO.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def server_modules(start: str = "webhook.cli._serve") -> set[str]:
    """Project modules `initshift serve` can import (function-level imports included);
    other CLI commands run with the user's own credentials, not the Deployment's."""
    import ast

    seen: set[str] = set()
    todo = [start]
    while todo:
        mod = todo.pop()
        if mod in seen or not _source(mod).is_file():
            continue
        seen.add(mod)
        package = mod if _source(mod).name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(_source(mod).read_text())):
            if isinstance(node, ast.Import):
                todo += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                todo.append(base)
                todo += [f"{base}.{a.name}" for a in node.names]
    return {m for m in seen if m.split(".")[0] in ("webhook", "certs", "waiter")}


# Server modules that call KubeApi.request directly, each replayed above.
DIRECT_REQUESTS = {"webhook.kube._api", "webhook.kube._certs", "webhook.kube._versions"}


def test_every_direct_api_request_is_covered():
    """A server module calling `api.request(...)` itself needs its grant in deploy/ and a scenario here."""
    # waiter/ is stdlib-only and speaks HTTP to loopback only (the server imports its flag grammar).
    users = {m for m in server_modules() if not m.startswith("waiter.")
             and re.search(r"\.(request|_open)\(", _source(m).read_text())}
    assert users - DIRECT_REQUESTS == set(), users - DIRECT_REQUESTS
    assert {"webhook.kube._api", "webhook.kube._certs"} <= users


@pytest.mark.parametrize("without", [False, True])
async def test_native_detection_reads_nodes_unless_the_component_leaves_it_out(without):
    """The default install lets detection read the kubelets' versions; without the grant the
    apiserver answers 403, and detection must cope."""
    from webhook.kube import read_versions

    r = Rendered(kustomize("overlays/self-managed", COMPONENTS[:1] if without else ()))
    g = grants(r)

    def responder(method: str, path: str, query: dict) -> tuple[int, Any]:
        if not allowed(g, request_attrs(method, path, query)):
            return 403, None
        if path == "/version":
            return 200, {"major": "1", "minor": "30", "gitVersion": "v1.30.2"}
        return 200, {"items": [{"status": {"nodeInfo": {"kubeletVersion": "v1.30.1"}}}], "metadata": {}}

    rec = Recorder(responder)
    obs = await read_versions(rec)
    assert obs.apiserver is not None
    if not without:
        assert obs.kubelets and obs.nodes_error is None
    else:
        assert obs.kubelets is None and "forbidden" in (obs.nodes_error or "")
