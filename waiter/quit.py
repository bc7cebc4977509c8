"""Quit the sidecars once the last main is done, so the pod can end without an API call."""

from __future__ import annotations

import os

from . import log
from .loopback import Endpoint
from .post import write_atomic
from .record import Record, read_record

QUIT_TIMEOUT = 2.0  # seconds per endpoint


def _final(path: str, retry: bool) -> bool:
    """A record that ends its container for good: any record, or under --retry
    (restartPolicy OnFailure: a failed container is restarted and needs the sidecars)
    only a successful one."""
    try:
        rec = read_record(path)
    except ValueError:
        return False
    return rec is not None and (rec.ok or not retry)


def mains_done(directory: str, expected: int, retry: bool = False) -> bool:
    """Whether `expected` mains have left a final record in their shared directory (the
    dot-files are records being written)."""
    try:
        names = [n for n in os.listdir(directory) if not n.startswith(".")]
    except OSError:
        return False
    return sum(1 for n in names if _final(os.path.join(directory, n), retry)) >= expected


def record_main(directory: str, name: str, record: Record) -> None:
    """This main's record in the shared directory, under its own (unique) container name."""
    try:
        write_atomic(os.path.join(directory, name), record.to_json())
    except OSError as exc:
        log.say(f"cannot write {os.path.join(directory, name)}: {exc.strerror}")


def quit_sidecars(endpoints: list[Endpoint], mains_dir: str = "", mains: int = 0, retry: bool = False) -> None:
    """POST every endpoint once every main has finished (at once without mains: the last
    step quits). Failures are logged, never raised: the watcher ends the pod anyway if a
    sidecar does not quit."""
    if not endpoints:
        return
    if mains_dir and not mains_done(mains_dir, mains, retry):
        log.say("other containers still running: leaving the sidecars to the last one")
        return
    for endpoint in endpoints:
        try:
            status = endpoint.request("POST", QUIT_TIMEOUT)
        except (OSError, ValueError) as exc:  # ValueError: a URL the request line cannot carry
            log.say(f"quit {endpoint.url}: {getattr(exc, 'strerror', None) or exc}")
            continue
        log.say(f"quit {endpoint.url}: HTTP {status}")
