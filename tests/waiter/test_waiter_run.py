"""The waiter as real processes (run from source): ordering, failures, signals, reaping,
timeouts, restarts, exec errors, argv and environment pass-through."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest

from waiter import protocol as p
from tests.support.waiter_support import PYTHON, ROOT, SOURCE_WAITER, catches, record, run, run_args, start, \
    step_dirs, wait_for, waiter_env

DONE = p.COMPLETION_FILE_NAME


def chain(tmp: Path, commands: list[list[str]], extra: dict[int, list[str]] | None = None):
    """Start every step at once (last first, to prove the order comes from the waiter)."""
    dirs = step_dirs(tmp, len(commands))
    procs = {}
    for i in reversed(range(len(commands))):
        flags = [p.FLAG_NAME, f"s{i}"]
        if i:
            flags += [p.FLAG_WAIT, str(dirs[i - 1] / DONE)]
        flags += (extra or {}).get(i, [])
        procs[i] = start(dirs[i] / DONE, *flags, argv=commands[i])
    results = {i: (proc.wait(timeout=60), proc.stderr.read().decode()) for i, proc in procs.items()}
    for proc in procs.values():
        proc.stdout.close()
        proc.stderr.close()
    return dirs, results


def test_five_steps_run_in_order(tmp_path: Path) -> None:
    log = tmp_path / "log"
    commands = [["sh", "-c", f'echo "$1" >> {log}', "sh", f"s{i}"] for i in range(5)]
    dirs, results = chain(tmp_path, commands)
    assert [results[i][0] for i in range(5)] == [0] * 5
    assert log.read_text().split() == [f"s{i}" for i in range(5)]
    recs = [record(d / DONE) for d in dirs]
    assert [r[p.RECORD_REASON] for r in recs] == [p.REASON_COMPLETED] * 5
    assert [r[p.RECORD_NAME] for r in recs] == [f"s{i}" for i in range(5)]
    for before, after in zip(recs, recs[1:]):
        assert after[p.RECORD_STARTED_AT] >= before[p.RECORD_FINISHED_AT]


def test_failing_middle_step_skips_the_rest(tmp_path: Path) -> None:
    log = tmp_path / "log"
    commands = [["sh", "-c", f'echo "$1" >> {log}; exit "$2"', "sh", f"s{i}", "3" if i == 2 else "0"]
                for i in range(5)]
    dirs, results = chain(tmp_path, commands)
    assert [results[i][0] for i in range(5)] == [0, 0, 3, 0, 0], "a skipped step exits 0, as if never started"
    assert log.read_text().split() == ["s0", "s1", "s2"]
    failed = record(dirs[2] / DONE)
    assert failed[p.RECORD_REASON] == p.REASON_ERROR and failed[p.RECORD_EXIT_CODE] == 3
    for i in (3, 4):
        rec = record(dirs[i] / DONE)
        assert rec[p.RECORD_REASON] == p.REASON_SKIPPED
        assert rec[p.RECORD_EXIT_CODE] == 0
        assert rec[p.RECORD_FAILED_STEP] == "s2"
        assert rec[p.RECORD_MESSAGE] == "skipped: step 's2' failed with exit code 3"
        assert "skipped: step 's2'" in results[i][1]


def test_skip_fails_exits_with_the_failed_steps_code(tmp_path: Path) -> None:
    """--skip-fails (a pod a controller such as kpack reads): every skipped step exits with
    the code of the step that failed, through a chain of skips, its record still `Skipped`."""
    commands = [["sh", "-c", 'exit "$1"', "sh", "7" if i == 1 else "0"] for i in range(4)]
    dirs, results = chain(tmp_path, commands, {i: [p.FLAG_SKIP_FAILS] for i in range(4)})
    assert [results[i][0] for i in range(4)] == [0, 7, 7, 7]
    for i in (2, 3):
        rec = record(dirs[i] / DONE)
        assert (rec[p.RECORD_REASON], rec[p.RECORD_EXIT_CODE], rec[p.RECORD_FAILED_STEP]) == (p.REASON_SKIPPED, 7, "s1")
        assert rec[p.RECORD_MESSAGE] == "skipped: step 's1' failed with exit code 7"


def test_step_killed_by_signal(tmp_path: Path) -> None:
    res = run(tmp_path / DONE, argv=["sh", "-c", "kill -KILL $$"])
    assert res.returncode == 128 + signal.SIGKILL
    rec = record(tmp_path / DONE)
    assert rec[p.RECORD_REASON] == p.REASON_ERROR
    assert rec[p.RECORD_EXIT_CODE] == 137
    assert rec[p.RECORD_MESSAGE] == "killed by SIGKILL"


# Each process waits in short sleeps: a signal that lands after Python's last check for
# handlers but before the sleep's system call leaves the handler pending until the sleep
# ends (a 60 s sleep outlived the test's wait on a loaded CI machine).
GROUP_SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    marks = sys.argv[1]
    def handler(name):
        def h(sig, frame):
            open(os.path.join(marks, name), "w").write(str(sig))
            os._exit(143)
        return h
    def idle():
        for _ in range(1200):
            time.sleep(0.05)
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, handler("grandchild"))
        open(os.path.join(marks, "grandchild-ready"), "w").close()
        idle()
        os._exit(1)
    signal.signal(signal.SIGTERM, handler("child"))
    open(os.path.join(marks, "child-ready"), "w").close()
    idle()
""")


