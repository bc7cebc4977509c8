"""A test-side mesh: a tiny HTTPS mutating webhook that injects an Istio-like or a
Linkerd-like proxy (tests/e2e/images/fakeproxy.c), the way their injectors do.

- Istio: namespaces labelled `istio-injection=enabled` (webhook
  `namespace.sidecar-injector.istio.io`, configuration `istio-sidecar-injector`); a pod's
  `sidecar.istio.io/inject: "false"` opts out. Adds `istio-init` (or `istio-validation`
  where the namespace runs "Istio CNI", label `e2e.initshift.io/istio-cni=true`), the
  `istio-proxy` with Istio's probes (readiness `:15021/healthz/ready` every 15 s, startupProbe
  every 1 s), its quit `POST :15020/quitquitquit` (on the port pilot-agent reads: the pod's
  `status.sidecar.istio.io/port`, else the `statusPort` of its `proxy.istio.io/config`, which
  the injector writes into the proxy's `PROXY_CONFIG`), `sidecar.istio.io/status`, and
  `kubectl.kubernetes.io/default-container` (the first container) where the pod names none.
  Native (an init container with `restartPolicy: Always`, as Istio >= 1.27 injects
  wherever the cluster supports it) when
  the pod asks (`sidecar.istio.io/nativeSidecar: "true"`) or its namespace is labelled
  `e2e.initshift.io/native-mesh=true`; classic (in `containers`) otherwise.
- Linkerd: called for every namespace (`linkerd-proxy-injector.linkerd.io`, configuration
  `linkerd-proxy-injector-webhook-config`); injects when the pod or its namespace is
  annotated `linkerd.io/inject: enabled`. Adds `linkerd-init`, the `linkerd-proxy` first
  (readiness `:4191/ready`, liveness `:4191/live` answered from the start, quit `POST
  :4191/shutdown`, on the port of the pod's or namespace's `config.linkerd.io/admin-port`
  where it has one, written into `LINKERD2_PROXY_ADMIN_LISTEN_ADDR` as Linkerd's injector
  does; served only where `LINKERD2_PROXY_SHUTDOWN_ENDPOINT_ENABLED` is "true":
  "false" unless the pod or its namespace says `config.linkerd.io/proxy-admin-shutdown:
  enabled`, as Linkerd 2.16 and later inject it); classic with a postStart hook that waits
  for readiness as linkerd-await does, native (with
  `config.linkerd.io/proxy-enable-native-sidecar: "true"`, or its beta or alpha name, on
  the pod or namespace) with a startupProbe on `/ready` instead, every second, as Linkerd's
  chart does.

Both configurations have `reinvocationPolicy: IfNeeded` and sort after initshift's, so
the apiserver calls initshift first and again after the injection (re-invocation).
Pod annotations tune the fake proxy: `e2e.initshift.io/proxy-ready-after` (seconds,
default 1.5) and `e2e.initshift.io/proxy-no-quit: "true"` (a proxy without a quit endpoint).
"""

from __future__ import annotations

import base64
import copy
import http.server
import json
import ssl
import tempfile
import threading
from pathlib import Path
from typing import Any

import jsonpatch
import yaml

from certs import pki
from waiter import protocol as p
from tests.support.k8s import free_port

from ._images import LINKERD_AWAIT
from ._kube import Kube

ISTIO_TRAFFIC, LINKERD_TRAFFIC = 15001, 4140  # where a step sends its traffic "through the proxy"
READY_AFTER = "e2e.initshift.io/proxy-ready-after"
NO_QUIT = "e2e.initshift.io/proxy-no-quit"
LINKERD_ADMIN_PORT = "config.linkerd.io/admin-port"  # Linkerd's own: where its admin server listens
NATIVE_NS = "e2e.initshift.io/native-mesh"
ISTIO_CNI_NS = "e2e.initshift.io/istio-cni"
# Only this run's namespaces: on a cluster of your own, the fake mesh never touches another pod.
RUN_LABEL = "e2e.initshift.io/run"
ISTIO_CONFIG, LINKERD_CONFIG = "istio-sidecar-injector", "linkerd-proxy-injector-webhook-config"
_RESTRICTED = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
               "runAsUser": 1337, "runAsGroup": 1337, "readOnlyRootFilesystem": True,
               "seccompProfile": {"type": "RuntimeDefault"}}


