"""What the rewrite reads of a pod's namespace (`Plan.rewrite(limit_ranges=..., quotas=...,
namespace=...)`): its LimitRanges and ResourceQuotas, and the Namespace's own mesh
injection labels. The apiserver's LimitRanger and ResourceQuota admission plugins run
after the mutating webhooks and reject a pod whose containers fall outside its namespace's
LimitRange (a request of 0 under a `min`), or that would take a quota past its `hard` (the
steps' limits, added up once they are regular); a mesh that injects by its namespace's
label alone (`istio-injection=enabled`) adds a proxy the pod does not ask for itself, after
initshift's first review, which those limits must hold too.

Modelled on LimitRanger (plugin/pkg/admission/limitranger), the same view for every kind:
an informer holds every object of the kind in the cluster (list and watch across all
namespaces, each cut down to what the rewrite reads); for a namespace it holds none for, a
live list answers, cached for 30 s, because one created just before the pod may not have
reached the informer yet. So the common case, a synced view that knows the namespace,
costs a dict lookup and no I/O. A quota's `status.used` is as the informer last saw it.

Nothing here ever fails a review: a live list that fails gives [] (the rewrite then does
what it does without them) and one warning per namespace per TTL; a server that may not
list them (403: an upgrade that kept the old RBAC) serves with the view off, says so once,
and looks again every minute.

Thread safety: `known()` is also called on the large review's thread. Every write replaces
a whole value (a namespace's tuple, a cache entry, the namespace dict) rather than changing
one in place, so a reader on another thread sees the old value or the new, never half of one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import AsyncIterator, Callable

from waiter import protocol as p

from ._api import KubeApi, KubeError
from ._informer import Informer

log = logging.getLogger("initshift.limitranges")  # both kinds: the name the logs have used

LIVE_TTL_SECONDS = 30.0  # the plugin's liveTTL
LOOKUP_SECONDS = 2.0  # a live list must leave most of the webhook's 5 s timeout to the rest
_LIVE_MAX = 10_000  # namespaces a live lookup is remembered for (the plugin's LRU size)
_FORBIDDEN_RETRY_SECONDS = 60.0  # how often a view turned off by RBAC asks again

Items = tuple[dict, ...]


def shrink(obj: dict) -> dict:
    """What the rewrite reads of a LimitRange: its name, where it is, its spec."""
    meta = obj.get("metadata") or {}
    return {"metadata": {k: meta[k] for k in ("namespace", "name", "resourceVersion") if k in meta},
            "spec": obj.get("spec") or {}}


def shrink_quota(obj: dict) -> dict:
    """What the rewrite reads of a ResourceQuota: a LimitRange's, and its status (hard, used)."""
    status = obj.get("status") or {}
    return {**shrink(obj), "status": {k: status[k] for k in ("hard", "used") if k in status}}


def shrink_namespace(obj: dict) -> dict:
    """What the rewrite reads of a Namespace: its name and its mesh injection markers."""
    meta = obj.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    return {"metadata": {"name": meta.get("name"), "resourceVersion": meta.get("resourceVersion"),
                         "labels": {k: labels[k] for k in p.NAMESPACE_MESH_LABELS if k in labels},
                         "annotations": {k: annotations[k] for k in p.NAMESPACE_MESH_ANNOTATIONS if k in annotations}}}


def _namespace_of(obj: dict) -> str:
    return str((obj.get("metadata") or {}).get("namespace") or "")


def _name_of(obj: dict) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _by_name(items: list[dict]) -> Items:
    """A namespace's objects in the apiserver's list order (by name), whatever the source."""
    return tuple(sorted(items, key=lambda o: str((o.get("metadata") or {}).get("name") or "")))


