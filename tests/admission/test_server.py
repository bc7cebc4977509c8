"""The admission server for real: uvicorn over HTTPS on a free loopback port, httpx with
the generated CA."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
import shlex
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tests.support import docs
from tests.support import https_helpers as h
from tests.support.fixtures import pods
from waiter import protocol as p
from webhook.admission import _review as admission
from webhook import logs
from webhook.cli import _review as review_cmd
from tests.support.patching import apply_patch, decode_patch
from webhook.rewrite._rewrite import rewrite
from webhook.admission._https import CompanionStopped, ListenError, bind
from webhook.admission._app import create_app
from webhook.settings import ServerSettings, settings_table
from webhook.watcher import WatcherStopped

OWN_NS = "initshift-system"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    h.make_certs(d)
    return d


@pytest.fixture(scope="module")
def server(pki):
    with h.running(h.settings_for(pki, namespace=OWN_NS), metrics_port=0) as srv:  # metrics on a free port
        yield srv


@pytest.fixture(scope="module")
def client(server, pki):
    with httpx.Client(verify=h.client_context(pki / "ca.crt"), base_url=h.base_url(server), timeout=30) as c:
        yield c


def mutate(client: httpx.Client, review: dict) -> dict:
    r = client.post("/mutate", json=review)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["response"]["uid"] == review["request"]["uid"]
    return answer


def test_kpack_build_pod_gets_the_rewrite_as_a_patch(client, server):
    pod = h.kpack_istio()
    answer = mutate(client, h.review(pod, namespace="builds"))
    resp = answer["response"]
    assert answer["apiVersion"] == admission.API_V1 and answer["kind"] == "AdmissionReview"
    assert resp["allowed"] is True and resp["patchType"] == "JSONPatch"
    patched = apply_patch(pod, decode_patch(answer))
    assert patched == rewrite(pod, server.settings).pod
    assert patched["metadata"]["labels"][p.LABEL_MANAGED] == p.MODE_WAITER
    assert [c["name"] for c in patched["spec"]["initContainers"]] == ["istio-init", p.INIT_CONTAINER_NAME]


def test_a_jobs_pod_without_init_containers_gets_its_mains_gated_as_a_patch(client, server):
    """Over the real HTTPS server: a CronJob's pod under Istio classic, patched so that its
    main waits for the proxy and quits it; counted as rewritten by the waiter strategy."""
    from tests.support.fixtures import pods
    from tests.support.podvalidate import assert_valid_pod

    pod = pods.catalogue()["cronjob-istio"]
    before = scrape(server)
    answer = mutate(client, h.review(pod, namespace="reports"))
    patched = apply_patch(pod, decode_patch(answer))
    assert patched == rewrite(pod, server.settings).pod
    assert patched["metadata"]["labels"][p.LABEL_MANAGED] == p.MODE_WAITER
    assert patched["spec"]["containers"][0]["command"] == [p.WAITER_PATH]
    assert_valid_pod({**patched, "metadata": {**patched["metadata"], "name": "x"}})

    def rewritten(text: str) -> float:
        line = next((x for x in text.splitlines()
                     if x.startswith('initshift_pods_total{reason="waiter",result="rewritten"}')), None)
        return float(line.split()[-1]) if line else 0.0

    assert rewritten(scrape(server)) == rewritten(before) + 1


def asking(pod: dict, mode: str) -> dict:
    """The pod with its own `initshift.io/mode`."""
    pod = copy.deepcopy(pod)
    pod["metadata"].setdefault("annotations", {})[p.ANNOTATION_MODE] = mode
    return pod


@pytest.mark.parametrize("pod, reason", [
    (pods.load("kpack-build"), "no-sidecar"),
    (pods.as_deployment_pod(pods.without_init(h.kpack_istio())), "no-init-containers"),
    (pods.as_deployment_pod(h.kpack_istio()), "restart-policy"),
    (asking(pods.inject_istio(pods.load("kpack-build"), "native"), p.MODE_NATIVE), "already-native"),
])
def test_unchanged_pods_have_no_patch_and_say_why(client, pod, reason):
    assert rewrite(pod, h.settings_for(Path("."))).reason == reason  # the case is what it claims
    answer = mutate(client, h.review(pod, namespace="builds"))
    resp = answer["response"]
    assert resp["allowed"] is True
    # The one change: the reason on a pod with init containers; nothing on a pod without.
    assert apply_patch(pod, decode_patch(answer)) == pods.not_rewritten(pod, reason)
    assert ("patch" in resp) == bool(pod["spec"].get("initContainers"))
    assert resp["warnings"] and all(w.strip() and "\n" not in w for w in resp["warnings"])


@pytest.mark.parametrize("mutation", ["deployment", "delete", "update", "subresource"])
def test_other_kinds_and_operations_are_allowed_unchanged(client, mutation):
    review = h.review(h.kpack_istio(), namespace="builds")
    req = review["request"]
    if mutation == "deployment":
        req["kind"] = {"group": "apps", "version": "v1", "kind": "Deployment"}
        req["resource"] = {"group": "apps", "version": "v1", "resource": "deployments"}
        req["object"] = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}}
    elif mutation == "delete":
        req["operation"], req["oldObject"], req["object"] = "DELETE", req["object"], None
    elif mutation == "update":
        req["operation"], req["oldObject"] = "UPDATE", copy.deepcopy(req["object"])
    else:
        req["subResource"] = "ephemeralcontainers"
    resp = mutate(client, review)["response"]
    assert resp == {"uid": req["uid"], "allowed": True}


def test_v1beta1_is_answered_in_v1beta1(client):
    answer = mutate(client, h.review(h.kpack_istio(), namespace="builds", api_version=admission.API_V1BETA1))
    assert answer["apiVersion"] == admission.API_V1BETA1
    assert answer["response"]["patchType"] == "JSONPatch" and decode_patch(answer)


def test_dry_run_gets_the_same_answer(client):
    pod = h.kpack_istio()
    wet = mutate(client, h.review(pod, namespace="builds"))
    dry = mutate(client, h.review(pod, namespace="builds", dry_run=True))
    assert dry == wet


@pytest.mark.parametrize("namespace", [OWN_NS, "kube-system"])
def test_own_namespace_and_kube_system_are_never_mutated(client, namespace):
    resp = mutate(client, h.review(h.kpack_istio(), namespace=namespace))["response"]
    assert resp["allowed"] is True and "patch" not in resp
    assert any(namespace in w for w in resp["warnings"])


def test_protected_namespace_taken_from_the_pod_when_the_request_has_none(client):
    review = h.review(h.kpack_istio(), namespace="kube-system")
    review["request"]["namespace"] = ""
    review["request"]["object"]["metadata"]["namespace"] = "kube-system"
    assert "patch" not in mutate(client, review)["response"]


def test_feature_gate_off_admits_unchanged(pki):
    settings = h.settings_for(pki)
    settings = settings.replace(feature_gate=False)
    with h.running(settings) as srv, httpx.Client(verify=h.client_context(pki / "ca.crt")) as c:
        resp = c.post(f"{h.base_url(srv)}/mutate", json=h.review(h.kpack_istio(), namespace="b")).json()["response"]
    assert "patch" not in resp and resp["warnings"]


def scrape(server) -> str:
    r = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return r.text


def test_health_ready_and_metrics(client, server):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["certificate"] is True and "strategy" in ready.json()
    mutate(client, h.review(h.kpack_istio(), namespace="builds"))
    client.post("/mutate", content=b"nope", headers={"content-type": "application/json"})
    text = scrape(server)
    assert 'initshift_admission_requests_total{outcome="patched"}' in text
    assert 'initshift_admission_requests_total{outcome="bad_request"}' in text
    # the reason of a rewritten pod names the strategy, never repeats the result
    assert 'initshift_pods_total{reason="waiter",result="rewritten"}' in text
    assert 'reason="rewritten"' not in text
    assert "initshift_admission_duration_seconds_bucket" in text
    from webhook import __version__

    assert f'initshift_build_info{{version="{__version__}"}} 1.0' in text
    assert "_created" not in text, "no _created series"
    expiry = [line for line in text.splitlines()
              if line.startswith('initshift_certificate_expiration_timestamp_seconds{certificate="serving"}')]
    from certs import pki as certs_pki
    from webhook.admission._tls import not_after

    assert len(expiry) == 1 and float(expiry[0].split()[-1]) == not_after(server.settings.server.tls_cert).timestamp()
    assert certs_pki.utcnow().timestamp() < float(expiry[0].split()[-1])


def test_tls_port_serves_only_admission_and_health(client):
    assert client.get("/metrics").status_code == 404


def test_metrics_port_off_and_in_use(pki):
    with h.running(h.settings_for(pki)) as srv:  # INITSHIFT_METRICS_PORT=0
        assert srv.metrics_port is None
    busy = bind()
    try:
        settings = h.settings_for(pki, metrics_port=busy.getsockname()[1])
        server = h.HttpsServer(settings, sock=bind(), graceful_seconds=1)
        with pytest.raises(ListenError, match=r"\(INITSHIFT_METRICS_PORT\): address already in use; give the "
                                              r"metrics another port, or 0 to turn them off$"):
            server.listen()
        server.sock.close()
    finally:
        busy.close()


def _serve_beside(pki, companion) -> list[BaseException]:
    """Run a real HTTPS server with `companion` beside it until the server stops (at most
    30 s); what `run()` raised."""
    server = h.HttpsServer(h.settings_for(pki), sock=bind(), graceful_seconds=1)
    raised: list[BaseException] = []

    def serve() -> None:
        try:
            server.run(companion)
        except BaseException as e:  # noqa: BLE001 - asserted by the callers
            raised.append(e)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    thread.join(30)
    server.sock.close()
    assert not thread.is_alive(), "the server kept serving after its companion ended"
    return raised


def test_a_companion_that_fails_stops_the_server(pki):
    """`serve --watch`: a watcher that stops with an error while the webhook serves stops
    the server too, so the process exits 1 and the kubelet restarts it, instead of serving
    reviews with no watcher to end their pods' sidecars."""
    failure = WatcherStopped("the watcher's controller failed: gone")

    async def companion(stop: asyncio.Event) -> None:
        await asyncio.sleep(0.3)
        raise failure

    assert _serve_beside(pki, companion) == [failure]


