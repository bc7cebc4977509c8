"""The completion record: what a step left behind for the next one (and for the watcher).

The same JSON is the container's termination message, so it stays under the size the
kubelet keeps whole (protocol.TERMINATION_MESSAGE_LIMIT, well below Kubernetes' 4 KiB: the
pod's 12 KiB are split among its containers): the free-text message is cut, never the fields
a reader parses.
"""

from __future__ import annotations

import json
import time
from collections import namedtuple

from . import protocol as p


def now() -> float:
    return time.time()


def rfc3339(ts: float) -> str:
    """UTC with microseconds and a `Z`: valid RFC 3339, parsed by Go and datetime.fromisoformat."""
    seconds = int(ts)
    micros = int(round((ts - seconds) * 1_000_000))
    if micros == 1_000_000:
        seconds, micros = seconds + 1, 0
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{micros:06d}Z"


def skip_message(failed: str, reason: str, message: str, code: int) -> str:
    """Why a step did not run, from the record of the step before it (`reason`, `message`,
    `code`; `failed`: the step whose failure is the cause). The waiter's skip writes it; the
    watcher says the same of a skipped container that has no record of its own."""
    if reason == p.REASON_SKIPPED and message:
        return message  # the same cause, said once by the first step it skipped
    if reason == p.REASON_STOPPED:
        # The pod is going away: the step before never ran, it did not fail.
        return f"skipped: step {failed!r} was {message or 'stopped before the command started'}"
    return f"skipped: step {failed!r} failed with exit code {code}"


class Record(namedtuple("Record", "name exit_code reason started_at finished_at message failed_step",
                        defaults=("", ""))):
    """name, exit_code: int, reason (REASON_*), started_at/finished_at (RFC 3339), message,
    failed_step. A namedtuple: `dataclasses` would cost ~10 ms of cold start (it imports inspect)."""

    __slots__ = ()

    @property
    def ok(self) -> bool:
        return self.reason == p.REASON_COMPLETED and self.exit_code == 0

    def _as_dict(self, message: str) -> dict[str, object]:
        out: dict[str, object] = {
            p.RECORD_NAME: self.name,
            p.RECORD_EXIT_CODE: self.exit_code,
            p.RECORD_REASON: self.reason,
            p.RECORD_STARTED_AT: self.started_at,
            p.RECORD_FINISHED_AT: self.finished_at,
        }
        if message:
            out[p.RECORD_MESSAGE] = message
        if self.failed_step:
            out[p.RECORD_FAILED_STEP] = self.failed_step
        return out

    def to_json(self, limit: int = p.TERMINATION_MESSAGE_LIMIT) -> bytes:
        data = json.dumps(self._as_dict(self.message), ensure_ascii=False).encode()
        message = self.message
        while len(data) > limit and message:
            # Cut the message by what is over (plus room for the marker), at least one character.
            cut = max(1, min(len(message), len(data) - limit + 4))
            message = message[:-cut] + "…" if len(message) > cut else ""
            data = json.dumps(self._as_dict(message), ensure_ascii=False).encode()
        return data

    @classmethod
    def from_json(cls, data: bytes) -> "Record":
        """Parse a record; raises ValueError on anything that is not one."""
        try:
            obj = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
        code = obj.get(p.RECORD_EXIT_CODE)
        reason = obj.get(p.RECORD_REASON)
        if not isinstance(code, int) or isinstance(code, bool) or not isinstance(reason, str):
            raise ValueError(f"no integer {p.RECORD_EXIT_CODE} or string {p.RECORD_REASON}")
        return cls(
            name=str(obj.get(p.RECORD_NAME, "")),
            exit_code=code,
            reason=reason,
            started_at=str(obj.get(p.RECORD_STARTED_AT, "")),
            finished_at=str(obj.get(p.RECORD_FINISHED_AT, "")),
            message=str(obj.get(p.RECORD_MESSAGE, "")),
            failed_step=str(obj.get(p.RECORD_FAILED_STEP, "")),
        )


def read_record(path: str) -> Record | None:
    """The record at path, None when there is none yet; ValueError when it is unreadable."""
    try:
        with open(path, "rb") as f:
            data = f.read(p.TERMINATION_MESSAGE_LIMIT * 4)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    return Record.from_json(data)
