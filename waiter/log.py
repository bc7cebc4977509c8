"""One-line messages on stderr, prefixed with the container name so pod logs read well."""

from __future__ import annotations

import os

from .protocol import WAITER_LOG_PREFIX

_name = ""
STDERR = 2


def set_name(name: str) -> None:
    global _name
    _name = name


def say(message: str) -> None:
    prefix = f"{WAITER_LOG_PREFIX}[{_name}]" if _name else WAITER_LOG_PREFIX
    _write(f"{prefix}: {message}\n".encode("utf-8", "backslashreplace"))


def _write(data: bytes) -> None:
    """Straight to the descriptor, as a blocking write would: the command shares its open file
    description and may have left it O_NONBLOCK (node does on a pipe), and a full pipe then
    fails with EAGAIN, which through sys.stderr lost the line."""
    while data:
        try:
            data = data[os.write(STDERR, data):]
            continue
        except BlockingIOError:
            pass
        except OSError:  # stderr closed, or its reader gone (EPIPE): nowhere to say it
            return
        import select  # only where the command left the pipe full and non-blocking

        try:
            select.select([], [STDERR], [])
        except OSError:
            return
