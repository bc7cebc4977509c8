"""Wait for something to happen in a directory: inotify through ctypes, polling as fallback.

A file is always watched through its directory: completion files appear by rename and
kubelet updates downward-API files by swapping a `..data` symlink, neither of which an
inotify watch on the file itself would see.
"""

from __future__ import annotations

import ctypes
import os
import select

IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
WATCH_MASK = IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE | IN_ATTRIB

POLL_INTERVAL = 0.1  # seconds, when inotify is unavailable
SAFETY_INTERVAL = 1.0  # seconds, re-check even with inotify: events can be missed on odd filesystems


# A wake-up source is anything with fileno() (a socket, a pipe end). Not a typing.Protocol:
# importing typing costs every step ~2 ms of cold start.
Wakeable = object


class DirWatch:
    """`wait(timeout)` returns after a change in one of the directories, a wake-up fd, or timeout."""

    def __init__(self, directories: list[str]) -> None:
        self.fd: int | None = None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        except (OSError, AttributeError):
            return
        if fd < 0:
            return
        for directory in directories:
            if libc.inotify_add_watch(fd, os.fsencode(directory), WATCH_MASK) < 0:
                os.close(fd)  # one directory we cannot watch: poll them all
                return
        self.fd = fd

    @property
    def interval(self) -> float:
        return SAFETY_INTERVAL if self.fd is not None else POLL_INTERVAL

    def wait(self, timeout: float | None = None, wake: Wakeable | None = None) -> None:
        limit = self.interval if timeout is None else min(timeout, self.interval)
        fds = [f for f in (self.fd, wake.fileno() if wake else None) if f is not None]
        ready, _, _ = select.select(fds, [], [], max(0.0, limit))
        if self.fd is not None and self.fd in ready:
            try:
                while os.read(self.fd, 65536):
                    pass
            except BlockingIOError:
                pass

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> "DirWatch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
