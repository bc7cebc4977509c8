"""`make bench-hostile`: what each hostile client costs the server, and the figures the
Deployment's memory limit is derived from. Prints figures, asserts nothing.

The server is `initshift serve` with production defaults, in a memory cgroup of its own
when one is writable here (no limit that could kill it: the cgroup measures each case's
peak), else its peak RSS. Each case runs alone while a legitimate client sends the 7-step
build pod's review on one kept-alive TLS connection (the apiserver), and prints: the
legitimate reviews' latency and statuses, the server's memory peak over its idle figure,
and how long the attack's connections were held after the attacker's last byte.

Then the sizing figures: the cost of the largest review the body limit admits, and of the
connection cap's worth of connections each holding a large review's unread body.
`--cases 1,4` runs only those cases; `--server-tree DIR` runs another checkout's server.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import httpx

from tests.bench._machine import Steal, describe
from tests.support import hostile
from tests.support import https_helpers as h
from webhook.settings import ServerSettings

MiB = 1024 * 1024


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))] * 1000 if values else float("nan")


def summary(samples: list[tuple[int, float]]) -> str:
    ok = [t for status, t in samples if status == 200]
    codes = dict(collections.Counter(status for status, _ in samples))
    return f"p50 {pct(ok, 0.5):.1f} ms, p99 {pct(ok, 0.99):.1f} ms, max {max(ok, default=0) * 1000:.0f} ms {codes}"


class Bench:
    def __init__(self, port: int, metrics_port: int, ca: Path, pid: int, cgroup: hostile.MemoryCgroup | None):
        self.port, self.metrics_port, self.ca, self.pid, self.cgroup = port, metrics_port, ca, pid, cgroup
        self.url, self.ctx = f"https://127.0.0.1:{port}", h.client_context(ca)
        self.idle = self.memory()

    def memory(self) -> int:
        """What the server uses now: its cgroup's usage, else its RSS (bytes)."""
        if self.cgroup is not None:
            return int((self.cgroup.path / ("memory.current" if self.cgroup.v2 else "memory.usage_in_bytes"))
                       .read_text())
        return hostile.memory_kb(self.pid) * 1024

    def peak(self) -> int:
        return self.cgroup.peak_bytes() if self.cgroup is not None and not self.cgroup.v2 else \
            hostile.memory_kb(self.pid, "VmHWM") * 1024

    def case(self, name: str, attack: Callable[[], tuple[str, list[socket.socket]]]) -> None:
        if self.cgroup is not None:
            self.cgroup.reset_peak()
        start, cpu = self.memory(), hostile.cpu_seconds(self.pid)
        legit = hostile.Legit(self.url, str(self.ca))
        with legit.running():
            said, socks = attack()
            last_byte = time.monotonic()
            open_ = hostile.wait_closed(socks, 180)  # an answered connection waits 120 s for another request
            held = time.monotonic() - last_byte
        hostile.close_all(socks)
        kills = f", OOM kills {self.cgroup.oom_kills()}" if self.cgroup is not None else ""
        print(f"{name}: {said}\n    legitimate /mutate meanwhile: {summary(legit.samples)}\n"
              f"    server: memory peak {self.peak() / MiB:.0f} MiB (at the start {start / MiB:.0f}, idle "
              f"{self.idle / MiB:.0f}), {hostile.cpu_seconds(self.pid) - cpu:.1f} s CPU{kills}; attack connections "
              + (f"closed {held:.1f} s after the last byte" if socks and not open_ else
                 f"{len(open_)} of {len(socks)} still open after {held:.0f} s" if socks else "none left open"),
              flush=True)


