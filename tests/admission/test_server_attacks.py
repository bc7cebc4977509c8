"""Every hostile client of issue 30 and the earlier ones, against `initshift serve` as a
process inside a memory cgroup limited to what the shipped Deployment allows: after each,
no OOM kill, the attack's connections closed by the server, and the legitimate reviews
sent meanwhile (the apiserver: one at a time on a kept-alive connection) all answered.

Nothing here counts time or requests: each case waits for the event it needs (a large
review answered, a connection closed), under deadlines many times the guards' own."""

from __future__ import annotations

import collections
import os
from pathlib import Path
from typing import Iterator

import pytest

from tests.support import hostile
from tests.support import https_helpers as h
from tests.support.deploy_render import Rendered, kustomize
from webhook.rewrite._quantity import parse
from webhook.settings import ServerSettings

CLOSED_WITHIN = 120.0  # seconds; every guard fires within 15
IDLE_SECONDS = 10.0  # the idle deadline here


def deployment_memory_limit() -> int:
    """The memory limit of the shipped Deployment (deploy/base, rendered by kustomize)."""
    return parse(Rendered(kustomize("base")).container["resources"]["limits"]["memory"], "memory")


class Server:
    def __init__(self, port: int, metrics_port: int, ca: Path, pid: int, cgroup: hostile.MemoryCgroup) -> None:
        self.port, self.metrics_port, self.ca, self.pid, self.cgroup = port, metrics_port, ca, pid, cgroup
        self.url, self.ctx = f"https://127.0.0.1:{port}", h.client_context(ca)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    cgroup = hostile.MemoryCgroup.create(deployment_memory_limit(), f"initshift-attacks-{os.getpid()}")
    if cgroup is None:
        pytest.skip("no writable memory cgroup here (cgroup v1 or v2 under this process's own)")
    d = tmp_path_factory.mktemp("attacks")  # (pytest keeps the last runs' server.log, as every tmp_path)
    h.make_certs(d)
    env = {k: v for k, v in os.environ.items() if not k.startswith("INITSHIFT_")}
    # Production defaults but the idle deadline (120 s, above the apiserver's 90): answered
    # connections left idle (the WebSocket case) are closed by it, and waiting 120 s for
    # that would only slow the suite; it fires like the others, from its own timer.
    env["INITSHIFT_KEEPALIVE_TIMEOUT_SECONDS"] = str(IDLE_SECONDS)
    proc = None
    try:
        proc, port = h.serve_process(d, hostile.small_body(), env=env, preexec_fn=cgroup.enter, log=d / "server.log")
        environ = dict(item.decode().split("=", 1) for item in Path(f"/proc/{proc.pid}/environ").read_bytes()
                       .split(b"\0") if b"=" in item)
        yield Server(port, int(environ["INITSHIFT_METRICS_PORT"]), d / "ca.crt", proc.pid, cgroup)
        assert proc.poll() is None
        # No attack leaves a traceback in the log: an exception in a guard's callback is a
        # guard that did not finish its work.
        tracebacks = [line for line in (d / "server.log").read_text(errors="replace").splitlines()
                      if "Traceback" in line or "Exception in callback" in line]
        assert not tracebacks, tracebacks[:3]
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
        cgroup.remove()


def attack(server: Server, socks: list, legit: hostile.Legit) -> None:
    """What every case asserts once its attack has run."""
    left = hostile.wait_closed(socks, CLOSED_WITHIN)
    hostile.close_all(socks)
    assert not left, f"{len(left)} of {len(socks)} attack connections still open"
    assert server.cgroup.oom_kills() == 0
    assert hostile.children(server.pid) == [] and Path(f"/proc/{server.pid}").exists()
    statuses = collections.Counter(status for status, _ in legit.samples)
    assert set(statuses) == {200}, statuses


def legit(server: Server) -> hostile.Legit:
    return hostile.Legit(server.url, str(server.ca))


def test_websocket_upgrades_are_answered_and_closed(server):
    with legit(server).running() as client:
        socks = hostile.upgrade_flood(server.port, server.ctx, 1100)
    attack(server, socks, client)


