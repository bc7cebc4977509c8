"""`make bench-admission-callgrind`: CPU instructions one review costs the server, counted
by valgrind's callgrind, which (unlike a clock) gives the same figure on a busy machine.

`initshift serve` (one process) runs under callgrind with collection off; a client sends a
warm-up, turns collection on (callgrind_control), sends N reviews of the 7-step kpack pod
with istio-proxy over one keep-alive TLS connection, turns it off again, then does the same
with GET /healthz. Everything the server process executes is counted: TLS, the HTTP parser,
the ASGI application, the JSON in and out, the rewrite, the log line and the metrics.
The in-process rewrite (plan, rewrite, JSONPatch) is counted too: the difference between a
run of N rewrites and a run of none. `--server-tree DIR` runs both from another checkout (a
baseline). Prints figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from certs import store
from tests.support import https_helpers as h

N = 200


def _request(method: str, path: str, body: bytes = b"") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\n"
    if body:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + "\r\n").encode() + body


def _exchange(conn: "socket.socket", request: bytes) -> int:
    conn.sendall(request)
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))  # type: ignore[union-attr]
    while len(rest) < length:
        rest += conn.recv(65536)
    return int(head.split()[1])


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True, timeout=120)


def _instructions(out_dir: Path) -> int:
    """Instructions of the last dump (each `callgrind_control -d` writes one file, and zeroes)."""
    dumps = sorted(out_dir.glob("callgrind.out*"), key=lambda p: p.stat().st_mtime)
    for line in dumps[-1].read_text(errors="replace").splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise SystemExit(f"no totals in {dumps[-1]}")


def measure(tree: Path, n: int, keep: Path | None = None) -> dict[str, float]:
    body = json.dumps(h.review(h.seven_step_pod(), namespace="builds")).encode()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        ca = h.make_certs(d)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1",
               "INITSHIFT_WORKERS": "1",  # one process from a --server-tree that still had workers
               "SUPPORT_INJECTED_SIDECARS": "true", "INITSHIFT_HOST": "127.0.0.1", "INITSHIFT_PORT": str(port),
               "INITSHIFT_METRICS_PORT": "0", "INITSHIFT_TLS_CERT": str(d / store.TLS_CERT),
               "INITSHIFT_TLS_KEY": str(d / store.TLS_KEY)}
        out = d / "cg"
        out.mkdir()
        proc = subprocess.Popen(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                                 f"--callgrind-out-file={out}/callgrind.out.%p", sys.executable,
                                 "-m", "webhook.cli", "serve"], env=env, cwd=tree,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            ctx = h.client_context(ca)
            deadline = time.monotonic() + 600
            while True:
                try:
                    conn = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=120),
                                           server_hostname="localhost")
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit("the server under valgrind did not start")
                    time.sleep(0.5)
            figures = {}
            with conn:
                for name, request in (("/mutate", _request("POST", "/mutate", body)),
                                      ("/healthz", _request("GET", "/healthz"))):
                    for _ in range(20):  # warm-up: caches, first-call paths
                        assert _exchange(conn, request) == 200
                    _control(proc.pid, "-i", "on")
                    for _ in range(n):
                        assert _exchange(conn, request) == 200
                    _control(proc.pid, "-i", "off")
                    _control(proc.pid, "-d")
                    time.sleep(0.5)
                    figures[name] = _instructions(out) / n
                    if keep is not None:  # for callgrind_annotate
                        keep.mkdir(parents=True, exist_ok=True)
                        newest = max(out.glob("callgrind.out*"), key=lambda p: p.stat().st_mtime)
                        shutil.copy(newest, keep / f"callgrind{name.replace('/', '.')}.out")
        finally:
            proc.terminate()
            proc.wait(120)
    return figures


_IN_PROCESS = """
import sys
from tests.support import https_helpers as h
from webhook.admission import make_patch
from webhook.rewrite import plan
from webhook.settings import Settings
pod, settings = h.seven_step_pod(), Settings(feature_gate=True)
for _ in range(20 + int(sys.argv[1])):
    make_patch(pod, plan(pod, settings).rewrite().pod)
"""


def in_process(tree: Path, n: int) -> float:
    """Instructions per plan + rewrite + JSONPatch of the 7-step pod, run from `tree`."""
    def total(runs: int) -> int:
        out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
                              "-c", _IN_PROCESS, str(runs)], capture_output=True, text=True, cwd=tree, check=True,
                             env={**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"})
        return int(re.search(r"refs:\s+([\d,]+)", out.stderr).group(1).replace(",", ""))  # type: ignore[union-attr]

    return (total(n) - total(0)) / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server-tree", type=Path, default=Path.cwd(), help="checkout the server runs from")
    ap.add_argument("-n", type=int, default=N, help="requests counted per endpoint")
    ap.add_argument("--keep", type=Path, help="copy each endpoint's callgrind profile here")
    args = ap.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (make bench-admission-callgrind installs it as root)")
        return 1
    tree = args.server_tree.resolve()
    rewrite = in_process(tree, args.n)
    f = measure(tree, args.n, args.keep)
    print(f"callgrind, code from {args.server_tree}: instructions (7-step kpack pod + istio-proxy)")
    print(f"  {'rewrite':>9}  {rewrite / 1e6:8.2f} M  in process: plan, rewrite, JSONPatch")
    for name, ir in f.items():
        print(f"  {name:>9}  {ir / 1e6:8.2f} M  per request, {args.n} over one keep-alive TLS connection")
    return 0


if __name__ == "__main__":
    sys.exit(main())
