"""`make bench-hostile`: what one hostile client costs the server (issue 24). Prints
figures, asserts nothing. The server runs as `initshift serve` with INITSHIFT_WORKERS=2 (as
in the issue's probes; `--workers N` to change) and production defaults otherwise.

1. Header flood: one request with 32 MB of small headers; bytes the client got in before
   it was cut off, and the workers' peak RSS (VmHWM) growth.
2. Metrics flood: 2,000 connections each sending an unfinished `GET /metrics` to worker
   0's metrics port; worker 0's CPU time while they are held, and /mutate latency
   meanwhile (p50/p99 over 100 reviews).
3. Slow bodies: 140 clients each declaring a 100-byte body and sending 10 bytes; then 100
   legitimate reviews: how many got 503.
4. Large reviews: 4 clients posting 7 MB reviews back to back; /mutate of the normal
   7-step build pod meanwhile (p50/p99 over 200 reviews), and the large ones' answers.
5. Pipelining: 100,000 `GET /healthz` sent at once on one connection; answers, RSS growth.
6. Memory: supervisor and per-worker RSS idle, and each process's peak after all of it.

`--server-tree DIR` runs the server from another checkout (a baseline); `--cases 1,4` runs
only those cases (memory, 6, is always printed).
"""

from __future__ import annotations

import argparse
import collections
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

from tests.support import hostile
from tests.support import https_helpers as h


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))] * 1000 if values else float("nan")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def summary(samples: list[tuple[int, float]]) -> str:
    ok = [t for status, t in samples if status == 200]
    codes = collections.Counter(status for status, _ in samples)
    return (f"p50 {pct(ok, 0.5):.1f} ms, p99 {pct(ok, 0.99):.1f} ms, max {max(ok, default=0) * 1000:.1f} ms "
            f"({dict(codes)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--server-tree", type=Path)
    parser.add_argument("--cases", default="1,2,3,4,5", help="which cases to run (comma list)")
    args = parser.parse_args()
    cases = {int(c) for c in args.cases.split(",")}
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} "
          f"(shared machines give noisy figures)")
    d = Path(tempfile.mkdtemp(prefix="initshift-hostile-"))
    h.make_certs(d)
    small = hostile.small_body()
    large = hostile.large_body(7 * 1000 * 1000)
    proc, port = h.serve_process(d, small, tree=args.server_tree, workers=args.workers)
    url, ctx = f"https://127.0.0.1:{port}", h.client_context(d / "ca.crt")
    try:
        env = dict(i.decode().split("=", 1) for i in Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
                   if b"=" in i)
        metrics_port = int(env["INITSHIFT_METRICS_PORT"])
        deadline = time.monotonic() + 120
        while len(hostile.children(proc.pid)) < args.workers > 1 and time.monotonic() < deadline:
            time.sleep(0.2)  # the others start after worker 0 answers
        workers = hostile.children(proc.pid) or [proc.pid]
        time.sleep(1)
        idle = {pid: hostile.memory_kb(pid) for pid in [proc.pid, *workers]}
        print(f"server: {len(workers)} worker(s); idle RSS supervisor {idle[proc.pid] / 1024:.0f} MB, workers "
              + ", ".join(f"{idle[p] / 1024:.0f}" for p in workers) + " MB")
        print(f"reviews: normal {len(small) / 1024:.0f} KiB, large {len(large) / 1e6:.1f} MB")

        # 1. header flood
        if 1 in cases:
            before = {p: hostile.memory_kb(p, "VmHWM") for p in workers}
            sent = hostile.header_flood(port, ctx)
            after = {p: hostile.memory_kb(p, "VmHWM") for p in workers}
            growth = max(after[p] - before[p] for p in workers) / 1024
            print(f"1. header flood (32 MB of headers): {sent / 1e6:.1f} MB sent before the cut; "
                  f"worker peak RSS growth {growth:.0f} MB")

        # 2. metrics flood
        if 2 in cases:
            w0 = workers[0]
            cpu0 = cpu_seconds(w0)
            start = time.monotonic()
            flood = hostile.metrics_flood(metrics_port, 2000)
            samples = hostile.latencies(url, ctx, small, 100)
            held = time.monotonic() - start
            cpu = cpu_seconds(w0) - cpu0
            print(f"2. metrics flood ({len(flood)} unfinished GET /metrics): worker 0 used {cpu:.2f} s CPU over "
                  f"{held:.1f} s; /mutate meanwhile {summary(samples)}")
            for s in flood:
                s.close()

        # 3. slow bodies
        if 3 in cases:
            slow = hostile.slow_bodies(port, ctx, 140)
            samples = hostile.latencies(url, ctx, small, 100, pause=0.01)
            print(f"3. slow bodies (140 clients, 10 of 100 bytes): legitimate /mutate {summary(samples)}; "
                  f"503s: {sum(1 for s, _ in samples if s == 503)}")
            for s in slow:
                s.close()

        # 4. large-review flood
        if 4 in cases:
            with hostile.posting(url, str(d / "ca.crt"), large, 4) as statuses:
                time.sleep(1)
                samples = hostile.latencies(url, ctx, small, 200)
            print(f"4. 7 MB review flood (4 clients): normal /mutate {summary(samples)}; large reviews answered "
                  f"{dict(collections.Counter(statuses))}")

        # 5. pipelining
        if 5 in cases:
            before = {p: hostile.memory_kb(p, "VmHWM") for p in workers}
            answered = hostile.pipelined(port, ctx, 100_000)
            growth = max(hostile.memory_kb(p, "VmHWM") - before[p] for p in workers) / 1024
            print(f"5. 100,000 pipelined GET /healthz on one connection: {answered} answered before the connection "
                  f"was dropped; worker peak RSS growth {growth:.0f} MB")

        # 6. memory
        peak = {pid: hostile.memory_kb(pid, "VmHWM") for pid in [proc.pid, *workers]}
        now = {pid: hostile.memory_kb(pid) for pid in [proc.pid, *workers]}
        print(f"6. RSS after all of it: supervisor {now[proc.pid] / 1024:.0f} MB (peak {peak[proc.pid] / 1024:.0f}); "
              "workers " + ", ".join(f"{now[p] / 1024:.0f} (peak {peak[p] / 1024:.0f})" for p in workers) + " MB")
    finally:
        proc.terminate()
        proc.wait(60)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
