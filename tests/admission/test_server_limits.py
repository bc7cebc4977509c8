"""The front door's guards (webhook/admission/_guards.py) and how reviews are taken
(_app.py), each against a real server in this process over real TLS sockets. Deadlines
are set short and waits are generous multiples of them: a test checks that a guard fires,
and waits for the event it needs, never for a number of other requests."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import signal
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import httpx
import pytest

from tests.support import hostile
from tests.support import https_helpers as h
from webhook import metrics
from webhook.admission import HttpsServer
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


def tls(port: int, pki: Path, source: str = "", **ctx_kw) -> ssl.SSLSocket:
    """A TLS connection to the server, from loopback address `source` (default 127.0.0.1)."""
    ctx = h.client_context(pki / "ca.crt")
    for k, v in ctx_kw.items():
        setattr(ctx, k, v)
    raw = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0) if source else None)
    return ctx.wrap_socket(raw, server_hostname="localhost")


def closed_within(sock: socket.socket, seconds: float) -> bool:
    return not hostile.wait_closed([sock], seconds)


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    sock.setblocking(True)
    sock.settimeout(30)
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


def request_head(length: int | None, path: str = "/mutate") -> bytes:
    size = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{size}\r\n\r\n".encode()


def _answer(sock: socket.socket) -> dict[str, str]:
    """A review sent on `sock`, answered 200: the answer's headers."""
    sock.sendall(request_head(len(BODY)) + BODY)
    status, headers, _ = read_response(sock)
    assert status == 200
    return headers


def counted(name: str, label: str) -> float:
    """A counter of this process's registry (the server runs in it), 0 when absent."""
    for line in metrics.exposition()[0].decode().splitlines():
        if line.startswith(f'{name}{{{label}}} '):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def closed_count(reason: str) -> float:
    return counted("initshift_connections_closed_total", f'reason="{reason}"')


