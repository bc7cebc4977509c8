"""The chart as a Helm release, after the documented uninstall took the e2e's install away
(phase 4): docs/install.md's Install, Upgrade and Uninstall with Helm's own engine
(helm-python-sdk's install, upgrade (the values given again) and uninstall: releases kept in the
cluster as Helm keeps them), the image built from this machine's Python (_serverpod.py) in
the run's registry. Between them, the release's own Pods rewrite build pods by the Service."""

from __future__ import annotations

import time

import helm_python

from waiter import protocol as p

from tests.support.deploy_render import CHART

from ._check import check_build
from ._env import Env, Record, scenario
from ._images import server_image
from ._install import NAMESPACE
from ._kube import PodWatch, kubectl, wait_for
from ._mesh import ISTIO_TRAFFIC
from ._pods import managed, outcome, pod, step, wait_end
from ._secondday import Builds, summary
from ._serverpod import POD_START_TIMEOUT, REPOSITORY
from ._uninstall import UNFINISHED, WAITED, left_in_cluster, left_in_namespace, names

RELEASE = "initshift"
PROXY = "envoy"  # a proxy name the chart's default sidecarNames lacks, given by helm upgrade
PROXY_READY, PROXY_QUIT, PROXY_TRAFFIC = 9901, 9902, 10000


def _applies(env: Env) -> bool:
    """the Helm install, on a cluster this run starts, with its local registry"""
    return env.install.flavour == "helm" and env.cluster is not None and env.registry is not None


def _build(env: Env, rec: Record, ns: str, name: str) -> str:
    """A build pod created, rewritten by the release's Pods, ended Succeeded with the outcome
    their watcher writes: its strategy."""
    env.kube.create(f"/api/v1/namespaces/{ns}/pods", pod(
        name, [step("fetch", env.images.busybox, port=ISTIO_TRAFFIC)], [step("completion", env.images.busybox,
                                                                               port=None)]))
    build = check_build(env, rec, ns, name, steps=["fetch"], proxy="istio-proxy", strategy=env.build_strategy)
    assert outcome(env.kube, ns, name)["result"] == "Succeeded"
    return str(build.obj["metadata"]["labels"][p.LABEL_MANAGED])


def _images(env: Env) -> set[str]:
    """The images of the release's running Pods."""
    return {c["image"] for x in env.kube.pods(NAMESPACE, f"app.kubernetes.io/instance={RELEASE}")
            if x["status"].get("phase") == "Running" and not x["metadata"].get("deletionTimestamp")
            for c in x["spec"]["containers"]}


def _replica_sets(env: Env) -> dict[str, int]:
    """The pod-template hash of each of the release's running Pods -> how many are Ready."""
    hashes: dict[str, int] = {}
    for x in env.kube.pods(NAMESPACE, f"app.kubernetes.io/instance={RELEASE}"):
        if x["metadata"].get("deletionTimestamp") or x["status"].get("phase") != "Running":
            continue
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in x["status"].get("conditions") or [])
        key = x["metadata"]["labels"]["pod-template-hash"]
        hashes[key] = hashes.get(key, 0) + ready
    return hashes


