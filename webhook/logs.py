"""JSON log lines: one object per line, stable keys, never pod contents.

`configure()` routes the root logger (and uvicorn's) through `JsonFormatter`; the server
writes one `review` line per AdmissionReview with `log_review()` (`pod` holds the
name or generateName: `name` is taken by the LogRecord itself).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, Callable

from . import jsontext

REPEAT_SECONDS = 60.0  # a warning that stays the same is logged again at most this often

_REVIEW_LOGGER = logging.getLogger("initshift.review")
# uvicorn adds `color_message` (ANSI-coloured duplicate of msg) to its records.
_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "color_message"}


class JsonFormatter(logging.Formatter):
    """ts, level, logger, msg, then every `extra=` field of the record."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            # One line still: the exception type and message, not a multi-line traceback.
            out["error"] = f"{record.exc_info[0].__name__}: {record.exc_info[1]}"  # type: ignore[union-attr]
        return jsontext.dumps(out, default=str).decode()


def configure(level: str = "info", stream: Any = None) -> None:
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers[:] = []
        lg.propagate = True


def log_review(*, uid: str, namespace: str, name: str, kind: str, operation: str, decision: str,
               reason: str, dry_run: bool, duration: float, level: int = logging.INFO) -> None:
    if not _REVIEW_LOGGER.isEnabledFor(level):
        return
    _REVIEW_LOGGER.log(level, "review", extra={
        "uid": uid, "namespace": namespace, "pod": name, "kind": kind, "operation": operation,
        "decision": decision, "reason": reason, "dry_run": dry_run, "duration_ms": round(duration * 1000, 3),
    })


class Repeats:
    """Which of a retry loop's warnings to log: one that changed, at once; the same one
    again at most every `seconds`. A failure that lasts (an outage, a missing namespace or
    grant) is then not one line per retry; the loop's metrics still count each."""

    def __init__(self, seconds: float = REPEAT_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds, self._clock = seconds, clock
        self._last: tuple[str, float] | None = None

    def new(self, text: str) -> bool:
        """Whether to log `text` now (and, if so, it is remembered as logged)."""
        now = self._clock()
        if self._last is not None and self._last[0] == text and now - self._last[1] < self.seconds:
            return False
        self._last = (text, now)
        return True
