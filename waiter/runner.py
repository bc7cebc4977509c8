"""Runner: start the user's program in its own process group, forward signals to the
group, reap every zombie (the waiter is PID 1 or a child subreaper), enforce a timeout."""

from __future__ import annotations

import ctypes
import errno
import os
import select
import signal
import time
from collections import namedtuple
from collections.abc import Callable

from . import protocol as p
from .errors import WaiterError
from .record import now
from .signals import SignalBox, all_signals, default_dispositions

DEFAULT_PATH = b"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # runc's default
KILL_GRACE = 2.0  # seconds between SIGTERM and SIGKILL of a timed-out group
PR_SET_CHILD_SUBREAPER = 36


class Outcome(namedtuple("Outcome", "exit_code started_at finished_at timed_out signal", defaults=(False, 0))):
    """exit_code: int, started_at/finished_at: float, timed_out: bool, signal: the signal that
    killed the child, if any (0)."""

    __slots__ = ()


def become_subreaper() -> None:
    """Orphans of the child are re-parented to us (and reaped) instead of to the host's init."""
    if os.getpid() == 1:
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def exec_candidates(command: bytes, env: dict[bytes, bytes]) -> list[bytes]:
    """Like runc/execvp: a name without '/' is looked up in the container's PATH."""
    if b"/" in command:
        return [command]
    path = env.get(b"PATH", DEFAULT_PATH)
    return [os.path.join(d or b".", command) for d in path.split(b":")]


def launch(argv: list[bytes], env: dict[bytes, bytes], start: Callable[[bytes], int]) -> int:
    """`start(path)` on each PATH candidate of argv[0] until one works, the way execvp
    chooses (a later EACCES beats an earlier ENOENT); WaiterError if none could run."""
    if not argv or not argv[0]:
        raise WaiterError("empty command", p.EXIT_NOT_FOUND)
    saved: OSError | None = None
    failed = b""
    for path in exec_candidates(argv[0], env):
        try:
            return start(path)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR) and not os.path.isfile(path):
                saved = saved or exc
                continue
            saved, failed = exc, path
            # A file that is there but whose exec fails ENOENT (its #! interpreter or ELF
            # loader is missing) is the one runc would have picked: the search ends there.
            if exc.errno != errno.EACCES:
                break
    name = os.fsdecode(argv[0])
    err = saved.errno if saved and saved.errno else errno.ENOENT
    if not failed:
        where = "" if b"/" in argv[0] else " in PATH"
        raise WaiterError(f"{name}: command not found{where}", p.EXIT_NOT_FOUND)
    if failed != argv[0]:
        name = f"{name} ({os.fsdecode(failed)})"
    raise WaiterError(f"{name}: cannot execute: {_why(failed, err)}", p.EXIT_CANNOT_EXEC)


def _why(path: bytes, err: int) -> str:
    """Why a file that exists could not be executed, in the words a user can act on: execve
    says ENOENT when the program's interpreter (`#!`) or dynamic loader (PT_INTERP, e.g. a
    glibc program in a musl image) is missing, and EACCES for a directory."""
    if err == errno.EACCES and os.path.isdir(path):
        return "is a directory"
    if err != errno.ENOENT:
        return os.strerror(err).lower()
    interpreter = b""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
            if head.startswith(b"#!"):
                words = head[2:].split(b"\n", 1)[0].split()
                interpreter = words[0] if words else b""
            elif head.startswith(b"\x7fELF"):
                interpreter = _elf_interpreter(f, head)
    except (OSError, ValueError, IndexError):
        pass
    if interpreter:
        return f"its interpreter {os.fsdecode(interpreter)} was not found"
    return "its interpreter or loader was not found"


