"""The e2e harness's own parts, without a cluster: the images' archive format, the test
mesh's injection, the install's two changes for this machine, the log timestamps, and the
Debian packages the Makefile installs for it. (`make e2e` runs the scenarios themselves.)"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import io
import json
import re
import tarfile
import threading
from pathlib import Path

import pytest

from tests.e2e._install import for_this_machine, render, server_env
from tests.e2e._kube import parse_time
from tests.e2e._mesh import ISTIO_TRAFFIC, NATIVE_NS, NO_QUIT, Mesh
from tests.e2e._pods import step
from tests.support.k8s import Image
from tests.support.k8s._cluster import COMMANDS
from waiter import protocol as p

REPO = Path(__file__).resolve().parents[2]


def test_a_docker_archive_holds_one_layer_its_config_names(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "tool").write_bytes(b"#!/bin/sh\n")
    (tmp_path / "bin" / "tool").chmod(0o755)
    image = Image("e2e.initshift.local/x:1", entrypoint=["/opt/x/bin/tool"], user="65532:65532")
    image.add_tree(tmp_path / "bin", "/opt/x/bin")
    image.files["/bin/sh"] = ("symlink", "/bin/busybox")
    with tarfile.open(image.write(tmp_path / "x.tar")) as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())
        (entry,) = manifest
        assert entry["RepoTags"] == ["e2e.initshift.local/x:1"]
        config = json.loads(tar.extractfile(entry["Config"]).read())
        layer = tar.extractfile(entry["Layers"][0]).read()
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer).hexdigest()]
    assert config["config"]["Entrypoint"] == ["/opt/x/bin/tool"] and config["config"]["User"] == "65532:65532"
    with tarfile.open(fileobj=io.BytesIO(layer)) as fs:
        members = {m.name: m for m in fs.getmembers()}
    assert members["opt/x/bin/tool"].mode & 0o111 and members["opt"].isdir()
    assert members["bin/sh"].issym() and members["bin/sh"].linkname == "/bin/busybox"
    assert members["tmp"].mode == 0o1777


class _NoApi:
    def __init__(self, labels: dict | None = None, annotations: dict | None = None) -> None:
        self.ns = {"metadata": {"labels": labels or {}, "annotations": annotations or {}}}

    def get(self, _path: str) -> dict:
        return self.ns


def _mesh(labels: dict | None = None, annotations: dict | None = None) -> Mesh:
    mesh = Mesh.__new__(Mesh)  # the injection alone: no server, no certificates
    mesh.kube, mesh.proxy_image, mesh.busybox, mesh.run = _NoApi(labels, annotations), "proxy:1", "busybox:1", "r"
    mesh._ns_cache, mesh._lock, mesh.calls = {}, threading.Lock(), 0
    return mesh


def _pod(annotations: dict | None = None) -> dict:
    return {"metadata": {"generateName": "build-", "annotations": annotations or {}},
            "spec": {"initContainers": [step("clone", "busybox:1", port=ISTIO_TRAFFIC)],
                     "containers": [step("main", "busybox:1", port=None)]}}


def _apply(mesh: Mesh, path: str, pod: dict) -> dict:
    import base64

    import jsonpatch

    answer = mesh.review(path + "?timeout=10s", {"request": {"uid": "u", "namespace": "b", "object": pod}})
    patch = answer["response"].get("patch")
    return jsonpatch.apply_patch(pod, json.loads(base64.b64decode(patch))) if patch else pod


def test_istio_classic_native_and_idempotent():
    mesh = _mesh()
    classic = _apply(mesh, "/istio", _pod())
    assert [c["name"] for c in classic["spec"]["initContainers"]] == ["istio-init", "clone"]
    assert [c["name"] for c in classic["spec"]["containers"]] == ["main", "istio-proxy"]
    proxy = classic["spec"]["containers"][1]
    assert proxy["startupProbe"]["periodSeconds"] == 1 and proxy["readinessProbe"]["periodSeconds"] == 15
    assert classic["metadata"]["labels"]["service.istio.io/canonical-name"] == "build"
    assert _apply(mesh, "/istio", copy.deepcopy(classic)) == classic  # injected once
    native = _apply(mesh, "/istio", _pod({p.ISTIO_NATIVE_ANNOTATION: "true"}))
    assert [c["name"] for c in native["spec"]["initContainers"]] == ["istio-init", "istio-proxy", "clone"]
    assert native["spec"]["initContainers"][1]["restartPolicy"] == "Always"
    by_namespace = _apply(_mesh({NATIVE_NS: "true"}), "/istio", _pod())
    assert by_namespace["spec"]["initContainers"][1]["name"] == "istio-proxy"
    assert _apply(mesh, "/istio", _pod({p.ISTIO_INJECT_ANNOTATION: "false"}))["spec"]["containers"][-1]["name"] == "main"
    no_quit = _apply(mesh, "/istio", _pod({NO_QUIT: "true"}))
    assert "--no-quit" in no_quit["spec"]["containers"][1]["args"]


def test_linkerd_injects_where_the_namespace_or_pod_asks():
    assert _apply(_mesh(), "/linkerd", _pod()) == _pod()
    pod = _apply(_mesh(annotations={p.LINKERD_INJECT_ANNOTATION: "enabled"}), "/linkerd", _pod())
    assert [c["name"] for c in pod["spec"]["containers"]] == ["linkerd-proxy", "main"]
    assert pod["spec"]["containers"][0]["lifecycle"]["postStart"]["exec"]["command"] == [
        "/usr/lib/linkerd/linkerd-await", "--timeout=2m", "--port=4191"], "Linkerd's proxy.await, as its chart writes it"
    native = _apply(_mesh(), "/linkerd", _pod({p.LINKERD_INJECT_ANNOTATION: "enabled",
                                                p.LINKERD_NATIVE_ANNOTATIONS[-1]: "true"}))  # the alpha name
    assert [c["name"] for c in native["spec"]["initContainers"]] == ["linkerd-init", "linkerd-proxy", "clone"]
    proxy = native["spec"]["initContainers"][1]
    assert "lifecycle" not in proxy and proxy["startupProbe"]["httpGet"] == {"path": "/ready", "port": 4191}, \
        "a native proxy awaits with a startupProbe instead, as Linkerd's chart does"


@pytest.mark.parametrize("flavour", ["helm", "kustomize"])
def test_the_install_changes_two_things_for_this_machine(flavour):
    objects = render(flavour)
    changed = for_this_machine(objects, "https://127.0.0.1:8443/mutate")
    assert len(changed) == len(objects)
    for before, after in zip(objects, changed):
        if after["kind"] == "Deployment":
            assert after["spec"]["replicas"] == 0
            env = server_env(after)
            assert env["INITSHIFT_NAMESPACE"] == after["metadata"]["namespace"] and env[p.FEATURE_GATE_ENV] == "true"
        elif after["kind"] == "MutatingWebhookConfiguration":
            assert [w["clientConfig"] for w in after["webhooks"]] == [{"url": "https://127.0.0.1:8443/mutate"}]
            assert [w["namespaceSelector"] for w in after["webhooks"]] == \
                [w["namespaceSelector"] for w in before["webhooks"]]
        else:
            assert after == before


def test_times_keep_microseconds_and_their_zone():
    stamp = parse_time("2026-11-25T16:45:31.195042059Z")
    assert stamp.microsecond == 195042 and stamp.utcoffset() == dt.timedelta(0)
    assert parse_time("2026-11-25T16:45:31Z").second == 31 and parse_time("2026-11-25T16:45:31Z").tzinfo
    assert parse_time("2026-11-25T16:45:31.5+02:00").utcoffset() == dt.timedelta(hours=2)
    with pytest.raises(ValueError):
        parse_time("yesterday")


def test_the_makefile_installs_every_debian_package_the_cluster_needs():
    makefile = (REPO / "Makefile").read_text()
    packages = set(re.search(r"^E2E_APT_PACKAGES := (.*)$", makefile, re.M).group(1).split())
    assert set(COMMANDS.values()) <= packages


def test_the_testing_page_describes_every_scenario():
    """docs/testing.md's table names each scenario `make e2e` runs, and no other."""
    from tests.e2e import __main__  # noqa: F401 - importing the runner registers every scenario
    from tests.e2e._env import SCENARIOS as registered
    from tests.support import docs

    table = docs.section(docs.page("testing.md"), "The scenarios")
    described = {name for row in table.splitlines() if row.startswith("| `")
                 for name in re.findall(r"`([a-z0-9-]+)`", row.split(" | ", 1)[0])}
    assert described == {s.name for s in registered}


def test_a_scenario_that_needs_something_says_what():
    """A scenario some clusters skip says why in the run's line (`not applicable here: NAME
    (needs ...)`) and in --list: its `applies` check's docstring."""
    from tests.e2e import __main__  # noqa: F401 - importing the runner registers every scenario
    from tests.e2e._env import SCENARIOS, any_cluster

    assert [s.name for s in SCENARIOS if s.applies is not any_cluster and not s.needs] == []
    assert [s.name for s in SCENARIOS if s.applies is any_cluster and s.needs] == []


def test_a_free_port_is_outside_the_kernels_ephemeral_range_and_bindable():
    """The kernel gives ports of its ephemeral range to outgoing connections' local ends: a
    port drawn there can be taken before the caller binds it."""
    import socket

    from tests.support.k8s import _procs

    low, high = _procs._ephemeral_ports()
    for _ in range(20):
        port = _procs.free_port()
        assert not low <= port <= high, (port, low, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))
