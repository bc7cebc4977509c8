"""`waiter hold [--from BUNDLE_DIR] [--hook-wait SECONDS] DEST`: the main process of hybrid's
`initshift-copy` container.

The copy runs in the container's postStart hook (`waiter init --hook DEST`): the kubelet
starts the next container (step 0) only once the hook has returned. A container whose
process ends while its hook still runs gets the hook killed and counted as failed, so this
process stays until the hook's process is gone (its record: waiter/copyrecord.py), then
exits 0 and the container reads Completed.

It copies the bundle too, first (waiter/install.py: atomic, whichever comes first; the
other keeps the bundle it finds in place, which steps may be running from). A kubelet
restarted between this container's start and the hook's end never runs the hook again, nor
learns how one it had started ended: it goes on to start the steps, which then find their
waiter, and this process, finding no hook of its run after `--hook-wait` seconds (120 by
default; a hook normally records within a second of the container's start), exits 0 instead
of holding the pod for ever.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from . import protocol as p
from .copyrecord import hook_ended, hook_since, process_start
from .errors import UsageError, WaiterError
from .install import install, source_dir, take_from
from .signals import release_terminating

USAGE = "usage: waiter hold [--from BUNDLE_DIR] [--hook-wait SECONDS] DEST"
HOOK_WAIT_SECONDS = 120.0
_POLL_FIRST, _POLL_GROWTH, _POLL_MAX = 0.005, 1.5, 0.05


def _parse(argv: list[str]) -> tuple[str | None, float, str]:
    args = list(argv)
    src, wait = take_from(args), HOOK_WAIT_SECONDS
    if args and args[0] == "--hook-wait":
        if len(args) < 2:
            raise UsageError("--hook-wait needs a value")
        value = args[1]
        del args[:2]
        try:
            wait = float(value)
        except ValueError:
            raise UsageError(f"--hook-wait: {value!r} is not a number of seconds") from None
    if len(args) != 1 or args[0].startswith("-"):
        raise UsageError(USAGE)
    return src, wait, args[0]


def main(argv: list[str]) -> int:
    try:
        src, wait, dest = _parse(argv)
    except UsageError as exc:
        sys.stderr.write(f"waiter hold: {exc.message}\n")
        return exc.exit_code
    # PID 1 of its container: the kernel ignores SIGTERM unless a handler is set.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda n, _frame: os._exit(p.EXIT_SIGNAL_BASE + n))
    release_terminating()
    since = process_start("self")
    if since is None:  # a container always has it; a bare chroot may not
        sys.stderr.write("waiter hold: /proc is not mounted: cannot tell when the hook has ended\n")
        return p.EXIT_USAGE
    try:
        install(source_dir(src), dest, replace=False)  # a bundle in place may be running already
    except WaiterError as exc:  # said; the hook may still copy
        sys.stderr.write(f"waiter hold: {exc.message}\n")
    except OSError as exc:
        sys.stderr.write(f"waiter hold: {exc.filename or dest}: {exc.strerror}\n")
    deadline = time.monotonic() + wait
    delay = _POLL_FIRST
    while not hook_ended(dest, since):
        if hook_since(dest, since) is None and time.monotonic() > deadline:
            sys.stderr.write(f"waiter hold: no postStart hook of this container ran within {wait:g} s (the kubelet "
                             f"restarted during its start?); the waiter is in place, exiting\n")
            return 0
        time.sleep(delay)
        delay = min(delay * _POLL_GROWTH, _POLL_MAX)
    return 0
