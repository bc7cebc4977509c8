"""The waiter's pure pieces: records, environment scrubbing, platform choice, flag parsing,
the gate's poll schedule, the directory watch."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from waiter import argvmap, env, flags
from waiter import protocol as p
from waiter.errors import UsageError
from waiter.record import Record, rfc3339


@settings(max_examples=60, deadline=None)
@given(message=st.text(max_size=6000), name=st.text(max_size=80))
def test_record_always_fits_the_termination_message_limit(message: str, name: str) -> None:
    rec = Record(name, 3, p.REASON_ERROR, rfc3339(0), rfc3339(1.5), message, "step")
    data = rec.to_json()
    assert len(data) <= p.TERMINATION_MESSAGE_LIMIT
    back = Record.from_json(data)
    assert (back.name, back.exit_code, back.reason, back.failed_step) == (name, 3, p.REASON_ERROR, "step")
    assert message.startswith(back.message.rstrip("…")) or back.message == message


def kubelet_status_message(message: bytes, containers: int) -> bytes:
    """What the kubelet's status manager keeps (normalizeStatus): 12 KiB per pod, split
    evenly among init and regular containers, the head of each message."""
    return message[:12 * 1024 // containers]


def test_a_long_record_survives_the_kubelets_per_pod_budget() -> None:
    """A rewritten kpack pod has 10 containers (istio-init, initshift-init, 6 steps, completion,
    istio-proxy): 1228 bytes each. A record cut there is no longer JSON, and the watcher would
    take a failed step for one that died without completing."""
    rec = Record("step-build", 127, p.REASON_WAITER_ERROR, rfc3339(0), rfc3339(1),
                 "/workspace/" + "very-long-path/" * 200 + "tool: command not found")
    kept = kubelet_status_message(rec.to_json(), containers=12)
    assert Record.from_json(kept).exit_code == 127


def test_rfc3339_is_utc_with_z() -> None:
    assert rfc3339(0) == "1970-01-01T00:00:00.000000Z"
    assert rfc3339(1.9999999) == "1970-01-01T00:00:02.000000Z"


@pytest.mark.parametrize("data", [b"", b"{", b"[]", b'{"exitCode": "1", "reason": "Error"}',
                                  b'{"exitCode": true, "reason": "Error"}', b"\xff"])
def test_unreadable_records_are_value_errors(data: bytes) -> None:
    with pytest.raises(ValueError):
        Record.from_json(data)


def test_scrub_restores_what_the_bootloader_changed() -> None:
    frozen = {b"PATH": b"/bin", b"LD_LIBRARY_PATH": b"/bundle:/orig", b"LD_LIBRARY_PATH_ORIG": b"/orig",
              b"_PYI_ARCHIVE_FILE": b"/x", b"_PYI_PARENT_PROCESS_LEVEL": b"1", b"STATICX_PROG_PATH": b"y"}
    assert env.scrub(frozen, frozen=True) == {b"PATH": b"/bin", b"LD_LIBRARY_PATH": b"/orig"}
    unset = {b"PATH": b"/bin", b"LD_LIBRARY_PATH": b"/bundle", b"_PYI_X": b"1"}
    assert env.scrub(unset, frozen=True) == {b"PATH": b"/bin"}
    # From source nothing is touched: those variables are the user's own.
    assert env.scrub(unset, frozen=False) == unset


@pytest.mark.parametrize("machine, keys", [
    ("x86_64", ["linux/amd64"]),
    ("aarch64", ["linux/arm64/v8", "linux/arm64"]),
    ("armv7l", ["linux/arm/v7", "linux/arm"]),
    ("armv6l", ["linux/arm/v6", "linux/arm"]),
    ("i686", ["linux/386"]),
    ("ppc64le", ["linux/ppc64le"]),
    ("s390x", ["linux/s390x"]),
    ("riscv64", ["linux/riscv64"]),
])
def test_platform_keys_follow_go(machine: str, keys: list[str]) -> None:
    assert argvmap.platform_keys("Linux", machine) == keys


def test_argv_map_prefers_the_variant() -> None:
    table = {"linux/arm64": ["generic"], "linux/arm64/v8": ["v8"]}
    assert argvmap.choose(table, argvmap.platform_keys("Linux", "aarch64")) == ["v8"]
    assert argvmap.choose({"linux/arm64": ["generic"]}, argvmap.platform_keys("Linux", "aarch64")) == ["generic"]
    with pytest.raises(UsageError, match=r"no argv for platform linux/arm/v7 .*has: linux/arm64"):
        argvmap.choose(table, argvmap.platform_keys("Linux", "armv7l"))


@pytest.mark.parametrize("text", ["nope", "[]", "{}", '{"linux/amd64": []}', '{"linux/amd64": [1]}'])
def test_argv_map_rejects_bad_tables(text: str) -> None:
    with pytest.raises(UsageError):
        argvmap.parse(text)


def test_parse_run_reads_every_flag(tmp_path) -> None:
    post, wait, mains = tmp_path / "a" / "done", tmp_path / "b" / "done", tmp_path / "mains"
    post.parent.mkdir()
    wait.parent.mkdir()
    mains.mkdir()
    opts = flags.parse_run([
        f"{p.FLAG_POST}={post}", p.FLAG_NAME, "build", p.FLAG_WAIT, str(wait),
        p.FLAG_READY_FILE, "/initshift/ready/ready", p.FLAG_PROBE, "http://127.0.0.1:15021/healthz/ready",
        p.FLAG_PROBE, "tcp://127.0.0.1:15090", p.FLAG_TIMEOUT, "2.5", p.FLAG_QUIT,
        "http://127.0.0.1:15020/quitquitquit", p.FLAG_MAINS_DIR, str(mains), p.FLAG_MAINS, "3", p.FLAG_RETRY,
        p.FLAG_TERMINATION_LOG, "/tmp/t", "--", "echo", "--timeout", "", "é"])
    assert (opts.post, opts.name, opts.wait, opts.timeout, opts.retry) == (str(post), "build", str(wait), 2.5, True)
    assert [e.port for e in opts.probes] == [15021, 15090]
    assert opts.quit[0].path == "/quitquitquit" and (opts.mains_dir, opts.mains) == (str(mains), 3)
    assert opts.termination_log == "/tmp/t" and opts.termination_log_explicit
    assert opts.argv == [b"echo", b"--timeout", b"", "é".encode()]


@pytest.mark.parametrize("args, message", [
    ([p.FLAG_NAME, "x", "--", "true"], "--post FILE is required"),
    ([p.FLAG_POST], "--post needs a value"),
    ([p.FLAG_POST, "done", p.FLAG_NAME, "a", p.FLAG_NAME, "b", "--", "x"], "--name given twice"),
    ([p.FLAG_POST, "done", "--"], "no command after --"),
    ([p.FLAG_POST, "done", "true"], "unexpected 'true' before --"),
])
def test_parse_run_errors(args: list[str], message: str, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as info:
        flags.parse_run(args)
    assert info.value.message == message
    assert info.value.exit_code == p.EXIT_USAGE


def test_post_path_is_found_even_when_flags_are_bad() -> None:
    assert flags.post_path_of(["--bogus", p.FLAG_POST, "/r/done", "--", p.FLAG_POST, "no"]) == "/r/done"
    assert flags.post_path_of([f"{p.FLAG_POST}=/r/done"]) == "/r/done"
    assert flags.post_path_of(["--", p.FLAG_POST, "/x"]) == ""


def test_init_errors_are_one_line(tmp_path, capsys) -> None:
    from waiter import install

    assert install.main(["--from", str(tmp_path), str(tmp_path)]) == p.EXIT_USAGE
    assert capsys.readouterr().err == f"waiter init: {tmp_path} is not a waiter bundle (no executable waiter)\n"
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / p.WAITER_EXE_NAME).write_text("#!/bin/sh\n")
    (bundle / p.WAITER_EXE_NAME).chmod(0o700)
    assert install.main(["--from", str(bundle), str(tmp_path / "missing")]) == p.EXIT_USAGE
    assert "missing: not a directory (mount the initshift-bin volume there)" in capsys.readouterr().err
    assert install.main([]) == p.EXIT_USAGE


def test_the_copier_hook_keeps_a_bundle_its_container_put_in_place(tmp_path) -> None:
    """`init --hook` after `hold` copied (hybrid's initshift-copy): no second copy on step
    0's path, and the record `hold` waits for."""
    from waiter import install

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / p.WAITER_EXE_NAME).write_text("v1")
    (bundle / p.WAITER_EXE_NAME).chmod(0o755)
    dest = tmp_path / "dest"
    dest.mkdir()
    assert install.main(["--from", str(bundle), str(dest)]) == 0  # what `hold` did
    (bundle / p.WAITER_EXE_NAME).write_text("v2")
    assert install.main(["--from", str(bundle), p.COPY_HOOK_FLAG, str(dest)]) == 0
    assert (dest / p.WAITER_DIR_NAME / p.WAITER_EXE_NAME).read_text() == "v1", "not copied again"
    assert (dest / p.COPY_DONE_FILE).read_text().split()[0] == str(os.getpid())
    empty = tmp_path / "empty"
    empty.mkdir()
    assert install.main(["--from", str(bundle), p.COPY_HOOK_FLAG, str(empty)]) == 0  # the hook first: it copies
    assert (empty / p.WAITER_DIR_NAME / p.WAITER_EXE_NAME).read_text() == "v2"