def test_a_companion_cancelled_by_no_one_here_stops_the_server(pki):
    """A companion ended by a stray cancellation (a library's bug, as aiohttp#8175 was) is
    not a stop the server asked for: it stops the server with an error naming it."""
    async def watcher(stop: asyncio.Event) -> None:
        await asyncio.sleep(0.3)
        raise asyncio.CancelledError  # as a library's stray cancellation surfaces

    raised = _serve_beside(pki, watcher)
    assert [type(e) for e in raised] == [CompanionStopped]
    assert str(raised[0]) == "watcher was cancelled while the server was serving"


# --- bad input, against the real server ----------------------------------------------------
GOOD = json.dumps(h.review(h.kpack_istio(), namespace="builds")).encode()
JSON_CT = {"content-type": "application/json"}


def _replace(path: list[str], value) -> bytes:
    doc = json.loads(GOOD)
    node = doc
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return json.dumps(doc).encode()


BAD = {
    "empty": (b"", JSON_CT),
    "an empty object": (b"{}", JSON_CT),
    "malformed json": (b'{"apiVersion": ', JSON_CT),
    "trailing garbage": (GOOD + b"}", JSON_CT),
    "not utf-8": (b'{"a": "\xff\xfe"}', JSON_CT),
    "array": (b"[1, 2]", JSON_CT),
    "NaN": (GOOD.replace(b'"dryRun": false', b'"dryRun": NaN'), JSON_CT),
    "a number too large for a float": (GOOD.replace(b'"dryRun": false', b'"dryRun": false, "x": 1e400'), JSON_CT),
    "deep nesting": (b'{"apiVersion": ' + b"[" * 200_000 + b"]" * 200_000 + b"}", JSON_CT),
    "huge integer": (b'{"a": ' + b"9" * 5000 + b"}", JSON_CT),
    "wrong content type": (GOOD, {"content-type": "text/plain"}),
    "form content type": (GOOD, {"content-type": "application/x-www-form-urlencoded"}),
    "missing request": (_replace(["request"], KeyError), JSON_CT),
    "null request": (_replace(["request"], None), JSON_CT),
    "request not an object": (_replace(["request"], "x"), JSON_CT),
    "wrong apiVersion": (_replace(["apiVersion"], "admission.k8s.io/v2"), JSON_CT),
    "wrong kind": (_replace(["kind"], "AdmissionResponse"), JSON_CT),
    "missing uid": (_replace(["request", "uid"], KeyError), JSON_CT),
    "uid not a string": (_replace(["request", "uid"], 7), JSON_CT),
    "missing operation": (_replace(["request", "operation"], KeyError), JSON_CT),
    "kind not an object": (_replace(["request", "kind"], "Pod"), JSON_CT),
    "dryRun not a bool": (_replace(["request", "dryRun"], "yes"), JSON_CT),
    "pod create without object": (_replace(["request", "object"], None), JSON_CT),
    "pod object a list": (_replace(["request", "object"], [1]), JSON_CT),
    # issue 17 finding 3: these were a 500 (the protected-namespace check ran outside the try)
    "pod namespace a list": (_replace(["request", "object", "metadata", "namespace"], ["kube-system"]), JSON_CT),
    "pod namespace a map": (_replace(["request", "object", "metadata", "namespace"], {"a": 1}), JSON_CT),
    "pod metadata a string": (_replace(["request", "object", "metadata"], "x"), JSON_CT),
    "pod name a number": (_replace(["request", "object", "metadata", "name"], 7), JSON_CT),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_is_a_one_line_400(client, name):
    body, headers = BAD[name]
    r = client.post("/mutate", content=body, headers=headers)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error and "\n" not in error and "Traceback" not in error and "None" not in error


def test_what_is_not_an_admission_review_says_what_is_missing(client):
    for body, words in ((b"{}", "not an AdmissionReview: apiVersion is missing (expected admission.k8s.io/v1 or "
                                "admission.k8s.io/v1beta1)"),
                        (b'{"apiVersion": "admission.k8s.io/v1"}', "not an AdmissionReview: kind is missing")):
        assert client.post("/mutate", content=body, headers=JSON_CT).json()["error"].startswith(words)


def test_body_over_the_limit_is_refused_by_content_length_and_a_chunked_one_by_its_head(client):
    limit = ServerSettings().max_body_bytes
    big = GOOD[:-1] + b', "pad": "' + b"x" * limit + b'"}'
    r = client.post("/mutate", content=big, headers=JSON_CT)
    assert r.status_code == 413 and "INITSHIFT_MAX_BODY_BYTES" in r.json()["error"]
    assert r.headers["connection"] == "close"  # the body was not read

    def chunks():  # no Content-Length: chunked transfer encoding
        yield GOOD[: len(GOOD) // 2]
        yield GOOD[len(GOOD) // 2:]

    r = client.post("/mutate", content=chunks(), headers=JSON_CT)
    assert r.status_code == 411 and "Content-Length" in r.json()["error"]
    assert r.headers["connection"] == "close"
    # and the server is fine afterwards
    assert client.post("/mutate", content=GOOD, headers=JSON_CT).status_code == 200


def test_configured_body_limit(pki):
    with h.running(h.settings_for(pki, max_body_bytes=1000)) as srv, \
            httpx.Client(verify=h.client_context(pki / "ca.crt"), base_url=h.base_url(srv)) as c:
        assert c.post("/mutate", content=GOOD, headers=JSON_CT).status_code == 413
        small = h.review({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a"},
                          "spec": {"containers": [{"name": "a", "image": "busybox"}]}})
        assert c.post("/mutate", json=small).status_code == 200


# --- failure mode (in-process: the fault is a native-sidecar detector that crashes) -------
def _crashing() -> bool | None:
    raise RuntimeError("detector exploded")


@pytest.mark.parametrize("mode", ["ignore", "deny"])
async def test_internal_error_follows_the_failure_mode(pki, mode):
    app = create_app(h.settings_for(pki, failure_mode=mode), native_supported=_crashing)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.post("/mutate", json=h.review(h.kpack_istio(), namespace="builds"))
    assert r.status_code == 200
    resp = r.json()["response"]
    assert "patch" not in resp
    if mode == "ignore":
        assert resp["allowed"] is True and "detector exploded" in resp["warnings"][0]
    else:
        assert resp["allowed"] is False and "detector exploded" in resp["status"]["message"]


async def test_readyz_is_503_until_certificates_are_loaded(pki):
    loaded = False
    app = create_app(h.settings_for(pki), ready=lambda: loaded)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        assert (await c.get("/readyz")).status_code == 503
        loaded = True
        assert (await c.get("/readyz")).status_code == 200


# --- logs -------------------------------------------------------------------------------------
def test_one_json_log_line_per_review_without_pod_contents(client, caplog):
    pod = h.kpack_istio()
    pod["metadata"]["name"], pod["metadata"]["generateName"] = "", "build-pod-"
    review = h.review(pod, namespace="builds")
    with caplog.at_level(logging.INFO, logger="initshift.review"):
        mutate(client, review)
    records = [r for r in caplog.records if r.name == "initshift.review"]
    assert len(records) == 1
    line = logs.JsonFormatter().format(records[0])
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["uid"] == review["request"]["uid"] and entry["namespace"] == "builds"
    assert entry["pod"] == "build-pod-" and entry["decision"] == "patched" and entry["duration_ms"] >= 0
    assert "istio-proxy" not in line and "GIT_URL" not in line


# --- TLS -------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_tls_1_2_and_newer_only(server, pki, version):
    # This OpenSSL refuses TLS < 1.2 on the client side too, so the floor is checked on the
    # context the listening socket uses; each allowed version is checked by a handshake.
    assert server.reloader.ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    ctx = h.client_context(pki / "ca.crt")
    ctx.minimum_version = ctx.maximum_version = version
    assert httpx.get(f"{h.base_url(server)}/healthz", verify=ctx).status_code == 200


def test_client_certificate_verification(pki, tmp_path):
    from certs import pki as certpki

    client_ca = certpki.create_ca("clients")
    leaf = certpki.create_serving(client_ca, ["kube-apiserver"], client=True)
    (tmp_path / "client-ca.crt").write_bytes(client_ca.cert_pem)
    (tmp_path / "c.crt").write_bytes(leaf.cert_pem)
    (tmp_path / "c.key").write_bytes(leaf.key_pem)
    with h.running(h.settings_for(pki, client_ca=str(tmp_path / "client-ca.crt"))) as srv:
        url = f"{h.base_url(srv)}/healthz"
        with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
            httpx.get(url, verify=h.client_context(pki / "ca.crt"))
        ctx = h.client_context(pki / "ca.crt", cert=(str(tmp_path / "c.crt"), str(tmp_path / "c.key")))
        assert httpx.get(url, verify=ctx).status_code == 200


def test_review_command_wraps_a_pod(tmp_path, capsys):
    assert review_cmd.main(["examples/pod-kpack.yaml", "--uid", "u1", "--dry-run"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["request"]["uid"] == "u1" and doc["request"]["dryRun"] is True
    assert doc["request"]["namespace"] == "builds" and doc["request"]["object"]["kind"] == "Pod"
    admission.parse_review(json.dumps(doc).encode())
    (tmp_path / "bad.yaml").write_text("a: [")
    assert review_cmd.main([str(tmp_path / "bad.yaml")]) == 2  # bad input, as `initshift mutate`
    assert review_cmd.main([str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "Traceback" not in err


def test_review_command_output_is_a_format_and_out_a_file(tmp_path, monkeypatch, capsys):
    """-o names a format, as `mutate -o` and kubectl's -o do (`-o json` wrote a file named
    ./json and printed nothing); --out FILE writes the file."""
    import yaml

    pod = str(Path("examples/pod-kpack.yaml").resolve(strict=True))
    monkeypatch.chdir(tmp_path)
    assert review_cmd.main([pod, "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "AdmissionReview"
    assert review_cmd.main([pod, "-o", "yaml", "-n", "builds"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["request"]["namespace"] == "builds"
    assert list(tmp_path.iterdir()) == []  # no file named json or yaml
    assert review_cmd.main([pod, "--out", "review.json", "--uid", "u2"]) == 0
    assert capsys.readouterr().out == ""
    assert json.loads((tmp_path / "review.json").read_text())["request"]["uid"] == "u2"


def test_example_review_is_the_example_pod():
    review = json.loads(Path("examples/review.json").read_text())
    assert review["request"]["object"] == review_cmd.load_pod("examples/pod-kpack.yaml")


def test_docs_settings_table_is_exactly_the_generated_one():
    lines = docs.page("admission-server.md").splitlines()
    header = settings_table().splitlines()[0]
    start = lines.index(header)
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    assert "\n".join(lines[start:end]) == settings_table()


def test_dev_server_serves_the_example_with_a_patch(tmp_path):
    """What `make run` runs, as a process: certificates appear in its directory, the
    printed curl command's request gets a real patch."""
    socks = [bind(), bind()]
    port, metrics_port = (s.getsockname()[1] for s in socks)
    for s in socks:
        s.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INITSHIFT_", p.FEATURE_GATE_ENV))}
    # a free metrics port too: the default 8080 would collide with another test run on this machine
    env.update(INITSHIFT_PORT=str(port), INITSHIFT_METRICS_PORT=str(metrics_port))
    proc = subprocess.Popen([sys.executable, "-m", "webhook.cli", "dev-server", "--dir", str(tmp_path / "run")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        banner = []
        for line in proc.stdout:  # type: ignore[union-attr]  # the banner; stderr holds the JSON log lines
            banner.append(line)
            if line.strip().startswith("curl "):
                break
        curl = banner[-1].strip()
        args = shlex.split(curl)
        assert args[args.index("--cacert") + 1] == str(tmp_path / "run" / "ca.crt")
        assert args[-1] == f"https://127.0.0.1:{port}/mutate"
        assert f"@{Path('examples/review.json').resolve()}" in args
        # pasted anywhere (not in the checkout), it works
        out = subprocess.run(curl, shell=True, cwd=tmp_path, capture_output=True, timeout=60, check=True)
        assert decode_patch(json.loads(out.stdout))
    finally:
        proc.terminate()
        proc.wait(20)
    assert proc.returncode == 0  # SIGTERM: a graceful stop
