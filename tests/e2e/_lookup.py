"""Entrypoint lookup on a real cluster: steps without `command`, whose image's ENTRYPOINT the
server reads from a registry, pulled by the node from that same registry.

The registry is Debian's `docker-registry` on 127.0.0.1 with TLS from a CA of its own
(tests/support/registryd.py), twice on one storage: anonymous, and private (htpasswd,
reached with a pod's imagePullSecrets). The node's containerd trusts both through a
`hosts.toml` each in its `certs.d`, the server through INITSHIFT_REGISTRY_CA_FILE. Only on
the throwaway cluster (a cluster named by KUBECONFIG has no such registry).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import gzip
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from tests.support import registryd
from tests.support.k8s import ClusterError, Image, busybox_image
from waiter import protocol as p

from ._check import check_build, proxy_stop
from ._env import Env, Record, check_report, scenario
from ._images import initshift_image
from ._install import NAMESPACE, SERVICE_ACCOUNT, server_env
from ._kube import KubeFailure, kubectl, wait_for
from ._mesh import ISTIO_TRAFFIC
from ._pods import managed, outcome, pod, statuses, step

ENTRYPOINT = ["/bin/sh", "-c"]  # the image's: a step's `args` are the script
REPOSITORY, TAG = "tools/sh", "1"


@dataclass(frozen=True)
class LocalRegistry:
    host: str  # 127.0.0.1:PORT, anonymous
    private_host: str  # 127.0.0.1:PORT, the same images behind a user and password
    ca_file: Path
    origin: registryd.Registry = field(repr=False, compare=False)  # the anonymous one, to push to

    @property
    def image(self) -> str:
        return f"{self.host}/{REPOSITORY}:{TAG}"

    @property
    def private_image(self) -> str:
        return f"{self.private_host}/{REPOSITORY}:{TAG}"

    def push(self, image: Image, repository: str, tag: str) -> None:
        """`image` as one gzipped layer (both hosts serve it: they share one storage)."""
        layer = image.layer()
        config, blob = image.config_json(layer), gzip.compress(layer, compresslevel=1, mtime=0)
        pusher = registryd.Pusher(self.origin)
        try:
            doc = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                   "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "size": len(config),
                              "digest": pusher.blob(repository, config)},
                   "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "size": len(blob),
                               "digest": pusher.blob(repository, blob)}]}
            pusher.manifest(repository, tag, doc)
        finally:
            pusher.close()


@contextlib.contextmanager
def local_registry(hosts_dir: Path) -> Iterator[LocalRegistry]:
    """The registry, its image pushed, trusted by the node (`make e2e` installs
    docker-registry; without it the run fails, as without containerd)."""
    root = Path(tempfile.mkdtemp(prefix="initshift-e2e-registry-"))
    registries: list[registryd.Registry] = []
    try:
        pki = registryd.Pki(root / "pki")
        try:
            for auth in ("none", "htpasswd"):
                registries.append(registryd.Registry(root, pki, root / "storage", auth=auth))
        except registryd.RegistryUnavailable as e:
            raise ClusterError(f"the e2e's registry: {e}") from None
        local = LocalRegistry(registries[0].host, registries[1].host, pki.ca_file, registries[0])
        # busybox with an ENTRYPOINT and no CMD: a step's `args` are its script
        local.push(dataclasses.replace(busybox_image(), entrypoint=ENTRYPOINT, cmd=None), REPOSITORY, TAG)
        for registry in registries:
            hosts = hosts_dir / registry.host
            hosts.mkdir(parents=True)
            (hosts / "hosts.toml").write_text(f'server = "{registry.url}"\n\n[host."{registry.url}"]\n'
                                              f'  capabilities = ["pull", "resolve"]\n  ca = "{pki.ca_file}"\n')
        yield local
    finally:
        for registry in registries:
            registry.stop()
        shutil.rmtree(root, ignore_errors=True)


def _has_registry(env: Env) -> bool:
    """the run's local registry (a cluster this run starts)"""
    return env.registry is not None


