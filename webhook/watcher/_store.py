"""The store: what the informers keep of the managed pods (client-go's informer cache).

Only pods still in flight, and of each only what the decisions read (`slim_pod`). A pod
that needs nothing more is dropped and remembered by name and uid only (so its later
changes, the kubelet ending it, cost nothing) until it is deleted; one dropped with its
outcome written but still running is remembered with the outcome's time too (for the
in-flight gauges).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Iterable

from waiter import protocol as p

from ..kube import rv_of
from ..rewrite import managed_as
from ._decide import slim_pod
from ._podstate import WAITER_RUN, deletion_asked, parse_time, pod_ended

Key = tuple[str, str]  # (namespace, name)


def key_of(obj: dict) -> Key:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


def uid_of(obj: dict | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("uid") or "")


def newer(candidate: dict, current: dict | None) -> bool:
    """Whether `candidate` is at least as new as `current` (resourceVersions are opaque,
    but numeric in every apiserver; compare them as numbers only when both are)."""
    if current is None:
        return True
    a, b = rv_of(candidate), rv_of(current)
    return not (a.isdigit() and b.isdigit()) or int(a) >= int(b)


def finished(pod: dict) -> bool:
    """Nothing will be asked of this pod again (given no action and no timer is due)."""
    if managed_as(pod) == p.MANAGED_START_ORDER:
        return pod_ended(pod)
    return p.ANNOTATION_OUTCOME in ((pod.get("metadata") or {}).get("annotations") or {})


def ending_since(pod: dict) -> float | None:
    """When the outcome of a waiter or hybrid pod that has not ended yet was decided (Unix
    time; 0 when unknown), or None for a pod that has no outcome yet, has ended, or is not
    a waiter pod (start-order pods are long-running by design and never get an outcome)."""
    outcome = ((pod.get("metadata") or {}).get("annotations") or {}).get(p.ANNOTATION_OUTCOME)
    if outcome is None or managed_as(pod) not in WAITER_RUN or pod_ended(pod):
        return None
    try:
        decided = parse_time(json.loads(outcome).get("decidedAt"))
    except (ValueError, AttributeError):
        decided = None
    return decided.timestamp() if decided is not None else 0.0


class PodStore:
    def __init__(self) -> None:
        self.pods: dict[Key, dict] = {}  # in flight: slim pods
        self.done: dict[Key, str] = {}  # need nothing more: key -> uid, until deleted
        self.ending: dict[Key, float] = {}  # dropped with an outcome, not ended yet: decidedAt
        self.gate_open: set[Key] = set()  # every sidecar seen Ready while the pod ran
        self.first_seen: dict[Key, datetime] = {}  # when this watcher first decided on the pod
        # The earliest deletion seen asked for the pod: the kubelet's last delete of a pod a
        # finalizer holds moves its deletionTimestamp to that moment (`deletion_asked`).
        self.deletion: dict[Key, datetime] = {}
        self._stale: dict[Key, str] = {}  # a write got 409 on this resourceVersion: a newer one exists

    def __len__(self) -> int:
        return len(self.pods)

    def __contains__(self, key: Key) -> bool:
        return key in self.pods

    def get(self, key: Key) -> dict | None:
        return self.pods.get(key)

    def is_done(self, key: Key, uid: str) -> bool:
        """This pod (by name and uid) needs nothing more."""
        return self.done.get(key) == uid

    def keys(self) -> list[Key]:
        return list(self.pods)

    def observe(self, kind: str, pod: dict) -> Key | None:
        """A pod from a list or the watch; its key when it needs a decision (None: deleted,
        or done and remembered by name only)."""
        key = key_of(pod)
        if kind == "DELETED":
            self.forget(key)
            return None
        uid = uid_of(pod)
        if self.done.get(key) == uid:
            if pod_ended(pod):
                self.ending.pop(key, None)
            return None
        if key in self.done:  # a new pod of the same name
            self.forget(key)
        self.update(key, slim_pod(pod))
        return key

    def update(self, key: Key, slim: dict) -> None:
        """Keep `slim` (a watch event's or a write's answer) when it is at least as new."""
        current = self.pods.get(key)
        if current is not None and uid_of(current) != uid_of(slim):
            self.forget(key)  # the name now belongs to another pod
            current = None
        if newer(slim, current):
            self.pods[key] = slim
            asked = deletion_asked(slim, self.deletion.get(key))
            if asked is not None:
                self.deletion[key] = asked
            if self._stale.get(key) not in (None, rv_of(slim)):
                del self._stale[key]

    def replace(self, namespace: str | None, pods: Iterable[dict]) -> tuple[list[Key], list[Key]]:
        """A fresh list of `namespace` (None: all): keeps what it has; returns (the keys it no
        longer has, whose DELETED event was missed: the caller forgets them; the keys that
        need a decision)."""
        listed = {key_of(pod): pod for pod in pods}
        gone = [k for k in [*self.pods, *self.done] if (namespace is None or k[0] == namespace) and k not in listed]
        due = [k for k in (self.observe("ADDED", pod) for pod in listed.values()) if k is not None]
        return gone, due

    def uids(self) -> set[str]:
        """The uids of the pods in flight."""
        return {uid_of(pod) for pod in self.pods.values()}

    def drop(self, key: Key) -> None:
        """The pod needs nothing more: keep only its name and uid, to ignore its next changes."""
        pod = self.pods.pop(key, None)
        if pod is None:
            return
        self.done[key] = uid_of(pod)
        decided = ending_since(pod)
        if decided is not None:  # outcome written, the kubelet has yet to end it: still in flight
            self.ending[key] = decided
        self._forget_seen(key)

    def forget(self, key: Key) -> str:
        """The pod is gone (deleted, or no longer listed); returns its uid."""
        pod = self.pods.pop(key, None)
        uid = uid_of(pod) or self.done.get(key, "")
        self.done.pop(key, None)
        self.ending.pop(key, None)
        self._forget_seen(key)
        return uid

    def _forget_seen(self, key: Key) -> None:
        """What was remembered of the pod beside its copy."""
        self.gate_open.discard(key)
        self.first_seen.pop(key, None)
        self.deletion.pop(key, None)
        self._stale.pop(key, None)

    # A 409 says the pod changed since the resourceVersion a write was conditional on; until
    # the watch brings the newer version, the stored one must not be decided on again.
    def mark_stale(self, key: Key, resource_version: str) -> None:
        self._stale[key] = resource_version

    def is_stale(self, key: Key) -> bool:
        return key in self._stale and self._stale[key] == rv_of(self.pods.get(key))

    def in_flight(self) -> tuple[int, list[float]]:
        """(waiter and hybrid pods still running their steps, decision times of the ones
        whose outcome is written but that still run, stored or dropped)."""
        steps, ending = 0, list(self.ending.values())
        for pod in self.pods.values():
            since = ending_since(pod)
            if since is not None:
                ending.append(since)
            elif managed_as(pod) in WAITER_RUN and not pod_ended(pod):
                steps += 1
        return steps, ending
