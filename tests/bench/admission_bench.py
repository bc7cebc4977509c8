"""`make bench-admission`, part two: what the server sustains under load, for the 7-step
build pod with an istio-proxy sidecar (part one, tests/bench/latency_bench.py, times one
review in process and over one connection). Prints figures, asserts nothing.

1. Throughput at 16 keep-alive connections (ApacheBench: C, so the client takes little of
   the machine's CPU away from the server).
2. A burst: 64 keep-alive connections sending reviews as fast as they are answered, while a
   probe opens a new TLS connection every 100 ms (handshake time) and asks /healthz on
   its own connection (latency): the webhook's 5 s timeout must never be near.
3. What one process serves: fixed-rate runs (reviews started on schedule whatever the
   answers' pace) at rising rates, 5 s each, until p99 reaches 5 ms; the highest rate under
   it is the figure the Deployment is sized by (docs/admission-server.md#sizing).

The server runs as `initshift serve` (one process, JSON logs on, as in production).
`--server-tree DIR` runs the server from another checkout (a baseline), `--quick` skips the
fixed-rate runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from tests.support import https_helpers as h

BURST_SECONDS = 10.0
RATES, RATE_SECONDS, RATE_P99_MS = (100, 200, 300, 400, 500, 600, 800, 1000, 1200, 1500, 2000), 5.0, 5.0


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))] * 1000 if values else float("nan")


# --- ApacheBench load and the probe --------------------------------------------------------
def ab(url: str, body_file: Path, concurrency: int, seconds: float) -> dict:
    out = subprocess.run(["ab", "-q", "-k", "-s", "30", "-c", str(concurrency), "-t", str(seconds), "-n", "10000000",
                          "-p", str(body_file), "-T", "application/json", f"{url}/mutate"],
                         capture_output=True, text=True).stdout

    def field(pattern: str, default: float = 0.0) -> float:
        m = re.search(pattern, out)
        return float(m.group(1)) if m else default

    return {"rps": field(r"Requests per second:\s+([\d.]+)"), "done": field(r"Complete requests:\s+(\d+)"),
            "failed": field(r"Failed requests:\s+(\d+)"), "non2xx": field(r"Non-2xx responses:\s+(\d+)"),
            "p99": field(r"\s99%\s+(\d+)", float("nan"))}


class Probe(threading.Thread):
    """Every 100 ms: a new TCP+TLS connection (handshake time), and GET /healthz on a
    kept-alive connection of its own (latency)."""

    def __init__(self, port: int, ca: Path) -> None:
        super().__init__(daemon=True)
        self.port, self.ctx = port, h.client_context(ca)
        self.handshakes: list[float] = []
        self.healthz: list[float] = []
        self.failures: list[str] = []
        self.stop = threading.Event()

    def _handshake(self) -> None:
        t = time.perf_counter()
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=10) as raw, \
                    self.ctx.wrap_socket(raw, server_hostname="localhost"):
                self.handshakes.append(time.perf_counter() - t)
        except (OSError, ssl.SSLError) as e:
            self.failures.append(f"handshake: {e!r}")

    def run(self) -> None:
        with httpx.Client(base_url=f"https://127.0.0.1:{self.port}", verify=self.ctx, timeout=10) as c:
            while not self.stop.wait(0.1):
                self._handshake()
                t = time.perf_counter()
                try:
                    ok = c.get("/healthz").status_code == 200
                    self.healthz.append(time.perf_counter() - t)
                    if not ok:
                        self.failures.append("healthz not 200")
                except httpx.HTTPError as e:
                    self.failures.append(f"healthz: {e!r}")


def burst(url: str, port: int, ca: Path, body_file: Path) -> tuple[dict, Probe]:
    probe = Probe(port, ca)
    probe.start()
    try:
        load = ab(url, body_file, 64, BURST_SECONDS)
    finally:
        probe.stop.set()
        probe.join(15)
    return load, probe


# --- fixed rate ---------------------------------------------------------------------------
async def fixed_rate(port: int, ca: Path, body: bytes, rate: int) -> dict:
    """Open loop: request i is due at start + i/RATE whatever the earlier answers' pace, and
    its latency counts from then (waiting for a free connection included). A raw asyncio
    TLS client (prepared request bytes) keeps the client's own CPU small; connections are
    reused last-in first-out, and one the server closed while idle is reopened once."""
    ctx = h.client_context(ca)
    request = (f"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    free = asyncio.Semaphore(64)
    latencies: list[float] = []
    errors: dict[str, int] = {}
    reopened = 0

    async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="localhost")

    async def exchange(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> int:
        reader, writer = conn
        writer.write(request)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"(?i)content-length:\s*(\d+)", head)
        await reader.readexactly(int(length.group(1)) if length else 0)
        return int(head.split()[1])

    async def one(due: float) -> None:
        nonlocal reopened
        async with free:
            conn = idle.pop() if idle else await connect()
            try:
                try:
                    status = await exchange(conn)
                except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
                    conn[1].close()
                    reopened += 1
                    conn = await connect()
                    status = await exchange(conn)
                if status != 200:
                    errors[f"HTTP {status}"] = errors.get(f"HTTP {status}", 0) + 1
                idle.append(conn)
            except (OSError, asyncio.IncompleteReadError, ssl.SSLError) as e:
                errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
            latencies.append(time.perf_counter() - due)

    tasks = []
    start = time.perf_counter()
    for i in range(int(rate * RATE_SECONDS)):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(due)))
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - start
    for _, writer in idle:
        writer.close()
    return {"sent": len(tasks), "rps": len(tasks) / wall, "p50": pct(latencies, 0.5), "p99": pct(latencies, 0.99),
            "max": max(latencies) * 1000, "errors": errors, "reopened": reopened}


def sweep(port: int, ca: Path, body: bytes) -> list[dict]:
    """Fixed-rate runs at RATES until one misses p99 < RATE_P99_MS (or fails); printed as they go."""
    out = []
    for rate in RATES:
        r = dict(asyncio.run(fixed_rate(port, ca, body, rate)), rate=rate)
        out.append(r)
        print(f"fixed rate {rate}/s for {RATE_SECONDS:g} s (up to 64 connections): {r['sent']} sent at "
              f"{r['rps']:.0f}/s, p50 {r['p50']:.1f} ms, p99 {r['p99']:.1f} ms, max {r['max']:.0f} ms, "
              f"errors {r['errors'] or 0}, idle connections reopened {r['reopened']}", flush=True)
        if r["p99"] >= RATE_P99_MS or r["errors"]:
            break
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server-tree", type=Path, default=Path.cwd(), help="checkout the server runs from")
    ap.add_argument("--quick", action="store_true", help="skip the fixed-rate runs")
    args = ap.parse_args(argv)
    pod = h.seven_step_pod()
    review = h.review(pod, namespace="builds")
    body = json.dumps(review).encode()
    print(f"admission benchmark: 7-step pod + istio-proxy, {len(body)} byte review, TLS, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f}, one server process from {args.server_tree}")
    have_ab = shutil.which("ab") is not None
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        ca = h.make_certs(d)
        body_file = d / "review.json"
        body_file.write_bytes(body)
        proc, port = h.serve_process(d, body, tree=args.server_tree.resolve())
        url = f"https://127.0.0.1:{port}"
        try:
            steady = ab(url, body_file, 16, 10) if have_ab else None
            load, probe = burst(url, port, ca, body_file) if have_ab else (None, None)
            rates = [] if args.quick else sweep(port, ca, body)
        finally:
            proc.terminate()
            proc.wait(30)
    if steady is None or load is None or probe is None:
        print("ApacheBench (ab, Debian apache2-utils) not found: no throughput or burst figures")
    else:
        print(f"ab, 16 keep-alive connections, 10 s: {steady['rps']:.0f} req/s, p99 {steady['p99']:.0f} ms, "
              f"{steady['failed']:.0f} failed, {steady['non2xx']:.0f} non-2xx")
        print(f"burst, 64 keep-alive connections, {BURST_SECONDS:g} s: {load['rps']:.0f} req/s, p99 {load['p99']:.0f} ms, "
              f"{load['failed']:.0f} failed, {load['non2xx']:.0f} non-2xx (503: refused when busy)")
        print(f"  new TLS handshakes during it: {len(probe.handshakes)}, p50 {pct(probe.handshakes, 0.5):.0f} ms, "
              f"p99 {pct(probe.handshakes, 0.99):.0f} ms, max {max(probe.handshakes, default=0) * 1000:.0f} ms "
              f"(goal: all under 1000 ms)")
        print(f"  /healthz during it: {len(probe.healthz)}, p50 {pct(probe.healthz, 0.5):.0f} ms, "
              f"p99 {pct(probe.healthz, 0.99):.0f} ms, max {max(probe.healthz, default=0) * 1000:.0f} ms; "
              f"probe failures: {len(probe.failures)} {probe.failures[:3]}")
    best = max((r["rate"] for r in rates if r["p99"] < RATE_P99_MS and not r["errors"]), default=None)
    if rates:
        print(f"one process serves {best or 'under ' + str(RATES[0])} reviews/s at p99 < {RATE_P99_MS:g} ms "
              f"(the highest fixed rate below)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
