"""The root of initshift's exceptions: every error the webhook raises on purpose derives from
`InitshiftError`, so a caller can tell ours (a clear message, no traceback) from a bug.

Each package keeps its own subclasses next to the code that raises them: `RewriteError`
(rewrite), `BadReview` and `TLSError` (admission), `RegistryError` and friends (registry),
`KubeError` (kube), `SettingsError` (settings), `NotManaged` (watcher), `InputError` and
`CliError` (cli). certs/ is independent of the webhook and has its own `PKIError`.
"""

from __future__ import annotations

__all__ = ["InitshiftError"]


class InitshiftError(Exception):
    """An error initshift raises on purpose; its message is meant for the user."""