def test_command_starts_with_default_signal_dispositions(tmp_path: Path) -> None:
    """Nothing the waiter catches, ignores or blocks (it blocks SIGTERM in its own start)
    reaches the command."""
    res = run(tmp_path / DONE, argv=["cat", "/proc/self/status"])
    assert res.returncode == 0, res.stderr
    status = dict(line.split(":", 1) for line in res.stdout.decode().splitlines() if ":" in line)
    reachable = sum(1 << (int(s) - 1) for s in signal.valid_signals())  # (glibc keeps 32 and 33)
    for field in ("SigIgn", "SigCgt", "SigBlk"):
        assert int(status[field].strip(), 16) & reachable == 0, (field, status[field])


def test_sigterm_reaches_the_whole_group(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = start(tmp_path / DONE, argv=[PYTHON, "-c", GROUP_SCRIPT, str(marks)])
    wait_for(lambda: (marks / "child-ready").exists() and (marks / "grandchild-ready").exists(),
             "child and grandchild handlers")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    wait_for(lambda: (marks / "grandchild").exists(), "grandchild to receive SIGTERM")
    assert (marks / "child").read_text() == str(int(signal.SIGTERM))
    assert (marks / "grandchild").read_text() == str(int(signal.SIGTERM))
    proc.stdout.close()
    proc.stderr.close()


ORPHAN_SCRIPT = textwrap.dedent("""
    import os, sys, time
    out, waiter = sys.argv[1], int(sys.argv[2])
    r, w = os.pipe()
    if os.fork() == 0:              # middle process: leaves an orphan behind
        if os.fork() == 0:          # the orphan: report its new parent, then exit
            while os.getppid() == 0 or os.read(r, 1) == b"":
                pass
            open(out, "w").write(str(os.getppid()))
            os._exit(0)
        os._exit(0)
    os.close(r)
    os.wait()                       # the middle process is gone: the orphan was re-parented
    os.write(w, b"x")
    # The orphan exits now: it must not stay a zombie of the waiter.
    def zombies():
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == waiter and stat[0] == "Z":
                found.append(pid)
        return found
    while not os.path.exists(out):
        time.sleep(0.01)
    for _ in range(1000):
        if not zombies():
            sys.exit(0)
        time.sleep(0.01)
    sys.exit(9)
""")


def test_orphans_are_reaped(tmp_path: Path) -> None:
    out = tmp_path / "orphan-parent"
    # The waiter's pid is the child's parent: pass it through the shell.
    proc = start(tmp_path / DONE, argv=["sh", "-c", f'exec {PYTHON} -c "$0" {out} $PPID', ORPHAN_SCRIPT])
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    assert int(out.read_text()) == proc.pid  # the waiter became the orphan's (sub)reaper
    proc.stdout.close()
    proc.stderr.close()


def test_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "bg"
    res = run(tmp_path / DONE, p.FLAG_TIMEOUT, "2",  # room for sh to write the pid file on a busy machine
              argv=["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"])
    assert res.returncode == p.EXIT_TIMED_OUT
    rec = record(tmp_path / DONE)
    assert rec[p.RECORD_REASON] == p.REASON_TIMED_OUT
    assert rec[p.RECORD_EXIT_CODE] == p.EXIT_TIMED_OUT
    bg = int(pidfile.read_text())
    wait_for(lambda: not os.path.exists(f"/proc/{bg}") or
             open(f"/proc/{bg}/stat").read().rsplit(")", 1)[1].split()[0] == "Z",
             "the background sleep to be killed")


def test_timeout_escalates_to_sigkill(tmp_path: Path) -> None:
    res = run(tmp_path / DONE, p.FLAG_TIMEOUT, "0.3", argv=["sh", "-c", "trap '' TERM; sleep 60"])
    assert res.returncode == p.EXIT_TIMED_OUT
    assert record(tmp_path / DONE)[p.RECORD_REASON] == p.REASON_TIMED_OUT


def test_restarted_container_does_not_run_again(tmp_path: Path) -> None:
    log = tmp_path / "log"
    argv = ["sh", "-c", f"echo ran >> {log}; exit 4"]
    assert run(tmp_path / DONE, argv=argv).returncode == 4
    first = (tmp_path / DONE).read_bytes()
    again = run(tmp_path / DONE, argv=argv)
    assert again.returncode == 4
    assert b"not running again" in again.stderr
    assert log.read_text() == "ran\n"
    assert (tmp_path / DONE).read_bytes() == first


def test_retry_reruns_a_failed_step_but_not_a_completed_one(tmp_path: Path) -> None:
    log, flag = tmp_path / "log", tmp_path / "succeed"
    argv = ["sh", "-c", f"echo ran >> {log}; test -e {flag}"]
    assert run(tmp_path / DONE, p.FLAG_RETRY, argv=argv).returncode == 1
    flag.touch()
    assert run(tmp_path / DONE, p.FLAG_RETRY, argv=argv).returncode == 0
    assert run(tmp_path / DONE, p.FLAG_RETRY, argv=argv).returncode == 0
    assert log.read_text() == "ran\nran\n"
    assert record(tmp_path / DONE)[p.RECORD_REASON] == p.REASON_COMPLETED


def test_retry_waits_through_a_failed_predecessor(tmp_path: Path) -> None:
    d0, d1 = step_dirs(tmp_path, 2)
    assert run(d0 / DONE, argv=["false"]).returncode == 1
    proc = start(d1 / DONE, p.FLAG_WAIT, str(d0 / DONE), p.FLAG_RETRY, argv=["true"])
    # The predecessor is retried (as the kubelet would) and now succeeds.
    assert run(d0 / DONE, p.FLAG_RETRY, argv=["true"]).returncode == 0
    assert proc.wait(timeout=30) == 0
    assert record(d1 / DONE)[p.RECORD_REASON] == p.REASON_COMPLETED
    proc.stdout.close()
    proc.stderr.close()


def test_missing_command_fails_clearly_and_later_steps_skip(tmp_path: Path) -> None:
    d0, d1 = step_dirs(tmp_path, 2)
    res = run(d0 / DONE, p.FLAG_NAME, "fetch", argv=["no-such-command-xyz", "a"])
    assert res.returncode == p.EXIT_NOT_FOUND
    assert res.stderr.decode().strip().splitlines() == \
        ["waiter[fetch]: no-such-command-xyz: command not found in PATH"]
    rec = record(d0 / DONE)
    assert rec[p.RECORD_REASON] == p.REASON_WAITER_ERROR
    after = run(d1 / DONE, p.FLAG_WAIT, str(d0 / DONE), argv=["true"])
    assert after.returncode == 0
    assert record(d1 / DONE)[p.RECORD_REASON] == p.REASON_SKIPPED
    assert record(d1 / DONE)[p.RECORD_MESSAGE] == f"skipped: step 'fetch' failed with exit code {p.EXIT_NOT_FOUND}"


def test_not_executable_is_permission_denied(tmp_path: Path) -> None:
    script = tmp_path / "script"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o644)
    res = run(tmp_path / DONE, argv=[str(script)])
    assert res.returncode == p.EXIT_CANNOT_EXEC
    assert "cannot execute: permission denied" in res.stderr.decode()
    assert len(res.stderr.decode().strip().splitlines()) == 1


