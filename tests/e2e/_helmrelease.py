"""The chart as a Helm release, after the documented uninstall took the e2e's install away
(phase 4): docs/install.md's Install, Upgrade and Uninstall with Helm's own engine
(helm-python-sdk's install, upgrade (the values given again) and uninstall: releases kept in the
cluster as Helm keeps them), the image built from this machine's Python (_serverpod.py) in
the run's registry. Between them, the release's own Pods rewrite build pods by the Service."""

from __future__ import annotations

import helm_python

from waiter import protocol as p

from tests.support.deploy_render import CHART

from ._check import check_build
from ._env import Env, Record, scenario
from ._images import server_image
from ._install import NAMESPACE
from ._kube import kubectl, wait_for
from ._mesh import ISTIO_TRAFFIC
from ._pods import outcome, pod, step
from ._serverpod import POD_START_TIMEOUT, REPOSITORY
from ._uninstall import UNFINISHED, WAITED, left_in_cluster, left_in_namespace, names

RELEASE = "initshift"


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
             f"(revision 2, logLevel kept): {second} build Succeeded; helm uninstall left the Secret and the Lease "
             f"the docs name, then nothing")