def wait_for(condition, seconds: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@contextlib.contextmanager
def held_review(server, pki: Path, body: bytes = BIG_BODY) -> Iterator[list[httpx.Response]]:
    """`body` (a large review) posted from a thread and held on the large turn's thread
    while the block runs; its answer lands in the list once released."""
    reviewer = server.app.state.reviewer
    real, release, entered = reviewer.parse, threading.Event(), threading.Event()

    def held(sent: bytes):
        if sent == body:
            entered.set()
            assert release.wait(120)
        return real(sent)

    reviewer.parse = held
    answers: list[httpx.Response] = []
    poster = threading.Thread(target=lambda: answers.append(httpx.post(
        f"{h.base_url(server)}/mutate", content=body, headers=JSON_CT, verify=h.client_context(pki / "ca.crt"),
        timeout=120)))
    try:
        poster.start()
        assert entered.wait(60)
        yield answers
    finally:
        release.set()
        poster.join(120)
        reviewer.parse = real


# --- deadlines ---------------------------------------------------------------------------------
def test_slow_heads_idle_connections_and_silent_sockets_are_closed(pki):
    settings = h.settings_for(pki, header_timeout_seconds=1.0, keepalive_timeout_seconds=1.0)
    before = closed_count("header-timeout")
    with h.running(settings) as server:
        idle = tls(server.port, pki)  # handshake done, never a byte
        silent = socket.create_connection(("127.0.0.1", server.port), timeout=10)  # no ClientHello
        half = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        half.sendall(b"\x16\x03\x01")  # the first bytes of a ClientHello, then nothing
        slow = tls(server.port, pki)  # slowloris: a header byte every 0.2 s
        slow.sendall(b"POST /mutate HTTP/1.1\r\n")
        assert hostile.trickle([slow], 30, every=0.2, silent=[idle, silent, half]) < 30
        kept = tls(server.port, pki)  # an answered keep-alive connection, then idle
        kept.sendall(request_head(len(BODY)) + BODY)
        assert read_response(kept)[0] == 200
        assert closed_within(kept, 30)
        with httpx.Client(verify=h.client_context(pki / "ca.crt")) as c:  # and it still serves
            assert c.post(f"{h.base_url(server)}/mutate", content=BODY, headers=JSON_CT).status_code == 200
    assert closed_count("header-timeout") >= before + 2


def _answered_owing_a_body(port: int, pki: Path) -> ssl.SSLSocket:
    """A connection whose `GET /healthz` declares 1,000 body bytes it never sends: answered
    (the app reads no body there), the body still owed."""
    sock = tls(port, pki)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n\r\n")
    assert read_response(sock)[0] == 200
    return sock


def test_a_body_the_app_answered_without_reading_has_the_bodys_deadline(pki):
    settings = h.settings_for(pki, header_timeout_seconds=60.0, body_timeout_seconds=1.0)
    before = closed_count("body-timeout")
    with h.running(settings) as server:
        owing = _answered_owing_a_body(server.port, pki)
        assert closed_within(owing, 30)  # not uvicorn's keep-alive timer, 125 s later
    assert closed_count("body-timeout") == before + 1


def test_past_the_cap_a_connection_owing_a_body_after_its_answer_is_evicted(pki):
    settings = h.settings_for(pki, max_connections=2, header_timeout_seconds=60.0, body_timeout_seconds=60.0)
    with h.running(settings) as server:
        owing = [_answered_owing_a_body(server.port, pki) for _ in range(2)]
        newest = tls(server.port, pki)  # past the cap: the first of them goes, not the new one
        assert closed_within(owing[0], 30)
        _answer(newest)
        for s in (*owing, newest):
            s.close()


def test_a_kept_alive_connection_waits_past_the_head_deadline_then_its_head_has_one(pki):
    """Between requests a connection waits INITSHIFT_KEEPALIVE_TIMEOUT_SECONDS (the apiserver
    reuses one idle for up to 90 s, and a review written to a connection closed under it is
    lost); the next request's head has INITSHIFT_HEADER_TIMEOUT_SECONDS from its first byte."""
    settings = h.settings_for(pki, header_timeout_seconds=1.0, keepalive_timeout_seconds=15.0)
    with h.running(settings) as server:
        kept, dribbled, idle = (tls(server.port, pki) for _ in range(3))
        for s in (kept, dribbled, idle):
            _answer(s)
        time.sleep(3.0)  # idle three head deadlines
        _answer(kept)
        heads, idles = closed_count("header-timeout"), closed_count("idle-timeout")
        # a byte now and then after the first: closed by the head's deadline, not the idle one
        assert hostile.trickle([dribbled], 30, every=0.2) < 30
        assert (closed_count("header-timeout"), closed_count("idle-timeout")) == (heads + 1, idles)
        assert closed_within(idle, 30)  # and one that never sends again: by the idle deadline
        assert closed_count("idle-timeout") == idles + 1


def test_a_stalled_body_is_a_408(pki):
    with h.running(h.settings_for(pki, body_timeout_seconds=1.0)) as server:
        for length, part in ((len(BODY), BODY[:100]), (len(BIG_BODY), BIG_BODY[:100])):  # inline, and large
            s = tls(server.port, pki)
            s.sendall(request_head(length) + part)  # then nothing
            status, headers, body = read_response(s)
            assert status == 408 and headers.get("connection") == "close"
            assert "INITSHIFT_BODY_TIMEOUT_SECONDS" in json.loads(body)["error"]


def test_an_answer_its_client_never_reads_is_dropped(pki):
    """Answers larger than the socket buffers, never read, one review at a time (each after
    the last was answered): once the buffers are full the connection goes after
    INITSHIFT_WRITE_TIMEOUT_SECONDS instead of when the kernel gives up."""
    patched = lambda: counted("initshift_admission_requests_total", 'outcome="patched"')  # noqa: E731
    before = closed_count("write-timeout")
    settings = h.settings_for(pki, write_timeout_seconds=1.0, header_timeout_seconds=120.0,
                              keepalive_timeout_seconds=120.0)
    with h.running(settings) as server:
        large = hostile.large_body(1_000_000)  # its answer (the patch) is over a megabyte
        s = hostile.unread_answers(server.port, h.client_context(pki / "ca.crt"), large, count=0)
        request = request_head(len(large)) + large
        conn = next(iter(server.front.by_key.values()))
        for _ in range(8):  # the kernel's buffers hold a few megabytes
            answered = patched()
            s.sendall(request)
            wait_for(lambda: (patched() > answered and conn.between_requests) or conn.closed.is_set(),
                     what="an answer")
            if conn.closed.is_set():
                break
        wait_for(lambda: closed_count("write-timeout") > before, what="the write timeout")
        assert closed_within(s, 30)


def test_an_answer_its_client_never_reads_that_the_kernel_holds_is_dropped_too(pki):
    """One answer, a few hundred KB: the kernel's send buffer takes it whole (the write
    buffer never fills), the client's window does not. Its connection goes after
    INITSHIFT_WRITE_TIMEOUT_SECONDS, though the idle deadline is far away."""
    before = closed_count("write-timeout")
    settings = h.settings_for(pki, write_timeout_seconds=1.0, keepalive_timeout_seconds=120.0)
    with h.running(settings) as server:
        s = hostile.unread_answers(server.port, h.client_context(pki / "ca.crt"), hostile.large_body(200_000))
        conn = next(iter(server.front.by_key.values()))
        # the server's side: reading on the client's would take the answer
        wait_for(conn.closed.is_set, seconds=30, what="the connection's close")
        assert closed_count("write-timeout") > before and closed_within(s, 30)


def test_pipelined_requests_are_read_one_at_a_time_and_a_flood_of_them_closes_the_connection(pki):
    with h.running(h.settings_for(pki)) as server:
        s = tls(server.port, pki)
        s.sendall((request_head(len(BODY)) + BODY) * 2 + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert [read_response(s)[0] for _ in range(3)] == [200, 200, 200]
        before = closed_count("pipelined")
        got, closed = hostile.pipelined(server.port, h.client_context(pki / "ca.crt"), 20_000)
        assert got < 20_000 and closed and closed_count("pipelined") > before


# --- draining (the preStop hook) ---------------------------------------------------------------------
def test_a_draining_server_closes_each_connection_with_its_answer_and_leaves_idle_ones(pki):
    """After drain() every answer says `Connection: close` and its connection closes, so the
    apiserver opens its next one elsewhere; a connection idle meanwhile is left open (closing
    it could race a review the apiserver is writing to it) until its next answer."""
    with h.running(h.settings_for(pki)) as server:
        busy, idle = tls(server.port, pki), tls(server.port, pki)
        assert "connection" not in _answer(busy) and "connection" not in _answer(idle)
        h.on_loop(server, server.drain)
        assert _answer(busy)["connection"] == "close" and closed_within(busy, 30)
        fresh = tls(server.port, pki)
        assert _answer(fresh)["connection"] == "close" and closed_within(fresh, 30)
        assert not closed_within(idle, 0.5)
        assert _answer(idle)["connection"] == "close" and closed_within(idle, 30)


def test_sigusr1_drains_a_serving_process(tmp_path):
    h.make_certs(tmp_path)
    proc, port = h.serve_process(tmp_path, BODY)
    try:
        kept = tls(port, tmp_path)
        assert "connection" not in _answer(kept)
        proc.send_signal(signal.SIGUSR1)  # what the Deployment's preStop hook sends
        wait_for(lambda: _answer(tls(port, tmp_path)).get("connection") == "close", what="a closing answer")
        assert _answer(kept)["connection"] == "close" and closed_within(kept, 30)
    finally:
        proc.terminate()
        proc.wait(60)
    assert proc.returncode == 0  # and SIGTERM still stops it gracefully


# --- the connection cap ------------------------------------------------------------------------------
def test_past_the_cap_the_connection_waiting_longest_goes_never_one_being_answered(pki):
    settings = h.settings_for(pki, max_connections=3, header_timeout_seconds=60.0, body_timeout_seconds=60.0)
    with h.running(settings) as server:
        stalled = tls(server.port, pki)  # inside a request, its body still coming: waiting longest
        stalled.sendall(request_head(len(BODY)) + BODY[:50])
        time.sleep(0.5)
        idle = tls(server.port, pki)
        with held_review(server, pki):  # the third: a large review being worked on
            time.sleep(0.5)
            newest = tls(server.port, pki)  # past the cap: the stalled one goes first
            assert closed_within(stalled, 30)
            assert hostile.wait_closed([idle], 1) == [idle]
            newer = tls(server.port, pki)  # then the idle one; the one being answered stays
            assert closed_within(idle, 30)
        for s in (newest, newer):
            s.close()


def test_past_the_cap_the_address_holding_the_most_connections_loses_one_of_its_own(pki):
    """A flood from one address while the apiserver keeps an idle connection from another:
    the flood's oldest goes, never the apiserver's, though it has waited longest."""
    settings = h.settings_for(pki, max_connections=4, header_timeout_seconds=60.0)
    with h.running(settings) as server:
        apiserver = tls(server.port, pki, source="127.0.0.2")
        _answer(apiserver)  # kept alive, then idle: the oldest waiting connection
        flood = [tls(server.port, pki) for _ in range(3)]  # the cap reached
        flood.append(tls(server.port, pki))  # past it: one of 127.0.0.1's three goes
        assert closed_within(flood[0], 30)
        assert hostile.wait_closed([apiserver, *flood[1:]], 1) == [apiserver, *flood[1:]]
        _answer(apiserver)  # still open, still served
        for s in (apiserver, *flood):
            s.close()


def test_past_the_cap_connections_never_answered_go_before_a_kept_alive_one(pki):
    """A flood from many addresses, a connection each, sending nothing, while the apiserver
    keeps an idle connection it was answered on: the flood's oldest goes, though the
    apiserver's has waited longest and its address holds as many."""
    settings = h.settings_for(pki, max_connections=4, header_timeout_seconds=60.0)
    with h.running(settings) as server:
        apiserver = tls(server.port, pki, source="127.0.0.2")
        _answer(apiserver)
        flood = [tls(server.port, pki, source=f"127.0.0.{i}") for i in (3, 4, 5)]  # the cap reached
        flood.append(tls(server.port, pki, source="127.0.0.6"))  # past it
        assert closed_within(flood[0], 30)
        assert hostile.wait_closed([apiserver, *flood[1:]], 1) == [apiserver, *flood[1:]]
        _answer(apiserver)
        for s in (apiserver, *flood):
            s.close()


def test_a_connection_past_a_cap_of_connections_being_answered_is_closed_at_once(pki):
    with h.running(h.settings_for(pki, max_connections=1)) as server:
        with held_review(server, pki):
            with pytest.raises((ssl.SSLError, OSError)):
                tls(server.port, pki)  # closed before its handshake


@pytest.mark.parametrize("hello", [False, True], ids=["connect-close", "hello-close"])
def test_connections_closed_before_their_handshake_leave_nothing_behind(pki, hello):
    """A TCP health check or a port scan: connect, close (or a client that leaves after
    its ClientHello). uvicorn counts every connection it was handed against
    limit_concurrency (2 x (cap + metrics places) = 36 here); one it is handed after the
    client left would never be taken back, and past 36 of them every review would be a 503."""
    first = hostile.client_hello(h.client_context(pki / "ca.crt")) if hello else b""
    assert not hello or first[:1] == b"\x16", "a TLS handshake record"
    with h.running(h.settings_for(pki, max_connections=2)) as server:
        hostile.connect_and_close(server.port, 60, first)
        wait_seen_gone(server, 30)
        assert not server.door.open
        with httpx.Client(verify=h.client_context(pki / "ca.crt")) as client:
            assert client.post(f"https://127.0.0.1:{server.port}/mutate", content=BODY,
                               headers=JSON_CT).status_code == 200


def test_handshakes_of_clients_gone_leave_no_tls_state_behind(pki):
    """Clients that send their ClientHello and close at once: their handshakes wait their
    turn, by which time the client is gone; TLS state built for them anyway lived until
    the handshake deadline (~50 KB each: 2,000 of them, 95 MiB, every burst while it lasted).
    The burst stays under the smallest listen backlog in use (somaxconn 128 on older
    kernels): past it, the kernel drops handshakes and a client's ClientHello and close may
    reach the server a minute later or never, leaving a connection only its deadline ends."""
    def tls_objects() -> int:
        return h.on_loop(server, _count_tls_objects)

    first = hostile.client_hello(h.client_context(pki / "ca.crt"))
    with h.running(h.settings_for(pki, header_timeout_seconds=120)) as server:
        before = tls_objects()
        hostile.connect_and_close(server.port, 100, first)
        wait_seen_gone(server, 60, lambda: tls_objects() > before + 8)
        assert not server.door.open, f"{len(server.door.open)} connections of clients gone still open"
        assert tls_objects() <= before + 8, "TLS state left for clients that are gone"


def _count_tls_objects() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, ssl.MemoryBIO))


