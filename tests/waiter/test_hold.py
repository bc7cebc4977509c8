"""`waiter hold` (hybrid's copier container) against real processes: it puts the bundle in
place itself, stays while its postStart hook runs, ignores a record an earlier run of the
container left, exits 0 once the hook that copied is gone, and, where no hook of its run
comes (a kubelet restarted during the container's start), after its wait."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.waiter_support import ROOT, SOURCE_WAITER, catches, wait_for, waiter_env
from waiter import protocol as p
from waiter.copyrecord import process_start

# A stand-in for the hook: records itself as `waiter init --hook` does, then lives until
# its stdin closes (a copy that takes as long as the test wants).
HOOK = [sys.executable, "-c", "import sys; from waiter.copyrecord import record_hook; record_hook(sys.argv[1]); "
        "sys.stdin.read()"]


def bundle(tmp: Path) -> Path:
    """A stand-in for the frozen bundle (`--from`): an executable and a data file."""
    src = tmp.parent / f"{tmp.name}-bundle"
    (src / "_internal").mkdir(parents=True, exist_ok=True)
    (src / p.WAITER_EXE_NAME).write_text("#!/bin/sh\n")
    (src / p.WAITER_EXE_NAME).chmod(0o755)
    (src / "_internal" / "data").write_text("d")
    return src


def hold(dest: Path, *flags: str) -> subprocess.Popen:
    proc = subprocess.Popen([*SOURCE_WAITER, p.CMD_HOLD, "--from", str(bundle(dest)), *flags, str(dest)],
                            env=waiter_env(), cwd=ROOT, stderr=subprocess.PIPE)
    wait_for(lambda: catches(proc.pid, signal.SIGTERM), "hold to start")
    return proc


def hook(dest: Path) -> subprocess.Popen:
    proc = subprocess.Popen([*HOOK, str(dest)], env=waiter_env(), cwd=ROOT, stdin=subprocess.PIPE)
    wait_for(lambda: (dest / p.COPY_DONE_FILE).exists() and
             (dest / p.COPY_DONE_FILE).read_text().split()[0] == str(proc.pid), "the hook's record")
    return proc


def sleeps(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("voluntary_ctxt_switches:")))


def polled(proc: subprocess.Popen, times: int = 4) -> None:
    """`proc` has slept between polls a few more times: it has seen what is there now and
    decided to stay."""
    base = sleeps(proc.pid)
    wait_for(lambda: proc.poll() is not None or sleeps(proc.pid) >= base + times, "hold to poll")
    assert proc.poll() is None, "hold exited"


def test_hold_stays_while_its_hook_runs_and_exits_0_once_it_is_gone(tmp_path: Path) -> None:
    proc = hold(tmp_path)
    polled(proc)  # no record yet
    running = hook(tmp_path)
    polled(proc)  # the hook has copied but is still running: the kubelet has not had its answer
    running.stdin.close()
    assert running.wait(timeout=20) == 0
    assert proc.wait(timeout=20) == 0 and proc.stderr.read() == b""


def test_a_record_from_an_earlier_run_of_the_container_is_not_this_hook(tmp_path: Path) -> None:
    stale = hook(tmp_path)
    stale.stdin.close()
    stale.wait(timeout=20)
    proc = hold(tmp_path)  # a restarted container: its last run's hook left its record
    polled(proc)
    fresh = hook(tmp_path)
    fresh.stdin.close()
    fresh.wait(timeout=20)
    assert proc.wait(timeout=20) == 0


def test_hold_puts_the_bundle_in_place_before_any_hook(tmp_path: Path) -> None:
    """A kubelet restarted during the container's start never runs the hook: the steps it
    starts next still find their waiter."""
    proc = hold(tmp_path)
    wait_for(lambda: os.access(tmp_path / p.WAITER_DIR_NAME / p.WAITER_EXE_NAME, os.X_OK), "the bundle in place")
    polled(proc)  # and it still waits for a hook
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=20)


def test_with_no_hook_of_its_run_hold_exits_0_after_its_wait(tmp_path: Path) -> None:
    stale = hook(tmp_path)  # an earlier run's record does not count
    stale.stdin.close()
    stale.wait(timeout=20)
    proc = hold(tmp_path, "--hook-wait", "0.3")
    assert proc.wait(timeout=20) == 0
    assert "no postStart hook of this container ran within 0.3 s" in proc.stderr.read().decode()
    assert os.access(tmp_path / p.WAITER_DIR_NAME / p.WAITER_EXE_NAME, os.X_OK)


def test_a_hook_of_its_run_is_waited_for_past_the_wait(tmp_path: Path) -> None:
    proc = hold(tmp_path, "--hook-wait", "0.2")
    running = hook(tmp_path)
    time.sleep(0.5)
    polled(proc)
    running.stdin.close()
    assert running.wait(timeout=20) == 0
    assert proc.wait(timeout=20) == 0 and proc.stderr.read() == b""


def test_sigterm_ends_the_hold(tmp_path: Path) -> None:
    proc = hold(tmp_path)  # a pod deleted before the hook ran: PID 1 must not ignore SIGTERM
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == p.EXIT_SIGNAL_BASE + signal.SIGTERM


def test_usage() -> None:
    usage = "waiter hold: usage: waiter hold [--from BUNDLE_DIR] [--hook-wait SECONDS] DEST\n"
    for args, said in (([], usage), (["a", "b"], usage), (["--x"], usage), (["--from"], "waiter hold: --from needs a value\n"),
                       (["--hook-wait", "soon", "d"], "waiter hold: --hook-wait: 'soon' is not a number of seconds\n")):
        res = subprocess.run([*SOURCE_WAITER, p.CMD_HOLD, *args], env=waiter_env(), cwd=ROOT, capture_output=True,
                             text=True)
        assert res.returncode == p.EXIT_USAGE and res.stderr == said, args


def test_process_start_reads_past_any_command_name(tmp_path: Path) -> None:
    odd = tmp_path / "a) b (c) 1"  # the kernel's comm field: parentheses and spaces are allowed
    odd.symlink_to("/bin/sleep")
    proc = subprocess.Popen([str(odd), "30"])
    try:
        wait_for(lambda: Path(f"/proc/{proc.pid}/comm").read_text().strip() == odd.name[:15], "the exec")
        mine = process_start("self")
        assert isinstance(mine, int) and process_start(proc.pid) >= mine, "started after this test's process"
    finally:
        proc.kill()
        proc.wait()
    assert process_start(proc.pid) is None, "gone once reaped"
    assert process_start(os.getpid()) == process_start("self")


def test_hold_keeps_a_bundle_the_hook_put_in_place(tmp_path: Path) -> None:
    """The hook's copy finished first and returned: the kubelet has started the steps from
    that bundle. `hold`'s own copy, finishing after, must not swap it (that deleted the
    files of a step starting from it: a hybrid step died with SIGSEGV, exit 139, on v1.34.9)."""
    src = bundle(tmp_path)
    (src / p.WAITER_EXE_NAME).write_text("#!/bin/sh\n# the hook's copy\n")
    subprocess.run([*SOURCE_WAITER, p.CMD_INIT, "--from", str(src), str(tmp_path)], env=waiter_env(), cwd=ROOT,
                   check=True, capture_output=True)
    placed = tmp_path / p.WAITER_DIR_NAME / p.WAITER_EXE_NAME
    running = placed.stat().st_ino, (tmp_path / p.WAITER_DIR_NAME / "_internal" / "data").stat().st_ino
    proc = hold(tmp_path)  # copies from a fresh bundle(): the plain "#!/bin/sh\n"
    polled(proc)
    assert (placed.stat().st_ino, (tmp_path / p.WAITER_DIR_NAME / "_internal" / "data").stat().st_ino) == running
    assert placed.read_text() == "#!/bin/sh\n# the hook's copy\n"
    assert sorted(x.name for x in tmp_path.iterdir()) == [p.WAITER_DIR_NAME], "hold's own copy is gone"
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=20)