def _container(env: Env) -> dict:
    deployment = env.kube.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{RELEASE}")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _settings(env: Env, rec: Record, helm: helm_python.Config, values: dict, ns: str) -> str:
    """`helm upgrade` of values other than the image: `replicas` 2 -> 3 (a scale, no
    rollout), then back to 2 with a new proxy name in `sidecarNames` (its quit endpoint in
    `quitEndpoints`) and other `resources` (a rollout) while build pods are created: every
    one rewritten and Succeeded; a build pod carrying that proxy, admitted as written before,
    is then rewritten with it as its sidecar and Succeeds."""
    before = _replica_sets(env)
    assert list(before.values()) == [2], before
    values["replicas"] = 3
    helm.upgrade(CHART, RELEASE, values, namespace=NAMESPACE, wait="watcher", timeout=int(POD_START_TIMEOUT))
    scaled = wait_for(lambda: (x := _replica_sets(env)) == {k: 3 for k in before} and x or None, 60,
                      "3 replicas Ready, same template")
    resources = {"requests": {"cpu": "150m", "memory": "192Mi"}, "limits": {"memory": "512Mi"}}
    values |= {"replicas": 2, "sidecarNames": ["istio-proxy", "linkerd-proxy", PROXY],
               "quitEndpoints": {PROXY: f"http://127.0.0.1:{PROXY_QUIT}/quitquitquit"}, "resources": resources}
    own = env.namespace("helm-own-proxy", mesh=None)
    rec.namespaces.append(own)
    own_pod = pod("own-proxy", [step("fetch", env.images.busybox, port=PROXY_TRAFFIC)],
                  [step("completion", env.images.busybox, port=None), _own_proxy(env)])
    # Before: PROXY is no sidecar of initshift's, the pod is admitted as written (its step,
    # an init container, runs before the proxy: its call is refused).
    env.kube.create(f"/api/v1/namespaces/{own}/pods", {**own_pod, "metadata": {
        **own_pod["metadata"], "name": "own-proxy-before"}})
    fail_open = env.kube.fail_open_count()
    outcomes = PodWatch(env.admin, [ns], p.ANNOTATION_OUTCOME)
    try:
        builds = Builds(env, ns, "settings")
        started = time.monotonic()
        builds.during(lambda: helm.upgrade(CHART, RELEASE, values, namespace=NAMESPACE, wait="watcher",
                                           timeout=int(POD_START_TIMEOUT)), every=1.5)
        rolled = time.monotonic() - started
        after = wait_for(lambda: (x := _replica_sets(env)) and len(x) == 1 and list(x.values()) == [2]
                         and x or None, 90, "2 replicas Ready of one new template")
        assert not set(after) & set(before), f"no rollout: {before} -> {after}"
        container = _container(env)
        assert container["resources"] == resources, container["resources"]
        names = next(e["value"] for e in container["env"] if e["name"] == "INITSHIFT_SIDECAR_NAMES")
        assert names == f"istio-proxy,linkerd-proxy,{PROXY}", names
        pods = builds.ended(outcomes, timeout=180)
        unchanged = [n for n, x in pods.items() if not managed(x)]
        assert all(x["status"]["phase"] == "Succeeded" for x in pods.values() if managed(x)), summary(pods)
    finally:
        outcomes.close()
    fail_open = env.kube.fail_open_count() - fail_open
    before_pod = wait_end(env.kube, own, "own-proxy-before")
    assert (managed(before_pod), before_pod["status"]["phase"]) == (None, "Failed"), \
        f"own-proxy-before: {managed(before_pod)} {before_pod['status']['phase']}"
    env.kube.create(f"/api/v1/namespaces/{own}/pods", own_pod)
    build = check_build(env, rec, own, "own-proxy", steps=["fetch"], proxy=PROXY, strategy=env.build_strategy)
    result = outcome(env.kube, own, "own-proxy")
    assert result["result"] == "Succeeded", result
    return (f"helm upgrade replicas=3: {sum(scaled.values())} Ready, no rollout; replicas=2 with sidecarNames "
            f"+{PROXY}, resources cpu 150m: rolled out in {rolled:.0f} s under {len(pods)} builds ({summary(pods)}, "
            f"{len(unchanged)} admitted unchanged, {fail_open} review failed open); a build with its own {PROXY}: "
            f"before, admitted unchanged and Failed (its step's call refused), after, rewritten "
            f"({managed(build.obj)}) and Succeeded")


def _own_proxy(env: Env) -> dict:
    """A proxy the build pod carries itself (no mesh injects it), named `PROXY`."""
    return {"name": PROXY, "image": env.images.proxy, "imagePullPolicy": "IfNotPresent",
            "args": ["--name", PROXY, "--ready-after", "1.5", "--ready", f"{PROXY_READY}:/ready",
                     "--quit", f"{PROXY_QUIT}:/quitquitquit", "--traffic", str(PROXY_TRAFFIC)],
            "readinessProbe": {"httpGet": {"path": "/ready", "port": PROXY_READY}, "periodSeconds": 1}}