def wait_seen_gone(server: HttpsServer, seconds: float, more: Callable[[], bool] = lambda: False) -> None:
    """Until the server has accepted every connection the kernel holds for it and holds none
    itself (nor `more()`), twice 0.1 s apart (a connection accepted is the door's a loop turn
    later), or `seconds` pass. The door alone may be empty for a moment on a loaded machine
    while the kernel still queues connections their clients closed long ago."""
    deadline, quiet = time.monotonic() + seconds, 0
    while quiet < 2 and time.monotonic() < deadline:
        busy = server.door.open or hostile.accept_queue(server.sock) or more()
        quiet = 0 if busy else quiet + 1
        time.sleep(0.1)


# --- what uvicorn bounds: the head, trailers, upgrades ---------------------------------------------
HEADS = {
    "many fields": b"POST /mutate HTTP/1.1\r\nHost: localhost\r\n" + b"".join(
        b"X-%d: 1\r\n" % i for i in range(150)) + b"\r\n",
    "a large head whole in one read": b"POST /mutate HTTP/1.1\r\nHost: localhost\r\n" + b"".join(
        b"X-%d: 1\r\n" % i for i in range(20_000)) + b"\r\n",
    "one large field": b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * 40_000 + b"\r\n\r\n",
    "long request line": b"POST /mutate?" + b"q" * 40_000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n",
    "a pipelined one": b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\nGET /healthz HTTP/1.1\r\n" + b"".join(
        b"X-%d: 1\r\n" % i for i in range(3000)) + b"\r\n",
}


