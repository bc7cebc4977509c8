"""`make bench-waiter`: figures for the frozen waiter, printed, never asserted.

- cold start: wall time of `waiter run --post F -- /bin/true`, median of 20 runs
- handoff: step i's finishedAt to step i+1's startedAt (from the records), 200 handoffs
  in batches of 21 chained waiters, all waiting before the first is released; each step
  posts into its own directory, as each pod step has its own run volume
- CPU time used while waiting 10 s for a completion file that never comes (schedstat, ns)
- peak RSS (VmHWM) of a waiting waiter
- step 0's gate: from a loopback server turning ready (`--probe`, what waiter and hybrid
  pods use) or the ready file appearing (`--ready-file`, the waiter's own part of the
  watcher's path) to step 0's startedAt, 20 runs each
- step 0's gate against a proxy that takes 3 s to turn ready: the waiter's CPU time while
  it polls (/proc/PID/schedstat, ns), the probes it made, and the latency once ready
- the start's signal window, 40 starts: from the spawn to the terminating signals blocked
  (a SIGTERM before that is lost to a PID 1) and to the SIGTERM handler in place, polling
  /proc/PID/status
- a chain of 20 steps of 0.2 s (the issue's kubelet measurement): first start to last end
- a Job-shaped pod (one main, no step) beside a proxy process, 20 runs: the gate (the
  proxy's loopback probe turns ready -> the main starts), and from the main's end (its
  record's finishedAt) to the quit POST reaching the proxy and to the proxy's exit

Runs the bundle where pods run it, chrooted into a busybox root with the bundle at
/initshift/bin/waiter (needs root); otherwise it measures the source waiter and says so.
"""

from __future__ import annotations

import os
import random
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from waiter import protocol as p
from waiter.post import write_atomic
from tests.bench._machine import Steal, describe
from tests.support.waiter_support import SOURCE_WAITER, catches, ensure_bundle, has_signal, holding, proc_status, \
    record, waiter_env

COLD_RUNS = 20
BATCHES, CHAIN = 10, 21  # 10 x 20 = 200 handoffs
IDLE_SECONDS = 10
GATE_RUNS = 20
SLOW_PROXY_SECONDS = 3.0
STEPS, STEP_SECONDS = 20, 0.2


