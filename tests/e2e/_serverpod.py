"""initshift's own Pods on the kubelet: the Deployment as installed, its image built from
this machine's Python (`_images.server_image`, pushed to the run's registry), serving the
apiserver's reviews through its Service.

As each install ships it: kustomize (v1.28.15) deploy/'s Deployment, Helm (v1.34.9) the
chart's default: two replicas on the pod network under the restricted Pod Security
Standard, finding the apiserver through the `kubernetes` Service as in any cluster (the
throwaway cluster routes that one Service, tests/support/k8s/_cluster.py). Helm then also
the chart with `hostNetwork: true` (for clusters whose apiserver cannot reach pod IPs), one
replica; a Pod on the node's network reaches the Service only through kube-proxy's rules
for the node itself, which this cluster lacks, so it is told the apiserver's loopback
address in KUBERNETES_SERVICE_HOST/PORT (the chart's `extraEnv`). Either way the apiserver
calls the webhook named by its Service at the Service's endpoints
(`--enable-aggregator-routing`), and `initshift check` verifies it from this machine, outside
the cluster, as the README tells a user to: through its own port-forward, and through `kubectl
port-forward` with `--service-url`.
"""

from __future__ import annotations

import copy
import json
import select
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from tests.support import deploy_render
from tests.support.k8s import free_port

from ._check import check_build
from ._env import Env, Record, check_report, scenario
from ._images import server_image
from ._install import NAMESPACE, render
from ._kube import kubectl, kubectl_path, wait_for
from ._mesh import ISTIO_TRAFFIC
from ._pods import managed, outcome, pod, step
from ._viewer import viewer

REPOSITORY = "platform/initshift"
POD_START_TIMEOUT = 180.0  # the image's pull (150 MB) and Python's start on a loaded 2-core machine


def _applies(env: Env) -> bool:
    """a cluster this run starts, with its local registry (the server's image)"""
    return env.cluster is not None and env.registry is not None


@dataclass
class _Shape:
    """What runs: the Deployment and Service to apply, and how they are reached."""

    what: str  # for the note
    objects: dict[str, dict]  # by kind
    host_network: bool = False

    @property
    def replicas(self) -> int:
        return int(self.objects["Deployment"]["spec"]["replicas"])

    @property
    def metrics_port(self) -> int:
        (container,) = self.objects["Deployment"]["spec"]["template"]["spec"]["containers"]
        return next(int(x["containerPort"]) for x in container["ports"] if x["name"] == "metrics")


def _served(objects: list[dict]) -> dict[str, dict]:
    return {o["kind"]: o for o in objects if o["kind"] in ("Deployment", "Service")}


def shapes(env: Env, image: str) -> list[_Shape]:
    """The install's Deployment as shipped on the pod network; with Helm, then the chart's
    `hostNetwork: true`."""
    assert env.cluster is not None
    if env.install.flavour == "helm":
        repository, tag = image.rsplit(":", 1)
        values = {"registry": {"pullSecrets": env.install.pull_secrets},
                  "image": {"repository": repository, "tag": tag}}
        apiserver = urlsplit(env.cluster.plane.server)
        host = {**values, "replicas": 1, "hostNetwork": True, "serverPort": free_port(),
                "metrics": {"port": free_port()},
                "extraEnv": [{"name": "KUBERNETES_SERVICE_HOST", "value": apiserver.hostname},
                             {"name": "KUBERNETES_SERVICE_PORT", "value": str(apiserver.port)}]}
        return [_Shape("the chart's default", _served(deploy_render.helm(values))),
                _Shape("the chart with hostNetwork", _served(deploy_render.helm(host)), host_network=True)]
    # deploy/ as shipped, the image moved as kustomize's `images:` moves it: the container's
    # and INITSHIFT_IMAGE's value both.
    objects = _served(render(env.install.flavour, env.install.pull_secrets))
    (container,) = objects["Deployment"]["spec"]["template"]["spec"]["containers"]
    container["image"] = image
    next(e for e in container["env"] if e["name"] == "INITSHIFT_IMAGE")["value"] = image
    return [_Shape("deploy/", objects)]