def test_a_head_of_100_fields_is_taken_and_one_of_101_is_a_431(pki):
    with h.running(h.settings_for(pki)) as server:
        for fields, status in ((100, 200), (101, 431)):
            sock = tls(server.port, pki)
            head = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n" + b"".join(
                b"X-%d: 1\r\n" % i for i in range(fields - 1)) + b"\r\n"
            sock.sendall(head)
            assert read_response(sock)[0] == status, fields
            sock.close()


@pytest.mark.parametrize("case", sorted(HEADS))
def test_an_oversized_head_is_a_431_and_the_server_keeps_serving(pki, case):
    before = closed_count("header-limit")
    with h.running(h.settings_for(pki)) as server:
        s = tls(server.port, pki)
        s.sendall(HEADS[case])
        if case == "a pipelined one":
            assert read_response(s)[0] == 200
        status, headers, body = read_response(s)
        assert status == 431 and headers["connection"] == "close"
        assert any(words in json.loads(body)["error"] for words in ("INITSHIFT_MAX_HEADER_BYTES", "header fields"))
        assert closed_within(s, 30)
        with httpx.Client(verify=h.client_context(pki / "ca.crt")) as c:
            assert c.post(f"{h.base_url(server)}/mutate", content=BODY, headers=JSON_CT).status_code == 200
    assert closed_count("header-limit") > before


