"""initshift's own Pod on the kubelet: the chart's Deployment, its image built from this
machine's Python (`_images.server_image`, pushed to the run's registry), serving the
apiserver's reviews through its Service.

The e2e's pods cannot reach its apiserver (127.0.0.1 on the host, no kube-proxy for the
`kubernetes` Service), so the Deployment runs with the chart's `hostNetwork: true` (what
clusters whose apiserver cannot reach pod IPs use), told the apiserver's loopback address
in KUBERNETES_SERVICE_HOST/PORT. The apiserver calls a webhook named by its Service at the
Service's endpoints (`--enable-aggregator-routing`), here the node's address.
"""

from __future__ import annotations

import copy
import json
import time
from urllib.parse import urlsplit

import httpx

from tests.support import deploy_render
from tests.support.k8s import free_port

from ._check import check_build
from ._env import Env, Record, scenario
from ._images import server_image
from ._install import NAMESPACE
from ._kube import kubectl, wait_for
from ._mesh import ISTIO_TRAFFIC
from ._pods import managed, outcome, pod, step

REPOSITORY = "platform/initshift"
POD_START_TIMEOUT = 180.0  # the image's pull (150 MB) and Python's start on a loaded 2-core machine


def _applies(env: Env) -> bool:
    return env.cluster is not None and env.registry is not None and env.install.flavour == "helm"


def _ready_pod(env: Env, selector: str) -> dict | None:
    for obj in env.kube.pods(NAMESPACE, selector):
        conditions = {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []}
        if conditions.get("Ready") == "True" and not obj["metadata"].get("deletionTimestamp"):
            return obj
    return None


