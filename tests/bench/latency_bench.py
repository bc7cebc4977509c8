"""`make bench-admission`, part one: what one review costs.

1. In process: the rewrite of the 7-step kpack pod with istio-proxy (plan, rewrite, JSONPatch),
   timed over many runs after a warm-up.
2. Over HTTPS: `initshift serve` in its own process and wrk (C, one thread, one keep-alive
   TLS connection, so the client is not the bottleneck) against POST /mutate and GET /healthz
   of the same server, side by side.

Each part runs `--rounds` times (default 3) and the figures printed are the medians over the
rounds, so one burst of another process's work on a shared machine moves them less.
`--server-tree DIR` runs the HTTPS part's server from another checkout (a baseline).
`make bench-admission-callgrind` (tests/bench/admission_callgrind.py) counts instructions
instead, which a busy machine does not change. Prints figures, asserts nothing but that the
pod is rewritten.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.bench._machine import Steal, describe
from tests.support import https_helpers as h
from webhook.admission import make_patch
from webhook.rewrite import plan
from webhook.settings import Settings

RUNS = 3000
WRK_SECONDS = int(os.environ.get("INITSHIFT_BENCH_SECONDS", "10"))
_WRK_LINE = re.compile(r"^\s+(50|75|90|99)%\s+([\d.]+)(us|ms|s)\s*$")
_UNIT = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def in_process() -> dict[str, float]:
    pod = h.seven_step_pod()
    settings = Settings(feature_gate=True)

    def once() -> None:
        result = plan(pod, settings).rewrite()
        assert result.changed, "the benchmark pod must be rewritten"
        make_patch(pod, result.pod)

    for _ in range(200):
        once()
    times = []
    for _ in range(RUNS):
        t = time.perf_counter()
        once()
        times.append((time.perf_counter() - t) * 1000)
    times.sort()
    return {"p50": statistics.median(times), "p99": times[int(RUNS * 0.99) - 1], "min": times[0]}


def wrk(url: str, body_file: Path | None) -> dict[str, float]:
    script = ""
    if body_file is not None:
        script = (f'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
                  f'local f = io.open("{body_file}", "rb")\nwrk.body = f:read("*a")\nf:close()\n')
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as lua:
        lua.write(script)
        lua.flush()
        out = subprocess.run(["wrk", "-t1", "-c1", f"-d{WRK_SECONDS}s", "--latency", "-s", lua.name, url],
                             capture_output=True, text=True, timeout=WRK_SECONDS + 60, check=True).stdout
    figures = {f"p{m.group(1)}": float(m.group(2)) * _UNIT[m.group(3)]
               for m in map(_WRK_LINE.match, out.splitlines()) if m}
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise SystemExit(f"{url}: {errors.group(1)} error answers\n{out}")
    figures["rps"] = float(rate.group(1)) if rate else 0.0
    return figures


def over_https(rounds: int, tree: Path | None) -> tuple[list[dict], list[dict], int] | None:
    if shutil.which("wrk") is None:
        print("wrk is not installed (make bench-admission installs it as root): HTTPS figures skipped")
        return None
    body = json.dumps(h.review(h.seven_step_pod(), namespace="builds")).encode()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        h.make_certs(d)  # serve_process starts the server with these
        (d / "review.json").write_bytes(body)
        proc, port = h.serve_process(d, body, tree=tree)
        try:
            url = f"https://127.0.0.1:{port}"
            # wrk does not verify certificates; the check above did, with the same server.
            mutate, healthz = [], []
            for _ in range(rounds):
                mutate.append(wrk(f"{url}/mutate", d / "review.json"))
                healthz.append(wrk(f"{url}/healthz", None))
            return mutate, healthz, len(body)
        finally:
            proc.terminate()
            proc.wait(20)


def median(runs: list[dict], key: str) -> float:
    return statistics.median(r.get(key, 0.0) for r in runs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="runs of each part; the medians are printed")
    ap.add_argument("--server-tree", type=Path, help="checkout the HTTPS part's server runs from")
    args = ap.parse_args(argv)
    print(describe())
    steal = Steal()
    runs = [in_process() for _ in range(args.rounds)]
    print(f"in-process rewrite of the 7-step kpack pod + istio-proxy (plan, rewrite, JSONPatch), {RUNS} runs, "
          f"median of {args.rounds} rounds:")
    print(f"  p50 {median(runs, 'p50'):.3f} ms   p99 {median(runs, 'p99'):.3f} ms   min {median(runs, 'min'):.3f} ms")
    https = over_https(args.rounds, args.server_tree.resolve() if args.server_tree else None)
    if https is None:
        print(steal)
        return 0
    mutate, healthz, size = https
    print(f"over HTTPS: wrk, 1 thread, 1 keep-alive TLS connection, {WRK_SECONDS} s each, {size} byte review, "
          f"median of {args.rounds} rounds{f', server from {args.server_tree}' if args.server_tree else ''}")
    print(f"{'endpoint':>9} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'req/s':>8}")
    for name, f in (("/mutate", mutate), ("/healthz", healthz)):
        print(f"{name:>9} {median(f, 'p50'):>8.2f} {median(f, 'p90'):>8.2f} {median(f, 'p99'):>8.2f} "
              f"{median(f, 'rps'):>8.0f}")
    print(steal)
    return 0


if __name__ == "__main__":
    sys.exit(main())