def test_init_installs_and_replaces_atomically(tmp_path) -> None:
    from waiter import install

    bundle = tmp_path / "bundle"
    (bundle / "_internal").mkdir(parents=True)
    (bundle / p.WAITER_EXE_NAME).write_text("v1")
    (bundle / p.WAITER_EXE_NAME).chmod(0o700)
    (bundle / p.WAITER_INIT_EXE_NAME).write_text("image only")
    (bundle / "_internal" / "data").write_text("d")
    dest = tmp_path / "dest"
    dest.mkdir()
    assert install.main(["--from", str(bundle), str(dest)]) == 0
    (bundle / p.WAITER_EXE_NAME).write_text("v2")
    assert install.main([f"--from={bundle}", str(dest)]) == 0
    installed = dest / p.WAITER_DIR_NAME
    assert sorted(x.name for x in dest.iterdir()) == [p.WAITER_DIR_NAME]  # no temp or old copies left
    assert (installed / p.WAITER_EXE_NAME).read_text() == "v2"
    assert (installed / p.WAITER_EXE_NAME).stat().st_mode & 0o777 == 0o755
    assert (installed / "_internal" / "data").stat().st_mode & 0o777 == 0o644
    assert not (installed / p.WAITER_INIT_EXE_NAME).exists()


STILL_CLOCK = """
from waiter import runner
from waiter.signals import SignalBox
runner.now = lambda: 1_000_000.0  # the wall clock stands still (stepped back by NTP, a VM resumed)
out = runner.run([b"sleep", b"20"], {b"PATH": b"/usr/bin:/bin"}, SignalBox(), timeout=0.3)
print(out.timed_out, out.started_at == out.finished_at == 1_000_000.0)
"""