def test_a_program_whose_interpreter_is_missing_is_named_so(tmp_path: Path) -> None:
    """execve fails ENOENT for a file that is there when its `#!` interpreter or its ELF
    loader is missing (a bash script or a glibc program in an alpine image): the user reads
    that, not "command not found" for a file they can see; and, as runc's PATH lookup
    would, the search stops at that file instead of running a later one of the same name."""
    bindir, later = tmp_path / "bin", tmp_path / "later"
    bindir.mkdir()
    later.mkdir()
    (bindir / "tool").write_text("#!/no/such/bash -e\nexit 0\n")
    (later / "tool").write_text("#!/bin/sh\nexit 0\n")
    loaderless = bindir / "loaderless"
    shutil.copy("/bin/true", loaderless)
    subprocess.run(["patchelf", "--set-interpreter", "/no/such/ld.so", str(loaderless)], check=True)
    for path in (bindir / "tool", later / "tool", loaderless):
        path.chmod(0o755)
    res = run(tmp_path / DONE, argv=["tool"], env=waiter_env(PATH=f"{bindir}:{later}"))
    assert res.returncode == p.EXIT_CANNOT_EXEC
    assert res.stderr.decode().strip() == \
        f"waiter: tool ({bindir}/tool): cannot execute: its interpreter /no/such/bash was not found"
    assert record(tmp_path / DONE)[p.RECORD_EXIT_CODE] == p.EXIT_CANNOT_EXEC
    (tmp_path / DONE).unlink()
    res = run(tmp_path / DONE, argv=[str(loaderless)])
    assert res.returncode == p.EXIT_CANNOT_EXEC
    assert res.stderr.decode().strip() == \
        f"waiter: {loaderless}: cannot execute: its interpreter /no/such/ld.so was not found"
    (tmp_path / DONE).unlink()
    res = run(tmp_path / DONE, argv=[str(later)])
    assert res.returncode == p.EXIT_CANNOT_EXEC
    assert res.stderr.decode().strip() == f"waiter: {later}: cannot execute: is a directory"


