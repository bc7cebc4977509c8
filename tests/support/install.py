"""An initshift install inside the API double, for `initshift check`: the objects deploy/
renders (Namespace, Service, MutatingWebhookConfiguration, the service account's RBAC as
the double's table), the real HTTPS server with a CA the caBundle carries, the real watcher
holding its Lease, an Istio injector, and a kubelet player for smoke pods.

The double plays the apiserver: a pod created in it goes through the real initshift
server (an AdmissionReview over HTTPS, verified with the caBundle), then Istio's injection
when the namespace asks for it, then initshift again (reinvocationPolicy: IfNeeded).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import dataclasses
import functools
import ssl
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import httpx

from certs import pki, store
from tests.deploy.test_deploy import grants
from tests.support import https_helpers as h
from tests.support.deploy_render import Rendered, kustomize
from tests.support.fixtures import pods
from tests.support.kubedouble import KubeDouble, now_rfc3339, running, terminated
from tests.support.podstatus import write_kubeconfig
from waiter import protocol as p
from webhook.admission._https import HttpsServer
from webhook.kube import KubeError
from tests.support.patching import apply_patch
from tests.support.patching import decode_patch
from webhook.cli._review import wrap
from webhook.settings import Settings, WatcherSettings
from webhook.watcher import run_watcher

NS = "initshift-system"
SA_USER = f"system:serviceaccount:{NS}:initshift"
SERVING_PORT = 8443  # the replicas' container port `https`, the Service's targetPort
BUILDS = "builds"  # opted in, Istio injects
PLAIN = "plain"  # opted in, no mesh
ISTIO_CONFIG = "istio-sidecar-injector"


@functools.cache
def rendered() -> Rendered:
    """The default install (kustomize deploy/), rendered once."""
    return Rendered(kustomize("."))


def istio_injector() -> dict:
    """Istio 1.22's injector configuration, as istioctl installs it (the webhooks that matter)."""
    svc = {"name": "istiod", "namespace": "istio-system", "path": "/inject", "port": 443}
    not_false = {"matchExpressions": [{"key": "sidecar.istio.io/inject", "operator": "NotIn", "values": ["false"]}]}
    return {"metadata": {"name": ISTIO_CONFIG}, "webhooks": [
        {"name": "rev.namespace.sidecar-injector.istio.io", "clientConfig": {"service": svc},
         "namespaceSelector": {"matchExpressions": [
             {"key": "istio.io/rev", "operator": "In", "values": ["default"]},
             {"key": "istio-injection", "operator": "DoesNotExist"}]},
         "objectSelector": not_false, "sideEffects": "None", "admissionReviewVersions": ["v1"]},
        {"name": "namespace.sidecar-injector.istio.io", "clientConfig": {"service": svc},
         "namespaceSelector": {"matchExpressions": [{"key": "istio-injection", "operator": "In",
                                                     "values": ["enabled"]}]},
         "objectSelector": not_false, "sideEffects": "None", "admissionReviewVersions": ["v1"]},
        {"name": "object.sidecar-injector.istio.io", "clientConfig": {"service": svc},
         "namespaceSelector": {"matchExpressions": [{"key": "istio-injection", "operator": "DoesNotExist"},
                                                    {"key": "istio.io/rev", "operator": "DoesNotExist"}]},
         "objectSelector": {"matchExpressions": [{"key": "sidecar.istio.io/inject", "operator": "In",
                                                  "values": ["true"]}]},
         "sideEffects": "None", "admissionReviewVersions": ["v1"]},
    ]}


def istiod(native: str | None = "false") -> dict:
    env = [{"name": "PILOT_ENABLE_STATUS", "value": "false"}]
    if native is not None:
        env.append({"name": "ENABLE_NATIVE_SIDECARS", "value": native})
    return {"metadata": {"name": "istiod", "namespace": "istio-system"},
            "spec": {"template": {"spec": {"containers": [{"name": "discovery", "image": "docker.io/istio/pilot:1.22.0",
                                                           "env": env}]}}}}


def make_pki(directory: Path, *, expired: bool = False) -> bytes:
    """A CA and a serving pair for the Service's names and 127.0.0.1 in `directory`; the CA PEM.
    `expired`: the serving certificate ended yesterday."""
    import datetime as dt

    ca = pki.create_ca()
    names = pki.service_dns_names("initshift", NS)
    now = pki.utcnow() - dt.timedelta(days=3) if expired else None
    serving = pki.create_serving(ca, names, ["127.0.0.1"], days=2 if expired else 365, now=now)
    store.write_dir(directory, ca, serving)
    return ca.cert_pem


@dataclasses.dataclass
class Install:
    kube: KubeDouble
    kubeconfig: str
    server: HttpsServer | None
    ca_pem: bytes
    url: str  # --service-url: the server on 127.0.0.1

    def argv(self, *more: str) -> list[str]:
        return ["--kubeconfig", self.kubeconfig, "--service-url", self.url, *more]


