"""The record hybrid's copier hook leaves for `waiter hold`: DEST/COPY_DONE_FILE holds
"PID STARTTIME" of the hook's process (the kernel's start time, in clock ticks since
boot), written once the bundle is in place. The start time tells this run's hook from one
of an earlier run of the container (a restart reads the record its last run left) and from
a later process given the same PID."""

from __future__ import annotations

import os

from . import protocol as p


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


def hook_since(dest: str, since: int) -> tuple[int, int] | None:
    """(pid, start) of the hook that recorded itself at or after `since` (clock ticks), if any."""
    try:
        with open(os.path.join(dest, p.COPY_DONE_FILE)) as f:
            pid, start = f.read().split()
        hook = int(pid), int(start)
    except (OSError, ValueError):  # not written yet (or half a record from a foreign writer)
        return None
    return hook if hook[1] >= since else None


def hook_ended(dest: str, since: int) -> bool:
    """A hook started at or after `since` recorded its copy and is gone."""
    hook = hook_since(dest, since)
    return hook is not None and process_start(hook[0]) != hook[1]