class NamespaceView:
    """The objects of one namespaced kind in every namespace: `known()` without I/O,
    `lookup()` live when it must, `run()` as a server companion. `api=None`: no API access,
    every answer is []."""

    RESOURCE = ""  # the kind's resource name
    NOUN = ""  # what the log lines call them
    RISK = ""  # what the rewrite risks without them
    shrink = staticmethod(shrink)
    key = staticmethod(_namespace_of)  # the namespace an object is of

    def __init__(self, api: KubeApi | None, *, ttl: float = LIVE_TTL_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api, self.ttl, self.clock = api, ttl, clock
        self.forbidden = False  # RBAC refused the cluster-wide list: the view is off
        self.forbidden_retry = _FORBIDDEN_RETRY_SECONDS
        self.informer: Informer | None = None
        self._held: dict[str, Items] = {}  # the informer's view, by namespace (only non-empty ones)
        self._live: dict[str, tuple[float, Items]] = {}  # namespace -> (expiry, what a live list said)
        self._pending: dict[str, asyncio.Future[Items]] = {}  # one live list per namespace at a time

    @property
    def off(self) -> bool:
        return self.api is None or self.forbidden

    @property
    def synced(self) -> bool:
        return self.informer is not None and self.informer.synced.is_set()

    def known(self, namespace: str) -> list[dict] | None:
        """The namespace's objects without I/O, or None when only a live list can say:
        the view has not synced, or holds none there and no fresh live list said so."""
        if self.off:
            return []
        held = self._held.get(namespace) if self.synced else None
        if held:  # the informer's entries win over a live list's
            return list(held)
        cached = self._live.get(namespace)
        if cached is not None and cached[0] > self.clock():
            return list(cached[1])
        return None

    async def lookup(self, namespace: str) -> list[dict]:
        """`known()`, else a live list (shared by the reviews that wait for it); never raises."""
        known = self.known(namespace)
        if known is not None:
            return known
        pending = self._pending.get(namespace)
        if pending is None:
            pending = self._pending[namespace] = asyncio.ensure_future(self._list_live(namespace))
            pending.add_done_callback(lambda _: self._pending.pop(namespace, None))
        # A review that stops waiting (its client left) does not stop the list the others wait for.
        items = await asyncio.shield(pending)
        return list(self._held.get(namespace) or items) if self.synced else list(items)

    async def _list_live(self, namespace: str) -> Items:
        assert self.api is not None
        items: list[dict] = []
        try:
            async with asyncio.timeout(LOOKUP_SECONDS):
                async for page, _ in self._pages(namespace):
                    items.extend(self.shrink(o) for o in page)
        except (KubeError, TimeoutError) as e:
            why = str(e) or f"no answer within {LOOKUP_SECONDS:g} s"
            log.warning("%s of namespace %s not read (%s); its pods are rewritten without them for %g s",
                        self.NOUN, namespace, why, self.ttl, extra={"namespace": namespace})
            items = []  # remembered like an answer: one call and one warning per namespace per TTL
        result = _by_name(items)
        self._remember(namespace, result)
        return result

    def _pages(self, namespace: str) -> AsyncIterator[tuple[list[dict], str]]:
        assert self.api is not None
        return self.api.list_pages(self.RESOURCE, namespace)

    def _remember(self, namespace: str, items: Items) -> None:
        now = self.clock()
        if len(self._live) >= _LIVE_MAX:  # forget what expired; if still full, the oldest half
            fresh = {ns: e for ns, e in self._live.items() if e[0] > now}
            if len(fresh) >= _LIVE_MAX:
                fresh = dict(sorted(fresh.items(), key=lambda kv: kv[1][0])[_LIVE_MAX // 2:])
            self._live = fresh
        self._live[namespace] = (now + self.ttl, items)

    # --- the informer's callbacks (on the loop) ---------------------------------------------
    def _listed(self, _where: str | None, items: list[dict]) -> None:
        grouped: dict[str, list[dict]] = {}
        for obj in items:
            grouped.setdefault(self.key(obj), []).append(obj)
        self._held = {ns: _by_name(objs) for ns, objs in grouped.items()}

    def _changed(self, kind: str, obj: dict) -> None:
        obj = self.shrink(obj)
        ns, name = self.key(obj), obj["metadata"].get("name")
        kept = [o for o in self._held.get(ns, ()) if o["metadata"].get("name") != name]
        if kind != "DELETED":
            kept.append(obj)
        if kept:
            self._held[ns] = _by_name(kept)
        else:
            self._held.pop(ns, None)

    # --- the companion ------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """List and watch every object of the kind until `stop`; with RBAC refusing the list,
        the view stays off (one warning) and the list is tried again every minute."""
        if self.api is None:
            return
        while not await self._may_list():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.forbidden_retry)
            if stop.is_set():
                return
        self.informer = Informer(self.api, self.RESOURCE, None, on_list=self._listed, on_event=self._changed,
                                 shrink=self.shrink)
        task = asyncio.create_task(self.informer.run(), name=f"{self.RESOURCE} informer")
        try:
            await stop.wait()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _may_list(self) -> bool:
        """One small cluster-wide list: False when RBAC refuses it (the view goes off). Any
        other failure is the informer's to retry, with live lists answering meanwhile."""
        assert self.api is not None
        try:
            async with contextlib.aclosing(self.api.list_pages(self.RESOURCE, None, limit=1)) as pages:
                async for _ in pages:
                    break
        except KubeError as e:
            if e.status in (401, 403):
                if not self.forbidden:
                    log.warning("%s are not read: the server may not list them (%s); pods are rewritten without "
                                "them, %s (grant list and watch on %s, docs/admission-server.md)",
                                self.NOUN, e, self.RISK, self.RESOURCE)
                self.forbidden = True
                return False
        if self.forbidden:
            log.info("%s are read again: listing them is allowed now", self.NOUN)
        self.forbidden = False
        return True


class LimitRanges(NamespaceView):
    RESOURCE, NOUN = "limitranges", "LimitRanges"
    RISK = "which a namespace's LimitRange may reject"


class ResourceQuotas(NamespaceView):
    RESOURCE, NOUN = "resourcequotas", "ResourceQuotas"
    RISK = "which a namespace's quota may refuse once the steps' limits add up"
    shrink = staticmethod(shrink_quota)


class Namespaces(NamespaceView):
    """Each namespace as the one object held for it (cluster-scoped: keyed by its name)."""

    RESOURCE, NOUN = "namespaces", "Namespaces"
    RISK = "so a proxy a mesh injects by a namespace's label alone is not held beside the steps within quotas"
    shrink = staticmethod(shrink_namespace)
    key = staticmethod(_name_of)

    def _pages(self, namespace: str) -> AsyncIterator[tuple[list[dict], str]]:
        assert self.api is not None
        return self.api.list_pages(self.RESOURCE, None, field_selector=f"metadata.name={namespace}")
