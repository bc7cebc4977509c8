"""One-line messages on stderr, prefixed with the container name so pod logs read well."""

from __future__ import annotations

import sys

_name = ""


def set_name(name: str) -> None:
    global _name
    _name = name


def say(message: str) -> None:
    prefix = f"waiter[{_name}]" if _name else "waiter"
    try:
        sys.stderr.write(f"{prefix}: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr closed: nowhere left to say it
        pass