def cases(b: Bench, large: bytes, small: bytes) -> dict[int, tuple[str, Callable[[], tuple[str, list]]]]:
    def header_flood() -> tuple[str, list]:
        cut = hostile.header_flood(b.port, b.ctx)
        return (f"answered {cut.answer!r} {cut.after * 1000:.0f} ms after the first byte, closed: {cut.closed}"
                if cut.after is not None else "never answered"), []

    def trailer_flood() -> tuple[str, list]:
        cuts = [hostile.trailer_flood(b.port, b.ctx) for _ in range(6)]
        answers = collections.Counter(cut.answer for cut in cuts)
        slowest = max((cut.after for cut in cuts if cut.after is not None), default=None)
        return (f"6 connections answered {dict(answers)}, the slowest {slowest * 1000:.0f} ms after its first byte, "
                f"{sum(cut.closed for cut in cuts)} closed" if slowest is not None else "never answered"), []

    def upgrades() -> tuple[str, list]:
        socks = hostile.upgrade_flood(b.port, b.ctx, 1100)
        return f"{len(socks)} of 1100 connections opened", socks

    def large_flood() -> tuple[str, list]:
        with hostile.posting(b.url, str(b.ca), large, 4) as seen:
            deadline = time.monotonic() + 60
            while sum(1 for s in seen() if s == 200) < 8 and time.monotonic() < deadline:
                time.sleep(0.2)
        return f"4 clients posting {len(large) / 1e6:.1f} MB reviews: {dict(collections.Counter(seen()))}", []

    def unread() -> tuple[str, list]:
        socks = [hostile.unread_answers(b.port, b.ctx, small, count=100, pause=0.02)]
        socks += [hostile.unread_answers(b.port, b.ctx, hostile.large_body(1_000_000), count=8, pause=1.0)]
        socks += [hostile.unread_answers(b.port, b.ctx, small, count=100, pause=0) for _ in range(4)]
        return ("never reading an answer: 100 reviews one at a time, 8 of 1 MB one at a time, 4 x 100 "
                "pipelined"), socks

    def idle_metrics() -> tuple[str, list]:
        statuses = hostile.idle_metrics_and_scrapes(b.metrics_port)
        return f"16 idle metrics connections reopened every 5 s; scrapes {dict(collections.Counter(statuses))}", []

    def metrics_flood() -> tuple[str, list]:
        start = time.monotonic()
        socks = hostile.metrics_flood(b.metrics_port, 2000)
        return f"{len(socks)} unfinished GET /metrics opened in {time.monotonic() - start:.1f} s", socks

    def slow_bodies() -> tuple[str, list]:
        socks = hostile.slow_bodies(b.port, b.ctx, 140)
        return "140 clients sending 10 of 100 declared bytes", socks

    def slow_heads() -> tuple[str, list]:
        lorises = hostile.slowloris(b.port, b.ctx, 50)
        idle = hostile.idle_connections(b.port, b.ctx, 100)
        silent = hostile.silent_tcp(b.port, 100)
        took = hostile.trickle(lorises, 60, silent=[*idle, *silent])
        return (f"50 heads a byte every 0.5 s, 100 idle TLS connections, 100 silent TCP connections: all closed "
                f"{took:.1f} s after they opened"), [*lorises, *idle, *silent]

    def pipelining() -> tuple[str, list]:
        got, closed = hostile.pipelined(b.port, b.ctx, 100_000)
        return f"100,000 pipelined GET /healthz on one connection: {got} answered, closed: {closed}", []

    def steps_by_mains() -> tuple[str, list]:
        body = hostile.steps_by_mains(8000)
        with hostile.posting(b.url, str(b.ca), body, 2) as seen:
            start = time.monotonic()
            deadline = start + 300
            while seen().count(200) < 4 and time.monotonic() < deadline:
                time.sleep(0.2)
            took = time.monotonic() - start
        return (f"2 clients posting 8,000 steps x 8,000 mains ({len(body) / 1e6:.2f} MB): 4 answered in {took:.1f} s, "
                f"{dict(collections.Counter(seen()))}"), []

    def closed_at_once(what: str, first: bytes = b"") -> tuple[str, list]:
        start = time.monotonic()
        hostile.connect_and_close(b.port, 2000, first)
        took = time.monotonic() - start
        with httpx.Client(verify=b.ctx, timeout=30) as client:
            after = collections.Counter(
                client.post(f"{b.url}/mutate", content=small, headers=hostile.JSON_CT).status_code for _ in range(20))
        return f"2,000 {what}, in {took:.1f} s; then 20 reviews: {dict(after)}", []

    def connect_close() -> tuple[str, list]:
        return closed_at_once("TCP connections closed at once")

    def hello_close() -> tuple[str, list]:
        return closed_at_once("ClientHellos each followed by a close", hostile.client_hello(b.ctx))

    return {1: ("1. header flood, 32 MB of headers", header_flood),
            2: ("2. chunked trailers that never end", trailer_flood),
            3: ("3. WebSocket upgrade requests", upgrades),
            4: ("4. largest-review flood", large_flood),
            5: ("5. answers never read", unread),
            6: ("6. idle metrics connections", idle_metrics),
            7: ("7. metrics flood", metrics_flood),
            8: ("8. slow bodies", slow_bodies),
            9: ("9. slow and silent heads", slow_heads),
            10: ("10. pipelining", pipelining),
            11: ("11. steps x mains", steps_by_mains),
            12: ("12. connections closed at once", connect_close),
            13: ("13. handshakes abandoned", hello_close)}


