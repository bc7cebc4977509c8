"""Catch every catchable signal into a queue and wake a select() loop through a pipe.

The waiter never acts inside a signal handler: handlers only queue the number, and the
main loop (waiting or running) decides — forward to the child's group, reap, or abort.
Until the handlers exist, the terminating signals are held blocked (`hold_terminating`).
"""

from __future__ import annotations

import os
import signal

# SIGKILL and SIGSTOP cannot be caught; the others are caught and forwarded or handled.
UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP}
# Signals whose default action would end the waiter: they abort a wait that has not started
# the child yet.
TERMINATING = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
               signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM}


def catchable() -> list[signal.Signals]:
    return [s for s in signal.valid_signals()
            if isinstance(s, signal.Signals) and s not in UNCATCHABLE]


def all_signals() -> list[int]:
    """Every signal number, real-time ones included: the child starts with default handlers."""
    return [s for s in signal.valid_signals() if s not in UNCATCHABLE]


def default_dispositions() -> None:
    """Every signal back to its default action and none blocked, as a program must start:
    the interpreter ignores SIGPIPE and SIGXFSZ, an exec resets only the handlers of caught
    signals, and the mask is inherited."""
    for sig in all_signals():
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def hold_terminating() -> None:
    """Block the terminating signals until the command's handlers take them. The kernel
    drops a signal sent to a container's PID 1 that has no handler for it (pid_namespaces(7)),
    so a SIGTERM in the waiter's start would be lost and the container SIGKILLed at the end
    of the grace period; blocked, it stays pending until `release_terminating`."""
    signal.pthread_sigmask(signal.SIG_BLOCK, TERMINATING)


def release_terminating() -> None:
    """Unblock the terminating signals: one held pending meanwhile is delivered now, to the
    handler just installed (or, where there is none, with its default action)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, TERMINATING)


class SignalBox:
    """Installed once per process; `fileno()` becomes readable when signals are pending."""

    def __init__(self) -> None:
        self._pending: list[int] = []
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        for sig in all_signals():
            if sig == signal.SIGPIPE:
                # Stays ignored: a SIGPIPE from our own write to a closed stderr must not be
                # forwarded and kill the child. (The child still starts with the default.)
                continue
            try:
                signal.signal(sig, self._handle)
            except (OSError, ValueError):  # reserved by libc (e.g. 32, 33)
                pass
        release_terminating()

    def _handle(self, signum: int, frame: object) -> None:
        self._pending.append(signum)

    def fileno(self) -> int:
        return self._r

    def take(self) -> list[int]:
        """Pending signals, in order of arrival; drains the wake-up pipe."""
        try:
            while os.read(self._r, 512):
                pass
        except BlockingIOError:
            pass
        taken, self._pending = self._pending, []
        return taken