def test_command_is_looked_up_in_the_containers_path(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tool = bindir / "mytool"
    tool.write_text("#!/bin/sh\nexit 5\n")
    tool.chmod(0o755)
    res = run(tmp_path / DONE, argv=["mytool"], env=waiter_env(PATH=f"{bindir}:/usr/bin:/bin"))
    assert res.returncode == 5


WEIRD_ARGS = [b"plain", b"with space", b"", b"'single'", b'"double"', b"back\\slash",
              "non-ascii é ü 漢字".encode(), b"\xff\xfe invalid utf-8", b"$HOME `x` *", b"--", b"-x", b"\n"]


def test_argv_passes_through_byte_for_byte(tmp_path: Path) -> None:
    out = tmp_path / "argv"
    dump = f"import os,sys; open({str(out)!r},'w').write(repr([os.fsencode(a) for a in sys.argv[1:]]))"
    res = run(tmp_path / DONE, argv=[PYTHON.encode(), b"-c", dump.encode(), *WEIRD_ARGS])
    assert res.returncode == 0, res.stderr
    assert eval(out.read_text()) == WEIRD_ARGS


def test_environment_passes_through_unchanged(tmp_path: Path) -> None:
    out = tmp_path / "env"
    env = {"PATH": "/usr/bin:/bin", "EMPTY": "", "SPACES": " a  b ", "EQ": "x=y=z", "LANG": "C",
           "UNICODE": "é", "LD_LIBRARY_PATH": "/nowhere", "PYTHONPATH": str(Path.cwd())}
    res = subprocess.run(["/usr/bin/env", "-i", *[f"{k}={v}" for k, v in env.items()],
                          os.path.realpath(os.sys.executable), "-m", "waiter",
                          p.CMD_RUN, p.FLAG_POST, str(tmp_path / DONE), "--",
                          "sh", "-c", f"cat /proc/$$/environ > {out}"],
                         capture_output=True)
    assert res.returncode == 0, res.stderr
    got = dict(e.split(b"=", 1) for e in out.read_bytes().split(b"\0") if e)
    assert got == {k.encode(): v.encode() for k, v in env.items()}


def test_bad_flags_fail_with_one_line_and_a_record(tmp_path: Path) -> None:
    res = run(tmp_path / DONE, "--bogus", "1", argv=["true"])
    assert res.returncode == p.EXIT_USAGE
    assert res.stderr.decode().strip().splitlines() == ["waiter: unknown flag '--bogus'"]
    rec = record(tmp_path / DONE)
    assert rec[p.RECORD_REASON] == p.REASON_WAITER_ERROR
    assert rec[p.RECORD_EXIT_CODE] == p.EXIT_USAGE


@pytest.mark.parametrize("flags, message", [
    ([p.FLAG_TIMEOUT, "soon"], "--timeout 'soon' is not a number of seconds"),
    ([p.FLAG_TIMEOUT, "-1"], "--timeout must be a positive number of seconds"),
    ([p.FLAG_PROBE, "ftp://127.0.0.1:1/"], "--probe 'ftp://127.0.0.1:1/': scheme must be one of http, https, tcp"),
    ([p.FLAG_QUIT, "tcp://127.0.0.1:1"], "--quit 'tcp://127.0.0.1:1': scheme must be one of http, https"),
    ([p.FLAG_WAIT, "/no/such/dir/done"], "--wait /no/such/dir/done: directory does not exist"),
    ([p.FLAG_ARGV_MAP, "[1]"], '--argv-map must be a non-empty JSON object {"os/arch": [argv...]}'),
    # an image's CMD can spell a NUL in its JSON: was "internal error: ValueError: embedded null byte"
    ([p.FLAG_ARGV_MAP, '{"linux/amd64": ["/bin/echo", "a\\u0000b"]}'],
     "--argv-map entry 'linux/amd64' holds a NUL character, which no program's argv can carry"),
])
def test_bad_values_are_one_line(tmp_path: Path, flags: list[str], message: str) -> None:
    res = run(tmp_path / DONE, *flags, argv=[] if p.FLAG_ARGV_MAP in flags else ["true"])
    assert res.returncode == p.EXIT_USAGE
    assert res.stderr.decode().strip().splitlines() == [f"waiter: {message}"]


def test_missing_separator_and_post(tmp_path: Path) -> None:
    res = subprocess.run([os.sys.executable, "-m", "waiter", "run", "--post", str(tmp_path / DONE), "true"],
                         capture_output=True, env=waiter_env())
    assert res.returncode == p.EXIT_USAGE
    assert res.stderr.decode().strip() == "waiter: unexpected 'true' before --"
    res = subprocess.run([os.sys.executable, "-m", "waiter", "run", "--", "true"], capture_output=True,
                         env=waiter_env())
    assert res.returncode == p.EXIT_USAGE
    assert res.stderr.decode().strip() == "waiter: --post FILE is required"


def test_a_record_that_cannot_be_written_leaves_no_termination_message(tmp_path: Path) -> None:
    """The command ran (exit 0) but its completion file cannot be written (here its run
    volume is gone; a full or read-only one alike): the steps after it would wait for ever.
    The termination message must not say `Completed` then, or the watcher reads the step as
    done: the waiter empties the one it wrote and exits 125, so the watcher takes the
    container as broken and ends the pod at once, naming it."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    log = tmp_path / "termination-log"
    log.touch()  # the kubelet creates it empty
    res = run(run_dir / DONE, p.FLAG_NAME, "fetch", p.FLAG_TERMINATION_LOG, str(log),
              argv=["rm", "-r", str(run_dir)])
    assert res.returncode == p.EXIT_USAGE
    assert res.stderr.decode().strip() == (
        f"waiter[fetch]: cannot write completion file {run_dir / DONE}: No such file or directory "
        "(Completed, exit code 0); the steps after this one cannot start")
    assert log.read_bytes() == b""
    # A termination message the program wrote itself stays, as always.
    run_dir.mkdir()
    res = run(run_dir / DONE, p.FLAG_TERMINATION_LOG, str(log),
              argv=["sh", "-c", f'printf mine > {log}; rm -r "$0"', str(run_dir)])
    assert res.returncode == p.EXIT_USAGE
    assert log.read_bytes() == b"mine"


def test_a_short_write_never_leaves_a_cut_record(tmp_path: Path) -> None:
    """Under a file size limit (RLIMIT_FSIZE, e.g. `docker run --ulimit fsize`) the write of
    the record came back short and the cut JSON was renamed into place: the step exited 0,
    and the next one read it as unreadable and skipped, naming this step as failed."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))

    proc = start(tmp_path / DONE, p.FLAG_NAME, "a-step-whose-record-is-longer", argv=["true"],
                 preexec_fn=limit)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == p.EXIT_USAGE, err
    assert "cannot write completion file" in err.decode() and "File too large" in err.decode()
    assert not (tmp_path / DONE).exists()


def test_an_unreadable_predecessor_record_is_named(tmp_path: Path) -> None:
    """A predecessor's record that is not one makes this step skip; its log said only that
    the step before "failed with exit code 125", which it may not have: the reason is shown."""
    d0, d1 = step_dirs(tmp_path, 2)
    (d0 / DONE).write_bytes(b"not a record")
    res = run(d1 / DONE, p.FLAG_WAIT, str(d0 / DONE), argv=["true"])
    assert res.returncode == 0
    assert f"unreadable record {d0 / DONE}: not JSON" in res.stderr.decode()
    assert record(d1 / DONE)[p.RECORD_REASON] == p.REASON_SKIPPED


def test_argv_map_picks_this_platform(tmp_path: Path) -> None:
    from waiter.argvmap import platform_keys

    table = {platform_keys()[-1]: ["sh", "-c", "exit 7"], "plan9/mips": ["false"]}
    res = run(tmp_path / DONE, p.FLAG_ARGV_MAP, __import__("json").dumps(table))
    assert res.returncode == 7
    # The map gives the image's words, the words after `--` (the container's args) follow.
    res = run(tmp_path / "args", p.FLAG_ARGV_MAP, __import__("json").dumps({platform_keys()[-1]: ["sh", "-c"]}),
              argv=["exit 9"])
    assert res.returncode == 9
    res = run(tmp_path / "other", p.FLAG_ARGV_MAP, '{"plan9/mips": ["true"]}')
    assert res.returncode == p.EXIT_USAGE
    assert f"no argv for platform {platform_keys()[0]} in --argv-map (has: plan9/mips)" in res.stderr.decode()


def test_termination_message_written_unless_the_program_wrote_one(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    log.touch()
    assert run(tmp_path / DONE, p.FLAG_TERMINATION_LOG, str(log), argv=["sh", "-c", "exit 2"]).returncode == 2
    assert record(log) == record(tmp_path / DONE)
    own = tmp_path / "own-log"
    other = tmp_path / "other"
    other.mkdir()
    assert run(other / DONE, p.FLAG_TERMINATION_LOG, str(own),
               argv=["sh", "-c", f"echo mine > {own}"]).returncode == 0
    assert own.read_text() == "mine\n"


def test_sigterm_while_waiting_records_and_exits(tmp_path: Path) -> None:
    d0, d1 = step_dirs(tmp_path, 2)
    marker = tmp_path / "ran"
    proc = start(d1 / DONE, p.FLAG_WAIT, str(d0 / DONE), argv=["touch", str(marker)])
    wait_for(lambda: catches(proc.pid, signal.SIGTERM), "the waiter's signal handlers")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    rec = record(d1 / DONE)
    assert rec[p.RECORD_REASON] == p.REASON_STOPPED
    assert rec[p.RECORD_MESSAGE] == "stopped by SIGTERM before the command started"
    assert not marker.exists()
    proc.stdout.close()
    proc.stderr.close()


def test_a_step_after_one_stopped_before_it_started_says_so(tmp_path: Path) -> None:
    """The pod going away (a deadline, a deletion): the kubelet signals every container, a
    waiting step records Stopped, and a step that reads that record before its own signal
    comes says the step before was stopped, not that it failed."""
    d0, d1, d2 = step_dirs(tmp_path, 3)
    middle = start(d1 / DONE, p.FLAG_NAME, "compile", p.FLAG_WAIT, str(d0 / DONE), argv=["true"])
    last = start(d2 / DONE, p.FLAG_NAME, "test", p.FLAG_WAIT, str(d1 / DONE), argv=["true"])
    wait_for(lambda: catches(middle.pid, signal.SIGTERM), "the waiter's signal handlers")
    middle.send_signal(signal.SIGTERM)
    assert middle.wait(timeout=30) == 128 + signal.SIGTERM
    assert last.wait(timeout=30) == 0, "skipped: it never started"
    rec = record(d2 / DONE)
    assert (rec[p.RECORD_REASON], rec[p.RECORD_FAILED_STEP]) == (p.REASON_SKIPPED, "compile")
    assert rec[p.RECORD_MESSAGE] == "skipped: step 'compile' was stopped by SIGTERM before the command started"
    for proc in (middle, last):
        proc.stdout.close()
        proc.stderr.close()


def test_closed_stdout_and_stderr_do_not_fail_the_step(tmp_path: Path) -> None:
    """A container started with stdout/stderr closed: the waiter's exit (it flushes its
    streams itself, then leaves without the interpreter's teardown) keeps the command's code."""
    from tests.support.waiter_support import ROOT, SOURCE_WAITER, run_args

    def closed(post: Path, argv: list[str]) -> int:
        args = [*SOURCE_WAITER, *run_args(post, argv=argv)]
        return subprocess.run(["sh", "-c", 'exec "$@" >&- 2>&-', "sh", *args], env=waiter_env(), cwd=ROOT,
                              capture_output=True, timeout=60).returncode

    assert closed(tmp_path / DONE, ["sh", "-c", "exit 3"]) == 3
    assert record(tmp_path / DONE)[p.RECORD_REASON] == p.REASON_ERROR
    # A waiter error is logged (to a closed stderr: dropped) and still recorded.
    (tmp_path / "missing").mkdir()
    assert closed(tmp_path / "missing" / DONE, ["/no/such/command"]) == p.EXIT_NOT_FOUND
    assert record(tmp_path / "missing" / DONE)[p.RECORD_REASON] == p.REASON_WAITER_ERROR


def on_terminal(tmp: Path, script: str, typed: list[bytes], argv: list[str] | None = None) -> tuple[bytes, int]:
    """The waiter as a container with `tty: true` runs it: a session leader whose stdin,
    stdout and stderr are a terminal (runc's pty). `typed` goes in once the program says
    `ready`; what the terminal shows and the waiter's exit code come back."""
    import pty
    import select
    import time

    pid, fd = pty.fork()
    if pid == 0:  # the child: session leader, the pty its controlling terminal
        os.chdir(ROOT)
        command = [*SOURCE_WAITER, *run_args(tmp / DONE, p.FLAG_NAME, "main", argv=argv or ["sh", "-c", script])]
        os.execve(command[0], command, waiter_env())
    shown, deadline = b"", time.monotonic() + 30
    while time.monotonic() < deadline:
        if typed and b"ready" in shown:
            os.write(fd, typed.pop(0))
        if select.select([fd], [], [], 0.1)[0]:
            try:
                data = os.read(fd, 4096)
            except OSError:  # EIO: every holder of the terminal's slave side is gone
                break
            if not data:
                break
            shown += data
    else:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return shown, os.waitstatus_to_exitcode(status)


def test_a_program_on_a_terminal_gets_it(tmp_path: Path) -> None:
    """`tty: true` (`kubectl run -it`): the program's group is the terminal's foreground
    before it runs, as a job-control shell or tini makes it: it is there from its first
    instruction (bash checks at once, and stops itself until it is), it reads what is typed
    (in a background group the read stopped it for good, SIGTTIN), and it gets the
    terminal's Ctrl-C. A command that cannot run is recorded as anywhere else."""
    foreground = 'set -- $(cat /proc/$$/stat); [ "$5" = "$8" ] && echo "first: in the foreground"; '
    shown, code = on_terminal(tmp_path, foreground + 'echo ready; read line; echo "got:$line"', [b"hello\n"])
    assert b"first: in the foreground" in shown and b"got:hello" in shown and code == 0, (shown, code)
    assert record(tmp_path / DONE)[p.RECORD_EXIT_CODE] == 0
    (tmp_path / DONE).unlink()
    # Builtins only after `ready`: a Ctrl-C typed before the shell forked a `sleep` would end
    # the shell and leave the sleep holding the terminal (and the waiter waiting) 30 s.
    shown, code = on_terminal(tmp_path, 'echo ready; read line; echo "got:late"', [b"\x03"])
    assert b"got:late" not in shown and code == 128 + signal.SIGINT, (shown, code)
    (tmp_path / DONE).unlink()
    shown, code = on_terminal(tmp_path, "", [], argv=["no-such-command-here"])
    assert code == p.EXIT_NOT_FOUND and b"command not found" in shown, (shown, code)
    assert record(tmp_path / DONE)[p.RECORD_EXIT_CODE] == p.EXIT_NOT_FOUND


FILL_NON_BLOCKING = """
import fcntl, os
fcntl.fcntl(2, fcntl.F_SETFL, fcntl.fcntl(2, fcntl.F_GETFL) | os.O_NONBLOCK)
try:
    while True:
        os.write(2, b"x" * 4095 + b"\\n")
except BlockingIOError:
    pass
"""


def test_a_line_after_a_command_that_left_stderr_non_blocking_and_full(tmp_path: Path) -> None:
    """node sets O_NONBLOCK on its stdio pipes, which the waiter shares with it: its line after
    the command (here: another main still runs) met a full pipe, EAGAIN, and was lost. It is
    written once the container's log reader has room, whole, after every byte of the command's."""
    mains = tmp_path / "mains"
    mains.mkdir()
    proc = start(tmp_path / DONE, p.FLAG_NAME, "main", p.FLAG_QUIT, "http://127.0.0.1:1/quitquitquit",
                 p.FLAG_MAINS_DIR, str(mains), p.FLAG_MAINS, "2", argv=[PYTHON, "-c", FILL_NON_BLOCKING])
    # Nothing is read until the waiter has met the full pipe: after its record in the mains'
    # directory it only says a line, so it has either exited (the line lost) or waits to write.
    wait_for(lambda: (mains / "main").exists() and (proc.poll() is not None or _sleeps_in(proc.pid, "poll_schedule")),
             "the waiter to meet the full pipe")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0
    said = err.decode().split("\n")
    assert set(said[:-2]) == {"x" * 4095}
    assert said[-2] == "waiter[main]: other containers still running: leaving the sidecars to the last one"


def _sleeps_in(pid: int, function: str) -> bool:
    """The process sleeps in that kernel function (its wchan, which may carry a suffix)."""
    try:
        return Path(f"/proc/{pid}/wchan").read_text().startswith(function)
    except OSError:
        return False