def replica(deployment: dict, name: str, *, ready: bool, **container_status: Any) -> dict:
    """A pod of the Deployment as the kubelet reports it: Ready, or not with `container_status`."""
    status = {"phase": "Running", "conditions": [{"type": "Ready", "status": str(ready)}],
              "containerStatuses": [{"name": "initshift", "ready": ready, "restartCount": 0,
                                     "state": {"running": {}}, **container_status}]}
    return {"metadata": {"name": name, "namespace": deployment["metadata"]["namespace"],
                         "labels": deployment["spec"]["template"]["metadata"]["labels"]},
            "spec": deployment["spec"]["template"]["spec"], "status": status}


def budget(pdb: dict, *, healthy: int, expected: int | None = None) -> dict:
    """A PodDisruptionBudget with the status the disruption controller writes for `healthy`
    Ready pods of `expected` (its minAvailable an integer, as deploy/'s)."""
    expected = healthy if expected is None else expected
    desired = int(pdb["spec"]["minAvailable"])
    meta = {**pdb["metadata"], "generation": 1}
    return {**pdb, "metadata": meta, "status": {
        "observedGeneration": 1, "expectedPods": expected, "currentHealthy": healthy, "desiredHealthy": desired,
        "disruptionsAllowed": max(0, healthy - desired)}}


def put_install(kube: KubeDouble, ca_pem: bytes) -> None:
    """Every object of the default install the check reads, the caBundle set to `ca_pem`."""
    r = rendered()
    for kind, resource in (("Namespace", "namespaces"), ("Service", "services"), ("ServiceAccount", "serviceaccounts"),
                           ("Deployment", "deployments")):
        for obj in r.of_kind(kind):
            kube.put(resource, obj)
    mwc = copy.deepcopy(r.one("MutatingWebhookConfiguration"))
    for wh in mwc["webhooks"]:
        wh["clientConfig"]["caBundle"] = base64.b64encode(ca_pem).decode()
    kube.put("mutatingwebhookconfigurations", mwc)
    deployment = r.one("Deployment")
    for i in range(deployment["spec"]["replicas"]):  # its replicas, Ready (the server in the tests runs beside)
        kube.put("pods", replica(deployment, f"initshift-7d9c5b-{i}", ready=True))
    kube.put("poddisruptionbudgets", budget(r.one("PodDisruptionBudget"), healthy=deployment["spec"]["replicas"]))
    kube.grant(SA_USER, grants(r))
    kube.put("namespaces", {"metadata": {"name": "kube-system"}})
    kube.put("namespaces", {"metadata": {"name": "default"}})
    kube.put("namespaces", {"metadata": {"name": BUILDS, "labels": {p.LABEL_NAMESPACE_ENABLED: "true",
                                                                    "istio-injection": "enabled"}}})
    kube.put("namespaces", {"metadata": {"name": PLAIN, "labels": {p.LABEL_NAMESPACE_ENABLED: "true"}}})
    kube.put("namespaces", {"metadata": {"name": "istio-system"}})
    kube.put("mutatingwebhookconfigurations", istio_injector())
    kube.put("deployments", istiod())


def watcher_settings() -> Settings:
    return Settings(watcher=WatcherSettings(grace_seconds=0.5, resync_seconds=60.0, lease_seconds=3.0))


@contextlib.asynccontextmanager
async def watcher(kube: KubeDouble) -> AsyncIterator[None]:
    """The real watcher, leader-elected: it holds and renews the Lease while it runs."""
    stop = asyncio.Event()
    api = kube.kube_api("initshift-watcher")
    task = asyncio.ensure_future(run_watcher(watcher_settings(), stop, api=api, identity="initshift-0"))
    try:
        for _ in range(500):
            if kube.get("leases", NS, "initshift-watcher"):
                break
            await asyncio.sleep(0.01)
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await api.close()


@contextlib.contextmanager
def server(directory: Path, *, gate: bool = True, mode: str | None = None, **app: Any) -> Iterator[HttpsServer]:
    settings = h.settings_for(directory, namespace=NS).replace(feature_gate=gate)
    if mode is not None:
        settings = settings.replace(rewrite=dataclasses.replace(settings.rewrite, mode=mode))
    with h.running(settings, **app) as srv:
        yield srv


