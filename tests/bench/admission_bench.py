"""`make bench-admission`: latency and throughput of POST /mutate for a 7-step build pod
with an istio-proxy sidecar, against GET /healthz of the same server as the floor.

The server runs as `initshift serve` in its own process (its own GIL, JSON logs on, as in
production); the client is httpx over TLS with keep-alive. Prints, asserts nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tests.support import https_helpers as h
from webhook.admission._https import bind

ROUNDS = {1: 400, 16: 2400}


async def measure(client: httpx.AsyncClient, method: str, path: str, body: bytes | None, concurrency: int,
                  total: int) -> dict:
    latencies: list[float] = []
    remaining = total

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            t = time.perf_counter()
            r = await client.request(method, path, content=body, headers={"content-type": "application/json"})
            latencies.append(time.perf_counter() - t)
            if r.status_code != 200:
                raise SystemExit(f"{path}: HTTP {r.status_code}: {r.text[:200]}")

    for _ in range(20):  # warm-up: connections, caches
        await client.request(method, path, content=body, headers={"content-type": "application/json"})
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    latencies.sort()
    return {"p50": statistics.median(latencies) * 1000, "p99": latencies[int(len(latencies) * 0.99) - 1] * 1000,
            "rps": len(latencies) / wall}


async def run(url: str, ca: Path, body: bytes) -> list[tuple[int, dict, dict]]:
    out = []
    for concurrency, total in ROUNDS.items():
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(base_url=url, verify=h.client_context(ca), limits=limits, timeout=30) as c:
            mutate = await measure(c, "POST", "/mutate", body, concurrency, total)
            trivial = await measure(c, "GET", "/healthz", None, concurrency, total)
        out.append((concurrency, mutate, trivial))
    return out


def main() -> int:
    review = h.review(h.seven_step_pod(), namespace="builds")
    body = json.dumps(review).encode()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        ca = h.make_certs(d)
        sock = bind()
        port = sock.getsockname()[1]
        sock.close()  # the child binds it; loopback ports are not reused that fast
        env = {**os.environ, "SUPPORT_INJECTED_SIDECARS": "true", "INITSHIFT_HOST": "127.0.0.1",
               "INITSHIFT_PORT": str(port), "INITSHIFT_TLS_CERT": str(d / "tls.crt"),
               "INITSHIFT_TLS_KEY": str(d / "tls.key")}
        proc = subprocess.Popen([sys.executable, "-m", "webhook.cli", "serve"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"https://127.0.0.1:{port}"
            for _ in range(200):
                try:
                    httpx.get(f"{url}/readyz", verify=h.client_context(ca))
                    break
                except httpx.TransportError:
                    time.sleep(0.05)
            answer = httpx.post(f"{url}/mutate", content=body, verify=h.client_context(ca),
                                headers={"content-type": "application/json"}).json()
            assert answer["response"].get("patch"), "the benchmark pod must be rewritten"
            results = asyncio.run(run(url, ca, body))
        finally:
            proc.terminate()
            proc.wait(20)
    print(f"admission benchmark: 7-step pod + istio-proxy, {len(body)} byte review, "
          f"TLS, keep-alive, {os.cpu_count()} cores")
    print(f"{'concurrency':>11} {'endpoint':>9} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8}")
    for concurrency, mutate, trivial in results:
        for name, r in (("/mutate", mutate), ("/healthz", trivial)):
            print(f"{concurrency:>11} {name:>9} {r['p50']:>8.2f} {r['p99']:>8.2f} {r['rps']:>8.0f}")
        print(f"{concurrency:>11} {'ratio':>9} {mutate['p50'] / trivial['p50']:>8.1f} "
              f"{mutate['p99'] / trivial['p99']:>8.1f} {trivial['rps'] / mutate['rps']:>8.1f}  (mutate / healthz)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
