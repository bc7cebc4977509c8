"""One-line messages on stderr, prefixed with the container name so pod logs read well."""

from __future__ import annotations

import sys

from .protocol import WAITER_LOG_PREFIX

_name = ""


def set_name(name: str) -> None:
    global _name
    _name = name


def say(message: str) -> None:
    prefix = f"{WAITER_LOG_PREFIX}[{_name}]" if _name else WAITER_LOG_PREFIX
    try:
        sys.stderr.write(f"{prefix}: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):  # stderr closed (None if never open): nowhere to say it
        pass
