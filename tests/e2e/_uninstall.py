"""docs/install.md's Uninstall, command by command, on the real cluster: the last scenario
(phase 3), as it takes initshift away. The Deployment's stand-in, this machine's server
and watcher, stops where deleting the Deployment would stop its Pods."""

from __future__ import annotations

import json

from waiter import protocol as p

from ._check import check_build
from ._env import Env, Record, scenario
from ._install import NAMESPACE
from ._kube import kubectl, wait_for
from ._mesh import ISTIO_TRAFFIC
from ._pods import annotations, managed, outcome, pod, step

STEPS = ["fetch", "compile", "test"]
# What the docs wait for: the pods whose ready gate and outcome the watcher writes. Native
# and start-order pods run on without initshift (a Deployment's never end).
WAITED = f"{p.LABEL_MANAGED} in ({p.MODE_WAITER},{p.MODE_HYBRID})"
UNFINISHED = "status.phase!=Succeeded,status.phase!=Failed"  # until none is left
# What kube-controller-manager puts in every namespace (the service-CA publisher's too, on
# v1.34.9 here).
KUBERNETES_OWN = {("ConfigMap", "kube-root-ca.crt"), ("ConfigMap", "openshift-service-ca.crt"),
                  ("ServiceAccount", "default")}


def names(env: Env, *args: str) -> list[str]:
    """`kubectl get ARGS -o name`, one `kind/name` a line."""
    return kubectl(env.admin, "get", *args, "-o", "name").stdout.split()


_KINDS = {"secret": "Secret", "lease.coordination.k8s.io": "Lease", "configmap": "ConfigMap",
          "serviceaccount": "ServiceAccount"}


def left_in_namespace(env: Env) -> set[tuple[str, str]]:
    """(Kind, name) of what is left in initshift's namespace, but what Kubernetes puts there."""
    left = {tuple(x.split("/", 1)) for x in names(env, "-n", NAMESPACE, "secrets,leases,configmaps,serviceaccounts,"
                                                   "services,deployments,roles,rolebindings")}
    return {(_KINDS.get(kind, kind), name) for kind, name in left} - KUBERNETES_OWN


def left_in_cluster(env: Env) -> list[str]:
    """initshift's cluster-wide objects and its namespace, where any is left."""
    return [n for n in names(env, "clusterroles,clusterrolebindings,mutatingwebhookconfigurations")
            if "initshift" in n] + names(env, "namespaces", "--field-selector", f"metadata.name={NAMESPACE}")