def test_a_chunked_body_is_a_411_and_never_reaches_h11(pki):
    """A body of unknown length (chunked: its trailers would be h11's to buffer, its end h11's
    to find) is refused at its head, with or without a Content-Length beside it, however its
    body and trailers go on; the server keeps serving."""
    before = closed_count("no-length")
    with h.running(h.settings_for(pki)) as server:
        for head in (request_head(None), request_head(None).replace(b"\r\n\r\n", b"\r\nContent-Length: 2\r\n\r\n")):
            s = tls(server.port, pki)
            s.sendall(head + b"2\r\n{}\r\n0\r\nX-Trailer: " + b"t" * 40_000)
            status, headers, body = read_response(s)
            assert status == 411 and headers["connection"] == "close", status
            assert "Content-Length" in json.loads(body)["error"]
            assert closed_within(s, 30)
        with httpx.Client(verify=h.client_context(pki / "ca.crt")) as c:
            assert c.post(f"{h.base_url(server)}/mutate", content=BODY, headers=JSON_CT).status_code == 200
    assert closed_count("no-length") >= before + 2


def test_an_unreadable_content_length_is_h11s_400(pki):
    with h.running(h.settings_for(pki)) as server:
        for value in (b"x", b"-1", b"1, 2"):
            s = tls(server.port, pki)
            s.sendall(request_head(2).replace(b"Content-Length: 2", b"Content-Length: " + value) + b"{}")
            status, headers, _ = read_response(s)
            assert status == 400 and headers["connection"] == "close", (value, status)
            assert closed_within(s, 30)


def test_an_upgrade_request_is_answered_as_an_ordinary_one(pki, caplog):
    with h.running(h.settings_for(pki)) as server, caplog.at_level("INFO"):
        s = tls(server.port, pki)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                  b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
        assert read_response(s)[0] == 200
    assert not [r for r in caplog.records if "upgrade" in r.getMessage().lower()
                or "websocket" in r.getMessage().lower()]  # a flood of them floods no log


