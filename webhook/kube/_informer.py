"""An informer's list-and-watch loop (client-go's reflector), for one core/v1 collection in
one namespace or all, and the capped exponential backoff it (and the watcher) retries with.

It lists first (in pages, each cut down by `shrink` before the next arrives), then
watches from the list's resourceVersion with bookmarks, and resumes from the last
resourceVersion it saw (an event's or a bookmark's) when a watch ends (the server ends
each after 5-10 min) or breaks. It re-lists only on 410 Gone, after a failed list, or
every `resync_seconds` when asked to. Errors back off exponentially (0.2 s doubling up to
5 s, with jitter), so after an outage it is back within seconds.

`relist_on_gone=False` is for a collection the apiserver keeps no watch cache for (Events):
its watches get no bookmarks, so the resourceVersion of a quiet one falls behind etcd's
compaction (every 5 min) and the next watch gets 410; a re-list there reads every object of
the collection from etcd (20,000 Events: 0.3 s of apiserver and etcd CPU), for each replica,
every 5-10 min while nothing happens. Such an informer resumes from now instead (one
object listed, no selector: the current resourceVersion), missing what changed while no
watch was open; only an informer whose view is a hint may do that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from typing import Callable

from ..logs import Repeats
from ._api import KubeApi, KubeError

log = logging.getLogger("initshift.informer")
_quiet = logging.getLogger(f"{log.name}.quiet")  # what an informer with `logs=False` logs to: nowhere
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False

BACKOFF_CAP = 5.0  # seconds: a retry after an outage must not wait much longer than the outage

_WATCH_SECONDS = (300, 600)  # a watch asks the server to end it after a random time in this range


def rv_of(obj: dict | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("resourceVersion") or "")


class Backoff:
    """Capped exponential backoff with jitter: initial, x2 each failure, up to cap."""

    def __init__(self, initial: float = 0.2, cap: float = BACKOFF_CAP) -> None:
        self.initial, self.cap, self.failures = initial, cap, 0

    def next(self) -> float:
        delay = min(self.cap, self.initial * (2 ** self.failures))
        self.failures += 1
        return delay * random.uniform(0.8, 1.0)

    def reset(self) -> None:
        self.failures = 0


class Informer:
    """`on_list(namespace, items)` after each list, `on_event(kind, obj)` for each change;
    `on_error(error)` for each failed call (the watcher counts them). `logs`: its retries
    are logged (a command that says them itself, through `on_error`, turns that off)."""

    def __init__(self, api: KubeApi, plural: str, namespace: str | None, *, label_selector: str | None = None,
                 field_selector: str | None = None, on_list: Callable[[str | None, list[dict]], None],
                 on_event: Callable[[str, dict], None], shrink: Callable[[dict], dict] = lambda obj: obj,
                 on_error: Callable[[KubeError], None] = lambda error: None,
                 page_size: int = 500, resync_seconds: float = 0.0, backoff_initial: float = 0.2,
                 relist_on_gone: bool = True, logs: bool = True) -> None:
        self.api, self.plural, self.namespace = api, plural, namespace
        self.label_selector, self.field_selector = label_selector, field_selector
        self.on_list, self.on_event, self.shrink, self.on_error = on_list, on_event, shrink, on_error
        self.page_size, self.resync_seconds, self.backoff_initial = page_size, resync_seconds, backoff_initial
        self.relist_on_gone = relist_on_gone
        self.log = log if logs else _quiet
        self._warnings = Repeats()  # a lasting failure: once a minute (`on_error` counts each)
        self.resource_version = ""  # the newest one delivered (a list's, an event's, a bookmark's)
        self.synced = asyncio.Event()  # the first list has been delivered

    async def _list(self) -> tuple[list[dict], str]:
        items: list[dict] = []
        rv = ""
        async for page, rv in self.api.list_pages(self.plural, self.namespace, label_selector=self.label_selector,
                                                  field_selector=self.field_selector, limit=self.page_size):
            items.extend(self.shrink(obj) for obj in page)
        return items, rv

    async def _current_resource_version(self) -> str:
        """The collection's resourceVersion now: one object listed, unfiltered (a selector
        would make an uncached apiserver read the whole collection to find a match)."""
        async with contextlib.aclosing(self.api.list_pages(self.plural, self.namespace, limit=1)) as pages:
            async for _, rv in pages:
                return rv
        return ""

    async def run(self) -> None:
        backoff = Backoff(self.backoff_initial)
        where = {"namespace": self.namespace or "*", "resource": self.plural}
        rv: str | None = None
        next_list = float("inf")
        resume_from_now = False  # after a 410, when a re-list is not wanted
        while True:
            try:
                if resume_from_now:
                    rv = await self._current_resource_version() or None  # None: re-list after all
                    resume_from_now = False
                    self.resource_version = rv or self.resource_version
                    self.log.info("watch expired (410), resuming from now", extra=where)
                if rv is None or time.monotonic() >= next_list:
                    items, rv = await self._list()
                    next_list = time.monotonic() + self.resync_seconds if self.resync_seconds > 0 else float("inf")
                    self.on_list(self.namespace, items)
                    self.resource_version = rv
                    self.synced.set()
                    backoff.reset()
                seconds = random.randint(*_WATCH_SECONDS)
                if next_list != float("inf"):
                    seconds = max(1, min(seconds, int(next_list - time.monotonic()) + 1))
                opened = time.monotonic()
                async for kind, obj in self.api.watch(self.plural, self.namespace, label_selector=self.label_selector,
                                                      field_selector=self.field_selector, resource_version=rv,
                                                      timeout_seconds=seconds):
                    rv = rv_of(obj) or rv
                    if kind != "BOOKMARK":
                        self.on_event(kind, obj)
                    self.resource_version = rv
                    backoff.reset()
                if time.monotonic() - opened < 1.0:
                    await asyncio.sleep(backoff.next())  # a stream that ends at once: don't spin
            except KubeError as e:
                self.on_error(e)
                if e.gone:
                    if self.relist_on_gone or not self.synced.is_set():  # (a first list's pages expired)
                        self.log.info("watch expired (410), re-listing", extra=where)
                        rv = None
                    else:
                        resume_from_now = True
                    continue
                delay = backoff.next()
                if self._warnings.new(str(e)):
                    self.log.warning("watch failed, retrying in %.1fs: %s", delay, e, extra=where)
                await asyncio.sleep(delay)
            except Exception:  # a bug or an unexpected payload: keep watching, after a pause
                delay = backoff.next()
                self.log.exception("watch loop error, retrying in %.1fs", delay, extra=where)
                await asyncio.sleep(delay)