def test_trailers_that_never_end_are_cut(server):
    with legit(server).running() as client:
        cuts = [hostile.trailer_flood(server.port, server.ctx) for _ in range(6)]
    # 411 at the head (the answer may be lost to the reset), closed
    assert all(cut.after is not None and cut.closed and cut.answer in ("", "HTTP/1.1 411 Length Required")
               for cut in cuts), cuts
    attack(server, [], client)


def test_a_header_flood_is_cut(server):
    with legit(server).running() as client:
        cut = hostile.header_flood(server.port, server.ctx)
    assert cut.after is not None and cut.closed, cut  # 431 (the answer may be lost to the reset), closed
    attack(server, [], client)


def test_the_largest_reviews_flooding_fit_the_memory_limit(server):
    """Four clients posting the largest review the body limit admits, back to back, until
    several were answered; small reviews meanwhile."""
    large = hostile.largest_body(ServerSettings().max_body_bytes)
    near_etcd = hostile.large_body(1_400_000)  # the largest the rewrite still rewrites
    with legit(server).running() as client:
        for body in (large, near_etcd):
            with hostile.posting(server.url, str(server.ca), body, 4) as seen:
                h.wait_until(lambda: seen().count(200) >= 3, 600, "three large reviews answered")
            assert set(seen()) <= {200, 0}, collections.Counter(seen())  # 0: a client stopped mid-request
    attack(server, [], client)


def test_pods_of_many_steps_and_many_mains_are_answered(server):
    """8,000 steps x 8,000 mains: a rewrite linear in the pod, one at a time."""
    with legit(server).running() as client:
        with hostile.posting(server.url, str(server.ca), hostile.steps_by_mains(8000), 2) as seen:
            h.wait_until(lambda: seen().count(200) >= 2, 600, "two such reviews answered")
    attack(server, [], client)


def test_answers_never_read_are_dropped(server):
    with legit(server).running() as client:
        socks = [hostile.unread_answers(server.port, server.ctx, hostile.small_body(), count=100, pause=0.02),
                 hostile.unread_answers(server.port, server.ctx, hostile.large_body(1_000_000), count=6, pause=1),
                 *(hostile.unread_answers(server.port, server.ctx, hostile.small_body(), count=100, pause=0)
                   for _ in range(4))]
    attack(server, socks, client)


def test_idle_metrics_connections_never_stop_a_scrape(server):
    with legit(server).running() as client:
        scrapes = hostile.idle_metrics_and_scrapes(server.metrics_port, every=2.0, scrapes=15, pause=0.3)
    assert set(scrapes) == {200}, scrapes
    attack(server, [], client)


def test_a_metrics_flood_is_harmless(server):
    with legit(server).running() as client:
        socks = hostile.metrics_flood(server.metrics_port, 2000)
    attack(server, socks, client)


def test_connections_closed_at_once_take_no_place(server):
    """TCP health checks and port scans: 1,000 connections gone before their handshake,
    more than uvicorn's limit_concurrency (288); reviews after them are still answered."""
    with legit(server).running(at_least=60) as client:
        hostile.connect_and_close(server.port, 1000)
    attack(server, [], client)


def test_slow_bodies_never_refuse_a_review(server):
    with legit(server).running() as client:
        socks = hostile.slow_bodies(server.port, server.ctx, 140)
    attack(server, socks, client)


def test_slow_idle_and_silent_heads_are_closed(server):
    with legit(server).running() as client:
        lorises = hostile.slowloris(server.port, server.ctx, 50)
        quiet = [*hostile.idle_connections(server.port, server.ctx, 100), *hostile.silent_tcp(server.port, 100)]
        hostile.trickle(lorises, CLOSED_WITHIN, silent=quiet)
    attack(server, [*lorises, *quiet], client)


def test_deep_pipelining_loses_the_connection(server):
    with legit(server).running() as client:
        got, closed = hostile.pipelined(server.port, server.ctx, 100_000)
    assert got < 100_000 and closed
    attack(server, [], client)


def test_a_connection_flood_past_the_cap_holding_unread_bodies(server):
    """The cap's worth of connections, each holding as much of a large review's body as the
    server's buffers take, and more connections past it: the memory limit holds."""
    large = hostile.largest_body(ServerSettings().max_body_bytes)
    with legit(server).running() as client:
        socks = hostile.unread_bodies(server.port, server.ctx, large, ServerSettings().max_connections + 50)
    attack(server, socks, client)
