"""`make bench-admission`, part two: what the server sustains under load, for the 7-step
build pod with an istio-proxy sidecar (part one, tests/bench/latency_bench.py, times one
review in process and over one connection). Prints figures, asserts nothing.

The server (`initshift serve`, one process, JSON logs on, as in production) is pinned to
one core and every client to another, so no client takes the server's CPU.

1. What one process serves: wrk (C) sends reviews as a Poisson stream at a rate asked
   for (each connection waits an exponential time before each request), 100/s and up,
   10 s each, until p99 reaches 5 ms; the highest rate under it is the figure the
   Deployment is sized by (docs/admission-server.md#sizing).
2. Throughput at 16 keep-alive connections sending as fast as answered (ApacheBench).
3. A burst: 64 keep-alive connections sending reviews as fast as they are answered, while a
   probe opens a new TLS connection every 100 ms (handshake time) and asks /healthz on
   its own connection (latency): the webhook's 5 s timeout must never be near.

`--server-tree DIR` runs the server from another checkout (a baseline), `--rates-only`
runs part 1 alone, `--quick` skips it.
"""

from __future__ import annotations

import argparse
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

from tests.bench._machine import Steal, describe
from tests.support import https_helpers as h

BURST_SECONDS = 10.0
RATES, RATE_SECONDS, RATE_P99_MS = (50, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1500), 10.0, 5.0


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


# --- what one process serves ----------------------------------------------------------------
# wrk (C) paces each connection with Lua's delay() hook: before each request it waits an
# exponential time, so the requests of all connections together arrive as a Poisson stream
# at the rate asked (many independent clients, as an apiserver's many writers are), and one
# late answer holds back only its own connection's next request. The first request of each
# connection waits for the TLS handshakes of all of them to be over (not counted).
_PACED = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("{body}", "rb")
wrk.body = f:read("*a")
f:close()
local gap, started = {gap_ms}, 0
function delay()
  started = started + 1
  local wait = -gap * math.log(1 - math.random())
  if started <= {connections} then wait = wait + 1000 end
  return wait
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("PACED %d %d %d %d %.0f %.0f %.0f %.0f\\n", summary.requests, summary.duration,
    e.status, e.connect + e.read + e.write + e.timeout, latency:percentile(50), latency:percentile(99),
    latency:percentile(99.9), latency.max))
end
"""


def paced(url: str, body_file: Path, rate: int) -> dict:
    """`rate` reviews/s for RATE_SECONDS (plus the second of warm-up) through wrk, pinned."""
    connections = max(8, min(64, rate // 10))
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as lua:
        lua.write(_PACED.format(body=body_file, gap_ms=1000.0 * connections / rate, connections=connections))
        lua.flush()
        out = subprocess.run(["wrk", "-t1", f"-c{connections}",
                              f"-d{RATE_SECONDS + 1:g}s", "--timeout", "10s", "-s", lua.name, f"{url}/mutate"],
                             capture_output=True, text=True, timeout=RATE_SECONDS + 120, check=True).stdout
    m = re.search(r"^PACED" + r" (\d+)" * 8 + "$", out, re.M)
    if m is None:
        raise SystemExit(f"wrk printed no figures:\n{out}")
    done, duration, status, errors, p50, p99, p999, worst = map(int, m.groups())
    # wrk's duration holds the second every connection waits before its first request.
    return {"rate": rate, "connections": connections, "done": done, "rps": done / max(duration / 1e6 - 1, 1e-9),
            "errors": status + errors, "p50": p50 / 1000, "p99": p99 / 1000, "p999": p999 / 1000, "max": worst / 1000}


def sweep(url: str, body_file: Path) -> list[dict]:
    """Paced runs at RATES until one misses p99 < RATE_P99_MS (or fails); printed as they go."""
    out = []
    for rate in RATES:
        r = paced(url, body_file, rate)
        out.append(r)
        print(f"paced {rate}/s ({r['connections']} connections, {RATE_SECONDS:g} s): {r['done']} answered at "
              f"{r['rps']:.0f}/s, p50 {r['p50']:.2f} ms, p99 {r['p99']:.2f} ms, p99.9 {r['p999']:.1f} ms, "
              f"max {r['max']:.0f} ms, errors {r['errors']}, load average {os.getloadavg()[0]:.1f}", flush=True)
        if r["p99"] >= RATE_P99_MS or r["errors"]:
            break
    return out


def pin() -> tuple[set[int], set[int]] | None:
    """One core for the server (a Python process uses one), another for the clients (this
    process, wrk and ab inherit it): the client never takes the server's CPU. None with
    fewer than two cores."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    server, client = {cpus[-1]}, {cpus[0]}
    os.sched_setaffinity(0, client)
    return server, client


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server-tree", type=Path, default=Path.cwd(), help="checkout the server runs from")
    ap.add_argument("--rates-only", action="store_true", help="only the paced runs (what one process serves)")
    ap.add_argument("--quick", action="store_true", help="skip the paced runs")
    args = ap.parse_args(argv)
    if shutil.which("wrk") is None:
        print("wrk is not installed (make bench-admission installs it as root)")
        return 1
    print(describe())
    steal = Steal()
    pinned = pin()
    body = json.dumps(h.review(h.seven_step_pod(), namespace="builds")).encode()
    where = f"server on CPU {min(pinned[0])}, clients on CPU {min(pinned[1])}" if pinned else "not pinned (one CPU)"
    print(f"admission benchmark: 7-step pod + istio-proxy, {len(body)} byte review, TLS, {os.cpu_count()} cores, "
          f"{where}, load average {os.getloadavg()[0]:.1f}, one server process from {args.server_tree}")
    have_ab = shutil.which("ab") is not None and not args.rates_only
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        ca = h.make_certs(d)
        body_file = d / "review.json"
        body_file.write_bytes(body)
        affinity = (lambda: os.sched_setaffinity(0, pinned[0])) if pinned else None
        proc, port = h.serve_process(d, body, tree=args.server_tree.resolve(), preexec_fn=affinity,
                                     env={"INITSHIFT_WORKERS": "1"})  # one process from an older --server-tree
        url = f"https://127.0.0.1:{port}"
        try:
            rates = [] if args.quick else sweep(url, body_file)
            steady = ab(url, body_file, 16, 10) if have_ab else None
            load, probe = burst(url, port, ca, body_file) if have_ab else (None, None)
        finally:
            proc.terminate()
            proc.wait(30)
    if steady is not None and load is not None and probe is not None:
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
    elif not args.rates_only:
        print("ApacheBench (ab, Debian apache2-utils) not found: no throughput or burst figures")
    if rates:
        best = max((r["rps"] for r in rates if r["p99"] < RATE_P99_MS and not r["errors"]), default=None)
        print(f"one process serves {f'{best:.0f}' if best else 'under ' + str(RATES[0])} reviews/s at p99 < "
              f"{RATE_P99_MS:g} ms (the highest paced rate above whose p99 stayed under it; load average "
              f"{os.getloadavg()[0]:.1f} at the end)")
    print(steal)
    return 0


if __name__ == "__main__":
    sys.exit(main())
