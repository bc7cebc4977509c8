"""The root of initshift's exceptions: every error the webhook raises on purpose derives from
`InitshiftError`, so a caller can tell ours (a clear message, no traceback) from a bug.

Each package keeps its own subclasses next to the code that raises them: `RewriteError`
(rewrite), `BadReview`, `TLSError`, `ListenError` and `CompanionStopped` (admission), `RegistryError` and friends (registry),
`KubeError` and `KubeConfigError` (kube), `SettingsError` (settings), `NotManaged` and
`WatcherStopped` (watcher), `InputError` and `CliError` (cli); tests/test_errors.py holds
every exception class in webhook/ to it. certs/ and waiter/ import nothing from webhook/ and keep their own roots
(`PKIError`, `WaiterError`).
"""

from __future__ import annotations

import os
import socket

__all__ = ["InitshiftError", "connect_reason", "os_reason"]


class InitshiftError(Exception):
    """An error initshift raises on purpose; its message is meant for the user."""


def os_reason(error: OSError) -> str:
    """An OSError's reason as part of a sentence: `no such file or directory`, not Python's
    `[Errno 2] No such file or directory: 'FILE'`."""
    why = error.strerror or str(error)
    return why[:1].lower() + why[1:]


def connect_reason(error: OSError) -> str:
    """Why a connection could not be made, in words (the Kubernetes and registry clients):
    `the name does not resolve`, not Python's `[Errno -2] Name or service not known`; else
    the errno's text (asyncio's strerror is "Connect call failed (address)")."""
    if isinstance(error, socket.gaierror):
        return "the name does not resolve"
    return os.strerror(error.errno).lower() if error.errno else os_reason(error)