def _rollout_under_reviews(env: Env, ns: str, deployment: str, streams: int = 2) -> tuple[int, list[str], float]:
    """`kubectl rollout restart` while dry-run pod creates stream in, each reviewed by a replica
    through the Service. A review that fails (a replica that closed its port while the
    apiserver still sent it reviews) admits its pod unchanged (failurePolicy Ignore).
    Returns (reviewed, what is known of each pod admitted unchanged, the rollout's seconds):
    when it came, the apiserver's warnings (a replica that answered "unchanged" says why), and
    how many reviews the apiserver counted as failed open meanwhile."""
    probe = json.dumps(pod("dry-run", [step("fetch", env.images.busybox, port=ISTIO_TRAFFIC)],
                           [step("completion", env.images.busybox, port=None)]))
    stop = threading.Event()
    counts = {"reviewed": 0}
    unchanged: list[str] = []
    lock = threading.Lock()
    started = time.monotonic()

    def stream() -> None:
        while not stop.is_set():
            try:
                resp = env.kube.http.post(f"/api/v1/namespaces/{ns}/pods", content=probe, params={"dryRun": "All"},
                                          headers={"Content-Type": "application/json"})
            except httpx.TransportError:  # a loaded machine: the apiserver was slow to answer
                continue
            assert resp.status_code == 201, f"a dry-run create answered {resp.status_code}: {resp.text[:500]}"
            with lock:
                counts["reviewed"] += 1
                if managed(resp.json()) is None:
                    unchanged.append(f"at {time.monotonic() - started:.1f} s, warnings "
                                     f"{resp.headers.get_list('warning')}")

    failed_open = env.kube.fail_open_count()
    with ThreadPoolExecutor(streams) as pool:
        running = [pool.submit(stream) for _ in range(streams)]
        try:
            kubectl(env.admin, "-n", NAMESPACE, "rollout", "restart", deployment)
            kubectl(env.admin, "-n", NAMESPACE, "rollout", "status", deployment, "--timeout=100s")
            time.sleep(2)  # the last old Pod's end
        finally:
            stop.set()
        took = time.monotonic() - started
        for future in running:
            future.result()
    if unchanged:
        unchanged.append(f"reviews failed open (apiserver_admission_webhook_fail_open_count): "
                         f"{env.kube.fail_open_count() - failed_open}")
    return counts["reviewed"], unchanged, took


def _crash_seen_by_check(env: Env, deployment: str, selector: str, serving: set[str]) -> str:
    """A rollout whose new Pod cannot start (its metrics port the webhook's): the surge Pod
    exits and `initshift check` says why in the server's own words (the termination
    message from its log), while the old Pods keep serving. What check said."""
    kubectl(env.admin, "-n", NAMESPACE, "set", "env", deployment, "INITSHIFT_METRICS_PORT=8443")

    def ended() -> dict | None:
        return next((x for x in env.kube.pods(NAMESPACE, selector) if x["metadata"]["name"] not in serving and any(
            (c.get("lastState") or {}).get("terminated") for c in x["status"].get("containerStatuses") or [])), None)

    wait_for(ended, POD_START_TIMEOUT, "the new Pod to exit", interval=1.0)
    (line,) = [x for x in check_report(env, "-n", NAMESPACE)[1] if "replicas Ready" in x["title"]]
    assert not line["ok"] and line["title"].endswith(f": {len(serving)} of {len(serving)} replicas Ready"), line
    assert "last ended with exit code 1: initshift serve: cannot listen on port 8443 for metrics " \
           "(INITSHIFT_METRICS_PORT): it is the HTTPS server's port" in line["hint"], line
    return line["hint"]


