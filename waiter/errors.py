"""The waiter's own failures: one clear line for the user and a distinct exit code."""

from __future__ import annotations

from . import protocol as p


class WaiterError(Exception):
    """A failure of the waiter itself (not of the user's program)."""

    def __init__(self, message: str, exit_code: int = p.EXIT_USAGE) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class UsageError(WaiterError):
    """Bad flags or values on the command line."""