def admission_chain(kube: KubeDouble, srv: HttpsServer, ca_pem: bytes) -> None:
    """The apiserver's mutating admission for pods: initshift, the mesh, initshift again."""
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    url = f"{h.base_url(srv)}/mutate"

    async def initshift(pod: dict, namespace: str) -> dict:
        ns = kube.get("namespaces", None, namespace) or {}
        if (ns.get("metadata", {}).get("labels") or {}).get(p.LABEL_NAMESPACE_ENABLED) != "true":
            return pod
        async with httpx.AsyncClient(verify=ctx, timeout=10) as client:
            answer = (await client.post(url, json=wrap(pod, namespace=namespace))).json()
        return apply_patch(pod, decode_patch(answer))

    async def istio(pod: dict, namespace: str) -> dict:
        ns = kube.get("namespaces", None, namespace) or {}
        if (ns.get("metadata", {}).get("labels") or {}).get("istio-injection") != "enabled":
            return pod
        return pods.inject_istio(pod)

    kube.admission = [initshift, istio, initshift]


@contextlib.asynccontextmanager
async def healthy(kube: KubeDouble, tmp_path: Path, *, gate: bool = True, mode: str | None = None,
                  **app: Any) -> AsyncIterator[Install]:
    """`gate`: the server's feature gate; `mode`: its INITSHIFT_MODE; `app`: create_app's hooks
    (native_supported, strategy)."""
    ca_pem = make_pki(tmp_path / "pki")
    put_install(kube, ca_pem)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url)
    with server(tmp_path / "pki", gate=gate, mode=mode, **app) as srv:
        for pod in kube.items("pods", NS):  # what a port-forward to a replica's https port reaches
            kube.pod_ports[(NS, pod["metadata"]["name"], SERVING_PORT)] = srv.port
        admission_chain(kube, srv, ca_pem)
        async with watcher(kube):
            yield Install(kube, kubeconfig, srv, ca_pem, h.base_url(srv))


# --- the kubelet, for smoke pods ------------------------------------------------------------------
class _Held(Exception):
    """The pod reached the stage the kubelet is held at."""