def _lookup_build(env: Env, rec: Record, ns: str, image: str, **spec: object) -> str:
    """A build whose steps have no `command`, their `image` pulled; checked to its end."""
    steps = []
    for name in ("fetch", "compile"):
        s = step(name, image, port=ISTIO_TRAFFIC)
        s["args"] = [s.pop("command")[-1]]  # the script alone: `sh -c` comes from the image
        steps.append(s)
    env.kube.create(f"/api/v1/namespaces/{ns}/pods", pod(
        "build", steps, [step("completion", env.images.busybox, port=None)], **spec))
    build = check_build(env, rec, ns, "build", steps=["fetch", "compile"], proxy="istio-proxy",
                        strategy=env.build_strategy)
    spec_out = build.obj["spec"]
    wrapped = next(c for c in [*spec_out.get("initContainers", []), *spec_out["containers"]] if c["name"] == "fetch")
    assert wrapped["args"][-3:-1] == ENTRYPOINT, f"fetch is not run as its image's ENTRYPOINT: {wrapped['args']}"
    result = outcome(env.kube, ns, "build")
    assert result["result"] == "Succeeded", result
    return f"strategy {managed(build.obj)}; steps in order through the proxy; proxy stopped by " \
           f"{proxy_stop(build, 'istio-proxy')}"


@scenario("entrypoint-lookup", applies=_has_registry)
def entrypoint_lookup(env: Env, rec: Record) -> None:
    """Steps without `command` (only `args`) in an image from a TLS registry: the server
    reads the image's ENTRYPOINT from the registry and wraps it, the node pulls the same
    image, the steps run in order through the proxy as `ENTRYPOINT + args`."""
    assert env.registry is not None
    ns = env.namespace("lookup")
    rec.namespaces.append(ns)
    rec.note(f"ENTRYPOINT {ENTRYPOINT} read from {env.registry.host}; "
             + _lookup_build(env, rec, ns, env.registry.image))


def _has_private_registry(env: Env) -> bool:
    """the run's local registry and the Helm install's pull secrets"""
    return env.registry is not None and env.install.pull_secrets


def _pull_secret(env: Env, ns: str, name: str, host: str | None = None) -> None:
    """A `kubernetes.io/dockerconfigjson` Secret for `host` (default: the private registry)."""
    assert env.registry is not None
    auth = base64.b64encode(f"{registryd.USER}:{registryd.PASSWORD}".encode()).decode()
    config = json.dumps({"auths": {host or env.registry.private_host: {"auth": auth}}})
    env.kube.create(f"/api/v1/namespaces/{ns}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
        "type": "kubernetes.io/dockerconfigjson", "data": {".dockerconfigjson": base64.b64encode(config.encode()).decode()}})


@scenario("private-registry", applies=_has_private_registry)
def private_registry(env: Env, rec: Record) -> None:
    """The same from a registry that wants a user and password, given as the pod's
    imagePullSecrets (a `kubernetes.io/dockerconfigjson` Secret): the server, installed with
    registry pull secrets, reads the Secret to look the ENTRYPOINT up; the kubelet pulls
    with it. Without the Secret the same pod is denied, saying why, where the waiter is the
    only strategy; where the cluster runs native sidecars `auto` gives it native, which
    needs no ENTRYPOINT (its step stays an init container)."""
    assert env.registry is not None
    ns = env.namespace("private")
    rec.namespaces.append(ns)
    host = env.registry.private_host
    _pull_secret(env, ns, "registry")
    bare = step("fetch", env.registry.private_image, port=None)
    bare["args"] = [bare.pop("command")[-1]]
    no_secret = pod("no-secret", [bare], [step("main", env.images.busybox, port=None)])
    if env.native:
        created = env.kube.create(f"/api/v1/namespaces/{ns}/pods", no_secret)
        labels, init = created["metadata"].get("labels") or {}, created["spec"].get("initContainers") or []
        assert labels.get(p.LABEL_MANAGED) == p.MODE_NATIVE, labels
        fetch = next(c for c in init if c["name"] == "fetch")
        assert "command" not in fetch and fetch["args"] == bare["args"], fetch
        env.kube.delete(f"/api/v1/namespaces/{ns}/pods/no-secret")  # the kubelet cannot pull it without the Secret
        without = "native instead of hybrid"
    else:
        try:
            env.kube.create(f"/api/v1/namespaces/{ns}/pods", no_secret)
            raise AssertionError("a pod whose step's ENTRYPOINT the server cannot read was admitted")
        except KubeFailure as e:
            assert "ENTRYPOINT" in str(e) and "403" in str(e), str(e)
        without = "denied"
    rec.note(f"ENTRYPOINT read from {host} with the pod's imagePullSecrets; "
             + _lookup_build(env, rec, ns, env.registry.private_image, imagePullSecrets=[{"name": "registry"}])
             + f"; without the Secret: {without}")


