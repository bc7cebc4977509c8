"""The rewrite's one error type."""

from __future__ import annotations

from ..errors import InitshiftError
from ._reasons import Reason


class RewriteError(InitshiftError):
    """The pod cannot be rewritten; the message says why.

    `reason` is the slug metrics and logs use; `deny` turns the admitted-unchanged-with-a-
    warning answer into a denial, for pods a silent non-rewrite would break.
    """

    def __init__(self, message: str, *, reason: Reason = Reason.INVALID, deny: bool = False) -> None:
        super().__init__(message)
        self.reason, self.deny = reason, deny