@scenario("server-pod", phase=2, applies=_applies)
def server_pod(env: Env, rec: Record) -> None:
    """initshift's own Pod from the chart (`hostNetwork: true`), its image built from this
    machine's Python: it starts as user 65532 on a read-only root, turns Ready through its
    HTTPS probes, takes its certificate from the Secret, is rolled out again on the one
    node, its watcher takes the Lease, and, the webhook named by its Service, it rewrites a
    build pod, which succeeds with the outcome its watcher writes."""
    assert env.cluster is not None and env.registry is not None
    image = server_image()
    tag = image.ref.rsplit(":", 1)[1]
    env.registry.push(image, REPOSITORY, tag)
    apiserver = urlsplit(env.cluster.plane.server)
    values = {"registry": {"pullSecrets": True}, "replicas": 1, "hostNetwork": True,
              "serverPort": free_port(), "metrics": {"port": free_port()},
              "image": {"repository": f"{env.registry.host}/{REPOSITORY}", "tag": tag},
              "extraEnv": [{"name": "KUBERNETES_SERVICE_HOST", "value": apiserver.hostname},
                           {"name": "KUBERNETES_SERVICE_PORT", "value": str(apiserver.port)}]}
    rendered = {o["kind"]: o for o in deploy_render.helm(values) if o["kind"] in ("Deployment", "Service")}
    original = {o["kind"]: o for o in env.install.objects if o["kind"] in ("Deployment", "Service")}
    config = next(o for o in env.install.objects if o["kind"] == "MutatingWebhookConfiguration")["metadata"]["name"]
    config_path = f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{config}"
    saved = env.kube.get(config_path)
    pod_identity = ""
    selector = ",".join(f"{k}={v}" for k, v in rendered["Deployment"]["spec"]["selector"]["matchLabels"].items())
    manifest = env.install.dir / "server-pod.yaml"

    def apply(objects: list[dict]) -> None:
        manifest.write_text("\n---\n".join(json.dumps(o) for o in objects))
        kubectl(env.admin, "apply", "--server-side", "--force-conflicts", "--field-manager=initshift-e2e",
                "-f", str(manifest))

    # hostNetwork leaves the restricted Pod Security Standard (docs/install.md, Helm values)
    kubectl(env.admin, "label", "--overwrite", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=privileged")
    try:
        apply(list(rendered.values()))
        started = time.monotonic()
        try:
            server = wait_for(lambda: _ready_pod(env, selector), POD_START_TIMEOUT, "initshift's own Pod Ready",
                              interval=1.0)
        except Exception:
            for obj in env.kube.pods(NAMESPACE, selector):
                name = obj["metadata"]["name"]
                rec.details += [f"pod {name}: {json.dumps(obj.get('status'))}",
                                *env.kube.logs(NAMESPACE, name, "initshift").splitlines()[-30:]]
            raise
        ready_after = time.monotonic() - started
        name = server["metadata"]["name"]
        spec = server["spec"]["containers"][0]
        assert server["spec"].get("hostNetwork") and spec["securityContext"].get("readOnlyRootFilesystem"), spec

        def server_log() -> list[dict]:
            return [json.loads(line) for line in env.kube.logs(NAMESPACE, name, "initshift", timestamps=False)
                    .splitlines() if line.startswith("{")]

        def logged(msg: str, timeout: float) -> dict:
            """The Pod's first log line `msg`, once it has one."""
            return wait_for(lambda: next((x for x in server_log() if x.get("msg") == msg), None), timeout,
                            f"the Pod {name}'s {msg!r} line")

        ensured = logged("certificates ensured", 30)
        # A rolling update on this one node (a Pod on the node's network holds its ports).
        deployment = f"deployment/{rendered['Deployment']['metadata']['name']}"
        rolled = time.monotonic()
        kubectl(env.admin, "-n", NAMESPACE, "rollout", "restart", deployment)
        kubectl(env.admin, "-n", NAMESPACE, "rollout", "status", deployment, "--timeout=100s")  # the helper waits 120 s
        rolled = time.monotonic() - rolled
        first_pod = name
        # The old Pod's preStop hook (the image's Python sleeping) ran; a failed one is an event.
        hooks = [e for e in env.kube.events(NAMESPACE, first_pod) if "PreStopHook" in (e.get("reason") or "")]
        assert not hooks, hooks
        server = wait_for(lambda: (pod := _ready_pod(env, selector)) and pod["metadata"]["name"] != first_pod and pod,
                          60, "the rolled-out Pod Ready", interval=1.0)
        name = server["metadata"]["name"]
        logged("certificates ensured", 30)
        # The Pod's watcher (`serve --watch`) takes the Lease once this machine's lets it go.
        assert env.install.watcher is not None
        env.install.watcher.stop()
        leading = logged("leading", 60)
        pod_identity = str(leading.get("identity"))
        assert env.install.lease_holder(env.kube) == pod_identity, (env.install.lease_holder(env.kube), pod_identity)
        # The webhook by its Service: the apiserver calls the Pod, not this machine's server.
        by_service = copy.deepcopy(env.kube.get(config_path))  # the Pod may have written its caBundle
        for wh in by_service["webhooks"]:
            wh["clientConfig"] = {"service": {"namespace": NAMESPACE, "name": rendered["Service"]["metadata"]["name"],
                                              "port": 443, "path": "/mutate"},
                                  "caBundle": wh["clientConfig"]["caBundle"]}
        env.kube.request("PUT", config_path, body=by_service)
        ns = env.namespace("server-pod")
        rec.namespaces.append(ns)
        env.kube.create(f"/api/v1/namespaces/{ns}/pods", pod(
            "build", [step("fetch", env.images.busybox, port=ISTIO_TRAFFIC)],
            [step("completion", env.images.busybox, port=None)]))
        build = check_build(env, rec, ns, "build", steps=["fetch"], proxy="istio-proxy", strategy=env.build_strategy)
        result = outcome(env.kube, ns, "build")  # written by the Pod's watcher, the only one running
        assert result["result"] == "Succeeded", result
        reviews = [x for x in server_log() if x.get("namespace") == ns and x.get("pod") == "build"]
        patched = next((x for x in reviews if x.get("decision") == "patched"), None)
        assert patched, reviews or server_log()[-5:]
        assert not any(f'"namespace":"{ns}"' in line for line in env.install.server.log.read_text(
            errors="replace").splitlines()), "this machine's server reviewed the pod, not initshift's own Pod"
        images = {c["image"] for c in [*build.obj["spec"].get("initContainers", []), *build.obj["spec"]["containers"]]
                  if c["name"].startswith("initshift-")}
        assert images == {f"{env.registry.host}/{REPOSITORY}:{tag}"}, images
        # Prometheus scrapes the Pod's address (the node's, on hostNetwork) on the metrics port.
        scraped = httpx.get(f"http://{server['status']['podIP']}:{values['metrics']['port']}/metrics", timeout=10)
        assert scraped.status_code == 200 and 'initshift_admission_requests_total{outcome="patched"}' in scraped.text, \
            scraped.text[:300]
        status = env.kube.pod(NAMESPACE, name)["status"]["containerStatuses"][0]
        errors = [x for x in server_log() if x.get("level") in ("error", "critical")]
        assert status["restartCount"] == 0 and not errors, (status, errors)
        warnings = [x.get("msg") for x in server_log() if x.get("level") == "warning"]
    finally:
        env.kube.request("PUT", config_path, body={**saved, "metadata": {
            **saved["metadata"], "resourceVersion": env.kube.get(config_path)["metadata"]["resourceVersion"]}})
        apply(list(original.values()))
        wait_for(lambda: not env.kube.pods(NAMESPACE, selector), 60, "initshift's own Pod gone", interval=1.0)
        kubectl(env.admin, "label", "--overwrite", "namespace", NAMESPACE,
                "pod-security.kubernetes.io/enforce=restricted")
        if env.install.watcher is not None and not env.install.watcher.alive():
            env.install.start_watcher()
        # The Lease back with this machine's watcher (the Pod's gives it up at its SIGTERM).
        wait_for(lambda: env.install.lease_holder(env.kube) not in ("", pod_identity) or None, 60, "this machine's watcher leading")
    rec.note(f"{image.ref.split('/')[-1]} ({REPOSITORY}:{tag}) Ready {ready_after:.1f} s after the apply, "
             f"certificates {ensured.get('action')}, rolled out again in place in {rolled:.1f} s (its preStop "
             f"hook 5 s), its watcher leading; by its Service: {len(reviews)} reviews, the build "
             f"{patched['decision']} ({patched['reason']}), {managed(build.obj)}, outcome {result['result']}; "
             f"its log: no error, warnings {warnings or 'none'}")
