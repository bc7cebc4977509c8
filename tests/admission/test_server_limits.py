"""The server's guards against slow, idle, many and heavy clients (issue 17 findings 3, 5,
6, 7), over real TLS sockets: every guard answers or closes within its configured time
(the bounds below are generous multiples of it: they check that the guard exists, not
how fast the machine is), and the server keeps serving afterwards."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.support import https_helpers as h
from webhook import metrics
from webhook.admission._app import INLINE_MAX_BYTES

REVIEW = h.review(h.kpack_istio(), namespace="builds")
BODY = json.dumps(REVIEW).encode()
JSON_CT = {"content-type": "application/json"}


def _big_review() -> bytes:
    """BODY's pod with an annotation that makes the review bigger than INLINE_MAX_BYTES."""
    review = json.loads(BODY)
    review["request"]["object"]["metadata"].setdefault("annotations", {})["example.com/pad"] = "x" * INLINE_MAX_BYTES
    return json.dumps(review).encode()


BIG_BODY = _big_review()


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    h.make_certs(d)
    return d


def tls(port: int, pki: Path, **ctx_kw) -> ssl.SSLSocket:
    ctx = h.client_context(pki / "ca.crt")
    for k, v in ctx_kw.items():
        setattr(ctx, k, v)
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    return ctx.wrap_socket(raw, server_hostname="localhost")


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes `sock` (EOF or reset) within `seconds`."""
    sock.settimeout(seconds)
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            if not sock.recv(65536):
                return True
    except (ConnectionError, ssl.SSLError):
        return True
    except (socket.timeout, TimeoutError):
        return False
    return False


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    sock.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        body += sock.recv(65536)
    return int(lines[0].split()[1]), headers, body


@contextlib.contextmanager
def held_review(server, pki: Path, body: bytes = BIG_BODY, when=lambda _body: True) -> Iterator[list[httpx.Response]]:
    """`body` posted from a thread and held on its lane's thread (the reviewer's first step
    blocked, for bodies `when` picks) while the block runs; its answer lands in the list
    once released. The default is over INLINE_MAX_BYTES: a smaller review is worked on the
    event loop, where holding it would hold the server."""
    reviewer = server.app.state.reviewer
    real, release, entered = reviewer.start, threading.Event(), threading.Event()

    def held(sent: bytes):
        if when(sent):
            entered.set()
            assert release.wait(60)
        return real(sent)

    reviewer.start = held
    answers: list[httpx.Response] = []
    poster = threading.Thread(target=lambda: answers.append(httpx.post(
        f"{h.base_url(server)}/mutate", content=body, headers=JSON_CT, verify=h.client_context(pki / "ca.crt"),
        timeout=60)))
    try:
        poster.start()
        assert entered.wait(30)
        yield answers
    finally:
        release.set()
        poster.join(60)
        reviewer.start = real


def request_head(length: int) -> bytes:
    return (f"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


# --- finding 6: slow and idle clients ---------------------------------------------------------
def test_slow_headers_idle_connections_and_silent_sockets_are_closed(pki):
    settings = h.settings_for(pki, header_timeout_seconds=1.0, keepalive_timeout_seconds=1.0)
    with h.running(settings) as server:
        idle = tls(server.port, pki)  # handshake done, never a byte
        assert closed_within(idle, 10)
        slow = tls(server.port, pki)  # slowloris: a header byte every 0.3 s
        deadline = time.monotonic() + 10
        try:
            for byte in request_head(len(BODY)) * 10:
                slow.sendall(bytes([byte]))
                time.sleep(0.3)
                assert time.monotonic() < deadline
        except (ConnectionError, ssl.SSLError):
            pass
        else:
            pytest.fail("the slow client was never cut off")
        silent = socket.create_connection(("127.0.0.1", server.port), timeout=10)  # no TLS ClientHello
        assert closed_within(silent, 10)
        kept = tls(server.port, pki)  # an answered keep-alive connection, then idle
        kept.sendall(request_head(len(BODY)) + BODY)
        assert read_response(kept)[0] == 200
        assert closed_within(kept, 10)
        with httpx.Client(verify=h.client_context(pki / "ca.crt")) as c:  # and it still serves
            assert c.post(f"{h.base_url(server)}/mutate", content=BODY, headers=JSON_CT).status_code == 200
        exposed = metrics.exposition()[0].decode()  # the server runs in this process
        assert 'initshift_connections_closed_total{reason="header-timeout"}' in exposed


def test_a_stalled_body_is_a_408_and_gives_its_bytes_back(pki):
    settings = h.settings_for(pki, body_timeout_seconds=1.0)
    with h.running(settings) as server:
        capacity = server.app.state.capacity
        s = tls(server.port, pki)
        s.sendall(request_head(len(BODY)) + BODY[:100])  # 100 bytes, then nothing
        status, headers, body = read_response(s)
        assert status == 408 and headers.get("connection") == "close"
        assert "not complete" in json.loads(body)["error"]
        assert capacity.reviews == 0 and capacity.body_bytes == 0


# --- finding 5: bounded work in hand, refused fast -------------------------------------------
def test_reviews_beyond_the_limit_are_refused_at_once_with_503(pki):
    """Complete reviews in hand are capped per lane; a review held on the worker thread
    (here: until released) takes the one place, the next is refused at once."""
    settings = h.settings_for(pki, max_pending_reviews=1)
    with h.running(settings) as server, httpx.Client(verify=h.client_context(pki / "ca.crt")) as c:
        with held_review(server, pki) as answers:
            r = c.post(f"{h.base_url(server)}/mutate", content=BODY, headers=JSON_CT)
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert "busy" in r.json()["error"] and "INITSHIFT_MAX_PENDING_REVIEWS" in r.json()["error"]
            assert c.get(f"{h.base_url(server)}/healthz").status_code == 200  # never refused
        assert [a.status_code for a in answers] == [200]
        assert c.post(f"{h.base_url(server)}/mutate", content=BODY, headers=JSON_CT).status_code == 200


def test_body_bytes_in_flight_are_capped(pki):
    """Bytes are counted as they arrive: a body stalled 10 bytes short holds the rest."""
    settings = h.settings_for(pki, max_body_bytes_in_flight=len(BODY) + 10)
    with h.running(settings) as server, httpx.Client(verify=h.client_context(pki / "ca.crt")) as c:
        holder = tls(server.port, pki)
        holder.sendall(request_head(len(BODY)) + BODY[:-10])
        deadline = time.monotonic() + 5
        while server.app.state.capacity.body_bytes < len(BODY) - 10:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        r = c.post(f"{h.base_url(server)}/mutate", content=BODY, headers=JSON_CT)
        assert r.status_code == 503 and "INITSHIFT_MAX_BODY_BYTES_IN_FLIGHT" in r.json()["error"]
        assert r.headers["connection"] == "close"  # its body was not read to the end
        holder.sendall(BODY[-10:])
        assert read_response(holder)[0] == 200
        assert c.post(f"{h.base_url(server)}/mutate", content=BODY, headers=JSON_CT).status_code == 200


def test_connections_over_the_cap_are_closed_at_once(pki):
    settings = h.settings_for(pki, max_connections=3, header_timeout_seconds=60.0)
    with h.running(settings) as server:
        held = [tls(server.port, pki) for _ in range(3)]
        extra = tls(server.port, pki)
        assert closed_within(extra, 10)
        for s in held:
            s.close()
        time.sleep(0.2)
        with httpx.Client(verify=h.client_context(pki / "ca.crt")) as c:
            assert c.get(f"{h.base_url(server)}/healthz").status_code == 200


# --- finding 7: cipher policy --------------------------------------------------------------------
@pytest.mark.parametrize("cipher", ["AES128-SHA", "AES256-SHA", "ECDHE-RSA-AES128-SHA", "AES128-GCM-SHA256"])
def test_tls12_refuses_sha1_cbc_and_static_rsa_suites(pki, cipher):
    with h.running(h.settings_for(pki)) as server:
        ctx = h.client_context(pki / "ca.crt")
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_ciphers(cipher + ":@SECLEVEL=0")
        with pytest.raises((ssl.SSLError, ConnectionError)):
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
                ctx.wrap_socket(raw, server_hostname="localhost").close()
        ctx = h.client_context(pki / "ca.crt")
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname="localhost") as s:
            name, version, _ = s.cipher()
            assert version == "TLSv1.2" and name.startswith("ECDHE-") and ("GCM" in name or "CHACHA20" in name)


# --- finding 3: a 500 closes its connection properly -----------------------------------------------
def test_an_unexpected_500_says_connection_close_and_the_next_request_works(pki):
    with h.running(h.settings_for(pki)) as server, httpx.Client(verify=h.client_context(pki / "ca.crt")) as c:
        reviewer = server.app.state.reviewer
        real = reviewer.start

        def broken(*_args, **_kw):
            raise RuntimeError("a bug outside the failure mode")

        reviewer.start = broken
        try:
            r = c.post(f"{h.base_url(server)}/mutate", content=BODY, headers=JSON_CT)
        finally:
            reviewer.start = real
        assert r.status_code == 500 and r.headers["connection"] == "close"
        assert r.json() == {"error": "internal error: RuntimeError"}
        assert c.post(f"{h.base_url(server)}/mutate", content=BODY, headers=JSON_CT).status_code == 200


def test_a_big_review_being_worked_on_never_holds_the_event_loop(pki):
    """Finding 5: a review over INLINE_MAX_BYTES runs on its lane's worker thread, so while
    one is in progress (here: held until released) the loop still completes new TLS handshakes and answers
    /healthz; the held review is answered afterwards."""
    with h.running(h.settings_for(pki)) as server:
        with held_review(server, pki) as answers:
            for _ in range(5):  # new connections, each a full handshake, answered meanwhile
                with httpx.Client(verify=h.client_context(pki / "ca.crt")) as fresh:
                    assert fresh.get(f"{h.base_url(server)}/healthz").status_code == 200
            assert answers == []  # the review is still held
        assert [a.status_code for a in answers] == [200]


def test_small_reviews_are_worked_on_the_event_loop_big_ones_on_the_worker_thread(pki):
    """An ordinary review skips the hop to the worker thread (issue 26): it costs less than
    the hop itself; a review over INLINE_MAX_BYTES does not hold the loop (the test above)."""
    import threading

    with h.running(h.settings_for(pki)) as server, httpx.Client(verify=h.client_context(pki / "ca.crt")) as c:
        reviewer = server.app.state.reviewer
        real, threads = reviewer.start, []

        def recorded(body: bytes):
            threads.append(threading.current_thread().name)
            return real(body)

        reviewer.start = recorded
        try:
            for body in (BODY, BIG_BODY):
                r = c.post(f"{h.base_url(server)}/mutate", content=body, headers=JSON_CT)
                assert r.status_code == 200 and r.json()["response"]["patch"]
        finally:
            reviewer.start = real
    assert len(BODY) <= INLINE_MAX_BYTES < len(BIG_BODY)
    assert threads == ["initshift-https", "initshift-review-small_0"]


@pytest.mark.parametrize("path", ["/mutate", "/healthz"])
def test_an_answer_is_written_in_one_piece(pki, path):
    """Head and body go out in one write (issue 26), so one TLS record: the first read of
    the client's TLS socket, which returns at most one record, holds the whole answer."""
    with h.running(h.settings_for(pki)) as server:
        s = tls(server.port, pki)
        if path == "/mutate":
            s.sendall(request_head(len(BODY)) + BODY)
        else:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        s.settimeout(10)
        first = s.recv(1 << 20)
        head, _, body = first.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        assert head.startswith(b"HTTP/1.1 200") and len(body) == length > 0