def test_timeout_runs_on_a_monotonic_clock() -> None:
    """--timeout must not follow the wall clock; the records still do. (A subprocess: the
    SignalBox takes over every signal of the process that creates it.)"""
    import subprocess
    import sys

    from tests.support.waiter_support import ROOT, waiter_env

    res = subprocess.run([sys.executable, "-c", STILL_CLOCK], env=waiter_env(), cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert res.stdout.split() == ["True", "True"], res.stderr


# --- the gate's poll schedule and the directory watch -------------------------------------

def test_gate_polls_fast_first_then_backs_off() -> None:
    from waiter.gate import poll_interval

    assert poll_interval(0, 0.0) == p.GATE_POLL_FIRST
    early = [poll_interval(n, 0.0) for n in range(40)]
    assert early == sorted(early) and max(early) == p.GATE_POLL_MAX  # a backoff up to the fast cap
    assert early.index(p.GATE_POLL_MAX) < 10  # reached within a few rounds
    # A sidecar that takes long is polled at a share of the wait, never beyond the ceiling.
    late = [poll_interval(1000, waited) for waited in (1, 10, 60, 600, 6000)]
    assert late == sorted(late) and late[0] == p.GATE_POLL_MAX
    assert late[2] == pytest.approx(60 * p.GATE_POLL_SHARE) and late[-1] == p.GATE_POLL_CEILING


def test_dirwatch_wakes_only_for_the_watched_name(tmp_path) -> None:
    """A writer's temporary file (created, written, renamed) does not end the wait; the
    rename onto the watched name does."""
    from waiter.post import write_atomic
    from waiter.wait import DirWatch

    with DirWatch([str(tmp_path)], ["done"]) as watch:
        assert watch.fd is not None, "inotify is unavailable here"
        (tmp_path / ".done.1.tmp").write_bytes(b"{}")
        (tmp_path / "other").write_bytes(b"{}")
        assert watch.wait(0.05) is False  # events came, none for "done": waited out the timeout
        write_atomic(str(tmp_path / "done"), b"{}")
        assert watch.wait(30) is True


def test_dirwatch_without_names_wakes_for_anything(tmp_path) -> None:
    from waiter.wait import DirWatch

    with DirWatch([str(tmp_path)]) as watch:
        (tmp_path / "x").write_bytes(b"")
        assert watch.wait(30) is True


def test_event_names_reads_the_kernels_records() -> None:
    import struct

    from waiter.wait import IN_MOVED_TO, IN_Q_OVERFLOW, event_names

    def event(mask: int, name: bytes) -> bytes:
        padded = name + b"\0" * (-len(name) % 16 or (16 if name else 0))
        return struct.pack("=iIII", 1, mask, 0, len(padded)) + padded

    assert event_names(event(IN_MOVED_TO, b"done") + event(IN_MOVED_TO, b".done.7.tmp")) == [b"done", b".done.7.tmp"]
    assert event_names(event(IN_MOVED_TO, b"done") + event(IN_Q_OVERFLOW, b"")) is None  # lost events: wake


def test_dirwatch_close_removes_the_watches_and_leaves_the_descriptor_to_exit(tmp_path) -> None:
    """close() removes the kernel's watches at once (closing the descriptor would wait for
    them to be reaped); the descriptor, close-on-exec, is left to the process's exit."""
    import fcntl

    from waiter.wait import DirWatch

    def watches(fd: int) -> int:
        return Path(f"/proc/self/fdinfo/{fd}").read_text().count("inotify wd:")

    watch = DirWatch([str(tmp_path)])
    fd = watch.fd
    assert fd is not None and watches(fd) == 1
    assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    watch.close()
    assert watch.fd is None and watches(fd) == 0
    os.close(fd)  # this test's process lives on: tidy up by hand