def _counted_budgets(env: Env) -> list[dict]:
    """The install's PodDisruptionBudgets once the disruption controller has counted each (its
    status for the current generation); the chart makes none for one replica."""
    def counted() -> tuple[list[dict]] | None:  # a tuple: no budget at all is an answer too
        budgets = env.kube.get(f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets")["items"]
        done = all("disruptionsAllowed" in (b.get("status") or {}) and
                   b["status"].get("observedGeneration") == b["metadata"].get("generation") for b in budgets)
        return (budgets,) if done else None
    return wait_for(counted, 60, "the disruption controller's count of the install's budgets")[0]


def _budget_as_counted(lines: list[dict], budgets: list[dict]) -> str:
    """`check`'s line for each budget holds the controller's own count; what it said."""
    said = [x for x in lines if x["title"].startswith("PodDisruptionBudget ")]
    assert [(x["budget"], x["disruptionsAllowed"]) for x in said] == [
        (b["metadata"]["name"], b["status"]["disruptionsAllowed"]) for b in budgets], (said, budgets)
    return "; ".join(x["title"] for x in said) or "no PodDisruptionBudget"


def _checked_from_a_workstation(env: Env, service: str, builds: str) -> str:
    """The README's verification from outside the cluster, where the certificate is verified
    for the Service's name with the configuration's caBundle: `initshift check` alone (its own
    port-forward to a Ready pod, over the API's WebSocket), by the admin and by a user granted
    only what the docs list (`get` on pods/portforward: _viewer.py), then through `kubectl
    port-forward svc/SERVICE PORT:443` and `--service-url https://127.0.0.1:PORT`. Every line
    ✔ every way; what each says of the server."""
    said = []
    budgets = _counted_budgets(env)
    with viewer(env, builds) as config:
        for who, kubeconfig in (("", None), (" as the docs' least-privileged user", config)):
            code, lines = check_report(env, "-n", NAMESPACE, kubeconfig=kubeconfig)
            failed = [x for x in lines if not x.get("ok")]
            assert code == 0 and not failed, f"check{who} exited {code}: {failed}"
            server = [x["title"] for x in lines if x["section"] == "webhook-server"]
            assert any("through a port-forward" in t for t in server) and any("caBundle" in t for t in server), server
            budget = "" if who else f"; {_budget_as_counted(lines, budgets)}"
            said.append(f"`initshift check` from outside the cluster{who}: {len(lines)} lines ✔"
                        + ("" if who else f" ({'; '.join(server)}{budget})"))
    port = free_port()
    forward = subprocess.Popen([kubectl_path(), "--kubeconfig", str(env.admin), "-n", NAMESPACE, "port-forward",
                                f"svc/{service}", f"{port}:443"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    try:
        assert forward.stdout is not None
        ready = select.select([forward.stdout], [], [], 30)[0]
        first = forward.stdout.readline() if ready else "(nothing in 30 s)"
        assert first.startswith("Forwarding from"), f"kubectl port-forward: {first}"
        code, lines = check_report(env, "-n", NAMESPACE, "--service-url", f"https://127.0.0.1:{port}")
        failed = [x for x in lines if not x.get("ok")]
        assert code == 0 and not failed, f"check exited {code}: {failed}"
        server = [x["title"] for x in lines if x["section"] == "webhook-server"]
        assert any("caBundle" in t for t in server), server
        said.append(f"`initshift check --service-url` through `kubectl port-forward svc/{service}`: {len(lines)} "
                    f"lines ✔")
        return "; ".join(said)
    finally:
        forward.terminate()
        forward.wait(10)


def ready_pods(env: Env, selector: str) -> list[dict]:
    out = []
    for obj in env.kube.pods(NAMESPACE, selector):
        conditions = {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []}
        if conditions.get("Ready") == "True" and not obj["metadata"].get("deletionTimestamp"):
            out.append(obj)
    return out


@scenario("server-pod", phase=2, applies=_applies)
def server_pod(env: Env, rec: Record) -> None:
    """initshift's own Pods as installed (deploy/ and the chart: two replicas on the pod
    network; the chart also with `hostNetwork: true`), the image built from this machine's
    Python: they start as user 65532 on a read-only root, turn Ready through their HTTPS
    probes, take their certificate from the Secret, are rolled out again on the one node,
    one's watcher takes the Lease, and, the webhook named by its Service, they rewrite a
    build pod, which succeeds with the outcome their watcher writes."""
    assert env.registry is not None
    image = server_image()
    tag = image.ref.rsplit(":", 1)[1]
    env.registry.push(image, REPOSITORY, tag)
    ref = f"{env.registry.host}/{REPOSITORY}:{tag}"
    rec.note(f"{image.ref.split('/')[-1]} ({REPOSITORY}:{tag}): "
             + "; ".join(_serve(env, rec, shape, ref) for shape in shapes(env, ref)))


def _serve(env: Env, rec: Record, shape: _Shape, ref: str) -> str:
    """One shape served, checked and taken back; what it showed."""
    assert env.cluster is not None
    rendered = shape.objects
    original = {o["kind"]: o for o in env.install.objects if o["kind"] in ("Deployment", "Service")}
    config = next(o for o in env.install.objects if o["kind"] == "MutatingWebhookConfiguration")["metadata"]["name"]
    config_path = f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{config}"
    saved = env.kube.get(config_path)
    leader = ""
    selector = ",".join(f"{k}={v}" for k, v in rendered["Deployment"]["spec"]["selector"]["matchLabels"].items())
    manifest = env.install.dir / "server-pod.yaml"

    def apply(objects: list[dict]) -> None:
        manifest.write_text("\n---\n".join(json.dumps(o) for o in objects))
        kubectl(env.admin, "apply", "--server-side", "--force-conflicts", "--field-manager=initshift-e2e",
                "-f", str(manifest))

    def server_log(name: str) -> list[dict]:
        return [json.loads(line) for line in env.kube.logs(NAMESPACE, name, "initshift", timestamps=False)
                .splitlines() if line.startswith("{")]

    def logged(names: list[str], msg: str, timeout: float) -> tuple[str, dict]:
        """The first of these Pods to log `msg`, and its line."""
        def found() -> tuple[str, dict] | None:
            return next(((n, x) for n in names for x in server_log(n) if x.get("msg") == msg), None)
        return wait_for(found, timeout, f"{msg!r} in the log of {', '.join(names)}")

    def lease_pod(among: list[str]) -> tuple[str, str] | None:
        """The Pod among these whose watcher holds the Lease, by the identity its log says
        it leads as (a Pod on the node's network has the node's hostname): (its name, the
        identity)."""
        holder = env.install.lease_holder(env.kube)
        return next(((name, holder) for name in among if holder and any(
            x.get("msg") == "leading" and x.get("identity") == holder for x in server_log(name))), None)

    def all_ready(old: set[str]) -> list[dict] | None:
        ready = [x for x in ready_pods(env, selector) if x["metadata"]["name"] not in old]
        return ready if len(ready) == shape.replicas else None

    if shape.host_network:  # it leaves the restricted Pod Security Standard (docs/install.md, Helm values)
        kubectl(env.admin, "label", "--overwrite", "namespace", NAMESPACE,
                "pod-security.kubernetes.io/enforce=privileged")
    try:
        apply(list(rendered.values()))
        started = time.monotonic()
        try:
            servers = wait_for(lambda: all_ready(set()), POD_START_TIMEOUT, "initshift's own Pods Ready", interval=1.0)
        except Exception:
            for obj in env.kube.pods(NAMESPACE, selector):
                name = obj["metadata"]["name"]
                rec.details += [f"pod {name}: {json.dumps(obj.get('status'))}",
                                *env.kube.logs(NAMESPACE, name, "initshift").splitlines()[-30:]]
            raise
        ready_after = time.monotonic() - started
        for server in servers:
            spec = server["spec"]["containers"][0]
            assert bool(server["spec"].get("hostNetwork")) == shape.host_network, server["spec"]
            assert spec["securityContext"].get("readOnlyRootFilesystem"), spec
        names = [x["metadata"]["name"] for x in servers]
        ensured = {n: logged([n], "certificates ensured", 30)[1] for n in names}
        # A rolling update on this one node: a surge Pod first on the pod network; with
        # hostNetwork in place (a Pod on the node's network holds its ports).
        deployment = f"deployment/{rendered['Deployment']['metadata']['name']}"
        rolled = time.monotonic()
        kubectl(env.admin, "-n", NAMESPACE, "rollout", "restart", deployment)
        kubectl(env.admin, "-n", NAMESPACE, "rollout", "status", deployment, "--timeout=100s")  # the helper waits 120 s
        rolled = time.monotonic() - rolled
        for old in names:  # each old Pod's preStop hook (the image's Python sleeping) ran; a failed one is an event
            hooks = [e for e in env.kube.events(NAMESPACE, old) if "PreStopHook" in (e.get("reason") or "")]
            assert not hooks, hooks
        servers = wait_for(lambda: all_ready(set(names)), 60, "the rolled-out Pods Ready", interval=1.0)
        names = [x["metadata"]["name"] for x in servers]
        for n in names:
            logged([n], "certificates ensured", 30)
        # A Pod's watcher (`serve --watch`) takes the Lease once this machine's lets it go.
        assert env.install.watcher is not None
        env.install.watcher.stop()
        leading, leader = wait_for(lambda: lease_pod(names), 60, "a Pod's watcher leading")
        # The webhook by its Service: the apiserver calls the Pods, not this machine's server.
        by_service = copy.deepcopy(env.kube.get(config_path))  # the Pods may have written its caBundle
        for wh in by_service["webhooks"]:
            wh["clientConfig"] = {"service": {"namespace": NAMESPACE, "name": rendered["Service"]["metadata"]["name"],
                                              "port": 443, "path": "/mutate"},
                                  "caBundle": wh["clientConfig"]["caBundle"]}
        env.kube.request("PUT", config_path, body=by_service)
        ns = env.namespace("server-pod-host" if shape.host_network else "server-pod")
        rec.namespaces.append(ns)
        env.kube.create(f"/api/v1/namespaces/{ns}/pods", pod(
            "build", [step("fetch", env.images.busybox, port=ISTIO_TRAFFIC)],
            [step("completion", env.images.busybox, port=None)]))
        build = check_build(env, rec, ns, "build", steps=["fetch"], proxy="istio-proxy", strategy=env.build_strategy)
        result = outcome(env.kube, ns, "build")  # written by the leading Pod's watcher, the only one leading
        assert result["result"] == "Succeeded", result
        workstation = _checked_from_a_workstation(env, rendered["Service"]["metadata"]["name"], ns)
        reviews = [x for n in names for x in server_log(n) if x.get("namespace") == ns and x.get("pod") == "build"]
        patched = next((x for x in reviews if x.get("decision") == "patched"), None)
        assert patched, reviews or [server_log(n)[-5:] for n in names]
        assert not any(f'"namespace":"{ns}"' in line for line in env.install.server.log.read_text(
            errors="replace").splitlines()), "this machine's server reviewed the pod, not initshift's own Pods"
        images = {c["image"] for c in [*build.obj["spec"].get("initContainers", []), *build.obj["spec"]["containers"]]
                  if c["name"].startswith("initshift-")}
        assert images == {ref}, images
        # Prometheus scrapes each Pod's address (the node's, on hostNetwork) on the metrics port.
        scrapes = [httpx.get(f"http://{x['status']['podIP']}:{shape.metrics_port}/metrics", timeout=10)
                   for x in servers]
        assert all(x.status_code == 200 and "initshift_admission_requests_total" in x.text for x in scrapes), scrapes
        assert any('initshift_admission_requests_total{outcome="patched"}' in x.text for x in scrapes)
        errors, warnings = [], set()
        for n in names:
            status = env.kube.pod(NAMESPACE, n)["status"]["containerStatuses"][0]
            errors += [x for x in server_log(n) if x.get("level") in ("error", "critical")]
            assert status["restartCount"] == 0, status
            warnings |= {str(x.get("msg")) for x in server_log(n) if x.get("level") == "warning"}
        assert not errors, errors
        handover = ""
        if len(names) > 1:
            # Two replicas are replaced one after the other while reviews stream in: each
            # one is answered (a replica told to stop serves through its preStop sleep).
            reviewed, unchanged, took = _rollout_under_reviews(env, ns, deployment)
            assert not unchanged, f"{len(unchanged) - 1} of {reviewed} pods admitted unchanged during a rollout " \
                                  f"({took:.1f} s): {'; '.join(unchanged)}"
            old_names = set(names)
            names = [x["metadata"]["name"] for x in wait_for(lambda: all_ready(old_names), 60, "the new Pods Ready")]
            leading, leader = wait_for(lambda: lease_pod(names), 60, "a new Pod's watcher leading")
            handover = f"; a rollout ({took:.1f} s) under {reviewed} reviews: none admitted unchanged"
            # The leading Pod deleted (a drain, a rollout): another's watcher takes the Lease
            # once the leader gives it up at its SIGTERM, after its preStop sleep, and finishes
            # a build created meanwhile.
            deleted = time.monotonic()
            kubectl(env.admin, "-n", NAMESPACE, "delete", "pod", leading, "--wait=false")
            env.kube.create(f"/api/v1/namespaces/{ns}/pods", pod(
                "build-2", [step("fetch", env.images.busybox, port=ISTIO_TRAFFIC)],
                [step("completion", env.images.busybox, port=None)]))
            # The other replica, or the one replacing the deleted Pod, whichever acquires first.
            others = lambda: [x["metadata"]["name"] for x in env.kube.pods(NAMESPACE, selector)  # noqa: E731
                              if x["metadata"]["name"] != leading]
            taker, leader = wait_for(lambda: lease_pod(others()), 60, "another Pod's watcher leading")
            took = time.monotonic() - deleted
            check_build(env, rec, ns, "build-2", steps=["fetch"], proxy="istio-proxy", strategy=env.build_strategy)
            second = outcome(env.kube, ns, "build-2")
            assert second["result"] == "Succeeded", second
            handover += f"; the leader deleted, {taker}'s watcher leading {took:.1f} s later (the leader kept the " \
                       f"Lease through its preStop sleep), a build meanwhile {second['result']}"
        memory = [env.cluster.pod_memory(x["metadata"]["uid"]) for x in ready_pods(env, selector)]
        handover += "; memory (working set, peak): " + ", ".join(
            f"{m[0] / 2**20:.0f}/{m[1] / 2**20:.0f} MiB" if m else "not found" for m in memory)
        if not shape.host_network:
            serving = wait_for(lambda: all_ready(set()), 60, "every replica Ready", interval=1.0)
            crashed = _crash_seen_by_check(env, deployment, selector, {x["metadata"]["name"] for x in serving})
    finally:
        env.kube.request("PUT", config_path, body={**saved, "metadata": {
            **saved["metadata"], "resourceVersion": env.kube.get(config_path)["metadata"]["resourceVersion"]}})
        apply(list(original.values()))
        wait_for(lambda: not env.kube.pods(NAMESPACE, selector), 60, "initshift's own Pods gone", interval=1.0)
        if shape.host_network:
            kubectl(env.admin, "label", "--overwrite", "namespace", NAMESPACE,
                    "pod-security.kubernetes.io/enforce=restricted")
        if env.install.watcher is not None and not env.install.watcher.alive():
            env.install.start_watcher()
        # The Lease back with this machine's watcher (the Pod's gives it up at its SIGTERM).
        wait_for(lambda: env.install.lease_holder(env.kube) not in ("", leader) or None, 60,
                 "this machine's watcher leading")
    where = "on the node's network, rolled out again in place" if shape.host_network else \
        "on the pod network, rolled out again with a surge Pod"
    return (f"{shape.what} x{shape.replicas} Ready {ready_after:.1f} s after the apply, certificates "
            f"{sorted({x.get('action') for x in ensured.values()})}, {where} in {rolled:.1f} s (preStop hook 5 s), "
            f"{leading}'s watcher leading; by its Service: {len(reviews)} reviews, the build {patched['decision']} "
            f"({patched['reason']}), {managed(build.obj)}, outcome {result['result']}; their logs: no error, "
            f"warnings {len(warnings)}; {workstation}{handover}"
            + ("" if shape.host_network else f"; a new Pod that cannot start: check says {crashed!r}"))