@scenario("uninstall", phase=3)
def uninstall(env: Env, rec: Record) -> None:
    """docs/install.md's uninstall with a build running: the webhook configuration first (a
    pod created next is admitted unchanged, the running build ends with its outcome), the
    install's objects, then what Helm does not know, the opt-in label: nothing is left."""
    ns = env.namespace("uninstall")
    rec.namespaces.append(ns)
    steps = [step(s, env.images.busybox, port=ISTIO_TRAFFIC, sleep=2) for s in STEPS]
    env.kube.create(f"/api/v1/namespaces/{ns}/pods", pod("running", steps, [step("completion", env.images.busybox,
                                                                                port=None)]))
    if env.native:  # a long-running pod with an init step: native, and it never ends
        env.kube.create(f"/api/v1/namespaces/{ns}/pods", pod(
            "service", [step("migrate", env.images.busybox, port=ISTIO_TRAFFIC)],
            [step("serve", env.images.busybox, port=None, sleep=3600)], restart="Always"))
    wait_for(lambda: any(s.get("state", {}).get("running") and s["name"] == "fetch" for s in (
        (env.kube.pod(ns, "running") or {}).get("status", {}).get("containerStatuses") or [])), 120, "step 0 running")
    config = next(o for o in env.install.objects if o["kind"] == "MutatingWebhookConfiguration")["metadata"]["name"]
    kubectl(env.admin, "delete", "mutatingwebhookconfiguration", config)
    after = pod("after", [step("fetch", env.images.busybox, port=None)], [step("completion", env.images.busybox,
                                                                                port=None)])
    pods = f"/api/v1/namespaces/{ns}/pods"
    # The apiserver drops the configuration from its webhooks a moment later (an informer):
    # dry runs until one is admitted without initshift, then the pod itself.
    wait_for(lambda: not managed(env.kube.request("POST", pods, body=after, params={"dryRun": "All"})), 10,
             "a pod admitted without initshift", interval=0.2)
    created = env.kube.create(pods, after)
    assert not managed(created) and not any(k.startswith("initshift.io/") for k in annotations(created)), \
        created["metadata"]
    # `kubectl get pods -A -l ... --field-selector ...`: the running build is listed; pods
    # that never end are not, nor the builds that have ended.
    waited = names(env, "pods", "-A", "-l", WAITED, "--field-selector", UNFINISHED)
    assert "pod/running" in waited, waited
    everlasting = [x["metadata"]["name"] for x in json.loads(kubectl(
        env.admin, "get", "pods", "-A", "-l", p.LABEL_MANAGED, "-o", "json").stdout)["items"]
        if x["metadata"]["labels"][p.LABEL_MANAGED] not in (p.MODE_WAITER, p.MODE_HYBRID)]
    assert ("service" in everlasting) == env.native and "pod/service" not in waited, (everlasting, waited)
    build = check_build(env, rec, ns, "running", steps=STEPS, proxy="istio-proxy", strategy=env.build_strategy)
    result = outcome(env.kube, ns, "running")
    assert result["result"] == "Succeeded", result
    wait_for(lambda: "pod/running" not in names(env, "pods", "-A", "-l", WAITED, "--field-selector", UNFINISHED),
             30, "the ended build gone from the list the docs wait on")
    # The install's objects (`kubectl delete -k`, or what `helm uninstall` deletes): the
    # Deployment's Pods, here this machine's server and watcher, stop with it.
    env.install.stop()
    manifest = env.install.dir / "install.yaml"
    # (`--ignore-not-found`: the webhook configuration is among them and already gone;
    # without it kubectl reports NotFound and exits 1.)
    kubectl(env.admin, "delete", "-f", str(manifest), "--ignore-not-found", "--wait=true", "--timeout=120s")
    if env.install.made_namespace:  # Helm: the chart brings no Namespace
        left = left_in_namespace(env)
        tls, lease = env.install.env_of(next(o for o in env.install.objects if o["kind"] == "Deployment")).get(
            "INITSHIFT_CERT_SECRET", "initshift-tls"), "initshift-watcher"
        assert left == {("Secret", tls), ("Lease", lease)}, f"left after the chart's objects: {sorted(left)}"
        kubectl(env.admin, "-n", NAMESPACE, "delete", f"secret/{tls}", f"lease/{lease}")
        kubectl(env.admin, "delete", "namespace", NAMESPACE, "--wait=true", "--timeout=120s")
        env.install.made_namespace = False
    kubectl(env.admin, "label", "namespace", ns, f"{p.LABEL_NAMESPACE_ENABLED}-")
    if env.native:  # it runs on without initshift
        service = env.kube.pod(ns, "service") or {}
        assert managed(service) == p.MODE_NATIVE and service["status"]["phase"] == "Running", service.get("status")
    leftovers = left_in_cluster(env)
    assert not leftovers, leftovers
    rec.note(f"{managed(build.obj)} build running at the webhook configuration's deletion: outcome "
             f"{result['result']}; a pod created after it admitted unchanged; `-l '{WAITED}'` lists it; `-l "
             f"{p.LABEL_MANAGED}` also {len(everlasting)} native or start-order pods, which never end"
             f"{' (a native one of its own, still Running after)' if env.native else ''}; nothing of initshift left "
             f"({env.install.flavour})")
