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
import gzip
import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from tests.support import registryd
from tests.support.k8s import ClusterError, busybox_image

from ._check import check_build, proxy_stop
from ._env import Env, Record, scenario
from ._kube import KubeFailure
from ._mesh import ISTIO_TRAFFIC
from ._pods import managed, outcome, pod, step

ENTRYPOINT = ["/bin/sh", "-c"]  # the image's: a step's `args` are the script
REPOSITORY, TAG = "tools/sh", "1"


@dataclass(frozen=True)
class LocalRegistry:
    host: str  # 127.0.0.1:PORT, anonymous
    private_host: str  # 127.0.0.1:PORT, the same images behind a user and password
    ca_file: Path

    @property
    def image(self) -> str:
        return f"{self.host}/{REPOSITORY}:{TAG}"

    @property
    def private_image(self) -> str:
        return f"{self.private_host}/{REPOSITORY}:{TAG}"


def _push_busybox(registry: registryd.Registry) -> None:
    """busybox as one gzipped layer, its config naming ENTRYPOINT (no CMD)."""
    image = busybox_image()
    layer = image.layer()
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "config": {"Env": image.env, "Entrypoint": ENTRYPOINT},
                         "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]}},
                        sort_keys=True).encode()
    blob = gzip.compress(layer, mtime=0)
    pusher = registryd.Pusher(registry)
    try:
        doc = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
               "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "size": len(config),
                          "digest": pusher.blob(REPOSITORY, config)},
               "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "size": len(blob),
                           "digest": pusher.blob(REPOSITORY, blob)}]}
        pusher.manifest(REPOSITORY, TAG, doc)
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
        _push_busybox(registries[0])
        for registry in registries:
            hosts = hosts_dir / registry.host
            hosts.mkdir(parents=True)
            (hosts / "hosts.toml").write_text(f'server = "{registry.url}"\n\n[host."{registry.url}"]\n'
                                              f'  capabilities = ["pull", "resolve"]\n  ca = "{pki.ca_file}"\n')
        yield LocalRegistry(registries[0].host, registries[1].host, pki.ca_file)
    finally:
        for registry in registries:
            registry.stop()
        shutil.rmtree(root, ignore_errors=True)


def _has_registry(env: Env) -> bool:
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
    return env.registry is not None and env.install.pull_secrets


@scenario("private-registry", applies=_has_private_registry)
def private_registry(env: Env, rec: Record) -> None:
    """The same from a registry that wants a user and password, given as the pod's
    imagePullSecrets (a `kubernetes.io/dockerconfigjson` Secret): the server, installed with
    registry pull secrets, reads the Secret to look the ENTRYPOINT up; the kubelet pulls
    with it. Without the Secret the same pod is denied, saying why."""
    assert env.registry is not None
    ns = env.namespace("private")
    rec.namespaces.append(ns)
    host = env.registry.private_host
    auth = base64.b64encode(f"{registryd.USER}:{registryd.PASSWORD}".encode()).decode()
    config = json.dumps({"auths": {host: {"auth": auth}}})
    env.kube.create(f"/api/v1/namespaces/{ns}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "registry"},
        "type": "kubernetes.io/dockerconfigjson", "data": {".dockerconfigjson": base64.b64encode(config.encode()).decode()}})
    bare = step("fetch", env.registry.private_image, port=None)
    bare["args"] = [bare.pop("command")[-1]]
    try:
        env.kube.create(f"/api/v1/namespaces/{ns}/pods", pod("no-secret", [bare], [step("main", env.images.busybox,
                                                                                         port=None)]))
        raise AssertionError("a pod whose step's ENTRYPOINT the server cannot read was admitted")
    except KubeFailure as e:
        assert "ENTRYPOINT" in str(e) and "403" in str(e), str(e)
    rec.note(f"ENTRYPOINT read from {host} with the pod's imagePullSecrets; "
             + _lookup_build(env, rec, ns, env.registry.private_image, imagePullSecrets=[{"name": "registry"}])
             + "; without the Secret: denied")
