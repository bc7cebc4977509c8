"""initshift installed as a user installs it, then run on this machine under its own
ServiceAccount.

1. Render the Helm chart or the kustomize default (`deploy/`) with the project's renderers
   (tests/support/deploy_render.py: Helm's Go SDK, kubectl's kustomize) and apply the
   objects with server-side apply (`kubectl apply --server-side`).
2. Two changes, because the server runs on this machine (the e2e's pods cannot reach its
   apiserver; `_serverpod.py` runs the Pod for one scenario): the Deployment is applied with
   `replicas: 0`, and the webhook configuration calls `https://HOST:PORT/mutate` on this
   machine (`clientConfig.url`) instead of the Service.
3. A token of the chart's ServiceAccount (`kubectl create token`) in a kubeconfig; with it,
   `initshift certs create --secret` and `initshift certs inject` make the serving
   certificate (with this machine's IP, which self-managed certificates never carry) and
   its caBundle, then `initshift serve` (the Deployment's environment, self-managed
   certificates off) and `initshift watch` run as that identity, as the Pods would.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import os
import ssl
import sys
import tempfile
import http.client
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import yaml

from tests.support import deploy_render
from tests.support.k8s import Process, free_port, wait_for

from ._kube import Kube, kubectl, parse_time, token_kubeconfig

NAMESPACE = deploy_render.NAMESPACE
SERVICE_ACCOUNT = "initshift"
USER = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
START_TIMEOUT = 120.0

# (verb, what, namespace or "", expected): what the ServiceAccount may do, and some of what
# it must not. `kubectl auth can-i VERB WHAT ... --as USER` answers each (WHAT: a resource,
# resource/name, or a resource with --subresource).
CAN_I: list[tuple[str, str, str, bool]] = [
    ("watch", "pods", "", True),
    ("list", "pods", "", True),
    ("patch", "pods", "builds", True),
    ("create", "events", "builds", True),
    ("create", "leases", NAMESPACE, True),
    ("update", "leases/initshift-watcher", NAMESPACE, True),
    ("get", "secrets/initshift-tls", NAMESPACE, True),
    ("update", "mutatingwebhookconfigurations/initshift-webhook", "", True),
    ("list", "nodes", "", True),  # kubelet versions, for native-sidecar detection (read only)
    ("create", "pods", "builds", False),
    ("delete", "pods", "builds", False),
    ("update", "pods", "builds", False),
    ("get", "pods --subresource=log", "builds", False),
    ("create", "pods --subresource=exec", "builds", False),
    ("create", "pods --subresource=eviction", "builds", False),
    ("update", "leases/other", NAMESPACE, False),
    ("create", "leases", "builds", False),
    ("get", "secrets/other", NAMESPACE, False),
    ("list", "secrets", NAMESPACE, False),
    ("get", "secrets", "builds", False),
    ("get", "serviceaccounts", "builds", False),
    ("create", "secrets", "builds", False),
    ("update", "mutatingwebhookconfigurations/istio-sidecar-injector", "", False),
    ("get", "configmaps", "builds", False),
    ("create", "serviceaccounts/token", NAMESPACE, False),
    ("create", "clusterrolebindings", "", False),
    ("impersonate", "serviceaccounts", "", False),
]


# What registry pull secrets (the chart's `registry.pullSecrets`, kustomize's
# components/registry-pull-secrets) grant beyond the rest: get on Secrets and ServiceAccounts
# in every namespace.
PULL_SECRETS_GRANTS = {("get", "secrets/other", NAMESPACE), ("get", "secrets", "builds"),
                       ("get", "serviceaccounts", "builds")}


def render(flavour: str, pull_secrets: bool = False) -> list[dict]:
    """The objects a user applies: `helm template` of the chart, or `kubectl kustomize deploy/`;
    `pull_secrets`: with registry lookups that read imagePullSecrets."""
    if flavour == "helm":
        return deploy_render.helm({"registry": {"pullSecrets": True}} if pull_secrets else None)
    return deploy_render.kustomize(".", ["components/registry-pull-secrets"] if pull_secrets else ())


def for_this_machine(objects: list[dict], url: str) -> list[dict]:
    """The server on this machine: the Deployment at zero replicas; the webhook called at `url`."""
    out = copy.deepcopy(objects)
    for obj in out:
        if obj["kind"] == "Deployment":
            obj["spec"]["replicas"] = 0
        if obj["kind"] == "MutatingWebhookConfiguration":
            for wh in obj["webhooks"]:
                wh["clientConfig"] = {"url": url}
    return out


def server_env(deployment: dict) -> dict[str, str]:
    """The Deployment's environment as its Pod would see it (fieldRefs resolved)."""
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {}
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = str(item["value"])
        elif (item.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
            env[item["name"]] = deployment["metadata"]["namespace"]
    return env


def _initshift(*args: str) -> list[str]:
    return [sys.executable, "-m", "webhook.cli", *args]


@dataclass
class Install:
    admin: Path  # the admin's kubeconfig
    flavour: str  # "helm" or "kustomize"
    image: str  # INITSHIFT_IMAGE: the image initshift-init runs
    host: str = "127.0.0.1"  # where the apiserver reaches this machine
    dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="initshift-e2e-install-")))
    port: int = field(default_factory=free_port)
    server: Process | None = None
    watcher: Process | None = None
    objects: list[dict] = field(default_factory=list)
    sa_kubeconfig: Path = Path()
    env: dict[str, str] = field(default_factory=dict)
    watcher_starts: int = 0
    made_namespace: bool = False
    extra_env: dict[str, str] = field(default_factory=dict)  # for the server and watcher, over the Deployment's
    pull_secrets: bool = False  # installed with registry pull secrets (their RBAC, INITSHIFT_REGISTRY_PULL_SECRETS)

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}/mutate"

    def apply(self) -> None:
        self.objects = for_this_machine(render(self.flavour, self.pull_secrets), self.url)
        if not any(o["kind"] == "Namespace" for o in self.objects):  # the chart makes none (docs/install.md)
            kubectl(self.admin, "create", "namespace", NAMESPACE)
            self.made_namespace = True
            kubectl(self.admin, "label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=restricted")
        manifest = self.dir / "install.yaml"
        manifest.write_text(yaml.safe_dump_all(self.objects, sort_keys=False))
        kubectl(self.admin, "apply", "--server-side", "--field-manager=initshift-e2e", "-f", str(manifest))
        self.sa_kubeconfig = token_kubeconfig(self.admin, NAMESPACE, SERVICE_ACCOUNT,
                                              self.dir / "initshift-sa.kubeconfig", duration="4h")
        deployment = next(o for o in self.objects if o["kind"] == "Deployment")
        tls = self.dir / "tls"
        self._run("certs", "create", "--out", str(tls), "--namespace", NAMESPACE, "--ip", self.host,
                  "--secret", self.env_of(deployment).get("INITSHIFT_CERT_SECRET", "initshift-tls"),
                  "--kubeconfig", str(self.sa_kubeconfig))
        config = next(o for o in self.objects if o["kind"] == "MutatingWebhookConfiguration")
        self._run("certs", "inject", "--ca-file", str(tls / "ca.crt"), "--webhook-config", config["metadata"]["name"],
                  "--kubeconfig", str(self.sa_kubeconfig))
        self.env = {**self.env_of(deployment),
                    "INITSHIFT_SELF_MANAGED_CERTS": "false",
                    "INITSHIFT_TLS_CERT": str(tls / "tls.crt"), "INITSHIFT_TLS_KEY": str(tls / "tls.key"),
                    "INITSHIFT_IMAGE": self.image, "INITSHIFT_IMAGE_PULL_POLICY": "IfNotPresent",
                    "INITSHIFT_METRICS_HOST": "127.0.0.1", "INITSHIFT_METRICS_PORT": str(free_port()),
                    **self.extra_env}
        self.ca_file = tls / "ca.crt"

    @staticmethod
    def env_of(deployment: dict) -> dict[str, str]:
        return server_env(deployment)

    def _run(self, *args: str) -> None:
        import subprocess

        proc = subprocess.run(_initshift(*args), capture_output=True, text=True, timeout=120,
                              env=self._process_env({}))
        if proc.returncode:
            raise AssertionError(f"initshift {' '.join(args[:2])} failed ({proc.returncode}): "
                                 f"{proc.stderr.strip() or proc.stdout.strip()}")

    def _process_env(self, extra: dict[str, str]) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("INITSHIFT_", "KUBECONFIG"))}
        return {**base, **self.env, **extra}

    def start_server(self) -> None:
        self.server = Process("initshift serve", _initshift("serve", "--host", "0.0.0.0" if self.host != "127.0.0.1"
                                                           else "127.0.0.1", "--port", str(self.port),
                                                           "--kubeconfig", str(self.sa_kubeconfig)),
                              self.dir / "serve.log", env=self._process_env({}))
        wait_for(lambda: self.readyz()[0] == 200, START_TIMEOUT, "initshift serve /readyz", watch=[self.server],
                 interval=0.2)

    def readyz(self) -> tuple[int, dict]:
        """The server's `GET /readyz`: its status and its JSON (the strategy in force among it)."""
        conn = http.client.HTTPSConnection(self.host, self.port, timeout=5,
                                           context=ssl.create_default_context(cafile=str(self.ca_file)))
        try:
            conn.request("GET", "/readyz")
            answer = conn.getresponse()
            return answer.status, json.loads(answer.read() or b"{}")
        finally:
            conn.close()

    @contextlib.contextmanager
    def serving_with(self, **env: str) -> Iterator[None]:
        """The server restarted with `env` over its own, then as it was: for a phase-2
        scenario only (every other pod's admission would see the restart)."""
        saved = self.env
        self.env = {**saved, **env}
        try:
            self._restart_server()
            yield
        finally:
            self.env = saved
            self._restart_server()

    def _restart_server(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.start_server()

    def start_watcher(self) -> None:
        self.watcher_starts += 1
        self.watcher = Process("initshift watch", _initshift("watch", "--kubeconfig", str(self.sa_kubeconfig)),
                               self.dir / "watch.log", env=self._process_env({}))

    def lease_holder(self, kube: Kube) -> str:
        """The identity holding the watcher's Lease ("" for none)."""
        lease = self.env.get("INITSHIFT_LEASE_NAME", "initshift-watcher")
        obj = kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{lease}") or {}
        return str((obj.get("spec") or {}).get("holderIdentity") or "")

    def wait_watcher_leads(self, kube: Kube, timeout: float = START_TIMEOUT) -> None:
        wait_for(lambda: bool(self.lease_holder(kube)), timeout, "the watcher's Lease held",
                 watch=[p for p in (self.watcher,) if p], interval=0.2)

    def logs_forbidden(self, since: dt.datetime | None = None) -> list[str]:
        """Lines of the server's and watcher's logs that report a 403 (RBAC said no); `since`:
        only those stamped then or later (a line without a readable stamp counts), so a
        scenario is not blamed for an earlier one's (an apiserver restarting answers 403
        until its authorizer has synced)."""
        out = []
        for proc in (self.server, self.watcher):
            if proc and proc.log.is_file():
                out += [f"{proc.name}: {line}" for line in proc.log.read_text(errors="replace").splitlines()
                        if ("Forbidden" in line or "forbidden" in line) and not _before(line, since)]
        return out

    def can_i(self) -> list[tuple[str, str, str, bool, bool]]:
        """(verb, resource, namespace, expected, answered) for every CAN_I row."""
        rows = []
        for verb, resource, ns, expected in CAN_I:
            expected = expected or (self.pull_secrets and (verb, resource, ns) in PULL_SECRETS_GRANTS)
            args = ["auth", "can-i", verb, *resource.split(), f"--as={USER}"]
            args += ["-n", ns] if ns else ["--all-namespaces"] if resource.split("/")[0] in (
                "pods", "events") else []
            answer = kubectl(self.admin, *args, check=False).stdout.strip()
            rows.append((verb, resource, ns or ("all namespaces" if "--all-namespaces" in args else "cluster"),
                         expected, answer == "yes"))
        return rows

    def stop(self) -> None:
        for proc in (self.watcher, self.server):
            if proc:
                proc.stop()

    def uninstall(self) -> None:
        manifest = self.dir / "install.yaml"
        if manifest.is_file():
            kubectl(self.admin, "delete", "--ignore-not-found", "--wait=false", "-f", str(manifest), check=False)
        if self.made_namespace:
            kubectl(self.admin, "delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)


def served_json(install: Install, path: str) -> dict:
    ctx = ssl.create_default_context(cafile=str(install.ca_file))
    conn = http.client.HTTPSConnection(install.host, install.port, context=ctx, timeout=5)
    try:
        conn.request("GET", path)
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def _before(line: str, since: dt.datetime | None) -> bool:
    """The JSON log line is stamped (`ts`) before `since`."""
    if since is None:
        return False
    try:
        return parse_time(json.loads(line)["ts"]) < since
    except (ValueError, KeyError, TypeError):
        return False
