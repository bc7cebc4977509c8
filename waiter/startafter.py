"""`waiter start-after`: the declared start order of long-running containers.

Wait until every container of the previous start-order group is ready, write this
container's startup marker, then `execve` the original argv: the user's process replaces
the waiter (same PID, signals delivered straight to it, its exit code is the container's).

What "ready" means per dependency (the webhook picks one flag per container):
- `--probe URL`: its httpGet/tcpSocket readiness probe, run on loopback (shared netns);
- `--after-ready-file FILE`: the downward-API file of `initshift.io/ready-<name>`, which
  the watcher keeps equal to the kubelet's `ready` (exec probes cannot cross containers);
- `--after-marker FILE`: a container without a readiness probe is ready once started. Its
  waiter creates the marker with an exclusive flock held by an inherited descriptor, so the
  lock lives exactly as long as the user's process: a marker whose lock is free is left
  over from an earlier run and means "not running now". A restarted container therefore
  waits again only if what it depends on is not running, and never on its own old state.

Each run starts from scratch (no record of an earlier run is consulted). `--max-wait`
bounds the wait (default: forever, as the kubelet would); every `LOG_INTERVAL` seconds a
line says what is still awaited.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import time

from . import argvmap, flags, log
from . import protocol as p
from .env import child_environment
from .errors import UsageError, WaiterError
from .gate import PROBE_TIMEOUT, poll_interval
from .loopback import Endpoint
from .record import now, rfc3339
from .runner import launch
from .signals import TERMINATING, SignalBox, default_dispositions
from .wait import DirWatch

LOG_INTERVAL = 30.0  # seconds between "still waiting" lines (hidden flag to shorten it in tests)
MARKER_POLL = 0.25  # a lock released by a dying process makes no inotify event: poll markers

USAGE = (f"usage: waiter start-after [{p.FLAG_NAME} NAME] [{p.FLAG_MARKER} FILE] [{p.FLAG_PROBE} URL]... "
         f"[{p.FLAG_AFTER_MARKER} FILE]... [{p.FLAG_AFTER_READY_FILE} FILE]... [{p.FLAG_MAX_WAIT} SECONDS] "
         f"[{p.FLAG_ARGV_MAP} JSON] {p.ARGV_SEPARATOR} COMMAND [ARGS...]")

# --- conditions ------------------------------------------------------------------------------

# A condition has `what` (for the log), `polled` (no file event announces it: re-check on a
# timer) and `met()`. Plain classes, no dataclasses or typing.Protocol: both imports cost
# every gated container ~12 ms of start-up.

class ProbeReady:
    polled = True

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint

    @property
    def what(self) -> str:
        return f"readiness probe {self.endpoint.url}"

    def met(self) -> bool:
        return self.endpoint.healthy(PROBE_TIMEOUT)


class AnnotationReady:
    polled = False

    def __init__(self, path: str) -> None:
        self.path = path

    @property
    def what(self) -> str:
        return f"container {os.path.basename(self.path)!r} Ready (annotation {p.ANNOTATION_READY_PREFIX}*)"

    def met(self) -> bool:
        try:
            with open(self.path, "rb") as f:
                return f.read(64).strip() == p.READY_TRUE.encode()
        except OSError:
            return False


class Started:
    polled = True

    def __init__(self, path: str) -> None:
        self.path = path

    @property
    def what(self) -> str:
        return f"container {os.path.basename(self.path)!r} started"

    def met(self) -> bool:
        return marker_alive(self.path)


# --- markers ---------------------------------------------------------------------------------

def marker_alive(path: str) -> bool:
    """The marker exists and the process that wrote it (now the user's program) still runs."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True  # the writer's lock is held: it is running
        except OSError:
            return True  # no locks on this filesystem: existence is all there is
        # The lock was free: stale, unless the writer could not lock at all.
        try:
            return json.loads(os.read(fd, 4096) or b"{}").get("locked") is False
        except (ValueError, AttributeError, OSError):
            return False
    finally:
        os.close(fd)


def write_marker(path: str, name: str) -> int:
    """Create the marker, locked, atomically; return the inheritable descriptor holding the
    lock (it stays open across exec, so the lock ends with the user's process)."""
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked = True
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            locked = False
        body = {p.RECORD_NAME: name, p.RECORD_STARTED_AT: rfc3339(now()), "locked": locked}
        os.write(fd, json.dumps(body).encode())
        os.rename(tmp, path)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    os.set_inheritable(fd, True)
    return fd


# --- options ---------------------------------------------------------------------------------

Condition = ProbeReady | AnnotationReady | Started


class StartOptions:
    def __init__(self) -> None:
        self.name = ""
        self.marker = ""
        self.conditions: list[Condition] = []
        self.max_wait: float | None = None
        self.log_interval = LOG_INTERVAL
        self.argv: list[bytes] = []


def parse(args: list[str]) -> StartOptions:
    pairs, argv = flags.split(args, flags.START_AFTER)
    opts = StartOptions()
    single: dict[str, str] = {}  # flags given once (split refuses a second)
    for flag, value in pairs:
        if flag == p.FLAG_PROBE:  # conditions keep their order: they are checked and logged in it
            opts.conditions.append(ProbeReady(flags.endpoint(flag, value or "")))
        elif flag == p.FLAG_AFTER_MARKER:
            opts.conditions.append(Started(value or ""))
        elif flag == p.FLAG_AFTER_READY_FILE:
            opts.conditions.append(AnnotationReady(value or ""))
        else:
            single[flag] = value or ""
    opts.name = single.get(p.FLAG_NAME, "")
    opts.marker = single.get(p.FLAG_MARKER, "")
    if p.FLAG_MAX_WAIT in single:
        opts.max_wait = flags.seconds(p.FLAG_MAX_WAIT, single[p.FLAG_MAX_WAIT])
    if p.FLAG_LOG_INTERVAL in single:
        opts.log_interval = flags.seconds(p.FLAG_LOG_INTERVAL, single[p.FLAG_LOG_INTERVAL])
    argv_map = argvmap.parse(single[p.FLAG_ARGV_MAP]) if p.FLAG_ARGV_MAP in single else None
    opts.argv = argvmap.final_argv(argv, argv_map)
    return opts


# --- waiting ---------------------------------------------------------------------------------

def _describe(conditions: list[Condition]) -> str:
    return "; ".join(c.what for c in conditions)


def wait(opts: StartOptions, box: SignalBox) -> None:
    """Return once every condition was met; raise WaiterError on a signal or max wait."""
    pending = [c for c in opts.conditions if not c.met()]
    if not pending:
        return
    log.say(f"waiting for: {_describe(pending)}")
    start = time.monotonic()
    next_log = start + opts.log_interval
    dirs = sorted({os.path.dirname(c.path) or "." for c in pending if isinstance(c, (AnnotationReady, Started))})
    rounds = 0
    with DirWatch(dirs) as watch:
        while True:
            stop = [s for s in box.take() if s in TERMINATING]
            if stop:
                name = signal.Signals(stop[0]).name
                raise WaiterError(f"{name} while waiting for: {_describe(pending)}; not starting",
                                  p.EXIT_SIGNAL_BASE + stop[0])
            pending = [c for c in pending if not c.met()]
            if not pending:
                log.say(f"ready after {time.monotonic() - start:.1f}s")
                return
            t = time.monotonic()
            if opts.max_wait is not None and t - start >= opts.max_wait:
                raise WaiterError(f"gave up after {opts.max_wait:g}s ({p.FLAG_MAX_WAIT}) still waiting for: "
                                  f"{_describe(pending)}", p.EXIT_TIMED_OUT)
            if t >= next_log:
                log.say(f"still waiting after {t - start:.0f}s for: {_describe(pending)}")
                next_log = t + opts.log_interval
            limits = [next_log - t]
            if opts.max_wait is not None:
                limits.append(start + opts.max_wait - t)
            if any(c.polled for c in pending):
                limits.append(MARKER_POLL if any(isinstance(c, Started) for c in pending)
                              else poll_interval(rounds, t - start))
            watch.wait(max(0.0, min(limits)), box)
            rounds += 1


# --- exec ------------------------------------------------------------------------------------

def exec_argv(argv: list[bytes], env: dict[bytes, bytes]) -> None:  # never returns (execve or WaiterError)
    """Replace this process with argv (PATH from the container's env, like runc); raises
    WaiterError with execvp's choice of error (EACCES beats ENOENT) if nothing could run."""
    default_dispositions()
    launch(argv, env, lambda path: os.execve(path, argv, env))
    raise AssertionError("unreachable: execve returned")


def start(opts: StartOptions, box: SignalBox) -> None:  # never returns (execve or WaiterError)
    wait(opts, box)
    if opts.marker:
        try:
            write_marker(opts.marker, opts.name)
        except OSError as exc:
            raise WaiterError(f"cannot write startup marker {opts.marker}: {exc.strerror}") from None
    exec_argv(opts.argv, child_environment())


def main(argv: list[str]) -> int:
    try:
        opts = parse(argv)
    except UsageError as exc:
        log.say(exc.message)
        return exc.exit_code
    log.set_name(opts.name)
    try:
        start(opts, SignalBox())
    except WaiterError as exc:
        log.say(exc.message)
        return exc.exit_code
    except Exception as exc:  # a bug of ours: one line, never a traceback
        log.say(f"internal error: {type(exc).__name__}: {exc}")
        return p.EXIT_USAGE
