"""Several server processes on one port, and the small supervisor that runs them.

One Python process uses one core, and a review is CPU work: `initshift serve` therefore
starts `INITSHIFT_WORKERS` copies of itself (one per usable CPU by default, as many as the
container's memory limit holds), each with its
own listening socket on the port (SO_REUSEPORT): the kernel spreads new connections evenly
over them, where one shared socket would let whichever process is idle first take every
connection (and the apiserver keeps its connections alive, so that imbalance would last).
A worker's event loop never runs a review itself (webhook/admission/_app.py), so its
socket's connections are accepted at once even while it works.

Worker 0 is the one that also runs the process-wide companions: self-managed certificate
renewal (it writes the files every worker's reloader watches) and the watcher (`--watch`).
It starts first, so the certificates exist when the others load them. Metrics are shared
through prometheus_client's multiprocess mode (a directory the supervisor creates), so
`/metrics` on any worker reports every worker. The supervisor restarts a worker that dies
once all have started; one that dies during start-up ends `initshift serve` with its code.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable

from ..settings import Settings, to_env

log = logging.getLogger("initshift.workers")

_MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_RESTART_DELAY = 1.0


AUTO_MAX_WORKERS = 8  # `0` never starts more
# The memory budget `0` counts with, from `make bench-hostile` (2 workers, 2 CPUs): the
# supervisor ~57 MB resident, a worker ~108 MB idle and ~200 MB at its peak through every
# hostile case (a 7 MB review flood the heaviest: one large review in hand, bodies arriving).
# The Deployment's and the chart's memory limit (512Mi) holds two workers.
SUPERVISOR_BYTES = 64 * 1024 * 1024
WORKER_BYTES = 224 * 1024 * 1024
_NO_LIMIT = 1 << 60  # cgroup v1 writes "no limit" as a huge number


def worker_count(setting: int, cgroup_root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup") -> int:
    """`INITSHIFT_WORKERS`, where 0 means one per CPU this process may use: the CPUs it may
    run on, fewer under a CPU limit (a container sees every core of its node, its cgroup's
    quota says how many it gets), at most AUTO_MAX_WORKERS, and no more than its memory
    limit holds (cgroup v2 memory.max, v1 memory.limit_in_bytes; SUPERVISOR_BYTES plus
    WORKER_BYTES per worker)."""
    if setting > 0:
        return setting
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    quota = _cgroup_cpu_limit(cgroup_root)
    if quota is not None:
        cpus = min(cpus, quota)
    memory = cgroup_memory_limit(cgroup_root, proc_cgroup)
    if memory is not None:
        cpus = min(cpus, workers_for_memory(memory))
    return max(1, min(cpus, AUTO_MAX_WORKERS))


def workers_for_memory(limit: int) -> int:
    """Workers a memory limit of `limit` bytes holds with their supervisor (at least one:
    a single worker runs without a supervisor)."""
    return max(1, (limit - SUPERVISOR_BYTES) // WORKER_BYTES)


def cgroup_memory_limit(root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup") -> int | None:
    """The memory limit of this process's cgroup in bytes (the smallest of its own and the
    mount's root, which is its own in a container's cgroup namespace); None: no limit."""
    try:
        with open(proc_cgroup) as f:
            lines = [line.strip().split(":", 2) for line in f if line.count(":") >= 2]
    except OSError:
        lines = []
    own_v2 = next((path for hid, _, path in lines if hid == "0"), "/")
    own_v1 = next((path for _, ctrls, path in lines if "memory" in ctrls.split(",")), "/")
    candidates = [os.path.join(root, own_v2.lstrip("/"), "memory.max"), os.path.join(root, "memory.max"),
                  os.path.join(root, "memory", own_v1.lstrip("/"), "memory.limit_in_bytes"),
                  os.path.join(root, "memory", "memory.limit_in_bytes")]
    limits = []
    for path in candidates:
        try:
            with open(path) as f:
                value = f.read().strip()
        except OSError:
            continue
        if value.isdigit() and int(value) < _NO_LIMIT:
            limits.append(int(value))
    return min(limits) if limits else None


def _cgroup_cpu_limit(root: str) -> int | None:
    """Whole CPUs of the cgroup's quota, rounded up (cgroup v2 cpu.max, else v1 cfs); None: no limit."""
    def read(name: str) -> str | None:
        try:
            with open(os.path.join(root, name)) as f:
                return f.read().strip()
        except OSError:
            return None

    v2 = read("cpu.max")  # "max 100000" or "200000 100000"
    if v2 is not None:
        quota, _, period = v2.partition(" ")
        pair = (quota, period)
    else:
        pair = (read("cpu/cpu.cfs_quota_us") or "-1", read("cpu/cpu.cfs_period_us") or "100000")
    try:
        q, per = int(pair[0]), int(pair[1])
    except ValueError:
        return None  # "max": no limit
    if q <= 0 or per <= 0:
        return None
    return max(1, -(-q // per))


def die_with_parent() -> None:
    """Ask the kernel to SIGTERM this worker when the supervisor dies, even by SIGKILL."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


class Supervisor:
    """Starts, watches and stops the worker processes of one `initshift serve`."""

    def __init__(self, settings: Settings, count: int, *, watch: bool, graceful_seconds: float = 10.0,
                 worker_args: list[str] | None = None) -> None:
        self.settings, self.count, self.watch = settings, count, watch
        self.worker_args = list(worker_args or [])  # the command's flags each worker needs too (--kubeconfig)
        self.graceful_seconds = graceful_seconds
        self.procs: dict[int, subprocess.Popen] = {}
        self.metrics_dir = tempfile.mkdtemp(prefix="initshift-metrics-")
        self._ready_r, self._ready_w = os.pipe()
        os.set_blocking(self._ready_r, False)
        self.stopping = False

    def _argv(self, index: int) -> list[str]:
        argv = [sys.executable, "-m", "webhook.cli", "serve", "--worker", str(index), "--ready-fd", str(self._ready_w),
                *self.worker_args]
        return argv + (["--watch"] if self.watch and index == 0 else [])

    def _start(self, index: int) -> None:
        # The settings travel as the environment: the worker's are exactly the command's
        # (flags and `dev-server` defaults included).
        env = {**os.environ, **to_env(self.settings), _MULTIPROC_ENV: self.metrics_dir}
        self.procs[index] = subprocess.Popen(self._argv(index), env=env, pass_fds=(self._ready_w,))

    def _wait_ready(self, indexes: set[int], deadline: float) -> int | None:
        """Until every worker in `indexes` said it serves; a worker's exit code if one died."""
        buf = b""
        while indexes:
            for i in list(indexes):
                code = self.procs[i].poll()
                if code is not None:
                    return code
            try:
                buf += os.read(self._ready_r, 4096)
            except BlockingIOError:
                pass
            *done, buf = buf.split(b"\n")
            indexes -= {int(x) for x in done if x.strip()}
            if self.stopping:
                return 0
            if time.monotonic() > deadline:
                log.error("workers did not start in time", extra={"workers": sorted(indexes)})
                return 1
            time.sleep(0.02)
        return None

    def run(self, on_started: Callable[[], None] | None = None) -> int:
        """Serve until SIGTERM/SIGINT; returns the exit code."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            # Worker 0 first: in self-managed mode it writes the certificates the others load.
            self._start(0)
            failed = self._wait_ready({0}, time.monotonic() + 120)
            if failed is None and self.count > 1:
                for i in range(1, self.count):
                    self._start(i)
                failed = self._wait_ready(set(range(1, self.count)), time.monotonic() + 120)
            if failed is not None:
                return failed
            if on_started is not None and not self.stopping:
                on_started()
            log.info("serving", extra={"workers": self.count, "pids": [p.pid for p in self.procs.values()]})
            self._supervise()
            return 0
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.close(self._ready_r)
            os.close(self._ready_w)
            shutil.rmtree(self.metrics_dir, ignore_errors=True)

    def _supervise(self) -> None:
        while not self.stopping:
            for index, proc in list(self.procs.items()):
                code = proc.poll()
                if code is None or self.stopping:
                    continue
                log.error("worker exited, restarting it", extra={"worker": index, "pid": proc.pid, "code": code})
                self._mark_dead(proc.pid)
                time.sleep(_RESTART_DELAY)
                if not self.stopping:
                    self._start(index)
            try:
                os.read(self._ready_r, 4096)  # restarted workers report too: drain
            except BlockingIOError:
                pass
            time.sleep(0.1)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.stopping = True

    def _stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.graceful_seconds + 5
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _mark_dead(self, pid: int) -> None:
        try:
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(pid, self.metrics_dir)
        except Exception:  # noqa: BLE001 - metrics housekeeping must never stop the supervisor
            log.warning("could not clean the metrics of a dead worker", exc_info=True)