@scenario("helm-release", phase=4, applies=_applies)
def helm_release(env: Env, rec: Record) -> None:
    """docs/install.md with Helm's own engine, after the uninstall: `helm install` into the
    labelled namespace (its Pods Ready, a build rewritten by them), `helm upgrade` with the
    install's values and `image.tag=NEW` (the Pods rolled to the new tag, the values kept, a
    build rewritten), then the Helm uninstall: nothing of initshift left."""
    assert env.registry is not None
    image = server_image()
    tag = image.ref.rsplit(":", 1)[1]
    for t in (tag, f"{tag}-next"):
        env.registry.push(image, REPOSITORY, t)
    repository = f"{env.registry.host}/{REPOSITORY}"
    ns = env.namespace("helm-release")
    rec.namespaces.append(ns)
    kubectl(env.admin, "create", "namespace", NAMESPACE)
    kubectl(env.admin, "label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=restricted")
    with helm_python.Config(kubeconfig_path=str(env.admin), namespace=NAMESPACE) as helm:
        try:
            values = {"image": {"repository": repository, "tag": tag}, "logLevel": "debug"}
            helm.install(CHART, RELEASE, values, namespace=NAMESPACE, wait="watcher", timeout=int(POD_START_TIMEOUT))
            assert _images(env) == {f"{repository}:{tag}"}, _images(env)
            first = _build(env, rec, ns, "build")
            # As docs/install.md upgrades: the install's values given again, the tag moved.
            values["image"] = {"repository": repository, "tag": f"{tag}-next"}
            helm.upgrade(CHART, RELEASE, values, namespace=NAMESPACE, wait="watcher", timeout=int(POD_START_TIMEOUT))
            # Helm keeps each revision of a release as a Secret of its own.
            revisions = sorted(n for n in names(env, "-n", NAMESPACE, "secrets") if f".{RELEASE}.v" in n)
            assert revisions == [f"secret/sh.helm.release.v1.{RELEASE}.v{i}" for i in (1, 2)], revisions
            wait_for(lambda: _images(env) == {f"{repository}:{tag}-next"}, 60, "only the new tag's Pods running")
            deployment = kubectl(env.admin, "-n", NAMESPACE, "get", "deployment", RELEASE, "-o",
                                 "jsonpath={.spec.template.spec.containers[0].env[?(@.name=='INITSHIFT_LOG_LEVEL')]"
                                 ".value}").stdout
            assert deployment == "debug", f"the upgrade lost logLevel: {deployment!r}"
            second = _build(env, rec, ns, "build-2")
            settings = _settings(env, rec, helm, values, ns)
            # The Helm uninstall, as docs/install.md writes it.
            kubectl(env.admin, "delete", "mutatingwebhookconfiguration", "initshift-webhook")
            assert not names(env, "pods", "-n", ns, "-l", WAITED, "--field-selector", UNFINISHED)
            helm.uninstall(RELEASE, wait="watcher", timeout=120)
        except BaseException:
            helm.uninstall(RELEASE, ignore_not_found=True)
            raise
    left = left_in_namespace(env)
    assert left == {("Secret", "initshift-tls"), ("Lease", "initshift-watcher")}, f"left by helm uninstall: {left}"
    kubectl(env.admin, "-n", NAMESPACE, "delete", "secret/initshift-tls", "lease/initshift-watcher")
    kubectl(env.admin, "delete", "namespace", NAMESPACE, "--wait=true", "--timeout=120s")
    leftovers = left_in_cluster(env)
    assert not leftovers, leftovers
    rec.note(f"helm install (Pods of {tag}): {first} build Succeeded; helm upgrade image.tag={tag}-next "
             f"(revision 2, logLevel kept): {second} build Succeeded; {settings}; helm uninstall left the Secret "
             f"and the Lease the docs name, then nothing")