def _elf_interpreter(f, head: bytes) -> bytes:
    """The PT_INTERP path of an ELF file (b"" when there is none)."""
    import struct  # the error path only

    wide, order = head[4] == 2, "<" if head[5] == 1 else ">"
    if wide:
        phoff, = struct.unpack_from(order + "Q", head, 0x20)
        entsize, count = struct.unpack_from(order + "HH", head, 0x36)
    else:
        phoff, = struct.unpack_from(order + "I", head, 0x1C)
        entsize, count = struct.unpack_from(order + "HH", head, 0x2A)
    f.seek(phoff)
    table = f.read(entsize * min(count, 64))
    for i in range(len(table) // entsize if entsize else 0):
        entry = table[i * entsize:(i + 1) * entsize]
        if struct.unpack_from(order + "I", entry, 0)[0] != 3:  # PT_INTERP
            continue
        offset, size = struct.unpack_from(order + ("Q16xQ" if wide else "I8xI"), entry, 8 if wide else 4)
        f.seek(offset)
        return f.read(min(size, 4096)).split(b"\0", 1)[0]
    return b""


def spawn(argv: list[bytes], env: dict[bytes, bytes]) -> int:
    """Start argv in its own process group with default signal dispositions; in a container
    with a terminal, that group is the terminal's foreground before the program runs."""
    if owns_terminal():
        return launch(argv, env, lambda path: _spawn_in_foreground(path, argv, env))
    return launch(argv, env, lambda path: os.posix_spawn(path, argv, env, setpgroup=0, setsigmask=(),
                                                         setsigdef=all_signals()))


def owns_terminal() -> bool:
    """The waiter leads the session of the terminal on its stdin, in its foreground: a
    container with `tty: true` (`kubectl run -it`), whose runtime made it so. (Run from a
    shell's terminal, as in a developer's test run, the shell leads: it keeps its terminal.)"""
    try:
        return os.getsid(0) == os.getpid() and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:  # no terminal on stdin: the usual case
        return False


def _spawn_in_foreground(path: bytes, argv: list[bytes], env: dict[bytes, bytes]) -> int:
    """What a job-control shell (or tini) does for a job: the child takes its own group and
    the terminal's foreground, then execs. In a background group a program that reads its
    terminal is stopped (SIGTTIN) for good, and Ctrl-C would reach the waiter instead.
    posix_spawn cannot hand the terminal over in the child, and handing it over from here
    after the start races a program that checks at once (bash stops itself until it is in
    the foreground). An exec error comes back through a close-on-exec pipe, as OSError."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: system calls only, until execve
        try:
            os.setpgid(0, 0)
            signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # tcsetpgrp from a background group
            try:
                os.tcsetpgrp(0, os.getpid())
            except OSError:  # the terminal is gone meanwhile (a hangup): run without it
                pass
            default_dispositions()
            os.execve(path, argv, env)
        except OSError as exc:
            os.write(w, b"%d" % (exc.errno or errno.EIO))
        finally:
            os._exit(p.EXIT_CANNOT_EXEC)
    os.close(w)
    with open(r, "rb") as pipe:
        failed = pipe.read()
    if failed:
        os.waitpid(pid, 0)
        code = int(failed)
        raise OSError(code, os.strerror(code))
    return pid


def reap(child: int) -> int | None:
    """Reap every exited process; the child's wait status if it was among them."""
    status = None
    while True:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return status
        if pid == 0:
            return status
        if pid == child:
            status = st


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run(argv: list[bytes], env: dict[bytes, bytes], box: SignalBox,
        timeout: float | None = None) -> Outcome:
    """Run argv to completion. Every signal but SIGCHLD goes to the child's whole group."""
    started = now()
    child = spawn(argv, env)
    # Deadlines on the monotonic clock (a stepped wall clock must not stretch them); the
    # record's times stay wall-clock.
    deadline = time.monotonic() + timeout if timeout else None
    kill_at: float | None = None
    timed_out = False
    status: int | None = None
    while status is None:
        wait = None
        current = time.monotonic()
        if kill_at is not None:
            wait = max(0.0, kill_at - current)
        elif deadline is not None:
            wait = max(0.0, deadline - current)
        select.select([box], [], [], wait)
        for sig in box.take():
            if sig != signal.SIGCHLD:
                _killpg(child, sig)
        status = reap(child)
        if status is not None:
            break
        current = time.monotonic()
        if deadline is not None and kill_at is None and current >= deadline:
            timed_out = True
            _killpg(child, signal.SIGTERM)
            kill_at = current + KILL_GRACE
        elif kill_at is not None and current >= kill_at:
            _killpg(child, signal.SIGKILL)
            deadline = kill_at = None  # nothing left to time: the kernel delivers SIGKILL
    finished = now()
    if timed_out:
        _killpg(child, signal.SIGKILL)  # what is left of the group goes too
    reap(child)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        return Outcome(p.EXIT_SIGNAL_BASE - code, started, finished, timed_out, -code)
    return Outcome(code, started, finished, timed_out)