def _probe(port: int, path: str, **extra: Any) -> dict:
    return {"httpGet": {"path": path, "port": port}, **extra}


def _place(spec: dict, init: dict, proxy: dict, native: bool, *, first: bool) -> None:
    """The mesh's init container first; its proxy right after it as a native sidecar, or
    among the regular containers (first or last)."""
    inits = spec.setdefault("initContainers", [])
    inits.insert(0, init)
    if native:
        proxy["restartPolicy"] = "Always"
        inits.insert(1, proxy)
    else:
        spec["containers"].insert(0 if first else len(spec["containers"]), proxy)


class Mesh:
    """The injector's HTTPS server (start/stop) and its two webhook configurations."""

    def __init__(self, kube: Kube, proxy_image: str, busybox_image: str, run: str, host: str = "127.0.0.1") -> None:
        self.kube, self.proxy_image, self.busybox, self.run = kube, proxy_image, busybox_image, run
        self.port = free_port()
        self._ns_cache: dict[str, dict] = {}
        self._lock = threading.Lock()
        self.calls = 0
        self._dir = tempfile.TemporaryDirectory(prefix="initshift-e2e-mesh-")
        ca = pki.create_ca("initshift-e2e-mesh-ca")
        serving = pki.create_serving(ca, ["localhost"], [host])
        self.host = host
        cert, key = Path(self._dir.name, "tls.crt"), Path(self._dir.name, "tls.key")
        cert.write_bytes(serving.cert_pem)
        key.write_bytes(serving.key_pem)
        self.ca_pem = ca.cert_pem
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(cert), str(key))
        mesh = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                answer = mesh.review(self.path, json.loads(body))
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((host, self.port), Handler)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self._thread = threading.Thread(target=self.server.serve_forever, name="mesh-injector", daemon=True)

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()
        ca = base64.b64encode(self.ca_pem).decode()
        base = {"admissionReviewVersions": ["v1"], "sideEffects": "None", "reinvocationPolicy": "IfNeeded",
                "timeoutSeconds": 10, "matchPolicy": "Equivalent",
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                           "resources": ["pods"], "scope": "Namespaced"}]}
        configs = [
            (ISTIO_CONFIG, {**base, "name": "namespace.sidecar-injector.istio.io", "failurePolicy": "Fail",
                            "clientConfig": {"url": f"https://{self.host}:{self.port}/istio", "caBundle": ca},
                            "namespaceSelector": {"matchLabels": {"istio-injection": "enabled", RUN_LABEL: self.run}}}),
            (LINKERD_CONFIG, {**base, "name": "linkerd-proxy-injector.linkerd.io", "failurePolicy": "Ignore",
                              "clientConfig": {"url": f"https://{self.host}:{self.port}/linkerd", "caBundle": ca},
                              "namespaceSelector": {"matchLabels": {RUN_LABEL: self.run}, "matchExpressions": [
                                  {"key": "config.linkerd.io/admission-webhooks", "operator": "NotIn",
                                   "values": ["disabled"]},
                                  {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                   "values": ["kube-system", "initshift-system"]}]}}),
        ]
        for name, webhook in configs:
            self.kube.create("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", {
                "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "initshift-e2e"}},
                "webhooks": [webhook]})

    def stop(self) -> None:
        for name in (ISTIO_CONFIG, LINKERD_CONFIG):
            try:
                self.kube.delete(f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{name}")
            except Exception:  # noqa: BLE001 - the cluster may be gone already
                pass
        self.server.shutdown()
        self.server.server_close()
        self._dir.cleanup()

    # --- admission --------------------------------------------------------------------------

    def _namespace(self, name: str) -> dict:
        with self._lock:
            if name not in self._ns_cache:
                self._ns_cache[name] = self.kube.get(f"/api/v1/namespaces/{name}") or {}
            return self._ns_cache[name]

    def review(self, path: str, review: dict) -> dict:
        request = review.get("request") or {}
        pod = request.get("object") or {}
        ns = self._namespace(request.get("namespace") or "default")
        inject = self.istio if path.split("?")[0] == "/istio" else self.linkerd  # the apiserver adds ?timeout=
        mutated = inject(copy.deepcopy(pod), ns)
        response: dict[str, Any] = {"uid": request.get("uid"), "allowed": True}
        if mutated is not None:
            self.calls += 1
            patch = jsonpatch.make_patch(pod, mutated).patch
            response |= {"patchType": "JSONPatch", "patch": base64.b64encode(json.dumps(patch).encode()).decode()}
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}

    def _proxy(self, name: str, pod: dict, ready: tuple[int, str], quit_: tuple[int, str], traffic: int) -> dict:
        ann = pod["metadata"].get("annotations") or {}
        args = ["--name", name, "--ready-after", ann.get(READY_AFTER, "1.5"),
                "--ready", f"{ready[0]}:{ready[1]}", "--quit", f"{quit_[0]}:{quit_[1]}", "--traffic", str(traffic)]
        if ann.get(NO_QUIT) == "true":
            args.append("--no-quit")
        return {"name": name, "image": self.proxy_image, "imagePullPolicy": "IfNotPresent", "args": args,
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
                "securityContext": dict(_RESTRICTED)}

    def istio(self, pod: dict, ns: dict) -> dict | None:
        meta = pod.setdefault("metadata", {})
        ann, labels = meta.setdefault("annotations", {}), meta.setdefault("labels", {})
        if ann.get("sidecar.istio.io/inject") == "false" or "sidecar.istio.io/status" in ann:
            return None
        ns_labels = (ns.get("metadata") or {}).get("labels") or {}
        spec = pod["spec"]
        native = ann.get("sidecar.istio.io/nativeSidecar", ns_labels.get(NATIVE_NS, "false")) == "true"
        cni = ns_labels.get(ISTIO_CNI_NS) == "true"
        init_name = "istio-validation" if cni else "istio-init"
        init = {"name": init_name, "image": self.busybox, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", f"echo {init_name}: traffic redirection {'validated' if cni else 'set up'}"],
                "resources": {"requests": {"cpu": "10m", "memory": "10Mi"}, "limits": {"memory": "32Mi"}},
                "securityContext": dict(_RESTRICTED)}
        # The pod's ProxyConfig into PROXY_CONFIG, as Istio's injector merges it (no mesh-wide
        # defaultConfig here); pilot-agent's status server (/quitquitquit) on the port it reads.
        config = yaml.safe_load(ann.get(p.ISTIO_PROXY_CONFIG_ANNOTATION, "{}")) or {}
        status_port = int(ann.get(p.ISTIO_STATUS_PORT_ANNOTATION, config.get("statusPort", 15020)))
        proxy = self._proxy("istio-proxy", pod, (15021, "/healthz/ready"), (status_port, "/quitquitquit"),
                            ISTIO_TRAFFIC)
        proxy["env"] = [{"name": p.ISTIO_PROXY_CONFIG_ENV, "value": json.dumps(config)}]
        proxy["ports"] = [{"containerPort": 15090, "name": "http-envoy-prom", "protocol": "TCP"}]
        proxy["readinessProbe"] = _probe(15021, "/healthz/ready", periodSeconds=15, timeoutSeconds=3,
                                         failureThreshold=4)
        proxy["startupProbe"] = _probe(15021, "/healthz/ready", periodSeconds=1, timeoutSeconds=3,
                                       failureThreshold=600)
        proxy["volumeMounts"] = [{"name": "istio-envoy", "mountPath": "/etc/istio/proxy"}]
        # Istio's template names the first container for kubectl, unless the pod names one.
        ann.setdefault(p.DEFAULT_CONTAINER_ANNOTATION, spec["containers"][0]["name"])
        _place(spec, init, proxy, native, first=False)  # Istio appends its proxy
        spec.setdefault("volumes", []).append({"name": "istio-envoy", "emptyDir": {"medium": "Memory"}})
        ann["sidecar.istio.io/status"] = json.dumps({
            "initContainers": [init_name], "containers": ["istio-proxy"], "volumes": ["istio-envoy"],
            "imagePullSecrets": None, "revision": "default"}, separators=(",", ":"))
        labels["security.istio.io/tlsMode"] = "istio"
        # as Istio names the workload: its labels, else the pod's name (generateName without its "-")
        workload = labels.get("app.kubernetes.io/name") or labels.get("app") or meta.get("name") or \
            (meta.get("generateName") or "pod").rstrip("-")
        labels.setdefault("service.istio.io/canonical-name", workload)
        return pod

    def linkerd(self, pod: dict, ns: dict) -> dict | None:
        meta = pod.setdefault("metadata", {})
        ann = meta.setdefault("annotations", {})
        ns_ann = (ns.get("metadata") or {}).get("annotations") or {}
        inject = ann.get("linkerd.io/inject", ns_ann.get("linkerd.io/inject"))
        spec = pod["spec"]
        present = {c["name"] for c in spec.get("containers", []) + spec.get("initContainers", [])}
        if inject not in ("enabled", "ingress") or "linkerd-proxy" in present:
            return None
        # The switch under the first of its names (GA, beta, alpha) the pod, else its namespace,
        # sets; native only where asked (Linkerd up to 2.19's default; 2.20 with nativeSidecar off).
        said = [where[k] for where in (ann, ns_ann) for k in p.LINKERD_NATIVE_ANNOTATIONS if k in where]
        native = bool(said) and said[0] == "true"
        init = {"name": "linkerd-init", "image": self.busybox, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "echo linkerd-init: iptables set up"],
                "resources": {"requests": {"cpu": "10m", "memory": "10Mi"}, "limits": {"memory": "32Mi"}},
                "securityContext": dict(_RESTRICTED)}
        # The admin server (/ready, /live, /shutdown) on the pod's (or namespace's) admin port.
        admin = int(ann.get(LINKERD_ADMIN_PORT, ns_ann.get(LINKERD_ADMIN_PORT, "4191")))
        proxy = self._proxy("linkerd-proxy", pod, (admin, "/ready"), (admin, "/shutdown"), LINKERD_TRAFFIC)
        proxy["ports"] = [{"containerPort": 4143, "name": "linkerd-proxy"},
                          {"containerPort": admin, "name": "linkerd-admin"}]
        # Linkerd 2.16 and later: /shutdown served only where the workload asks for it.
        shutdown = ann.get(p.LINKERD_SHUTDOWN_ANNOTATION, ns_ann.get(p.LINKERD_SHUTDOWN_ANNOTATION)) == "enabled"
        proxy["env"] = [{"name": p.LINKERD_ADMIN_ADDR_ENV, "value": f"0.0.0.0:{admin}"},
                        {"name": p.LINKERD_SHUTDOWN_ENV, "value": "true" if shutdown else "false"}]
        proxy["args"] += ["--quit-enabled-by", p.LINKERD_SHUTDOWN_ENV]
        proxy["readinessProbe"] = _probe(admin, "/ready", initialDelaySeconds=2, timeoutSeconds=1)
        proxy["livenessProbe"] = _probe(admin, "/live", initialDelaySeconds=10, timeoutSeconds=1)  # from the start
        proxy["args"] += ["--live", "/live"]
        if native:  # Linkerd's chart: proxy.await as a startupProbe for a native proxy, else a postStart hook
            proxy["startupProbe"] = _probe(admin, "/ready", initialDelaySeconds=0, periodSeconds=1,
                                           failureThreshold=120)
        else:
            proxy["lifecycle"] = {"postStart": {"exec": {"command": [LINKERD_AWAIT, "--timeout=2m",
                                                                     f"--port={admin}"]}}}
        _place(spec, init, proxy, native, first=True)  # Linkerd puts its proxy first
        ann["linkerd.io/proxy-version"] = "e2e-fake"
        ann["linkerd.io/created-by"] = "initshift-e2e/mesh"
        meta.setdefault("labels", {})["linkerd.io/control-plane-ns"] = "linkerd"
        return pod
