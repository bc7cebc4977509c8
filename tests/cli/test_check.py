"""`initshift check` against the API double holding the default install, the real HTTPS
server and the real watcher: a healthy install passes, and each failure it detects is a ✘
line and exit code 1."""

from __future__ import annotations

import asyncio
import base64
import io
import json

import pytest

from tests.support import https_helpers as h
from tests.support import install as inst
from tests.support.kubedouble import KubeDouble
from webhook.cli import _check as check_cmd


async def check(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = await check_cmd.run(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


def marks(out: str) -> dict[str, str]:
    """Title -> ✔/✘ for every check line."""
    return {line[2:]: line[0] for line in out.splitlines() if line[:1] in ("✔", "✘")}


def failed(out: str) -> list[str]:
    return [title for title, mark in marks(out).items() if mark == "✘"]


async def test_healthy_install_passes(kube: KubeDouble, tmp_path) -> None:
    async with inst.healthy(kube, tmp_path) as i:
        code, out, err = await check(*i.argv())
    assert (code, failed(out), err) == (0, [], ""), out
    titles = list(marks(out))
    for expected in ["can reach the Kubernetes API (v1.30.2)",
                     "MutatingWebhookConfiguration initshift-webhook exists (webhook pods.initshift.io)",
                     "sideEffects: None", "reinvocationPolicy: IfNeeded",
                     "failurePolicy: Ignore (while no replica answers, pods of opted-in namespaces are created "
                     "without the rewrite)",
                     "PodDisruptionBudget initshift-system/initshift: a node drain may evict 1 of 2 Ready replicas "
                     "at a time",
                     "timeoutSeconds: 5 (above the 4s registry lookup budget)",
                     "namespaceSelector never selects initshift-system or kube-system",
                     "Service initshift-system/initshift exists",
                     "the caBundle verifies the certificate the server presents",
                     "/readyz: ready, strategy unknown, native sidecars unknown",
                     "service account initshift-system/initshift may make the 21 calls the server makes "
                     "(with self-managed certificates)",
                     "opted-in namespaces: builds (Istio injects), plain (no mesh injects)"]:
        assert expected in titles, (expected, out)
    assert any(t.startswith("serving certificate valid until") and "days left" in t for t in titles)
    assert any(t.startswith("watcher Lease initshift-system/initshift-watcher held by initshift-0, renewed")
               for t in titles)
    assert any(t.startswith("Istio injector istio-sidecar-injector: called after initshift-webhook; injects "
                            "natively: no (ENABLE_NATIVE_SIDECARS=false on Deployment istio-system/istiod)")
               for t in titles)
    assert out.rstrip().endswith("Status check results are ✔")
    # Every SubjectAccessReview asked about initshift's service account, never about the caller.
    reviews = [r.body for r in kube.requests if r.path.endswith("/subjectaccessreviews")]
    assert reviews and {r["spec"]["user"] for r in reviews} == {inst.SA_USER}


async def test_json_output(kube: KubeDouble, tmp_path) -> None:
    async with inst.healthy(kube, tmp_path, native_supported=lambda: True, strategy=lambda: "native") as i:
        code, out, _ = await check(*i.argv("-o", "json"))
    report = json.loads(out)
    assert code == 0 and report["ok"] is True
    ready = next(c for c in report["checks"] if c["title"].startswith("/readyz"))
    assert ready["title"] == "/readyz: ready, strategy native, native sidecars supported"
    assert ready["readyz"]["strategy"] == "native" and ready["section"] == "webhook-server"
    assert {c["section"] for c in report["checks"]} >= {"kubernetes-api", "webhook-configuration", "webhook-server",
                                                         "watcher", "rbac", "namespaces", "mesh"}


async def test_json_output_without_a_kubeconfig_is_the_failure_as_data(tmp_path) -> None:
    """A script reading stdout gets a report, not nothing; stderr keeps its one line."""
    missing = tmp_path / "missing"
    code, out, err = await check("-o", "json", "--kubeconfig", str(missing))
    assert code == 1 and err == f"initshift check: kubeconfig {missing}: no such file\n"
    assert json.loads(out) == {"ok": False, "checks": [
        {"section": "kubernetes-api", "ok": False, "title": "can reach the Kubernetes API",
         "hint": f"kubeconfig {missing}: no such file"}]}
    code, out, err = await check("--kubeconfig", str(missing))
    assert (code, out) == (1, "") and err.count("\n") == 1  # text: the one line is the whole answer


async def test_no_configuration(kube: KubeDouble, tmp_path) -> None:
    async with inst.healthy(kube, tmp_path) as i:
        kube.delete("mutatingwebhookconfigurations", None, "initshift-webhook")
        code, out, _ = await check(*i.argv())
    assert code == 1
    assert failed(out) == ["MutatingWebhookConfiguration initshift-webhook exists"]
    assert "no configuration: pods are never sent to initshift. Install it: kubectl apply -k deploy/" in out


async def test_a_namespace_that_does_not_exist_ends_the_check(kube: KubeDouble, tmp_path) -> None:
    """-n with a typo: one ✘ naming where the configuration sends pods, not a ✘ per fact about
    a namespace that is not there (one of them advice to change the webhook's selector)."""
    async with inst.healthy(kube, tmp_path) as i:
        code, out, _ = await check(*i.argv("-n", "initshift-sytem"))
    assert code == 1 and list(marks(out)) == ["can reach the Kubernetes API (v1.30.2)",
                                              "initshift's namespace initshift-sytem exists"], out
    assert ("\n    -n names the namespace initshift is installed in (default initshift-system); "
            "MutatingWebhookConfiguration initshift-webhook sends pods to Service initshift-system/initshift: "
            "-n initshift-system\n") in out


async def test_ca_bundle_that_does_not_verify(kube: KubeDouble, tmp_path) -> None:
    async with inst.healthy(kube, tmp_path) as i:
        mwc = kube.get("mutatingwebhookconfigurations", None, "initshift-webhook")
        other = inst.make_pki(tmp_path / "other")
        mwc["webhooks"][0]["clientConfig"]["caBundle"] = base64.b64encode(other).decode()
        kube.put("mutatingwebhookconfigurations", mwc)
        code, out, _ = await check(*i.argv())
    assert code == 1 and failed(out) == ["the caBundle verifies the certificate the server presents"]
    assert "unable to get local issuer certificate: the apiserver cannot call the webhook" in out


async def refused(port: int, seconds: float = 30) -> None:
    """Until nothing listens on the port: stop() only asks uvicorn to exit (it looks every 0.1 s)."""
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except ConnectionRefusedError:
            return
        except ConnectionResetError:
            pass  # the listener closed with this connection still queued (a loaded machine): look again
        else:
            writer.close()
        assert asyncio.get_running_loop().time() < deadline, "the server still listens"
        await asyncio.sleep(0.05)


async def test_server_down(kube: KubeDouble, tmp_path) -> None:
    async with inst.healthy(kube, tmp_path) as i:
        i.server.stop()
        await refused(int(i.url.rsplit(":", 1)[1]))
        i.server.sock.close()
        code, out, _ = await check(*i.argv())
    host = i.url.removeprefix("https://")
    assert code == 1 and failed(out) == [f"initshift answers on {host} (initshift.initshift-system.svc)"]
    assert "ConnectionRefusedError" in out and "Is the Deployment running (its lines below)?" in out


async def test_expired_certificate(kube: KubeDouble, tmp_path) -> None:
    ca = inst.make_pki(tmp_path / "pki", expired=True)
    inst.put_install(kube, ca)
    cfg = inst.write_kubeconfig(tmp_path / "kubeconfig", kube.url)
    with inst.server(tmp_path / "pki") as srv:
        async with inst.watcher(kube):
            code, out, _ = await check("--kubeconfig", cfg, "--service-url", inst.h.base_url(srv))
    bad = failed(out)
    assert code == 1 and len(bad) == 3, out
    assert bad[0] == "the caBundle verifies the certificate the server presents"
    assert bad[1].startswith("serving certificate expired ") and bad[1].endswith("(24 hours ago)")
    assert bad[2] == "/readyz: 503 not ready"
    assert "certificate has expired" in out


async def test_lease_not_renewed(kube: KubeDouble, tmp_path) -> None:
    """Held by a replica whose pod is still there: its watcher is stuck."""
    async with inst.healthy(kube, tmp_path) as i:
        pass  # the watcher stopped and released the Lease; the server stopped too: start another
    lease = kube.get("leases", inst.NS, "initshift-watcher")
    # The identity is the holder's hostname, its pod's name, and a suffix.
    lease["spec"].update(holderIdentity="initshift-7d9c5b-0-1a2b3c", renewTime="2026-01-01T00:00:00.000000Z")
    kube.put("leases", lease)
    with inst.server(tmp_path / "pki") as srv:
        code, out, _ = await check("--kubeconfig", i.kubeconfig, "--service-url", inst.h.base_url(srv))
    bad = failed(out)
    assert code == 1 and len(bad) == 1 and bad[0].startswith(
        "watcher Lease initshift-system/initshift-watcher held by initshift-7d9c5b-0-1a2b3c, last renewed "), out
    assert "(duration 3s)" in bad[0] and "not renewed within its duration: the watcher is stuck or gone" in out


async def test_lease_of_a_gone_pod(kube: KubeDouble, tmp_path) -> None:
    """Held by a pod that is gone (its leader killed, or a previous install's Lease left) while
    other replicas are Ready: a handover, which they finish within the Lease's duration (seen
    on v1.34.9 after a reinstall, and after the leader was killed), not a stuck watcher."""
    async with inst.healthy(kube, tmp_path) as i:
        pass
    lease = kube.get("leases", inst.NS, "initshift-watcher")
    lease["spec"].update(holderIdentity="initshift-6c8f9d-q2x7w-8de2db", renewTime="2026-01-01T00:00:00.000000Z")
    kube.put("leases", lease)
    with inst.server(tmp_path / "pki") as srv:
        code, out, _ = await check("--kubeconfig", i.kubeconfig, "--service-url", inst.h.base_url(srv))
    assert code == 1 and len(failed(out)) == 1 and failed(out)[0].startswith(
        "watcher Lease initshift-system/initshift-watcher held by initshift-6c8f9d-q2x7w-8de2db, last renewed "), out
    assert "its holder's pod initshift-6c8f9d-q2x7w is gone" in out and "a handover, not a stuck watcher" in out
    assert "Ready replica(s) initshift-7d9c5b-0, initshift-7d9c5b-1 take the Lease" in out
    assert "the watcher is stuck" not in out


async def test_lease_released(kube: KubeDouble, tmp_path) -> None:
    async with inst.healthy(kube, tmp_path) as i:
        pass
    with inst.server(tmp_path / "pki") as srv:
        code, out, _ = await check("--kubeconfig", i.kubeconfig, "--service-url", inst.h.base_url(srv))
    assert code == 1 and failed(out) == ["watcher Lease initshift-system/initshift-watcher is held"]


@pytest.mark.parametrize("verb, resource, denied", [
    ("patch", "pods", "patch pods (the watcher follows managed pods and writes their annotations)"),
    ("update", "leases", "update leases.coordination.k8s.io initshift-watcher in initshift-system (leader election)"),
])
async def test_rbac_missing(kube: KubeDouble, tmp_path, verb, resource, denied) -> None:
    async with inst.healthy(kube, tmp_path) as i:
        kube.revoke(inst.SA_USER, verb, resource)
        code, out, _ = await check(*i.argv())
    assert code == 1 and failed(out) == ["service account initshift-system/initshift may make the 21 calls the "
                                         "server makes (with self-managed certificates)"]
    assert f"forbidden: {denied}. Re-apply deploy/" in out


async def test_nodes_list_granted_by_the_default_install(kube: KubeDouble, tmp_path) -> None:
    async with inst.healthy(kube, tmp_path) as i:
        code, out, _ = await check(*i.argv())
    assert code == 0 and "✔ native-sidecar detection by kubelet versions: list nodes granted\n" in out, out


async def test_nodes_list_not_granted_is_a_warning_naming_the_risk(kube: KubeDouble, tmp_path) -> None:
    """Without `list nodes` the apiserver's version alone decides native-sidecar support: a
    v1.28 kubelet under a v1.29+ apiserver (an upgrade in progress) hangs hybrid and native pods
    in Init. An install may refuse the grant: a warning under a ✔ line, never a failure."""
    async with inst.healthy(kube, tmp_path) as i:
        kube.revoke(inst.SA_USER, "list", "nodes")
        code, out, _ = await check(*i.argv())
        _, data, _ = await check(*i.argv("-o", "json"))
    assert (code, failed(out)) == (0, []), out
    title = "native-sidecar detection by kubelet versions: list nodes not granted (warning)"
    assert f"✔ {title}\n    warning: " in out
    hint = out.split(title, 1)[1].split("\n")[1]
    for words in ("the apiserver's version alone", "A kubelet older than v1.29 under a v1.29+ apiserver",
                  "the pod hangs in Init", "rbac.nodeVersions=true", "components/without-node-versions"):
        assert words in hint, (words, hint)
    (line,) = [c for c in json.loads(data)["checks"] if c["title"] == title]
    assert (line["ok"], line["warning"], line["granted"]) == (True, True, False)


async def test_configuration_that_drifted_from_the_install(kube: KubeDouble, tmp_path) -> None:
    async with inst.healthy(kube, tmp_path) as i:
        mwc = kube.get("mutatingwebhookconfigurations", None, "initshift-webhook")
        wh = mwc["webhooks"][0]
        wh.update(reinvocationPolicy="Never", sideEffects="Unknown", timeoutSeconds=3)
        wh["namespaceSelector"] = {"matchLabels": {"initshift.io/enabled": "true"}}
        mwc["metadata"]["name"] = "zz-initshift"
        kube.put("mutatingwebhookconfigurations", mwc)
        code, out, _ = await check(*i.argv("--webhook-config", "zz-initshift"))
    assert code == 1
    assert failed(out) == ["sideEffects: Unknown", "reinvocationPolicy: Never",
                           "timeoutSeconds: 3 (above the 4s registry lookup budget)",
                           "namespaceSelector never selects initshift-system or kube-system",
                           # RBAC names initshift-webhook: the renamed configuration cannot get its caBundle
                           "service account initshift-system/initshift may make the 21 calls the server makes "
                           "(with self-managed certificates)",
                           "Istio injector istio-sidecar-injector is called before zz-initshift; injects natively: "
                           "no (ENABLE_NATIVE_SIDECARS=false on Deployment istio-system/istiod)"]


async def test_unreachable_api(tmp_path) -> None:
    cfg = inst.write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:1")
    code, out, _ = await check("--kubeconfig", cfg)
    assert code == 1 and failed(out) == ["can reach the Kubernetes API"]


async def test_an_api_certificate_the_kubeconfig_does_not_trust(tmp_path) -> None:
    """One advice, the certificate's: not also 'check the kubeconfig, the context and the network'."""
    h.make_certs(tmp_path)
    with h.running(h.settings_for(tmp_path)) as server:  # initshift's own server, its own CA
        cfg = inst.write_kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{server.port}")
        code, out, _ = await check("--kubeconfig", cfg)
    assert code == 1 and failed(out) == ["can reach the Kubernetes API"]
    hint = next(line for line in out.splitlines() if "not trusted" in line)
    assert hint.endswith("is not trusted (unable to get local issuer certificate): check the kubeconfig's cluster CA")
    assert hint.count("check ") == 1


async def test_credentials_the_api_refuses(kube: KubeDouble, tmp_path) -> None:
    """401: the API was reached (not 'can reach ... check the network'); said as status and logs say it."""
    cfg = inst.write_kubeconfig(tmp_path / "kubeconfig", kube.url)
    kube.fail_next("/version", 401, message="Unauthorized")
    code, out, _ = await check("--kubeconfig", cfg)
    assert code == 1 and failed(out) == ["the Kubernetes API accepts your credentials"], out
    assert "\n    the API server did not accept your credentials (Unauthorized); check the kubeconfig\n" in out


async def test_linkerd_injector_and_where_it_injects(kube: KubeDouble, tmp_path) -> None:
    svc = {"name": "linkerd-proxy-injector", "namespace": "linkerd", "path": "/", "port": 443}
    kube.put("mutatingwebhookconfigurations", {"metadata": {"name": "linkerd-proxy-injector-webhook-config"},
                                               "webhooks": [{"name": "linkerd-proxy-injector.linkerd.io",
                                                             "clientConfig": {"service": svc},
                                                             "namespaceSelector": {"matchExpressions": [
                                                                 {"key": "config.linkerd.io/admission-webhooks",
                                                                  "operator": "NotIn", "values": ["disabled"]}]}}]})
    kube.put("configmaps", {"metadata": {"name": "linkerd-config", "namespace": "linkerd"},
                            "data": {"values": "proxy:\n  nativeSidecar: true\n"}})
    kube.put("namespaces", {"metadata": {"name": "ci", "labels": {"initshift.io/enabled": "true"},
                                         "annotations": {"linkerd.io/inject": "enabled"}}})
    async with inst.healthy(kube, tmp_path) as i:
        code, out, _ = await check(*i.argv())
    assert code == 0, out
    titles = list(marks(out))
    assert "opted-in namespaces: builds (Istio injects), ci (Linkerd injects), plain (no mesh injects)" in titles
    assert "Linkerd injector linkerd-proxy-injector-webhook-config: called after initshift-webhook; injects " \
           "natively: yes (proxy.nativeSidecar: true in linkerd/linkerd-config)" in titles


@pytest.mark.parametrize("values, says", [
    ("proxy:\n  nativeSidecar: false\n", "no (proxy.nativeSidecar: false in linkerd/linkerd-config)"),
    ("linkerdVersion: edge-25.12.3\nproxy:\n  logLevel: warn\n",
     "Linkerd's default (proxy.nativeSidecar unset in linkerd/linkerd-config, linkerdVersion edge-25.12.3; "
     "on from Linkerd 2.20)"),
    ("proxy: null\n", "Linkerd's default (proxy.nativeSidecar unset in linkerd/linkerd-config; on from Linkerd 2.20)"),
    ("[not, a, mapping]", "Linkerd's default (proxy.nativeSidecar unset in linkerd/linkerd-config; on from Linkerd 2.20)"),
])
async def test_linkerd_native_as_its_config_says(kube: KubeDouble, values: str, says: str) -> None:
    """A key the stored values leave out is the release's default (on from 2.20), not "no"."""
    from webhook.cli._check_preflight import _linkerd_native
    from webhook.kube import KubeApi

    kube.put("configmaps", {"metadata": {"name": "linkerd-config", "namespace": "linkerd"}, "data": {"values": values}})
    async with KubeApi.for_host(kube.url) as api:
        assert await _linkerd_native(api, {"namespace": "linkerd", "name": "linkerd-proxy-injector"}) == says


def test_label_selectors_as_the_apiserver_reads_them() -> None:
    from webhook.cli._check_report import selects

    sel = {"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "NotIn", "values": ["x"]},
                                                           {"key": "c", "operator": "DoesNotExist"}]}
    assert selects(sel, {"a": "1"})  # NotIn and DoesNotExist hold for a missing key
    assert not selects(sel, {"a": "1", "b": "x"}) and not selects(sel, {"a": "1", "c": ""})
    assert not selects(sel, {"a": "2"}) and selects(None, {}) and selects({}, {"z": "1"})
    assert selects({"matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}]}, {"k": "v"})
    assert not selects({"matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}]}, {})
    assert not selects({"matchExpressions": [{"key": "k", "operator": "Exists"}]}, {})


async def test_outside_the_cluster_through_a_port_forward(kube: KubeDouble, tmp_path, monkeypatch) -> None:
    """The Service's name resolves only inside the cluster: from outside, the server is reached
    through a port-forward to the replica Ready longest, its `https` port, and its certificate
    is verified for the Service's name all the same."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    async with inst.healthy(kube, tmp_path) as i:
        first = kube.pod(inst.NS, "initshift-7d9c5b-0")
        first["status"]["conditions"][0]["lastTransitionTime"] = "2026-11-29T10:00:00Z"
        kube.put("pods", first)
        code, out, _ = await check("--kubeconfig", i.kubeconfig)
        assert code == 0, out
        server = [t for t in marks(out) if t.startswith("initshift answers on")]
        assert server == ["initshift answers on pod/initshift-7d9c5b-1:8443 through a port-forward "
                          "(initshift.initshift-system.svc)"]  # Ready since before the other's time
        assert "✔ the caBundle verifies the certificate the server presents" in out
        forwards = [r for r in kube.requests if r.path.endswith("/portforward")]
        assert {r.path for r in forwards} == {"/api/v1/namespaces/initshift-system/pods/initshift-7d9c5b-1/portforward"}
        assert len(forwards) == 2 and all(r.query == {"ports": "8443"} for r in forwards)  # as is, then verified

        del kube.pod_ports[(inst.NS, "initshift-7d9c5b-1", inst.SERVING_PORT)]  # nothing listens there
        code, out, _ = await check("--kubeconfig", i.kubeconfig)
        assert code == 1 and failed(out) == ["initshift answers on pod/initshift-7d9c5b-1:8443 through a port-forward "
                                             "(initshift.initshift-system.svc)"]
        assert "error forwarding port 8443 to pod initshift-7d9c5b-1: dial tcp4 127.0.0.1:8443: connect: connection " \
               "refused. Is the Deployment running (its lines below)?" in out

        for name in ("initshift-7d9c5b-0", "initshift-7d9c5b-1"):
            kube.put("pods", inst.replica(kube.get("deployments", inst.NS, "initshift"), name, ready=False))
        code, out, _ = await check("--kubeconfig", i.kubeconfig)
        assert "✘ initshift answers on initshift.initshift-system.svc:443 (through a port-forward)\n    no Ready pod " \
               "behind Service initshift-system/initshift (app.kubernetes.io/component=webhook,app.kubernetes.io/name=" \
               "initshift) to port-forward to: see the Deployment's lines below" in out

        kube.fail_next("/api/v1/namespaces/initshift-system/pods/initshift-7d9c5b-0/portforward", 403)
        kube.put("pods", inst.replica(kube.get("deployments", inst.NS, "initshift"), "initshift-7d9c5b-0", ready=True))
        code, out, _ = await check("--kubeconfig", i.kubeconfig)
        assert "✘ initshift answers on pod/initshift-7d9c5b-0:8443 through a port-forward (initshift.initshift-system" \
               ".svc)\n    port-forward to pod initshift-system/initshift-7d9c5b-0 port 8443: forbidden (it needs get " \
               "on pods/portforward)" in out


async def test_inside_the_cluster_the_services_name(kube: KubeDouble, tmp_path, monkeypatch) -> None:
    """In a pod (KUBERNETES_SERVICE_HOST set) the Service's name is used as the apiserver uses it,
    no port-forward (here it does not resolve: the line says so)."""
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    async with inst.healthy(kube, tmp_path) as i:
        code, out, _ = await check("--kubeconfig", i.kubeconfig)
    assert code == 1
    assert failed(out) == ["initshift answers on initshift.initshift-system.svc:443 (initshift.initshift-system.svc)"]
    assert not [r for r in kube.requests if r.path.endswith("/portforward")]


def set_env(kube: KubeDouble, **env: str) -> None:
    """Variables set on initshift's Deployment in the double (as `kubectl set env` would)."""
    deployment = kube.get("deployments", inst.NS, "initshift")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    container["env"] = [e for e in container["env"] if e["name"] not in env] + \
        [{"name": k, "value": v} for k, v in env.items()]
    kube.put("deployments", deployment)


def pull_secret(namespace: str, name: str, host: str, kind: str = "kubernetes.io/dockerconfigjson") -> dict:
    auth = base64.b64encode(b"ci:s3cret").decode()
    doc = base64.b64encode(json.dumps({"auths": {host: {"auth": auth}}}).encode()).decode()
    return {"metadata": {"name": name, "namespace": namespace}, "type": kind, "data": {".dockerconfigjson": doc}}


async def test_the_deployments_settings_and_image(kube: KubeDouble, tmp_path) -> None:
    async with inst.healthy(kube, tmp_path) as i:
        code, out, _ = await check(*i.argv())
        assert code == 0
        assert "Deployment initshift-system/initshift: its settings are valid (initshift's image " \
               "ghcr.io/initshift/initshift:0.1.0)" in marks(out)
        assert not any("IMAGE_PULL_SECRETS" in t for t in marks(out))  # not set: nothing to look for
        set_env(kube, INITSHIFT_MODE="fastest")
        code, out, _ = await check(*i.argv())
        assert code == 1 and failed(out) == ["Deployment initshift-system/initshift: its settings are valid"]
        assert "INITSHIFT_MODE: expected one of disabled, waiter, native, hybrid, auto, got 'fastest': the server " \
               "exits at start" in out
        kube.delete("deployments", inst.NS, "initshift")
        code, out, _ = await check(*i.argv())
        assert code == 1 and failed(out) == ["Deployment initshift-system/initshift exists"]


async def test_pull_secrets_for_initshifts_image_in_each_opted_in_namespace(kube: KubeDouble, tmp_path) -> None:
    """INITSHIFT_IMAGE_PULL_SECRETS names Secrets the kubelet must find in every namespace
    whose pods are rewritten, holding credentials for initshift's image as it matches them."""
    setting = "INITSHIFT_IMAGE_PULL_SECRETS (regcred, mirror)"
    async with inst.healthy(kube, tmp_path) as i:
        set_env(kube, INITSHIFT_IMAGE="registry.example.com:5000/tools/initshift:0.1.0",
                INITSHIFT_IMAGE_PULL_SECRETS="regcred,mirror")
        kube.put("secrets", pull_secret(inst.BUILDS, "regcred", "registry.example.com:5000"))
        kube.put("secrets", pull_secret(inst.PLAIN, "mirror", "https://registry.example.com:5000/v1/"))
        code, out, _ = await check(*i.argv())
        assert code == 0, out
        assert f"{setting}: credentials for initshift's image in every opted-in namespace" in marks(out)

        kube.delete("secrets", inst.PLAIN, "mirror")
        code, out, _ = await check(*i.argv())
        assert code == 1 and failed(out) == [f"{setting}: no credentials for initshift's image in plain (no Secret "
                                             f"regcred, mirror)"]
        assert "builds rewritten there stop at ErrImagePull: create the Secret" in out

        # Of a type the kubelet does not read, and for another registry (its port differs).
        kube.put("secrets", pull_secret(inst.PLAIN, "regcred", "registry.example.com:5000", kind="Opaque"))
        kube.put("secrets", pull_secret(inst.PLAIN, "mirror", "registry.example.com"))
        code, out, _ = await check(*i.argv())
        assert failed(out) == [f"{setting}: no credentials for initshift's image in plain (secret plain/regcred "
                               f"is of type Opaque, not kubernetes.io/dockerconfigjson)"]
        kube.put("secrets", pull_secret(inst.PLAIN, "regcred", "registry.example.com:5000", kind="Opaque") |
                 {"type": "kubernetes.io/dockerconfigjson", "data": {".dockerconfigjson": "bm90IGpzb24="}})
        code, out, _ = await check(*i.argv())
        assert failed(out) == [f"{setting}: no credentials for initshift's image in plain (secret plain/regcred: "
                               f".dockerconfigjson is not base64-encoded JSON)"]
        kube.delete("secrets", inst.PLAIN, "regcred")
        code, out, _ = await check(*i.argv())
        assert failed(out) == [f"{setting}: no credentials for initshift's image in plain (no Secret regcred; none "
                               f"holds an entry for the image's registry)"]


async def test_an_image_the_kubelet_would_refuse(kube: KubeDouble, tmp_path) -> None:
    async with inst.healthy(kube, tmp_path) as i:
        set_env(kube, INITSHIFT_IMAGE="ghcr.io/initshift/Initshift:0.1.0")
        code, out, _ = await check(*i.argv())
    assert code == 1 and failed(out) == ["Deployment initshift-system/initshift: its settings are valid"]
    assert "INITSHIFT_IMAGE: image reference 'ghcr.io/initshift/Initshift:0.1.0' has an invalid repository" in out \
        and "the server exits at start with this error; fix the variable" in out, out


async def test_replicas_not_ready_say_why(kube: KubeDouble, tmp_path) -> None:
    """The kubelet's words for each pod of the Deployment that is not Ready: a crash gives the
    server's last line (its termination message: FallbackToLogsOnError), a pending pod its
    waiting reason, an unschedulable one the scheduler's message."""
    title = "Deployment initshift-system/initshift: 1 of 2 replicas Ready"
    async with inst.healthy(kube, tmp_path) as i:
        deployment = kube.get("deployments", inst.NS, "initshift")
        kube.delete("pods", inst.NS, "initshift-7d9c5b-1")
        kube.put("pods", inst.replica(deployment, "initshift-7d9c5b-2", ready=False, restartCount=3, state={
            "waiting": {"reason": "CrashLoopBackOff"}}, lastState={"terminated": {"exitCode": 1, "message": (
                '{"ts":"2026-11-28T00:41:12.656Z","level":"info","logger":"initshift.certs","msg":"certificates '
                'ensured"}\n{"ts":"2026-11-28T00:41:12.656Z","level":"error","logger":"initshift.cli","msg":"initshift '
                'serve: cannot listen on port 8443 (INITSHIFT_METRICS_PORT): address already in use"}\n')}}))
        code, out, _ = await check(*i.argv())
        assert code == 1 and failed(out) == [title]
        assert "pod initshift-7d9c5b-2: CrashLoopBackOff, last ended with exit code 1: initshift serve: cannot " \
               "listen on port 8443 (INITSHIFT_METRICS_PORT): address already in use, restarts: 3" in out
        unscheduled = inst.replica(deployment, "initshift-7d9c5b-2", ready=False)
        unscheduled["status"] = {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": "0/3 nodes are available: 3 Insufficient memory."}]}
        kube.put("pods", unscheduled)
        code, out, _ = await check(*i.argv())
        assert failed(out) == [title] and "pod initshift-7d9c5b-2: not scheduled: 0/3 nodes are available: 3 " \
                                          "Insufficient memory." in out
        kube.delete("pods", inst.NS, "initshift-7d9c5b-2")
        kube.delete("pods", inst.NS, "initshift-7d9c5b-0")
        code, out, _ = await check(*i.argv())
        assert failed(out) == ["Deployment initshift-system/initshift: 0 of 2 replicas Ready"]
        assert "no pod: kubectl -n initshift-system describe deployment initshift" in out


async def test_settings_as_the_kubelet_gives_them(kube: KubeDouble, tmp_path) -> None:
    """A Deployment that leaves the kubelet's Service variables on, in a namespace with the
    Service `initshift`: INITSHIFT_PORT=tcp://IP:443 stops the server at start (deploy/'s did)."""
    async with inst.healthy(kube, tmp_path) as i:
        service = kube.get("services", inst.NS, "initshift")
        kube.put("services", {**service, "spec": {**service["spec"], "clusterIP": "10.96.0.208"}})
        code, out, _ = await check(*i.argv())
        assert code == 0, out  # deploy/ turns them off
        deployment = kube.get("deployments", inst.NS, "initshift")
        del deployment["spec"]["template"]["spec"]["enableServiceLinks"]
        kube.put("deployments", deployment)
        code, out, _ = await check(*i.argv())
    assert code == 1 and failed(out) == ["Deployment initshift-system/initshift: its settings are valid"]
    assert "INITSHIFT_PORT: expected a port number, got 'tcp://10.96.0.208:443': the kubelet's variable for the " \
           "Service 'initshift' of the pod's namespace; set `enableServiceLinks: false` on the pod" in out


async def test_a_deployment_scaled_to_zero(kube: KubeDouble, tmp_path) -> None:
    """No replica behind the Service the configuration calls: a failure. With a `url`, the
    server runs elsewhere (as in `make e2e`): the Deployment may be at zero."""
    async with inst.healthy(kube, tmp_path) as i:
        deployment = kube.get("deployments", inst.NS, "initshift")
        deployment["spec"]["replicas"] = 0
        kube.put("deployments", deployment)
        for n in range(2):
            kube.delete("pods", inst.NS, f"initshift-7d9c5b-{n}")
        code, out, _ = await check(*i.argv())
        assert code == 1 and failed(out) == ["Deployment initshift-system/initshift: scaled to 0 replicas"]
        assert "kubectl -n initshift-system scale deployment initshift --replicas=2" in out
        mwc = kube.get("mutatingwebhookconfigurations", None, "initshift-webhook")
        mwc["webhooks"][0]["clientConfig"] = {"url": f"{i.url}/mutate",
                                              "caBundle": mwc["webhooks"][0]["clientConfig"]["caBundle"]}
        kube.put("mutatingwebhookconfigurations", mwc)
        code, out, _ = await check(*i.argv())
    assert "Deployment initshift-system/initshift: 0 of 0 replicas Ready" in marks(out)
    assert "Deployment initshift-system/initshift: 0 of 0 replicas Ready" not in failed(out)


async def test_failure_policy_says_what_a_pod_meets_while_no_replica_answers(kube: KubeDouble, tmp_path) -> None:
    """Fail (also the API's default when unset) refuses pods while no replica answers: the
    configuration's line says so, and so do the replicas' lines when none is Ready."""
    async with inst.healthy(kube, tmp_path) as i:
        mwc = kube.get("mutatingwebhookconfigurations", None, "initshift-webhook")
        del mwc["webhooks"][0]["failurePolicy"]
        kube.put("mutatingwebhookconfigurations", mwc)
        for n in range(2):
            kube.delete("pods", inst.NS, f"initshift-7d9c5b-{n}")
        code, out, _ = await check(*i.argv())
    assert "failurePolicy: Fail (while no replica answers, pods of opted-in namespaces are refused)" in marks(out)
    assert code == 1 and failed(out) == ["Deployment initshift-system/initshift: 0 of 2 replicas Ready"]
    assert "no replica answers: pods of opted-in namespaces are refused" in out


async def test_a_disruption_budget_that_blocks_every_drain_is_a_warning(kube: KubeDouble, tmp_path) -> None:
    """One replica under `minAvailable: 1` (the disruption controller's count: none allowed):
    a drain of its node waits for ever. A warning naming the fix, never a failure; nothing
    said of a budget the controller has not counted yet, nor while no replica is Ready
    (that line fails instead)."""
    title = ("PodDisruptionBudget initshift-system/initshift allows no eviction: 1 Ready, 1 wanted, minAvailable 1 "
             "(warning)")
    async with inst.healthy(kube, tmp_path) as i:
        deployment = kube.get("deployments", inst.NS, "initshift")
        deployment["spec"]["replicas"] = 1
        kube.put("deployments", deployment)
        kube.delete("pods", inst.NS, "initshift-7d9c5b-1")
        pdb = kube.get("poddisruptionbudgets", inst.NS, "initshift")
        kube.put("poddisruptionbudgets", inst.budget(pdb, healthy=1))
        code, out, _ = await check(*i.argv())
        assert code == 0 and marks(out).get(title) == "✔", out
        assert "`kubectl drain` of a node running initshift waits until it times out: run more replicas (kubectl -n " \
               "initshift-system scale deployment initshift --replicas=2), or delete the budget" in out
        stale = inst.budget(pdb, healthy=1)
        stale["metadata"]["generation"] = 2  # edited since the controller last counted
        kube.put("poddisruptionbudgets", stale)
        code, out, _ = await check(*i.argv())
        assert code == 0 and not [t for t in marks(out) if t.startswith("PodDisruptionBudget")], out
        kube.put("poddisruptionbudgets", inst.budget(pdb, healthy=0, expected=1))
        kube.put("pods", inst.replica(deployment, "initshift-7d9c5b-0", ready=False))
        code, out, _ = await check(*i.argv())
        assert failed(out) == ["Deployment initshift-system/initshift: 0 of 1 replicas Ready"]
        assert not [t for t in marks(out) if t.startswith("PodDisruptionBudget")], out
        kube.put("pods", inst.replica(deployment, "initshift-7d9c5b-0", ready=True))
        kube.fail_next(f"/apis/policy/v1/namespaces/{inst.NS}/poddisruptionbudgets", 403)
        code, out, _ = await check(*i.argv())
    assert code == 0 and marks(out).get("PodDisruptionBudgets: cannot be read (warning)") == "✔", out


async def test_a_drain_under_way_the_budget_says_why_it_waits(kube: KubeDouble, tmp_path) -> None:
    """A node cordoned and drained (as on v1.34.9, e2e `second-day`): one replica evicted, its
    replacement Pending (no node takes it), the other held by `minAvailable: 1`. The replicas'
    line fails naming the Pending pod, and the budget's line says it allows no eviction and
    why, without the one-replica advice to scale up (two are asked for already)."""
    async with inst.healthy(kube, tmp_path) as i:
        deployment = kube.get("deployments", inst.NS, "initshift")
        kube.delete("pods", inst.NS, "initshift-7d9c5b-1")
        pending = inst.replica(deployment, "initshift-7d9c5b-2", ready=False, state={"waiting": {}})
        pending["status"] = {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": "0/1 nodes are available: 1 node(s) were unschedulable."}]}
        kube.put("pods", pending)
        pdb = kube.get("poddisruptionbudgets", inst.NS, "initshift")
        kube.put("poddisruptionbudgets", inst.budget(pdb, healthy=1, expected=2))
        code, out, _ = await check(*i.argv())
    title = ("PodDisruptionBudget initshift-system/initshift allows no eviction: 1 Ready, 1 wanted, minAvailable 1 "
             "(warning)")
    assert code == 1 and failed(out) == ["Deployment initshift-system/initshift: 1 of 2 replicas Ready"], out
    assert marks(out).get(title) == "✔", out
    assert "a node drain evicts no more of initshift's replicas until the ones not Ready (above) are Ready" in out
    assert "--replicas=2" not in out.split(title, 1)[1], out


def _pod_patch_policy(namespace: str = "initshift-system") -> list[dict]:
    """deploy/components/pod-patch-policy as kustomize renders it; `namespace`: the one its
    expression names (another: a namespace move that did not patch it)."""
    from tests.support.deploy_render import kustomize

    objects = [o for o in kustomize(".", ["components/pod-patch-policy"])
               if o["kind"].startswith("ValidatingAdmissionPolicy")]
    for o in objects:
        for cond in o["spec"].get("matchConditions") or []:
            cond["expression"] = cond["expression"].replace("initshift-system", namespace)
    return objects


async def test_the_pod_patch_policy_absent_present_or_naming_no_one(kube: KubeDouble, tmp_path) -> None:
    async with inst.healthy(kube, tmp_path) as i:
        code, out, _ = await check(*i.argv())
        assert code == 0 and "✔ pod-patch policy: none (" in out, out
        for obj in _pod_patch_policy():
            kube.put("validatingadmissionpolicies" if obj["kind"].endswith("Policy") else
                     "validatingadmissionpolicybindings", obj)
        code, out, _ = await check(*i.argv())
        title = f"pod-patch policy initshift-pod-patch narrows {inst.SA_USER}'s pod patches"
        assert (code, f"✔ {title}\n" in out) == (0, True), out
        # Moved to another namespace with kustomize, its expression left as it was.
        policy, binding = _pod_patch_policy("ci-tools")
        kube.put("validatingadmissionpolicies", policy)
        code, out, _ = await check(*i.argv())
        assert (code, failed(out)) == (1, [title]), out
        assert "its matchConditions name another account (request.userInfo.username == " \
               "'system:serviceaccount:ci-tools:initshift'), so it narrows no one" in out
        kube.delete("validatingadmissionpolicybindings", None, binding["metadata"]["name"])
        kube.put("validatingadmissionpolicies", _pod_patch_policy()[0])
        code, out, _ = await check(*i.argv())
        assert code == 1 and "no ValidatingAdmissionPolicyBinding with validationActions Deny names it" in out, out


async def test_the_pod_patch_policy_unreadable_is_a_warning(kube: KubeDouble, tmp_path) -> None:
    """A viewer's role from before the policy cannot list it: a warning naming the grant, not a ✘."""
    async with inst.healthy(kube, tmp_path) as i:
        kube.fail_next("/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies", 403)
        code, out, _ = await check(*i.argv())
    assert (code, failed(out)) == (0, []), out
    assert "✔ pod-patch policy: cannot be read (warning)\n    warning: " in out
    assert "validatingadmissionpolicies and validatingadmissionpolicybindings" in out


async def test_namespaces_a_changed_selector_leaves_out(kube: KubeDouble, tmp_path) -> None:
    """`helm upgrade --set webhook.namespaceSelector.matchLabels.team=builds` (Helm merges it
    into the default's matchLabels): namespaces labelled initshift.io/enabled=true alone are no
    longer selected and their pods are created unchanged (seen on v1.34.9). The check named no
    namespace and told to label them initshift.io/enabled=true, which they already were."""
    kube.put("namespaces", {"metadata": {"name": "ci", "labels": {"initshift.io/enabled": "true", "team": "builds"}}})
    async with inst.healthy(kube, tmp_path) as i:
        config = kube.get("mutatingwebhookconfigurations", None, "initshift-webhook")
        config["webhooks"][0]["namespaceSelector"]["matchLabels"]["team"] = "builds"
        kube.put("mutatingwebhookconfigurations", config)
        # kube-system with the label too: never selected, on purpose (a line of its own says so)
        kube.put("namespaces", {"metadata": {"name": "kube-system", "labels": {"initshift.io/enabled": "true"}}})
        code, out, _ = await check(*i.argv())
    assert code == 1 and failed(out) == ["namespaces labelled initshift.io/enabled=true that the namespaceSelector "
                                         "does not select: builds (lacks team=builds), plain (lacks team=builds)"], out
    assert "Opt them in (kubectl label namespace NAME initshift.io/enabled=true team=builds)" in out
    assert "✔ opted-in namespaces: ci (no mesh injects)" in out
