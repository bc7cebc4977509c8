"""Post writer: the termination message, then the completion file, each written atomically.

Order matters: a reader that sees the completion file may rely on the termination message
being in place already.
"""

from __future__ import annotations

import errno
import os

from . import log
from .record import Record


def write_atomic(path: str, data: bytes, mode: int = 0o644) -> None:
    """Write to a temp file in the same directory, then rename over path.

    No fsync: readers only need rename's atomicity, and an emptyDir does not outlive a node
    crash (the pod is gone with it), so durability would buy nothing but handoff latency."""
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _write_in_place(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        _write_all(fd, data)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    """A short write (a file size limit, RLIMIT_FSIZE; a volume filling up) is continued,
    so it ends in an error (EFBIG, ENOSPC) rather than a cut record renamed into place."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_termination_message(path: str, record: Record, *, explicit: bool) -> bool:
    """Leave a message the user's program wrote; else write the record.

    The kubelet bind-mounts the file (default /dev/termination-log), so rename onto it fails
    (EBUSY) and /dev is usually not writable: then the single write in place is the fallback.
    Outside Kubernetes the default path does not exist and nothing is written, unless the
    path was given explicitly. True when the record was written.
    """
    try:
        if os.path.getsize(path) > 0:
            return False
    except FileNotFoundError:
        if not explicit:
            return False
    except OSError:
        pass
    data = record.to_json()
    try:
        write_atomic(path, data)
        return True
    except OSError as exc:
        if exc.errno not in (errno.EBUSY, errno.EACCES, errno.EPERM, errno.EROFS, errno.EXDEV):
            log.say(f"cannot write termination message {path}: {exc.strerror}")
            return False
    try:
        _write_in_place(path, data)
        return True
    except OSError as exc:
        log.say(f"cannot write termination message {path}: {exc.strerror}")
        return False


def retract_termination_message(path: str) -> None:
    """Empty the termination message this waiter wrote: its completion file could not be
    written, so the record must not tell the watcher the step finished as recorded (the
    steps after it would wait for ever); without one the watcher takes the container as
    broken and ends the pod, naming it."""
    try:
        os.truncate(path, 0)
    except OSError as exc:
        log.say(f"cannot empty termination message {path}: {exc.strerror}")


def write_completion(path: str, record: Record) -> None:
    """The completion file later steps wait for; raises OSError when it cannot be written."""
    write_atomic(path, record.to_json())