def fresh(d: Path, small: bytes, tree: Path | None) -> tuple[Any, Bench]:
    """A server of its own in a cgroup of its own (when writable), idle."""
    cgroup = hostile.MemoryCgroup.create(8 << 30, f"initshift-bench-{os.getpid()}-{time.monotonic_ns()}")
    proc, port = h.serve_process(d, small, tree=tree, preexec_fn=cgroup.enter if cgroup else None)
    env = dict(i.decode().split("=", 1) for i in Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
               if b"=" in i)
    time.sleep(1)
    return proc, Bench(port, int(env["INITSHIFT_METRICS_PORT"]), d / "ca.crt", proc.pid, cgroup)


def stop(proc: Any, b: Bench) -> None:
    proc.terminate()
    proc.wait(60)
    if b.cgroup is not None:
        b.cgroup.remove()


def sizing(d: Path, small: bytes, large: bytes, tree: Path | None) -> None:
    """The terms of the memory limit, each from a fresh server: idle; one largest review
    (and the largest one the rewrite still rewrites); the connection cap's worth of
    connections each holding a large review's unread body."""
    import httpx

    cap = ServerSettings().max_connections
    for what, body in (("the largest review", large),
                       ("the largest review rewritten (near etcd's limit)", hostile.large_body(1_400_000)),
                       (f"{cap} connections (INITSHIFT_MAX_CONNECTIONS) each holding a large review's unread body",
                        None)):
        proc, b = fresh(d, small, tree)
        try:
            if body is not None:
                r = httpx.post(f"{b.url}/mutate", content=body, headers=hostile.JSON_CT, verify=b.ctx, timeout=120)
                said = f"{len(body) / 1e6:.2f} MB review, {len(r.content) / 1e6:.2f} MB answer"
            else:
                socks = hostile.unread_bodies(b.port, b.ctx, large, cap)
                time.sleep(2)
                said = f"{len(socks)} connections"
            print(f"sizing: {what} ({said}): peak {b.peak() / MiB:.0f} MiB, +{(b.peak() - b.idle) / MiB:.0f} MiB "
                  f"over the idle {b.idle / MiB:.0f} MiB", flush=True)
            if body is None:
                hostile.close_all(socks)
        finally:
            stop(proc, b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server-tree", type=Path)
    parser.add_argument("--cases", default=",".join(str(i) for i in range(1, 14)), help="cases to run (comma list)")
    parser.add_argument("--no-sizing", action="store_true", help="skip the sizing figures")
    args = parser.parse_args()
    chosen = {int(c) for c in args.cases.split(",") if c}
    print(describe(), flush=True)
    steal = Steal()
    d = Path(tempfile.mkdtemp(prefix="initshift-hostile-"))
    h.make_certs(d)
    small = hostile.small_body()
    large = hostile.largest_body(ServerSettings().max_body_bytes)
    cgroup = hostile.MemoryCgroup.create(8 << 30, f"initshift-bench-{os.getpid()}")
    proc = None
    try:
        proc, port = h.serve_process(d, small, tree=args.server_tree, preexec_fn=cgroup.enter if cgroup else None)
        env = dict(i.decode().split("=", 1) for i in Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
                   if b"=" in i)
        time.sleep(1)
        b = Bench(port, int(env["INITSHIFT_METRICS_PORT"]), d / "ca.crt", proc.pid, cgroup)
        print(f"server: one process, idle {b.idle / MiB:.0f} MiB ({'its cgroup' if cgroup else 'RSS'}); reviews: "
              f"normal {len(small) / 1024:.0f} KiB, largest {len(large) / 1e6:.2f} MB", flush=True)
        for number, (name, attack) in cases(b, large, small).items():
            if number in chosen:
                b.case(name, attack)
        print(f"after all of it: {b.memory() / MiB:.0f} MiB, peak {hostile.memory_kb(proc.pid, 'VmHWM') / 1024:.0f} "
              f"MiB RSS")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
        if cgroup is not None:
            cgroup.remove()
    try:
        if not args.no_sizing:
            sizing(d, small, large, args.server_tree)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print(steal)


if __name__ == "__main__":
    main()