# --- large reviews: one at a time, never in the way ----------------------------------------------
def test_a_large_review_in_the_works_holds_up_neither_small_ones_nor_the_loop(pki):
    """A large review on its thread (held until released): small reviews, /healthz and new
    handshakes are answered meanwhile; a second large one waits its turn, unread, and is
    answered once the first is done."""
    with h.running(h.settings_for(pki)) as server, \
            httpx.Client(verify=h.client_context(pki / "ca.crt"), timeout=60) as c:
        second: list[httpx.Response] = []
        with held_review(server, pki) as answers:
            assert [c.post(f"{h.base_url(server)}/mutate", content=BODY, headers=JSON_CT).status_code
                    for _ in range(3)] == [200] * 3
            for _ in range(3):  # new connections, each a full handshake
                with httpx.Client(verify=h.client_context(pki / "ca.crt")) as fresh:
                    assert fresh.get(f"{h.base_url(server)}/healthz").status_code == 200
            poster = threading.Thread(target=lambda: second.append(
                httpx.post(f"{h.base_url(server)}/mutate", content=BIG_BODY + b" ", headers=JSON_CT,
                           verify=h.client_context(pki / "ca.crt"), timeout=60)))
            poster.start()
            time.sleep(0.5)
            assert answers == [] and second == []  # both still waiting
        poster.join(60)
        assert [r.status_code for r in answers + second] == [200, 200]
        assert second[0].json()["response"]["patch"]


def test_a_large_review_waiting_too_long_for_its_turn_is_a_503(pki):
    with h.running(h.settings_for(pki, body_timeout_seconds=1.0)) as server:
        with held_review(server, pki):
            r = httpx.post(f"{h.base_url(server)}/mutate", content=BIG_BODY + b" ", headers=JSON_CT,
                           verify=h.client_context(pki / "ca.crt"), timeout=60)
        assert r.status_code == 503 and "busy" in r.json()["error"] and r.headers["connection"] == "close"


def test_a_client_that_leaves_gives_its_turn_back(pki):
    """Waiting for the turn, a client that leaves leaves the queue at once; one that leaves
    while its review is worked on stops it at the next step, unanswered."""
    gone = lambda: counted("initshift_admission_requests_total", 'outcome="gone"')  # noqa: E731
    with h.running(h.settings_for(pki, body_timeout_seconds=60.0)) as server:
        with held_review(server, pki):
            before = gone()
            s = tls(server.port, pki)
            s.sendall(request_head(len(BIG_BODY)) + BIG_BODY[:1000])
            time.sleep(0.3)
            s.close()
            wait_for(lambda: gone() > before, what="the waiting review to leave")  # the held one still runs
        reviewer = server.app.state.reviewer
        real, left = reviewer.parse, threading.Event()

        def slow(body: bytes):
            assert left.wait(60)
            time.sleep(0.5)  # the server sees the close
            return real(body)

        reviewer.parse = slow
        try:
            before = gone()
            s = tls(server.port, pki)
            s.sendall(request_head(len(BIG_BODY)) + BIG_BODY)
            time.sleep(0.3)
            s.close()
            left.set()
            wait_for(lambda: gone() > before, what="the review to stop")
        finally:
            reviewer.parse = real
        assert httpx.post(f"{h.base_url(server)}/mutate", content=BIG_BODY, headers=JSON_CT,
                          verify=h.client_context(pki / "ca.crt"), timeout=60).status_code == 200
        assert gc.isenabled()


def test_small_reviews_are_worked_on_the_event_loop_large_ones_on_the_turns_thread(pki, caplog):
    """An ordinary review skips the hop to a thread: it costs less than the hop itself. A
    large one is worked on with the cyclic collector paused, back on once answered; its log
    line still names its pod."""
    with h.running(h.settings_for(pki)) as server, httpx.Client(verify=h.client_context(pki / "ca.crt")) as c:
        reviewer = server.app.state.reviewer
        real, seen = reviewer.parse, []

        def recorded(body: bytes):
            seen.append((threading.current_thread().name, gc.isenabled()))
            return real(body)

        reviewer.parse = recorded
        try:
            with caplog.at_level(logging.INFO, logger="initshift.review"):
                for body in (BODY, BIG_BODY):
                    r = c.post(f"{h.base_url(server)}/mutate", content=body, headers=JSON_CT)
                    assert r.status_code == 200 and r.json()["response"]["patch"]
                    assert gc.isenabled()
        finally:
            reviewer.parse = real
    assert len(BODY) <= INLINE_MAX_BYTES < len(BIG_BODY)
    assert seen[0] == ("initshift-https", True)
    assert seen[1][0].startswith("initshift-review") and seen[1][1] is False
    lines = [r for r in caplog.records if r.name == "initshift.review"]
    assert [(r.namespace, r.pod) for r in lines] == [("builds", REVIEW["request"]["object"]["metadata"]["name"])] * 2


