"""One client must not starve or kill the server (issue 24), over real TLS sockets: the
request head's limits, the metrics port under a flood, slow bodies that never take a
review's place, large reviews in a lane of their own, shapes no apiserver sends, unread
answers and deep pipelining. Waits are bounded by generous deadlines: they check that a
guard exists, not how fast the machine is."""

from __future__ import annotations

import copy
import json
import socket
import ssl
import threading
import time

import httpx
import pytest

from tests.admission.test_server_limits import (BODY, JSON_CT, REVIEW, closed_within, held_review, pki,  # noqa: F401
                                                read_response, request_head, tls)
from tests.admission.test_server_workers import wait_for
from tests.support import https_helpers as h
from webhook import metrics
from tests.support.patching import decode_patch
from webhook.rewrite._podcheck import MAX_OBJECT_BYTES, object_bytes

def closed_count(reason: str) -> float:
    """initshift_connections_closed_total{reason} of this process (the server runs in it)."""
    for line in metrics.exposition()[0].decode().splitlines():
        if line.startswith(f'initshift_connections_closed_total{{reason="{reason}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def near_etcd_limit_pod() -> dict:
    """A build pod just under etcd's 1.5 MiB object limit: what a real apiserver may send."""
    pod = h.kpack_istio()
    main = pod["spec"]["containers"][0]
    main.setdefault("env", []).append({"name": "PAD", "value": ""})
    main["env"][-1]["value"] = "x" * (MAX_OBJECT_BYTES - object_bytes(pod) - 20_000)
    return pod


# --- point 1: the request head --------------------------------------------------------------------
HEADS = {
    "many fields": b"POST /mutate HTTP/1.1\r\nHost: localhost\r\n" + b"".join(
        b"X-%d: 1\r\n" % i for i in range(150)) + b"\r\n",
    "one large field": b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n",
    "long request line": b"POST /mutate?" + b"q" * 20_000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n",
}


@pytest.mark.parametrize("case", sorted(HEADS))
def test_an_oversized_head_is_a_431_and_the_server_keeps_serving(pki, case):
    with h.running(h.settings_for(pki)) as server:
        s = tls(server.port, pki)
        s.sendall(HEADS[case])
        status, headers, body = read_response(s)
        assert status == 431 and headers["connection"] == "close"
        assert "INITSHIFT_MAX_HEADER" in json.loads(body)["error"]
        assert closed_within(s, 10)
        with httpx.Client(verify=h.client_context(pki / "ca.crt")) as c:
            assert c.post(f"{h.base_url(server)}/mutate", content=BODY, headers=JSON_CT).status_code == 200


def test_a_header_flood_is_cut_off_before_it_is_buffered(pki):
    """32 MB of small headers: the server stops reading at INITSHIFT_MAX_HEADER_BYTES (431,
    closed) instead of keeping them all (the issue: a worker grew from 318 to 778 MB)."""
    with h.running(h.settings_for(pki)) as server:
        s = tls(server.port, pki)
        line = b"X-Flood: " + b"f" * 80 + b"\r\n"
        chunk = line * (64 * 1024 // len(line))
        s.sendall(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\n")
        sent, cut = 0, False
        try:
            while sent < 32 * 1024 * 1024:
                s.sendall(chunk)
                sent += len(chunk)
        except (ConnectionError, ssl.SSLError, socket.timeout):
            cut = True
        if not cut:  # every byte fitted in the socket buffers: the answer must be the 431
            assert read_response(s)[0] == 431
        assert sent < 32 * 1024 * 1024 or not cut
        assert closed_count("header-limit") >= 1
        assert closed_within(s, 10)


# --- point 2: the metrics port ----------------------------------------------------------------------
def test_a_flood_of_unfinished_metrics_requests_is_bounded_and_does_not_stop_mutate(pki):
    from webhook.admission import _metrics_port

    with h.running(h.settings_for(pki), metrics_port=0) as server, \
            httpx.Client(verify=h.client_context(pki / "ca.crt")) as c:
        threads_before = threading.active_count()
        flood = []
        for _ in range(3 * _metrics_port.MAX_CONNECTIONS):
            s = socket.create_connection(("127.0.0.1", server.metrics_port), timeout=10)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finished
            flood.append(s)
        # Over the cap: closed at once. No thread per connection.
        assert sum(closed_within(s, 0.5) for s in flood) >= 2 * _metrics_port.MAX_CONNECTIONS - 2
        assert threading.active_count() <= threads_before + 2
        assert c.post(f"{h.base_url(server)}/mutate", content=BODY, headers=JSON_CT).status_code == 200
        # The rest: closed after the read timeout.
        assert all(closed_within(s, _metrics_port.READ_TIMEOUT + 10) for s in flood)
        r = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics")
        assert r.status_code == 200 and "initshift_admission_requests_total" in r.text
        assert 'initshift_connections_closed_total{reason="metrics-over-limit"}' in r.text
        for s in flood:
            s.close()


def test_the_metrics_address_is_a_setting_of_its_own(pki):
    with h.running(h.settings_for(pki, metrics_host="127.0.0.2"), metrics_port=0) as server:
        assert httpx.get(f"http://127.0.0.2:{server.metrics_port}/metrics").status_code == 200
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics")


# --- point 3: slow bodies never take a review's place -----------------------------------------------
def test_slow_bodies_do_not_count_as_reviews_in_hand(pki):
    """The issue: 140 clients each declaring 100 bytes and sending 10 made every /mutate a
    503 for 30 s. Here 12 such clients against a limit of 2 reviews in hand."""
    settings = h.settings_for(pki, max_pending_reviews=2, body_timeout_seconds=30.0)
    with h.running(settings) as server, httpx.Client(verify=h.client_context(pki / "ca.crt")) as c:
        slow = [tls(server.port, pki) for _ in range(12)]
        for s in slow:
            s.sendall(request_head(100) + b"{" * 10)
        capacity = server.app.state.capacity
        wait_for(lambda: capacity.body_bytes == 120, what="the slow bodies' bytes")
        assert capacity.reviews == 0
        for _ in range(3):
            assert c.post(f"{h.base_url(server)}/mutate", content=BODY, headers=JSON_CT).status_code == 200
        for s in slow:
            s.close()


# --- point 4: large reviews in a lane of their own ------------------------------------------------
def test_a_large_review_in_hand_never_holds_up_small_ones(pki):
    """A review over INITSHIFT_LARGE_REVIEW_BYTES held on its lane's thread (here: until
    released): small reviews are answered meanwhile, a second large one waits unread and is
    refused after the body timeout, and the held one completes. Before, one thread served
    both: the small review waited."""
    large = json.dumps(h.review(near_etcd_limit_pod(), namespace="builds")).encode()
    with h.running(h.settings_for(pki, body_timeout_seconds=1.0)) as server, \
            httpx.Client(verify=h.client_context(pki / "ca.crt"), timeout=60) as c:
        with held_review(server, pki, large, when=lambda body: len(body) > server.settings.server.large_review_bytes) \
                as answers:
            small = [c.post(f"{h.base_url(server)}/mutate", content=BODY, headers=JSON_CT) for _ in range(3)]
            second = c.post(f"{h.base_url(server)}/mutate", content=large, headers=JSON_CT)
        assert [r.status_code for r in small] == [200, 200, 200]
        assert second.status_code == 503 and "INITSHIFT_MAX_LARGE_REVIEWS" in second.json()["error"]
        assert [r.status_code for r in answers] == [200]
        assert answers[0].json()["response"].get("patch")  # the pod near etcd's limit is rewritten


# --- point 5: shapes no apiserver sends, unread answers, pipelining -------------------------------
def _with(change) -> bytes:
    doc = copy.deepcopy(REVIEW)
    change(doc["request"]["object"])
    return json.dumps(doc).encode()


ODD_PODS = {
    "labels a string": _with(lambda o: o["metadata"].__setitem__("labels", "x")),
    "labels a list": _with(lambda o: o["metadata"].__setitem__("labels", ["a", "b"])),
    "spec [null]": _with(lambda o: o.__setitem__("spec", [None])),
    "spec a string": _with(lambda o: o.__setitem__("spec", "x")),
}
NOT_REVIEWS = {
    "a lone surrogate": _with(lambda o: o["metadata"].setdefault("annotations", {}).__setitem__("a", "\udfff")),
    "UTF-16": json.dumps(REVIEW).encode("utf-16"),
    "UTF-32": json.dumps(REVIEW).encode("utf-32"),
    "UTF-16 without a BOM": json.dumps(REVIEW).encode("utf-16-le"),
}


@pytest.mark.parametrize("failure_mode", ["ignore", "deny"])
def test_shapes_no_apiserver_sends_get_a_clear_decision(pki, failure_mode):
    with h.running(h.settings_for(pki, failure_mode=failure_mode)) as server, \
            httpx.Client(verify=h.client_context(pki / "ca.crt")) as c:
        for name, body in ODD_PODS.items():
            r = c.post(f"{h.base_url(server)}/mutate", content=body, headers=JSON_CT)
            assert r.status_code == 200, name
            answer = r.json()["response"]
            assert answer["allowed"] is True, name
            # Not rewritten; at most the reason noted on the pod.
            assert all(op["path"].startswith("/metadata/annotations") for op in decode_patch(r.json())), name
            assert "internal error" not in r.text and "admitted unchanged" in " ".join(answer["warnings"]), name
        for name, body in NOT_REVIEWS.items():
            r = c.post(f"{h.base_url(server)}/mutate", content=body, headers=JSON_CT)
            assert r.status_code == 400 and "\n" not in r.json()["error"], name
            assert any(word in r.json()["error"] for word in ("UTF-8", "surrogate", "malformed JSON")), name


def test_an_answer_its_client_never_reads_is_dropped(pki):
    """The client sends reviews and never reads: once the answers fill the socket buffers
    the server stops writing, and drops the connection after INITSHIFT_WRITE_TIMEOUT_SECONDS
    (before: held until the kernel gave up, ~35 s)."""
    before = closed_count("write-timeout")
    with h.running(h.settings_for(pki, write_timeout_seconds=1.0, keepalive_timeout_seconds=60.0)) as server:
        raw = socket.socket()
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        raw.settimeout(5)
        raw.connect(("127.0.0.1", server.port))
        s = h.client_context(pki / "ca.crt").wrap_socket(raw, server_hostname="localhost")
        try:
            for _ in range(2000):  # one at a time: each is answered before the next arrives
                s.sendall(request_head(len(BODY)) + BODY)
                time.sleep(0.002)
                if closed_count("write-timeout") > before:
                    break
        except (ConnectionError, ssl.SSLError, socket.timeout):
            pass  # the server stopped reading (its answers unread) or dropped the connection
        wait_for(lambda: closed_count("write-timeout") > before, what="the write timeout")
        s.close()


def test_deep_pipelining_loses_the_connection(pki):
    """No apiserver pipelines; a client queueing thousands of requests on one connection
    (100k grew a worker by 200 MB) loses it past 16 queued."""
    with h.running(h.settings_for(pki)) as server:
        s = tls(server.port, pki)
        burst = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n" * 2000
        s.settimeout(10)
        try:
            s.sendall(burst)
        except (ConnectionError, ssl.SSLError, socket.timeout):
            pass
        got = b""
        try:
            while chunk := s.recv(65536):
                got += chunk
        except (ConnectionError, ssl.SSLError, socket.timeout):
            pass
        assert got.count(b"HTTP/1.1 200") < 2000
        assert closed_count("pipelined") >= 1
        with httpx.Client(verify=h.client_context(pki / "ca.crt")) as c:
            assert c.get(f"{h.base_url(server)}/healthz").status_code == 200