class Target:
    """How to start a waiter: frozen in a chroot (root) or from source."""

    def __init__(self, tmp: Path) -> None:
        self.frozen = os.geteuid() == 0
        if self.frozen:
            bundle = ensure_bundle()
            self.root = tmp / "root"
            bindir = self.root / p.BIN_MOUNT.lstrip("/")
            bindir.mkdir(parents=True)
            subprocess.run([sys.executable, "-m", "waiter", p.CMD_INIT, "--from", str(bundle), str(bindir)],
                           check=True, capture_output=True)
            (self.root / "bin").mkdir()
            shutil.copy(shutil.which("busybox") or "/bin/busybox", self.root / "bin" / "busybox")
            (self.root / "bin" / "true").symlink_to("busybox")
            (self.root / "bin" / "sleep").symlink_to("busybox")
            self.work = self.root / "work"
            self.inside = "/work"
        else:
            self.work = tmp / "work"
            self.inside = str(self.work)
        self.work.mkdir()

    def popen(self, post: str, *flags: str, argv: list[str]) -> subprocess.Popen:
        args = [p.CMD_RUN, p.FLAG_POST, post, *flags, p.ARGV_SEPARATOR, *argv]
        if self.frozen:
            root = str(self.root)
            return subprocess.Popen([p.WAITER_PATH, *args], env={"PATH": "/bin"},
                                    preexec_fn=lambda: (os.chroot(root), os.chdir("/")),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return subprocess.Popen([*SOURCE_WAITER, *args], env=waiter_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def true(self) -> str:
        return "/bin/true" if self.frozen else shutil.which("true") or "/bin/true"

    def sleep(self) -> str:
        return "/bin/sleep" if self.frozen else shutil.which("sleep") or "/bin/sleep"


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _wait_ready(procs: list[subprocess.Popen]) -> None:
    while not all(catches(proc.pid, signal.SIGTERM) for proc in procs):
        time.sleep(0.01)


def cold_start(t: Target) -> list[float]:
    times = []
    for i in range(COLD_RUNS):
        start = time.perf_counter()
        proc = t.popen(f"{t.inside}/cold{i}", argv=[t.true()])
        proc.wait()
        times.append(time.perf_counter() - start)
        assert proc.returncode == 0, f"cold start run failed ({proc.returncode})"
    return times


WINDOW_RUNS = 40


def start_window(t: Target) -> tuple[list[float], list[float]]:
    """Per start: spawn -> terminating signals blocked, spawn -> SIGTERM handled (seconds)."""
    held, handled = [], []
    for i in range(WINDOW_RUNS):
        begun = time.perf_counter()
        proc = t.popen(f"{t.inside}/window{i}", p.FLAG_WAIT, f"{t.inside}/never", argv=[t.true()])
        blocked = None
        try:
            while True:
                status = proc_status(proc.pid)
                assert status, "the waiter exited in its start"
                if blocked is None and holding(status):
                    blocked = time.perf_counter() - begun
                if has_signal(status, "SigCgt", signal.SIGTERM):
                    handled.append(time.perf_counter() - begun)
                    break
        finally:
            proc.kill()
            proc.wait()
        if blocked is not None:  # (the poll can miss the few ms between the two)
            held.append(blocked)
    return held, handled


def _step_posts(t: Target, name: str, count: int) -> tuple[list[Path], list[str]]:
    """Completion files of `count` steps, each in its own directory (a pod's run volumes):
    paths outside the root, and as the waiters see them."""
    base = t.work / name
    for i in range(count):
        (base / str(i)).mkdir(parents=True)
    done = p.COMPLETION_FILE_NAME
    return [base / str(i) / done for i in range(count)], [f"{t.inside}/{name}/{i}/{done}" for i in range(count)]


def handoffs(t: Target) -> list[float]:
    out: list[float] = []
    for b in range(BATCHES):
        posts, inside = _step_posts(t, f"b{b}", CHAIN + 1)  # [0] is the release, written here
        procs = [t.popen(inside[i], p.FLAG_WAIT, inside[i - 1], argv=[t.true()]) for i in range(1, CHAIN + 1)]
        _wait_ready(procs)
        now = datetime.utcnow().isoformat() + "Z"
        write_atomic(str(posts[0]), (f'{{"{p.RECORD_EXIT_CODE}": 0, "{p.RECORD_REASON}": '
                                     f'"{p.REASON_COMPLETED}", "{p.RECORD_FINISHED_AT}": "{now}"}}').encode())
        for proc in procs:
            proc.wait()
        recs = [record(post) for post in posts[1:]]
        out += [_ts(b_[p.RECORD_STARTED_AT]) - _ts(a[p.RECORD_FINISHED_AT]) for a, b_ in zip(recs, recs[1:])]
    return out


def _cpu_ns(pid: int) -> int:
    """CPU time of a process in ns (schedstat: /proc/PID/stat counts 10 ms ticks)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def idle(t: Target) -> tuple[float, int]:
    (t.work / "idle").mkdir()
    proc = t.popen(f"{t.inside}/idle/mine", p.FLAG_WAIT, f"{t.inside}/idle/never", argv=[t.true()])
    _wait_ready([proc])
    before = _cpu_ns(proc.pid)
    time.sleep(IDLE_SECONDS)
    used = (_cpu_ns(proc.pid) - before) / 1e9
    status = Path(f"/proc/{proc.pid}/status").read_text()
    hwm = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:"))
    proc.send_signal(signal.SIGTERM)
    proc.wait()
    return used, hwm


class Sidecar:
    """A loopback HTTP server whose readiness endpoint answers 503 until `ready` is set;
    `probes` counts the requests."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.probes = 0
        sidecar = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                sidecar.probes += 1
                self.send_response(200 if sidecar.ready.is_set() else 503)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/ready"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _gated(t: Target, name: str, flags: tuple[str, ...], open_gate) -> float:
    """Seconds from open_gate() to the step's startedAt."""
    (t.work / name).mkdir()
    proc = t.popen(f"{t.inside}/{name}/done", *flags, argv=[t.true()])
    _wait_ready([proc])
    time.sleep(0.3 + random.uniform(0, p.GATE_POLL_MAX))  # well into its waiting, at any phase of its probe rounds
    opened = time.time()
    open_gate()
    proc.wait()
    return _ts(record(t.work / name / "done")[p.RECORD_STARTED_AT]) - opened


def gate_latency(t: Target) -> tuple[list[float], list[float]]:
    sidecar = Sidecar()
    probe, ready_file = [], []
    try:
        for i in range(GATE_RUNS):
            sidecar.ready.clear()
            probe.append(_gated(t, f"probe{i}", (p.FLAG_PROBE, sidecar.url), sidecar.ready.set))
            path = t.work / f"file{i}" / "ready"
            ready_file.append(_gated(t, f"file{i}", (p.FLAG_READY_FILE, f"{t.inside}/file{i}/ready"),
                                     lambda: write_atomic(str(path), p.READY_TRUE.encode())))
    finally:
        sidecar.close()
    return probe, ready_file


def gate_slow_proxy(t: Target) -> tuple[float, int, float]:
    """A proxy that turns ready SLOW_PROXY_SECONDS after step 0 starts waiting: the waiter's
    CPU seconds meanwhile, the probes it made, and seconds from ready to step 0's start."""
    sidecar = Sidecar()
    try:
        (t.work / "slow").mkdir()
        proc = t.popen(f"{t.inside}/slow/done", p.FLAG_PROBE, sidecar.url, argv=[t.true()])
        _wait_ready([proc])
        before, probes = _cpu_ns(proc.pid), sidecar.probes
        time.sleep(SLOW_PROXY_SECONDS)
        used, probes = _cpu_ns(proc.pid) - before, sidecar.probes - probes
        opened = time.time()
        sidecar.ready.set()
        proc.wait()
    finally:
        sidecar.close()
    return used / 1e9, probes, _ts(record(t.work / "slow" / "done")[p.RECORD_STARTED_AT]) - opened


def chain(t: Target) -> float:
    """First step's start to last step's end, STEPS steps of STEP_SECONDS, all started at once,
    each posting into its own directory."""
    posts, inside = _step_posts(t, "chain", STEPS)
    procs = [t.popen(inside[i], *((p.FLAG_WAIT, inside[i - 1]) if i else ()),
                     argv=[t.sleep(), str(STEP_SECONDS)]) for i in range(STEPS)]
    for proc in procs:
        proc.wait()
    recs = [record(post) for post in posts]
    return _ts(recs[-1][p.RECORD_FINISHED_AT]) - _ts(recs[0][p.RECORD_STARTED_AT])


# --- a Job-shaped pod: mains gated on a proxy process, the last one quitting it (issue 23) --------
JOB_RUNS = 20
# A proxy as its own process: readiness 503 until SIGUSR1, then 200; a POST (the quit) is
# answered, its arrival time printed, and the process exits, as Envoy's /quitquitquit does.
_PROXY = r"""
import os, signal, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
ready = threading.Event()
signal.signal(signal.SIGUSR1, lambda *_: ready.set())
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if ready.is_set() else 503); self.send_header("Content-Length", "0"); self.end_headers()
    def do_POST(self):
        told = time.time()
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers(); self.wfile.flush()
        print(told, flush=True); os._exit(0)
    def log_message(self, *a): pass
s = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""


def _job_once(t: Target, i: int) -> tuple[float, float, float]:
    """One Job-shaped pod with one main: (probe ready -> main starts, main ends -> quit POST
    received, main ends -> proxy exited), each in seconds."""
    proxy = subprocess.Popen([sys.executable, "-c", _PROXY], stdout=subprocess.PIPE, text=True)
    # Its exit seen at once (Popen.wait with a timeout polls in steps of up to 50 ms).
    exit_fd = os.pidfd_open(proxy.pid)
    try:
        port = int(proxy.stdout.readline())
        base = t.work / f"job{i}"
        for d in ("run", "mains", "ready"):
            (base / d).mkdir(parents=True)
        inside = f"{t.inside}/job{i}"
        # The flags the rewrite gives a Job's main (tests/rewrite/test_job.py), paths moved here.
        main = t.popen(f"{inside}/run/done", p.FLAG_NAME, "main", p.FLAG_READY_FILE, f"{inside}/ready/ready",
                       p.FLAG_PROBE, f"http://127.0.0.1:{port}/healthz/ready",
                       p.FLAG_QUIT, f"http://127.0.0.1:{port}/quitquitquit",
                       p.FLAG_MAINS_DIR, f"{inside}/mains", p.FLAG_MAINS, "1", argv=[t.true()])
        _wait_ready([main])
        time.sleep(0.3 + random.uniform(0, p.GATE_POLL_MAX))  # at any phase of the probe rounds
        opened = time.time()
        proxy.send_signal(signal.SIGUSR1)
        # The main quits it; a main that does not is a failed run, not a hang.
        if not select.select([exit_fd], [], [], 30)[0]:
            raise RuntimeError("the main never quit the proxy")
        exited = time.time()
        told = float(proxy.stdout.readline())
        main.wait()
    finally:
        os.close(exit_fd)
        if proxy.poll() is None:
            proxy.kill()
        proxy.wait()
    rec = record(base / "run" / "done")
    ended = _ts(rec[p.RECORD_FINISHED_AT])
    return _ts(rec[p.RECORD_STARTED_AT]) - opened, told - ended, exited - ended


def job_pod(t: Target) -> tuple[list[float], list[float], list[float]]:
    runs = [_job_once(t, i) for i in range(JOB_RUNS)]
    return [r[0] for r in runs], [r[1] for r in runs], [r[2] for r in runs]


def print_job_pod(t: Target) -> None:
    gate, told, exited = job_pod(t)
    print(f"Job-shaped pod (one main, a proxy process on loopback), {JOB_RUNS} runs:")
    print(f"  gate, proxy's loopback probe turns ready -> main starts: {_ms(gate)}")
    print(f"  last main ends -> sidecar told to quit (POST received): {_ms(told)}")
    print(f"  last main ends -> sidecar exited: {_ms(exited)}")


def _ms(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1000:.1f} ms (min {min(values) * 1000:.1f}, " \
           f"max {max(values) * 1000:.1f})"


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="waiter-bench-") as tmp:
        t = Target(Path(tmp))
        what = "frozen bundle in a chroot" if t.frozen else "SOURCE waiter (not root: no chroot)"
        print(f"waiter benchmark: {what}")
        print(describe())
        steal = Steal()
        cold = cold_start(t)
        print(f"cold start (run -- true), median of {COLD_RUNS}: {statistics.median(cold) * 1000:.1f} ms "
              f"(min {min(cold) * 1000:.1f}, max {max(cold) * 1000:.1f})")
        hand = sorted(handoffs(t))
        p99 = hand[min(len(hand) - 1, int(round(0.99 * len(hand))) - 1)]
        print(f"handoff over {len(hand)} step-to-step handoffs: median {statistics.median(hand) * 1000:.2f} ms, "
              f"p99 {p99 * 1000:.2f} ms, max {hand[-1] * 1000:.2f} ms")
        used, hwm = idle(t)
        print(f"CPU time while waiting {IDLE_SECONDS} s: {used * 1000:.2f} ms")
        print(f"peak RSS of a waiting waiter (VmHWM): {hwm / 1024:.1f} MiB")
        probe, ready_file = gate_latency(t)
        print(f"step 0 gate, loopback probe turns ready -> step starts: {_ms(probe)}")
        print(f"step 0 gate, ready file appears -> step starts: {_ms(ready_file)} "
              f"(on a cluster add the watcher's patch and the kubelet's downward-API refresh)")
        cpu, probes, late = gate_slow_proxy(t)
        print(f"step 0 gate, proxy ready after {SLOW_PROXY_SECONDS:g} s: waiter CPU while waiting "
              f"{cpu * 1000:.1f} ms ({probes} probes), ready -> step starts {late * 1000:.1f} ms")
        held, handled = start_window(t)
        print(f"start, spawn -> terminating signals blocked ({len(held)} of {WINDOW_RUNS} seen): {_ms(held)}")
        print(f"start, spawn -> SIGTERM handled: {_ms(handled)}")
        span = chain(t)
        print(f"{STEPS} steps of {STEP_SECONDS} s under the waiter, first start -> last end: {span:.2f} s "
              f"(the limit is {STEPS * STEP_SECONDS:.1f} s)")
        print_job_pod(t)
        print(steal)
    return 0


if __name__ == "__main__":
    sys.exit(main())