def _own_container(obj: dict) -> dict:
    """The status of the pod's container of initshift's image (initshift-init, initshift-copy)."""
    st = statuses(obj)
    return st.get(p.INIT_CONTAINER_NAME) or st.get(p.COPY_CONTAINER_NAME) or {}


@scenario("private-initshift-image", phase=2, applies=_has_registry)
def private_initshift_image(env: Env, rec: Record) -> None:
    """initshift's own image in a registry that wants a password (INITSHIFT_IMAGE there, the
    server restarted with INITSHIFT_IMAGE_PULL_SECRETS): where the namespace has that Secret
    it joins the pod's own and the build ends well; where it has none the kubelet says so
    and initshift's container cannot be pulled."""
    assert env.registry is not None
    repository, tag = "platform/initshift", env.images.initshift.rsplit(":", 1)[1]
    env.registry.push(initshift_image(), repository, tag)
    image = f"{env.registry.private_host}/{repository}:{tag}"  # never pulled by this node before
    ns, bare = env.namespace("private-image"), env.namespace("no-pull-secret")
    rec.namespaces += [ns, bare]
    for where in (ns, bare):
        _pull_secret(env, where, "builds", "registry.example")  # the pod's own (its pushes), kept first
    _pull_secret(env, ns, "platform-registry")
    steps = [step("fetch", env.images.busybox, port=ISTIO_TRAFFIC)]
    build = pod("build", steps, [step("completion", env.images.busybox, port=None)],
                imagePullSecrets=[{"name": "builds"}])
    with env.install.serving_with(INITSHIFT_IMAGE=image, INITSHIFT_IMAGE_PULL_SECRETS="platform-registry,builds"):
        env.kube.create(f"/api/v1/namespaces/{bare}/pods", build)

        def refused() -> str | None:
            waiting = (_own_container(env.kube.pod(bare, "build") or {}).get("state") or {}).get("waiting") or {}
            return waiting.get("reason") if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff") else None

        without = wait_for(refused, 90, f"initshift's container of {bare}/build to fail its pull", interval=0.5)
        missing = [e for e in env.kube.events(bare, "build") if e.get("reason") == "FailedToRetrieveImagePullSecret"]
        assert missing and "platform-registry" in missing[0].get("message", ""), env.kube.events(bare, "build")
        env.kube.delete(f"/api/v1/namespaces/{bare}/pods/build")
        env.kube.create(f"/api/v1/namespaces/{ns}/pods", build)
        done = check_build(env, rec, ns, "build", steps=["fetch"], proxy="istio-proxy", strategy=env.build_strategy)
    secrets = done.obj["spec"].get("imagePullSecrets")
    assert secrets == [{"name": "builds"}, {"name": "platform-registry"}], secrets
    pulled = _own_container(done.obj)
    assert pulled.get("image", "").endswith(f"{repository}:{tag}"), pulled
    line = _check_pull_secrets(env, INITSHIFT_IMAGE=image, INITSHIFT_IMAGE_PULL_SECRETS="platform-registry,builds")
    assert not line["ok"] and f" {bare} (no Secret platform-registry; none holds an entry for the image's " \
        f"registry)" in line["title"] and f" {ns} (" not in line["title"], line
    rec.note(f"{image}: with INITSHIFT_IMAGE_PULL_SECRETS the pod's imagePullSecrets {[x['name'] for x in secrets]}, "
             f"{managed(done.obj)} build Succeeded; in a namespace without the Secret: {missing[0]['reason']}, "
             f"{without}, and `initshift check` names it")


def _check_pull_secrets(env: Env, **settings: str) -> dict:
    """`initshift check`'s line for INITSHIFT_IMAGE_PULL_SECRETS, with `settings` given to the
    Deployment (`kubectl set env`; it runs no replica here) and then taken back."""
    name = SERVICE_ACCOUNT  # deploy/ and the chart name the Deployment like the Service
    before = server_env(env.kube.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{name}"))
    deployment = f"deployment/{name}"
    kubectl(env.admin, "-n", NAMESPACE, "set", "env", deployment, *(f"{k}={v}" for k, v in settings.items()))
    try:
        report = check_report(env, "-n", NAMESPACE)[1]
    finally:
        kubectl(env.admin, "-n", NAMESPACE, "set", "env", deployment,
                *(f"{k}={before[k]}" if k in before else f"{k}-" for k in settings))
    lines = [x for x in report if x["title"].startswith("INITSHIFT_IMAGE_PULL_SECRETS")]
    assert len(lines) == 1, report
    return lines[0]
