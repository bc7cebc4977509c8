"""`waiter hold DEST`: the main process of hybrid's `initshift-copy` container.

The copy itself runs in the container's postStart hook (`waiter init --hook DEST`): the
kubelet starts the next container (step 0) only once the hook has returned. A container
whose process ends while its hook still runs gets the hook killed and counted as failed,
so this process stays until the hook's process is gone, then exits 0 and the container
reads Completed.

The hook records itself in DEST/COPY_DONE_FILE as "PID STARTTIME" (the kernel's start
time of the process, in clock ticks since boot), written once the bundle is in place.
The start time tells this hook from one of an earlier run of the container (a restart
reads the record its last run left) and from a later process given the same PID.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from . import protocol as p
from .errors import UsageError

USAGE = "usage: waiter hold DEST"
_POLL_FIRST, _POLL_GROWTH, _POLL_MAX = 0.005, 1.5, 0.05


def process_start(pid: int | str) -> int | None:
    """The start time of process `pid` (field 22 of /proc/PID/stat), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ")": split after the last.
    fields = stat[stat.rfind(b")") + 2:].split()
    return int(fields[19])


def record_hook(dest: str) -> None:
    """Called by the hook once the bundle is in place: this process is the hook to wait for."""
    final = os.path.join(dest, p.COPY_DONE_FILE)
    tmp = f"{final}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{os.getpid()} {process_start('self')}\n")
    os.chmod(tmp, 0o644)
    os.rename(tmp, final)  # atomic: a reader sees the whole record or none


def _hook(dest: str) -> tuple[int, int] | None:
    try:
        with open(os.path.join(dest, p.COPY_DONE_FILE)) as f:
            pid, start = f.read().split()
        return int(pid), int(start)
    except (OSError, ValueError):  # not written yet (or half a record from a foreign writer)
        return None


def hook_ended(dest: str, since: int) -> bool:
    """A hook started at or after `since` (clock ticks) recorded its copy and is gone."""
    hook = _hook(dest)
    return hook is not None and hook[1] >= since and process_start(hook[0]) != hook[1]


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0].startswith("-"):
        sys.stderr.write(f"waiter hold: {UsageError(USAGE).message}\n")
        return p.EXIT_USAGE
    # PID 1 of its container: the kernel ignores SIGTERM unless a handler is set.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda n, _frame: os._exit(p.EXIT_SIGNAL_BASE + n))
    since = process_start("self")
    if since is None:  # a container always has it; a bare chroot may not
        sys.stderr.write("waiter hold: /proc is not mounted: cannot tell when the hook has ended\n")
        return p.EXIT_USAGE
    delay = _POLL_FIRST
    while not hook_ended(argv[0], since):
        time.sleep(delay)
        delay = min(delay * _POLL_GROWTH, _POLL_MAX)
    return 0