def test_a_review_stopped_or_refused_gives_the_collector_back(pki):
    """The collector comes back on however a large review ends: its client gone mid-work, a
    bad review, an internal error."""
    with h.running(h.settings_for(pki)) as server:
        reviewer = server.app.state.reviewer
        real = reviewer.parse

        def broken(body: bytes):
            raise RuntimeError("boom")

        reviewer.parse = broken
        try:
            r = httpx.post(f"{h.base_url(server)}/mutate", content=BIG_BODY, headers=JSON_CT,
                           verify=h.client_context(pki / "ca.crt"), timeout=60)
        finally:
            reviewer.parse = real
        assert r.status_code == 500 and gc.isenabled()
        r = httpx.post(f"{h.base_url(server)}/mutate", content=b"[" * len(BIG_BODY), headers=JSON_CT,
                       verify=h.client_context(pki / "ca.crt"), timeout=60)
        assert r.status_code == 400 and gc.isenabled()


# --- the rest -----------------------------------------------------------------------------------------
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


def test_an_unexpected_500_says_connection_close_and_the_next_request_works(pki):
    with h.running(h.settings_for(pki)) as server, httpx.Client(verify=h.client_context(pki / "ca.crt")) as c:
        reviewer = server.app.state.reviewer
        real = reviewer.parse

        def broken(*_args, **_kw):
            raise RuntimeError("a bug outside the failure mode")

        reviewer.parse = broken
        try:
            r = c.post(f"{h.base_url(server)}/mutate", content=BODY, headers=JSON_CT)
        finally:
            reviewer.parse = real
        assert r.status_code == 500 and r.headers["connection"] == "close"
        assert r.json() == {"error": "internal error: RuntimeError"}
        assert c.post(f"{h.base_url(server)}/mutate", content=BODY, headers=JSON_CT).status_code == 200


def test_metrics_floods_never_stop_a_scrape(pki):
    """Unfinished requests and idle connections beyond the metrics port's 16 places: the
    oldest go, a scrape gets its answer."""
    with h.running(h.settings_for(pki), metrics_port=0) as server:
        flood = hostile.metrics_flood(server.metrics_port, 100)
        r = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=30)
        assert r.status_code == 200 and "initshift_admission_requests_total" in r.text
        assert 'initshift_connections_closed_total{reason="over-limit"}' in r.text
        assert hostile.wait_closed(flood, 60) == []
        assert set(hostile.idle_metrics_and_scrapes(server.metrics_port, every=1.0, scrapes=4, pause=0.5)) == {200}
        assert httpx.get(f"http://127.0.0.1:{server.metrics_port}/other", timeout=30).status_code == 404


def test_the_metrics_address_is_a_setting_of_its_own(pki):
    with h.running(h.settings_for(pki, metrics_host="127.0.0.2"), metrics_port=0) as server:
        assert httpx.get(f"http://127.0.0.2:{server.metrics_port}/metrics").status_code == 200
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics")


def test_ipv6_loopback(pki, tmp_path):
    """`serve --host ::1` (and `::`, both stacks) listens; the server answers over IPv6."""
    from certs import rotation
    from webhook.admission import bind
    from webhook.admission._certs import ensure_local_certificates

    try:
        sock = bind("::1")
    except OSError as e:
        pytest.skip(f"no IPv6 loopback here: {e}")
    ensure_local_certificates(tmp_path, rotation.Wanted(("localhost",), ("::1",)))
    with h.running(h.settings_for(tmp_path, host="::1"), sock=sock) as server:
        r = httpx.post(f"https://[::1]:{server.port}/mutate", content=BODY, headers=JSON_CT,
                       verify=h.client_context(tmp_path / "ca.crt"))
        assert r.status_code == 200 and r.json()["response"]["patch"]
    both = bind("::")
    try:
        for family, host in ((socket.AF_INET6, "::1"), (socket.AF_INET, "127.0.0.1")):
            with socket.socket(family) as s:
                s.settimeout(10)
                s.connect((host, both.getsockname()[1]))
    finally:
        both.close()