class Kubelet:
    """Plays the kubelet for each smoke pod: writes its status through the status subresource in
    the order a real kubelet runs the pod the rewrite made. `hold`: a stage it never gets past
    ("sidecar-ready": the proxy never becomes Ready; "image-pull": initshift-init's image
    cannot be pulled). `waiter_first`: waiter pods end before
    the kubelet's own probe reports the proxy up (a real kubelet probes every second or more;
    the waiter's loopback probe answers within milliseconds)."""

    def __init__(self, kube: KubeDouble, namespace: str, *, hold: str | None = None, pause: float = 0.05,
                 waiter_first: bool = False) -> None:
        self.kube, self.namespace, self.hold, self.pause = kube, namespace, hold, pause
        self.waiter_first = waiter_first
        self.api = kube.kube_api("kubelet")
        self.status: dict[str, Any] = {"phase": "Pending", "startTime": now_rfc3339()}
        self.name = ""

    async def write(self, **changes: Any) -> None:
        self.status.update(changes)
        await self.api.request("PATCH", f"/api/v1/namespaces/{self.namespace}/pods/{self.name}/status",
                               body={"status": self.status}, content_type="application/merge-patch+json")
        await asyncio.sleep(self.pause)

    def _set(self, key: str, entry: dict) -> list[dict]:
        entries = {s["name"]: s for s in self.status.get(key) or []}
        old = (entries.get(entry["name"]) or {}).get("state", {}).get("running")
        for state in ("running", "terminated"):  # readiness and the end change; the start does not
            if old and state in entry["state"]:
                entry["state"][state]["startedAt"] = old["startedAt"]
        entries[entry["name"]] = entry
        return list(entries.values())

    async def init(self, entry: dict) -> None:
        await self.write(initContainerStatuses=self._set("initContainerStatuses", entry))

    async def regular(self, *entries: dict, phase: str | None = None) -> None:
        for e in entries:
            self.status["containerStatuses"] = self._set("containerStatuses", e)
        await self.write(**({"phase": phase} if phase else {}))

    async def run(self) -> None:
        """Plays each pod created in the namespace, one after the other (the smoke check's
        build pod, then its Job-shaped pod), until cancelled."""
        played: set[str] = set()
        try:
            while True:
                found = [q["metadata"]["name"] for q in self.kube.items("pods", self.namespace)
                         if q["metadata"]["name"] not in played]
                if not found:
                    await asyncio.sleep(0.01)
                    continue
                self.name = found[0]
                played.add(self.name)
                self.status = {"phase": "Pending", "startTime": now_rfc3339()}
                pod = self.kube.pod(self.namespace, self.name)
                managed = (pod["metadata"].get("labels") or {}).get(p.LABEL_MANAGED)
                play = {p.MODE_NATIVE: self._native, p.MODE_WAITER: self._waiter, p.MODE_HYBRID: self._hybrid}
                try:
                    await play.get(managed, self._plain)(pod)
                except KubeError:
                    pass  # the check deleted the pod it gave up on
                except _Held:
                    pass
        finally:
            await self.api.close()

    async def _inits_in_order(self, pod: dict, until: str | None = None) -> None:
        """Non-restartable init containers one after the other (up to `until`)."""
        for c in pod["spec"].get("initContainers") or []:
            if c["name"] == until:
                return
            if c["name"] == p.INIT_CONTAINER_NAME and self.hold == "image-pull":
                await self.init({"name": c["name"], "ready": False, "restartCount": 0, "image": c["image"],
                                 "state": {"waiting": {"reason": "ErrImagePull", "message": "401 Unauthorized"}}})
                raise _Held
            if c.get("restartPolicy") == "Always":
                continue
            await self.init(running(c["name"], ready=False))
            await self.init(terminated(c["name"]))

    async def _plain(self, pod: dict) -> None:
        await self._inits_in_order(pod)
        main = pod["spec"]["containers"][0]["name"]
        await self.regular(running(main), phase="Running")
        await self.regular(terminated(main), phase="Succeeded")

    async def _waiter(self, pod: dict) -> None:
        await self._inits_in_order(pod)
        names = [c["name"] for c in pod["spec"]["containers"]]
        work = [n for n in names if n != p.ISTIO_PROXY]
        # the proxy runs, its startup probe has not passed yet: not `started` (nor Ready)
        await self.regular(*[running(n, ready=False) for n in work],
                           {**running(p.ISTIO_PROXY, ready=False), "started": False}, phase="Running")
        if self.hold == "sidecar-ready":
            return
        if not self.waiter_first:
            await self.regular(running(p.ISTIO_PROXY))
        await self._steps(pod)
        await self.regular(terminated(p.ISTIO_PROXY), phase="Succeeded")  # the last main POSTed quitquitquit

    async def _hybrid(self, pod: dict) -> None:
        """The proxy is a native sidecar: the kubelet starts the regular containers (the
        waiter's steps and mains) once its startup probe passed, and stops it after them."""
        proxy = await self._native_start(pod)
        if proxy is None:
            return
        await self.regular(*[running(c["name"], ready=False) for c in pod["spec"]["containers"]], phase="Running")
        await self._steps(pod)
        await self.init(terminated(proxy))  # the kubelet stops native sidecars once the mains have exited
        await self.write(phase="Succeeded")

    async def _steps(self, pod: dict) -> None:
        """Each waiter runs its command after the previous one's record; step 0 after the gate."""
        import json

        step0 = pod["spec"]["containers"][0]
        if p.FLAG_READY_FILE in (step0.get("args") or []):  # the gate is the watcher's annotation
            for _ in range(400):
                ann = self.kube.pod(self.namespace, self.name)["metadata"].get("annotations") or {}
                if ann.get(p.ANNOTATION_READY) == p.READY_TRUE:
                    break
                await asyncio.sleep(0.02)
        steps = json.loads(pod["metadata"]["annotations"][p.ANNOTATION_STEPS])
        mains = json.loads(pod["metadata"]["annotations"][p.ANNOTATION_MAINS])
        for n in [*steps, *mains]:  # each waiter runs its command after the previous one's record
            started = _micro()
            await asyncio.sleep(self.pause)
            record = {"name": n, "exitCode": 0, "reason": p.REASON_COMPLETED, "startedAt": started,
                      "finishedAt": _micro(), "message": ""}
            await self.regular(terminated(n, message=json.dumps(record)))

    async def _native_start(self, pod: dict) -> str | None:
        """The init containers up to the native proxy, the proxy until its startup probe passed,
        then the init containers after it; the proxy's name (None: held at sidecar-ready)."""
        inits = pod["spec"]["initContainers"]
        proxy = next(c["name"] for c in inits if c.get("restartPolicy") == "Always")
        await self._inits_in_order(pod, until=proxy)
        await self.init({**running(proxy, ready=False), "started": False})
        if self.hold == "sidecar-ready":
            return None
        # The startup probe passed: `started`, and the kubelet starts the next container. Not
        # Ready yet: as on a real kubelet, readiness follows at the readiness probe's next
        # period (Istio's: 15 s), after a smoke pod has ended.
        await self.init(running(proxy, ready=False))
        for c in inits[[c["name"] for c in inits].index(proxy) + 1:]:
            await self.init(running(c["name"], ready=False))
            await self.init(terminated(c["name"]))
        return proxy

    async def _native(self, pod: dict) -> None:
        proxy = await self._native_start(pod)
        if proxy is None:
            return
        main = pod["spec"]["containers"][0]["name"]
        await self.regular(running(main), phase="Running")
        await self.regular(terminated(main))
        await self.init(terminated(proxy))  # the kubelet stops sidecars once the mains have exited
        await self.write(phase="Succeeded")


def _micro() -> str:
    import datetime as dt
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
