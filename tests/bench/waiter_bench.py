"""`make bench-waiter`: figures for the frozen waiter, printed, never asserted.

- cold start: wall time of `waiter run --post F -- /bin/true`, median of 20 runs
- handoff: step i's finishedAt to step i+1's startedAt (from the records), 200 handoffs
  in batches of 21 chained waiters, all waiting before the first is released
- CPU time used while waiting 10 s for a completion file that never comes
- peak RSS (VmHWM) of a waiting waiter

Runs the bundle where pods run it, chrooted into a busybox root with the bundle at
/initshift/bin/waiter (needs root); otherwise it measures the source waiter and says so.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from waiter import protocol as p
from waiter.post import write_atomic
from tests.support.waiter_support import SOURCE_WAITER, catches, ensure_bundle, record, waiter_env

COLD_RUNS = 20
BATCHES, CHAIN = 10, 21  # 10 x 20 = 200 handoffs
IDLE_SECONDS = 10


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


def handoffs(t: Target) -> list[float]:
    out: list[float] = []
    for b in range(BATCHES):
        batch = t.work / f"b{b}"
        batch.mkdir()
        inside = f"{t.inside}/b{b}"
        procs = []
        for i in range(CHAIN):
            prev = f"{inside}/go" if i == 0 else f"{inside}/{i - 1}"
            procs.append(t.popen(f"{inside}/{i}", p.FLAG_WAIT, prev, argv=[t.true()]))
        _wait_ready(procs)
        now = datetime.utcnow().isoformat() + "Z"
        write_atomic(str(batch / "go"), (f'{{"{p.RECORD_EXIT_CODE}": 0, "{p.RECORD_REASON}": '
                                         f'"{p.REASON_COMPLETED}", "{p.RECORD_FINISHED_AT}": "{now}"}}').encode())
        for proc in procs:
            proc.wait()
        recs = [record(batch / str(i)) for i in range(CHAIN)]
        out += [_ts(b_[p.RECORD_STARTED_AT]) - _ts(a[p.RECORD_FINISHED_AT]) for a, b_ in zip(recs, recs[1:])]
    return out


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle(t: Target) -> tuple[float, int]:
    (t.work / "idle").mkdir()
    proc = t.popen(f"{t.inside}/idle/mine", p.FLAG_WAIT, f"{t.inside}/idle/never", argv=[t.true()])
    _wait_ready([proc])
    before = _cpu_seconds(proc.pid)
    time.sleep(IDLE_SECONDS)
    used = _cpu_seconds(proc.pid) - before
    status = Path(f"/proc/{proc.pid}/status").read_text()
    hwm = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:"))
    proc.send_signal(signal.SIGTERM)
    proc.wait()
    return used, hwm


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="waiter-bench-") as tmp:
        t = Target(Path(tmp))
        what = "frozen bundle in a chroot" if t.frozen else "SOURCE waiter (not root: no chroot)"
        print(f"waiter benchmark: {what}, {os.cpu_count()} CPUs")
        cold = cold_start(t)
        print(f"cold start (run -- true), median of {COLD_RUNS}: {statistics.median(cold) * 1000:.1f} ms "
              f"(min {min(cold) * 1000:.1f}, max {max(cold) * 1000:.1f})")
        hand = sorted(handoffs(t))
        p99 = hand[min(len(hand) - 1, int(round(0.99 * len(hand))) - 1)]
        print(f"handoff over {len(hand)} step-to-step handoffs: median {statistics.median(hand) * 1000:.2f} ms, "
              f"p99 {p99 * 1000:.2f} ms, max {hand[-1] * 1000:.2f} ms")
        used, hwm = idle(t)
        tick = 1000 / os.sysconf("SC_CLK_TCK")
        print(f"CPU time while waiting {IDLE_SECONDS} s: {used * 1000:.0f} ms (resolution {tick:.0f} ms)")
        print(f"peak RSS of a waiting waiter (VmHWM): {hwm / 1024:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
