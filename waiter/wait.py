"""Wait for something to happen in a directory: inotify through ctypes, polling as fallback.

A file is always watched through its directory: completion files appear by rename and
kubelet updates downward-API files by swapping a `..data` symlink, neither of which an
inotify watch on the file itself would see.
"""

from __future__ import annotations

import ctypes
import os
import select
import sys
import time

IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_Q_OVERFLOW = 0x00004000  # events were lost: whatever we wait for may have happened
IN_IGNORED = 0x00008000  # the watch is gone (directory removed or unmounted)
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
WATCH_MASK = IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE | IN_ATTRIB
EVENT_HEADER = 16  # struct inotify_event: int wd, u32 mask, u32 cookie, u32 len, then the name
# The kubelet updates a downward-API volume by swapping this symlink (the files point through it).
KUBELET_DATA_LINK = "..data"

POLL_INTERVAL = 0.1  # seconds, when inotify is unavailable
SAFETY_INTERVAL = 1.0  # seconds, re-check even with inotify: events can be missed on odd filesystems


# Descriptors of closed watches, watches removed: the process's exit closes them (see close()).
_RETIRED: list[int] = []

# A wake-up source is anything with fileno() (a socket, a pipe end). Not a typing.Protocol:
# importing typing costs every step ~2 ms of cold start.
Wakeable = object


def event_names(data: bytes) -> list[bytes] | None:
    """The names in a buffer of inotify events; None when one says events were lost or the
    watch is gone (then anything may have changed)."""
    names = []
    at = 0
    while at + EVENT_HEADER <= len(data):
        mask = int.from_bytes(data[at + 4:at + 8], sys.byteorder)
        length = int.from_bytes(data[at + 12:at + 16], sys.byteorder)
        if mask & (IN_Q_OVERFLOW | IN_IGNORED):
            return None
        names.append(data[at + EVENT_HEADER:at + EVENT_HEADER + length].rstrip(b"\0"))
        at += EVENT_HEADER + length
    return names


class DirWatch:
    """`wait(timeout)` returns after a change in one of the directories, a wake-up fd, or timeout.

    With `names`, only events for those entries end the wait: a writer's temporary file
    (created, written, then renamed over the watched name) does not wake the waiter three
    times while the writer is still busy on the core it wakes up on."""

    def __init__(self, directories: list[str], names: list[str] | None = None) -> None:
        self.fd: int | None = None
        self.names = None if names is None else {os.fsencode(n) for n in names}
        self._watches: list[int] = []
        try:
            self._libc = libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        except (OSError, AttributeError):
            return
        if fd < 0:
            return
        for directory in directories:
            wd = libc.inotify_add_watch(fd, os.fsencode(directory), WATCH_MASK)
            if wd < 0:
                os.close(fd)  # one directory we cannot watch: poll them all
                return
            self._watches.append(wd)
        self.fd = fd

    @property
    def interval(self) -> float:
        return SAFETY_INTERVAL if self.fd is not None else POLL_INTERVAL

    def _drain(self, fd: int) -> bool:
        """Read the pending events; whether one of them is for a watched name."""
        relevant = False
        try:
            while data := os.read(fd, 65536):
                names = event_names(data)
                relevant = relevant or names is None or self.names is None or \
                    not self.names.isdisjoint(names)
        except BlockingIOError:
            pass
        return relevant

    def wait(self, timeout: float | None = None, wake: Wakeable | None = None) -> bool:
        """True when a watched entry changed (or events were lost); False after the timeout
        (or the safety/poll interval) or a wake-up. Callers re-check either way."""
        limit = self.interval if timeout is None else min(timeout, self.interval)
        deadline = time.monotonic() + max(0.0, limit)
        fds = [f for f in (self.fd, wake.fileno() if wake else None) if f is not None]
        while True:
            ready, _, _ = select.select(fds, [], [], max(0.0, deadline - time.monotonic()))
            if self.fd is None or self.fd not in ready:
                return False
            if self._drain(self.fd):
                return True
            if len(ready) > 1:
                return False
            # Only other entries changed: keep waiting for the rest of the time.

    def close(self) -> None:
        """Stop watching. Closing an inotify descriptor waits until the kernel has reaped
        every removed watch, its own or any other process's (a timer tick and an RCU grace
        period: 8 ms median here, up to 20), which would hold up what the watch guarded: the
        step's start. So the watches are removed (inotify_rm_watch returns at once; the
        kernel reaps them in the background) and the descriptor is left to the process's
        exit or exec (it is close-on-exec). What that close may still wait for then comes
        after the record is written (exit), or before the program starts (start-after's
        exec: the same wait as closing it here)."""
        if self.fd is not None:
            for wd in self._watches:
                self._libc.inotify_rm_watch(self.fd, wd)
            self._watches = []
            _RETIRED.append(self.fd)
            self.fd = None

    def __enter__(self) -> "DirWatch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
